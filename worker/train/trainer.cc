// See trainer.h.
#include "worker/train/trainer.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/env_vars.h"
#include "common/errors.h"
#include "common/json.h"
#include "common/run_dir.h"
#include "worker/data/batcher.h"
#include "worker/train/evaluator.h"
#include "worker/train/hdf5_image.h"
#include "worker/train/keras_archive.h"

namespace dtrain::train {

std::vector<std::pair<std::string, double>> EpochMetrics::named() const {
  std::vector<std::pair<std::string, double>> all = {{"loss", loss}, {companion, accuracy}};
  if (!validated) return all;
  all.emplace_back("val_loss", val_loss);
  all.emplace_back("val_" + companion, val_accuracy);
  for (const auto& [name, value] : val_metrics) all.emplace_back("val_" + name, value);
  return all;
}

namespace {

// derive_seed stream of worker r's epoch orders when the data is sharded by file: r plus this.
constexpr uint64_t kFileShardStream = 0xf11e0000;

// A checkpoint's step must exist in this run's epochs: the batcher cannot start an epoch past its
// end (train.steps_per_epoch lowered since, or a hand-made file).
void check_resumable(const LoadedCheckpoint& c, int epochs, int64_t steps_per_epoch) {
  if (c.state.epoch < epochs && c.state.step > steps_per_epoch) {
    throw common::ConfigError(fmt::format(
        "{}: resumes at step {} of epoch {}, but an epoch has {} steps in this configuration; "
        "remove the file or restore train.steps_per_epoch",
        c.path, c.state.step, c.state.epoch + 1, steps_per_epoch));
  }
}

// Where training resumes from a shared position: its epoch, step and running totals; the
// epoch's clock and the loss scale are the trainer's to take apart, and a state's own clock and
// loss scale are recorded again when it is saved.
TrainingState resume_point(const TrainingState& t) {
  return TrainingState{t.epoch,          t.step,          t.global_step, t.optimizer_iterations,
                       t.epoch_loss_sum, t.epoch_correct, t.epoch_seen};
}

// An epoch's metrics as metrics.jsonl has them (docs/design.md#run-directory); with_steps adds
// "steps", which the TensorBoard points need, for the copy kept in the epoch checkpoint.
std::string metrics_json(const EpochMetrics& m, bool with_steps) {
  common::JsonWriter w;
  w.begin_object().key("epoch").value(m.epoch);
  for (const auto& [name, value] : m.named()) w.key(name).value(value);
  if (m.validated) w.key("val_seconds").value(m.val_seconds);
  w.key("seconds").value(m.seconds).key("samples_per_second").value(m.samples_per_second);
  if (m.tokens_per_second > 0) w.key("tokens_per_second").value(m.tokens_per_second);
  w.key("allreduce_seconds").value(m.allreduce_seconds);
  w.key("input_wait_seconds").value(m.input_wait_seconds);
  w.key("step_seconds").value(m.step_seconds);
  if (with_steps) w.key("steps").value(m.steps);
  return w.end_object().str();
}

// metrics_json(m, true) read back; ConfigError when it is not that.
EpochMetrics metrics_of(const std::string& json, const std::string& source,
                        const TrainConfig& config) {
  common::JsonDocument doc = common::JsonDocument::parse(json, source);
  const common::JsonNode root = doc.root();
  constexpr double kMax = std::numeric_limits<double>::max();
  auto number = [&](const char* key) { return root.at(key).as_number(-kMax, kMax); };
  EpochMetrics m;
  m.epoch = static_cast<int>(root.at("epoch").as_int(1, 1 << 20));
  m.companion = config.companion;
  m.loss = number("loss"), m.accuracy = number(m.companion.c_str());
  if (root.find("val_loss")) {
    m.validated = true;
    m.val_loss = number("val_loss"), m.val_accuracy = number(("val_" + m.companion).c_str());
    for (const MetricSpec& metric : config.metrics)
      m.val_metrics.emplace_back(metric.name, number(("val_" + metric.name).c_str()));
    m.val_seconds = number("val_seconds");
  }
  m.seconds = number("seconds"), m.samples_per_second = number("samples_per_second");
  if (root.find("tokens_per_second")) m.tokens_per_second = number("tokens_per_second");
  m.allreduce_seconds = number("allreduce_seconds");
  if (root.find("input_wait_seconds")) m.input_wait_seconds = number("input_wait_seconds");
  if (root.find("step_seconds")) m.step_seconds = number("step_seconds");
  m.steps = root.at("steps").as_int(0, int64_t{1} << 50);
  return m;
}

// Whether the metrics.jsonl at path has a line for epoch (1-based). A line that does not parse
// (torn by a kill) is no epoch's.
bool has_epoch_line(const std::string& path, int epoch) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    try {
      common::JsonDocument doc = common::JsonDocument::parse(line, path);
      std::optional<common::JsonNode> n = doc.root().find("epoch");
      if (n && n->as_int(0, 1 << 20) == epoch) return true;
    } catch (const common::ConfigError&) {
    }
  }
  return false;
}

// Test only: the seconds DTRAIN_TEST_SLOW_STEP_MS ("RANK:MS", or "RANK:MS:cpu" to spend them
// on the CPU) has this rank sleep in each step.
double test_slow_step_seconds(int rank, bool* on_cpu) {
  std::optional<std::string> value = common::get_env(common::kEnvTestSlowStepMs);
  if (!value) return 0;
  int slow_rank = -1;
  double ms = -1;
  char mode[8] = {};
  int fields = std::sscanf(value->c_str(), "%d:%lf:%7s", &slow_rank, &ms, mode);
  *on_cpu = fields == 3 && std::string(mode) == "cpu";
  if (fields < 2 || (fields == 3 && !*on_cpu) || ms < 0 || ms > 60000) {
    throw common::ConfigError(
        fmt::format("{}=\"{}\": expected RANK:MS or RANK:MS:cpu, MS at most 60000",
                    common::kEnvTestSlowStepMs.name, *value));
  }
  return slow_rank == rank ? ms / 1000 : 0;
}

// Test only: the global step before which DTRAIN_TEST_SPIN_AT_STEP ("RANK:STEP") has this rank
// spin; -1 for none.
int64_t test_spin_step(int rank) {
  std::optional<std::string> value = common::get_env(common::kEnvTestSpinAtStep);
  if (!value) return -1;
  int spin_rank = -1;
  long long step = -1;
  char tail = 0;
  if (std::sscanf(value->c_str(), "%d:%lld%c", &spin_rank, &step, &tail) != 2 || step < 1) {
    throw common::ConfigError(fmt::format("{}=\"{}\": expected RANK:STEP, STEP at least 1",
                                          common::kEnvTestSpinAtStep.name, *value));
  }
  return spin_rank == rank ? step : -1;
}

[[noreturn]] void spin_for_ever() {
  spdlog::warn("{}: spinning for ever (test only)", common::kEnvTestSpinAtStep.name);
  for (volatile uint64_t turns = 0;; turns = turns + 1) {
  }
}

// What the chief will write, made ready before the first step, so that the run does not train up
// to a save only to fail there: run_dir/backup.dir made if it is missing (ConfigError naming
// train.backup.dir and the path when that fails or a non-folder is in the way, a file there or
// where a parent folder should be; no restart would clear it: docs/design.md#checkpoint-format),
// and, for a model from Keras, libhdf5 loaded for model.keras (hdf5_image.h).
void prepare_chief(const TrainConfig& config, const std::string& run_dir) {
  std::string path = run_dir + "/" + config.backup.dir;
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  std::error_code type_ec;
  if (!ec && !std::filesystem::is_directory(path, type_ec))
    ec = std::make_error_code(std::errc::not_a_directory);
  if (ec) {
    throw common::ConfigError(fmt::format(
        "train.backup.dir: cannot use {} as the checkpoint folder ({}); remove what is in its way "
        "or choose another train.backup.dir",
        path, ec.message()));
  }
  if (!config.keras_config.empty()) load_hdf5();
}

}  // namespace

Trainer::Trainer(const TrainConfig& config, nn::Backend& backend, comm::Communicator& comm,
                 data::Dataset train, data::Dataset test, TrainerOptions options,
                 common::ControlClient* control, ModelParts parts)
    : config_(config),
      backend_(backend),
      comm_(comm),
      train_(std::move(train)),
      test_(std::move(test)),
      options_(std::move(options)),
      control_(control),
      progress_(ProgressBar::for_stdout(options_.progress_line_seconds)),
      store_(options_.run_dir + "/" + config.backup.dir, config.backup.keep) {
  store_.set_dtype_policy(dtype_policy_name(config_));
  store_.set_class_names(train_.class_names);
  // On the host, the gradients live in the communicator's window when it has one (shared
  // memory): peers then sum them in place instead of through copies.
  const comm::Window window = gradient_window();
  if (parts) {  // a promoted spare's, warm (docs/design.md#spares)
    parts.model->move_gradients(window.data, window.floats);
  } else {
    parts = build_model_parts(config_, backend_, train_.classes, window);
  }
  model_ = std::move(parts.model);
  optimizer_ = std::move(parts.optimizer);
  tensors_ = std::make_unique<ModelTensors>(*model_, optimizer_->slots());
  if (config_.callbacks.early_stopping) {
    std::vector<TensorView> weights = tensors_->download();
    weights.resize(tensors_->weight_count());
    early_stopping_ = std::make_unique<EarlyStopping>(*config_.callbacks.early_stopping, weights);
    tensors_->add_host_tensors(early_stopping_->tensors());
  }
  if (config_.callbacks.model_checkpoint) {
    model_checkpoint_ = std::make_unique<ModelCheckpoint>(*config_.callbacks.model_checkpoint);
    tensors_->add_host_tensors(model_checkpoint_->tensors());
  }
  if (config_.callbacks.reduce_lr) {
    reduce_lr_ = std::make_unique<ReduceLrOnPlateau>(*config_.callbacks.reduce_lr);
    tensors_->add_host_tensors(reduce_lr_->tensors());
    optimizer_->allow_rate_changes();
  }
  stager_ = std::move(parts.stager);
  if (!window.empty()) {
    spdlog::info(model_->gradients_lent()
                     ? "gradients ({} floats) live in the shared-memory window ({} floats)"
                     : "gradients ({} floats) do not fit the shared-memory window ({} floats): "
                       "all-reduced through copies",
                 model_->gradients().size(), window.floats);
  }
  // Every worker runs the same number of steps (they all-reduce each one): size them by the
  // largest shard, worker 0's.
  // Sharded by file, train_ is this worker's share of global_count examples.
  int64_t shard = data::shard_size(train_.global_count > 0 ? train_.global_count : train_.count, 0,
                                   virtual_size());
  steps_per_epoch_ = config_.steps_per_epoch > 0
                         ? config_.steps_per_epoch
                         : data::default_steps(shard, config_.per_worker_batch_size);
  optimizer_->resolve_schedule(config_.epochs * steps_per_epoch_, virtual_size());
  StepOptions step_options;
  step_options.overlap = config_.overlap;
  step_options.graphs = config_.cuda_graphs;
  step_options.slots = InputStager::kSlots;
  step_options.test_slow_step_seconds =
      test_slow_step_seconds(comm_.rank(), &step_options.test_slow_step_on_cpu);
  step_options.whole_steps = options_.recovery && options_.recovery->in_place() &&
                             whole_steps_possible(backend_.device(), comm_);
  step_options.virtual_size = elastic_size();
  step_options.loss_scale = config_.loss_scale;
  step_options.loss = loss_options(config_);
  if (config_.loss_scale.enabled) {
    spdlog::info("loss scaling: {} scale {} (docs/design.md#loss-scaling)",
                 config_.loss_scale.dynamic ? "dynamic, initial" : "fixed",
                 config_.loss_scale.initial_scale);
  }
  if (!options_.ledger_path.empty()) {
    ledger_.reset(std::fopen(options_.ledger_path.c_str(), "a"));
    if (!ledger_) {
      throw common::IoError(
          fmt::format("cannot open the ledger {}: {}", options_.ledger_path, std::strerror(errno)));
    }
  }
  if (step_options.test_slow_step_seconds > 0) {
    spdlog::warn("{}: each step sleeps {:.0f} ms (test only)", common::kEnvTestSlowStepMs.name,
                 step_options.test_slow_step_seconds * 1000);
  }
  step_ = std::make_unique<TrainStep>(*model_, *optimizer_, backend_, comm_, step_options);
  if (options_.timeline) options_.timeline->mark("model");
  if (chief()) prepare_chief(config_, options_.run_dir);  // not at the first save
  if (generation() == 0) test_spin_step_ = test_spin_step(comm_.rank());
  take_state(share_whole_state(comm_, *tensors_, held_state(false)));
  if (options_.timeline) options_.timeline->mark("broadcast");
  start_ = state_;
  report_restored();
}

Trainer::~Trainer() = default;

comm::Window Trainer::gradient_window() {
  return backend_.device().kind() == nn::DeviceKind::kHost ? comm_.window() : comm::Window{};
}

std::vector<TensorView> Trainer::checkpoint_tensors() {
  return tensors_->download();
}

void Trainer::upload_tensors() {
  tensors_->upload();
}

std::optional<TrainingState> Trainer::load_checkpoint(std::vector<TensorView>& views,
                                                      std::string& epoch_metrics) {
  std::optional<LoadedCheckpoint> c = store_.load_latest(config_.model_json);
  if (!c) return std::nullopt;
  check_resumable(*c, config_.epochs, steps_per_epoch_);
  restore_tensors(*c, views);
  epoch_metrics = c->epoch_metrics;
  spdlog::info("restored {}: resuming at epoch {} step {}", c->path, c->state.epoch + 1,
               c->state.step);
  if (c->dtype_policy != dtype_policy_name(config_)) {  // allowed, as Keras loads any weights
    spdlog::info("{} was trained under dtype_policy {}; it continues under {}", c->path,
                 c->dtype_policy, dtype_policy_name(config_));
  }
  return c->state;
}

std::optional<TrainingState> Trainer::load_final_state(std::vector<TensorView>& views,
                                                       std::string& epoch_metrics) {
  CheckpointStore final_store(common::RunDir(options_.run_dir).model_dir() + "/state", 1);
  std::optional<LoadedCheckpoint> c = final_store.load_latest(config_.model_json);
  if (!c) return std::nullopt;
  // No more epochs to train: the state is this launch's own end only on a restart within it
  // (the checkpoints gone with delete_on_success); a new start trains from scratch, as before
  // (`dtrain launch` refuses such a start on a run that succeeded).
  const bool restart = options_.attempt > 0 || generation() > 0;
  if (c->state.epoch >= config_.epochs && !restart) {
    spdlog::info(
        "{} holds a finished run of {} epochs, which train.epochs {} does not continue: "
        "training from scratch",
        c->path, c->state.epoch, config_.epochs);
    return std::nullopt;
  }
  if (c->state.epoch > config_.epochs) {
    throw common::ConfigError(fmt::format(
        "{}: the finished run trained {} epochs, more than train.epochs {}; raise train.epochs "
        "to continue it, or `dtrain launch --fresh` to train from scratch",
        c->path, c->state.epoch, config_.epochs));
  }
  restore_tensors(*c, views);
  for (const TensorView& v : views)  // a new fit: its callbacks start afresh, as Keras's do
    if (v.name.rfind("callbacks.", 0) == 0) std::fill_n(const_cast<float*>(v.data), v.count, 0.0f);
  epoch_metrics = c->epoch_metrics;
  if (c->state.epoch < config_.epochs) {
    spdlog::info("continuing the finished run from {}: epochs {}-{} of {}", c->path,
                 c->state.epoch + 1, config_.epochs, config_.epochs);
    const LearningRateSchedule& schedule = config_.optimizer.learning_rate;
    if (!schedule.constant() && schedule.decay_steps == 0) {
      spdlog::warn(
          "the learning-rate schedule's decay_steps follows train.epochs: the finished run's {} "
          "epochs followed a {}-epoch schedule, and the rest follows one of {} (set decay_steps "
          "to keep one schedule across a continuation)",
          c->state.epoch, c->state.epoch, config_.epochs);
    }
  } else {
    spdlog::info("{} is the finished run's final state: nothing is left to train", c->path);
  }
  return c->state;
}

void Trainer::check_finite_loss(int steps_ago, int64_t global_step) {
  const TrainStep::StepLosses losses = step_->step_losses(steps_ago);
  if (std::isfinite(losses.group)) return;
  const uint8_t mine = std::isfinite(losses.own) ? 0 : 1;
  std::vector<uint8_t> all = comm_.all_gather(&mine, 1);
  std::string who;
  for (int r = 0; r < comm_.size(); ++r)
    if (all[static_cast<size_t>(r)]) who += fmt::format("{}worker {}", who.empty() ? "" : ", ", r);
  const int64_t index = global_step - 1;
  throw NonFinite(fmt::format(
      "the loss became {} at epoch {} step {} (global step {}), in the batch of {} "
      "(TerminateOnNaN): training stops without a checkpoint; the newest checkpoint holds the "
      "last finite state",
      std::isnan(losses.group) ? "nan" : "infinite", index / steps_per_epoch_ + 1,
      index % steps_per_epoch_ + 1, global_step, who.empty() ? "no single worker" : who));
}

std::vector<TensorView> Trainer::finite_weights(const char* before) {
  std::vector<TensorView> tensors = checkpoint_tensors();
  tensors.resize(tensors_->weight_count());
  for (const TensorView& t : tensors) {
    for (size_t i = 0; i < t.count; ++i) {
      if (std::isfinite(t.data[i])) continue;
      throw NonFinite(fmt::format(
          "{} holds {} at element {} after global step {} (epoch {} step {}), found before {} "
          "(TerminateOnNaN): training stops without writing it",
          t.name, std::isnan(t.data[i]) ? "nan" : "an infinity", i, state_.global_step,
          state_.step == 0 ? state_.epoch : state_.epoch + 1,
          state_.step == 0 ? steps_per_epoch_ : state_.step, before));
    }
  }
  return tensors;
}

bool Trainer::judge_epoch(const EpochMetrics& m, const std::vector<TensorView>& weights) {
  if (!early_stopping_ && !model_checkpoint_ && !reduce_lr_) return false;
  NamedMetrics metrics = m.named();
  std::optional<double> before;
  if (model_checkpoint_ && model_checkpoint_->on_epoch_end(metrics, before) && chief()) {
    common::BusyPhase busy(options_.record, common::ProgressPhase::kSaving);
    const std::string best = common::RunDir(options_.run_dir).model_dir() + "/best";
    write_final_model(best, weights, config_.model_json, dtype_policy_name(config_),
                      train_.class_names,
                      vocabulary_json(train_.vocabulary, train_.symbols, train_.classes));
    if (!config_.keras_config.empty()) {
      write_keras_archive(best + "/model.keras", config_.keras_config, config_.model, weights,
                          std::time(nullptr));
    }
    const std::string& name = model_checkpoint_->monitor();
    double value = 0;
    for (const auto& [key, v] : metrics)
      if (key == name) value = v;
    spdlog::info(before ? fmt::format("Epoch {}: {} improved from {:.5f} to {:.5f}, saving model "
                                      "to {}",
                                      m.epoch, name, *before, value, best)
                        : fmt::format("Epoch {}: {} is {:.5f}, saving model to {}", m.epoch, name,
                                      value, best));
  }
  if (reduce_lr_) {
    if (std::optional<double> rate =
            reduce_lr_->on_epoch_end(metrics, optimizer_->learning_rate())) {
      optimizer_->set_constant_rate(*rate);
      if (chief())
        spdlog::info("Epoch {}: ReduceLROnPlateau reducing learning rate to {}.", m.epoch, *rate);
    }
  }
  if (!early_stopping_) return false;
  const bool stop = early_stopping_->on_epoch_end(m.epoch - 1, metrics, weights);
  if (stop && chief()) spdlog::info("Epoch {}: early stopping", m.epoch);
  return stop;
}

void Trainer::finish_early_stopping() {
  std::vector<TensorView> views = checkpoint_tensors();
  std::vector<TensorView> weights(views.begin(),
                                  views.begin() + static_cast<long>(tensors_->weight_count()));
  if (int best = early_stopping_->restore_best(weights); best > 0) {
    if (chief()) spdlog::info("Restoring model weights from the end of the best epoch: {}.", best);
    upload_tensors();
  }
}

void Trainer::save_final_state(const std::string& model_dir) {
  CheckpointStore final_store(model_dir + "/state", 1);
  final_store.set_dtype_policy(dtype_policy_name(config_));
  final_store.set_class_names(train_.class_names);
  settle_state();
  std::string path =
      final_store.save(state_, checkpoint_tensors(), config_.model_json, last_epoch_metrics_);
  spdlog::info("final state (for a later launch with more epochs) in {}", path);
}

// A kill at the very end (docs/design.md#checkpoint-format): the chief wrote model/ and deleted
// every checkpoint (delete_on_success), then a worker died before the launcher recorded the
// group's success. The restart of the same launch finishes with that model instead of training
// every step again; a new launch (spec.json written again) or a lone worker trains as before.
std::optional<TrainingState> Trainer::load_finished_model(std::vector<TensorView>& views) {
  if (options_.attempt == 0 && generation() == 0) return std::nullopt;
  common::RunDir run(options_.run_dir);
  TrainingState done{config_.epochs, 0, config_.epochs * steps_per_epoch_, 0, 0, 0, 0};
  std::optional<LoadedCheckpoint> model = train::load_finished_model(
      run.model_dir() + "/model.safetensors", run.spec_json(), config_.model_json, done);
  if (!model) return std::nullopt;
  std::vector<TensorView> weights = views;
  weights.resize(tensors_->weight_count());
  restore_tensors(*model, weights);
  spdlog::info(
      "no checkpoint, but {} is this launch's finished model (global step {}): nothing "
      "is left to train",
      model->path, done.global_step);
  return done;
}

HeldState Trainer::held_state(bool holding) {
  HeldState held;
  held.holding = holding;
  held.global_step = state_.global_step, held.epoch = state_.epoch, held.step = state_.step;
  held.position = [this] { return position(); };
  held.stored = [this] { return stored_position(); };
  return held;
}

// The whole state this member holds: state_ with the optimizer's count, the epoch's totals and
// the loss scale as the step has them now, and the resumed epoch's clock (which travels with the
// state, as its loss totals do: a new chief's metrics.jsonl line times the whole epoch, not only
// its own part of it).
Position Trainer::position() {
  step_->settle_loss_scale();  // the optimizer's count, less the skips not yet read
  Position p{state_, last_epoch_metrics_};
  TrainingState& t = p.state;
  t.optimizer_iterations = optimizer_->iterations();
  EpochTotals totals = step_->totals();
  t.epoch_loss_sum = totals.loss_sum, t.epoch_correct = totals.correct;
  t.epoch_seen = totals.seen;
  const LossScaleState scale = step_->loss_scale().state();
  t.loss_scale = scale.scale, t.loss_scale_good_steps = scale.good_steps;
  t.epoch_seconds = 0, t.epoch_samples = 0, t.epoch_first_step = -1;
  if (state_.step > 0) {
    t.epoch_seconds = common::monotonic_seconds() - epoch_started_;
    t.epoch_samples = epoch_samples_, t.epoch_first_step = epoch_first_step_;
  }
  return p;
}

// A fresh group: the chief's newest checkpoint, else the final state a finished run left, else
// this launch's finished model; none of them: the initial state.
std::optional<Position> Trainer::stored_position() {
  std::optional<Position> found;
  std::vector<TensorView> views = tensors_->views();
  if (chief()) {
    Position p;
    std::optional<TrainingState> t = load_checkpoint(views, p.epoch_metrics);
    if (!t) t = load_final_state(views, p.epoch_metrics);
    if (t) {
      p.state = *t;
      if (t->step == 0 || t->epoch_first_step < 0)  // no clock: the epoch is timed from here
        p.state.epoch_seconds = 0, p.state.epoch_samples = 0, p.state.epoch_first_step = -1;
      found = std::move(p);
    } else if (std::optional<TrainingState> done = load_finished_model(views)) {
      p.state = *done;
      found = std::move(p);
    }
  }
  if (options_.timeline) options_.timeline->mark("checkpoint read");
  return found;
}

void Trainer::take_state(const Position& shared) {
  if (reduce_lr_) {  // the rate its last reduction set travels in its state
    if (std::optional<double> rate = reduce_lr_->rate()) optimizer_->set_constant_rate(*rate);
  }
  const TrainingState& t = shared.state;
  if (config_.loss_scale.enabled)  // the same on every worker
    step_->set_loss_scale_state({static_cast<float>(t.loss_scale), t.loss_scale_good_steps});
  carried_epoch_seconds_ = t.epoch_seconds, carried_epoch_samples_ = t.epoch_samples;
  carried_first_step_ = t.epoch_first_step;
  state_ = resume_point(t);
  optimizer_->set_iterations(state_.optimizer_iterations);
  restored_epoch_metrics_ = shared.epoch_metrics;
  if (!shared.epoch_metrics.empty()) last_epoch_metrics_ = shared.epoch_metrics;
  resumed_step_ = state_.global_step;
}

void Trainer::regroup(const comm::GroupBroken& broken) {
  if (!options_.recovery || !options_.recovery->in_place()) throw broken;
  bool cut_short = step_->abandon_step();
  double started = common::monotonic_seconds();
  std::string what = broken.what();
  spdlog::warn("the group broke ({}); {}holding the whole state of global step {}", what,
               cut_short ? "the step in flight changed nothing; " : "", state_.global_step);
  const int64_t held = state_.global_step;
  for (;;) {
    try {
      Position shared = options_.recovery->rejoin(what, cut_short, *tensors_, held_state(true));
      take_state(shared);
    } catch (const NoRecovery& e) {
      spdlog::error("{}", e.what());
      throw broken;
    } catch (const comm::GroupBroken& again) {  // the next generation did not form, or broke
      what = again.what();
      spdlog::warn("re-forming failed ({}); asking again", what);
      continue;
    }
    if (chief()) prepare_chief(config_, options_.run_dir);  // perhaps a new chief
    const comm::Window window = gradient_window();
    model_->move_gradients(window.data, window.floats);
    spdlog::info(
        "re-formed as generation {} in {:.2f} s: resuming at epoch {} step {} "
        "(global step {}; this worker held {})",
        generation(), common::monotonic_seconds() - started, state_.epoch + 1, state_.step,
        state_.global_step, held);
    report_restored();
    force_heartbeat_ = true;
    return;
  }
}

// After an epoch, with a dynamic loss scale: where it stands, and the steps it skipped, if any
// (the same on every worker, so the chief's line speaks for all).
void Trainer::report_loss_scale() {
  const LossScale& scale = step_->loss_scale();
  if (!scale.dynamic() || !chief()) return;
  int64_t skipped = step_->skipped_steps() - skipped_reported_;
  skipped_reported_ = step_->skipped_steps();
  if (skipped > 0) {
    spdlog::info("loss scale {} after {} step(s) with a non-finite gradient, skipped",
                 scale.scale(), skipped);
  } else {
    spdlog::debug("loss scale {}", scale.scale());
  }
}

// Tells the launcher once where this worker resumes (0: a fresh start).
void Trainer::report_restored() {
  if (!control_) return;
  common::ControlMessage m =
      common::heartbeat_message(options_.task, options_.attempt, static_cast<int>(::getpid()));
  m.restored_step = state_.global_step;
  if (generation() > 0) m.generation = generation();
  control_->send(m);
}

void Trainer::settle_state() {
  const LossScale& scale = step_->loss_scale();  // settled: the optimizer's count too
  state_.optimizer_iterations = optimizer_->iterations();
  state_.loss_scale = scale.dynamic() ? scale.scale() : 0;
  state_.loss_scale_good_steps = scale.dynamic() ? scale.good_steps() : 0;
}

void Trainer::save_checkpoint(const EpochMetrics* finished) {
  if (!chief()) return;
  settle_state();
  common::BusyPhase busy(options_.record, common::ProgressPhase::kSaving);
  double started = common::monotonic_seconds();
  std::string path = store_.save(state_, checkpoint_tensors(), config_.model_json,
                                 finished ? metrics_json(*finished, true) : std::string());
  spdlog::info("saved {} (epoch {} step {})", path, state_.epoch + 1, state_.step);
  spdlog::debug("saved {} in {:.0f} ms", path, (common::monotonic_seconds() - started) * 1000);
}

EpochMetrics Trainer::fit() {
  for (;;) {
    try {
      return fit_from_state();
    } catch (const comm::GroupBroken& broken) {
      regroup(broken);  // rethrows when there is no recovery in place
    }
  }
}

EpochMetrics Trainer::fit_from_state() {
  EpochMetrics last;
  if (chief() && config_.tensorboard.enabled && !tensorboard_) {
    tensorboard_ =
        std::make_unique<TensorBoardLog>(config_.tensorboard, options_.run_dir, config_.validation);
  }
  if (chief()) recover_epoch_metrics();
  const bool stopped_before = early_stopping_ && early_stopping_->stopped();  // a resume after it
  for (int epoch = static_cast<int>(state_.epoch); epoch < config_.epochs && !stopped_before;
       ++epoch) {
    // ms/step over the steps the epoch's clock times: from where it was entered, when its clock
    // was carried through a resume (train_epoch), else this run's.
    const bool resumed = epoch == state_.epoch && state_.step > 0;
    progress_.begin_epoch(epoch + 1, config_.epochs,
                          !resumed                   ? 0
                          : carried_first_step_ >= 0 ? carried_first_step_
                                                     : state_.step);
    last = train_epoch(epoch);
    step_->settle_loss_scale();  // skips not yet read leave the host's count ahead
    report_loss_scale();
    state_ = TrainingState{epoch + 1, 0, state_.global_step, optimizer_->iterations(), 0, 0, 0};
    last_epoch_metrics_ = metrics_json(last, true);
    // Their state goes into the epoch's checkpoint, downloaded again after them.
    const bool stop_early = judge_epoch(last, finite_weights("the epoch's checkpoint"));
    save_checkpoint(&last);
    if (chief()) {  // a line in metrics.jsonl says the summaries were written too
      common::BusyPhase busy(options_.record, common::ProgressPhase::kSaving);
      write_summaries(last);
      write_metrics(last);
    }
    if (last.stop_agreed) {  // asked during the epoch's last step: stop here, together
      comm_.barrier();
      throw Preempted(
          fmt::format("stopped at epoch {} step {}, its end (epoch checkpoint saved by the chief)",
                      epoch + 1, steps_per_epoch_));
    }
    if (stop_early) break;
  }
  if (early_stopping_) finish_early_stopping();
  if (chief()) {
    common::BusyPhase busy(options_.record, common::ProgressPhase::kSaving);
    std::vector<TensorView> weights = checkpoint_tensors();
    weights.resize(tensors_->weight_count());
    const std::string model_dir = common::RunDir(options_.run_dir).model_dir();
    write_final_model(model_dir, weights, config_.model_json, dtype_policy_name(config_),
                      train_.class_names,
                      vocabulary_json(train_.vocabulary, train_.symbols, train_.classes));
    if (!config_.keras_config.empty()) {  // the model came from Keras: also in Keras's format
      write_keras_archive(model_dir + "/model.keras", config_.keras_config, config_.model, weights,
                          std::time(nullptr));
    }
    save_final_state(model_dir);  // before the checkpoints go: a kill between loses nothing
    if (config_.backup.delete_on_success) store_.remove_all();
  }
  return last;
}

// Reads the epoch's totals back (a sync) at most twice a second, or when forced, and shows them.
void Trainer::show_progress(int epoch, int64_t step, double started, double seen_here, bool force) {
  double now = common::monotonic_seconds();
  if (!force && last_shown_ >= 0 && now - last_shown_ < 0.5) return;
  last_shown_ = now;
  EpochTotals totals = step_->totals();
  double elapsed = now - started;
  double loss = totals.mean_loss(), accuracy = totals.accuracy();
  progress_.update(step, steps_per_epoch_, elapsed,
                   {{"loss", loss}, {config_.companion, accuracy}});
  heartbeat(epoch + 1, step, steps_per_epoch_, loss, accuracy, seen_here / std::max(elapsed, 1e-9));
}

EpochMetrics Trainer::train_epoch(int epoch) {
  bool resumed = epoch == state_.epoch && state_.step > 0;
  data::BatchStreamOptions stream_options;
  stream_options.seed = config_.seed;
  stream_options.epoch = epoch;
  stream_options.worker_index = comm_.rank();
  stream_options.worker_count = comm_.size();
  if (train_.global_count > 0) {  // sharded by file: this worker shuffles its own files alone
    stream_options.seed =
        data::derive_seed(config_.seed, kFileShardStream + static_cast<uint64_t>(comm_.rank()));
    stream_options.worker_index = 0;
    stream_options.worker_count = 1;
  }
  stream_options.batch_size = config_.per_worker_batch_size;
  stream_options.first_step = resumed ? state_.step : 0;
  stream_options.steps = steps_per_epoch_;
  // A member of a partial elastic group computes each of its virtual shards' batches in turn.
  const comm::ShardPlan held = shards();
  const bool sharded = !held.full(comm_.size());
  std::vector<std::unique_ptr<data::BatchStream>> streams;
  for (int j = 0; j < (sharded ? held.held : 1); ++j) {
    data::BatchStreamOptions o = stream_options;
    if (sharded) o.worker_index = held.shard(j), o.worker_count = held.virtual_size;
    streams.push_back(std::make_unique<data::BatchStream>(train_, o));
  }
  std::vector<const data::BatchStream*> ledger_streams;
  for (const auto& s : streams) ledger_streams.push_back(s.get());
  data::BatchStream& stream = *streams.front();
  step_->set_totals(
      resumed ? EpochTotals{state_.epoch_loss_sum, state_.epoch_correct, state_.epoch_seen}
              : EpochTotals{});
  step_->reset_exposed_comm_seconds();
  last_shown_ = -1;
  double started = common::monotonic_seconds(), seen_here = 0, input_wait = 0, in_steps = 0;
  epoch_first_step_ = stream_options.first_step;
  if (resumed && carried_first_step_ >= 0) {
    started -= carried_epoch_seconds_, seen_here = carried_epoch_samples_;
    epoch_first_step_ = carried_first_step_;
  }
  carried_epoch_seconds_ = carried_epoch_samples_ = 0, carried_first_step_ = -1;
  epoch_started_ = started, epoch_samples_ = seen_here;
  auto stage = [&](int64_t step) {
    double asked = common::monotonic_seconds();
    data::Batch batch = stream.next();
    // The epoch's first batch waits for the pipeline to start; the others should not wait.
    if (step > stream_options.first_step) input_wait += common::monotonic_seconds() - asked;
    stager_->stage(static_cast<int>(step % InputStager::kSlots), batch.images.data(),
                   batch.labels.data(), static_cast<int>(batch.size));
    return static_cast<int>(batch.size);
  };
  int n = !sharded && stream_options.first_step < steps_per_epoch_
              ? stage(stream_options.first_step)
              : 0;
  std::vector<data::Batch> batches(streams.size());
  std::vector<ShardInput> inputs(streams.size());
  for (int64_t step = stream_options.first_step; step < steps_per_epoch_; ++step) {
    int slot = static_cast<int>(step % InputStager::kSlots);
    int next_n = 0;
    if (sharded) {  // host memory: the batches are the step's inputs as they are
      double asked = common::monotonic_seconds();
      for (size_t j = 0; j < streams.size(); ++j) {
        batches[j] = streams[j]->next();
        inputs[j] = {batches[j].images.data(), batches[j].labels.data(),
                     static_cast<int>(batches[j].size)};
      }
      if (step > stream_options.first_step) input_wait += common::monotonic_seconds() - asked;
      n = inputs.front().n;
    } else {
      stager_->ready();
      next_n = step + 1 < steps_per_epoch_ ? stage(step + 1) : 0;  // overlaps this step
    }
    if (options_.stop_requested && options_.stop_requested()) step_->request_stop();
    if (ledger_) write_ledger(epoch, step, ledger_streams);
    if (state_.global_step + 1 == test_spin_step_) spin_for_ever();
    double step_started = common::monotonic_seconds();
    if (sharded)
      step_->run_shards(held, inputs.data(), {config_.seed, epoch, step}, slot);
    else
      step_->run(stager_->images(slot), stager_->labels(slot), n, {config_.seed, epoch, step},
                 slot);
    in_steps += common::monotonic_seconds() - step_started;
    seen_here += static_cast<double>(n) * virtual_size();
    epoch_samples_ = seen_here;
    n = next_n;
    state_ =
        TrainingState{epoch, step + 1, state_.global_step + 1, optimizer_->iterations(), 0, 0, 0};
    if (options_.record)
      options_.record->finished_step(state_.global_step,
                                     common::monotonic_seconds() - step_started);
    if (options_.leave_requested && options_.leave_requested()) {
      throw LeftGroup(fmt::format("left the group after epoch {} step {} (global step {})",
                                  epoch + 1, step + 1, state_.global_step));
    }
    if (state_.global_step == start_.global_step + 3 && step_->graphed()) {
      spdlog::info("training step recorded as a CUDA graph, replayed each step");
    }
    if (state_.global_step == resumed_step_ + 1) {  // benchmarks time restarts up to here
      step_->stop_agreed(0);
      spdlog::debug("first step of this run done (CLOCK_MONOTONIC {:.6f})",
                    common::monotonic_seconds());
      if (std::string kernels = backend_.implementations(); !kernels.empty())
        spdlog::info("kernels ({}): {}", dtype_policy_name(config_), kernels);
      if (options_.timeline) {
        options_.timeline->mark("first step");
        spdlog::debug("start-up: {}", options_.timeline->summary());
      }
    }
    // The flag reduced one step ago: every worker reads the same value, so all stop here.
    bool stop = step_->stop_agreed(1);
    check_finite_loss(1, state_.global_step - 1);
    show_progress(epoch, step + 1, started, seen_here, stop || force_heartbeat_);
    if (chief() && tensorboard_ && tensorboard_->wants_batch(state_.global_step))
      write_batch_summary();
    bool periodic = config_.backup.save_every_steps > 0 &&
                    state_.global_step % config_.backup.save_every_steps == 0 &&
                    step + 1 < steps_per_epoch_;
    if (stop || periodic) {
      finite_weights("a checkpoint");
      EpochTotals t = step_->totals();
      state_.epoch_loss_sum = t.loss_sum, state_.epoch_correct = t.correct;
      state_.epoch_seen = t.seen;
      state_.epoch_seconds = common::monotonic_seconds() - started;
      state_.epoch_samples = seen_here;
      state_.epoch_first_step = epoch_first_step_;
      save_checkpoint();
    }
    if (stop) {
      comm_.barrier();
      throw Preempted(fmt::format("stopped at epoch {} step {} (checkpoint saved by the chief)",
                                  epoch + 1, step + 1));
    }
  }
  EpochMetrics m;
  m.companion = config_.companion;
  m.stop_agreed = step_->stop_agreed(0);  // waits for the epoch's last step
  check_finite_loss(0, state_.global_step);
  EpochTotals t = step_->totals();
  m.epoch = epoch + 1;
  m.loss = t.mean_loss();
  m.accuracy = t.accuracy();
  m.seconds = common::monotonic_seconds() - started;
  m.samples_per_second = seen_here / m.seconds;
  if (train_.is_text()) m.tokens_per_second = m.samples_per_second * train_.positions();
  m.steps = steps_per_epoch_ - epoch_first_step_;
  m.allreduce_seconds = step_->exposed_comm_seconds();
  m.input_wait_seconds = input_wait;
  m.step_seconds = in_steps;
  m.learning_rate = optimizer_->learning_rate();  // before ReduceLROnPlateau may change it
  heartbeat(epoch + 1, steps_per_epoch_, steps_per_epoch_, m.loss, m.accuracy,
            m.samples_per_second);
  if (config_.validation) {
    double validation_started = common::monotonic_seconds();
    const Scores scores = evaluate();
    m.val_loss = scores.loss;
    m.val_accuracy = scores.companion;
    for (size_t i = 0; i < config_.metrics.size(); ++i)
      m.val_metrics.emplace_back(config_.metrics[i].name, scores.metrics[i]);
    m.val_seconds = common::monotonic_seconds() - validation_started;
    m.validated = true;
  }
  progress_.end_epoch(steps_per_epoch_, m.seconds, m.named());
  return m;
}

Scores Trainer::evaluate() {
  common::BusyPhase busy(options_.record, common::ProgressPhase::kValidating);
  return evaluate_model(*model_, backend_, test_, config_.per_worker_batch_size, &comm_,
                        loss_options(config_), config_.metrics);
}

void Trainer::write_metrics(const EpochMetrics& m) {
  common::append_line(common::RunDir(options_.run_dir).metrics_jsonl(),
                      metrics_json(m, false) + "\n");
}

// The chief died after the epoch checkpoint, before its metrics line (and so, see fit, before or
// while writing its TensorBoard points): they are written now from the checkpoint's copy. A
// checkpoint from inside an epoch carries none: the epoch before it was fully written.
void Trainer::recover_epoch_metrics() {
  if (restored_epoch_metrics_.empty()) return;
  std::string path = common::RunDir(options_.run_dir).metrics_jsonl();
  EpochMetrics m;
  try {
    m = metrics_of(restored_epoch_metrics_, "the checkpoint's epoch_metrics", config_);
  } catch (const common::ConfigError& e) {
    spdlog::warn("cannot recover the last epoch's metrics: {}", e.what());
    return;
  }
  restored_epoch_metrics_.clear();
  if (has_epoch_line(path, m.epoch)) return;
  common::BusyPhase busy(options_.record, common::ProgressPhase::kSaving);
  spdlog::warn("{} has no line for epoch {}; written now from its checkpoint", path, m.epoch);
  write_summaries(m);
  write_metrics(m);
}

// Keras's logs at epoch end: the metrics, val_ ones (validation/), then learning_rate and
// steps_per_second, and our samples_per_second; evaluation_*_vs_iterations after validating.
void Trainer::write_summaries(const EpochMetrics& m) {
  if (!tensorboard_) return;
  SummaryLogs logs;
  SummaryLogs evaluation;
  for (const auto& [name, value] : m.named()) {
    logs.push_back({name, value});
    if (name.rfind("val_", 0) == 0) evaluation.push_back({name.substr(4), value});
  }
  if (m.validated) tensorboard_->log_evaluation(optimizer_->iterations(), evaluation);
  // The rate the epoch trained with (Keras's ReduceLROnPlateau logs it before reducing it).
  const double rate = m.learning_rate >= 0 ? m.learning_rate : optimizer_->learning_rate();
  logs.insert(logs.end(), {{"learning_rate", rate},
                           {"steps_per_second", static_cast<double>(m.steps) / m.seconds},
                           {"samples_per_second", m.samples_per_second}});
  if (m.tokens_per_second > 0) logs.push_back({"tokens_per_second", m.tokens_per_second});
  tensorboard_->log_epoch(m.epoch - 1, logs);
}

void Trainer::write_batch_summary() {
  EpochTotals t = step_->totals();
  tensorboard_->log_batch(state_.global_step,
                          {{"loss", t.mean_loss()}, {config_.companion, t.accuracy()}});
}

// In an elastic group the chief's duties (restoring and writing checkpoints, metrics, summaries,
// the final model) are the first member's: the chief's own task while it is a member, another
// while its host is gone (docs/design.md#elastic-membership).
bool Trainer::chief() const {
  return elastic_size() > 0 ? comm_.rank() == 0 : options_.chief;
}

int Trainer::generation() const {
  return options_.recovery ? options_.recovery->generation() : 0;
}

int Trainer::elastic_size() const {
  std::optional<comm::ShardPlan> plan;
  if (options_.recovery) plan = options_.recovery->shards();
  return plan ? plan->virtual_size : 0;
}

int Trainer::virtual_size() const {
  return elastic_size() > 0 ? elastic_size() : comm_.size();
}

comm::ShardPlan Trainer::shards() const {
  std::optional<comm::ShardPlan> plan;
  if (options_.recovery) plan = options_.recovery->shards();
  return plan ? *plan : comm::ShardPlan{comm_.size(), comm_.rank(), 1};
}

// docs/design.md#elastic-membership, the ledger: written before the step runs here, so a worker
// killed once its part of the all-reduce was sent has its lines all the same; a step cut short
// and done again is written once per run of it (its lines are the same).
void Trainer::write_ledger(int epoch, int64_t step,
                           const std::vector<const data::BatchStream*>& streams) {
  const comm::ShardPlan held = shards();
  for (size_t j = 0; j < streams.size(); ++j) {
    common::JsonWriter w;
    w.begin_object().key("epoch").value(epoch).key("step").value(step);
    w.key("shard").value(held.shard(static_cast<int>(j))).key("task").value(options_.task);
    w.key("generation").value(generation());
    w.key("ids").begin_array();
    for (int64_t id : streams[j]->ids_at(step)) w.value(id);
    std::string line = w.end_array().end_object().str() + "\n";
    if (std::fwrite(line.data(), 1, line.size(), ledger_.get()) != line.size())
      throw common::IoError(fmt::format("cannot write the ledger {}", options_.ledger_path));
  }
  std::fflush(ledger_.get());
}

void Trainer::heartbeat(int epoch, int64_t step, int64_t steps, double loss, double accuracy,
                        double rate) {
  double now = common::monotonic_seconds();
  if (!control_ ||
      (last_heartbeat_ >= 0 && now - last_heartbeat_ < 0.5 && step != steps && !force_heartbeat_)) {
    return;
  }
  last_heartbeat_ = now;
  force_heartbeat_ = false;
  common::ControlMessage m;
  m.type = common::ControlMessageType::kProgress;
  m.task = options_.task;
  m.attempt = options_.attempt;
  m.epoch = epoch;
  m.epochs = config_.epochs;
  m.step = static_cast<int>(step);
  m.steps = static_cast<int>(steps);
  m.loss = loss;
  m.accuracy = accuracy;
  m.samples_per_second = rate;
  if (train_.is_text()) m.tokens_per_second = rate * train_.positions();
  m.global_step = state_.global_step;
  if (generation() > 0) m.generation = generation();
  // This worker's own pace, averaged since the last report: in a synchronous group every worker
  // shows the same samples/s, so only these tell which one the others wait for.
  if (std::optional<StepTimes> t = step_->take_step_times(); t && t->steps > 0) {
    m.compute_seconds_per_step = t->compute_seconds / static_cast<double>(t->steps);
    m.wait_seconds_per_step = t->wait_seconds / static_cast<double>(t->steps);
  }
  control_->send(m);
}

}  // namespace dtrain::train
