// DT_ENFORCE messages and main()'s exception-to-exit-code mapping.
#include <algorithm>
#include <catch2/catch.hpp>

#include "common/env_vars.h"
#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "common/ports.h"

using namespace dtrain::common;

TEST_CASE("DT_ENFORCE throws EnforceError with file, line, condition and message") {
  int x = 3;
  try {
    DT_ENFORCE(x == 4, "x was {}", x);
    FAIL("no throw");
  } catch (const EnforceError& e) {
    std::string message = e.what();
    CHECK(message.find("test_errors.cc:") != std::string::npos);
    CHECK(message.find("x == 4") != std::string::npos);
    CHECK(message.find("x was 3") != std::string::npos);
  }
  CHECK_NOTHROW([&] { DT_ENFORCE(x == 3); }());
}

TEST_CASE("DT_ENFORCE_EQ shows both values") {
  CHECK_THROWS_WITH([] { DT_ENFORCE_EQ(1 + 1, 3, "sum"); }(), Catch::Contains("2 vs 3. sum"));
  CHECK_NOTHROW([] { DT_ENFORCE_EQ(2, 2); }());
}

TEST_CASE("run_main maps error kinds to exit codes") {
  CHECK(run_main("t", [] { return 7; }) == 7);
  CHECK(run_main("t", []() -> int { throw ConfigError("bad"); }) == kExitConfig);
  CHECK(run_main("t", []() -> int { throw IoError("lost"); }) == kExitFailure);
  CHECK(run_main("t", []() -> int { throw EnforceError("bug"); }) == kExitBug);
  CHECK(run_main("t", []() -> int { throw std::runtime_error("other"); }) == kExitFailure);
}

TEST_CASE("reserved environment names") {
  CHECK(is_reserved_env_name("TF_CONFIG"));
  CHECK(is_reserved_env_name("DTRAIN_TOKEN"));
  CHECK_FALSE(is_reserved_env_name("OMP_NUM_THREADS"));
  CHECK_FALSE(is_reserved_env_name("PATH"));
  CHECK_FALSE(is_reserved_env_name("DTRAIN_LOG_LEVEL"));
  CHECK(is_reserved_env_name("DTRAIN_CONTROL"));
}

TEST_CASE("log set-up rejects unknown levels and names roles") {
  CHECK_THROWS_AS(setup_logging("test", "loud"), ConfigError);
  CHECK_NOTHROW(setup_logging("test", "warn"));
  CHECK(role_name("worker", 1) == "worker 1");
  CHECK(role_name("chief", 0) == "chief");
}

TEST_CASE("a port held by a listener is not free; a picked one is") {
  int port = pick_free_ports(1)[0];
  CHECK(is_port_free("127.0.0.1", port));
  CHECK_THROWS_AS(is_port_free("no-such-host.invalid", port), IoError);
}

TEST_CASE("a host's listen addresses are numeric, so checks on them need no resolver") {
  std::vector<std::string> localhost = listen_addresses("localhost");
  CHECK(std::find(localhost.begin(), localhost.end(), "127.0.0.1") != localhost.end());
  CHECK(listen_addresses("127.0.0.1") == std::vector<std::string>{"127.0.0.1"});
  CHECK_THROWS_AS(listen_addresses("no-such-host.invalid"), IoError);
  int port = pick_free_ports(1)[0];
  for (const std::string& address : localhost) CHECK(is_port_free(address, port));
}
