// dtrain-worker: reads TF_CONFIG and the training config, finds its place in the group, trains.
// This is the table of contents; each step lives in its own file.
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/control_protocol.h"
#include "common/env_vars.h"
#include "common/errors.h"
#include "common/exit_codes.h"
#include "common/json.h"
#include "common/logging.h"
#include "common/run_dir.h"
#include "common/tf_config.h"
#include "common/thread_name.h"
#include "common/version.h"
#include "worker/comm/comm_factory.h"
#include "worker/comm/group_communicator.h"
#include "worker/data/dataset.h"
#include "worker/gpu/gpu_info.h"
#include "worker/nn/backend.h"
#include "worker/signal_origin.h"
#include "worker/train/evaluator.h"
#include "worker/train/model_parts.h"
#include "worker/train/preconditions.h"
#include "worker/train/train_config.h"
#include "worker/train/train_step.h"
#include "worker/train/trainer.h"
#include "worker/worker_options.h"

namespace dtrain::train {
namespace {

// SIGTERM (the launcher's teardown, or a preemption) never runs a handler on a working thread:
// the JIT GEMM kernels of Debian's oneDNN 2.x point rsp into the heap while they run, so a signal
// frame pushed on such a thread overwrites heap memory (oneDNN issue #4845, fixed upstream in
// 3.x). SIGTERM stays blocked in every thread (they inherit main's mask, blocked before any thread
// exists) and one thread takes it with sigwait: before catch_sigterm() it ends the process by
// SIGTERM as the default action would; after, it sets the flag the training loop reads each step.
// In place (docs/design.md#in-place-recovery), a SIGTERM that does not come from this worker's
// parent (the launcher, or the agent that relays the launcher's stop) or from the slurmstepd of
// that agent's step (which signals every process of the step) preempts this worker alone: it
// finishes its step and leaves, and a replacement takes its share; from them it is the job's
// stop, which the group agrees on and saves (worker/signal_origin.h).
// SIGUSR1 is blocked and taken by the same thread, for the same reason: the launcher's notice
// (docs/design.md#in-place-recovery), queued with sigqueue and the new generation G as its value,
// interrupts the live group's collective (GroupCommunicator::interrupt(G)) when there is one,
// since a peer cut off by the network closes nothing its peers could see. Any other SIGUSR1 (no
// value, no group: a spare, a run not in place) is ignored and never kills.
std::atomic<bool> g_catching_sigterm{false};
std::atomic<bool> g_leave_alone{false};  ///< set when in place: see above
std::atomic<bool> g_stop_requested{false};
std::atomic<bool> g_leave_requested{false};
std::atomic<int> g_leave_sender{0};
// Set before g_leave_alone (and read only once it is): who asks the launcher whether a SIGTERM
// from elsewhere is the whole job's stop (issue 43), and whether a question is under way.
SigtermAsker g_sigterm_asker;
std::atomic<bool> g_asking_launcher{false};
// How long a worker waits for the launcher's answer (which comes within about a second).
constexpr double kSigtermAnswerSeconds = 5;
std::atomic<int> g_noticed_generation{0};  ///< the newest generation a notice named

void end_by_sigterm() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  ::signal(SIGTERM, SIG_DFL);
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(SIGTERM);  // the default action: the whole process ends, by SIGTERM
}

// What the signal thread does with SIGUSR1 (see above), with what it needs under one lock: the
// live group, set by train() once the group is made and cleared before it is destroyed, and the
// logger, set once logging is set up. The signal thread never reaches spdlog's registry, whose
// default logger main() replaces without synchronising with readers; until then it is silent.
// The signal thread outlives main(): close() (main's last step) leaves it nothing to touch but
// this object, which is never destroyed, so a SIGUSR1 during static destruction, after spdlog's
// registry, sinks and the logger are gone, is taken and ignored (issue 43, item 19).
class NoticeTarget {
 public:
  /// From now on take() ignores every signal, silently. Waits for a take() under way to finish.
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    group_ = nullptr;
    log_.reset();
  }
  void set_group(comm::GroupCommunicator* group) {
    std::lock_guard<std::mutex> lock(mutex_);
    group_ = group;
  }
  void set_log(std::shared_ptr<spdlog::logger> log) {
    std::lock_guard<std::mutex> lock(mutex_);
    log_ = std::move(log);
  }
  void take(const siginfo_t& info) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    if (info.si_code != SI_QUEUE) {
      if (log_) log_->info("SIGUSR1 from pid {} without a generation: ignored", info.si_pid);
      return;
    }
    const int generation = info.si_value.sival_int;
    if (log_) log_->info("notice: the launcher re-forms the group as generation {}", generation);
    // A rendezvous under way for an older generation gives up (CommOptions::superseded).
    for (int seen = g_noticed_generation.load();
         generation > seen && !g_noticed_generation.compare_exchange_weak(seen, generation);) {
    }
    if (group_ && group_->interrupt(generation)) return;  // the trainer logs the break
    if (log_) {
      log_->info(
          "notice for generation {} ignored: {}", generation,
          group_ ? "this worker is not in an older generation's group" : "no group here to leave");
    }
  }

 private:
  std::mutex mutex_;
  bool closed_ = false;
  comm::GroupCommunicator* group_ = nullptr;
  std::shared_ptr<spdlog::logger> log_;
};
NoticeTarget& g_notice = *new NoticeTarget;  // never destroyed: the signal thread outlives main()

// Registers group for the notice for as long as it lives (declared after it: cleared first).
class NoticeRegistration {
 public:
  explicit NoticeRegistration(comm::GroupCommunicator* group) : active_(group != nullptr) {
    if (active_) g_notice.set_group(group);
  }
  ~NoticeRegistration() {
    if (active_) g_notice.set_group(nullptr);
  }
  NoticeRegistration(const NoticeRegistration&) = delete;
  NoticeRegistration& operator=(const NoticeRegistration&) = delete;

 private:
  bool active_;
};

// A SIGTERM from elsewhere, in place: the launcher says whether the whole job is stopping (then
// the group saves and stops together) or this worker alone is preempted. Asked on a thread of its
// own, so notices keep coming; a SIGTERM while a question is under way joins it.
void ask_about_sigterm(int sender) {
  if (g_asking_launcher.exchange(true)) return;
  std::thread([asker = g_sigterm_asker, sender] {
    common::name_this_thread("dt-sigterm");
    if (launcher_says_job_stop(asker, sender, kSigtermAnswerSeconds) || g_stop_requested) {
      g_stop_requested = true;
    } else {
      g_leave_sender = sender;
      g_leave_requested = true;
    }
    g_asking_launcher = false;
  }).detach();
}

void watch_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    common::name_this_thread("dt-signals");
    while (true) {
      siginfo_t info{};
      int taken = ::sigwaitinfo(&set, &info);
      if (taken == SIGUSR1) g_notice.take(info);
      if (taken != SIGTERM) continue;
      if (!g_catching_sigterm) end_by_sigterm();
      bool job_stop = info.si_code == SI_USER && sent_by_job_stopper(info.si_pid);
      if (g_leave_alone && !job_stop) {
        ask_about_sigterm(info.si_pid);
      } else {
        g_stop_requested = true;
      }
    }
  }).detach();
}

// main()'s last step: from here the signal thread touches no logger, group or other object that
// static destruction ends; SIGTERM keeps its meaning (it still ends the process, or sets a flag).
void quiet_signals() {
  g_leave_alone = false;  // a late SIGTERM sets a flag; it no longer reads g_sigterm_asker
  g_notice.close();
}

// From here on SIGTERM does not kill: it asks the group to save and stop at the next step.
void catch_sigterm() {
  g_catching_sigterm = true;
}

using common::ConfigError;

// How long a worker whose group broke waits for the launcher's answer (which waits up to 10 s for
// a failure to explain the break).
constexpr double kReformReplySeconds = 30;
// How many times a group that broke before it first formed asks for the next generation.
constexpr int kMaxStartRegroups = 5;
// How long a spare's request for promotion stays open before it asks again.
constexpr double kSpareRequestSeconds = 60;
// How long a spare waits before it loads its data and warms up. A new spare starts as the last one
// is promoted, while the group recovers (about 0.1 s); on a host without idle cores its start
// would take CPU from the recovery's rendezvous and first step.
constexpr double kSpareStartDelaySeconds = 0.5;

// The task this process plays: TF_CONFIG's, or a lone worker 0 when TF_CONFIG is unset.
common::TfConfig read_task() {
  std::optional<std::string> text = common::get_env(common::kEnvTfConfig);
  if (!text || text->empty()) {
    return common::TfConfig{common::ClusterSpec({{common::kWorker, {"localhost:0"}}}),
                            common::TaskId{common::kWorker, 0}, "", ""};
  }
  common::TfConfig config = common::parse_tf_config(*text);
  if (config.task.type == common::kPs) {
    throw ConfigError(
        "TF_CONFIG: task.type: \"ps\" (parameter server) tasks are not supported; "
        "dtrain trains with synchronous all-reduce (MultiWorkerMirroredStrategy)");
  }
  return config;
}

// The `train` object: the file's "train" member if it is a job file, else the whole file; and
// the job name when the file has one.
std::pair<std::string, std::string> read_train_config(const std::string& path) {
  if (path.empty()) throw ConfigError("--config is required (a job file or a train object)");
  // A worker on another host gets the file's text from the launcher (no shared file system).
  std::string text = common::get_env(common::kEnvConfigText).value_or("");
  try {
    if (text.empty()) text = common::read_file(path, common::kMaxJsonFileBytes);
  } catch (const common::IoError& e) {
    throw ConfigError(fmt::format("--config: {}", e.what()));
  }
  common::JsonDocument doc = common::JsonDocument::parse(text, path);
  common::JsonNode root = doc.root();
  if (!root.is_object())
    throw ConfigError(
        fmt::format("{}: top level: expected an object, found {}", path, root.describe()));
  std::string job = "dtrain";
  if (auto name = root.find("job"); name && name->is_string()) job = name->as_string();
  if (auto train = root.find("train")) return {train->dump(), job};
  return {root.dump(), job};
}

// The backend for train.device: cuda, cpu, or auto (CUDA when this build has it and a GPU is
// visible). Deciding creates no CUDA context; only the CUDA backend itself, which trains, does.
// On a CPU machine or build the log names the CPU device only (why not CUDA is a debug line).
// A mixed policy on a CPU without its 16-bit products (docs/design.md#mixed-precision): exit 2,
// or float32 with a warning where train.dtype_policy_fallback says so; checkpoints and
// model.json then record float32, the policy the model was trained under.
void cpu_fallback(TrainConfig& config, const std::string& source) {
  if (!config.dtype_policy_fallback) throw cpu_policy_error(config.math, source);
  spdlog::warn("train.dtype_policy \"{}\": {}; training in float32 (train.dtype_policy_fallback)",
               nn::math_mode_name(config.math), cpu_policy_lack(config.math));
  config.math = nn::MathMode::kFloat32;
}

std::unique_ptr<nn::Backend> choose_backend(TrainConfig& config, const std::string& source) {
  gpu::GpuInfo build = gpu::probe_build();
  bool gpu_usable = build.compiled && build.device_count > 0;
  bool cuda = false;
  switch (config.device) {
    case DeviceChoice::kCpu:
      break;
    case DeviceChoice::kAuto:
      cuda = gpu_usable;
      break;
    case DeviceChoice::kCuda:
      if (!build.compiled) {
        throw ConfigError(fmt::format(
            "{}: train.device: \"cuda\" needs dtrain's CUDA build; this one is CPU-only ({})",
            source, gpu::describe(build)));
      }
      if (build.device_count == 0) {
        throw ConfigError(fmt::format("{}: train.device: \"cuda\", but no GPU is visible ({})",
                                      source, gpu::describe(build)));
      }
      cuda = true;
      break;
  }
  bool automatic = config.device == DeviceChoice::kAuto;
  if (cuda) check_gpu_rule(config, source);  // docs/design.md#preconditions
  if (cuda) {
    std::unique_ptr<nn::Backend> backend = nn::make_cuda_backend(config.math);
    spdlog::info("device: {} on GPU {} ({}{})", backend->name(), backend->device().name(),
                 backend->device().location(), automatic ? ", picked by auto" : "");
    return backend;
  }
  if (automatic) spdlog::debug("train.device auto: not CUDA: {}", gpu::describe(build));
  if (config.math == nn::MathMode::kTf32) {
    spdlog::info("train.allow_tf32: no effect on the CPU (it computes in float32)");
    config.math = nn::MathMode::kFloat32;
  }
  if (!nn::cpu_supports(config.math)) cpu_fallback(config, source);
  std::unique_ptr<nn::Backend> backend = nn::make_dnnl_backend(config.math);
  spdlog::info("device: {}", backend->name());
  return backend;
}

// Sharded by file (train.data.shard_policy "file"), a worker decodes only its rank's share of the
// training files; a spare has no rank until promoted, and an evaluator reads no training split.
data::FileShard file_shard(const TrainConfig& config, const common::TfConfig& task,
                           const std::string& job, const std::optional<std::string>& spare) {
  if (config.data.shard_policy != "file" || spare || task.task.type == common::kEvaluator)
    return {};
  comm::RingIdentity id = comm::ring_identity_from_environment(task, job);
  return {static_cast<int>(id.rank), static_cast<int>(id.size)};
}

std::string run_dir_for(const WorkerOptions& options, const std::string& job) {
  std::string dir = !options.run_dir.empty()
                        ? options.run_dir
                        : common::get_env(common::kEnvRunDir).value_or("runs/" + job);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw common::IoError(fmt::format("cannot create run directory {}: {}", dir, ec.message()));
  return dir;
}

// A spare's model, optimizer and input slots, warmed by one step that leaves no trace
// (docs/design.md#spares), so that its promotion finds them ready.
ModelParts warm_spare(const TrainConfig& config, nn::Backend& backend,
                      const data::Dataset& train_data, const std::string& config_path,
                      Timeline& timeline) {
  try {
    ModelParts parts = warm_model_parts(config, backend, train_data);
    timeline.mark("warm");
    return parts;
  } catch (const ConfigError& e) {
    std::string message = e.what();  // layer shape errors name "model..." in the train object
    if (message.rfind("model", 0) == 0)
      throw ConfigError(fmt::format("{}: train.{}", config_path, message));
    throw;
  }
}

// A spare (docs/design.md#spares), warm, asks the launcher to be promoted, again each minute while
// it is not needed; nullopt when the job ended without needing it. IoError when the launcher
// cannot be reached (a spare never outlives its launcher).
std::optional<common::SpareAssignment> wait_for_promotion(const std::string& spare,
                                                          double warm_seconds) {
  common::ControlClient control(common::get_env(common::kEnvControl).value_or(""));
  if (!control.enabled()) {
    throw ConfigError(fmt::format("{} needs {}: a spare waits for the launcher",
                                  common::kEnvSpare.name, common::kEnvControl.name));
  }
  spdlog::info(
      "spare {}: warm: data and backend ready, model built and one warm-up step run (not trained "
      "on) in {:.0f} ms; waiting to be promoted",
      spare, warm_seconds * 1000);
  for (int unanswered = 0;;) {
    common::SpareRequest request{spare, static_cast<int>(::getpid())};
    double asked = common::monotonic_seconds();
    std::optional<common::SpareAssignment> place =
        control.request_promotion(request, kSpareRequestSeconds);
    if (place && !place->ok) {
      spdlog::info("spare {}: not needed ({})", spare, place->error);
      return std::nullopt;
    }
    if (place) return place;
    // A request the launcher could not take fails at once; one it held runs out its time.
    bool held = common::monotonic_seconds() - asked >= kSpareRequestSeconds / 2;
    unanswered = held ? 0 : unanswered + 1;
    if (unanswered >= 3) throw common::IoError("spare: the launcher cannot be reached");
    if (!held) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

// One training task: join the ring, train, and turn how it ended into an exit code.
int train(const common::TfConfig& task, std::optional<int> promoted_generation,
          const std::string& promoted_members, const std::string& job, const TrainConfig& config,
          nn::Backend& backend, data::Dataset train_data, data::Dataset test_data,
          const std::string& run_dir, const std::string& config_path, Timeline& timeline,
          double progress_line_seconds, ModelParts warm) {
  int attempt = comm::attempt_from_environment();
  comm::RingIdentity id = comm::ring_identity_from_environment(task, job);
  if (promoted_generation) id.generation = static_cast<uint32_t>(*promoted_generation);
  int generation = static_cast<int>(id.generation);
  // Elastic (docs/design.md#elastic-membership): the generation's members, from the launcher.
  std::optional<std::string> members_text = common::get_env(common::kEnvMembers);
  if (promoted_generation && members_text) members_text = promoted_members;
  const bool elastic = members_text.has_value();
  std::vector<int> members =
      common::parse_members(members_text.value_or(""), id.size, common::kEnvMembers.name);
  if (elastic) check_elastic(config, backend.device().kind() != nn::DeviceKind::kHost, config_path);
  auto shards_now = [&] { return comm::shard_plan(members, id.rank, id.size); };
  spdlog::info("task {}: rank {} of {}, attempt {}{}, {} training examples{}", task.task.text(),
               id.rank, id.size, attempt,
               generation > 0 ? fmt::format(" generation {}", generation) : "", train_data.count,
               elastic && !shards_now().full(static_cast<int>(members.size()))
                   ? fmt::format("; {} of {} members, holding {} shards from {}", members.size(),
                                 id.size, shards_now().held, shards_now().first)
                   : "");
  auto make_communicator = [&](int g) {
    comm::RingIdentity member = elastic ? comm::members_ring(id, members) : id;
    member.generation = static_cast<uint32_t>(g);
    comm::CommOptions options;
    // A notice of a newer generation ends a rendezvous that can no longer complete (a member of
    // g was replaced meanwhile) at once, instead of after its time-out.
    options.superseded = [g] { return g_noticed_generation.load() > g; };
    return comm::make_training_communicator(
        member, options, backend.device(),
        elastic ? comm::Communication::kRing : config.communication);
  };
  // In place (docs/design.md#in-place-recovery): the launcher answers reform requests, and this
  // worker keeps whole steps, which host devices and GPUs staged through the host do (checked
  // again once the group has formed).
  bool in_place = common::get_env_or_default(common::kEnvRecovery) == "in_place";
  // Read by the launcher to find a frozen member (docs/design.md#frozen-workers).
  common::ProgressRecordWriter record(common::get_env(common::kEnvProgressFile).value_or(""));
  common::ControlClient control(common::get_env(common::kEnvControl).value_or(""));
  std::unique_ptr<comm::GroupCommunicator> group;
  for (int regroups = 0; !group; ++regroups) {
    try {
      group = std::make_unique<comm::GroupCommunicator>(make_communicator, generation, &record);
    } catch (const ConfigError& e) {  // train.communication does not fit this worker: name it
      throw ConfigError(fmt::format("{}: {}", config_path, e.what()));
    } catch (const comm::GroupBroken& e) {
      // A member failed before the group first formed (killed while it loaded its data, say):
      // in place the group forms again with its replacement, as it does after a step.
      if (!in_place || regroups >= kMaxStartRegroups) throw;
      spdlog::warn("the group broke before training ({}): asking for the next generation",
                   e.what());
      // whole_step -1: it holds no state yet, so it says nothing of how far the group got.
      std::optional<common::ReformReply> reply = control.request_reform(
          {task.task.text(), attempt, generation, -1, false, e.what()}, kReformReplySeconds);
      if (!reply || !reply->ok) throw;
      generation = reply->generation;
      if (elastic) members = common::parse_members(reply->members, id.size, "reform reply");
    }
  }
  comm::Communicator* communicator = group.get();
  if (in_place && !train::whole_steps_possible(backend.device(), *communicator)) {
    spdlog::warn(
        "recovery in place needs whole steps, which NCCL cannot keep: a failure ends "
        "this worker (set train.communication to \"ring\" for recovery in place)");
    in_place = false;
  }
  // In place only: elsewhere nothing asks the launcher for the next generation, so a notice
  // is ignored. So is one to a world of one that is not elastic: it has no group to re-form (an
  // elastic group shrunk to one grows again, docs/design.md#elastic-membership).
  const bool noticed = in_place && (elastic || id.size > 1);
  NoticeRegistration notice(noticed ? group.get() : nullptr);
  timeline.mark("rendezvous");
  catch_sigterm();  // until here SIGTERM kills at once; from here it means "save and stop together"
  bool chief = task.cluster.is_chief(task.task);
  TrainerOptions trainer_options{
      run_dir, chief, task.task.text(), attempt, [] { return g_stop_requested.load(); }, &timeline};
  trainer_options.progress_line_seconds = progress_line_seconds;
  trainer_options.generation = generation;
  trainer_options.record = &record;
  if (elastic) {
    trainer_options.virtual_size = id.size;
    trainer_options.shards = shards_now();
  }
  if (config.ledger) {
    trainer_options.ledger_path = common::RunDir(run_dir).ledger_file(task.task);
    std::error_code ec;
    std::filesystem::create_directories(
        std::filesystem::path(trainer_options.ledger_path).parent_path(), ec);
  }
  if (in_place) {
    g_sigterm_asker = {common::get_env(common::kEnvControl).value_or(""), task.task.text(),
                       attempt};
    g_leave_alone = true;
    trainer_options.leave_requested = [] { return g_leave_requested.load(); };
    trainer_options.regroup = [&, group = group.get()](const std::string& what, int64_t whole_step,
                                                       bool in_flight) -> std::optional<Regrouped> {
      group->leave(what);
      common::ReformRequest request{task.task.text(), attempt,   group->generation(),
                                    whole_step,       in_flight, what};
      std::optional<common::ReformReply> reply =
          control.request_reform(request, kReformReplySeconds);
      if (!reply) {
        spdlog::error("the launcher did not answer the reform request within {:.0f} s",
                      kReformReplySeconds);
        return std::nullopt;
      }
      if (!reply->ok) {
        spdlog::error("no recovery in place: {}", reply->error);
        return std::nullopt;
      }
      if (elastic) {
        members = common::parse_members(reply->members, id.size, "reform reply");
        spdlog::info("joining generation {} with members {}", reply->generation,
                     common::format_members(members));
      } else {
        spdlog::info("joining generation {}", reply->generation);
      }
      group->join(reply->generation);
      return Regrouped{reply->generation, elastic ? shards_now() : comm::ShardPlan{}};
    };
  }
  try {
    Trainer trainer(config, backend, *communicator, std::move(train_data), std::move(test_data),
                    trainer_options, &control, std::move(warm));
    trainer.fit();
  } catch (const Preempted& e) {
    spdlog::warn("preempted: {}", e.what());
    return common::kExitPreempted;
  } catch (const NonFinite& e) {
    spdlog::error("{}", e.what());
    return common::kExitNonFinite;
  } catch (const LeftGroup& e) {
    spdlog::warn(
        "preempted alone (SIGTERM from pid {}): {}; a replacement takes this worker's share",
        g_leave_sender.load(), e.what());
    spdlog::default_logger()->flush();
    end_by_sigterm();
  } catch (const common::IoError& e) {
    communicator->abort(e.what());
    throw;
  } catch (const std::bad_alloc&) {
    communicator->abort("out of memory");
    throw;
  } catch (const ConfigError& e) {
    communicator->abort(e.what());
    std::string message = e.what();  // layer shape errors name "model..." in the train object
    if (message.rfind("model", 0) == 0)
      throw ConfigError(fmt::format("{}: train.{}", config_path, message));
    throw;
  }
  spdlog::info("finished{}", chief ? "; model written to " + run_dir + "/model" : "");
  return common::kExitSuccess;
}

int run_worker(const WorkerOptions& options) {
  if (options.help) {
    std::cout << worker_usage();
    return common::kExitSuccess;
  }
  if (options.version) {
    std::cout << "dtrain-worker " << DTRAIN_VERSION << "\n";
    return common::kExitSuccess;
  }
  if (options.print_gpu_count) {
    std::cout << gpu::probe_build().device_count << "\n";  // 0 in a CPU-only build, as --help says
    return common::kExitSuccess;
  }
  if (options.print_gpu) {
    std::cout << gpu::describe(gpu::probe_gpu()) << "\n";
    return common::kExitSuccess;
  }
  Timeline timeline;
  std::optional<std::string> spare = common::get_env(common::kEnvSpare);
  common::TfConfig task = spare ? common::TfConfig{} : read_task();
  bool supervised = common::get_env(common::kEnvControl).has_value() ||
                    common::get_env(common::kEnvRunDir).has_value();
  common::setup_logging(
      spare ? "" : common::worker_log_role(task.task.type, task.task.index, supervised));
  g_notice.set_log(spdlog::default_logger());
  auto [train_json, job] = read_train_config(options.config_path);
  TrainConfig config = parse_train_config(train_json, options.config_path);
  std::unique_ptr<nn::Backend> backend = choose_backend(config, options.config_path);
  timeline.mark("backend");
  if (spare) std::this_thread::sleep_for(std::chrono::duration<double>(kSpareStartDelaySeconds));
  // Keras's input shape: [h, w, c], or a language model's [T] (token ids).
  const std::vector<int> input_shape = config.model.data_shape();
  // The test split is read only where it is used: validation at epoch ends, or an evaluator.
  const bool need_test = config.validation || task.task.type == common::kEvaluator;
  auto [train_data, test_data] =
      data::load_data(config.data, input_shape, need_test, file_shard(config, task, job, spare));
  const int classes = config.model.units();
  data::check_labels_below(train_data, classes);
  data::check_labels_below(test_data, classes);
  timeline.mark("data");
  std::string run_dir = run_dir_for(options, job);
  std::optional<int> generation;
  std::string promoted_members;
  ModelParts warm;
  if (spare) {  // warm but idle until the launcher gives it a failed task's place
    double warming = common::monotonic_seconds();
    warm = warm_spare(config, *backend, train_data, options.config_path, timeline);
    std::optional<common::SpareAssignment> place =
        wait_for_promotion(*spare, common::monotonic_seconds() - warming);
    if (!place) return common::kExitSuccess;
    timeline.mark("promoted");
    task = common::parse_tf_config(place->tf_config);
    generation = place->generation;
    promoted_members = place->members;
    spdlog::info("promoted: spare {} takes the place of {} in generation {}", *spare, place->task,
                 place->generation);
    if (config.data.shard_policy == "file" && task.task.type != common::kEvaluator) {
      train_data = data::load_data(config.data, input_shape, false,
                                   file_shard(config, task, job, std::nullopt))
                       .first;  // the files of the place it takes
    }
  }
  if (task.task.type == common::kEvaluator) {
    if (!need_test) test_data = data::load_data(config.data, input_shape).second;  // a spare's
    catch_sigterm();  // from here SIGTERM means "evaluate the final model if it is there, then
                      // exit"
    int evaluations = run_evaluator(config, *backend, test_data,
                                    {run_dir, 0.5, [] { return g_stop_requested.load(); }});
    spdlog::info("evaluator: {} evaluation(s) in {}/eval.jsonl", evaluations, run_dir);
    return common::kExitSuccess;
  }
  return train(task, generation, promoted_members, job, config, *backend, std::move(train_data),
               std::move(test_data), run_dir, options.config_path, timeline,
               options.progress_line_seconds, std::move(warm));
}

}  // namespace
}  // namespace dtrain::train

int main(int argc, char** argv) {
  dtrain::train::watch_signals();  // first: every later thread inherits SIGTERM, SIGUSR1 blocked
  const int code = dtrain::common::run_main("dtrain-worker", [&] {
    std::vector<std::string> args(argv + 1, argv + argc);
    try {
      return dtrain::train::run_worker(dtrain::train::parse_worker_options(args));
    } catch (const std::bad_alloc&) {
      // The same model, batch and data would not fit on a restart either: a person must change
      // them (or the machine), so it is a configuration error (exit 2), not a restartable failure.
      throw dtrain::common::ConfigError(
          "out of memory: the model, batch size or data set does not fit in this machine's "
          "memory");
    }
  });
  dtrain::train::quiet_signals();  // last: the signal thread runs on through static destruction
  return code;
}
