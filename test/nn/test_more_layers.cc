// Issue 44's layers and activations: sigmoid, tanh, gelu and swish (as the activation layer and
// as dense's and conv2d's activation), average pooling, max pooling with "same" padding, and
// the rest as they come. For each: the values Keras computes on a small known input, gradients
// that match finite differences of the loss on the reference backend, the oneDNN backend's
// parity with the reference (operation by operation and a whole model's loss and gradients),
// and the ConfigErrors a bad key gets. Also the cross-entropy's vector loops (host_eltwise.h).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "worker/nn/host_eltwise.h"
#include "worker/nn/model.h"

using namespace dtrain;
using namespace dtrain::nn;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using Floats = std::vector<float>;

namespace {

ModelSpec spec_of(const std::string& json) {
  common::JsonDocument doc = common::JsonDocument::parse(json, "model");
  return parse_model_spec(doc.root().at("model"));
}

std::string error_of(const std::string& json) {
  try {
    spec_of(json);
  } catch (const common::ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

const int kBatch = 3;

Floats images(const Dims& d) {
  Floats x(d.size() * kBatch);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 17) / 8.0f - 1.0f;
  return x;
}

// The mean cross-entropy of the model on the fixed batch, and (when grads) its gradients.
double loss_of(Model& model, Backend& backend, Floats* grads = nullptr) {
  Floats x = images(model.input_dims());
  std::vector<int32_t> labels = {1, 0, 2};
  const float* logits = model.forward(x.data(), kBatch, StepKey{5, 0, 0}, true);
  Floats totals(3, 0.0f);
  backend.softmax_cross_entropy(kBatch, model.classes(), logits, labels.data(),
                                grads ? model.logits_gradient() : nullptr, totals.data());
  if (grads) {
    model.backward(kBatch);
    *grads = model.gradients().to_host();
  }
  return totals[0] / kBatch;
}

// Checks every parameter's gradient against central differences of the loss (reference
// backend), skipping a step that crosses a kink (two different one-sided slopes).
void check_gradients(const std::string& json, double tolerance = 0.03) {
  INFO(json);
  std::unique_ptr<Backend> backend = make_reference_backend();
  Model model(spec_of(json), *backend, kBatch);
  model.initialize(7);
  Floats grads;
  loss_of(model, *backend, &grads);
  Floats params = model.parameters().to_host();
  const float h = 1e-3f;
  const double center = loss_of(model, *backend);
  size_t compared = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    Floats moved = params;
    moved[i] = params[i] + h;
    model.parameters().from_host(moved);
    double up = loss_of(model, *backend);
    moved[i] = params[i] - h;
    model.parameters().from_host(moved);
    double down = loss_of(model, *backend);
    double forward = (up - center) / h, backward = (center - down) / h;
    if (std::abs(forward - backward) >
        0.1 * std::max({std::abs(forward), std::abs(backward), 1e-2}))
      continue;
    double numeric = (up - down) / (2 * h);
    INFO("parameter " << i << ": backward " << grads[i] << ", finite difference " << numeric);
    CHECK(std::abs(numeric - grads[i]) / std::max(1e-2, std::abs(numeric)) < tolerance);
    ++compared;
  }
  model.parameters().from_host(params);
  CHECK(compared * 10 > params.size() * 9);
}

// The oneDNN backend's loss and gradients against the reference's, on the same weights.
void check_model_parity(const std::string& json) {
  INFO(json);
  std::unique_ptr<Backend> ref = make_reference_backend(), dnnl = make_dnnl_backend();
  ModelSpec spec = spec_of(json);
  Model a(spec, *ref, kBatch), b(spec, *dnnl, kBatch);
  a.initialize(11);
  b.initialize(11);
  Floats ga, gb;
  CHECK(loss_of(b, *dnnl, &gb) == Approx(loss_of(a, *ref, &ga)).epsilon(1e-5));
  REQUIRE(ga.size() == gb.size());
  double scale = 0;
  for (float g : ga) scale = std::max(scale, double{std::abs(g)});
  for (size_t i = 0; i < ga.size(); ++i) {
    INFO("gradient " << i);
    CHECK(std::abs(ga[i] - gb[i]) <= 1e-4 * scale + 1e-6);
  }
}

// Flatten and a dense layer of 3 logits after `middle` (layer objects, comma-separated).
std::string model_with(const std::string& input_shape, const std::string& middle) {
  return R"({"model": {"input_shape": )" + input_shape + R"(, "layers": [)" + middle +
         R"(, {"type": "flatten"}, {"type": "dense", "units": 3}]}})";
}

const char* kActivations[] = {"sigmoid", "tanh", "gelu", "swish"};

}  // namespace

TEST_CASE("sigmoid, tanh, gelu and swish compute Keras's values", "[nn][layers]") {
  std::unique_ptr<Backend> ref = make_reference_backend(), dnnl = make_dnnl_backend();
  const Floats x = {-3.0f, -0.5f, 0.0f, 0.25f, 2.0f};
  // Keras's definitions, in double: sigmoid, tanh, gelu (erf), silu.
  auto keras = [](Eltwise f, double v) {
    switch (f) {
      case Eltwise::kSigmoid:
        return 1 / (1 + std::exp(-v));
      case Eltwise::kTanh:
        return std::tanh(v);
      case Eltwise::kGelu:
        return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      case Eltwise::kSwish:
        return v / (1 + std::exp(-v));
    }
    return 0.0;
  };
  for (Eltwise f : {Eltwise::kSigmoid, Eltwise::kTanh, Eltwise::kGelu, Eltwise::kSwish}) {
    INFO(eltwise_name(f));
    Floats y_ref(x.size()), y_dnnl(x.size());
    ref->eltwise_forward(f, x.size(), x.data(), y_ref.data());
    dnnl->eltwise_forward(f, x.size(), x.data(), y_dnnl.data());
    for (size_t i = 0; i < x.size(); ++i) {
      CHECK(y_ref[i] == Approx(keras(f, x[i])).epsilon(1e-6).margin(1e-7));
      CHECK(y_dnnl[i] == Approx(keras(f, x[i])).epsilon(1e-5).margin(1e-6));
    }
  }
}

// GELU runs on host_eltwise.h's loops (Abramowitz and Stegun's erf, host_lanes.h's exponential):
// each width this CPU runs gives the plain loops' bits, and the values are Keras's to a few
// roundings across the whole range, the tails included (1 + erf is taken as erfc there).
TEST_CASE("GELU's loops give Keras's values and the same bits at every vector width",
          "[nn][layers]") {
  using direct_conv::Vectors;
  Floats x, dy;
  for (int i = 0; i <= 4000; ++i) x.push_back(-12.0f + 24.0f * static_cast<float>(i) / 4000.0f);
  x.push_back(-200.0f);
  x.push_back(200.0f);
  for (size_t i = 0; i < x.size(); ++i) dy.push_back(0.5f - static_cast<float>(i % 7) / 7.0f);
  auto run = [&](Vectors v) {
    std::pair<Floats, Floats> out{Floats(x.size()), Floats(x.size())};
    host_gelu_forward(x.size(), x.data(), out.first.data(), v);
    host_gelu_backward(x.size(), x.data(), dy.data(), out.second.data(), v);
    return out;
  };
  const auto plain = run(Vectors::kPlain);
  double worst_y = 0, worst_dx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
    const double y = v * cdf, slope = cdf + v * std::exp(-v * v / 2) / std::sqrt(2 * M_PI);
    worst_y = std::max(worst_y, std::abs(plain.first[i] - y) / std::max(1.0, std::abs(y)));
    worst_dx = std::max(worst_dx, std::abs(plain.second[i] - dy[i] * slope));
  }
  INFO("worst y " << worst_y << ", worst dx " << worst_dx);
  CHECK(worst_y < 1e-6);
  CHECK(worst_dx < 1e-6);
  CHECK(plain.first[x.size() - 2] == 0.0f);  // gelu(-200): 0, not NaN
  CHECK(plain.first.back() == 200.0f);
  for (Vectors v : {Vectors::kAvx512, Vectors::kAvx2}) {
    if (!direct_conv::runs(v)) continue;
    INFO(direct_conv::vectors_name(v));
    const auto wide = run(v);
    CHECK(wide.first == plain.first);
    CHECK(wide.second == plain.second);
  }
}

TEST_CASE("the cross-entropy's rows match a softmax in double, the same bits at every width",
          "[nn][layers]") {
  using direct_conv::Vectors;
  // Rows of 1, 3, 16, 65 and 130 classes (every tail of the 16 lanes), with a NaN row.
  for (int classes : {1, 3, 16, 65, 130}) {
    const int n = 37;
    Floats logits(size_t(n) * classes);
    std::vector<int32_t> labels(n);
    for (size_t i = 0; i < logits.size(); ++i)
      logits[i] = 8.0f * std::sin(0.37f * static_cast<float>(i)) + (i % 5 == 0 ? 30.0f : 0.0f);
    for (int i = 0; i < n; ++i) labels[i] = (i * 7) % classes;
    logits[size_t(n - 1) * classes] = NAN;
    auto run = [&](Vectors v) {
      struct Out {
        Floats d, losses;
        std::vector<uint8_t> hits;
      } o{Floats(logits.size()), Floats(n), std::vector<uint8_t>(n)};
      host_softmax_cross_entropy(n, classes, logits.data(), labels.data(), 0.25f, o.d.data(),
                                 o.losses.data(), o.hits.data(), v);
      return o;
    };
    const auto plain = run(Vectors::kPlain);
    INFO(classes << " classes");
    for (int i = 0; i + 1 < n; ++i) {
      const float* x = logits.data() + size_t(i) * classes;
      const double top = *std::max_element(x, x + classes);
      double sum = 0;
      for (int j = 0; j < classes; ++j) sum += std::exp(x[j] - top);
      const int best = static_cast<int>(std::max_element(x, x + classes) - x);
      CHECK(plain.losses[i] == Approx(x[labels[i]] - top - std::log(sum)).margin(1e-5));
      CHECK(plain.hits[i] == (best == labels[i] ? 1 : 0));
      for (int j = 0; j < classes; ++j) {
        const double want = (std::exp(x[j] - top) / sum - (j == labels[i])) * 0.25;
        CHECK(plain.d[size_t(i) * classes + j] == Approx(want).margin(1e-7));
      }
    }
    CHECK(std::isnan(plain.losses[n - 1]));  // a NaN logit makes the row's loss NaN
    for (Vectors v : {Vectors::kAvx512, Vectors::kAvx2}) {
      if (!direct_conv::runs(v)) continue;
      INFO(direct_conv::vectors_name(v));
      const auto wide = run(v);
      CHECK(std::memcmp(wide.d.data(), plain.d.data(), plain.d.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(wide.losses.data(), plain.losses.data(), n * sizeof(float)) == 0);
      CHECK(wide.hits == plain.hits);
    }
  }
}

TEST_CASE("oneDNN's activations match the reference, forward and backward", "[parity]") {
  std::unique_ptr<Backend> ref = make_reference_backend(), dnnl = make_dnnl_backend();
  std::mt19937 rng(44);
  std::uniform_real_distribution<float> value(-6.0f, 6.0f);
  Floats x(1001), dy(1001);
  for (float& v : x) v = value(rng);
  for (float& v : dy) v = value(rng) / 6.0f;
  for (Eltwise f : {Eltwise::kSigmoid, Eltwise::kTanh, Eltwise::kGelu, Eltwise::kSwish}) {
    INFO(eltwise_name(f));
    Floats y_ref(x.size()), y_dnnl(x.size()), dx_ref(x.size()), dx_dnnl(x.size());
    ref->eltwise_forward(f, x.size(), x.data(), y_ref.data());
    dnnl->eltwise_forward(f, x.size(), x.data(), y_dnnl.data());
    ref->eltwise_backward(f, x.size(), x.data(), dy.data(), dx_ref.data());
    dnnl->eltwise_backward(f, x.size(), x.data(), dy.data(), dx_dnnl.data());
    double worst_y = 0, worst_dx = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      worst_y = std::max(worst_y, std::abs(double{y_ref[i]} - y_dnnl[i]) /
                                      std::max(1.0, double{std::abs(y_ref[i])}));
      worst_dx = std::max(worst_dx, std::abs(double{dx_ref[i]} - dx_dnnl[i]));
    }
    INFO("worst y " << worst_y << ", worst dx " << worst_dx);
    CHECK(worst_y < 1e-5);
    CHECK(worst_dx < 1e-5);
    // In place, as the layers may call it.
    Floats in_place = x;
    dnnl->eltwise_forward(f, x.size(), in_place.data(), in_place.data());
    CHECK(in_place == y_dnnl);
  }
}

TEST_CASE("activations train by their gradients as layers and on dense and conv2d",
          "[nn][layers]") {
  for (const char* name : kActivations) {
    const std::string f = name;
    check_gradients(model_with("[4, 4, 1]", R"({"type": "conv2d", "filters": 2, "kernel_size": 3,
      "activation": ")" + f + R"("})"));
    check_gradients(R"({"model": {"input_shape": [3, 3, 1], "layers": [{"type": "flatten"},
      {"type": "dense", "units": 4, "activation": ")" +
                    f + R"("}, {"type": "dense", "units": 3}]}})");
    check_gradients(R"({"model": {"input_shape": [3, 3, 1], "layers": [{"type": "flatten"},
      {"type": "dense", "units": 4}, {"type": "activation", "activation": ")" +
                    f + R"("}, {"type": "dense", "units": 3}]}})");
    check_model_parity(model_with("[5, 5, 2]", R"({"type": "conv2d", "filters": 3,
      "kernel_size": 3, "padding": "same", "activation": ")" +
                                                   f + R"("})"));
  }
}

TEST_CASE("an activation on dense computes what the activation layer after it does",
          "[nn][layers]") {
  // Both with the weights the first is initialised with (initialisation keys on the node's
  // index, which the activation layer moves).
  Floats weights;
  auto loss_and_grads = [&](const std::string& layers) {
    std::unique_ptr<Backend> backend = make_reference_backend();
    Model model(spec_of(R"({"model": {"input_shape": [3, 3, 1], "layers": [{"type": "flatten"},
      )" + layers + R"(, {"type": "dense", "units": 3}]}})"),
                *backend, kBatch);
    model.initialize(5);
    if (weights.empty()) weights = model.parameters().to_host();
    model.parameters().from_host(weights);
    Floats grads;
    double loss = loss_of(model, *backend, &grads);
    return std::make_pair(loss, grads);
  };
  for (const char* name : kActivations) {
    const std::string f = name;
    CHECK(loss_and_grads(R"({"type": "dense", "units": 4, "activation": ")" + f + R"("})") ==
          loss_and_grads(R"({"type": "dense", "units": 4},
                             {"type": "activation", "activation": ")" +
                         f + R"("})"));
  }
  // silu is Keras's name for swish.
  CHECK(loss_and_grads(R"({"type": "dense", "units": 4, "activation": "silu"})") ==
        loss_and_grads(R"({"type": "dense", "units": 4, "activation": "swish"})"));
}

TEST_CASE("an activation dtrain does not compute is a ConfigError naming the key", "[nn][layers]") {
  CHECK_THAT(error_of(model_with("[4, 4, 1]", R"({"type": "conv2d", "filters": 2,
    "kernel_size": 3, "activation": "elu"})")),
             StartsWith("model.layers[0].activation: activation \"elu\" is not supported"));
  CHECK_THAT(error_of(model_with("[4, 4, 1]", R"({"type": "activation", "activation": 3})")),
             StartsWith("model.layers[0].activation:"));
}

TEST_CASE("average pooling takes each window's mean; \"same\" only over the input, as TF",
          "[nn][layers]") {
  // One 3x3 channel, a 2x2 pool of stride 2: "valid" gives one window, "same" four, the
  // bottom and right ones cut by the edge (TensorFlow pads only after: 3 = 2 * 2 - 1).
  const Floats x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  for (auto make : {make_reference_backend, make_dnnl_backend}) {
    std::unique_ptr<Backend> backend = make(MathMode::kFloat32);
    INFO(backend->name());
    Model valid(spec_of(R"({"model": {"input_shape": [3, 3, 1], "layers": [
      {"type": "average_pooling2d", "pool_size": 2}, {"type": "flatten"}]}})"),
                *backend, 1);
    const float* y = valid.forward(x.data(), 1, StepKey{}, false);
    CHECK(Floats(y, y + 1) == Floats{3});
    Model same(spec_of(R"({"model": {"input_shape": [3, 3, 1], "layers": [
      {"type": "average_pooling2d", "pool_size": 2, "padding": "same"}, {"type": "flatten"}]}})"),
               *backend, 1);
    y = same.forward(x.data(), 1, StepKey{}, false);
    CHECK(Floats(y, y + 4) == Floats{3, 4.5f, 7.5f, 9});
    // Max pooling, "same": the padding is never the maximum.
    const Floats negative = {-1, -2, -3, -4, -5, -6, -7, -8, -9};
    Model max_same(spec_of(R"({"model": {"input_shape": [3, 3, 1], "layers": [
      {"type": "max_pooling2d", "padding": "same"}, {"type": "flatten"}]}})"),
                   *backend, 1);
    y = max_same.forward(negative.data(), 1, StepKey{}, false);
    CHECK(Floats(y, y + 4) == Floats{-1, -3, -7, -9});
  }
  CHECK(spec_of(R"({"model": {"input_shape": [5, 7, 2], "layers": [
    {"type": "average_pooling2d", "pool_size": [2, 3], "strides": 2, "padding": "same"},
    {"type": "flatten"}]}})")
            .nodes[0]
            .out == Dims{2, 3, 4});
  CHECK(spec_of(R"({"model": {"input_shape": [5, 7, 2], "layers": [
    {"type": "average_pooling2d", "pool_size": 2, "strides": [1, 2]}, {"type": "flatten"}]}})")
            .nodes[0]
            .out == Dims{2, 4, 3});
}

TEST_CASE("pooling's gradients match finite differences, and oneDNN the reference",
          "[nn][layers]") {
  const char* pools[] = {
      R"({"type": "average_pooling2d", "pool_size": 2})",
      R"({"type": "average_pooling2d", "pool_size": 3, "strides": 2, "padding": "same"})",
      R"({"type": "average_pooling2d", "pool_size": [2, 3], "strides": 1, "padding": "same"})",
      R"({"type": "max_pooling2d", "pool_size": 2, "padding": "same"})",
      R"({"type": "max_pooling2d", "pool_size": 3, "strides": 2, "padding": "same"})"};
  for (const char* pool : pools) {
    const std::string layers =
        R"({"type": "conv2d", "filters": 2, "kernel_size": 2, "activation": "tanh"}, )" +
        std::string(pool);
    check_gradients(model_with("[6, 5, 1]", layers));
    check_model_parity(model_with("[7, 6, 2]", layers));
  }
}

TEST_CASE("oneDNN pooling with TensorFlow's padding matches the reference", "[parity]") {
  std::unique_ptr<Backend> ref = make_reference_backend(), dnnl = make_dnnl_backend();
  std::mt19937 rng(45);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (int trial = 0; trial < 24; ++trial) {
    PoolShape s;
    s.n = 2, s.c = 3, s.h = 4 + trial % 7, s.w = 5 + trial % 5;
    s.kh = 1 + trial % 3, s.kw = 1 + (trial / 3) % 3, s.sh = 1 + trial % 2, s.sw = 1 + trial % 3;
    auto pad = [](int size, int kernel, int stride, int* before, int* after) {
      int out = (size + stride - 1) / stride;
      int total = std::max((out - 1) * stride + kernel - size, 0);
      *before = total / 2, *after = total - total / 2;
    };
    pad(s.h, s.kh, s.sh, &s.pad_top, &s.pad_bottom);
    pad(s.w, s.kw, s.sw, &s.pad_left, &s.pad_right);
    INFO("h " << s.h << " w " << s.w << " window " << s.kh << "x" << s.kw << " strides " << s.sh
              << "x" << s.sw);
    Floats x(s.input_count()), dy(s.output_count());
    for (float& v : x) v = value(rng);
    for (float& v : dy) v = value(rng);
    Floats y_ref(dy.size()), y_dnnl(dy.size()), dx_ref(x.size()), dx_dnnl(x.size());
    ref->avgpool_forward(s, x.data(), y_ref.data());
    dnnl->avgpool_forward(s, x.data(), y_dnnl.data());
    ref->avgpool_backward(s, dy.data(), dx_ref.data());
    dnnl->avgpool_backward(s, dy.data(), dx_dnnl.data());
    for (size_t i = 0; i < y_ref.size(); ++i) CHECK(y_dnnl[i] == Approx(y_ref[i]).margin(1e-6));
    for (size_t i = 0; i < dx_ref.size(); ++i) CHECK(dx_dnnl[i] == Approx(dx_ref[i]).margin(1e-6));
    std::vector<unsigned char> ws_ref(ref->maxpool_workspace_bytes(s)),
        ws_dnnl(dnnl->maxpool_workspace_bytes(s));
    ref->maxpool_forward(s, x.data(), y_ref.data(), ws_ref.data());
    dnnl->maxpool_forward(s, x.data(), y_dnnl.data(), ws_dnnl.data());
    CHECK(y_ref == y_dnnl);
    ref->maxpool_backward(s, dy.data(), ws_ref.data(), dx_ref.data());
    dnnl->maxpool_backward(s, dy.data(), ws_dnnl.data(), dx_dnnl.data());
    for (size_t i = 0; i < dx_ref.size(); ++i) CHECK(dx_dnnl[i] == Approx(dx_ref[i]).margin(1e-6));
  }
}

TEST_CASE("pooling keys are Keras's; mistakes are ConfigErrors naming the key", "[nn][layers]") {
  CHECK_THAT(error_of(model_with("[4, 4, 1]", R"({"type": "average_pooling2d"})")),
             StartsWith("model.layers[0]: missing required key \"pool_size\""));
  CHECK_THAT(error_of(model_with("[4, 4, 1]",
                                 R"({"type": "average_pooling2d", "pool_size": 2,
                                     "padding": "full"})")),
             StartsWith("model.layers[0].padding: expected \"valid\" or \"same\""));
  CHECK_THAT(error_of(model_with("[4, 4, 1]", R"({"type": "max_pooling2d", "padding": "causal"})")),
             StartsWith("model.layers[0].padding: expected \"valid\" or \"same\""));
  CHECK_THAT(error_of(model_with("[4, 4, 1]", R"({"type": "average_pooling2d", "pool_size": 0})")),
             StartsWith("model.layers[0].pool_size:"));
  CHECK_THAT(error_of(model_with("[2, 2, 1]", R"({"type": "average_pooling2d", "pool_size": 3})")),
             Contains("a 3x3 pool does not fit the 2x2 input"));
  CHECK(error_of(model_with("[2, 2, 1]", R"({"type": "average_pooling2d", "pool_size": 3,
    "padding": "same"})")) == "accepted");
}

TEST_CASE("rescaling is x * scale + offset, in training and inference", "[nn][layers]") {
  const Floats x = {0, 51, 255, -1};
  for (auto make : {make_reference_backend, make_dnnl_backend}) {
    std::unique_ptr<Backend> backend = make(MathMode::kFloat32);
    Model model(spec_of(R"({"model": {"input_shape": [2, 2, 1], "layers": [
      {"type": "rescaling", "scale": 0.00784313725490196, "offset": -1}, {"type": "flatten"}]}})"),
                *backend, 1);
    for (bool training : {false, true}) {
      const float* y = model.forward(x.data(), 1, StepKey{}, training);
      for (size_t i = 0; i < x.size(); ++i)
        CHECK(y[i] == x[i] * static_cast<float>(0.00784313725490196) + -1.0f);
    }
  }
  check_gradients(model_with("[5, 5, 1]", R"({"type": "rescaling", "scale": 0.5, "offset": 0.25},
    {"type": "conv2d", "filters": 2, "kernel_size": 3, "activation": "sigmoid"},
    {"type": "rescaling", "scale": -3})"));
  check_model_parity(model_with("[5, 5, 2]", R"({"type": "conv2d", "filters": 2,
    "kernel_size": 3}, {"type": "rescaling", "scale": 2.5, "offset": 1})"));
  CHECK_THAT(error_of(model_with("[2, 2, 1]", R"({"type": "rescaling"})")),
             StartsWith("model.layers[0]: missing required key \"scale\""));
  CHECK_THAT(error_of(model_with("[2, 2, 1]", R"({"type": "rescaling", "scale": [1, 2]})")),
             StartsWith("model.layers[0].scale: expected a number (dtrain has no per-channel"));
  CHECK_THAT(error_of(model_with("[2, 2, 1]", R"({"type": "rescaling", "scale": 1,
    "offset": "1"})")),
             StartsWith("model.layers[0].offset: expected a number"));
}

TEST_CASE("reshape reshapes the channels-last order, as Keras's does", "[nn][layers]") {
  // A 2x3 image of 2 channels; element (row y, column x, channel c) is 100 y + 10 x + c,
  // stored NCHW.
  Floats x(12);
  for (int c = 0; c < 2; ++c)
    for (int y = 0; y < 2; ++y)
      for (int col = 0; col < 3; ++col) x[(c * 2 + y) * 3 + col] = 100.0f * y + 10.0f * col + c;
  // Keras's channels-last order of those elements.
  Floats keras;
  for (int y = 0; y < 2; ++y)
    for (int col = 0; col < 3; ++col)
      for (int c = 0; c < 2; ++c) keras.push_back(100.0f * y + 10.0f * col + c);
  std::unique_ptr<Backend> backend = make_dnnl_backend();
  // To [12]: a flat output in Keras's order.
  Model flat(spec_of(R"({"model": {"input_shape": [2, 3, 2], "layers": [
    {"type": "reshape", "target_shape": [12]}]}})"),
             *backend, 1);
  const float* y = flat.forward(x.data(), 1, StepKey{}, true);
  CHECK(Floats(y, y + 12) == keras);
  // To [3, -1, 4] (3 x 1 x 4, the -1 inferred): Keras's element (r, 0, c) is keras[4 r + c],
  // stored NCHW: c major.
  ModelSpec spec = spec_of(R"({"model": {"input_shape": [2, 3, 2], "layers": [
    {"type": "reshape", "target_shape": [3, -1, 4]}, {"type": "flatten"}]}})");
  CHECK(spec.nodes[0].out == Dims{4, 3, 1});
  Model image(spec, *backend, 1);
  y = image.forward(x.data(), 1, StepKey{}, true);
  for (int c = 0; c < 4; ++c)
    for (int r = 0; r < 3; ++r) CHECK(y[c * 3 + r] == keras[static_cast<size_t>(4 * r + c)]);
  // Gradients flow back through the permutation; the orders agree with one channel (a view).
  check_gradients(model_with("[4, 3, 2]", R"({"type": "conv2d", "filters": 3, "kernel_size": 2,
    "activation": "tanh"}, {"type": "reshape", "target_shape": [2, 3, 3]},
    {"type": "conv2d", "filters": 2, "kernel_size": 2})"));
  check_gradients(model_with("[4, 4, 1]", R"({"type": "reshape", "target_shape": [2, 8, 1]},
    {"type": "conv2d", "filters": 2, "kernel_size": 2, "activation": "gelu"},
    {"type": "reshape", "target_shape": [-1]})"));
  check_model_parity(model_with("[4, 3, 2]", R"({"type": "conv2d", "filters": 3,
    "kernel_size": 2}, {"type": "reshape", "target_shape": [3, 2, 3]})"));
  CHECK_THAT(error_of(model_with("[2, 2, 3]", R"({"type": "reshape", "target_shape": [5]})")),
             StartsWith("model.layers[0]: target_shape [5] does not hold the input's 12 values"));
  CHECK_THAT(error_of(model_with("[2, 2, 3]", R"({"type": "reshape",
    "target_shape": [-1, -1, 3]})")),
             StartsWith("model.layers[0].target_shape: more than one -1"));
  CHECK_THAT(error_of(model_with("[2, 2, 3]", R"({"type": "reshape", "target_shape": [4, 3]})")),
             StartsWith("model.layers[0].target_shape: expected [units] or [height, width, "
                        "channels]"));
  CHECK_THAT(error_of(model_with("[2, 2, 3]", R"({"type": "reshape", "target_shape": [0, 3, 4]})")),
             StartsWith("model.layers[0].target_shape: a size of 0"));
}

TEST_CASE("translate2d reads as Keras's affine_transform: bilinear or nearest, four fills",
          "[nn][layers]") {
  // One row [1 2 3 4] shifted right by 1.5: output q reads the input at q - 1.5.
  const Floats x = {1, 2, 3, 4};
  const Shift2d shift{0.0f, 1.5f};
  auto translated = [&](FillMode fill, bool bilinear) {
    TranslateShape s;
    s.n = 1, s.c = 1, s.h = 1, s.w = 4, s.bilinear = bilinear, s.fill = fill, s.fill_value = 9;
    Floats y(4);
    make_reference_backend()->translate2d_forward(s, &shift, x.data(), y.data());
    Floats same(4);
    make_dnnl_backend()->translate2d_forward(s, &shift, x.data(), same.data());
    CHECK(same == y);
    return y;
  };
  // reflect (d c b a | a b c d): -2 -> 2, -1 -> 1; wrap: -2 -> 3, -1 -> 4; constant: 9;
  // nearest: the edge.
  CHECK(translated(FillMode::kReflect, true) == Floats{1.5f, 1, 1.5f, 2.5f});
  CHECK(translated(FillMode::kWrap, true) == Floats{3.5f, 2.5f, 1.5f, 2.5f});
  CHECK(translated(FillMode::kConstant, true) == Floats{9, 5, 1.5f, 2.5f});
  CHECK(translated(FillMode::kNearest, true) == Floats{1, 1, 1.5f, 2.5f});
  // nearest interpolation rounds the coordinate (q - 1.5 + 0.5, down).
  CHECK(translated(FillMode::kReflect, false) == Floats{1, 1, 2, 3});
  CHECK(translated(FillMode::kConstant, false) == Floats{9, 1, 2, 3});

  // Backward is the transpose: <T x, dy> = <x, T' dy>, for every fill (fill value 0).
  std::mt19937 rng(46);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (FillMode fill :
       {FillMode::kReflect, FillMode::kWrap, FillMode::kConstant, FillMode::kNearest}) {
    for (bool bilinear : {true, false}) {
      TranslateShape s;
      s.n = 2, s.c = 2, s.h = 5, s.w = 4, s.bilinear = bilinear, s.fill = fill;
      const Shift2d shifts[] = {{1.25f, -2.75f}, {-4.5f, 3.0f}};
      Floats a(s.count()), dy(s.count()), ta(s.count()), tdy(s.count());
      for (float& v : a) v = value(rng);
      for (float& v : dy) v = value(rng);
      std::unique_ptr<Backend> backend = make_reference_backend();
      backend->translate2d_forward(s, shifts, a.data(), ta.data());
      backend->translate2d_backward(s, shifts, dy.data(), tdy.data());
      double left = 0, right = 0;
      for (size_t i = 0; i < a.size(); ++i)
        left += double{ta[i]} * dy[i], right += double{a[i]} * tdy[i];
      INFO("fill " << static_cast<int>(fill) << " bilinear " << bilinear);
      CHECK(left == Approx(right).epsilon(1e-5));
    }
  }
}

TEST_CASE("random translation shifts each example in training only, by its own draw",
          "[nn][layers]") {
  const std::string json = R"({"model": {"input_shape": [6, 5, 2], "layers": [
    {"type": "random_translation", "height_factor": 0.5, "width_factor": [-0.2, 0.4]},
    {"type": "flatten"}]}})";
  std::unique_ptr<Backend> backend = make_dnnl_backend();
  Model model(spec_of(json), *backend, 4);
  Floats x(60 * 4);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 61) * 0.5f;
  auto out = [&](bool training, StepKey key) {
    const float* y = model.forward(x.data(), 4, key, training);
    return Floats(y, y + x.size());
  };
  CHECK(out(false, StepKey{1, 2, 3}) == x);  // inference: the identity
  const Floats a = out(true, StepKey{1, 2, 3});
  CHECK(a != x);
  CHECK(out(true, StepKey{1, 2, 3}) == a);  // a pure function of the key
  CHECK(out(true, StepKey{1, 2, 4}) != a);
  CHECK(out(true, StepKey{1, 3, 3}) != a);
  CHECK(out(true, StepKey{1, 2, 3, 1}) != a);  // another shard of the global batch
  // Each example its own shift: example 0's and 1's images are the same here, their outputs
  // not.
  Floats twins = x;
  std::copy(twins.begin(), twins.begin() + 60, twins.begin() + 60);
  const float* y = model.forward(twins.data(), 4, StepKey{1, 2, 3}, true);
  CHECK(Floats(y, y + 60) != Floats(y + 60, y + 120));
  check_gradients(model_with("[6, 6, 1]", R"({"type": "conv2d", "filters": 2,
    "kernel_size": 2, "activation": "tanh"}, {"type": "random_translation",
    "height_factor": 0.3, "width_factor": 0.3, "fill_mode": "constant", "fill_value": 0.5})"));
  check_gradients(model_with("[6, 6, 1]", R"({"type": "conv2d", "filters": 2,
    "kernel_size": 2}, {"type": "random_translation", "height_factor": [0.1, 0.5],
    "width_factor": 0.3, "fill_mode": "wrap", "interpolation": "nearest"})"));
  check_model_parity(model_with("[6, 6, 2]", R"({"type": "conv2d", "filters": 2,
    "kernel_size": 2}, {"type": "random_translation", "height_factor": 0.4, "width_factor": 0.4})"));
}

TEST_CASE("random translation's keys are Keras's; mistakes are ConfigErrors naming the key",
          "[nn][layers]") {
  auto with = [](const std::string& keys) {
    return error_of(model_with("[4, 4, 1]", R"({"type": "random_translation", )" + keys + "}"));
  };
  CHECK(with(R"("height_factor": -0.2, "width_factor": [0.1, -0.3])") == "accepted");
  CHECK_THAT(with(R"("height_factor": 0.2)"),
             StartsWith("model.layers[0]: missing required key \"width_factor\""));
  CHECK_THAT(with(R"("height_factor": 1.5, "width_factor": 0.1)"),
             StartsWith("model.layers[0].height_factor: expected a number from -1 to 1"));
  CHECK_THAT(with(R"("height_factor": 0.1, "width_factor": [0.1, 2])"),
             StartsWith("model.layers[0].width_factor[1]: expected a number from -1 to 1"));
  CHECK_THAT(with(R"("height_factor": 0.1, "width_factor": [0.1])"),
             StartsWith("model.layers[0].width_factor: expected a number or [lower, upper]"));
  CHECK_THAT(with(R"("height_factor": 0.1, "width_factor": 0.1, "fill_mode": "mirror")"),
             StartsWith("model.layers[0].fill_mode: expected \"reflect\", \"wrap\", "
                        "\"constant\" or \"nearest\", found \"mirror\""));
  CHECK_THAT(with(R"("height_factor": 0.1, "width_factor": 0.1, "interpolation": "bicubic")"),
             StartsWith("model.layers[0].interpolation: expected \"bilinear\" or \"nearest\""));
  CHECK_THAT(with(R"("height_factor": 0.1, "width_factor": 0.1, "seed": 3)"),
             StartsWith("model.layers[0]: unknown key \"seed\""));
}
