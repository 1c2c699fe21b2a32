// A stand-in worker for launcher tests: reads TF_CONFIG like any worker, then misbehaves as told.
// Failure flags apply while DTRAIN_ATTEMPT < --until-attempt and (if --only) on one task, so a
// test can make "worker:1 fails on attempt 0 only". It always prints its task, attempt and pid
// first, and writes its pid to $DTRAIN_RUN_DIR/pids/<task>-<attempt>.pid.
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "common/control_protocol.h"
#include "common/env_vars.h"
#include "common/tf_config.h"

namespace {

struct Flags {
  int exit_code = 1;
  bool fail = false;  // --exit or --signal given
  int signal = 0;
  bool hang = false;
  bool ignore_sigterm = false;
  bool grandchild = false;
  bool heartbeat = false;
  bool partial = false;
  bool progress_bar = false;
  long lines = 0;
  double sleep = 0;
  double tick = 0;
  int until_attempt = 1 << 30;
  std::string only;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--exit")
      f.fail = true, f.exit_code = std::stoi(next());
    else if (a == "--signal")
      f.fail = true, f.signal = std::stoi(next());
    else if (a == "--hang")
      f.hang = true;
    else if (a == "--ignore-sigterm")
      f.ignore_sigterm = true;
    else if (a == "--grandchild")
      f.grandchild = true;
    else if (a == "--heartbeat")
      f.heartbeat = true;
    else if (a == "--partial")
      f.partial = true;
    else if (a == "--progress-bar")
      f.progress_bar = true;
    else if (a == "--lines")
      f.lines = std::stol(next());
    else if (a == "--sleep")
      f.sleep = std::stod(next());
    else if (a == "--tick")
      f.tick = std::stod(next());
    else if (a == "--until-attempt")
      f.until_attempt = std::stoi(next());
    else if (a == "--only")
      f.only = next();
    else {
      std::fprintf(stderr, "test_worker: unknown flag %s\n", a.c_str());
      std::exit(2);
    }
  }
  return f;
}

void write_pid_file(const std::string& name) {
  const char* run_dir = std::getenv("DTRAIN_RUN_DIR");
  if (!run_dir) return;
  std::string dir = std::string(run_dir) + "/pids";
  ::mkdir(dir.c_str(), 0755);
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  // "pid monotonic-seconds": benchmarks read when the process was up and running.
  std::ofstream(dir + "/" + name + ".pid")
      << ::getpid() << " " << now.tv_sec << "."
      << std::to_string(1000000000 + now.tv_nsec).substr(1) << "\n";
}

// Prints "tick <monotonic seconds>" every interval for seconds: log-latency benchmarks.
void print_ticks(double interval, double seconds) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    std::printf("tick %ld.%09ld\n", static_cast<long>(now.tv_sec), now.tv_nsec);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(interval));
  }
}

void sleep_with_heartbeats(double seconds, dtrain::common::ControlClient* control,
                           const dtrain::common::ControlMessage& base) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (control) control->send(base);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Flags f = parse(argc, argv);
  auto tf =
      dtrain::common::parse_tf_config(std::getenv("TF_CONFIG") ? std::getenv("TF_CONFIG") : "");
  std::string task = tf.task.text();
  int attempt = std::atoi(std::getenv("DTRAIN_ATTEMPT") ? std::getenv("DTRAIN_ATTEMPT") : "0");
  std::printf("test_worker task=%s attempt=%d pid=%d omp=%s\n", task.c_str(), attempt, ::getpid(),
              std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "-");
  std::fflush(stdout);
  std::string name = task;
  name[name.find(':')] = '-';
  write_pid_file(name + "-" + std::to_string(attempt));
  bool misbehave = attempt < f.until_attempt && (f.only.empty() || f.only == task);
  if (f.ignore_sigterm) ::signal(SIGTERM, SIG_IGN);
  if (f.grandchild) {
    pid_t child = ::fork();
    if (child == 0) {
      write_pid_file("grandchild-" + name + "-" + std::to_string(attempt));
      ::sleep(1000);
      ::_exit(0);
    }
    std::printf("grandchild pid=%d\n", child);
  }
  std::unique_ptr<dtrain::common::ControlClient> control;
  dtrain::common::ControlMessage beat =
      dtrain::common::heartbeat_message(task, attempt, ::getpid());
  if (f.heartbeat)
    control = std::make_unique<dtrain::common::ControlClient>(
        std::getenv("DTRAIN_CONTROL") ? std::getenv("DTRAIN_CONTROL") : "");
  for (long i = 0; i < f.lines; ++i) {
    std::printf("%s line %ld of %ld ........................................\n", task.c_str(), i,
                f.lines);
  }
  if (f.progress_bar) {
    for (int i = 1; i <= 3; ++i) std::printf("\r%d/3 [%.*s]", i, i, "===");
    std::printf("\n");
  }
  std::fflush(stdout);
  if (misbehave && f.hang) {
    while (true) ::pause();
  }
  if (f.tick > 0)
    print_ticks(f.tick, f.sleep);
  else
    sleep_with_heartbeats(f.sleep, control.get(), beat);
  if (f.partial) {
    std::printf("no newline at the end");
    std::fflush(stdout);
  }
  if (misbehave && f.signal) {
    ::signal(f.signal, SIG_DFL);
    ::raise(f.signal);
  }
  if (misbehave && f.fail) return f.exit_code;
  return 0;
}
