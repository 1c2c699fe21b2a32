// main()'s exception-to-exit-code mapping: one line on stderr, never a stack trace.
#include "common/exit_codes.h"

#include <cstdio>
#include <exception>
#include <new>

#include "common/errors.h"

namespace dtrain::common {

int run_main(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return kExitConfig;
  } catch (const IoError& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return kExitFailure;
  } catch (const EnforceError& e) {
    std::fprintf(stderr, "%s: internal error (a bug, please report it): %s\n", program, e.what());
    return kExitBug;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: error: out of memory\n", program);
    return kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return kExitFailure;
  }
}

}  // namespace dtrain::common
