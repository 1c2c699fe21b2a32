// See signal_origin.h.
#include "worker/signal_origin.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "common/control_protocol.h"

namespace dtrain::train {
namespace {

// The parent of pid from /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may hold spaces and
// parentheses: the fields start after the last ')'); 0 when it cannot be read.
int parent_of(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return 0;
  size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 1));
  std::string state;
  int ppid = 0;
  return fields >> state >> ppid ? ppid : 0;
}

std::string name_of(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

}  // namespace

bool sent_by_job_stopper(int sender) {
  if (sender <= 1) return false;
  int pid = static_cast<int>(::getppid());
  if (sender == pid) return true;
  // A chain longer than this is a loop in what /proc said (a pid reused meanwhile).
  constexpr int kMaxDepth = 256;
  for (int depth = 0; pid > 1 && depth < kMaxDepth; ++depth) {
    pid = parent_of(pid);
    if (pid == sender) return name_of(pid) == "slurmstepd";
  }
  return false;
}

bool launcher_says_job_stop(const SigtermAsker& asker, int sender, double timeout_seconds) {
  common::ControlClient client(asker.control_address);
  if (!client.enabled()) return false;
  std::optional<bool> job_stop =
      client.ask_about_sigterm({asker.task, asker.attempt, sender}, timeout_seconds);
  return job_stop.value_or(false);
}

}  // namespace dtrain::train
