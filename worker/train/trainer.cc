// See trainer.h.
#include "worker/train/trainer.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>

#include "common/clock.h"
#include "common/errors.h"
#include "common/json.h"
#include "common/run_dir.h"
#include "common/unique_fd.h"
#include "worker/data/batcher.h"

namespace dtrain::train {
namespace {

// Slots after the gradients in the all-reduce buffer: this step's loss sum, correct count,
// examples, and the stop flag. With kMean they arrive divided by the world size.
constexpr size_t kLossSlot = 0, kCorrectSlot = 1, kSeenSlot = 2, kStopSlot = 3, kStatSlots = 4;

}  // namespace

Trainer::Trainer(const TrainConfig& config, nn::Backend& backend, comm::Communicator& comm,
                 data::Dataset train, data::Dataset test, TrainerOptions options,
                 common::ControlClient* control)
    : config_(config),
      backend_(backend),
      comm_(comm),
      train_(std::move(train)),
      test_(std::move(test)),
      options_(std::move(options)),
      control_(control),
      progress_(ProgressBar::for_stdout()),
      store_(options_.run_dir + "/" + config.backup.dir, config.backup.keep) {
  model_ = std::make_unique<nn::Sequential>(config_.model, backend_, config_.per_worker_batch_size,
                                            kStatSlots);
  if (model_->classes() < train_.classes) {
    throw common::ConfigError(
        fmt::format("model: the last layer has {} units but the data has {} classes",
                    model_->classes(), train_.classes));
  }
  model_->initialize(config_.seed);
  optimizer_ = std::make_unique<Optimizer>(config_.optimizer, model_->parameters().size());
  // Every worker runs the same number of steps (they all-reduce each one): size them by the
  // largest shard, worker 0's.
  int64_t shard = data::shard_size(train_.count, 0, comm_.size());
  steps_per_epoch_ = config_.steps_per_epoch > 0
                         ? config_.steps_per_epoch
                         : data::default_steps(shard, config_.per_worker_batch_size);
  restore();
}

Trainer::~Trainer() = default;

// Parameters, then each optimizer slot split into the same named tensors.
std::vector<TensorView> Trainer::checkpoint_tensors() {
  std::vector<TensorView> views;
  for (const nn::ParamInfo& p : model_->parameter_infos()) {
    views.push_back({p.name, p.shape, model_->parameters().data() + p.offset, p.count});
  }
  for (auto& [slot, buffer] : optimizer_->slots()) {
    for (const nn::ParamInfo& p : model_->parameter_infos()) {
      views.push_back(
          {"optimizer." + slot + "." + p.name, p.shape, buffer->data() + p.offset, p.count});
    }
  }
  return views;
}

// The chief loads the newest good checkpoint; everyone receives the state from it.
void Trainer::restore() {
  std::vector<double> header(8, 0.0);  // found, epoch, step, global step, iterations, 3 metric sums
  if (options_.chief) {
    if (std::optional<LoadedCheckpoint> c = store_.load_latest(config_.model_json)) {
      for (TensorView& v : checkpoint_tensors()) {
        auto it = c->file.tensors.find(v.name);
        if (it == c->file.tensors.end() || it->second.data.size() != v.count) {
          spdlog::warn("{}: no tensor {}; it starts from zero", c->path, v.name);
          continue;
        }
        std::copy(it->second.data.begin(), it->second.data.end(), const_cast<float*>(v.data));
      }
      const TrainingState& t = c->state;
      header = {1,
                double(t.epoch),
                double(t.step),
                double(t.global_step),
                double(t.optimizer_iterations),
                t.epoch_loss_sum,
                t.epoch_correct,
                t.epoch_seen};
      spdlog::info("restored {}: resuming at epoch {} step {}", c->path, t.epoch + 1, t.step);
    }
  }
  comm_.broadcast(header.data(), header.size() * sizeof(double), 0);
  for (TensorView& v : checkpoint_tensors())
    comm_.broadcast(const_cast<float*>(v.data), v.count * sizeof(float), 0);
  state_ =
      TrainingState{int64_t(header[1]), int64_t(header[2]), int64_t(header[3]), int64_t(header[4]),
                    header[5],          header[6],          header[7]};
  optimizer_->set_iterations(state_.optimizer_iterations);
  start_ = state_;
}

void Trainer::save_checkpoint() {
  if (!options_.chief) return;
  state_.optimizer_iterations = optimizer_->iterations();
  double started = common::monotonic_seconds();
  std::string path = store_.save(state_, checkpoint_tensors(), config_.model_json);
  spdlog::info("saved {} (epoch {} step {}) in {:.0f} ms", path, state_.epoch + 1, state_.step,
               (common::monotonic_seconds() - started) * 1000);
}

EpochMetrics Trainer::fit() {
  EpochMetrics last;
  for (int epoch = static_cast<int>(state_.epoch); epoch < config_.epochs; ++epoch) {
    progress_.begin_epoch(epoch + 1, config_.epochs);
    last = train_epoch(epoch);
    state_ = TrainingState{epoch + 1, 0, state_.global_step, optimizer_->iterations(), 0, 0, 0};
    save_checkpoint();
    if (options_.chief) write_metrics(last);
  }
  if (options_.chief) {
    std::vector<TensorView> weights;
    for (const nn::ParamInfo& p : model_->parameter_infos()) {
      weights.push_back({p.name, p.shape, model_->parameters().data() + p.offset, p.count});
    }
    write_final_model(common::RunDir(options_.run_dir).model_dir(), weights, config_.model_json);
    if (config_.backup.delete_on_success) store_.remove_all();
  }
  return last;
}

EpochMetrics Trainer::train_epoch(int epoch) {
  bool resumed = epoch == state_.epoch && state_.step > 0;
  data::BatchStreamOptions stream_options;
  stream_options.seed = config_.seed;
  stream_options.epoch = epoch;
  stream_options.worker_index = comm_.rank();
  stream_options.worker_count = comm_.size();
  stream_options.batch_size = config_.per_worker_batch_size;
  stream_options.first_step = resumed ? state_.step : 0;
  stream_options.steps = steps_per_epoch_;
  data::BatchStream stream(train_, stream_options);
  std::vector<float> dlogits(static_cast<size_t>(config_.per_worker_batch_size) *
                             model_->classes());
  std::vector<float>& reduced = model_->gradients();
  float* stats = reduced.data() + model_->parameters().size();
  double started = common::monotonic_seconds();
  double loss_sum = resumed ? state_.epoch_loss_sum : 0,
         correct_sum = resumed ? state_.epoch_correct : 0;
  double seen = resumed ? state_.epoch_seen : 0, seen_here = 0, reduce_seconds = 0;
  for (int64_t step = stream_options.first_step; step < steps_per_epoch_; ++step) {
    data::Batch batch = stream.next();
    int n = static_cast<int>(batch.size);
    const float* logits =
        model_->forward(batch.images.data(), n, {config_.seed, epoch, step}, true);
    int correct = 0;
    float loss = backend_.softmax_cross_entropy(n, model_->classes(), logits, batch.labels.data(),
                                                dlogits.data(), &correct);
    model_->backward(dlogits.data(), n);
    bool stop_here = options_.stop_requested && options_.stop_requested();
    stats[kLossSlot] = loss * static_cast<float>(n);
    stats[kCorrectSlot] = static_cast<float>(correct);
    stats[kSeenSlot] = static_cast<float>(n);
    stats[kStopSlot] = stop_here ? 1.0f : 0.0f;
    double reduce_started = common::monotonic_seconds();
    comm_.all_reduce(reduced.data(), reduced.size(), comm::ReduceOp::kMean);
    reduce_seconds += common::monotonic_seconds() - reduce_started;
    optimizer_->apply(backend_, model_->parameters(), reduced);
    float size = static_cast<float>(comm_.size());
    loss_sum += stats[kLossSlot] * size;
    correct_sum += stats[kCorrectSlot] * size;
    seen += stats[kSeenSlot] * size;
    seen_here += stats[kSeenSlot] * size;
    state_ = TrainingState{
        epoch,       step + 1, state_.global_step + 1, optimizer_->iterations(), loss_sum,
        correct_sum, seen};
    if (state_.global_step == start_.global_step + 1) {  // benchmarks time restarts up to here
      spdlog::info("first step of this run done (CLOCK_MONOTONIC {:.6f})",
                   common::monotonic_seconds());
    }
    double elapsed = common::monotonic_seconds() - started;
    std::vector<std::pair<std::string, double>> values = {{"loss", loss_sum / seen},
                                                          {"accuracy", correct_sum / seen}};
    progress_.update(step + 1, steps_per_epoch_, elapsed, values);
    heartbeat(epoch + 1, step + 1, steps_per_epoch_, loss_sum / seen, correct_sum / seen,
              seen_here / elapsed);
    if (stats[kStopSlot] > 0) {  // some worker was asked to stop: all stop here, together
      save_checkpoint();
      comm_.barrier();
      throw Preempted(fmt::format("stopped at epoch {} step {} (checkpoint saved by the chief)",
                                  epoch + 1, step + 1));
    }
    if (config_.backup.save_every_steps > 0 &&
        state_.global_step % config_.backup.save_every_steps == 0 && step + 1 < steps_per_epoch_) {
      save_checkpoint();
    }
  }
  EpochMetrics m;
  m.epoch = epoch + 1;
  m.loss = loss_sum / seen;
  m.accuracy = correct_sum / seen;
  m.seconds = common::monotonic_seconds() - started;
  m.samples_per_second = seen_here / m.seconds;
  m.allreduce_seconds = reduce_seconds;
  std::vector<std::pair<std::string, double>> values = {{"loss", m.loss}, {"accuracy", m.accuracy}};
  if (config_.validation) {
    std::tie(m.val_loss, m.val_accuracy) = evaluate();
    m.validated = true;
    values.emplace_back("val_loss", m.val_loss);
    values.emplace_back("val_accuracy", m.val_accuracy);
  }
  progress_.end_epoch(steps_per_epoch_, m.seconds, values);
  return m;
}

std::pair<double, double> Trainer::evaluate() {
  int batch = config_.per_worker_batch_size;
  size_t per_example = static_cast<size_t>(test_.height) * test_.width * test_.channels;
  std::vector<float> images(per_example * static_cast<size_t>(batch));
  std::vector<float> dlogits(static_cast<size_t>(batch) * model_->classes());
  double loss_sum = 0, correct_sum = 0;
  for (int64_t start = 0; start < test_.count; start += batch) {
    int n = static_cast<int>(std::min<int64_t>(batch, test_.count - start));
    data::copy_nchw(test_, start, n, images.data());
    const float* logits = model_->forward(images.data(), n, {config_.seed, 0, 0}, false);
    int correct = 0;
    float loss = backend_.softmax_cross_entropy(
        n, model_->classes(), logits, test_.labels.data() + start, dlogits.data(), &correct);
    loss_sum += static_cast<double>(loss) * n;
    correct_sum += correct;
  }
  return {loss_sum / static_cast<double>(test_.count),
          correct_sum / static_cast<double>(test_.count)};
}

void Trainer::write_metrics(const EpochMetrics& m) {
  common::JsonWriter w;
  w.begin_object()
      .key("epoch")
      .value(m.epoch)
      .key("loss")
      .value(m.loss)
      .key("accuracy")
      .value(m.accuracy);
  if (m.validated) w.key("val_loss").value(m.val_loss).key("val_accuracy").value(m.val_accuracy);
  w.key("seconds").value(m.seconds).key("samples_per_second").value(m.samples_per_second);
  w.key("allreduce_seconds").value(m.allreduce_seconds);
  std::string line = w.end_object().str() + "\n";
  std::string path = common::RunDir(options_.run_dir).metrics_jsonl();
  common::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!fd.valid() ||
      ::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    throw common::IoError(fmt::format("cannot append to {}", path));
  }
}

void Trainer::heartbeat(int epoch, int64_t step, int64_t steps, double loss, double accuracy,
                        double rate) {
  double now = common::monotonic_seconds();
  if (!control_ || (last_heartbeat_ >= 0 && now - last_heartbeat_ < 0.5 && step != steps)) return;
  last_heartbeat_ = now;
  common::ControlMessage m;
  m.type = "progress";
  m.task = options_.task;
  m.attempt = options_.attempt;
  m.epoch = epoch;
  m.epochs = config_.epochs;
  m.step = static_cast<int>(step);
  m.steps = static_cast<int>(steps);
  m.loss = loss;
  m.accuracy = accuracy;
  m.samples_per_second = rate;
  control_->send(m);
}

}  // namespace dtrain::train
