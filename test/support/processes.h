// Generic /proc scanning for tests and benchmarks: reading a file whole, listing processes with
// their parents, environments and command lines, and telling which of them a run or a dir holds.
// Linux only, and every answer is a snapshot that may be stale a moment later. It deliberately
// signals, kills and reaps nothing, and knows no fixture (Slurm, namespaces): callers decide.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace dtrain::testing {

/// One process as /proc/<pid>/stat shows it.
struct ProcessEntry {
  int pid = 0;
  int ppid = 0;
  std::string comm;  ///< the name in parentheses, at most 15 bytes
};

/// The whole file at path, byte for byte; "" when it cannot be read.
std::string read_all(const std::string& path);
/// Every pid in /proc right now, zombies included.
std::vector<int> all_pids();
/// Live (not zombie) processes except this process and its ancestors up to init: a sweep of what
/// it returns never kills the caller, the shell it runs in (which may sit in a fixture's dir) or
/// anything the test runs under.
std::vector<ProcessEntry> live_processes();
/// NAME=value entries of pid's environment; empty when it cannot be read (gone, kernel thread).
std::vector<std::string> environment_of(int pid);
/// The value of the first NAME=value entry of env with this name; "" when there is none.
std::string env_value(const std::vector<std::string>& env, const std::string& name);
/// True when pid is a zombie, or its stat cannot be read (gone): either way, not running.
bool is_zombie(int pid);
/// Live (not zombie) processes whose environment has DTRAIN_RUN_DIR=run_dir: the workers of a
/// run, on any host of a test bed that shares this machine's /proc.
std::vector<int> processes_of_run(const std::string& run_dir);
/// "<pid>: <command line>" (arguments NUL-separated as in /proc) for each process whose command
/// line contains one of needles, once per needle it contains; empty needles match nothing.
std::vector<std::string> command_lines_with(const std::vector<std::string>& needles);
/// True when text holds the path dir itself, not merely a longer name that starts with it.
bool mentions(const std::string& text, const std::string& dir);
/// Where the symlink link points; "" when it is no symlink or cannot be read.
std::string link_target(const std::string& link);
/// Whether pid's working dir or one of its open files lies in dir.
bool uses_dir(int pid, const std::string& dir);
/// Whether dir appears in pid's command line (e.g. a daemon started with -f <dir>/x.conf).
bool names_dir(int pid, const std::string& dir);
/// roots, then each descendant of theirs in processes (once, parents before children).
std::vector<int> with_descendants(const std::vector<ProcessEntry>& processes,
                                  std::vector<int> roots);
/// The pid in "<prefix><pid>-..." (a fixture's name, made by the test process that owns it) when
/// that process no longer runs, else 0 (also for a name of another form). A zombie counts as
/// gone: an init that reaps lazily keeps a killed test process around as one for a while.
long dead_creator(const std::string& name, const std::string& prefix);
/// Calls done every 0.1 s until it returns true (then true) or seconds passed (then false).
bool wait_for(const std::function<bool()>& done, double seconds);

}  // namespace dtrain::testing
