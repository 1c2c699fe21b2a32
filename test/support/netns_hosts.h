// Several "hosts" on one machine for multi-host tests: N network namespaces on one bridge, each
// with an address in one /24 and an OpenSSH server that takes root logins by a key generated here.
// It does not isolate files, users or processes: the hosts share this machine's filesystem and pid
// space, so a path or binary is the same on every host. Needs root and Debian's openssh-server.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "test/support/subprocess.h"

namespace dtrain::testing {

/// Owns N network namespaces "dtrain-netns-<pid>-<seq>-h<i>" plus one "...-sw" holding the bridge
/// they hang on (veth eth0 in host i, port p<i> on the bridge), an sshd per host, and a private
/// 0700 temp dir with the keys and configs. Host i is 10.77.<x>.<i+1>/24; x varies with the pid
/// and a per-process counter so parallel fixtures read apart (the namespaces isolate them anyway).
/// Construction sweeps the namespaces (and the processes in them) and temp dirs of fixtures whose
/// test process died before its destructor ran. One thread owns a fixture; nothing is thread-safe.
class NetnsHosts {
 public:
  /// Sets up count >= 2 hosts, each running sshd_path, and waits up to 5 s for each sshd to
  /// listen. When the machine refuses (not root, no CAP_SYS_ADMIN/CAP_NET_ADMIN, no veth or bridge,
  /// no ip/ssh/sshd, no sshd user, root's password locked), available() is false, why_not() says
  /// why and nothing is left behind; under DTRAIN_REQUIRE_TESTBEDS=1 (test/support/test_beds.h)
  /// it throws std::runtime_error saying why instead. Any other failure (sshd exits or never
  /// listens) throws std::runtime_error with sshd's log, after cleaning up.
  explicit NetnsHosts(int count = 2, std::string sshd_path = "/usr/sbin/sshd");
  /// Stops each sshd (SIGTERM by its pid, SIGKILL after 2 s), SIGKILLs any other process still in
  /// the namespaces (ssh sessions, workers they started), deletes the namespaces (and with them the
  /// links) and the temp dir. Never throws.
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  bool available() const { return why_not_.empty(); }
  /// Why the machine refused, for a Catch2 WARN; empty when available.
  const std::string& why_not() const { return why_not_; }

  int size() const { return count_; }
  /// Host i's address, "10.77.<x>.<i+1>".
  std::string host(int i) const;
  const std::string& namespace_name(int i) const;
  /// {"ip", "netns", "exec", <namespace i>}: put before an argv to run it on host i.
  std::vector<std::string> exec_prefix(int i) const;
  /// Runs argv inside namespace i (ip netns exec) to completion or options.timeout_seconds.
  ProcessResult run_in(int i, const std::vector<std::string>& argv,
                       const ProcessOptions& options = {}) const;
  /// Runs fn on a new thread that has entered namespace i (setns), and joins it; fn's exception,
  /// if any, is rethrown here. Sockets and getifaddrs in fn see namespace i. Do not use Catch2
  /// assertions inside fn (not thread-safe in v2): return values out and check them after.
  void in_namespace(int i, const std::function<void()>& fn) const;

  /// `ssh -F <dir>/ssh_config`: root by the generated key, known_hosts holding the generated host
  /// key (strict checking), BatchMode, ConnectTimeout 5, ServerAliveInterval 1 x CountMax 3 (a cut
  /// session ends with 255 after about 4 s), LogLevel ERROR. Append the host and the command. Works
  /// from inside a namespace only (the hosts exist only there; from the root namespace 10.77.x.x
  /// is at best somebody else's address); it is the launcher's `remote_shell` for a launcher
  /// started with exec_prefix(0).
  std::vector<std::string> ssh_command() const;
  /// exec_prefix(from) + ssh_command() + {host(to), remote_command}.
  std::vector<std::string> ssh_argv(int from, int to, const std::string& remote_command) const;

  /// Brings host i's bridge port down: packets to and from host i are dropped silently (a pulled
  /// cable); host i keeps its address. restore_link brings it back up (no STP: forwards at once).
  void cut_link(int i);
  void restore_link(int i);

  /// Pid of host i's sshd (its listener; sessions are its children).
  int sshd_pid(int i) const;
  /// The fixture's private temp dir (0700): keys, configs, sshd logs.
  const std::string& dir() const { return dir_; }

 private:
  void set_up();
  void build_network();
  void write_keys();
  void tear_down() noexcept;
  void start_sshd(int i);

  int count_;
  std::string sshd_path_;
  int subnet_ = 0;
  std::string prefix_;  ///< "dtrain-netns-<pid>-<seq>-"
  std::string why_not_;
  std::string dir_;
  std::vector<std::string> namespaces_;  ///< created so far, switch last
  std::vector<std::unique_ptr<BackgroundProcess>> sshd_;
};

}  // namespace dtrain::testing

/// In a Catch2 test: WARN why and return when the test bed is unavailable on this machine (never
/// under DTRAIN_REQUIRE_TESTBEDS=1, where the constructor throws instead).
#define SKIP_UNLESS_AVAILABLE(hosts)                                           \
  do {                                                                         \
    if (!(hosts).available()) {                                                \
      WARN("skipped: multi-host test bed unavailable: " << (hosts).why_not()); \
      return;                                                                  \
    }                                                                          \
  } while (false)
