// dtrain-worker: reads TF_CONFIG and the training config, finds its place in the group, trains.
// This is the table of contents; each step lives in its own file.
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
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
#include "common/version.h"
#include "worker/comm/comm_factory.h"
#include "worker/comm/group_communicator.h"
#include "worker/data/dataset.h"
#include "worker/gpu/gpu_info.h"
#include "worker/model_commands.h"
#include "worker/nn/backend.h"
#include "worker/spec/preconditions.h"
#include "worker/spec/train_config.h"
#include "worker/train/evaluator.h"
#include "worker/train/model_parts.h"
#include "worker/train/recovery_client.h"
#include "worker/train/train_step.h"
#include "worker/train/trainer.h"
#include "worker/worker_options.h"
#include "worker/worker_signals.h"

namespace dtrain::train {
namespace {

using common::ConfigError;

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

// The recovery client's options (docs/design.md#the-workers-recovery-client): this worker's
// place in the cluster and the generation it starts in (a promoted spare's, from its
// assignment), an elastic job's members, and whether the launcher re-forms the group in place.
RecoveryOptions recovery_options(const common::TfConfig& task, const std::string& job,
                                 std::optional<int> promoted_generation,
                                 const std::string& promoted_members) {
  RecoveryOptions options;
  options.task = task.task.text();
  options.attempt = comm::attempt_from_environment();
  options.ring = comm::ring_identity_from_environment(task, job);
  if (promoted_generation) options.ring.generation = static_cast<uint32_t>(*promoted_generation);
  // Elastic (docs/design.md#elastic-membership): the generation's members, from the launcher.
  std::optional<std::string> members = common::get_env(common::kEnvMembers);
  if (promoted_generation && members) members = promoted_members;
  if (members) {
    options.members = common::parse_members(*members, options.ring.size, common::kEnvMembers.name);
  }
  // In place (docs/design.md#in-place-recovery): the launcher answers reform requests, and this
  // worker keeps whole steps, which host devices and GPUs staged through the host do (checked
  // again once the group has formed).
  options.in_place = common::get_env_or_default(common::kEnvRecovery) == "in_place";
  return options;
}

// Makes a generation's communicator for the recovery client: the job's transport (the TCP ring
// when elastic), given up at once when a notice names a newer generation.
RecoveryClient::Factory communicator_factory(const TrainConfig& config, nn::Backend& backend,
                                             bool elastic) {
  return [&config, &backend, elastic](const comm::RingIdentity& ring) {
    comm::CommOptions options;
    // A notice of a newer generation ends a rendezvous that can no longer complete (a member of
    // this generation was replaced meanwhile) at once, instead of after its time-out.
    options.superseded = [g = static_cast<int>(ring.generation)] {
      return noticed_generation() > g;
    };
    return comm::make_training_communicator(
        ring, options, backend.device(),
        elastic ? comm::Communication::kRing : config.communication);
  };
}

void log_task(const common::TfConfig& task, const RecoveryClient& recovery, int attempt,
              int64_t examples) {
  const comm::RingIdentity& id = recovery.ring();
  std::optional<comm::ShardPlan> shards = recovery.shards();
  spdlog::info(
      "task {}: rank {} of {}, attempt {}{}, {} training examples{}", task.task.text(), id.rank,
      id.size, attempt,
      recovery.generation() > 0 ? fmt::format(" generation {}", recovery.generation()) : "",
      examples,
      shards && !shards->full(static_cast<int>(recovery.members().size()))
          ? fmt::format("; {} of {} members, holding {} shards from {}", recovery.members().size(),
                        id.size, shards->held, shards->first)
          : "");
}

// The starting generation's group. In place only where this worker can keep whole steps, which
// host devices and GPUs staged through the host do.
comm::Communicator& form_group(RecoveryClient& recovery, nn::Backend& backend,
                               const std::string& config_path) {
  comm::Communicator* group = nullptr;
  try {
    group = &recovery.form();
  } catch (const ConfigError& e) {  // train.communication does not fit this worker: name it
    throw ConfigError(fmt::format("{}: {}", config_path, e.what()));
  }
  if (recovery.in_place() && !train::whole_steps_possible(backend.device(), *group)) {
    spdlog::warn(
        "recovery in place needs whole steps, which NCCL cannot keep: a failure ends "
        "this worker (set train.communication to \"ring\" for recovery in place)");
    recovery.give_up_in_place();
  }
  return *group;
}

// Trains, and turns how training ended into an exit code.
int fit(const TrainConfig& config, nn::Backend& backend, comm::Communicator& communicator,
        data::Dataset train_data, data::Dataset test_data, const TrainerOptions& options,
        common::ControlClient& control, ModelParts warm, const std::string& config_path) {
  try {
    Trainer trainer(config, backend, communicator, std::move(train_data), std::move(test_data),
                    options, &control, std::move(warm));
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
        leave_sender(), e.what());
    spdlog::default_logger()->flush();
    end_by_sigterm();
  } catch (const common::IoError& e) {
    communicator.abort(e.what());
    throw;
  } catch (const std::bad_alloc&) {
    communicator.abort("out of memory");
    throw;
  } catch (const ConfigError& e) {
    communicator.abort(e.what());
    std::string message = e.what();  // layer shape errors name "model..." in the train object
    if (message.rfind("model", 0) == 0)
      throw ConfigError(fmt::format("{}: train.{}", config_path, message));
    throw;
  }
  spdlog::info("finished{}",
               options.chief ? "; model written to " + options.run_dir + "/model" : "");
  return common::kExitSuccess;
}

// One training task: join the group through the recovery client, train, and turn how it ended
// into an exit code.
int train(const common::TfConfig& task, RecoveryOptions recovery_options, const TrainConfig& config,
          nn::Backend& backend, data::Dataset train_data, data::Dataset test_data,
          const std::string& run_dir, const std::string& config_path, Timeline& timeline,
          double progress_line_seconds, ModelParts warm) {
  const bool elastic = recovery_options.members.has_value();
  const bool on_gpu = backend.device().kind() != nn::DeviceKind::kHost;
  check_transport(config, on_gpu, config_path);  // docs/design.md#preconditions
  if (elastic) check_elastic(config, on_gpu, config_path);
  // Read by the launcher to find a frozen member (docs/design.md#frozen-workers).
  common::ProgressRecordWriter record(common::get_env(common::kEnvProgressFile).value_or(""));
  common::ControlClient control(common::get_env(common::kEnvControl).value_or(""));
  const int attempt = recovery_options.attempt;
  RecoveryClient recovery(std::move(recovery_options),
                          communicator_factory(config, backend, elastic), control, &record);
  log_task(task, recovery, attempt, train_data.count);
  comm::Communicator& group = form_group(recovery, backend, config_path);
  // In place only: elsewhere nothing asks the launcher for the next generation, so a notice
  // is ignored. So is one to a world of one that is not elastic: it has no group to re-form (an
  // elastic group shrunk to one grows again, docs/design.md#elastic-membership).
  const bool noticed = recovery.in_place() && (elastic || recovery.ring().size > 1);
  NoticeRegistration notice(noticed ? &recovery.group() : nullptr);
  timeline.mark("rendezvous");
  catch_sigterm();  // until here SIGTERM kills at once; from here it means "save and stop together"
  TrainerOptions options{run_dir, task.cluster.is_chief(task.task), task.task.text(),
                         attempt, [] { return stop_requested(); },  &timeline};
  options.progress_line_seconds = progress_line_seconds;
  options.record = &record;
  options.recovery = &recovery;
  if (config.ledger) {
    options.ledger_path = common::RunDir(run_dir).ledger_file(task.task);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(options.ledger_path).parent_path(),
                                        ec);
  }
  if (recovery.in_place()) {
    leave_alone_on_sigterm(
        {common::get_env(common::kEnvControl).value_or(""), task.task.text(), attempt});
    options.leave_requested = [] { return leave_requested(); };
  }
  return fit(config, backend, group, std::move(train_data), std::move(test_data), options, control,
             std::move(warm), config_path);
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
  log_signals_to(spdlog::default_logger());
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
    int evaluations =
        run_evaluator(config, *backend, test_data, {run_dir, 0.5, [] { return stop_requested(); }});
    spdlog::info("evaluator: {} evaluation(s) in {}/eval.jsonl", evaluations, run_dir);
    return common::kExitSuccess;
  }
  return train(task, recovery_options(task, job, generation, promoted_members), config, *backend,
               std::move(train_data), std::move(test_data), run_dir, options.config_path, timeline,
               options.progress_line_seconds, std::move(warm));
}

}  // namespace
}  // namespace dtrain::train

int main(int argc, char** argv) {
  // `dtrain evaluate`, `predict`, `generate` and validate's data check, executed here by the
  // launcher (worker/model_commands.h): they speak as dtrain, and signals end them as usual.
  const std::vector<std::string> first(argv + 1, argv + argc);
  if (dtrain::train::is_model_command(first))
    return dtrain::common::run_main("dtrain",
                                    [&] { return dtrain::train::run_model_command(first); });
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
