// ProfiledBackend around the reference backend: a small model's forward, loss, backward and SGD
// step give bit for bit what the bare reference backend gives, and the profile holds one row per
// layer operation and shape, in call order, with its call count; fused calls reach the wrapped
// backend as one call (one row), and reset() empties the profile.
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/nn/model.h"
#include "worker/nn/profiled_backend.h"

using namespace dtrain::nn;

namespace {

using Floats = std::vector<float>;

// conv2d 3 3x3 relu, max_pooling2d 2x2, flatten, dense 5 relu, dense 4 on 6x6x1 inputs.
ModelSpec small_model() {
  dtrain::common::JsonDocument doc = dtrain::common::JsonDocument::parse(
      R"({"input_shape": [6, 6, 1], "layers": [
        {"type": "conv2d", "filters": 3, "kernel_size": 3, "activation": "relu"},
        {"type": "max_pooling2d"}, {"type": "flatten"},
        {"type": "dense", "units": 5, "activation": "relu"}, {"type": "dense", "units": 4}]})",
      "model");
  return parse_model_spec(doc.root());
}

struct StepResult {
  Floats logits, dlogits, totals, gradients, parameters;
};

// One training step of the small model on backend: forward, loss, backward, SGD.
StepResult train_step(Backend& backend) {
  const int n = 2;
  Model model(small_model(), backend, n);
  model.initialize(7);
  Floats images(n * 36);
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>((i * 37) % 11) - 5.0f;
  std::vector<int32_t> labels = {1, 3};
  StepResult r;
  const float* logits = model.forward(images.data(), n, StepKey{1, 0, 0}, true);
  r.logits.assign(logits, logits + n * 4);
  r.totals.assign(3, 0.0f);
  backend.softmax_cross_entropy(n, 4, logits, labels.data(), model.logits_gradient(),
                                r.totals.data());
  r.dlogits.assign(model.logits_gradient(), model.logits_gradient() + n * 4);
  model.backward(n);
  r.gradients = model.gradients().to_host();
  SgdParams sgd;
  sgd.learning_rate = 0.1f;
  backend.sgd_update(sgd, model.parameters().size(), model.parameters().data(),
                     model.gradients().data(), nullptr);
  r.parameters = model.parameters().to_host();
  return r;
}

const OpTime* row(const std::vector<OpTime>& table, const std::string& label) {
  for (const OpTime& t : table)
    if (t.label == label) return &t;
  return nullptr;
}

}  // namespace

TEST_CASE("ProfiledBackend computes what the backend it wraps computes", "[nn][profile]") {
  std::unique_ptr<Backend> bare = make_reference_backend();
  std::unique_ptr<Backend> inner = make_reference_backend();
  ProfiledBackend profiled(*inner);
  CHECK(profiled.name() == inner->name());
  CHECK(&profiled.device() == &inner->device());
  CHECK(profiled.math_mode() == inner->math_mode());
  CHECK_FALSE(profiled.synchronizes());  // the host device: calls have run when they return

  StepResult want = train_step(*bare);
  StepResult got = train_step(profiled);
  CHECK(got.logits == want.logits);
  CHECK(got.dlogits == want.dlogits);
  CHECK(got.totals == want.totals);
  CHECK(got.gradients == want.gradients);
  CHECK(got.parameters == want.parameters);
  CHECK(got.parameters != std::vector<float>(got.parameters.size(), 0.0f));
}

TEST_CASE("ProfiledBackend counts calls per operation and shape", "[nn][profile]") {
  std::unique_ptr<Backend> inner = make_reference_backend();
  ProfiledBackend profiled(*inner);
  train_step(profiled);
  std::vector<OpTime> table = profiled.table();
  std::vector<std::string> labels;
  for (const OpTime& t : table) labels.push_back(t.label);
  INFO("labels: " << Catch::Detail::stringify(labels));
  // The forward pass in layer order, then the loss, the backward pass and the update.
  REQUIRE(!table.empty());
  CHECK(table.front().label == "conv2d_relu_forward 2x1x6x6 k3 3x3");
  CHECK(row(table, "maxpool_forward 2x3x4x4 2x2 s2x2"));
  CHECK(row(table, "dense_relu_forward 2x12->5"));
  CHECK(row(table, "dense_forward 2x5->4"));
  CHECK(row(table, "softmax_cross_entropy 2x4"));
  CHECK(row(table, "maxpool_backward 2x3x4x4 2x2 s2x2"));
  CHECK(table.back().label == "sgd_update 119");  // 30 + 65 + 24 parameters
  // The fused forward reached the reference backend as one call: no separate conv or relu rows.
  CHECK_FALSE(row(table, "conv2d_forward 2x1x6x6 k3 3x3"));
  CHECK_FALSE(row(table, "relu_forward 96"));
  for (const OpTime& t : table) {
    CHECK(t.calls >= 1);
    CHECK(t.seconds >= 0.0);
  }

  // A second step adds to the same rows: every count doubles, no row is added.
  train_step(profiled);
  std::vector<OpTime> twice = profiled.table();
  REQUIRE(twice.size() == table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    CHECK(twice[i].label == table[i].label);
    CHECK(twice[i].calls == 2 * table[i].calls);
    CHECK(twice[i].seconds >= table[i].seconds);
  }

  // After reset(): row blocks of one kernel's gradient share the layer's row; strides and padding
  // show.
  profiled.reset();
  CHECK(profiled.table().empty());
  Floats x(2 * 12, 1.0f), dy(2 * 5, 1.0f), dw(12 * 5);
  profiled.dense_backward_weight_rows(2, 12, 5, x.data(), dy.data(), dw.data(), 0, 6);
  profiled.dense_backward_weight_rows(2, 12, 5, x.data(), dy.data(), dw.data(), 6, 12);
  const OpTime* rows = row(profiled.table(), "dense_backward_weight_rows 2x12->5");
  REQUIRE(rows);
  CHECK(rows->calls == 2);
  ConvShape s;
  s.n = 1, s.c = 1, s.h = 5, s.w = 5, s.k = 2, s.kh = s.kw = 3, s.sh = s.sw = 2;
  s.pad_top = s.pad_bottom = s.pad_left = s.pad_right = 1;
  Floats in(s.input_count(), 1.0f), w(s.weight_count(), 1.0f), b(2, 0.0f), y(s.output_count());
  profiled.conv2d_forward(s, in.data(), w.data(), b.data(), y.data());
  CHECK(row(profiled.table(), "conv2d_forward 1x1x5x5 k2 3x3 s2x2 pad 1,1,1,1"));
  CHECK(profiled.table().size() == 2);
}
