// The layers that move pixels (zero_padding2d, random_crop, random_flip; backend.h's remap2d):
// padding and the centre crop of inference give the image back exactly; in training each example
// gets its own window or flip, a pure function of (seed, epoch, step, shard, example); gradients
// flow back through them (finite differences); keys are Keras's.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "worker/nn/model.h"

using namespace dtrain;
using namespace dtrain::nn;
using Floats = std::vector<float>;

namespace {

ModelSpec spec_of(const std::string& json) {
  common::JsonDocument doc = common::JsonDocument::parse(json, "model");
  return parse_model_spec(doc.root().at("model"));
}

// n distinct 6x6x1 images: pixel values identify (example, row, column).
Floats images(int n) {
  Floats x(static_cast<size_t>(n) * 36);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i + 1);
  return x;
}

const char* kPadCrop = R"({"model": {"input_shape": [6, 6, 1], "layers": [
  {"type": "zero_padding2d", "padding": 2}, {"type": "random_crop", "height": 6, "width": 6},
  {"type": "flatten"}]}})";

}  // namespace

TEST_CASE("pad and crop: the centre in inference, each example's own window in training",
          "[augmentation]") {
  std::unique_ptr<Backend> backend = make_dnnl_backend();
  const int n = 16;
  Model model(spec_of(kPadCrop), *backend, n);
  Floats x = images(n);
  const float* y = model.forward(x.data(), n, StepKey{3, 1, 7, 0}, false);
  CHECK(Floats(y, y + x.size()) == x);  // padded by 2, the 6x6 centre: the image

  y = model.forward(x.data(), n, StepKey{3, 1, 7, 0}, true);
  Floats train(y, y + x.size());
  std::set<std::pair<int, int>> offsets;
  for (int i = 0; i < n; ++i) {
    // Find the window: the output's non-zero pixels are the input's, shifted by (dr, dc).
    const float* out = train.data() + i * 36;
    int dr = 0, dc = 0;
    bool found = false;
    for (int a = -2; a <= 2 && !found; ++a)
      for (int b = -2; b <= 2 && !found; ++b) {
        bool all = true;
        for (int r = 0; r < 6 && all; ++r)
          for (int q = 0; q < 6 && all; ++q) {
            int sr = r + a, sq = q + b;
            float want = sr < 0 || sr >= 6 || sq < 0 || sq >= 6 ? 0.0f : x[i * 36 + sr * 6 + sq];
            all = out[r * 6 + q] == want;
          }
        if (all) dr = a, dc = b, found = true;
      }
    CHECK(found);
    offsets.insert({dr, dc});
  }
  CHECK(offsets.size() > 4);  // 16 examples, 25 windows: not one window for the batch

  // The same key draws the same windows; another step, or another shard, others.
  y = model.forward(x.data(), n, StepKey{3, 1, 7, 0}, true);
  CHECK(Floats(y, y + x.size()) == train);
  y = model.forward(x.data(), n, StepKey{3, 1, 8, 0}, true);
  CHECK(Floats(y, y + x.size()) != train);
  y = model.forward(x.data(), n, StepKey{3, 1, 7, 1}, true);
  CHECK(Floats(y, y + x.size()) != train);
}

TEST_CASE("random_flip mirrors about half the examples in training, none in inference",
          "[augmentation]") {
  std::unique_ptr<Backend> backend = make_reference_backend();
  const int n = 64;
  Model model(spec_of(R"({"model": {"input_shape": [6, 6, 1], "layers": [
    {"type": "random_flip", "mode": "horizontal"}, {"type": "flatten"}]}})"),
              *backend, n);
  Floats x = images(n);
  const float* y = model.forward(x.data(), n, StepKey{1, 0, 0, 0}, false);
  CHECK(Floats(y, y + x.size()) == x);
  y = model.forward(x.data(), n, StepKey{1, 0, 0, 0}, true);
  int flipped = 0;
  for (int i = 0; i < n; ++i) {
    bool same = true, mirrored = true;
    for (int r = 0; r < 6; ++r)
      for (int q = 0; q < 6; ++q) {
        same &= y[i * 36 + r * 6 + q] == x[i * 36 + r * 6 + q];
        mirrored &= y[i * 36 + r * 6 + q] == x[i * 36 + r * 6 + (5 - q)];
      }
    CHECK(same != mirrored);
    flipped += mirrored;
  }
  CHECK(flipped > n / 4);
  CHECK(flipped < 3 * n / 4);
}

TEST_CASE("gradients flow back through padding, crops and flips", "[augmentation]") {
  const char* json = R"({"model": {"input_shape": [5, 5, 1], "layers": [
    {"type": "conv2d", "filters": 2, "kernel_size": 3, "padding": "same"},
    {"type": "zero_padding2d", "padding": [1, 2]}, {"type": "random_crop", "height": 5, "width": 6},
    {"type": "random_flip"}, {"type": "flatten"}, {"type": "dense", "units": 3}]}})";
  std::unique_ptr<Backend> backend = make_reference_backend();
  const int n = 4;
  Model model(spec_of(json), *backend, n);
  model.initialize(8);
  Floats x(static_cast<size_t>(n) * 25);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * static_cast<float>(i));
  std::vector<int32_t> labels = {0, 1, 2, 1};
  auto loss = [&](Floats* grads) {
    const float* logits = model.forward(x.data(), n, StepKey{5, 2, 3, 1}, true);
    Floats totals(3, 0.0f);
    backend->softmax_cross_entropy(n, 3, logits, labels.data(),
                                   grads ? model.logits_gradient() : nullptr, totals.data());
    if (grads) {
      model.backward(n);
      *grads = model.gradients().to_host();
    }
    return double(totals[0]) / n;
  };
  Floats grads;
  loss(&grads);
  Floats params = model.parameters().to_host();
  const float h = 1e-3f;
  for (size_t i = 0; i < 20; ++i) {  // the convolution's parameters: behind every remap
    Floats moved = params;
    moved[i] = params[i] + h;
    model.parameters().from_host(moved);
    double up = loss(nullptr);
    moved[i] = params[i] - h;
    model.parameters().from_host(moved);
    double numeric = (up - loss(nullptr)) / (2 * h);
    INFO("parameter " << i << ": backward " << grads[i] << ", finite difference " << numeric);
    CHECK(std::abs(numeric - grads[i]) / std::max(1e-2, std::abs(numeric)) < 0.02);
  }
}

TEST_CASE("augmentation keys are Keras's, and a crop must fit", "[augmentation]") {
  auto error = [](const std::string& layer) {
    try {
      spec_of(R"({"model": {"input_shape": [4, 4, 1], "layers": [)" + layer +
              R"(, {"type": "flatten"}, {"type": "dense", "units": 2}]}})");
    } catch (const common::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(error(R"({"type": "random_flip"})") == "accepted");
  CHECK(error(R"({"type": "zero_padding2d", "padding": [[1, 0], [0, 2]]})") == "accepted");
  CHECK_THAT(error(R"({"type": "random_flip", "mode": "sideways"})"),
             Catch::StartsWith("model.layers[0].mode: expected \"horizontal\""));
  CHECK_THAT(error(R"({"type": "random_crop", "height": 5, "width": 4})"),
             Catch::StartsWith("model.layers[0]: a 5x4 crop does not fit the 4x4 input"));
  CHECK_THAT(error(R"({"type": "zero_padding2d", "padding": [1, 2, 3]})"),
             Catch::StartsWith("model.layers[0].padding: expected an integer"));
}
