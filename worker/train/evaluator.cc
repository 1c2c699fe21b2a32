// See evaluator.h.
#include "worker/train/evaluator.h"

#include <fmt/format.h>
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

namespace {

// Row sums of each metric over n examples' outputs (rows of `units`) and label words.
void add_metrics(const std::vector<MetricSpec>& metrics, const LossOptions& loss, int n, int units,
                 const float* outputs, const int32_t* labels, float* sums) {
  for (size_t m = 0; m < metrics.size(); ++m) {
    double total = 0;
    for (int i = 0; i < n; ++i) {
      const float* o = outputs + static_cast<size_t>(i) * units;
      const int32_t* words =
          labels + static_cast<size_t>(i) * (loss.kind == nn::Loss::kSparseCategorical ? 1 : units);
      if (metrics[m].kind == MetricSpec::Kind::kTopK) {
        int label = words[0];
        if (loss.kind != nn::Loss::kSparseCategorical) {
          label = 0;
          for (int k = 1; k < units; ++k)
            if (data::target_value(words[k]) > data::target_value(words[label])) label = k;
        }
        int above = 0;  // outputs larger than the label's: in the top k while fewer than k
        for (int k = 0; k < units; ++k) above += o[k] > o[label] ? 1 : 0;
        total += above < metrics[m].k ? 1 : 0;
      } else {
        double row = 0;
        for (int k = 0; k < units; ++k) {
          const double e = double(o[k]) - data::target_value(words[k]);
          row += metrics[m].kind == MetricSpec::Kind::kMeanSquared ? e * e : std::fabs(e);
        }
        total += row / units;
      }
    }
    sums[m] = static_cast<float>(total);
  }
}

}  // namespace

Scores evaluate_model(nn::Model& model, nn::Backend& backend, const data::Dataset& test, int batch,
                      comm::Communicator* comm, const LossOptions& loss,
                      const std::vector<MetricSpec>& metrics) {
  const int64_t batches = (test.count + batch - 1) / batch;
  const int ranks = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  const int64_t first = batches * rank / ranks, last = batches * (rank + 1) / ranks;
  size_t per_example = static_cast<size_t>(test.height) * test.width * test.channels;
  const int words = test.label_width(), positions = test.positions();
  InputStager stager(backend.device(), per_example, batch, words);
  std::vector<int32_t> labels(static_cast<size_t>(words) * static_cast<size_t>(batch));
  // Batch b's loss sum, companion sum and examples at 3b..3b+2: each batch sums from zero, so
  // its figures do not depend on which rank ran it or on the batches before it. Its metrics'
  // sums follow all the batches' (metrics.size() per batch).
  const size_t slots = static_cast<size_t>(std::max<int64_t>(batches, 1));
  nn::Buffer<float> sums(backend.device(), 3 * slots);
  backend.device().fill_zero(sums.data(), sums.bytes());
  const size_t per_batch = metrics.size();
  std::vector<float> metric_sums(per_batch * slots, 0.0f);
  std::vector<float> outputs;
  std::vector<float> images(per_example * static_cast<size_t>(batch));
  std::vector<std::vector<int32_t>> staged_labels(InputStager::kSlots);
  auto stage = [&](int64_t b) {
    int64_t start = b * batch;
    int n = static_cast<int>(std::min<int64_t>(batch, test.count - start));
    data::copy_nchw(test, start, n, images.data());
    data::copy_labels(test, start, n, labels.data());
    const int slot = static_cast<int>(b % InputStager::kSlots);
    stager.stage(slot, images.data(), labels.data(), n);
    if (per_batch > 0) staged_labels[static_cast<size_t>(slot)] = labels;
    return n;
  };
  int n = first < last ? stage(first) : 0;
  for (int64_t b = first; b < last; ++b) {
    int slot = static_cast<int>(b % InputStager::kSlots);
    stager.ready();
    int next = b + 1 < last ? stage(b + 1) : 0;
    const float* logits = model.forward(stager.images(slot), n, {}, false);
    apply_loss(backend, loss, model, n, logits, stager.labels(slot), nullptr, sums.data() + 3 * b);
    if (per_batch > 0) {
      const int units = model.classes();
      outputs.resize(static_cast<size_t>(n) * units);
      backend.device().download(outputs.data(), logits, outputs.size() * sizeof(float));
      add_metrics(metrics, loss, n, units, outputs.data(),
                  staged_labels[static_cast<size_t>(slot)].data(),
                  metric_sums.data() + static_cast<size_t>(b) * per_batch);
    }
    n = next;
  }
  std::vector<float> host = sums.to_host();  // zeros for the other ranks' batches
  host.insert(host.end(), metric_sums.begin(), metric_sums.end());
  // x + 0 is x: the all-reduce hands every rank every batch's figures, bit for bit.
  if (ranks > 1) comm->all_reduce(host.data(), host.size(), comm::ReduceOp::kSum);
  Scores scores;
  scores.metrics.assign(per_batch, 0.0);
  double loss_sum = 0, companion = 0;
  for (int64_t b = 0; b < batches; ++b) {
    loss_sum += host[static_cast<size_t>(3 * b)];
    companion += host[static_cast<size_t>(3 * b + 1)];
    for (size_t m = 0; m < per_batch; ++m)
      scores.metrics[m] += host[3 * slots + static_cast<size_t>(b) * per_batch + m];
  }
  const double rows = loss.kind == nn::Loss::kSparseCategorical ? positions : 1;
  double count = std::max<double>(static_cast<double>(test.count) * rows, 1.0);
  // Keras's val_loss includes the regularizers' penalty, as the training loss does.
  scores.loss = loss_sum / count + regularization_penalty(model);
  scores.companion = companion / count;
  for (double& m : scores.metrics) m /= std::max<double>(static_cast<double>(test.count), 1.0);
  return scores;
}

std::vector<std::pair<std::string, double>> named_scores(const TrainConfig& config,
                                                         const Scores& scores,
                                                         const std::string& prefix) {
  std::vector<std::pair<std::string, double>> named = {
      {prefix + "loss", scores.loss}, {prefix + config.companion, scores.companion}};
  for (size_t m = 0; m < config.metrics.size() && m < scores.metrics.size(); ++m)
    named.emplace_back(prefix + config.metrics[m].name, scores.metrics[m]);
  return named;
}

namespace {

// One eval.jsonl line's scores, and the log's words for them.
std::string scores_words(const std::vector<std::pair<std::string, double>>& named) {
  std::string words;
  for (const auto& [name, value] : named)
    words += fmt::format("{}{} {:.4f}", words.empty() ? "" : " ", name, value);
  return words;
}

Scores evaluate_config(nn::Model& model, nn::Backend& backend, const data::Dataset& test,
                       const TrainConfig& config) {
  return evaluate_model(model, backend, test, config.per_worker_batch_size, nullptr,
                        loss_options(config), config.metrics);
}

}  // namespace

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
        const auto named =
            named_scores(config, evaluate_config(model, backend, test, config), "val_");
        common::JsonWriter line;
        line.begin_object().key("model").value("final");
        for (const auto& [name, value] : named) line.key(name).value(value);
        common::append_line(out, line.end_object().str() + "\n");
        spdlog::info("final model: {}", scores_words(named));
        return lines + 1;
      }
    }
    if (stopping) return lines;
    std::optional<LoadedCheckpoint> c = store.load_latest(config.model_json);
    if (c && c->state.global_step != last_step && load_weights(model, c->file)) {
      last_step = c->state.global_step;
      const auto named =
          named_scores(config, evaluate_config(model, backend, test, config), "val_");
      common::JsonWriter line;
      line.begin_object().key("checkpoint").value(c->path).key("epoch").value(c->state.epoch);
      line.key("step").value(c->state.step).key("global_step").value(c->state.global_step);
      for (const auto& [name, value] : named) line.key(name).value(value);
      common::append_line(out, line.end_object().str() + "\n");
      spdlog::info("checkpoint at global step {}: {}", last_step, scores_words(named));
      ++lines;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(options.poll_seconds));
  }
}

}  // namespace dtrain::train
