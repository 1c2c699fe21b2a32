// The model as a graph (worker/nn/model.h, worker/spec/model_spec.h): a chain written as a graph
// computes the chain's bits; a residual graph's gradients, where an activation feeds two layers and
// the two shares add up, match finite differences of its loss on the reference backend; layers
// listed out of order are ordered; every mistake in a graph (a name that resolves to nothing, a
// cycle, an unused layer, shapes that do not add, the wrong number of inputs) is a ConfigError
// naming the JSON path of the layer; backward computes no gradient that no parameter needs; an
// add's inputs share a gradient buffer only where that is safe.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "worker/nn/model.h"
#include "worker/nn/profiled_backend.h"

using namespace dtrain;
using namespace dtrain::nn;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

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

std::vector<float> images(const Dims& d) {
  std::vector<float> x(d.size() * kBatch);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 17) / 8.0f - 1.0f;
  return x;
}

// The mean cross-entropy of the model on the fixed batch, and (when grads) its gradients.
double loss_of(Model& model, Backend& backend, std::vector<float>* grads = nullptr) {
  std::vector<float> x = images(model.input_dims());
  std::vector<int32_t> labels = {1, 0, 2};
  const float* logits = model.forward(x.data(), kBatch, StepKey{5, 0, 0}, true);
  std::vector<float> totals(3, 0.0f);
  backend.softmax_cross_entropy(kBatch, model.classes(), logits, labels.data(),
                                grads ? model.logits_gradient() : nullptr, totals.data());
  if (grads) {
    model.backward(kBatch);
    *grads = model.gradients().to_host();
  }
  return totals[0] / kBatch;
}

// A stem convolution feeding a residual block (two convolutions added to the stem's output: the
// stem's activation feeds both the block and the addition), then flatten and dense.
const char* kResidual = R"({"model": {"input_shape": [6, 6, 2], "layers": [
  {"name": "stem", "type": "conv2d", "filters": 3, "kernel_size": 3, "padding": "same",
   "activation": "relu"},
  {"name": "a", "type": "conv2d", "filters": 3, "kernel_size": 3, "padding": "same",
   "activation": "relu"},
  {"name": "b", "type": "conv2d", "filters": 3, "kernel_size": 1},
  {"name": "sum", "type": "add", "inputs": ["stem", "b"]},
  {"name": "out", "type": "relu"},
  {"type": "flatten"},
  {"name": "logits", "type": "dense", "units": 3}]}})";

}  // namespace

TEST_CASE("a chain written as a graph computes the chain's bits", "[nn][graph]") {
  const char* chain = R"({"model": {"input_shape": [6, 6, 1], "layers": [
    {"type": "conv2d", "filters": 2, "kernel_size": 3, "activation": "relu"},
    {"type": "flatten"}, {"type": "dropout", "rate": 0.25}, {"type": "dense", "units": 3}]}})";
  // The same layers, each naming the one before, listed backwards, with the output named.
  const char* graph = R"({"model": {"input_shape": [6, 6, 1], "output": "layers.0.dense",
    "layers": [
    {"type": "dense", "units": 3, "inputs": ["d"]},
    {"name": "d", "type": "dropout", "rate": 0.25, "inputs": ["f"]},
    {"name": "f", "type": "flatten", "inputs": ["c"]},
    {"name": "c", "type": "conv2d", "filters": 2, "kernel_size": 3, "activation": "relu",
     "inputs": ["input"]}]}})";
  ModelSpec a = spec_of(chain), b = spec_of(graph);
  REQUIRE(b.nodes.size() == 4);
  CHECK(b.nodes[0].name == "c");  // ordered: each layer after its inputs
  CHECK(b.nodes[3].name == "layers.0.dense");
  CHECK(b.nodes[3].inputs == std::vector<size_t>{2});
  CHECK(a.nodes[0].param_prefix == "layers.0.conv2d.");  // a chain's names, as checkpoints have

  std::unique_ptr<Backend> backend = make_reference_backend();
  Model ma(a, *backend, kBatch), mb(b, *backend, kBatch);
  ma.initialize(9);
  mb.initialize(9);
  CHECK(ma.parameters().to_host() == mb.parameters().to_host());
  std::vector<float> ga, gb;
  CHECK(loss_of(ma, *backend, &ga) == loss_of(mb, *backend, &gb));
  CHECK(ga == gb);
  CHECK(mb.parameter_infos()[0].name == "c.kernel");
  CHECK(mb.parameter_infos()[2].name == "layers.0.dense.kernel");
}

TEST_CASE("a residual graph's gradients match finite differences of its loss", "[nn][graph]") {
  std::unique_ptr<Backend> backend = make_reference_backend();
  Model model(spec_of(kResidual), *backend, kBatch);
  model.initialize(3);
  std::vector<std::string> names;
  for (const ParamInfo& p : model.parameter_infos()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"stem.kernel", "stem.bias", "a.kernel", "a.bias",
                                          "b.kernel", "b.bias", "logits.kernel", "logits.bias"});
  std::vector<float> grads;
  loss_of(model, *backend, &grads);
  std::vector<float> params = model.parameters().to_host();
  // Every stem parameter (its output feeds the block and the sum) and a sample of the others.
  std::vector<size_t> checked;
  for (size_t i = 0; i < 2 * 9 * 3 + 3; ++i) checked.push_back(i);
  for (size_t i = 57; i < params.size(); i += 7) checked.push_back(i);
  const float h = 1e-3f;
  const double center = loss_of(model, *backend);
  double worst = 0;
  size_t kinks = 0;
  for (size_t i : checked) {
    std::vector<float> moved = params;
    moved[i] = params[i] + h;
    model.parameters().from_host(moved);
    double up = loss_of(model, *backend);
    moved[i] = params[i] - h;
    model.parameters().from_host(moved);
    double down = loss_of(model, *backend);
    // A step that crosses a ReLU's kink has two different one-sided slopes: no derivative to
    // compare there.
    double forward = (up - center) / h, backward = (center - down) / h;
    if (std::abs(forward - backward) >
        0.1 * std::max({std::abs(forward), std::abs(backward), 1e-2})) {
      ++kinks;
      continue;
    }
    double numeric = (up - down) / (2 * h);
    double error = std::abs(numeric - grads[i]) / std::max(1e-2, std::abs(numeric));
    INFO("parameter " << i << ": backward " << grads[i] << ", finite difference " << numeric);
    CHECK(error < 0.05);
    worst = std::max(worst, error);
  }
  CHECK(kinks * 10 < checked.size());
  model.parameters().from_host(params);
  INFO("worst relative error " << worst);
  CHECK(worst > 0);  // the check compared something
}

TEST_CASE("an activation added to itself gets both shares of its gradient", "[nn][graph]") {
  // sum = relu(x) + relu(x): the same input twice, the second share added to the first.
  const char* twice = R"({"model": {"input_shape": [2, 2, 1], "layers": [
    {"type": "flatten"}, {"name": "h", "type": "dense", "units": 4, "activation": "relu"},
    {"name": "sum", "type": "add", "inputs": ["h", "h"]},
    {"name": "logits", "type": "dense", "units": 3}]}})";
  const char* doubled = R"({"model": {"input_shape": [2, 2, 1], "layers": [
    {"type": "flatten"}, {"name": "h", "type": "dense", "units": 4, "activation": "relu"},
    {"name": "logits", "type": "dense", "units": 3}]}})";
  std::unique_ptr<Backend> backend = make_reference_backend();
  Model m2(spec_of(twice), *backend, kBatch), m1(spec_of(doubled), *backend, kBatch);
  m2.initialize(4);
  m1.initialize(4);
  // logits' kernel halved in the doubled model: the same logits as the sum's.
  std::vector<float> p2 = m2.parameters().to_host(), p1 = p2;
  const size_t h_params = 4 * 4 + 4;
  for (size_t i = h_params; i < h_params + 4 * 3; ++i) p1[i] = p2[i] * 2.0f;
  m1.parameters().from_host(p1);
  std::vector<float> g2, g1;
  CHECK(loss_of(m2, *backend, &g2) == Approx(loss_of(m1, *backend, &g1)).epsilon(1e-6));
  for (size_t i = 0; i < h_params; ++i) CHECK(g2[i] == Approx(g1[i]).margin(1e-6));
}

TEST_CASE("mistakes in a graph are ConfigErrors naming the layer", "[nn][graph]") {
  auto with_layers = [](const std::string& layers, const std::string& more = "") {
    return error_of(R"({"model": {"input_shape": [4, 4, 1], )" + more + R"("layers": [)" + layers +
                    "]}}");
  };
  const std::string dense = R"({"name": "logits", "type": "dense", "units": 2})";
  CHECK_THAT(with_layers(R"({"type": "flatten", "inputs": ["nope"]}, )" + dense),
             StartsWith("model.layers[0].inputs[0]: no layer is named \"nope\""));
  CHECK_THAT(with_layers(R"({"name": "f", "type": "flatten", "inputs": ["g"]},
                            {"name": "g", "type": "relu", "inputs": ["f"]},
                            {"type": "flatten", "inputs": ["g"]}, )" +
                         dense),
             Contains("form a cycle"));
  CHECK_THAT(with_layers(std::string(R"({"name": "f", "type": "flatten"},
                            {"name": "spare", "type": "relu", "inputs": ["input"]}, )") +
                         R"({"name": "logits", "type": "dense", "units": 2, "inputs": ["f"]})"),
             StartsWith("model.layers[1] (\"spare\"): the output does not use this layer"));
  CHECK_THAT(with_layers(R"({"name": "c", "type": "conv2d", "filters": 2, "kernel_size": 3},
                            {"name": "s", "type": "add", "inputs": ["c", "input"]},
                            {"type": "flatten"}, )" +
                         dense),
             StartsWith("model.layers[1]: add needs inputs of one shape; input 0 is 2x2x2, "
                        "input 1 is 4x4x1"));
  CHECK_THAT(with_layers(R"({"name": "s", "type": "add", "inputs": ["input"]},
                            {"type": "flatten"}, )" +
                         dense),
             StartsWith("model.layers[0].inputs: add takes two inputs or more, found 1"));
  CHECK_THAT(with_layers(R"({"type": "flatten", "inputs": ["input", "input"]}, )" + dense),
             StartsWith("model.layers[0].inputs: flatten takes 1 input, found 2"));
  CHECK_THAT(with_layers(R"({"name": "x", "type": "flatten"}, {"name": "x", "type": "dense",
                            "units": 2})"),
             StartsWith("model.layers[1].name: the name \"x\" is taken by model.layers[0]"));
  CHECK_THAT(with_layers(R"({"name": "input", "type": "flatten"}, )" + dense),
             StartsWith("model.layers[0].name: \"input\" names the model's input"));
  CHECK_THAT(with_layers(R"({"type": "flatten"}, )" + dense, R"("output": "logit", )"),
             StartsWith("model.output: no layer is named \"logit\""));
  CHECK_THAT(with_layers(R"({"type": "conv2d", "filters": 2, "kernel_size": 3})"),
             StartsWith("model.layers[0]: the model must end in a flat output"));
  CHECK_THAT(with_layers(R"({"type": "flaten"}, )" + dense),
             StartsWith("model.layers[0].type: unknown layer type \"flaten\" (did you mean "
                        "\"flatten\"? expected conv2d, "));
}

TEST_CASE("layers without a bias, and global average pooling, train by their gradients",
          "[nn][graph]") {
  const char* json = R"({"model": {"input_shape": [4, 4, 2], "layers": [
    {"name": "conv", "type": "conv2d", "filters": 3, "kernel_size": 3, "strides": 2,
     "padding": "same", "use_bias": false, "activation": "relu"},
    {"name": "gap", "type": "global_average_pooling2d"},
    {"name": "logits", "type": "dense", "units": 3, "use_bias": false}]}})";
  std::unique_ptr<Backend> backend = make_reference_backend();
  ModelSpec spec = spec_of(json);
  CHECK(spec.nodes[0].out == Dims{3, 2, 2});  // stride 2, "same": 4x4 to 2x2
  CHECK(spec.nodes[1].out == Dims{3, 1, 1});
  Model model(spec, *backend, kBatch);
  model.initialize(6);
  std::vector<std::string> names;
  for (const ParamInfo& p : model.parameter_infos()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"conv.kernel", "logits.kernel"});
  CHECK(model.parameters().size() == 3 * 2 * 9 + 3 * 3);
  // Pooling is each channel's mean.
  std::vector<float> x = images(model.input_dims());
  model.forward(x.data(), kBatch, StepKey{}, false);
  std::vector<float> grads;
  loss_of(model, *backend, &grads);
  std::vector<float> params = model.parameters().to_host();
  const float h = 1e-3f;
  const double center = loss_of(model, *backend);
  size_t compared = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<float> moved = params;
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
    CHECK(std::abs(numeric - grads[i]) / std::max(1e-2, std::abs(numeric)) < 0.05);
    ++compared;
  }
  CHECK(compared * 10 > params.size() * 9);
}

TEST_CASE("global average pooling gives each channel's mean", "[nn][graph]") {
  const char* json = R"({"model": {"input_shape": [2, 2, 2], "layers": [
    {"type": "global_average_pooling2d"}]}})";
  std::unique_ptr<Backend> backend = make_dnnl_backend();
  Model model(spec_of(json), *backend, 1);
  std::vector<float> x = {1, 2, 3, 6, -1, -1, -1, 7};  // NCHW: channel 0 then channel 1
  const float* y = model.forward(x.data(), 1, StepKey{}, false);
  CHECK(y[0] == 3.0f);
  CHECK(y[1] == 1.0f);
}

TEST_CASE("an activation layer computes what a relu layer or none does", "[nn][graph]") {
  auto logits_and_grads = [](const std::string& middle) {
    std::unique_ptr<Backend> backend = make_reference_backend();
    Model model(spec_of(R"({"model": {"input_shape": [3, 3, 1], "layers": [
      {"type": "flatten"}, {"type": "dense", "units": 4}, )" +
                        middle + R"(, {"type": "dense", "units": 3}]}})"),
                *backend, kBatch);
    model.initialize(5);
    std::vector<float> grads;
    double loss = loss_of(model, *backend, &grads);
    return std::make_pair(loss, grads);
  };
  CHECK(logits_and_grads(R"({"type": "activation", "activation": "relu"})") ==
        logits_and_grads(R"({"type": "relu"})"));
  CHECK(logits_and_grads(R"({"type": "activation", "activation": "linear"})") ==
        logits_and_grads(R"({"type": "dropout", "rate": 0})"));
  CHECK_THAT(error_of(R"({"model": {"input_shape": [2, 2, 1], "layers": [{"type": "flatten"},
    {"type": "activation", "activation": "softmax"}, {"type": "dense", "units": 2}]}})"),
             StartsWith("model.layers[1].activation: softmax is only supported as the output's"));
}

TEST_CASE("kernel initializers follow Keras's variance scaling", "[nn][graph]") {
  // A 3x3 convolution of 16 channels to 32 filters: fan_in 144, fan_out 288.
  auto kernel = [](const std::string& init) {
    std::unique_ptr<Backend> backend = make_reference_backend();
    Model model(spec_of(R"({"model": {"input_shape": [8, 8, 16], "layers": [
      {"type": "conv2d", "filters": 32, "kernel_size": 3, "use_bias": false,
       "kernel_initializer": )" +
                        init + R"(}, {"type": "flatten"},
      {"type": "dense", "units": 2}]}})"),
                *backend, 1);
    model.initialize(11);
    std::vector<float> p = model.parameters().to_host();
    return std::vector<float>(p.begin(), p.begin() + 32 * 16 * 9);
  };
  auto stddev = [](const std::vector<float>& w) {
    double sum = 0, squares = 0;
    for (float x : w) sum += x, squares += double(x) * x;
    double mean = sum / w.size();
    return std::sqrt(squares / w.size() - mean * mean);
  };
  const double fan_in = 144, fan_out = 288;
  struct Case {
    std::string init;
    double want_stddev;  // of the values drawn
    double bound;        // no value beyond
  };
  const double cut = 2 / 0.87962566103423978;  // a truncated normal's bound, in its stddevs
  for (const Case& c :
       std::vector<Case>{{R"("he_normal")", std::sqrt(2 / fan_in), cut * std::sqrt(2 / fan_in)},
                         {R"({"class_name": "HeNormal", "config": {"seed": 3}})",
                          std::sqrt(2 / fan_in), cut * std::sqrt(2 / fan_in)},
                         {R"("he_uniform")", std::sqrt(2 / fan_in), std::sqrt(6 / fan_in)},
                         {R"("glorot_normal")", std::sqrt(2 / (fan_in + fan_out)),
                          cut * std::sqrt(2 / (fan_in + fan_out))},
                         {R"("lecun_normal")", std::sqrt(1 / fan_in), cut * std::sqrt(1 / fan_in)},
                         {R"("lecun_uniform")", std::sqrt(1 / fan_in), std::sqrt(3 / fan_in)},
                         {R"("glorot_uniform")", std::sqrt(2 / (fan_in + fan_out)),
                          std::sqrt(6 / (fan_in + fan_out))}}) {
    INFO(c.init);
    std::vector<float> w = kernel(c.init);
    CHECK(stddev(w) == Approx(c.want_stddev).epsilon(0.05));
    for (float x : w) REQUIRE(std::abs(x) <= c.bound * (1 + 1e-6));
  }
  CHECK(kernel(R"("he_normal")") != kernel(R"("he_uniform")"));
  CHECK_THAT(error_of(R"({"model": {"input_shape": [2, 2, 1], "layers": [{"type": "flatten"},
    {"type": "dense", "units": 2, "kernel_initializer": "orthogonal"}]}})"),
             StartsWith("model.layers[1].kernel_initializer: initializer orthogonal is not "
                        "supported (dtrain has glorot_uniform, "));
}

TEST_CASE("concatenate joins channels, and its gradients match finite differences", "[nn][graph]") {
  // Two branches of 2 and 3 filters joined into 5 channels, then a dense layer.
  const char* json = R"({"model": {"input_shape": [3, 3, 1], "layers": [
    {"name": "a", "type": "conv2d", "filters": 2, "kernel_size": 3, "padding": "same"},
    {"name": "b", "type": "conv2d", "filters": 3, "kernel_size": 1, "inputs": ["input"]},
    {"name": "joined", "type": "concatenate", "inputs": ["a", "b"]},
    {"type": "flatten"}, {"name": "logits", "type": "dense", "units": 3}]}})";
  std::unique_ptr<Backend> backend = make_reference_backend();
  ModelSpec spec = spec_of(json);
  CHECK(spec.nodes[2].out == Dims{5, 3, 3});
  Model model(spec, *backend, kBatch);
  model.initialize(4);
  std::vector<float> grads;
  loss_of(model, *backend, &grads);
  std::vector<float> params = model.parameters().to_host();
  const float h = 1e-3f;
  for (size_t i = 0; i < 2 * 9 + 2 + 3 + 3; ++i) {  // both branches' parameters
    std::vector<float> moved = params;
    moved[i] = params[i] + h;
    model.parameters().from_host(moved);
    double up = loss_of(model, *backend);
    moved[i] = params[i] - h;
    model.parameters().from_host(moved);
    double numeric = (up - loss_of(model, *backend)) / (2 * h);
    INFO("parameter " << i << ": backward " << grads[i] << ", finite difference " << numeric);
    CHECK(std::abs(numeric - grads[i]) / std::max(1e-2, std::abs(numeric)) < 0.02);
  }
  CHECK_THAT(error_of(R"({"model": {"input_shape": [4, 4, 1], "layers": [
    {"name": "a", "type": "max_pooling2d"}, {"name": "j", "type": "concatenate",
     "inputs": ["a", "input"]}, {"type": "flatten"}, {"type": "dense", "units": 2}]}})"),
             StartsWith("model.layers[1]: concatenate needs inputs of one height and width"));
}

// Backward computes the gradient of what has parameters at or before it only: the augmentation
// layers in front of the first convolution run no backward, and that convolution computes no dx;
// the parameters' gradients are what they were.
TEST_CASE("backward skips the gradients that no parameter needs", "[graph]") {
  const std::string json = R"({"model": {"input_shape": [6, 6, 1], "layers": [
    {"type": "random_flip", "mode": "horizontal"}, {"type": "rescaling", "scale": 0.5},
    {"type": "conv2d", "filters": 4, "kernel_size": 3},
    {"type": "relu"}, {"type": "flatten"}, {"type": "dense", "units": 3}]}})";
  std::unique_ptr<Backend> ref = make_reference_backend();
  ProfiledBackend profiled(*ref);
  Model model(spec_of(json), profiled, kBatch);
  model.initialize(4);
  std::vector<float> x(kBatch * 36);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * float(i));
  model.forward(x.data(), kBatch, StepKey{3, 0, 1}, true);
  profiled.reset();
  std::vector<float> dlogits = {0.1f, -0.2f, 0.3f, 0.0f, 0.5f, -0.4f, 0.2f, 0.2f, -0.1f};
  std::copy(dlogits.begin(), dlogits.end(), model.logits_gradient());
  model.backward(kBatch);
  std::vector<std::string> labels;
  for (const OpTime& row : profiled.table()) labels.push_back(row.label);
  auto has = [&](const std::string& prefix) {
    return std::any_of(labels.begin(), labels.end(),
                       [&](const std::string& l) { return l.rfind(prefix, 0) == 0; });
  };
  CHECK(has("conv2d_backward_weights"));
  CHECK(has("dense_backward_data"));
  CHECK_FALSE(has("conv2d_backward_data"));
  CHECK_FALSE(has("remap2d_backward"));
  CHECK_FALSE(has("scale_shift"));
  std::vector<float> grads = model.gradients().to_host();
  CHECK(std::any_of(grads.begin(), grads.end(), [](float g) { return g != 0.0f; }));
}

// An add's inputs share one gradient buffer where that is safe (Model::share_gradients): the
// branch's last convolution, whose only user is the add, takes the stem's buffer (the stem's
// other user comes before it); a branch that reads the stem itself does not, as its backward
// adds into the stem's gradient while its own is still to be read. The gradients are checked
// by the finite differences above (kResidual shares).
TEST_CASE("an add's inputs share their gradient buffer only where nothing writes it between",
          "[nn][graph]") {
  std::unique_ptr<Backend> backend = make_reference_backend();
  Model shared(spec_of(kResidual), *backend, kBatch);
  const auto node = [&](const Model& m, const std::string& name) {
    const ModelSpec& spec = m.spec();
    for (size_t i = 0; i < spec.nodes.size(); ++i)
      if (spec.nodes[i].name == name) return i;
    FAIL("no node " << name);
    return size_t{0};
  };
  CHECK(shared.shares_gradient(node(shared, "stem"), node(shared, "b")));
  CHECK_FALSE(shared.shares_gradient(node(shared, "stem"), node(shared, "a")));
  // sum = stem + a, where a reads the stem: a's backward writes the stem's gradient.
  const char* reads = R"({"model": {"input_shape": [6, 6, 2], "layers": [
    {"name": "stem", "type": "conv2d", "filters": 3, "kernel_size": 3, "padding": "same"},
    {"name": "a", "type": "conv2d", "filters": 3, "kernel_size": 3, "padding": "same"},
    {"name": "sum", "type": "add", "inputs": ["stem", "a"]},
    {"type": "flatten"}, {"name": "logits", "type": "dense", "units": 3}]}})";
  Model apart(spec_of(reads), *backend, kBatch);
  CHECK_FALSE(apart.shares_gradient(node(apart, "stem"), node(apart, "a")));
}

// Two residual blocks: the first block's output feeds the second block's convolution and its
// add. The convolution's share of that output's gradient (the last one backward computes) is
// left in scratch for the first add to take as it applies its ReLU's mask
// (Model::defer_last_shares), and the gradients still match finite differences of the loss.
TEST_CASE("a gradient's last share, left for its producer's ReLU, gives the right gradients",
          "[nn][graph]") {
  const char* blocks = R"({"model": {"input_shape": [5, 5, 2], "layers": [
    {"name": "stem", "type": "conv2d", "filters": 3, "kernel_size": 3, "padding": "same"},
    {"name": "a", "type": "conv2d", "filters": 3, "kernel_size": 3, "padding": "same"},
    {"name": "sum_a", "type": "add", "inputs": ["stem", "a"]},
    {"name": "relu_a", "type": "relu"},
    {"name": "b", "type": "conv2d", "filters": 3, "kernel_size": 3, "padding": "same"},
    {"name": "sum_b", "type": "add", "inputs": ["b", "relu_a"]},
    {"name": "relu_b", "type": "relu"},
    {"type": "flatten"}, {"name": "logits", "type": "dense", "units": 3}]}})";
  std::unique_ptr<Backend> ref = make_reference_backend();
  ProfiledBackend profiled(*ref);
  Model model(spec_of(blocks), profiled, kBatch);
  model.initialize(8);
  std::vector<float> grads;
  profiled.reset();
  loss_of(model, profiled, &grads);
  bool added = false;
  for (const OpTime& row : profiled.table())
    added |= row.label.rfind("relu_backward_added", 0) == 0;
  CHECK(added);
  std::vector<float> params = model.parameters().to_host();
  const float h = 1e-3f;
  size_t compared = 0;
  for (size_t i = 0; i < params.size(); i += 3) {
    std::vector<float> moved = params;
    moved[i] = params[i] + h;
    model.parameters().from_host(moved);
    const double up = loss_of(model, profiled);
    moved[i] = params[i] - h;
    model.parameters().from_host(moved);
    const double down = loss_of(model, profiled);
    model.parameters().from_host(params);
    const double center = loss_of(model, profiled);
    const double forward = (up - center) / h, backward = (center - down) / h;
    if (std::abs(forward - backward) >
        0.1 * std::max({std::abs(forward), std::abs(backward), 1e-2}))
      continue;  // a ReLU's kink: no derivative to compare
    const double numeric = (up - down) / (2 * h);
    INFO("parameter " << i << ": backward " << grads[i] << ", finite difference " << numeric);
    CHECK(std::abs(numeric - grads[i]) / std::max(1e-2, std::abs(numeric)) < 0.05);
    ++compared;
  }
  CHECK(compared * 10 > params.size() / 3 * 8);
}
