// A real Slurm cluster on this machine for integration tests: its own munged, one slurmctld and
// two slurmd (nodes n1 and n2, 4 CPUs each, emulated with `slurmd -N`), all configured in a
// private temp dir. It does not isolate files, users, processes or the network: jobs run as root
// on this machine, and both "nodes" are 127.0.0.1. Needs root and Debian's slurmctld, slurmd,
// slurm-client and munge (Slurm 22.05).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "test/support/subprocess.h"

namespace dtrain::testing {

/// Owns a temp dir "dtrain-slurm-<pid>-<seq>-XXXXXX" (0700) holding slurm.conf, a generated munge
/// key, munged's socket, the controller's state, each node's spool dir, and every daemon's pid
/// file and log; and the daemons themselves: munged (daemonized, stopped by its pid file),
/// slurmctld and two slurmd (children of this process, in the foreground). Ports are picked free
/// by the OS, so fixtures in parallel processes do not meet. Requeued jobs may start again after
/// about 6 s (AuthInfo cred_expire=5; Slurm's default holds them for 121 s). Construction sweeps
/// the daemons, job processes and temp dirs of fixtures whose test process died before its
/// destructor ran. One thread owns a fixture; nothing is thread-safe.
class SlurmCluster {
 public:
  /// Starts the daemons and waits up to 20 s until sinfo reports both nodes idle (about 1 s in
  /// practice). When the machine refuses (not root, a Slurm or munge binary missing, a daemon
  /// exits at start, e.g. a plugin missing), available() is false, why_not() says why (with the
  /// daemon's log) and nothing is left behind; under DTRAIN_REQUIRE_TESTBEDS=1
  /// (test/support/test_beds.h) it throws std::runtime_error saying why instead. Nodes never idle
  /// in 20 s throws std::runtime_error with the tails of the daemon logs, after cleaning up.
  explicit SlurmCluster();
  /// Cancels every job (scancel, then SIGKILL to what the jobs run after 0.5 s: a cancelled job
  /// whose processes ignore SIGTERM would otherwise stay COMPLETING for KillWait, 10 s) and waits
  /// up to 15 s for the queue to drain; stops each slurmd, slurmctld and munged (SIGTERM by pid,
  /// SIGKILL after 2 s); SIGKILLs any process still tied to the temp dir (slurmstepd and its
  /// descendants, and anything with the dir in its command line, working dir or open files); and
  /// deletes the dir. About 0.15 s for an idle cluster, 4 s with a job that ignores SIGTERM. Never
  /// throws.
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  bool available() const { return why_not_.empty(); }
  /// Why the machine refused, for a Catch2 WARN; empty when available.
  const std::string& why_not() const { return why_not_; }

  /// The private temp dir. Client commands run() here by default, so a batch job's default
  /// output file is dir()/slurm-<job id>.out.
  const std::string& dir() const { return dir_; }
  const std::string& conf_path() const { return conf_path_; }
  /// {"n1", "n2"}: the partition "debug" (the default) holds both.
  std::vector<std::string> node_names() const;

  /// Environment to add for any Slurm client command: {SLURM_CONF, conf_path()}. Jobs inherit
  /// it from sbatch and srun, so clients inside a job reach this cluster too.
  std::vector<std::pair<std::string, std::string>> client_env() const;
  /// Runs a client command (sbatch, srun, salloc, scontrol, squeue, sinfo, scancel) to completion
  /// or options.timeout_seconds, with client_env() added, every other inherited SLURM_* variable
  /// unset (a test run inside a real allocation must not point the clients at it) and the
  /// working dir dir() unless options.cwd says otherwise. options.env wins over both.
  ProcessResult run(const std::vector<std::string>& argv, ProcessOptions options = {}) const;
  /// `sbatch --parsable <args...> <script>`, 60 s at most; returns the job id. Throws
  /// std::runtime_error with sbatch's output when it fails.
  std::string sbatch(const std::string& script, const std::vector<std::string>& args = {}) const;
  /// `scontrol -o show job <id>` as a key=value map (JobState, ExitCode, Restarts, NodeList,
  /// BatchFlag, ...). Empty when the controller does not know the job. Completed jobs stay
  /// known for 600 s (MinJobAge).
  std::map<std::string, std::string> job_info(const std::string& job_id) const;
  /// Polls job_info every 0.2 s until JobState is one of states or timeout_seconds passed;
  /// returns the last JobState seen ("" if the job was never known).
  std::string wait_job_state(const std::string& job_id, const std::vector<std::string>& states,
                             double timeout_seconds) const;
  /// Every live process of this cluster's jobs right now: the slurmstepd processes tied to dir()
  /// (by their open log file or working dir, never by name alone) and all their descendants.
  std::vector<int> job_processes() const;

 private:
  void set_up();
  void write_config();
  void start_munged();
  void start_slurm_daemons();
  void wait_nodes_idle();
  std::string daemon_logs() const;
  void cancel_jobs() noexcept;
  void stop_munged() noexcept;
  void tear_down() noexcept;

  std::string why_not_;
  std::string name_;  ///< "dtrain-slurm-<pid>-<seq>-"
  std::string dir_;
  std::string conf_path_;
  int munged_pid_ = 0;
  std::unique_ptr<BackgroundProcess> slurmctld_;
  std::vector<std::unique_ptr<BackgroundProcess>> slurmd_;
};

}  // namespace dtrain::testing

/// In a Catch2 test: WARN why and return when the Slurm test bed is unavailable on this machine
/// (never under DTRAIN_REQUIRE_TESTBEDS=1, where the constructor throws instead).
#define SKIP_UNLESS_SLURM(cluster)                                          \
  do {                                                                      \
    if (!(cluster).available()) {                                           \
      WARN("skipped: Slurm test bed unavailable: " << (cluster).why_not()); \
      return;                                                               \
    }                                                                       \
  } while (false)
