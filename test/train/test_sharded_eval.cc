// Sharded validation: N ranks (threads over an in-process ring) each evaluate their share of the
// test split's batches and all-reduce the per-batch sums; every rank's loss and accuracy equal,
// bit for bit, one rank evaluating every batch, for any N and a last batch that is not full. A
// rank that evaluated nothing gives the same figures too. Not processes or the TCP link.
#include <array>
#include <catch2/catch.hpp>
#include <memory>
#include <thread>
#include <vector>

#include "test/comm/in_process_link.h"
#include "worker/comm/ring_communicator.h"
#include "worker/data/dataset.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/train_config.h"
#include "worker/train/evaluator.h"

using namespace dtrain;

namespace {

const char* kConfig = R"({
  "model": {"input_shape": [8, 8, 1], "layers": [
    {"type": "conv2d", "filters": 4, "kernel_size": 3, "activation": "relu"},
    {"type": "flatten"},
    {"type": "dense", "units": 16, "activation": "relu"},
    {"type": "dense", "units": 10}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": {"type": "sgd", "learning_rate": 0.05},
  "data": {"source": "synthetic", "examples": 64, "classes": 10},
  "metrics": [{"type": "sparse_top_k_categorical_accuracy", "k": 3}],
  "per_worker_batch_size": 8, "epochs": 1})";

constexpr int kBatch = 8;

// Each rank's (loss, accuracy, top-3 accuracy) from evaluating test with ranks ranks.
std::vector<std::array<double, 3>> evaluate_on(int ranks, const data::Dataset& test) {
  train::TrainConfig c = train::parse_train_config(kConfig, "test");
  auto links = testing::make_in_process_ring(ranks);
  std::vector<std::array<double, 3>> results(static_cast<size_t>(ranks));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto backend = nn::make_dnnl_backend();
        nn::Model model(c.model, *backend, kBatch);
        model.initialize(7);  // the same weights on every rank
        comm::RingCommunicator comm(std::move(links[static_cast<size_t>(r)]), r, ranks);
        const train::Scores s =
            train::evaluate_model(model, *backend, test, kBatch, ranks > 1 ? &comm : nullptr,
                                  train::loss_options(c), c.metrics);
        results[static_cast<size_t>(r)] = {s.loss, s.companion, s.metrics.at(0)};
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return results;
}

}  // namespace

TEST_CASE("sharded validation gives every rank one rank's figures, bit for bit") {
  // 83 examples: 11 batches of 8, the last one of 3; with 8 ranks each gets 1 or 2 batches.
  data::Dataset test = data::make_synthetic(83, 10, 8, 8, 1, 5, 1000);
  auto [loss, accuracy, top3] = evaluate_on(1, test).front();
  REQUIRE(loss > 0);
  REQUIRE((accuracy >= 0 && accuracy <= 1));
  REQUIRE(top3 >= accuracy);  // the top class is among the top 3
  for (int ranks : {2, 3, 4, 8}) {
    INFO(ranks << " ranks");
    for (const auto& [l, a, k] : evaluate_on(ranks, test)) {
      CHECK(l == loss);  // exact: the same per-batch sums, added in the same order
      CHECK(a == accuracy);
      CHECK(k == top3);
    }
  }
  SECTION("more ranks than batches: the idle ranks still take part and agree") {
    data::Dataset small = data::make_synthetic(10, 10, 8, 8, 1, 5, 1000);  // 2 batches
    auto [one_loss, one_accuracy, one_top3] = evaluate_on(1, small).front();
    for (const auto& [l, a, k] : evaluate_on(5, small)) {
      CHECK(k == one_top3);
      CHECK(l == one_loss);
      CHECK(a == one_accuracy);
    }
  }
}
