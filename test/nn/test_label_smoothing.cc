// Label smoothing (backend.h's softmax_cross_entropy_smoothed, on the host backends): smoothing 0
// is the plain loss, bit for bit; otherwise each row's loss is -sum t log softmax with Keras's
// targets t = (1 - s) onehot + s / classes, its gradient (softmax - t) / n matches finite
// differences, and accuracy is still against the label.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <vector>

#include "worker/nn/backend.h"

using namespace dtrain::nn;
using Floats = std::vector<float>;

TEST_CASE("label smoothing follows Keras's targets", "[loss]") {
  for (auto make : {make_reference_backend, make_dnnl_backend}) {
    std::unique_ptr<Backend> b = make(MathMode::kFloat32);
    const int n = 2, k = 3;
    Floats logits = {1.0f, -0.5f, 2.0f, 0.25f, 0.75f, -1.0f};
    std::vector<int32_t> labels = {0, 1};
    Floats plain_d(6), zero_d(6), totals_plain(3, 0.0f), totals_zero(3, 0.0f);
    b->softmax_cross_entropy(n, k, logits.data(), labels.data(), plain_d.data(),
                             totals_plain.data());
    b->softmax_cross_entropy_smoothed(n, k, 0.0f, logits.data(), labels.data(), zero_d.data(),
                                      totals_zero.data());
    CHECK(zero_d == plain_d);
    CHECK(totals_zero == totals_plain);

    const float s = 0.2f;
    Floats d(6), totals(3, 0.0f);
    b->softmax_cross_entropy_smoothed(n, k, s, logits.data(), labels.data(), d.data(),
                                      totals.data());
    double want = 0;
    for (int i = 0; i < n; ++i) {
      double sum = 0;
      for (int c = 0; c < k; ++c) sum += std::exp(double(logits[i * k + c]));
      for (int c = 0; c < k; ++c) {
        double t = (c == labels[i] ? 1 - s : 0) + s / k;
        want -= t * (logits[i * k + c] - std::log(sum));
      }
    }
    CHECK(totals[0] == Approx(want).epsilon(1e-6));
    CHECK(totals[1] == 1.0f);  // row 0's arg-max is class 2, row 1's is its label
    CHECK(totals[2] == 2.0f);
    // The gradient of the mean loss, by central differences of the loss sum / n.
    for (size_t j = 0; j < logits.size(); ++j) {
      auto loss = [&](float delta) {
        Floats moved = logits, t(3, 0.0f);
        moved[j] += delta;
        b->softmax_cross_entropy_smoothed(n, k, s, moved.data(), labels.data(), nullptr, t.data());
        return double(t[0]) / n;
      };
      double numeric = (loss(1e-3f) - loss(-1e-3f)) / 2e-3;
      CHECK(d[j] == Approx(numeric).margin(1e-4));
    }
  }
}
