// fork/exec implementation of subprocess.h.
#include "test/support/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "test/support/temp_dir.h"

namespace dtrain::testing {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

[[noreturn]] void exec_child(const std::vector<std::string>& argv, const ProcessOptions& options,
                             const std::string& dir) {
  int in = ::open((dir + "/in").c_str(), O_RDONLY);
  int out = ::open((dir + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int err = ::open((dir + "/err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (in < 0 || out < 0 || err < 0) ::_exit(126);
  ::dup2(in, 0);
  ::dup2(out, 1);
  ::dup2(err, 2);
  for (const auto& [name, value] : options.env) {
    if (value)
      ::setenv(name.c_str(), value->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
  if (!options.cwd.empty() && ::chdir(options.cwd.c_str()) != 0) ::_exit(126);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  ::_exit(127);
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options) {
  TempDir dir;
  std::ofstream(dir.path() + "/in", std::ios::binary) << options.stdin_text;
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) exec_child(argv, options, dir.path());

  ProcessResult result;
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(options.timeout_seconds);
  int status = 0;
  while (true) {
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      result.timed_out = true;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = slurp(dir.path() + "/out");
  result.err = slurp(dir.path() + "/err");
  return result;
}

std::string binary(const std::string& name) {
  for (const char* folder : {"launcher", "worker", "test/helpers", "bench"}) {
    std::string path = std::string(DTRAIN_BINARY_DIR) + "/" + folder + "/" + name;
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  throw std::runtime_error("not built: " + name);
}

}  // namespace dtrain::testing
