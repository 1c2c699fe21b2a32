// Runs a real program for a test and collects its exit status and output. stdout and stderr go
// to files (no pipe deadlock on big output). A program still running at the time-out is
// SIGKILLed and reported with timed_out = true.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::testing {

struct ProcessResult {
  int exit_code = -1;  ///< exit status, or 128 + signal when killed by a signal
  bool timed_out = false;
  std::string out;
  std::string err;
};

struct ProcessOptions {
  std::map<std::string, std::optional<std::string>> env;  ///< set (value) or unset (nullopt)
  std::string stdin_text;
  double timeout_seconds = 60;
  std::string cwd;
};

ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options = {});

/// Path of a program built by this project, e.g. binary("dtrain").
std::string binary(const std::string& name);

}  // namespace dtrain::testing
