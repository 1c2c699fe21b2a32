// Debian's Python for the tests that run PyTorch programs: /usr/bin/python3, which scripts/setup.sh
// --tests gives python3-torch and python3-numpy (a python3 earlier on PATH may lack them). Tests
// skip with a WARN naming what is missing when python_imports() is false, except under
// scripts/test.sh (CI), which installs them and sets DTRAIN_REQUIRE_TESTBEDS=1 (or with the older
// DTRAIN_REQUIRE_PYTORCH=1, which requires PyTorch alone; test/support/test_beds.h): there a failed
// import is a test failure, so a broken install cannot pass as a skip.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "test/support/subprocess.h"
#include "test/support/test_beds.h"

namespace dtrain::testing {

inline constexpr const char* kSystemPython = "/usr/bin/python3";

/// True when kSystemPython exists and runs `import <modules>` (e.g. "numpy, torch") cleanly.
/// Throws, naming what failed, instead of returning false when pytorch_required().
inline bool python_imports(const std::string& modules) {
  bool must = pytorch_required();
  const char* variable = test_beds_required() ? kRequireTestBedsVariable : kRequirePytorchVariable;
  if (!std::filesystem::exists(kSystemPython)) {
    if (must) {
      throw std::runtime_error(
          test_bed_missing("PyTorch", std::string(kSystemPython) + " does not exist", variable));
    }
    return false;
  }
  ProcessResult r = run_process({kSystemPython, "-c", "import " + modules});
  if (r.exit_code != 0 && must) {
    throw std::runtime_error(test_bed_missing(
        "PyTorch", std::string(kSystemPython) + " -c \"import " + modules + "\" failed: " + r.err,
        variable));
  }
  return r.exit_code == 0;
}

}  // namespace dtrain::testing
