// See processes.h. Reads /proc only; a process that vanishes mid-scan reads as empty files and
// is skipped or left out, never an error.
#include "test/support/processes.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "test/support/subprocess.h"

namespace dtrain::testing {

namespace fs = std::filesystem;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<int> all_pids() {
  std::vector<int> pids;
  DIR* proc = ::opendir("/proc");
  while (dirent* e = proc ? ::readdir(proc) : nullptr) {
    int pid = std::atoi(e->d_name);
    if (pid > 0) pids.push_back(pid);
  }
  if (proc) ::closedir(proc);
  return pids;
}

std::vector<ProcessEntry> live_processes() {
  std::vector<ProcessEntry> processes;
  std::set<int> mine = {static_cast<int>(::getpid())};
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = read_all("/proc/" + name + "/stat");
    size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close + 4 > stat.size()) {
      continue;
    }
    ProcessEntry process;
    process.pid = std::stoi(name);
    process.comm = stat.substr(open + 1, close - open - 1);
    process.ppid = std::atoi(stat.c_str() + close + 4);
    if (stat[close + 2] != 'Z') processes.push_back(process);
  }
  for (int pid = ::getppid(); pid > 1 && mine.insert(pid).second;) {
    auto it = std::find_if(processes.begin(), processes.end(),
                           [pid](const ProcessEntry& p) { return p.pid == pid; });
    pid = it == processes.end() ? 0 : it->ppid;
  }
  processes.erase(std::remove_if(processes.begin(), processes.end(),
                                 [&](const ProcessEntry& p) { return mine.count(p.pid) > 0; }),
                  processes.end());
  return processes;
}

std::vector<std::string> environment_of(int pid) {
  std::string env = read_all("/proc/" + std::to_string(pid) + "/environ");
  std::vector<std::string> entries;
  for (size_t at = 0; at < env.size();) {
    size_t end = env.find('\0', at);
    if (end == std::string::npos) end = env.size();
    entries.push_back(env.substr(at, end - at));
    at = end + 1;
  }
  return entries;
}

std::string env_value(const std::vector<std::string>& env, const std::string& name) {
  for (const std::string& entry : env)
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
  return "";
}

bool is_zombie(int pid) {
  std::string stat = read_all("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z';
}

std::vector<int> processes_of_run(const std::string& run_dir) {
  std::vector<int> found;
  for (int pid : all_pids()) {
    if (env_value(environment_of(pid), "DTRAIN_RUN_DIR") == run_dir && !is_zombie(pid))
      found.push_back(pid);
  }
  return found;
}

std::vector<std::string> command_lines_with(const std::vector<std::string>& needles) {
  std::vector<std::string> hits;
  for (int pid : all_pids()) {
    std::string cmdline = read_all("/proc/" + std::to_string(pid) + "/cmdline");
    for (const std::string& needle : needles)
      if (!needle.empty() && cmdline.find(needle) != std::string::npos)
        hits.push_back(std::to_string(pid) + ": " + cmdline);
  }
  return hits;
}

bool mentions(const std::string& text, const std::string& dir) {
  for (size_t at = text.find(dir); at != std::string::npos; at = text.find(dir, at + 1)) {
    char next = at + dir.size() < text.size() ? text[at + dir.size()] : '\0';
    if (next == '\0' || next == '/' || next == ' ') return true;
  }
  return false;
}

std::string link_target(const std::string& link) {
  std::error_code ec;
  return fs::read_symlink(link, ec).string();
}

bool uses_dir(int pid, const std::string& dir) {
  std::string proc = "/proc/" + std::to_string(pid);
  if (mentions(link_target(proc + "/cwd"), dir)) return true;
  std::error_code ec;
  for (const auto& fd : fs::directory_iterator(proc + "/fd", ec)) {
    if (mentions(link_target(fd.path().string()), dir)) return true;
  }
  return false;
}

bool names_dir(int pid, const std::string& dir) {
  std::string cmdline = read_all("/proc/" + std::to_string(pid) + "/cmdline");
  std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
  return mentions(cmdline, dir);
}

std::vector<int> with_descendants(const std::vector<ProcessEntry>& processes,
                                  std::vector<int> roots) {
  std::set<int> seen(roots.begin(), roots.end());
  for (size_t i = 0; i < roots.size(); ++i) {
    for (const auto& p : processes) {
      if (p.ppid == roots[i] && seen.insert(p.pid).second) roots.push_back(p.pid);
    }
  }
  return roots;
}

bool wait_for(const std::function<bool()>& done, double seconds) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

long dead_creator(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return 0;
  char* end = nullptr;
  long pid = std::strtol(name.c_str() + prefix.size(), &end, 10);
  if (pid <= 0 || *end != '-') return 0;
  return process_alive(static_cast<int>(pid)) ? 0 : pid;
}

}  // namespace dtrain::testing
