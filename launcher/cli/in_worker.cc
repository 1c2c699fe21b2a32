// See in_worker.h.
#include "launcher/cli/in_worker.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "common/errors.h"
#include "launcher/plan/run_preparation.h"
#include "launcher/process/captured_run.h"

namespace dtrain::launcher {
namespace {

// The worker's message: the text after "dtrain: error: " on the last line that has it (its
// run_main's), so the launcher's own run_main prints it once; else everything it wrote (log lines
// before an error are the worker's, not the message).
std::string worker_message(const std::string& err) {
  const std::string prefix = "dtrain: error: ";
  const size_t at = err.rfind(prefix);
  if (at == std::string::npos || (at > 0 && err[at - 1] != '\n')) return err;
  return err.substr(at + prefix.size());
}

}  // namespace

void exec_in_worker(const std::vector<std::string>& args) {
  const std::string program = find_worker_program();
  std::vector<char*> argv = {const_cast<char*>(program.c_str())};
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::cout.flush();
  std::cerr.flush();
  ::execvp(argv[0], argv.data());
  throw common::IoError(fmt::format("cannot run {}: {}", program, std::strerror(errno)));
}

std::string check_data_in_worker(const std::string& job_file) {
  CapturedRun run = run_captured({find_worker_program(), "check-data", "--config", job_file}, {},
                                 kDataCheckSeconds);
  if (run.exit_code == 2) throw common::ConfigError(worker_message(run.err));
  if (run.exit_code != 0) {
    throw common::IoError(
        fmt::format("{} failed ({}): {}", run.command, run.ending(), worker_message(run.err)));
  }
  while (!run.out.empty() && run.out.back() == '\n') run.out.pop_back();
  return run.out;
}

}  // namespace dtrain::launcher
