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

/// A program started in the background; the test signals it and waits for it. If the test
/// forgets to wait, the destructor SIGKILLs and reaps it.
class BackgroundProcess {
 public:
  BackgroundProcess(const std::vector<std::string>& argv, const ProcessOptions& options = {});
  ~BackgroundProcess();
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;

  int pid() const { return pid_; }
  void signal(int sig);
  /// Waits up to timeout_seconds (SIGKILL after that) and collects the output.
  ProcessResult wait(double timeout_seconds = 60);
  /// Output written so far (stdout).
  std::string out_so_far() const;
  /// Output written so far (stderr).
  std::string err_so_far() const;

 private:
  std::string dir_;
  int pid_ = -1;
  bool reaped_ = false;
};

/// True while pid exists and is not a zombie (a dead process its parent has not reaped yet).
bool process_alive(int pid);

/// Path of a program built by this project, e.g. binary("dtrain").
std::string binary(const std::string& name);

}  // namespace dtrain::testing
