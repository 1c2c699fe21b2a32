// The must-run switch (test/support/test_beds.h): a test bed given a missing prerequisite (an sshd
// that does not exist, a Python module that does not exist) skips its test without
// DTRAIN_REQUIRE_TESTBEDS=1 and fails it, naming what is missing, with it. Each probe runs in a
// child process of this very executable (hidden test cases), so its failure is observed here.
// It does not start a test bed that works; the netns and Slurm suites do that.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <optional>
#include <string>

#include "test/support/netns_hosts.h"
#include "test/support/python.h"
#include "test/support/subprocess.h"

namespace dtrain::testing {
namespace {

constexpr const char* kMissingSshd = "/nonexistent/dtrain-test-beds/sshd";
constexpr const char* kMissingModule = "dtrain_test_beds_no_such_module";

std::string self_path() {
  char path[4096];
  ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  REQUIRE(n > 0);
  return std::string(path, static_cast<size_t>(n));
}

/// Runs the hidden test case `tag` of this executable with both switches set as given (nullopt:
/// unset, whatever this process has set).
ProcessResult run_probe(const std::string& tag, std::optional<std::string> require_testbeds,
                        std::optional<std::string> require_pytorch = std::nullopt) {
  ProcessOptions options;
  options.env[kRequireTestBedsVariable] = std::move(require_testbeds);
  options.env[kRequirePytorchVariable] = std::move(require_pytorch);
  options.timeout_seconds = 60;
  ProcessResult r = run_process({self_path(), tag, "--reporter", "compact"}, options);
  INFO(tag << " exit " << r.exit_code << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE_FALSE(r.timed_out);
  // Catch2 found and ran the probe (a tag that matches nothing would say so and exit 2).
  REQUIRE(r.out.find("No test cases matched") == std::string::npos);
  REQUIRE(r.out.find("test case") != std::string::npos);
  return r;
}

}  // namespace

TEST_CASE("probe: a multi-host test bed with an sshd that does not exist", "[.probe-netns]") {
  NetnsHosts hosts(2, kMissingSshd);
  SKIP_UNLESS_AVAILABLE(hosts);
  FAIL("the test bed started with " << kMissingSshd);
}

TEST_CASE("probe: PyTorch with a module that does not exist", "[.probe-pytorch]") {
  if (!python_imports(kMissingModule)) {
    WARN("skipped: " << kSystemPython << " cannot import " << kMissingModule);
    return;
  }
  FAIL(kSystemPython << " imported " << kMissingModule);
}

TEST_CASE("without DTRAIN_REQUIRE_TESTBEDS a test bed that cannot run skips its test") {
  ProcessResult netns = run_probe("[.probe-netns]", std::nullopt);
  CHECK(netns.exit_code == 0);
  CHECK(netns.out.find("skipped: multi-host test bed unavailable") != std::string::npos);
  if (::geteuid() == 0) CHECK(netns.out.find(kMissingSshd) != std::string::npos);

  ProcessResult pytorch = run_probe("[.probe-pytorch]", std::nullopt);
  CHECK(pytorch.exit_code == 0);
  CHECK(pytorch.out.find(std::string("skipped: ") + kSystemPython) != std::string::npos);

  ProcessResult zero = run_probe("[.probe-netns]", "0");  // only "1" turns it on
  CHECK(zero.exit_code == 0);
}

TEST_CASE("DTRAIN_REQUIRE_TESTBEDS=1 turns a test bed that cannot run into a failure") {
  ProcessResult netns = run_probe("[.probe-netns]", "1");
  CHECK(netns.exit_code != 0);
  CHECK(netns.out.find("multi-host (network namespaces, sshd) test bed cannot run and "
                       "DTRAIN_REQUIRE_TESTBEDS=1 requires it") != std::string::npos);
  if (::geteuid() == 0) CHECK(netns.out.find(kMissingSshd) != std::string::npos);
  CHECK(netns.out.find("skipped") == std::string::npos);

  ProcessResult pytorch = run_probe("[.probe-pytorch]", "1");
  CHECK(pytorch.exit_code != 0);
  CHECK(pytorch.out.find("PyTorch test bed cannot run and DTRAIN_REQUIRE_TESTBEDS=1 requires it") !=
        std::string::npos);
  CHECK(pytorch.out.find(kMissingModule) != std::string::npos);
}

TEST_CASE("DTRAIN_REQUIRE_PYTORCH=1 still requires PyTorch, and nothing else") {
  ProcessResult pytorch = run_probe("[.probe-pytorch]", std::nullopt, "1");
  CHECK(pytorch.exit_code != 0);
  CHECK(pytorch.out.find("PyTorch test bed cannot run and DTRAIN_REQUIRE_PYTORCH=1 requires it") !=
        std::string::npos);

  ProcessResult netns = run_probe("[.probe-netns]", std::nullopt, "1");
  CHECK(netns.exit_code == 0);
  CHECK(netns.out.find("skipped: multi-host test bed unavailable") != std::string::npos);
}

}  // namespace dtrain::testing
