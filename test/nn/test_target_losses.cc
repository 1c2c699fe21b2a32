// Keras's losses against float targets (backend.h's target_loss, on the host backends): each
// loss's value is Keras's formula written out here, its gradient matches central differences of
// the mean loss, and the companion metric counts what Keras's metric counts. One-hot categorical
// cross-entropy is sparse categorical cross-entropy on the same labels, to rounding.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <vector>

#include "worker/data/dataset.h"
#include "worker/nn/backend.h"

using namespace dtrain::nn;
using dtrain::data::target_word;
using Floats = std::vector<float>;

namespace {

std::vector<int32_t> words(const Floats& values) {
  std::vector<int32_t> out;
  for (float v : values) out.push_back(target_word(v));
  return out;
}

// The gradient of the mean loss against central differences of totals[0] / n.
void check_gradient(Backend& b, const TargetLossShape& s, const Floats& outputs,
                    const Floats& targets) {
  Floats d(outputs.size()), totals(3, 0.0f);
  const std::vector<int32_t> t = words(targets);
  b.target_loss(s, outputs.data(), t.data(), d.data(), totals.data());
  for (size_t j = 0; j < outputs.size(); ++j) {
    auto loss = [&](float delta) {
      Floats moved = outputs, sums(3, 0.0f);
      moved[j] += delta;
      b.target_loss(s, moved.data(), t.data(), nullptr, sums.data());
      return double(sums[0]) / s.n;
    };
    const float h = s.from_logits ? 1e-3f : 1e-4f;
    const double numeric = (loss(h) - loss(-h)) / (2.0 * h);
    INFO("loss " << static_cast<int>(s.loss) << " output " << j);
    CHECK(d[j] == Approx(numeric).margin(2e-3));
  }
}

}  // namespace

// Each backend in turn (a loop outside the sections would run each section for the first only).
TEST_CASE("float-target losses follow Keras's formulas and gradients", "[loss]") {
  auto make = GENERATE(make_reference_backend, make_dnnl_backend);
  {
    std::unique_ptr<Backend> b = make(MathMode::kFloat32);
    SECTION("categorical_crossentropy on one-hot rows is the sparse loss") {
      const Floats logits = {1.0f, -0.5f, 2.0f, 0.25f, 0.75f, -1.0f};
      TargetLossShape s{Loss::kCategorical, 2, 3, true, 0};
      Floats totals(3, 0.0f), sparse(3, 0.0f), d(6), sparse_d(6);
      const std::vector<int32_t> onehot = words({1, 0, 0, 0, 1, 0}), labels = {0, 1};
      b->target_loss(s, logits.data(), onehot.data(), d.data(), totals.data());
      b->softmax_cross_entropy(2, 3, logits.data(), labels.data(), sparse_d.data(), sparse.data());
      CHECK(totals[0] == Approx(sparse[0]).epsilon(1e-6));
      CHECK(totals[1] == sparse[1]);  // row 0's arg-max is 2, row 1's is its class
      CHECK(totals[2] == 2.0f);
      for (size_t j = 0; j < d.size(); ++j) CHECK(d[j] == Approx(sparse_d[j]).margin(1e-6));
      check_gradient(*b, s, logits, {0.7f, 0.2f, 0.1f, 0, 1, 0});
      s.smoothing = 0.1f;
      check_gradient(*b, s, logits, {1, 0, 0, 0, 1, 0});
    }
    SECTION("binary_crossentropy from logits and from probabilities") {
      const Floats logits = {0.3f, -1.2f, 2.0f, -0.1f};
      const Floats targets = {1, 0, 0, 1};
      TargetLossShape s{Loss::kBinary, 2, 2, true, 0};
      Floats totals(3, 0.0f);
      std::vector<int32_t> t = words(targets);
      b->target_loss(s, logits.data(), t.data(), nullptr, totals.data());
      double want = 0;
      for (size_t j = 0; j < logits.size(); ++j) {
        const double p = 1 / (1 + std::exp(-double(logits[j])));
        want -= (targets[j] * std::log(p) + (1 - targets[j]) * std::log(1 - p)) / 2;
      }
      CHECK(totals[0] == Approx(want).epsilon(1e-6));
      CHECK(totals[1] == Approx(1.0));  // row 0: both right; row 1: both wrong
      check_gradient(*b, s, logits, targets);
      Floats probabilities;
      for (float z : logits) probabilities.push_back(1 / (1 + std::exp(-z)));
      s.from_logits = false;
      Floats from_p(3, 0.0f);
      b->target_loss(s, probabilities.data(), t.data(), nullptr, from_p.data());
      CHECK(from_p[0] == Approx(want).epsilon(1e-5));
      check_gradient(*b, s, probabilities, targets);
    }
    SECTION("mean squared and mean absolute error, each the other's companion") {
      const Floats outputs = {1.5f, -2.0f, 0.25f, 3.0f, 0.0f, 1.0f};
      const Floats targets = {1.0f, -1.0f, 0.5f, 2.0f, 1.0f, -1.0f};
      double squares = 0, absolutes = 0;
      for (size_t j = 0; j < outputs.size(); ++j) {
        const double e = double(outputs[j]) - targets[j];
        squares += e * e / 3;  // each row's mean over its 3 units
        absolutes += std::fabs(e) / 3;
      }
      std::vector<int32_t> t = words(targets);
      TargetLossShape s{Loss::kMeanSquared, 2, 3, true, 0};
      Floats totals(3, 0.0f);
      b->target_loss(s, outputs.data(), t.data(), nullptr, totals.data());
      CHECK(totals[0] == Approx(squares).epsilon(1e-6));
      CHECK(totals[1] == Approx(absolutes).epsilon(1e-6));
      check_gradient(*b, s, outputs, targets);
      s.loss = Loss::kMeanAbsolute;
      totals.assign(3, 0.0f);
      b->target_loss(s, outputs.data(), t.data(), nullptr, totals.data());
      CHECK(totals[0] == Approx(absolutes).epsilon(1e-6));
      CHECK(totals[1] == Approx(squares).epsilon(1e-6));
      check_gradient(*b, s, outputs, targets);
    }
  }
}
