// See evaluator.h.
#include "worker/train/evaluator.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <thread>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/json.h"
#include "common/run_dir.h"
#include "worker/nn/model.h"
#include "worker/train/checkpoint.h"
#include "worker/train/gradient_rules.h"
#include "worker/train/input_stager.h"

namespace dtrain::train {

bool load_weights(nn::Model& model, const SafetensorsFile& file) {
  auto load = [&](nn::Buffer<float>& buffer, const std::vector<nn::ParamInfo>& infos) {
    std::vector<float> host(buffer.size());
    for (const nn::ParamInfo& p : infos) {
      auto it = file.tensors.find(p.name);
      if (it == file.tensors.end() || it->second.data.size() != p.count) return false;
      std::copy(it->second.data.begin(), it->second.data.end(),
                host.begin() + static_cast<long>(p.offset));
    }
    buffer.from_host(host);
    return true;
  };
  return load(model.parameters(), model.parameter_infos()) &&
         load(model.state(), model.state_infos());
}

std::pair<double, double> evaluate_model(nn::Model& model, nn::Backend& backend,
                                         const data::Dataset& test, int batch,
                                         comm::Communicator* comm, float label_smoothing) {
  const int64_t batches = (test.count + batch - 1) / batch;
  const int ranks = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  const int64_t first = batches * rank / ranks, last = batches * (rank + 1) / ranks;
  size_t per_example = static_cast<size_t>(test.height) * test.width * test.channels;
  const int positions = test.positions();
  InputStager stager(backend.device(), per_example, batch, positions);
  std::vector<int32_t> labels(static_cast<size_t>(positions) * static_cast<size_t>(batch));
  // Batch b's loss sum, correct count and examples at 3b..3b+2: each batch sums from zero, so
  // its figures do not depend on which rank ran it or on the batches before it.
  nn::Buffer<float> sums(backend.device(), 3 * static_cast<size_t>(std::max<int64_t>(batches, 1)));
  backend.device().fill_zero(sums.data(), sums.bytes());
  std::vector<float> images(per_example * static_cast<size_t>(batch));
  auto stage = [&](int64_t b) {
    int64_t start = b * batch;
    int n = static_cast<int>(std::min<int64_t>(batch, test.count - start));
    data::copy_nchw(test, start, n, images.data());
    data::copy_labels(test, start, n, labels.data());
    stager.stage(static_cast<int>(b % InputStager::kSlots), images.data(), labels.data(), n);
    return n;
  };
  int n = first < last ? stage(first) : 0;
  for (int64_t b = first; b < last; ++b) {
    int slot = static_cast<int>(b % InputStager::kSlots);
    stager.ready();
    int next = b + 1 < last ? stage(b + 1) : 0;
    const float* logits = model.forward(stager.images(slot), n, {}, false);
    backend.softmax_cross_entropy_smoothed(n * positions, model.classes(), label_smoothing, logits,
                                           stager.labels(slot), nullptr, sums.data() + 3 * b);
    n = next;
  }
  std::vector<float> host = sums.to_host();  // zeros for the other ranks' batches
  // x + 0 is x: the all-reduce hands every rank every batch's figures, bit for bit.
  if (ranks > 1) comm->all_reduce(host.data(), host.size(), comm::ReduceOp::kSum);
  double loss = 0, correct = 0;
  for (int64_t b = 0; b < batches; ++b) {
    loss += host[static_cast<size_t>(3 * b)];
    correct += host[static_cast<size_t>(3 * b + 1)];
  }
  double count = std::max<double>(static_cast<double>(test.count) * positions, 1.0);
  // Keras's val_loss includes the regularizers' penalty, as the training loss does.
  return {loss / count + regularization_penalty(model), correct / count};
}

int run_evaluator(const TrainConfig& config, nn::Backend& backend, const data::Dataset& test,
                  const EvaluatorOptions& options) {
  common::RunDir run(options.run_dir);
  CheckpointStore store(options.run_dir + "/" + config.backup.dir, config.backup.keep);
  nn::Model model(config.model, backend, config.per_worker_batch_size);
  std::string out = options.run_dir + "/eval.jsonl";
  std::string final_model = run.model_dir() + "/model.safetensors";
  int64_t last_step = -1;
  int lines = 0;
  while (true) {
    bool stopping = options.stop_requested && options.stop_requested();
    if (std::filesystem::exists(final_model)) {
      SafetensorsFile file = read_safetensors(final_model);
      if (file.metadata["architecture"] == config.model_json && load_weights(model, file)) {
        auto [loss, accuracy] = evaluate_model(model, backend, test, config.per_worker_batch_size,
                                               nullptr, config.label_smoothing);
        common::JsonWriter line;
        line.begin_object().key("model").value("final");
        line.key("val_loss").value(loss).key("val_accuracy").value(accuracy);
        common::append_line(out, line.end_object().str() + "\n");
        spdlog::info("final model: val_loss {:.4f} val_accuracy {:.4f}", loss, accuracy);
        return lines + 1;
      }
    }
    if (stopping) return lines;
    std::optional<LoadedCheckpoint> c = store.load_latest(config.model_json);
    if (c && c->state.global_step != last_step && load_weights(model, c->file)) {
      last_step = c->state.global_step;
      auto [loss, accuracy] = evaluate_model(model, backend, test, config.per_worker_batch_size,
                                             nullptr, config.label_smoothing);
      common::JsonWriter line;
      line.begin_object().key("checkpoint").value(c->path).key("epoch").value(c->state.epoch);
      line.key("step").value(c->state.step).key("global_step").value(c->state.global_step);
      line.key("val_loss").value(loss).key("val_accuracy").value(accuracy);
      common::append_line(out, line.end_object().str() + "\n");
      spdlog::info("checkpoint at global step {}: val_loss {:.4f} val_accuracy {:.4f}", last_step,
                   loss, accuracy);
      ++lines;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(options.poll_seconds));
  }
}

}  // namespace dtrain::train
