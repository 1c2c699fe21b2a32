// fork/exec implementation of subprocess.h.
#include "test/support/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

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

BackgroundProcess::BackgroundProcess(const std::vector<std::string>& argv,
                                     const ProcessOptions& options) {
  char pattern[] = "/tmp/dtrain-proc-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
  std::ofstream(dir_ + "/in", std::ios::binary) << options.stdin_text;
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) exec_child(argv, options, dir_);
}

BackgroundProcess::~BackgroundProcess() {
  if (!reaped_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void BackgroundProcess::signal(int sig) {
  if (!reaped_) ::kill(pid_, sig);
}

std::string BackgroundProcess::out_so_far() const {
  return slurp(dir_ + "/out");
}

std::string BackgroundProcess::err_so_far() const {
  return slurp(dir_ + "/err");
}

ProcessResult BackgroundProcess::wait(double timeout_seconds) {
  ProcessResult result;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  int status = 0;
  while (!reaped_) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) break;
    if (std::chrono::steady_clock::now() > deadline) {
      result.timed_out = true;
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  reaped_ = true;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = slurp(dir_ + "/out");
  result.err = slurp(dir_ + "/err");
  return result;
}

ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& options) {
  BackgroundProcess process(argv, options);
  return process.wait(options.timeout_seconds);
}

bool process_alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  size_t close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] != 'Z';
}

std::string binary(const std::string& name) {
  for (const char* folder : {"launcher", "worker", "test/helpers", "bench"}) {
    std::string path = std::string(DTRAIN_BINARY_DIR) + "/" + folder + "/" + name;
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  throw std::runtime_error("not built: " + name);
}

}  // namespace dtrain::testing
