// See run_preparation.h.
#include "launcher/plan/run_preparation.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/control_protocol.h"
#include "common/env_vars.h"
#include "common/errors.h"
#include "common/gpu_count.h"
#include "common/json.h"
#include "launcher/control/control_server.h"
#include "launcher/plan/train_section.h"
#include "launcher/plan/worker_env.h"

namespace dtrain::launcher {
namespace fs = std::filesystem;
namespace {

common::UniqueFd lock_run_dir(const common::RunDir& run_dir) {
  common::UniqueFd fd(::open(run_dir.lock_file().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    throw common::IoError(
        fmt::format("cannot open {}: {}", run_dir.lock_file(), std::strerror(errno)));
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    // The holder names itself in state.json, which it writes just after taking the lock: wait
    // up to a second for it, then refuse without the pid.
    std::string holder;
    for (int attempt = 0; attempt < 20 && holder.empty(); ++attempt) {
      try {
        common::JsonDocument doc =
            common::JsonDocument::parse(common::read_file(run_dir.state_json()), "state.json");
        holder =
            fmt::format(" (launcher pid {})", doc.root().at("launcher_pid").as_int(0, 1 << 30));
      } catch (const std::exception&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    throw common::ConfigError(fmt::format(
        "run directory {} is in use by a running launcher{}: see `dtrain status {}`, follow it "
        "with `dtrain logs -f {}`, or stop it with `dtrain stop {}`",
        run_dir.root(), holder, run_dir.root(), run_dir.root(), run_dir.root()));
  }
  return fd;
}

void make_dir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST)
    throw common::IoError(fmt::format("cannot create {}: {}", path, std::strerror(errno)));
}

// Creates the run directory for this user only (0700). One that exists keeps its mode: it may be
// shared, like /tmp (1777), and is the user's to protect; the control socket in it is 0600.
void make_run_dir(const common::RunDir& run_dir) {
  std::error_code ec;
  fs::create_directories(fs::path(run_dir.root()).parent_path(), ec);
  if (ec) throw common::IoError(fmt::format("cannot create {}: {}", run_dir.root(), ec.message()));
  make_dir(run_dir.root(), 0700);
  struct stat info {};
  if (::stat(run_dir.root().c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
    throw common::ConfigError(fmt::format("run directory {} is not a directory", run_dir.root()));
  if (info.st_mode & (S_IWGRP | S_IWOTH))
    spdlog::warn(
        "run directory {} is writable by other users (mode {:o}): they can change its files",
        run_dir.root(), info.st_mode & 07777);
  make_dir(run_dir.logs_dir(), 0755);
  make_dir(run_dir.progress_dir(), 0700);
}

// True when /proc/<pid>/environ has DTRAIN_RUN_DIR=<run_dir>: the process is a worker of this run.
bool belongs_to_run(int pid, const std::string& run_dir) {
  std::ifstream environ(fmt::format("/proc/{}/environ", pid), std::ios::binary);
  std::string entry;
  std::string wanted = std::string(common::kEnvRunDir.name) + "=" + run_dir;
  while (std::getline(environ, entry, '\0')) {
    if (entry == wanted) return true;
  }
  return false;
}

// GPUs on this host the launcher may hand out: the NVIDIA driver's count (/proc/driver/nvidia),
// limited by the launcher's own CUDA_VISIBLE_DEVICES. Starts no process and loads no CUDA.
int count_local_gpus() {
  return common::count_visible_gpus(common::get_env(common::kEnvCudaDevices));
}

// The backup folder of a dtrain-worker job: train.backup.dir, relative to the run directory.
std::string backup_folder(const common::JobSpec& spec, const common::RunDir& run_dir) {
  const std::string dir =
      read_train_section(spec).value_or(train::TrainConfig{}).backup.dir;  // default "backup"
  return (fs::path(run_dir.root()) / dir).lexically_normal().string();
}

// --fresh: what a finished or stopped run produced, so the job trains from scratch.
void remove_results(const common::JobSpec& spec, const common::RunDir& run_dir) {
  for (const std::string& path :
       {backup_folder(spec, run_dir), run_dir.model_dir(), run_dir.metrics_jsonl(),
        run_dir.root() + "/eval.jsonl", run_dir.root() + "/tensorboard"}) {
    std::error_code ec;
    if (fs::remove_all(path, ec) > 0)
      spdlog::info("--fresh: removed {}", path);
    else if (ec)
      throw common::IoError(fmt::format("--fresh: cannot remove {}: {}", path, ec.message()));
  }
}

}  // namespace

std::string find_worker_program() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path candidate : {self.parent_path() / "dtrain-worker",
                               self.parent_path().parent_path() / "worker" / "dtrain-worker"}) {
      if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    }
  }
  return "dtrain-worker";  // looked up on PATH when spawned
}

int end_stale_workers(const std::string& run_dir) {
  common::RunDir dir(run_dir);
  if (!fs::exists(dir.state_json())) return 0;
  std::vector<int> groups;
  try {
    common::JsonDocument doc =
        common::JsonDocument::parse(common::read_file(dir.state_json()), "state.json");
    for (const common::JsonNode& worker : doc.root().at("workers").as_array()) {
      int pid = static_cast<int>(worker.at("pid").as_int(0, 1 << 30));
      if (pid > 0 && belongs_to_run(pid, run_dir)) groups.push_back(pid);
    }
  } catch (const std::exception& e) {
    spdlog::warn("cannot read {} to look for stale workers: {}", dir.state_json(), e.what());
    return 0;
  }
  for (int pgid : groups) {
    spdlog::warn("ending stale worker process group {} left by an earlier launcher", pgid);
    ::killpg(pgid, SIGKILL);
  }
  for (int i = 0; i < 100 && !groups.empty(); ++i) {  // up to 5 s for the kernel to reap them
    groups.erase(std::remove_if(groups.begin(), groups.end(),
                                [](int pgid) { return ::killpg(pgid, 0) != 0; }),
                 groups.end());
    if (!groups.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return static_cast<int>(groups.size());
}

int next_attempt(const common::RunDir& run_dir) {
  if (!fs::exists(run_dir.state_json())) return 0;
  try {
    common::JsonDocument doc =
        common::JsonDocument::parse(common::read_file(run_dir.state_json()), "state.json");
    return static_cast<int>(doc.root().at("attempt").as_int(0, 1 << 30)) + 1;
  } catch (const std::exception& e) {
    spdlog::warn("ignoring unreadable {}: {}", run_dir.state_json(), e.what());
    return 0;
  }
}

std::string run_root(const common::JobSpec& spec) {
  std::string root = fs::absolute(spec.run_dir).lexically_normal().string();
  if (root.size() > 1 && root.back() == '/') root.pop_back();
  return root;
}

LaunchContext make_launch_context(const common::JobSpec& spec, const std::string& root) {
  LaunchContext c;
  c.spec = &spec;
  if (spec.slurm) {
    c.slurm = read_slurm_allocation(spec);
    c.cluster = c.slurm->cluster();
  } else {
    c.cluster = common::resolve_cluster(spec);
  }
  c.run_dir = root;
  c.spec_path = common::RunDir(root).spec_json();
  c.spec_text = common::job_spec_to_json(spec, c.cluster) + "\n";
  c.control_address = common::kControlScheme + control_socket_path(root);
  c.worker_program = find_worker_program();
  std::error_code self_error;
  fs::path self = fs::read_symlink("/proc/self/exe", self_error);
  if (!self_error) c.dtrain_program = self.string();
  c.cwd = fs::current_path().string();
  c.host_cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  c.launcher_omp_threads = common::get_env(common::kEnvOmpThreads);
  c.local_gpus = spec.slurm ? 0 : count_local_gpus();  // Slurm hands out a step's GPUs
  if (std::optional<std::string> visible = common::get_env(common::kEnvCudaDevices)) {
    c.gpu_names = common::visible_gpu_names(visible, common::count_driver_gpus());
  }
  return c;
}

bool run_dir_locked(const common::RunDir& run_dir) {
  struct stat lock {};
  if (::stat(run_dir.lock_file().c_str(), &lock) != 0) return false;
  // /proc/locks: "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF" (device in hex, inode in
  // decimal); waiters' lines have "->" as their second field.
  std::ifstream locks("/proc/locks");
  if (!locks) {  // no /proc: ask for the lock itself, for an instant
    common::UniqueFd fd(::open(run_dir.lock_file().c_str(), O_RDONLY | O_CLOEXEC));
    return fd.valid() && ::flock(fd.get(), LOCK_SH | LOCK_NB) != 0;
  }
  std::string want = fmt::format("{:02x}:{:02x}:{}", major(lock.st_dev), minor(lock.st_dev),
                                 static_cast<unsigned long>(lock.st_ino));
  for (std::string line; std::getline(locks, line);) {
    std::istringstream fields(line);
    std::string number, kind, mode, access, pid, file;
    fields >> number >> kind;
    if (kind != "FLOCK") continue;
    fields >> mode >> access >> pid >> file;
    if (file == want) return true;
  }
  return false;
}

bool same_work_as_recorded(const common::JobSpec& spec, const common::RunDir& run_dir) {
  try {
    common::JsonDocument doc =
        common::JsonDocument::parse(common::read_file(run_dir.spec_json()), "spec.json");
    common::JsonNode root = doc.root();
    std::optional<common::JsonNode> train = root.find("train");
    std::string recorded_train = train ? train->dump() : "";
    std::string wanted_train =
        spec.train_json ? common::JsonDocument::parse(*spec.train_json, "train").root().dump() : "";
    std::vector<std::string> recorded_command;
    if (auto command = root.find("command"))
      for (const common::JsonNode& word : command->as_array())
        recorded_command.push_back(word.as_string());
    return recorded_train == wanted_train && recorded_command == spec.command;
  } catch (const std::exception&) {
    return false;  // no readable record: not known to be the same
  }
}

namespace {

// train without its epochs, and its epochs (1 when absent, the worker's default as Keras's fit).
std::pair<std::string, int64_t> split_epochs(const common::JsonNode& train) {
  common::JsonWriter w;
  w.begin_object();
  int64_t epochs = 1;
  for (const auto& [key, value] : train.as_object()) {
    if (key == "epochs") {
      epochs = value.as_int(0, INT32_MAX);
      continue;
    }
    w.key(key).raw(value.dump());
  }
  return {w.end_object().str(), epochs};
}

// The first key of train whose value differs between two train sections ("" when none).
std::string first_difference(const common::JsonNode& recorded, const common::JsonNode& wanted) {
  std::map<std::string, std::string> before, after;
  for (const auto& [key, value] : recorded.as_object()) before[key] = value.dump();
  for (const auto& [key, value] : wanted.as_object()) after[key] = value.dump();
  for (const auto& [key, value] : after)
    if (key != "epochs" && (!before.count(key) || before[key] != value)) return "train." + key;
  for (const auto& [key, value] : before)
    if (key != "epochs" && !after.count(key)) return "train." + key;
  return "";
}

// The newest checkpoint's name in folder's checkpoint.json, "" when there is none.
std::string newest_checkpoint(const std::string& folder) {
  try {
    common::JsonDocument index =
        common::JsonDocument::parse(common::read_file(folder + "/checkpoint.json"), folder);
    return index.root().at("latest").as_string();
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace

RunStart run_start(const common::JobSpec& spec, const common::RunDir& run_dir, bool fresh) {
  using Kind = RunStart::Kind;
  if (fresh) return {Kind::kFresh, "starts from scratch (--fresh)"};
  const bool succeeded = recorded_status(run_dir) == common::kStatusSucceeded;
  if (succeeded && same_work_as_recorded(spec, run_dir))
    return {Kind::kFinished, "has nothing to do"};
  if (!spec.train_json) return {Kind::kFresh, "runs its command"};
  if (succeeded) {
    try {
      common::JsonDocument recorded_doc =
          common::JsonDocument::parse(common::read_file(run_dir.spec_json()), "spec.json");
      std::optional<common::JsonNode> recorded = recorded_doc.root().find("train");
      common::JsonDocument wanted_doc = common::JsonDocument::parse(*spec.train_json, "train");
      if (recorded && recorded->is_object() && wanted_doc.root().is_object()) {
        const auto [recorded_rest, done] = split_epochs(*recorded);
        const auto [wanted_rest, epochs] = split_epochs(wanted_doc.root());
        const std::string state = run_dir.model_dir() + "/state";
        if (epochs > done && done > 0) {
          // The chief's model/ is on the chief's host: a local model/ without a state is a run
          // that finished before final states were kept.
          if (fs::exists(run_dir.model_dir()) && newest_checkpoint(state).empty() &&
              newest_checkpoint(backup_folder(spec, run_dir)).empty()) {
            return {Kind::kRefused,
                    fmt::format("job \"{}\" finished {} epochs in {}, but {} holds no final state "
                                "to continue from; `dtrain launch --fresh` trains it again from "
                                "scratch",
                                spec.job, done, run_dir.root(), state)};
          }
          std::string what = fmt::format(
              "continues the finished run from epoch {} to epoch {} (its final state in {})", done,
              epochs, state);
          if (recorded_rest != wanted_rest) {
            what += fmt::format(" under the job's new settings ({} changed, among others)",
                                first_difference(*recorded, wanted_doc.root()));
          }
          return {Kind::kContinue, what};
        }
        const std::string changed =
            epochs != done ? "train.epochs" : first_difference(*recorded, wanted_doc.root());
        return {Kind::kRefused,
                fmt::format("job \"{}\" already succeeded in {} after {} epochs, and its {} "
                            "changed since: only a larger train.epochs continues a finished run; "
                            "`dtrain launch --fresh` trains it again from scratch, or give it "
                            "another run_dir",
                            spec.job, run_dir.root(), done, changed)};
      }
    } catch (const std::exception&) {  // an unreadable record: launch as before
    }
  }
  const std::string backup = backup_folder(spec, run_dir);
  if (std::string newest = newest_checkpoint(backup); !newest.empty())
    return {Kind::kResume,
            fmt::format("resumes from its newest checkpoint, {}/{}", backup, newest)};
  return {Kind::kFresh, "starts from scratch"};
}

std::string recorded_status(const common::RunDir& run_dir) {
  if (!fs::exists(run_dir.state_json())) return "";
  try {
    common::JsonDocument doc =
        common::JsonDocument::parse(common::read_file(run_dir.state_json()), "state.json");
    std::string status = doc.root().at("status").as_string();
    return common::is_final_status(status) ? status : "";
  } catch (const std::exception&) {
    return "";
  }
}

PreparedRun prepare_run(const common::JobSpec& spec, bool fresh) {
  PreparedRun run;
  std::string root = run_root(spec);
  run.run_dir = common::RunDir(root);
  make_run_dir(run.run_dir);
  run.lock = lock_run_dir(run.run_dir);
  end_stale_workers(root);
  if (fresh) remove_results(spec, run.run_dir);
  run.first_attempt = next_attempt(run.run_dir);
  LaunchContext context = make_launch_context(spec, root);
  context.token = random_token();
  run.plan = plan_launch(std::move(context));
  common::write_file_atomically(run.plan.context.spec_path, run.plan.context.spec_text);
  return run;
}

std::vector<std::string> tail_lines(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (lines.size() > n) lines.pop_front();
  }
  return {lines.begin(), lines.end()};
}

}  // namespace dtrain::launcher
