// A stand-in worker for launcher tests: reads TF_CONFIG like any worker, then misbehaves as told.
// Failure flags apply while DTRAIN_ATTEMPT < --until-attempt and (if --only) on one task, so a
// test can make "worker:1 fails on attempt 0 only". It always prints its task, attempt and pid
// first, and writes its pid to $DTRAIN_RUN_DIR/pids/<task>-<attempt>.pid. The agent tests use
// it as a remote worker: a reform request and its reply, a queued SIGUSR1, a progress record.
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
#include <vector>

#include "common/control_protocol.h"
#include "common/env_vars.h"
#include "common/progress_record.h"
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
  bool flood = false;  // tick lines without a pause
  int until_attempt = 1 << 30;
  std::string only;
  std::vector<double> reform_timeouts;  // one reform request per --request-reform, in order
  bool print_sigusr1 = false;
  int write_progress = 0;  // steps
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
    else if (a == "--flood")
      f.flood = true;
    else if (a == "--until-attempt")
      f.until_attempt = std::stoi(next());
    else if (a == "--only")
      f.only = next();
    else if (a == "--request-reform")
      f.reform_timeouts.push_back(std::stod(next()));
    else if (a == "--print-sigusr1")
      f.print_sigusr1 = true;
    else if (a == "--write-progress")
      f.write_progress = std::stoi(next());
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

// Prints "tick <monotonic seconds>" every interval (0: without a pause) for seconds: log-latency
// benchmarks, and a worker whose output never stops.
void print_ticks(double interval, double seconds) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    std::printf("tick %ld.%09ld\n", static_cast<long>(now.tv_sec), now.tv_nsec);
    std::fflush(stdout);
    if (interval > 0) std::this_thread::sleep_for(std::chrono::duration<double>(interval));
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

// Sends a reform request on DTRAIN_CONTROL and prints "reform reply: <the reply line>" (as
// format_reform_reply writes it) or "reform reply: none" after timeout seconds.
void request_reform(const std::string& task, int attempt, double timeout) {
  const char* address = std::getenv("DTRAIN_CONTROL");
  dtrain::common::ControlClient control(address ? address : "");
  dtrain::common::ReformRequest request{task, attempt, 0, 3, true, "test_worker: asked to"};
  std::optional<dtrain::common::ReformReply> reply = control.request_reform(request, timeout);
  if (reply)
    std::printf("reform reply: %s", dtrain::common::format_reform_reply(*reply).c_str());
  else
    std::printf("reform reply: none\n");
  std::fflush(stdout);
}

volatile sig_atomic_t sigusr1_got = 0, sigusr1_value = 0, sigusr1_code = 0;

void on_sigusr1(int, siginfo_t* info, void*) {
  sigusr1_value = info->si_value.sival_int;
  sigusr1_code = info->si_code;
  sigusr1_got = 1;
}

// Prints "sigusr1 ready", waits up to 20 s for SIGUSR1, then prints "sigusr1 value=V queued=yes"
// (queued: sent by sigqueue) or "sigusr1 none".
void print_sigusr1() {
  struct sigaction action {};
  action.sa_sigaction = on_sigusr1;
  action.sa_flags = SA_SIGINFO;
  ::sigemptyset(&action.sa_mask);
  ::sigaction(SIGUSR1, &action, nullptr);
  std::printf("sigusr1 ready\n");
  std::fflush(stdout);
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!sigusr1_got && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (sigusr1_got)
    std::printf("sigusr1 value=%d queued=%s\n", static_cast<int>(sigusr1_value),
                sigusr1_code == SI_QUEUE ? "yes" : "no");
  else
    std::printf("sigusr1 none\n");
  std::fflush(stdout);
}

// Prints "progress file=<DTRAIN_PROGRESS_FILE>", waits 0.7 s, then keeps a progress record
// there (generation 2): steps steps of one collective each, 0.1 s apart.
void write_progress(int steps) {
  const char* path = std::getenv("DTRAIN_PROGRESS_FILE");
  std::printf("progress file=%s\n", path ? path : "-");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  dtrain::common::ProgressRecordWriter record(path ? path : "");
  record.set_generation(2);
  for (int step = 1; step <= steps; ++step) {
    record.begin_collective();
    record.end_collective();
    record.finished_step(step, 0.02);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::printf("progress steps=%d\n", steps);
  std::fflush(stdout);
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
  if (f.print_sigusr1) print_sigusr1();
  for (double timeout : f.reform_timeouts) request_reform(task, attempt, timeout);
  if (f.write_progress > 0) write_progress(f.write_progress);
  if (misbehave && f.hang) {
    while (true) ::pause();
  }
  if (f.tick > 0 || f.flood)
    print_ticks(f.flood ? 0 : f.tick, f.sleep);
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
