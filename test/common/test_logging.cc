// The log format: one role prefix per line. A worker under the launcher leaves the role out (the
// launcher's console adds "[worker 1]" and its log files are per worker); a standalone one and
// every other program keep it.
#include <catch2/catch.hpp>

#include "common/logging.h"

using namespace dtrain::common;

TEST_CASE("a worker under the launcher has no role in its pattern; standalone it has") {
  CHECK(log_pattern("worker 1") == "%Y-%m-%d %H:%M:%S.%e %^%L%$ [worker 1] %v");
  CHECK(log_pattern("") == "%Y-%m-%d %H:%M:%S.%e %^%L%$ %v");
  CHECK(worker_log_role("worker", 1, false) == "worker 1");
  CHECK(worker_log_role("chief", 0, false) == "chief");
  CHECK(worker_log_role("worker", 1, true).empty());
  CHECK(log_pattern(worker_log_role("worker", 0, true)).find("[worker") == std::string::npos);
}
