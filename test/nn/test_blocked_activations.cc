// Activations in blocks of channels (docs/design.md#blocked-activations): where the oneDNN
// backend blocks channels, the model blocks every activation between layers that take it so
// (convolutions, batch normalization, adds, activations) and keeps plain what another layer
// reads; a convolution gives the same bits whatever the layouts of its x and y; a model with
// blocked activations computes what the plain one does, to a rounding (batch normalization sums
// in another order).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/json.h"
#include "worker/nn/model.h"

using namespace dtrain;
using namespace dtrain::nn;

namespace {

using Floats = std::vector<float>;

Floats random_floats(size_t count, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Floats out(count);
  for (float& v : out) v = d(engine);
  return out;
}

double worst_relative(const Floats& a, const Floats& b, double floor) {
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

// A stem, a residual block, a strided stage; a side branch through max pooling (which reads
// plain NCHW) and a flatten; the two pooled branches concatenated.
const char* kResidual = R"({"model": {"input_shape": [8, 8, 1], "layers": [
  {"name": "stem", "type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same",
   "use_bias": false},
  {"name": "stem_bn", "type": "batch_normalization"},
  {"name": "stem_relu", "type": "relu"},
  {"name": "a", "type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same"},
  {"name": "a_bn", "type": "batch_normalization"},
  {"name": "a_relu", "type": "activation", "activation": "relu"},
  {"name": "b", "type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same"},
  {"name": "b_bn", "type": "batch_normalization"},
  {"name": "sum", "type": "add", "inputs": ["stem_relu", "b_bn"]},
  {"name": "sum_relu", "type": "relu"},
  {"name": "down", "type": "conv2d", "filters": 32, "kernel_size": 3, "strides": 2,
   "padding": "same"},
  {"name": "down_bn", "type": "batch_normalization"},
  {"name": "down_relu", "type": "relu"},
  {"name": "pool", "type": "global_average_pooling2d"},
  {"name": "side", "type": "conv2d", "filters": 16, "kernel_size": 1, "inputs": ["sum_relu"]},
  {"name": "side_pool", "type": "max_pooling2d", "pool_size": 2},
  {"name": "side_flat", "type": "flatten"},
  {"name": "both", "type": "concatenate", "inputs": ["pool", "side_flat"]},
  {"name": "logits", "type": "dense", "units": 10}]}})";

std::map<std::string, Layout> layouts_of(const Model& model) {
  std::map<std::string, Layout> out;
  for (size_t i = 0; i < model.spec().nodes.size(); ++i)
    out[model.spec().nodes[i].name] = model.layout(i);
  return out;
}

struct StepResult {
  Floats logits, gradients, inference, statistics;
};

StepResult step(Backend& backend, const std::string& json) {
  const int n = 6;
  Model model(spec_of(json), backend, n);
  model.initialize(5);
  Floats x = random_floats(size_t(n) * 64, 21);
  std::vector<int32_t> labels = {0, 3, 9, 1, 5, 7};
  StepResult r;
  const float* logits = model.forward(x.data(), n, StepKey{1, 0, 0}, true);
  r.logits.assign(logits, logits + n * 10);
  Floats totals(3, 0.0f);
  backend.softmax_cross_entropy(n, 10, logits, labels.data(), model.logits_gradient(),
                                totals.data());
  model.backward(n);
  r.gradients = model.gradients().to_host();
  r.statistics = model.statistics().to_host();
  model.state().from_host(random_floats(model.state().size(), 22, 0.5, 1.5));
  const float* inferred = model.forward(x.data(), n, StepKey{1, 0, 0}, false);
  r.inference.assign(inferred, inferred + n * 10);
  return r;
}

}  // namespace

TEST_CASE("the model blocks the activations between the layers that take them blocked",
          "[blocked]") {
  std::unique_ptr<Backend> dnnl = make_dnnl_backend(), plain = make_plain_dnnl_backend();
  CHECK_FALSE(plain->blocks_channels());
  CHECK_FALSE(make_reference_backend()->blocks_channels());
  CHECK(dnnl->blocks_channels() == own_kernels_may_use(VectorIsa::kAvx512));
  Model model(spec_of(kResidual), *dnnl, 4);
  std::map<std::string, Layout> got = layouts_of(model);
  const Layout blocked = dnnl->blocks_channels() ? Layout::kBlocked : Layout::kPlain;
  // Between convolutions, through normalization, ReLUs (fused or not) and the add.
  for (const char* name : {"stem", "stem_bn", "stem_relu", "a", "a_bn", "a_relu", "b", "b_bn",
                           "sum", "sum_relu", "down", "down_bn", "down_relu"}) {
    INFO(name);
    CHECK(got[name] == blocked);
  }
  // Max pooling reads plain; global average pooling, flatten, concatenate and dense write plain.
  for (const char* name : {"side", "side_pool", "side_flat", "pool", "both", "logits"}) {
    INFO(name);
    CHECK(got[name] == Layout::kPlain);
  }
  Model all_plain(spec_of(kResidual), *plain, 4);
  for (const auto& [name, layout] : layouts_of(all_plain)) {
    INFO(name);
    CHECK(layout == Layout::kPlain);
  }
  // A channel count that is not a multiple of 16 stays plain, and so does what follows it.
  std::string narrow = kResidual;
  narrow.replace(narrow.find("\"filters\": 32"), 13, "\"filters\": 24");
  got = layouts_of(Model(spec_of(narrow), *dnnl, 4));
  CHECK(got["down"] == Layout::kPlain);
  CHECK(got["down_bn"] == Layout::kPlain);
  CHECK(got["sum"] == blocked);
}

TEST_CASE("blocked activations compute what plain ones do", "[blocked]") {
  for (MathMode mode : {MathMode::kFloat32, MathMode::kBfloat16}) {
    if (!cpu_supports(mode)) continue;
    INFO(math_mode_name(mode));
    std::unique_ptr<Backend> dnnl = make_dnnl_backend(mode), plain = make_plain_dnnl_backend(mode);
    StepResult got = step(*dnnl, kResidual), want = step(*plain, kResidual);
    // The same products on the same values; batch normalization's sums in another order, whose
    // last bits then pass through the layers after it (in bf16, some round to the other side).
    const double tolerance = mode == MathMode::kFloat32 ? 1e-4 : 3e-2;
    CHECK(worst_relative(got.logits, want.logits, 1e-2) < tolerance);
    CHECK(worst_relative(got.inference, want.inference, 1e-2) < tolerance);
    CHECK(worst_relative(got.statistics, want.statistics, 1e-2) < tolerance);
    CHECK(worst_relative(got.gradients, want.gradients, 1e-2) < 10 * tolerance);
    // The same backend twice: the same bits.
    StepResult again = step(*dnnl, kResidual);
    CHECK(again.gradients == got.gradients);
    CHECK(again.inference == got.inference);
  }
}

// A convolution's x and y in either layout: the same primitives on the same values, so the
// results are the same bits once reordered, except a first layer's y and weight gradient, which the
// direct loops take only when both are plain. This runs on any CPU: where oneDNN wants
// another layout, the stages reorder.
TEST_CASE("a convolution gives the same bits whatever the layouts of x and y", "[blocked]") {
  std::unique_ptr<Backend> b = make_dnnl_backend();
  for (ConvShape s : {ConvShape{3, 16, 9, 9, 32, 3, 3, 2, 2, 0, 1, 0, 1},
                      ConvShape{2, 32, 7, 7, 16, 3, 3, 1, 1, 1, 1, 1, 1},
                      ConvShape{2, 1, 10, 10, 16, 3, 3, 1, 1, 1, 1, 1, 1},
                      ConvShape{6, 16, 8, 8, 16, 1, 1}, ConvShape{3, 16, 8, 8, 32, 1, 1, 2, 2}}) {
    INFO("input " << s.n << "x" << s.c << "x" << s.h << "x" << s.w << ", " << s.k << " filters");
    const int in_hw = s.h * s.w, out_hw = s.oh() * s.ow();
    Floats x = random_floats(s.input_count(), 31), w = random_floats(s.weight_count(), 32),
           bias = random_floats(size_t(s.k), 33), dy = random_floats(s.output_count(), 34);
    struct Result {
      Floats y, dx, dw, db;
    };
    auto run = [&](Layout x_layout, Layout y_layout) {
      ConvShape t = s;
      t.x_layout = x_layout;
      t.y_layout = y_layout;
      Floats xs(x.size()), dys(dy.size());
      const bool bx = x_layout == Layout::kBlocked, by = y_layout == Layout::kBlocked;
      if (bx) b->reorder_channels(s.n, s.c, in_hw, Layout::kBlocked, x.data(), xs.data());
      if (by) b->reorder_channels(s.n, s.k, out_hw, Layout::kBlocked, dy.data(), dys.data());
      const Floats& xi = bx ? xs : x;
      const Floats& dyi = by ? dys : dy;
      Result r{Floats(s.output_count()), Floats(s.input_count()), Floats(s.weight_count()),
               Floats(size_t(s.k))};
      b->conv2d_forward(t, xi.data(), w.data(), bias.data(), r.y.data());
      b->conv2d_backward(t, xi.data(), dyi.data(), w.data(), r.dx.data(), r.dw.data(), r.db.data(),
                         {});
      if (by) {
        Floats y(r.y.size());
        b->reorder_channels(s.n, s.k, out_hw, Layout::kPlain, r.y.data(), y.data());
        r.y = y;
      }
      if (bx) {
        Floats dx(r.dx.size());
        b->reorder_channels(s.n, s.c, in_hw, Layout::kPlain, r.dx.data(), dx.data());
        r.dx = dx;
      }
      return r;
    };
    Result want = run(Layout::kPlain, Layout::kPlain);
    std::vector<std::pair<Layout, Layout>> layouts = {{Layout::kPlain, Layout::kBlocked}};
    if (s.c % kChannelBlock == 0) {
      layouts.push_back({Layout::kBlocked, Layout::kBlocked});
      layouts.push_back({Layout::kBlocked, Layout::kPlain});
    }
    for (auto [xl, yl] : layouts) {
      INFO("x " << (xl == Layout::kBlocked ? "blocked" : "plain") << ", y "
                << (yl == Layout::kBlocked ? "blocked" : "plain"));
      Result got = run(xl, yl);
      CHECK(got.dx == want.dx);
      // A few input channels times taps at column stride 1 (a first layer's, or a 1x1 of 16) run
      // the direct loops when x and y are plain, and oneDNN's kernels when either is blocked:
      // its weight gradient sums in another order.
      const bool direct_when_plain = s.sw == 1 && s.c * s.kh * s.kw <= 32;
      if (direct_when_plain && !(xl == Layout::kPlain && yl == Layout::kPlain)) {
        CHECK(worst_relative(got.y, want.y, 1.0) < 1e-5);
        CHECK(worst_relative(got.dw, want.dw, 1e-2) < 1e-3);
        CHECK(worst_relative(got.db, want.db, 1e-2) < 1e-3);
      } else {
        CHECK(got.y == want.y);
        CHECK(got.dw == want.dw);
        CHECK(got.db == want.db);
      }
    }
  }
}
