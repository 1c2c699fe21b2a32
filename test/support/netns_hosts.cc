// See netns_hosts.h. Every step is an `ip`, `ssh-keygen` or `sshd` child process; the only
// in-process networking is a setns'd thread (in_namespace) used to poll sshd's port.
#include "test/support/netns_hosts.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <shadow.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "test/support/processes.h"
#include "test/support/test_beds.h"

namespace dtrain::testing {
namespace {

constexpr const char* kNamePrefix = "dtrain-netns-";
constexpr double kSshdReadySeconds = 5;

/// The machine refuses: the fixture is unavailable rather than broken.
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string joined(const std::vector<std::string>& argv) {
  std::string text;
  for (const auto& a : argv) text += (text.empty() ? "" : " ") + a;
  return text;
}

/// Runs argv (10 s at most); on failure throws Refused (refusal) or std::runtime_error.
void must(const std::vector<std::string>& argv, bool refusal = false) {
  ProcessOptions options;
  options.timeout_seconds = 10;
  ProcessResult r = run_process(argv, options);
  if (r.exit_code == 0 && !r.timed_out) return;
  std::string message =
      "`" + joined(argv) + "` failed (" +
      (r.timed_out ? "timed out after 10 s" : "exit " + std::to_string(r.exit_code)) +
      "): " + r.err;
  if (refusal) throw Refused(message);
  throw std::runtime_error(message);
}

bool on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(std::string(path ? path : "") + ":/usr/sbin:/sbin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

/// Pids of the processes whose network namespace is /run/netns/<name> (zombies have none).
std::vector<pid_t> processes_in(const std::string& name) {
  std::vector<pid_t> pids;
  struct stat ns {};
  if (::stat(("/run/netns/" + name).c_str(), &ns) != 0) return pids;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (pid <= 0 || *end != '\0' || pid == ::getpid()) continue;
    struct stat st {};
    std::string link = std::string("/proc/") + entry->d_name + "/ns/net";
    if (::stat(link.c_str(), &st) == 0 && st.st_ino == ns.st_ino && st.st_dev == ns.st_dev) {
      pids.push_back(static_cast<pid_t>(pid));
    }
  }
  ::closedir(proc);
  return pids;
}

/// SIGKILLs every process in the namespace (sessions, workers they started) and waits up to 2 s
/// for them to be gone.
void kill_processes_in(const std::string& name) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (auto pids = processes_in(name); !pids.empty(); pids = processes_in(name)) {
    for (pid_t pid : pids) ::kill(pid, SIGKILL);
    if (std::chrono::steady_clock::now() > deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void delete_namespace(const std::string& name) noexcept {
  try {
    kill_processes_in(name);
    ProcessOptions options;
    options.timeout_seconds = 10;
    run_process({"ip", "netns", "del", name}, options);
  } catch (...) {
  }
}

/// Deletes the namespaces and temp dirs of fixtures whose test process died before its
/// destructor ran (SIGKILL, a crash).
void sweep_stale(const std::string& temp_base) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/run/netns", ec)) {
    std::string name = entry.path().filename().string();
    if (dead_creator(name, kNamePrefix)) delete_namespace(name);
  }
  for (const auto& entry : std::filesystem::directory_iterator(temp_base, ec)) {
    if (entry.is_directory(ec) && dead_creator(entry.path().filename().string(), kNamePrefix)) {
      std::filesystem::remove_all(entry.path(), ec);
    }
  }
}

/// One non-blocking TCP connect from the calling thread, waiting up to timeout_ms.
bool tcp_connects(const std::string& address, int port, int timeout_ms) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, address.c_str(), &sa.sin_addr);
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  bool ok = rc == 0;
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t size = sizeof error;
    ok = ::poll(&p, 1, timeout_ms) == 1 &&
         ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0;
  }
  ::close(fd);
  return ok;
}

std::string sshd_config(const std::string& dir, const std::string& address, int i) {
  std::string n = std::to_string(i);
  return "ListenAddress " + address + ":22\n" +                //
         "HostKey " + dir + "/host_ed25519\n" +                //
         "PidFile " + dir + "/sshd-" + n + ".pid\n" +          //
         "AuthorizedKeysFile " + dir + "/authorized_keys\n" +  //
         "PermitRootLogin prohibit-password\n"                 //
         "PubkeyAuthentication yes\n"                          //
         "PasswordAuthentication no\n"                         //
         "KbdInteractiveAuthentication no\n"                   //
         "UsePAM no\n"                                         //
         "StrictModes no\n"  // the keys sit under /tmp (mode 1777), which strict modes refuse
         "MaxStartups 64\n"  // a launcher may open many sessions at once
         "PrintMotd no\n"
         "PrintLastLog no\n"
         "X11Forwarding no\n"
         "LogLevel INFO\n";
}

std::string ssh_config(const std::string& dir) {
  return "Host *\n"
         "  User root\n"
         "  IdentityFile " +
         dir + "/id_ed25519\n" +  //
         "  IdentitiesOnly yes\n"
         "  UserKnownHostsFile " +
         dir + "/known_hosts\n" +  //
         "  GlobalKnownHostsFile /dev/null\n"
         "  StrictHostKeyChecking yes\n"
         "  BatchMode yes\n"
         "  ConnectTimeout 5\n"
         "  ServerAliveInterval 1\n"
         "  ServerAliveCountMax 3\n"
         "  ControlMaster no\n"
         "  LogLevel ERROR\n";
}

/// Throws Refused naming what this machine lacks for the test bed.
void check_prerequisites(const std::string& sshd) {
  if (::geteuid() != 0) {
    throw Refused("needs root for network namespaces and sshd (running as uid " +
                  std::to_string(::geteuid()) + ")");
  }
  for (const char* tool : {"ip", "ssh", "ssh-keygen"}) {
    if (!on_path(tool)) {
      throw Refused(std::string("`") + tool +
                    "` not found: run scripts/setup.sh (iproute2, openssh-client)");
    }
  }
  if (::access(sshd.c_str(), X_OK) != 0) {
    throw Refused(sshd + " not found: run scripts/setup.sh (openssh-server)");
  }
  if (::getpwnam("sshd") == nullptr) {
    throw Refused("no privilege separation user `sshd`: reinstall openssh-server");
  }
  if (const spwd* root = ::getspnam("root"); root && root->sp_pwdp && root->sp_pwdp[0] == '!') {
    throw Refused(
        "root's password is locked ('!' in /etc/shadow) and sshd without PAM refuses "
        "locked accounts even for keys; `usermod -p '*' root` allows key logins only");
  }
  // sshd's compiled-in privilege separation directory; Debian's service creates it at start.
  if (::mkdir("/run/sshd", 0755) != 0 && errno != EEXIST) {
    throw Refused(std::string("cannot create /run/sshd for sshd: ") + std::strerror(errno));
  }
}

}  // namespace

NetnsHosts::NetnsHosts(int count, std::string sshd_path)
    : count_(count), sshd_path_(std::move(sshd_path)) {
  static std::atomic<int> sequence{0};
  int seq = sequence++;
  int pid = static_cast<int>(::getpid());
  prefix_ = kNamePrefix + std::to_string(pid) + "-" + std::to_string(seq) + "-";
  subnet_ = (pid + seq * 37) % 254 + 1;
  if (count < 2) throw std::invalid_argument("NetnsHosts needs at least 2 hosts");
  try {
    set_up();
  } catch (const Refused& e) {
    tear_down();
    if (test_beds_required()) {
      throw std::runtime_error(test_bed_missing("multi-host (network namespaces, sshd)", e.what()));
    }
    why_not_ = e.what();
  } catch (...) {
    tear_down();
    throw;
  }
}

NetnsHosts::~NetnsHosts() {
  tear_down();
}

std::string NetnsHosts::host(int i) const {
  return "10.77." + std::to_string(subnet_) + "." + std::to_string(i + 1);
}

const std::string& NetnsHosts::namespace_name(int i) const {
  return namespaces_.at(i);
}

std::vector<std::string> NetnsHosts::exec_prefix(int i) const {
  return {"ip", "netns", "exec", namespace_name(i)};
}

ProcessResult NetnsHosts::run_in(int i, const std::vector<std::string>& argv,
                                 const ProcessOptions& options) const {
  std::vector<std::string> full = exec_prefix(i);
  full.insert(full.end(), argv.begin(), argv.end());
  return run_process(full, options);
}

void NetnsHosts::in_namespace(int i, const std::function<void()>& fn) const {
  std::string path = "/run/netns/" + namespace_name(i);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  std::exception_ptr error;
  std::thread thread([&] {
    try {
      if (::setns(fd, CLONE_NEWNET) != 0) {
        throw std::runtime_error("setns " + path + ": " + std::strerror(errno));
      }
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  });
  thread.join();
  ::close(fd);
  if (error) std::rethrow_exception(error);
}

std::vector<std::string> NetnsHosts::ssh_command() const {
  return {"ssh", "-F", dir_ + "/ssh_config"};
}

std::vector<std::string> NetnsHosts::ssh_argv(int from, int to,
                                              const std::string& remote_command) const {
  std::vector<std::string> argv = exec_prefix(from);
  for (const auto& a : ssh_command()) argv.push_back(a);
  argv.push_back(host(to));
  argv.push_back(remote_command);
  return argv;
}

void NetnsHosts::cut_link(int i) {
  must({"ip", "-n", namespaces_.back(), "link", "set", "p" + std::to_string(i), "down"});
}

void NetnsHosts::restore_link(int i) {
  must({"ip", "-n", namespaces_.back(), "link", "set", "p" + std::to_string(i), "up"});
}

int NetnsHosts::sshd_pid(int i) const {
  return sshd_.at(i)->pid();
}

void NetnsHosts::set_up() {
  check_prerequisites(sshd_path_);
  const char* base = std::getenv("TMPDIR");
  std::string temp_base = base && *base ? base : "/tmp";
  sweep_stale(temp_base);
  std::string pattern = temp_base + "/" + prefix_ + "XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;  // mkdtemp makes it 0700
  build_network();
  write_keys();
  for (int i = 0; i < count_; ++i) start_sshd(i);
}

void NetnsHosts::build_network() {
  // The switch namespace goes last in namespaces_, hosts 0..count-1 first.
  for (int i = 0; i <= count_; ++i) {
    std::string name = prefix_ + (i < count_ ? "h" + std::to_string(i) : std::string("sw"));
    must({"ip", "netns", "add", name}, true);
    namespaces_.push_back(name);
  }
  const std::string& sw = namespaces_.back();
  must({"ip", "-n", sw, "link", "add", "br0", "type", "bridge"}, true);
  for (int i = 0; i < count_; ++i) {
    std::string port = "p" + std::to_string(i);
    const std::string& ns = namespaces_[i];
    must({"ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns",
          sw},
         true);
    must({"ip", "-n", sw, "link", "set", port, "master", "br0", "up"});
    must({"ip", "-n", ns, "addr", "add", host(i) + "/24", "dev", "eth0"});
    must({"ip", "-n", ns, "link", "set", "lo", "up"});
    must({"ip", "-n", ns, "link", "set", "eth0", "up"});
  }
  must({"ip", "-n", sw, "link", "set", "br0", "up"});
}

void NetnsHosts::write_keys() {
  must({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dtrain-test", "-f",
        dir_ + "/id_ed25519"});
  must({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dtrain-test-host", "-f",
        dir_ + "/host_ed25519"});
  write_file(dir_ + "/authorized_keys", read_file(dir_ + "/id_ed25519.pub"));
  std::string hosts;
  for (int i = 0; i < count_; ++i) hosts += (i ? "," : "") + host(i);
  write_file(dir_ + "/known_hosts", hosts + " " + read_file(dir_ + "/host_ed25519.pub"));
  write_file(dir_ + "/ssh_config", ssh_config(dir_));
}

void NetnsHosts::start_sshd(int i) {
  std::string config = dir_ + "/sshd-" + std::to_string(i) + ".conf";
  std::string log = dir_ + "/sshd-" + std::to_string(i) + ".log";
  write_file(config, sshd_config(dir_, host(i), i));
  // ip netns exec execs sshd in place, so the recorded pid is sshd's own.
  sshd_.push_back(std::make_unique<BackgroundProcess>(std::vector<std::string>{
      "ip", "netns", "exec", namespaces_[i], sshd_path_, "-D", "-E", log, "-f", config}));
  int pid = sshd_.back()->pid();
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(kSshdReadySeconds);
  while (true) {
    bool listening = false;
    in_namespace(i, [&] { listening = tcp_connects(host(i), 22, 200); });
    if (listening) return;
    if (!process_alive(pid)) {
      throw std::runtime_error("sshd for " + host(i) + " exited at start; its log " + log + ":\n" +
                               read_file(log) + sshd_.back()->wait(1).err);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("sshd for " + host(i) + " did not listen on port 22 within " +
                               std::to_string(kSshdReadySeconds) + " s; its log:\n" +
                               read_file(log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void NetnsHosts::tear_down() noexcept {
  for (auto& sshd : sshd_) {
    try {
      sshd->signal(SIGTERM);
      sshd->wait(2);
    } catch (...) {
    }
  }
  sshd_.clear();
  for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) delete_namespace(*it);
  namespaces_.clear();
  if (!dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

}  // namespace dtrain::testing
