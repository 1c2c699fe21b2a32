// Debian's Python for the tests that run PyTorch programs: /usr/bin/python3, which scripts/setup.sh
// --tests gives python3-torch and python3-numpy (a python3 earlier on PATH may lack them). Tests
// skip with a WARN naming what is missing when python_imports() is false.
#pragma once

#include <filesystem>
#include <string>

#include "test/support/subprocess.h"

namespace dtrain::testing {

inline constexpr const char* kSystemPython = "/usr/bin/python3";

/// True when kSystemPython exists and runs `import <modules>` (e.g. "numpy, torch") cleanly.
inline bool python_imports(const std::string& modules) {
  if (!std::filesystem::exists(kSystemPython)) return false;
  return run_process({kSystemPython, "-c", "import " + modules}).exit_code == 0;
}

}  // namespace dtrain::testing
