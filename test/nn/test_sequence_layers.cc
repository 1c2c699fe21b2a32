// The sequence layers (docs/design.md#sequences): embedding (worker/nn/layers/embedding.cc),
// layer_normalization (layer_normalization.cc) and dense on each position of a sequence. Their
// backend operations compute the hand-made values on both host backends; the oneDNN backend's
// match the reference's and give the same bits at one and two threads and at every vector width;
// a model from token ids to a sequence of logits has gradients that match finite differences;
// the layers that read images refuse a sequence and the elementwise ones keep it; bad keys are
// ConfigErrors naming the key; and Keras's Functional model of the same layers reads.
#include <omp.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "worker/nn/host_sequence.h"
#include "worker/nn/model.h"
#include "worker/spec/keras_model.h"

using namespace dtrain;
using namespace dtrain::nn;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

using Floats = std::vector<float>;

Floats random_floats(size_t count, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Floats out(count);
  for (float& v : out) v = d(engine);
  return out;
}

Floats random_ids(size_t count, int input_dim, uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_int_distribution<int> d(0, input_dim - 1);
  Floats out(count);
  for (float& v : out) v = static_cast<float>(d(engine));
  return out;
}

double worst_relative(const Floats& a, const Floats& b, double floor = 1e-3) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst =
        std::max(worst, std::abs(double(a[i]) - b[i]) / std::max(floor, std::abs(double(b[i]))));
  return worst;
}

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

/// A model of token ids of length 5: these layers after the input.
std::string sequence_model(const std::string& layers) {
  return R"({"model": {"input_shape": [5], "layers": [)" + layers + "]}}";
}

const char* kLanguageModel = R"({"model": {"input_shape": [5], "layers": [
  {"name": "embedding", "type": "embedding", "input_dim": 7, "output_dim": 4},
  {"name": "norm", "type": "layer_normalization"},
  {"name": "logits", "type": "dense", "units": 7}]}})";

struct LayerNormRun {
  Floats y, mean, rstd, dx, dgamma, dbeta;
};

LayerNormRun run_layernorm(Backend& b, int rows, int features, bool affine) {
  const size_t count = size_t(rows) * features;
  Floats x = random_floats(count, 1, -2, 3), dy = random_floats(count, 2);
  Floats gamma = random_floats(size_t(features), 3, 0.5, 1.5);
  Floats beta = random_floats(size_t(features), 4);
  const float* g = affine ? gamma.data() : nullptr;
  LayerNormRun r{Floats(count), Floats(size_t(rows)),     Floats(size_t(rows)),
                 Floats(count), Floats(size_t(features)), Floats(size_t(features))};
  b.layernorm_forward(rows, features, 1e-3f, x.data(), g, affine ? beta.data() : nullptr,
                      r.y.data(), r.mean.data(), r.rstd.data());
  b.layernorm_backward(rows, features, x.data(), dy.data(), g, r.mean.data(), r.rstd.data(),
                       r.dx.data(), r.dgamma.data(), r.dbeta.data());
  return r;
}

struct EmbeddingRun {
  Floats y, dtable;
};

EmbeddingRun run_embedding(Backend& b, int rows, int input_dim, int output_dim) {
  Floats ids = random_ids(size_t(rows), input_dim, 5);
  Floats table = random_floats(size_t(input_dim) * output_dim, 6);
  Floats dy = random_floats(size_t(rows) * output_dim, 7);
  EmbeddingRun r{Floats(size_t(rows) * output_dim), Floats(table.size(), 42.0f)};
  b.embedding_forward(rows, input_dim, output_dim, ids.data(), table.data(), r.y.data());
  b.embedding_backward(rows, input_dim, output_dim, ids.data(), dy.data(), r.dtable.data());
  return r;
}

}  // namespace

TEST_CASE("embedding gathers rows and adds their gradients in token order, by hand", "[sequence]") {
  for (auto make : {make_reference_backend, make_dnnl_backend}) {
    std::unique_ptr<Backend> b = make(MathMode::kFloat32);
    INFO(b->name());
    const Floats table = {0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32};  // 4 ids x 3
    const Floats ids = {2, 0, 2};
    Floats y(9);
    b->embedding_forward(3, 4, 3, ids.data(), table.data(), y.data());
    CHECK(y == Floats{20, 21, 22, 0, 1, 2, 20, 21, 22});
    const Floats dy = {1, 2, 3, 0.5, 0.25, 0.125, 4, 5, 6};
    Floats dtable(12, 99.0f);  // overwritten, not added to
    b->embedding_backward(3, 4, 3, ids.data(), dy.data(), dtable.data());
    CHECK(dtable == Floats{0.5, 0.25, 0.125, 0, 0, 0, 5, 7, 9, 0, 0, 0});
  }
}

TEST_CASE("an id outside the table is an error naming it, never a read outside", "[sequence]") {
  for (auto make : {make_reference_backend, make_dnnl_backend}) {
    std::unique_ptr<Backend> b = make(MathMode::kFloat32);
    INFO(b->name());
    const Floats table(12, 1.0f);
    Floats y(6), dtable(12);
    for (float bad : {4.0f, -1.0f, 1.5f, std::numeric_limits<float>::quiet_NaN(), 1e9f}) {
      INFO("id " << bad);
      const Floats ids = {1, bad};
      CHECK_THROWS_WITH(b->embedding_forward(2, 4, 3, ids.data(), table.data(), y.data()),
                        Contains("token 1 has id") && Contains("[0, 4) (input_dim)"));
      CHECK_THROWS_AS(b->embedding_backward(2, 4, 3, ids.data(), y.data(), dtable.data()),
                      common::EnforceError);
    }
  }
}

TEST_CASE("layer normalization normalizes each row over its features, by hand", "[sequence]") {
  for (auto make : {make_reference_backend, make_dnnl_backend}) {
    std::unique_ptr<Backend> b = make(MathMode::kFloat32);
    INFO(b->name());
    // Row 0: mean 2, variance 2/3; row 1: mean 2, variance 8.
    const Floats x = {1, 2, 3, 0, 0, 6}, gamma = {1, 2, 0.5}, beta = {0, 1, -1};
    Floats y(6), mean(2), rstd(2);
    b->layernorm_forward(2, 3, 1e-3f, x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                         rstd.data());
    const double r0 = 1 / std::sqrt(2.0 / 3 + 1e-3), r1 = 1 / std::sqrt(8 + 1e-3);
    CHECK(mean == Floats{2, 2});
    CHECK(rstd[0] == Approx(r0).epsilon(1e-6));
    CHECK(rstd[1] == Approx(r1).epsilon(1e-6));
    const double want[] = {-r0, 1, r0 * 0.5 - 1, -2 * r1, -2 * r1 * 2 + 1, 4 * r1 * 0.5 - 1};
    for (int k = 0; k < 6; ++k) CHECK(y[k] == Approx(want[k]).margin(2e-6));
    // Without gamma and beta each row has mean 0 and (biased) variance var / (var + epsilon).
    b->layernorm_forward(2, 3, 1e-3f, x.data(), nullptr, nullptr, y.data(), mean.data(),
                         rstd.data());
    CHECK(y[0] + y[1] + y[2] == Approx(0).margin(1e-6));
    CHECK((y[0] * y[0] + y[1] * y[1] + y[2] * y[2]) / 3 == Approx((2.0 / 3) / (2.0 / 3 + 1e-3)));
    // Backward, a gradient only on feature 0 of row 0 (gamma 1): dbeta is dy's column sums,
    // dgamma dy * xhat, and dx sums to 0 over the row (the mean's gradient cancels).
    const Floats dy = {1, 0, 0, 0, 0, 0};
    Floats dx(6), dgamma(3), dbeta(3);
    b->layernorm_backward(2, 3, x.data(), dy.data(), nullptr, mean.data(), rstd.data(), dx.data(),
                          dgamma.data(), dbeta.data());
    CHECK(dbeta == Floats{1, 0, 0});
    CHECK(dgamma[0] == Approx(-r0).epsilon(1e-6));
    CHECK(dx[0] + dx[1] + dx[2] == Approx(0).margin(1e-6));
    CHECK(dx[3] == 0.0f);
    // d y0 / d x0 = rstd * (1 - 1/3 - xhat0^2 / 3), xhat0 = -rstd.
    CHECK(dx[0] == Approx(r0 * (1 - 1.0 / 3 - r0 * r0 / 3)).epsilon(1e-5));
  }
}

TEST_CASE("oneDNN's sequence operations match the reference, at one thread and two",
          "[parity][sequence]") {
  std::unique_ptr<Backend> dnnl = make_dnnl_backend(), ref = make_reference_backend();
  const int threads = omp_get_max_threads();
  // Large enough that the embedding's loops go parallel (2^14 floats), with odd sizes.
  for (auto [rows, input_dim, output_dim] : {std::array{3, 4, 3}, std::array{600, 1000, 33}}) {
    INFO("embedding of " << rows << " tokens, " << input_dim << "x" << output_dim);
    EmbeddingRun want = run_embedding(*ref, rows, input_dim, output_dim);
    omp_set_num_threads(2);
    EmbeddingRun two = run_embedding(*dnnl, rows, input_dim, output_dim);
    omp_set_num_threads(1);
    EmbeddingRun one = run_embedding(*dnnl, rows, input_dim, output_dim);
    omp_set_num_threads(threads);
    CHECK(two.y == want.y);  // a copy, and float adds in token order: exact
    CHECK(two.dtable == want.dtable);
    CHECK(one.y == two.y);
    CHECK(one.dtable == two.dtable);
  }
  for (auto [rows, features] : {std::array{7, 5}, std::array{64, 37}, std::array{300, 130}}) {
    for (bool affine : {true, false}) {
      INFO("layer normalization " << rows << "x" << features << (affine ? "" : " plain"));
      LayerNormRun want = run_layernorm(*ref, rows, features, affine);
      omp_set_num_threads(2);
      LayerNormRun two = run_layernorm(*dnnl, rows, features, affine);
      omp_set_num_threads(1);
      LayerNormRun one = run_layernorm(*dnnl, rows, features, affine);
      omp_set_num_threads(threads);
      CHECK(worst_relative(two.mean, want.mean) < 1e-6);
      CHECK(worst_relative(two.rstd, want.rstd) < 1e-6);
      // y in float (Keras's folding) against the reference's double.
      CHECK(worst_relative(two.y, want.y, 1.0) < 4e-6);
      CHECK(worst_relative(two.dx, want.dx) < 1e-4);
      CHECK(worst_relative(two.dgamma, want.dgamma) < 1e-5);
      CHECK(worst_relative(two.dbeta, want.dbeta) < 1e-5);
      CHECK(one.y == two.y);
      CHECK(one.mean == two.mean);
      CHECK(one.rstd == two.rstd);
      CHECK(one.dx == two.dx);
      CHECK(one.dgamma == two.dgamma);
      CHECK(one.dbeta == two.dbeta);
    }
  }
}

TEST_CASE("layer normalization's loops give the same bits at every vector width", "[sequence]") {
  using direct_conv::Vectors;
  int widths = 0;
  for (Vectors vectors : {Vectors::kAvx512, Vectors::kAvx2}) {
    if (!direct_conv::runs(vectors)) {
      WARN("this CPU does not run the " << direct_conv::vectors_name(vectors) << " loops");
      continue;
    }
    ++widths;
    for (auto [rows, features] : {std::array{5, 3}, std::array{9, 37}, std::array{4, 130}}) {
      INFO(direct_conv::vectors_name(vectors) << " " << rows << "x" << features);
      const size_t count = size_t(rows) * features;
      Floats x = random_floats(count, 1, -2, 3), dy = random_floats(count, 2);
      Floats gamma = random_floats(size_t(features), 3, 0.5, 1.5);
      Floats beta = random_floats(size_t(features), 4);
      auto run = [&](Vectors v) {
        LayerNormRun r{Floats(count), Floats(size_t(rows)),     Floats(size_t(rows)),
                       Floats(count), Floats(size_t(features)), Floats(size_t(features))};
        host_layernorm_forward(rows, features, 1e-3f, x.data(), gamma.data(), beta.data(),
                               r.y.data(), r.mean.data(), r.rstd.data(), v);
        host_layernorm_backward(rows, features, x.data(), dy.data(), gamma.data(), r.mean.data(),
                                r.rstd.data(), r.dx.data(), r.dgamma.data(), r.dbeta.data(), v);
        return r;
      };
      LayerNormRun plain = run(Vectors::kPlain), wide = run(vectors);
      CHECK(wide.y == plain.y);
      CHECK(wide.mean == plain.mean);
      CHECK(wide.rstd == plain.rstd);
      CHECK(wide.dx == plain.dx);
      CHECK(wide.dgamma == plain.dgamma);
      CHECK(wide.dbeta == plain.dbeta);
    }
  }
  if (widths == 0) WARN("only the plain loops run here: nothing to compare");
}

TEST_CASE("a model from token ids to a sequence of logits: gradients match finite differences",
          "[sequence]") {
  std::unique_ptr<Backend> backend = make_reference_backend();
  const int n = 4, positions = 5, classes = 7;
  Model model(spec_of(kLanguageModel), *backend, n);
  CHECK(model.positions() == positions);
  CHECK(model.classes() == classes);
  CHECK(model.spec().output_dims() == Dims{1, positions, classes, true});
  model.initialize(2);
  std::vector<std::string> names;
  for (const ParamInfo& p : model.parameter_infos()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"embedding.embeddings", "norm.gamma", "norm.beta",
                                          "logits.kernel", "logits.bias"});
  CHECK(model.parameter_infos()[0].shape == std::vector<int64_t>{7, 4});
  Floats initial = model.parameters().to_host();
  REQUIRE(initial.size() == 28 + 4 + 4 + 28 + 7);
  for (size_t i = 0; i < 28; ++i) CHECK((initial[i] >= -0.05f && initial[i] < 0.05f));
  CHECK(std::count(initial.begin(), initial.begin() + 28, initial[0]) == 1);  // drawn, not set
  CHECK(Floats(initial.begin() + 28, initial.begin() + 36) == Floats{1, 1, 1, 1, 0, 0, 0, 0});

  // Parameters of some size, so that every one moves the loss measurably.
  Floats params = random_floats(initial.size(), 9);
  for (size_t i = 28; i < 32; ++i) params[i] += 1.0f;  // gamma about 1
  model.parameters().from_host(params);
  Floats ids = random_ids(size_t(n) * positions, 6, 10);  // ids 0..5: row 6 gets no gradient
  std::vector<int32_t> labels(size_t(n) * positions);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t((i * 3) % classes);
  const int rows = n * positions;
  auto loss = [&](Floats* grads) {
    const float* logits = model.forward(ids.data(), n, StepKey{1, 0, 0}, true);
    Floats totals(3, 0.0f);
    backend->softmax_cross_entropy(rows, classes, logits, labels.data(),
                                   grads ? model.logits_gradient() : nullptr, totals.data());
    if (grads) {
      model.backward(n);
      *grads = model.gradients().to_host();
    }
    return double(totals[0]) / rows;
  };
  Floats grads;
  loss(&grads);
  for (size_t i = 24; i < 28; ++i) CHECK(grads[i] == 0.0f);  // id 6 never appears
  const float h = 1e-3f;
  for (size_t i = 0; i < params.size(); ++i) {
    Floats moved = params;
    moved[i] = params[i] + h;
    model.parameters().from_host(moved);
    const double up = loss(nullptr);
    moved[i] = params[i] - h;
    model.parameters().from_host(moved);
    const double down = loss(nullptr);
    const double numeric = (up - down) / (2 * h);
    INFO("parameter " << i << ": backward " << grads[i] << ", finite difference " << numeric);
    CHECK(std::abs(numeric - grads[i]) / std::max(1e-2, std::abs(numeric)) < 0.05);
  }

  // The oneDNN backend computes the same model to rounding, with the same bits at one thread
  // and two.
  std::unique_ptr<Backend> dnnl = make_dnnl_backend();
  Model fast(spec_of(kLanguageModel), *dnnl, n);
  auto gradients_at = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    fast.parameters().from_host(params);
    const float* logits = fast.forward(ids.data(), n, StepKey{1, 0, 0}, true);
    Floats totals(3, 0.0f);
    dnnl->softmax_cross_entropy(rows, classes, logits, labels.data(), fast.logits_gradient(),
                                totals.data());
    fast.backward(n);
    omp_set_num_threads(saved);
    return fast.gradients().to_host();
  };
  Floats one = gradients_at(1), two = gradients_at(2);
  CHECK(one == two);
  CHECK(worst_relative(two, grads, 1e-2) < 1e-4);
}

TEST_CASE("dense on a sequence applies to each position's features", "[sequence]") {
  std::unique_ptr<Backend> backend = make_reference_backend();
  Model model(spec_of(sequence_model(R"(
    {"name": "embedding", "type": "embedding", "input_dim": 3, "output_dim": 2},
    {"name": "dense", "type": "dense", "units": 3, "activation": "relu"})")),
              *backend, 2);
  CHECK(model.spec().output_dims() == Dims{1, 5, 3, true});
  // table rows (1, 0), (0, 1), (1, 1); kernel [[1, -1, 2], [3, 1, -5]]; bias (0, 0.5, 1)
  Floats params = {1, 0, 0, 1, 1, 1, 1, -1, 2, 3, 1, -5, 0, 0.5, 1};
  model.parameters().from_host(params);
  const Floats ids = {0, 1, 2, 2, 0, 1, 1, 1, 0, 2};
  const float* y = model.forward(ids.data(), 2, StepKey{}, false);
  Floats got(30);
  backend->device().copy(got.data(), y, got.size() * sizeof(float));
  const Floats rows[3] = {{1, 0, 3}, {3, 1.5, 0}, {4, 0.5, 0}};  // relu(table row x kernel + bias)
  for (size_t t = 0; t < ids.size(); ++t) {
    INFO("position " << t);
    CHECK(Floats(got.begin() + 3 * t, got.begin() + 3 * t + 3) == rows[size_t(ids[t])]);
  }
}

TEST_CASE("layers that read images refuse a sequence; elementwise ones keep it", "[sequence]") {
  const std::string embed =
      R"({"name": "embed", "type": "embedding", "input_dim": 9, "output_dim": 4}, )";
  for (const char* layer :
       {R"({"type": "conv2d", "filters": 2, "kernel_size": 1})",
        R"({"type": "max_pooling2d", "pool_size": 1})",
        R"({"type": "average_pooling2d", "pool_size": 1})", R"({"type": "batch_normalization"})",
        R"({"type": "global_average_pooling2d"})", R"({"type": "zero_padding2d", "padding": 1})",
        R"({"type": "random_crop", "height": 1, "width": 1})", R"({"type": "random_flip"})",
        R"({"type": "random_translation", "height_factor": 0.1, "width_factor": 0.1})",
        R"({"type": "reshape", "target_shape": [20]})",
        R"({"type": "concatenate", "inputs": ["embed", "embed"]})"}) {
    INFO(layer);
    std::string error = error_of(sequence_model(embed + layer));
    CHECK_THAT(error, StartsWith("model.layers[1]") && Contains("does not take a sequence"));
  }
  for (const char* layer :
       {R"({"type": "relu"})", R"({"type": "dropout", "rate": 0.5})",
        R"({"type": "activation", "activation": "tanh"})", R"({"type": "rescaling", "scale": 2})",
        R"({"type": "add", "inputs": ["embed", "embed"]})", R"({"type": "layer_normalization"})"}) {
    INFO(layer);
    ModelSpec spec = spec_of(sequence_model(embed + layer));
    CHECK(spec.output_dims() == Dims{1, 5, 4, true});
  }
  // Flatten makes the sequence Keras's flat (T * D) vector, position by position.
  ModelSpec flat = spec_of(sequence_model(embed + R"({"type": "flatten"})"));
  CHECK(flat.output_dims() == Dims{20, 1, 1});
  // Layer normalization also normalizes flat features; an embedding needs token ids.
  CHECK(spec_of(sequence_model(embed + R"({"type": "flatten"}, {"type": "layer_normalization"})"))
            .output_dims() == Dims{20, 1, 1});
  CHECK_THAT(error_of(R"({"model": {"input_shape": [4, 4], "layers": [
      {"type": "embedding", "input_dim": 3, "output_dim": 2}]}})"),
             StartsWith("model.layers[0]: embedding takes a sequence of token ids"));
  CHECK_THAT(error_of(R"({"model": {"input_shape": [4, 4, 2], "layers": [
      {"type": "layer_normalization"}, {"type": "flatten"}, {"type": "dense", "units": 2}]}})"),
             StartsWith("model.layers[0]: layer_normalization takes a sequence or flat features"));
  // An image still needs a flatten before a dense layer.
  CHECK_THAT(error_of(R"({"model": {"input_shape": [4, 4, 2], "layers": [
      {"type": "dense", "units": 2}]}})"),
             Contains("add a flatten layer before it"));
}

TEST_CASE("the sequence layers' keys are Keras's; mistakes are ConfigErrors naming the key",
          "[sequence]") {
  auto embedding = [](const std::string& keys) {
    return error_of(sequence_model(R"({"type": "embedding")" + keys + "}"));
  };
  CHECK(embedding(R"(, "input_dim": 3, "output_dim": 2, "mask_zero": false,
      "embeddings_initializer": "uniform")") == "accepted");
  CHECK(embedding(R"(, "input_dim": 3, "output_dim": 2, "embeddings_initializer": {"module":
      "keras.initializers", "class_name": "RandomUniform", "config": {"seed": 7, "minval": -0.1,
      "maxval": 0.1}, "registered_name": null})") == "accepted");
  CHECK_THAT(embedding(R"(, "output_dim": 2)"), Contains("input_dim"));
  CHECK_THAT(embedding(R"(, "input_dim": 0, "output_dim": 2)"),
             StartsWith("model.layers[0].input_dim:"));
  CHECK_THAT(embedding(R"(, "input_dim": 3, "output_dim": -1)"),
             StartsWith("model.layers[0].output_dim:"));
  CHECK_THAT(embedding(R"(, "input_dim": 3, "output_dim": 2, "mask_zero": true)"),
             StartsWith("model.layers[0].mask_zero: true is not supported"));
  CHECK_THAT(embedding(R"(, "input_dim": 3, "output_dim": 2, "embeddings_initializer":
      "glorot_uniform")"),
             StartsWith("model.layers[0].embeddings_initializer:"));
  CHECK_THAT(embedding(R"(, "input_dim": 3, "output_dim": 2, "embeddings_initializer": {
      "class_name": "RandomUniform", "config": {"minval": 1, "maxval": 0}})"),
             StartsWith("model.layers[0].embeddings_initializer.config: minval"));
  CHECK_THAT(embedding(R"(, "input_dim": 3, "output_dim": 2, "sparse": true)"),
             StartsWith("model.layers[0]: unknown key \"sparse\""));

  auto norm = [](const std::string& keys) {
    return error_of(sequence_model(
        R"({"type": "embedding", "input_dim": 3, "output_dim": 2}, {"type": "layer_normalization")" +
        keys + "}"));
  };
  CHECK(norm(R"(, "axis": -1, "epsilon": 1e-5, "center": false, "scale": false,
      "rms_scaling": false)") == "accepted");
  CHECK(norm(R"(, "axis": [2])") == "accepted");  // Keras's built form for (T, D)
  CHECK(norm(R"(, "axis": [-1])") == "accepted");
  CHECK_THAT(norm(R"(, "axis": 1)"), StartsWith("model.layers[1]") && Contains("axis 1 is not"));
  CHECK_THAT(norm(R"(, "axis": 0)"), StartsWith("model.layers[1].axis: axis 0 is not supported"));
  CHECK_THAT(norm(R"(, "axis": [1, 2])"), StartsWith("model.layers[1].axis: only one axis"));
  CHECK_THAT(norm(R"(, "epsilon": 0)"), StartsWith("model.layers[1].epsilon:"));
  CHECK_THAT(norm(R"(, "rms_scaling": true)"),
             StartsWith("model.layers[1].rms_scaling: true is not supported"));
  CHECK_THAT(norm(R"(, "center": 1)"), StartsWith("model.layers[1].center:"));
  CHECK_THAT(norm(R"(, "gamma_regularizer": null)"),
             StartsWith("model.layers[1]: unknown key \"gamma_regularizer\""));
}

namespace {

const char* kPolicy =
    R"({"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, )"
    R"("registered_name": null})";

std::string initializer(const std::string& class_name, const std::string& config) {
  return R"({"module": "keras.initializers", "class_name": ")" + class_name + R"(", "config": )" +
         config + R"(, "registered_name": null})";
}

std::string tensor(const std::string& shape, const std::string& dtype, const std::string& from) {
  return R"({"class_name": "__keras_tensor__", "config": {"shape": )" + shape + R"(, "dtype": ")" +
         dtype + R"(", "keras_history": [")" + from + R"(", 0, 0]}})";
}

/// Keras 3's model.to_json() of keras.Input((5,), dtype="int32") -> Embedding(7, 4) ->
/// LayerNormalization() -> Dense(7), with `replace` applied (key text, new text).
std::string keras_language_model(const std::string& from = "", const std::string& to = "") {
  std::string json =
      R"({"module": "keras.src.models.functional", "class_name": "Functional", "config": )"
      R"({"name": "functional", "trainable": true, "layers": [)"
      R"({"module": "keras.layers", "class_name": "InputLayer", "config": {"batch_shape": )"
      R"([null, 5], "dtype": "int32", "sparse": false, "ragged": false, "name": "tokens", )"
      R"("optional": false}, "registered_name": null, "name": "tokens", "inbound_nodes": []}, )"
      R"({"module": "keras.layers", "class_name": "Embedding", "config": {"name": "embedding", )"
      R"("trainable": true, "dtype": )" +
      std::string(kPolicy) + R"(, "input_dim": 7, "output_dim": 4, "embeddings_initializer": )" +
      initializer("RandomUniform", R"({"seed": null, "minval": -0.05, "maxval": 0.05})") +
      R"(, "embeddings_regularizer": null, "activity_regularizer": null, )"
      R"("embeddings_constraint": null, "mask_zero": false, "quantization_config": null}, )"
      R"("registered_name": null, "build_config": {"input_shape": [null, 5]}, "name": )"
      R"("embedding", "inbound_nodes": [{"args": [)" +
      tensor("[null, 5]", "int32", "tokens") +
      R"(], "kwargs": {}}]}, )"
      R"({"module": "keras.layers", "class_name": "LayerNormalization", "config": {"name": )"
      R"("layer_normalization", "trainable": true, "dtype": )" +
      std::string(kPolicy) +
      R"(, "axis": [2], "epsilon": 0.001, "center": true, "scale": true, "rms_scaling": false, )"
      R"("beta_initializer": )" +
      initializer("Zeros", "{}") + R"(, "gamma_initializer": )" + initializer("Ones", "{}") +
      R"(, "beta_regularizer": null, "gamma_regularizer": null, "beta_constraint": null, )"
      R"("gamma_constraint": null}, "registered_name": null, "build_config": {"input_shape": )"
      R"([null, 5, 4]}, "name": "layer_normalization", "inbound_nodes": [{"args": [)" +
      tensor("[null, 5, 4]", "float32", "embedding") +
      R"(], "kwargs": {}}]}, )"
      R"({"module": "keras.layers", "class_name": "Dense", "config": {"name": "dense", )"
      R"("trainable": true, "dtype": )" +
      std::string(kPolicy) +
      R"(, "units": 7, "activation": "linear", "use_bias": true, "kernel_initializer": )" +
      initializer("GlorotUniform", R"({"seed": null})") + R"(, "bias_initializer": )" +
      initializer("Zeros", "{}") +
      R"(, "kernel_regularizer": null, "bias_regularizer": null, "kernel_constraint": null, )"
      R"("bias_constraint": null, "quantization_config": null}, "registered_name": null, )"
      R"("build_config": {"input_shape": [null, 5, 4]}, "name": "dense", "inbound_nodes": )"
      R"([{"args": [)" +
      tensor("[null, 5, 4]", "float32", "layer_normalization") +
      R"(], "kwargs": {}}]}], "input_layers": [["tokens", 0, 0]], "output_layers": )"
      R"([["dense", 0, 0]]}, "registered_name": "Functional", "build_config": {"input_shape": )"
      R"(null}})";
  if (!from.empty()) {
    const size_t at = json.find(from);
    REQUIRE(at != std::string::npos);
    json.replace(at, from.size(), to);
  }
  return json;
}

std::string keras_error(const std::string& json) {
  try {
    train::translate_keras_model(json, "model.json");
  } catch (const common::ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("Keras's Embedding and LayerNormalization read from a Functional model",
          "[sequence][keras]") {
  train::KerasModel model = train::translate_keras_model(keras_language_model(), "model.json");
  CHECK(model.spec.input_dims() == Dims{1, 5, 1, true});
  REQUIRE(model.spec.nodes.size() == 3);
  CHECK(model.spec.nodes[0].type == "embedding");
  CHECK(model.spec.nodes[1].type == "layer_normalization");
  CHECK(model.spec.nodes[2].type == "dense");
  CHECK(model.spec.output_dims() == Dims{1, 5, 7, true});
  CHECK_THAT(model.model_json, StartsWith(R"({"input_shape":[5],)"));
  // It builds, with Keras's weight names and shapes.
  std::unique_ptr<Backend> backend = make_reference_backend();
  Model built(model.spec, *backend, 2);
  std::vector<std::string> names;
  for (const ParamInfo& p : built.parameter_infos()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"embedding.embeddings", "layer_normalization.gamma",
                                          "layer_normalization.beta", "dense.kernel",
                                          "dense.bias"});

  // int64 ids and a float32 input read too; what dtrain cannot do names the layer and the key.
  CHECK(keras_error(keras_language_model(R"("dtype": "int32", "sparse")",
                                         R"("dtype": "int64", "sparse")")) == "accepted");
  CHECK(keras_error(keras_language_model(R"("dtype": "int32", "sparse")",
                                         R"("dtype": "float32", "sparse")")) == "accepted");
  CHECK_THAT(keras_error(keras_language_model(R"("mask_zero": false)", R"("mask_zero": true)")),
             Contains(R"(layer "embedding" (Embedding): mask_zero)"));
  CHECK_THAT(keras_error(keras_language_model(R"("embeddings_regularizer": null)",
                                              R"("embeddings_regularizer": "l2")")),
             Contains(R"(layer "embedding" (Embedding): embeddings_regularizer)"));
  CHECK_THAT(
      keras_error(keras_language_model(
          R"("quantization_config": null}, "registered_name": null, "build_config": {"input_shape": [null, 5]})",
          R"("quantization_config": null, "lora_rank": 4}, "registered_name": null, "build_config": {"input_shape": [null, 5]})")),
      Contains(R"((Embedding): lora_rank)"));
  CHECK_THAT(keras_error(keras_language_model(R"("rms_scaling": false)", R"("rms_scaling": true)")),
             Contains(R"(layer "layer_normalization" (LayerNormalization): rms_scaling)"));
  CHECK_THAT(keras_error(keras_language_model(R"("axis": [2])", R"("axis": [1])")),
             Contains(R"(layer "layer_normalization" (LayerNormalization))") &&
                 Contains("axis 1 is not supported"));
  CHECK_THAT(keras_error(keras_language_model(
                 R"("gamma_initializer": {"module": "keras.initializers", "class_name": "Ones")",
                 R"("gamma_initializer": {"module": "keras.initializers", "class_name": "Zeros")")),
             Contains("gamma_initializer"));
  // Integer tensors are token ids: only the model's input holds them; images stay float32.
  CHECK_THAT(keras_error(keras_language_model(
                 R"("shape": [null, 5, 4], "dtype": "float32", "keras_history": ["embedding")",
                 R"("shape": [null, 5, 4], "dtype": "int32", "keras_history": ["embedding")")),
             Contains("an integer tensor is not supported here"));
  CHECK_THAT(keras_error(keras_language_model(R"("batch_shape": [null, 5], "dtype": "int32")",
                                              R"("batch_shape": [null, 5, 3], "dtype": "int32")")),
             Contains("int32"));
}
