// See slurm_cluster.h. Every step is a child process (munged, the Slurm daemons and clients); the
// only in-process work is writing files (slurm.conf's text: slurm_config.h), asking the OS for free
// ports and reading /proc (processes.h) to find the processes tied to a fixture's dir.
#include "test/support/slurm_cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "test/support/processes.h"
#include "test/support/slurm_config.h"
#include "test/support/test_beds.h"

extern char** environ;

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kNamePrefix = "dtrain-slurm-";
constexpr const char* kNodes[] = {"n1", "n2"};
constexpr const char* kPartition = "debug";
constexpr int kCpusPerNode = 4;
constexpr double kNodesIdleSeconds = 20;
constexpr double kMungedReadySeconds = 10;
constexpr double kStopSeconds = 2;
constexpr double kJobsGoneSeconds = 15;
constexpr double kJobsKillAfterSeconds = 0.5;

/// The machine refuses: the fixture is unavailable rather than broken.
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(std::string(path ? path : "") + ":/usr/sbin:/sbin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

void write_file(const std::string& path, const std::string& text, mode_t mode = 0644) {
  {
    std::ofstream out(path, std::ios::binary);
    out << text;
    if (!out.flush()) throw std::runtime_error("cannot write " + path);
  }
  ::chmod(path.c_str(), mode);
}

/// The last `lines` lines of a file, headed by its path.
std::string tail(const std::string& path, size_t lines = 25) {
  std::istringstream in(read_all(path));
  std::deque<std::string> last;
  for (std::string line; std::getline(in, line);) {
    last.push_back(line);
    if (last.size() > lines) last.pop_front();
  }
  std::string text = "--- " + path + " (last " + std::to_string(last.size()) + " lines)\n";
  for (const auto& line : last) text += line + "\n";
  return text;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bind port 0, read it, close).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof sa;
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &size) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error(std::string("no free port: ") + std::strerror(errno));
  return ntohs(sa.sin_port);
}

/// This machine's name up to the first dot: what slurmctld compares SlurmctldHost with.
std::string short_hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) throw Refused("gethostname failed");
  std::string host(name);
  return host.substr(0, host.find('.'));
}

// ---- Processes of a fixture, found through /proc (the generic parts: processes.h) ----

/// The slurmstepd processes tied to dir (their log file, spool dir or working dir is there) and
/// their descendants: the processes of the jobs of the cluster living in dir.
std::vector<int> job_processes_of(const std::vector<ProcessEntry>& processes,
                                  const std::string& dir) {
  std::vector<int> stepds;
  for (const auto& p : processes) {
    if (p.comm == "slurmstepd" && uses_dir(p.pid, dir)) stepds.push_back(p.pid);
  }
  return with_descendants(processes, stepds);
}

/// The job processes of dir other than slurmstepd: what the jobs run.
std::vector<int> job_tasks_of(const std::string& dir) {
  std::vector<ProcessEntry> processes = live_processes();
  std::set<int> stepds;
  for (const auto& p : processes) {
    if (p.comm == "slurmstepd") stepds.insert(p.pid);
  }
  std::vector<int> tasks;
  for (int pid : job_processes_of(processes, dir)) {
    if (!stepds.count(pid)) tasks.push_back(pid);
  }
  return tasks;
}

/// Job processes of dir, plus every process naming dir or using it (daemons, slurmscriptd,
/// orphaned tasks), plus their descendants.
std::vector<int> all_processes_of(const std::string& dir) {
  std::vector<ProcessEntry> processes = live_processes();
  std::vector<int> pids = job_processes_of(processes, dir);
  std::vector<int> roots;
  for (const auto& p : processes) {
    if (names_dir(p.pid, dir) || uses_dir(p.pid, dir)) roots.push_back(p.pid);
  }
  for (int pid : with_descendants(processes, roots)) {
    if (std::find(pids.begin(), pids.end(), pid) == pids.end()) pids.push_back(pid);
  }
  return pids;
}

/// SIGKILLs every process of dir until none is left or 2 s passed.
void kill_processes_of(const std::string& dir) {
  auto start = Clock::now();
  for (auto pids = all_processes_of(dir); !pids.empty(); pids = all_processes_of(dir)) {
    for (int pid : pids) ::kill(pid, SIGKILL);
    if (seconds_since(start) > kStopSeconds) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// SIGTERM, then SIGKILL after 2 s, for a process this one did not start (munged).
void stop_foreign(int pid) {
  ::kill(pid, SIGTERM);
  auto start = Clock::now();
  while (process_alive(pid) && seconds_since(start) < kStopSeconds) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (process_alive(pid)) ::kill(pid, SIGKILL);
}

void stop_child(BackgroundProcess& process) noexcept {
  try {
    process.signal(SIGTERM);
    process.wait(kStopSeconds);  // SIGKILLs after that
  } catch (...) {
  }
}

/// Kills the daemons and job processes of fixtures whose test process died before its
/// destructor ran (SIGKILL, a crash), and deletes their dirs.
void sweep_stale(const std::string& temp_base) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(temp_base, ec)) {
    if (!entry.is_directory(ec) || !dead_creator(entry.path().filename().string(), kNamePrefix))
      continue;
    kill_processes_of(entry.path().string());
    fs::remove_all(entry.path(), ec);
  }
}

/// Throws Refused naming what this machine lacks for the test bed.
void check_prerequisites() {
  if (::geteuid() != 0) {
    throw Refused("needs root for slurmd and munged (running as uid " +
                  std::to_string(::geteuid()) + ")");
  }
  for (const char* tool : {"munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "squeue",
                           "sinfo", "scancel"}) {
    if (!on_path(tool)) {
      throw Refused(std::string("`") + tool +
                    "` not found: apt-get install slurmctld slurmd slurm-client munge");
    }
  }
}

/// 1024 random bytes, readable by root only (munged refuses looser modes).
void write_munge_key(const std::string& path) {
  std::random_device random;
  std::string key(1024, '\0');
  for (char& c : key) c = static_cast<char>(random() & 0xff);
  write_file(path, key, 0400);
}

/// Options for a daemon or client: SLURM_CONF set, every other inherited SLURM_* unset.
ProcessOptions slurm_options(const std::string& conf, const std::string& cwd) {
  ProcessOptions options;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    if (entry.rfind("SLURM_", 0) == 0) options.env[entry.substr(0, entry.find('='))] = {};
  }
  options.env["SLURM_CONF"] = conf;
  options.cwd = cwd;
  return options;
}

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

/// "key=value key=value ..." as printed by `scontrol -o`; a word without '=' continues the
/// value before it (values such as Reason or Command may hold spaces).
std::map<std::string, std::string> parse_fields(const std::string& line) {
  std::map<std::string, std::string> fields;
  std::istringstream words(line);
  std::string key;
  for (std::string word; words >> word;) {
    size_t eq = word.find('=');
    bool is_key =
        eq != std::string::npos && eq > 0 &&
        std::all_of(word.begin(), word.begin() + eq, [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':' || c == '/';
        });
    if (is_key) {
      key = word.substr(0, eq);
      fields[key] = word.substr(eq + 1);
    } else if (!key.empty()) {
      fields[key] += " " + word;
    }
  }
  return fields;
}

}  // namespace

SlurmCluster::SlurmCluster() {
  static std::atomic<int> sequence{0};
  name_ = kNamePrefix + std::to_string(::getpid()) + "-" + std::to_string(sequence++) + "-";
  try {
    set_up();
  } catch (const Refused& e) {
    tear_down();
    if (test_beds_required()) {
      throw std::runtime_error(test_bed_missing("Slurm (slurmctld, slurmd, munged)", e.what()));
    }
    why_not_ = e.what();
  } catch (...) {
    tear_down();
    throw;
  }
}

SlurmCluster::~SlurmCluster() {
  tear_down();
}

std::vector<std::string> SlurmCluster::node_names() const {
  return {std::begin(kNodes), std::end(kNodes)};
}

std::vector<std::pair<std::string, std::string>> SlurmCluster::client_env() const {
  return {{"SLURM_CONF", conf_path_}};
}

ProcessResult SlurmCluster::run(const std::vector<std::string>& argv,
                                ProcessOptions options) const {
  ProcessOptions full = slurm_options(conf_path_, options.cwd.empty() ? dir_ : options.cwd);
  for (auto& [name, value] : options.env) full.env[name] = value;
  full.stdin_text = options.stdin_text;
  full.timeout_seconds = options.timeout_seconds;
  return run_process(argv, full);
}

std::string SlurmCluster::sbatch(const std::string& script,
                                 const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {"sbatch", "--parsable"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(script);
  ProcessResult r = run(argv);
  std::string id = r.out.substr(0, r.out.find_first_of(";\n"));
  if (r.exit_code != 0 || r.timed_out || id.empty() ||
      id.find_first_not_of("0123456789") != std::string::npos) {
    std::string command;
    for (const auto& a : argv) command += (command.empty() ? "" : " ") + a;
    throw std::runtime_error(
        "`" + command + "` failed (" +
        (r.timed_out ? "timed out after 60 s" : "exit " + std::to_string(r.exit_code)) +
        "): " + r.out + r.err);
  }
  return id;
}

std::map<std::string, std::string> SlurmCluster::job_info(const std::string& job_id) const {
  ProcessOptions options;
  options.timeout_seconds = 10;
  ProcessResult r = run({"scontrol", "-o", "show", "job", job_id}, options);
  if (r.exit_code != 0) return {};
  return parse_fields(r.out.substr(0, r.out.find('\n')));
}

std::string SlurmCluster::wait_job_state(const std::string& job_id,
                                         const std::vector<std::string>& states,
                                         double timeout_seconds) const {
  auto start = Clock::now();
  while (true) {
    std::string state = job_info(job_id)["JobState"];
    if (std::find(states.begin(), states.end(), state) != states.end()) return state;
    if (seconds_since(start) > timeout_seconds) return state;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

std::vector<int> SlurmCluster::job_processes() const {
  return job_processes_of(live_processes(), dir_);
}

void SlurmCluster::set_up() {
  check_prerequisites();
  const char* base = std::getenv("TMPDIR");
  std::string temp_base = base && *base ? base : "/tmp";
  sweep_stale(temp_base);
  std::string pattern = temp_base + "/" + name_ + "XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;  // mkdtemp makes it 0700
  conf_path_ = dir_ + "/slurm.conf";
  write_munge_key(dir_ + "/munge.key");
  write_config();
  start_munged();
  start_slurm_daemons();
  wait_nodes_idle();
}

void SlurmCluster::write_config() {
  SlurmConfigInput config;
  config.host = short_hostname();
  config.cluster = "dt" + std::to_string(::getpid()) + "x" + dir_.substr(dir_.size() - 6);
  std::transform(config.cluster.begin(), config.cluster.end(), config.cluster.begin(),
                 [](unsigned char c) { return std::isalnum(c) ? std::tolower(c) : 'x'; });
  config.controller_port = free_port();
  config.dir = dir_;
  for (const char* node : kNodes) {
    config.nodes.emplace_back(node, free_port());
    fs::create_directory(dir_ + "/spool-" + node);
  }
  config.cpus_per_node = kCpusPerNode;
  config.partition = kPartition;
  fs::create_directory(dir_ + "/state");
  write_file(dir_ + "/plugstack.conf", "");  // no site SPANK plugins from /etc/slurm
  write_file(conf_path_, slurm_conf_text(config));
}

void SlurmCluster::start_munged() {
  // munged forks; the parent exits once the daemon listens (0) or with the reason it will not.
  // --force: munged wants every dir above its socket open to all (o+x) for other users' clients;
  // this dir is 0700 on purpose and every client here runs as root.
  ProcessOptions options;
  options.timeout_seconds = kMungedReadySeconds;
  ProcessResult r =
      run_process({"munged", "--force", "--socket=" + dir_ + "/munge.socket",
                   "--key-file=" + dir_ + "/munge.key", "--pid-file=" + dir_ + "/munged.pid",
                   "--log-file=" + dir_ + "/munged.log", "--seed-file=" + dir_ + "/munged.seed"},
                  options);
  munged_pid_ = std::atoi(read_all(dir_ + "/munged.pid").c_str());
  if (r.exit_code != 0 || r.timed_out || munged_pid_ <= 0) {
    throw Refused("munged did not start (" +
                  (r.timed_out ? std::string("timed out") : "exit " + std::to_string(r.exit_code)) +
                  "): " + r.err + tail(dir_ + "/munged.log"));
  }
}

void SlurmCluster::start_slurm_daemons() {
  // In the foreground (-D) as children of this process: a daemon that dies is seen at once.
  ProcessOptions options = slurm_options(conf_path_, dir_);
  slurmctld_ = std::make_unique<BackgroundProcess>(
      std::vector<std::string>{"slurmctld", "-D", "-f", conf_path_}, options);
  for (const char* node : kNodes) {
    slurmd_.push_back(std::make_unique<BackgroundProcess>(
        std::vector<std::string>{"slurmd", "-D", "-N", node, "-f", conf_path_}, options));
  }
}

void SlurmCluster::wait_nodes_idle() {
  auto start = Clock::now();
  ProcessOptions options;
  options.timeout_seconds = 5;
  std::string seen;
  while (true) {
    std::vector<std::pair<std::string, BackgroundProcess*>> daemons = {
        {"slurmctld", slurmctld_.get()}};
    for (size_t i = 0; i < slurmd_.size(); ++i) {
      daemons.push_back({std::string("slurmd -N ") + kNodes[i], slurmd_[i].get()});
    }
    for (auto& [name, daemon] : daemons) {
      if (process_alive(daemon->pid())) continue;
      ProcessResult r = daemon->wait(1);
      throw Refused(name + " exited at start (exit " + std::to_string(r.exit_code) + "): " + r.err +
                    "\n" + daemon_logs());
    }
    seen = run({"sinfo", "-h", "-N", "-o", "%N=%t"}, options).out;
    bool idle = true;
    for (const char* node : kNodes) idle = idle && has_line(seen, node + std::string("=idle"));
    if (idle) return;
    if (seconds_since(start) > kNodesIdleSeconds) {
      throw std::runtime_error("Slurm nodes not idle within " +
                               std::to_string(static_cast<int>(kNodesIdleSeconds)) +
                               " s; sinfo says:\n" + seen + daemon_logs());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string SlurmCluster::daemon_logs() const {
  std::string logs = tail(dir_ + "/slurmctld.log");
  for (const char* node : kNodes) logs += tail(dir_ + "/slurmd-" + node + ".log");
  return logs;
}

void SlurmCluster::cancel_jobs() noexcept {
  try {
    ProcessOptions options;
    options.timeout_seconds = 5;
    auto start = Clock::now();
    run({"scancel", std::string("--partition=") + kPartition}, options);
    while (seconds_since(start) < kJobsGoneSeconds) {
      ProcessResult queue = run({"squeue", "-h", "-o", "%A"}, options);
      if (queue.exit_code != 0 || queue.out.empty()) return;
      // A process that ignores SIGTERM holds its job COMPLETING for KillWait (10 s), and
      // `scancel --signal=KILL` does no better (Slurm treats it as a cancel). SIGKILL the job
      // processes instead; each slurmstepd then reports its tasks gone.
      if (seconds_since(start) > kJobsKillAfterSeconds) {
        for (int pid : job_tasks_of(dir_)) ::kill(pid, SIGKILL);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (...) {
  }
}

void SlurmCluster::stop_munged() noexcept {
  // Only the process munged.pid names and whose command line names this dir: not a recycled pid.
  if (munged_pid_ > 0 && names_dir(munged_pid_, dir_)) stop_foreign(munged_pid_);
  munged_pid_ = 0;
}

void SlurmCluster::tear_down() noexcept {
  if (slurmctld_ && process_alive(slurmctld_->pid())) cancel_jobs();
  for (auto& slurmd : slurmd_) stop_child(*slurmd);
  if (slurmctld_) stop_child(*slurmctld_);
  slurmd_.clear();
  slurmctld_.reset();
  if (dir_.empty()) return;
  try {
    stop_munged();
    kill_processes_of(dir_);  // slurmstepd left by a stopped slurmd, and what they run
  } catch (...) {
  }
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

}  // namespace dtrain::testing
