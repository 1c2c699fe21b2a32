// Shared by the fuzz targets (test/fuzz/fuzz_*.cc): what counts as a clean refusal, and how a
// broken invariant stops the run. A target gets bytes; it may refuse them with the errors our
// parsers document (ConfigError, IoError). Anything else that escapes (EnforceError, bad_alloc,
// out_of_range, a crash, a sanitizer report) is a finding.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/errors.h"

namespace dtrain::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// Stops the run (libFuzzer saves the input) when an invariant does not hold.
inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
  std::abort();
}

/// Runs parse; a documented refusal returns false, success true; anything else escapes.
template <typename Parse>
bool accepts(Parse parse) {
  try {
    parse();
    return true;
  } catch (const common::ConfigError&) {
    return false;
  } catch (const common::IoError&) {
    return false;
  }
}

}  // namespace dtrain::fuzz
