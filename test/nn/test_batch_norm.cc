// BatchNormalization (worker/nn/layers/batch_normalization.cc, backend.h's batchnorm_*): the
// oneDNN backend's loops match the reference's (statistics, output, gradients) and do not depend
// on the thread count or the vector width; a graph with batch normalization has gradients that
// match finite differences; training normalizes by the batch and inference by the moving
// statistics, which move by Keras's rule from the statistics summed over shards; its keys take
// Keras's defaults and refuse what is not supported.
#include <omp.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "worker/nn/bf16_rounding.h"
#include "worker/nn/host_norm.h"
#include "worker/nn/model.h"
#include "worker/nn/profiled_backend.h"

using namespace dtrain;
using namespace dtrain::nn;
using Catch::Matchers::StartsWith;

namespace {

using Floats = std::vector<float>;

Floats random_floats(size_t count, uint32_t seed, float lo = -2, float hi = 3) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Floats out(count);
  for (float& v : out) v = d(engine);
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

struct NormRun {
  Floats y, mean, var, dx, dgamma, dbeta, y_inference;
};

NormRun run_norm(Backend& b, const NormShape& s, bool affine) {
  Floats x = random_floats(s.count(), 1), dy = random_floats(s.count(), 2, -1, 1);
  Floats gamma = random_floats(size_t(s.c), 3, 0.5, 1.5), beta = random_floats(size_t(s.c), 4);
  const float* g = affine ? gamma.data() : nullptr;
  const float* bt = affine ? beta.data() : nullptr;
  NormRun r{Floats(s.count()),   Floats(size_t(s.c)), Floats(size_t(s.c)), Floats(s.count()),
            Floats(size_t(s.c)), Floats(size_t(s.c)), Floats(s.count())};
  b.batchnorm_forward_training(s, 1e-3f, x.data(), g, bt, r.y.data(), r.mean.data(), r.var.data());
  b.batchnorm_backward(s, 1e-3f, x.data(), r.y.data(), dy.data(), g, r.mean.data(), r.var.data(),
                       r.dx.data(), r.dgamma.data(), r.dbeta.data());
  Floats moving_mean = random_floats(size_t(s.c), 5, -0.5, 0.5);
  Floats moving_var = random_floats(size_t(s.c), 6, 0.5, 2);
  b.batchnorm_forward_inference(s, 1e-3f, x.data(), g, bt, moving_mean.data(), moving_var.data(),
                                r.y_inference.data());
  return r;
}

ModelSpec spec_of(const std::string& json) {
  common::JsonDocument doc = common::JsonDocument::parse(json, "model");
  return parse_model_spec(doc.root().at("model"));
}

const char* kNormModel = R"({"model": {"input_shape": [5, 5, 2], "layers": [
  {"name": "conv", "type": "conv2d", "filters": 3, "kernel_size": 3, "padding": "same"},
  {"name": "bn", "type": "batch_normalization"},
  {"type": "relu"},
  {"name": "sum", "type": "add", "inputs": ["relu_in", "layers.2.relu"]},
  {"type": "flatten"},
  {"name": "logits", "type": "dense", "units": 3}]}})";

}  // namespace

TEST_CASE("oneDNN's batch normalization matches the reference, whatever the threads",
          "[parity][batch_norm]") {
  std::unique_ptr<Backend> dnnl = make_dnnl_backend(), ref = make_reference_backend();
  for (NormShape s : {NormShape{4, 3, 25}, NormShape{7, 5, 1}, NormShape{2, 16, 49}}) {
    for (bool affine : {true, false}) {
      INFO("shape " << s.n << "x" << s.c << "x" << s.hw << (affine ? " with" : " without")
                    << " gamma and beta");
      NormRun want = run_norm(*ref, s, affine), got = run_norm(*dnnl, s, affine);
      // Both reduce in double; they differ by the last rounding of each float result.
      CHECK(worst_relative(got.mean, want.mean) < 1e-6);
      CHECK(worst_relative(got.var, want.var) < 1e-6);
      // y = x * scale + shift in float (Keras's folding) against the reference's double: a few
      // roundings of terms up to about 5, so an absolute error up to about 1e-6.
      CHECK(worst_relative(got.y, want.y, 1.0) < 2e-6);
      CHECK(worst_relative(got.y_inference, want.y_inference, 1.0) < 2e-6);
      CHECK(worst_relative(got.dx, want.dx) < 1e-4);
      CHECK(worst_relative(got.dgamma, want.dgamma) < 1e-5);
      CHECK(worst_relative(got.dbeta, want.dbeta) < 1e-5);
      // The mean of y is beta (0 without), its variance about gamma^2 (1 without).
      for (int ch = 0; ch < s.c && s.n * s.hw > 1; ++ch) {
        double sum = 0;
        for (int i = 0; i < s.n; ++i)
          for (int p = 0; p < s.hw; ++p) sum += got.y[(size_t(i) * s.c + ch) * s.hw + p];
        double beta = affine ? random_floats(size_t(s.c), 4)[ch] : 0.0;
        CHECK(sum / (s.n * s.hw) == Approx(beta).margin(1e-5));
      }
      int threads = omp_get_max_threads();
      omp_set_num_threads(1);
      NormRun one = run_norm(*dnnl, s, affine);
      omp_set_num_threads(threads);
      CHECK(one.y == got.y);
      CHECK(one.dx == got.dx);
      CHECK(one.dgamma == got.dgamma);
    }
  }
}

// The oneDNN backend's batch normalization runs host_norm.h's loops at the CPU's widest vectors;
// each width this CPU runs gives the plain loops' bits (the same sums in the same order, no
// multiply and add fused), so two machines with different vectors train the same model. Row
// lengths that leave a tail of each width, with and without the fused ReLU.
TEST_CASE("batch normalization's loops give the same bits at every vector width", "[batch_norm]") {
  using direct_conv::Vectors;
  int widths = 0;
  for (Vectors vectors : {Vectors::kAvx512, Vectors::kAvx2}) {
    if (!direct_conv::runs(vectors)) {
      WARN("this CPU does not run the " << direct_conv::vectors_name(vectors) << " loops");
      continue;
    }
    ++widths;
    for (NormShape s :
         {NormShape{3, 4, 49}, NormShape{2, 3, 37}, NormShape{5, 2, 1}, NormShape{2, 16, 196}}) {
      for (bool relu : {false, true}) {
        s.relu = relu;
        INFO(direct_conv::vectors_name(vectors)
             << " shape " << s.n << "x" << s.c << "x" << s.hw << (relu ? " relu" : ""));
        Floats x = random_floats(s.count(), 1), dy = random_floats(s.count(), 2, -1, 1);
        Floats gamma = random_floats(size_t(s.c), 3, 0.5, 1.5);
        Floats beta = random_floats(size_t(s.c), 4);
        auto run = [&](Vectors v) {
          NormRun r{Floats(s.count()), Floats(size_t(s.c)), Floats(size_t(s.c)),
                    Floats(s.count()), Floats(size_t(s.c)), Floats(size_t(s.c)),
                    Floats(s.count())};
          host_batchnorm_forward_training(s, 1e-3f, x.data(), gamma.data(), beta.data(), r.y.data(),
                                          r.mean.data(), r.var.data(), v);
          host_batchnorm_backward(s, 1e-3f, x.data(), r.y.data(), dy.data(), gamma.data(),
                                  r.mean.data(), r.var.data(), r.dx.data(), r.dgamma.data(),
                                  r.dbeta.data(), v);
          host_batchnorm_forward_inference(s, 1e-3f, x.data(), gamma.data(), beta.data(),
                                           r.mean.data(), r.var.data(), r.y_inference.data(), v);
          return r;
        };
        NormRun plain = run(Vectors::kPlain), wide = run(vectors);
        CHECK(wide.mean == plain.mean);
        CHECK(wide.var == plain.var);
        CHECK(wide.y == plain.y);
        CHECK(wide.y_inference == plain.y_inference);
        CHECK(wide.dx == plain.dx);
        CHECK(wide.dgamma == plain.dgamma);
        CHECK(wide.dbeta == plain.dbeta);
      }
    }
  }
  if (widths == 0) WARN("only the plain loops run here: nothing to compare");
}

// Batch normalization in blocks of channels (docs/design.md#blocked-activations), as the oneDNN
// backend runs it between convolutions: the plain loops' results to a few float roundings (the
// plain loops sum in double; the blocked ones in float over chunks of pixels, the chunks in
// double), and the same bits at every vector width and thread count.
TEST_CASE("batch normalization in blocks of channels: the plain results, the same bits anywhere",
          "[batch_norm]") {
  using direct_conv::Vectors;
  auto blocked = [](const Floats& v, const NormShape& s) {  // NCHW -> nChw16c
    Floats out(v.size());
    for (int i = 0; i < s.n; ++i)
      for (int ch = 0; ch < s.c; ++ch)
        for (int p = 0; p < s.hw; ++p)
          out[((size_t(i) * (s.c / 16) + ch / 16) * s.hw + p) * 16 + ch % 16] =
              v[(size_t(i) * s.c + ch) * s.hw + p];
    return out;
  };
  for (NormShape s :
       {NormShape{3, 16, 49}, NormShape{2, 32, 37}, NormShape{5, 16, 1}, NormShape{4, 48, 9}}) {
    for (bool relu : {false, true}) {
      s.relu = relu;
      INFO("shape " << s.n << "x" << s.c << "x" << s.hw << (relu ? " relu" : ""));
      const size_t c = size_t(s.c);
      Floats x = random_floats(s.count(), 1), dy = random_floats(s.count(), 2, -1, 1);
      Floats gamma = random_floats(c, 3, 0.5, 1.5), beta = random_floats(c, 4);
      auto run = [&](Layout layout, Vectors v) {
        NormShape t = s;
        t.layout = layout;
        const bool b = layout == Layout::kBlocked;
        const Floats& xs = b ? blocked(x, s) : x;
        const Floats& dys = b ? blocked(dy, s) : dy;
        NormRun r{Floats(s.count()), Floats(c), Floats(c),        Floats(s.count()),
                  Floats(c),         Floats(c), Floats(s.count())};
        host_batchnorm_forward_training(t, 1e-3f, xs.data(), gamma.data(), beta.data(), r.y.data(),
                                        r.mean.data(), r.var.data(), v);
        host_batchnorm_backward(t, 1e-3f, xs.data(), r.y.data(), dys.data(), gamma.data(),
                                r.mean.data(), r.var.data(), r.dx.data(), r.dgamma.data(),
                                r.dbeta.data(), v);
        host_batchnorm_forward_inference(t, 1e-3f, xs.data(), gamma.data(), beta.data(),
                                         r.mean.data(), r.var.data(), r.y_inference.data(), v);
        return r;
      };
      NormRun plain = run(Layout::kPlain, Vectors::kPlain);
      NormRun got = run(Layout::kBlocked, Vectors::kWidest);
      // Errors relative to the terms' size (x and dy up to 1), not to a sum that cancels.
      CHECK(worst_relative(got.mean, plain.mean, 1e-2) < 1e-6);
      CHECK(worst_relative(got.var, plain.var, 1e-2) < 1e-6);
      CHECK(worst_relative(got.y, blocked(plain.y, s), 1.0) < 2e-6);
      CHECK(worst_relative(got.y_inference, blocked(plain.y_inference, s), 1.0) < 2e-6);
      CHECK(worst_relative(got.dx, blocked(plain.dx, s)) < 1e-4);
      CHECK(worst_relative(got.dgamma, plain.dgamma, 1.0) < 1e-5);
      CHECK(worst_relative(got.dbeta, plain.dbeta, 1.0) < 1e-5);
      for (Vectors v : {Vectors::kPlain, Vectors::kAvx2, Vectors::kAvx512}) {
        if (!direct_conv::runs(v)) continue;
        INFO(direct_conv::vectors_name(v));
        NormRun width = run(Layout::kBlocked, v);
        CHECK(width.mean == got.mean);
        CHECK(width.var == got.var);
        CHECK(width.y == got.y);
        CHECK(width.y_inference == got.y_inference);
        CHECK(width.dx == got.dx);
        CHECK(width.dgamma == got.dgamma);
        CHECK(width.dbeta == got.dbeta);
      }
      const int threads = omp_get_max_threads();
      omp_set_num_threads(1);
      NormRun one = run(Layout::kBlocked, Vectors::kWidest);
      omp_set_num_threads(threads);
      CHECK(one.y == got.y);
      CHECK(one.dx == got.dx);
      CHECK(one.dgamma == got.dgamma);
      // The forward's factors handed to the backward: the ReLU's mask from x, the same bits.
      NormShape t = s;
      t.layout = Layout::kBlocked;
      const Floats xs = blocked(x, s), dys = blocked(dy, s);
      Floats y(s.count()), mean(c), var(c), scale(c), shift(c), dx(s.count()), dgamma(c), dbeta(c);
      host_batchnorm_forward_training(t, 1e-3f, xs.data(), gamma.data(), beta.data(), y.data(),
                                      mean.data(), var.data(), Vectors::kWidest, scale.data(),
                                      shift.data());
      CHECK(y == got.y);
      host_batchnorm_backward(t, 1e-3f, xs.data(), y.data(), dys.data(), gamma.data(), mean.data(),
                              var.data(), dx.data(), dgamma.data(), dbeta.data(), Vectors::kWidest,
                              scale.data(), shift.data());
      CHECK(dx == got.dx);
      CHECK(dgamma == got.dgamma);
      CHECK(dbeta == got.dbeta);
    }
  }
}

// Synchronized batch normalization's pieces (docs/design.md#synchronized-batch-normalization):
// with one batch's own sums, batchnorm_sums and batchnorm_backward_data give the training
// forward's statistics and batchnorm_backward's dx bit for bit on the host backend (the same
// loops), and match the reference within a rounding; at every vector width the same bits.
TEST_CASE("synchronized batch normalization's pieces rebuild the per-batch results",
          "[batch_norm]") {
  std::unique_ptr<Backend> dnnl = make_dnnl_backend(), ref = make_reference_backend();
  for (NormShape s : {NormShape{4, 3, 25}, NormShape{2, 16, 49}, NormShape{3, 2, 37}}) {
    for (bool relu : {false, true}) {
      s.relu = relu;
      INFO("shape " << s.n << "x" << s.c << "x" << s.hw << (relu ? " relu" : ""));
      const size_t c = size_t(s.c);
      const double m = double(s.n) * s.hw;
      Floats x = random_floats(s.count(), 1), dy = random_floats(s.count(), 2, -1, 1);
      Floats gamma = random_floats(c, 3, 0.5, 1.5), beta = random_floats(c, 4);
      struct Pieces {
        Floats mean, var, dx, totals;
      };
      auto pieces = [&](Backend& b) {
        Pieces p{Floats(c), Floats(c), Floats(s.count()), Floats(2 * c)};
        Floats sums(c), y(s.count());
        b.batchnorm_sums(s, x.data(), nullptr, sums.data());
        for (size_t ch = 0; ch < c; ++ch) p.mean[ch] = float(sums[ch] / m);
        b.batchnorm_sums(s, x.data(), p.mean.data(), sums.data());
        for (size_t ch = 0; ch < c; ++ch) p.var[ch] = float(sums[ch] / m);
        b.batchnorm_forward_inference(s, 1e-3f, x.data(), gamma.data(), beta.data(), p.mean.data(),
                                      p.var.data(), y.data());
        b.batchnorm_backward(s, 1e-3f, x.data(), y.data(), dy.data(), gamma.data(), p.mean.data(),
                             p.var.data(), nullptr, p.totals.data() + c, p.totals.data());
        b.batchnorm_backward_data(s, 1e-3f, x.data(), y.data(), dy.data(), gamma.data(),
                                  p.mean.data(), p.var.data(), p.totals.data(), m, p.dx.data());
        return p;
      };
      Pieces got = pieces(*dnnl), want = pieces(*ref);
      CHECK(worst_relative(got.mean, want.mean) < 1e-6);
      CHECK(worst_relative(got.var, want.var) < 1e-6);
      CHECK(worst_relative(got.dx, want.dx) < 1e-4);
      // The per-batch path from the same statistics: the same dbeta and dgamma (written from the
      // same doubles), and dx but for the totals' rounding to float on the way.
      Floats mean(c), var(c), y(s.count()), dx(s.count()), dgamma(c), dbeta(c);
      host_batchnorm_forward_training(s, 1e-3f, x.data(), gamma.data(), beta.data(), y.data(),
                                      mean.data(), var.data());
      CHECK(worst_relative(mean, got.mean) < 1e-6);
      CHECK(worst_relative(var, got.var) < 1e-6);
      host_batchnorm_backward(s, 1e-3f, x.data(), y.data(), dy.data(), gamma.data(),
                              got.mean.data(), got.var.data(), dx.data(), dgamma.data(),
                              dbeta.data());
      CHECK(dbeta == Floats(got.totals.begin(), got.totals.begin() + long(c)));
      CHECK(dgamma == Floats(got.totals.begin() + long(c), got.totals.end()));
      CHECK(worst_relative(dx, got.dx) < 2e-5);
      using direct_conv::Vectors;
      for (Vectors v : {Vectors::kAvx512, Vectors::kAvx2}) {
        if (!direct_conv::runs(v)) continue;
        Floats sums_plain(c), sums_wide(c), dx_plain(s.count()), dx_wide(s.count());
        host_batchnorm_sums(s, x.data(), got.mean.data(), sums_plain.data(), Vectors::kPlain);
        host_batchnorm_sums(s, x.data(), got.mean.data(), sums_wide.data(), v);
        CHECK(sums_wide == sums_plain);
        host_batchnorm_backward_data(s, 1e-3f, x.data(), y.data(), dy.data(), gamma.data(),
                                     got.mean.data(), got.var.data(), got.totals.data(), 3 * m,
                                     dx_plain.data(), Vectors::kPlain);
        host_batchnorm_backward_data(s, 1e-3f, x.data(), y.data(), dy.data(), gamma.data(),
                                     got.mean.data(), got.var.data(), got.totals.data(), 3 * m,
                                     dx_wide.data(), v);
        CHECK(dx_wide == dx_plain);
      }
    }
  }
}

// A ReLU fused into batch normalization (docs/design.md#fusion) computes what the two layers
// compute one after the other, bit for bit: the fused forward is max(y, 0) of the plain one, and
// the fused backward is the plain backward of relu_backward's masked gradient.
TEST_CASE("a ReLU fused into batch normalization gives the two layers' bits", "[batch_norm]") {
  for (auto make : {make_reference_backend, make_dnnl_backend}) {
    std::unique_ptr<Backend> b = make(MathMode::kFloat32);
    for (NormShape s : {NormShape{4, 3, 25}, NormShape{7, 5, 1}, NormShape{2, 16, 49}}) {
      INFO(b->name() << " shape " << s.n << "x" << s.c << "x" << s.hw);
      Floats x = random_floats(s.count(), 1), dy = random_floats(s.count(), 2, -1, 1);
      Floats gamma = random_floats(size_t(s.c), 3, 0.5, 1.5), beta = random_floats(size_t(s.c), 4);
      Floats mean(size_t(s.c)), var(size_t(s.c));
      // The two layers: y, relu(y), its gradient masked, then batch normalization's backward.
      Floats y(s.count()), relu_y(s.count()), masked(s.count()), dx(s.count());
      Floats dgamma(size_t(s.c)), dbeta(size_t(s.c));
      b->batchnorm_forward_training(s, 1e-3f, x.data(), gamma.data(), beta.data(), y.data(),
                                    mean.data(), var.data());
      b->relu_forward(s.count(), y.data(), relu_y.data());
      b->relu_backward(s.count(), relu_y.data(), dy.data(), masked.data());
      b->batchnorm_backward(s, 1e-3f, x.data(), y.data(), masked.data(), gamma.data(), mean.data(),
                            var.data(), dx.data(), dgamma.data(), dbeta.data());
      // Fused.
      NormShape fused = s;
      fused.relu = true;
      Floats fy(s.count()), fdx(s.count()), fdgamma(size_t(s.c)), fdbeta(size_t(s.c));
      Floats fmean(size_t(s.c)), fvar(size_t(s.c));
      b->batchnorm_forward_training(fused, 1e-3f, x.data(), gamma.data(), beta.data(), fy.data(),
                                    fmean.data(), fvar.data());
      b->batchnorm_backward(fused, 1e-3f, x.data(), fy.data(), dy.data(), gamma.data(),
                            fmean.data(), fvar.data(), fdx.data(), fdgamma.data(), fdbeta.data());
      CHECK(fy == relu_y);
      CHECK(fmean == mean);
      CHECK(fvar == var);
      CHECK(fdx == dx);
      CHECK(fdgamma == dgamma);
      CHECK(fdbeta == dbeta);
      CHECK(std::count(fy.begin(), fy.end(), 0.0f) > 0);  // the ReLU cut something
      Floats iy(s.count()), irelu(s.count()), ify(s.count());
      b->batchnorm_forward_inference(s, 1e-3f, x.data(), gamma.data(), beta.data(), mean.data(),
                                     var.data(), iy.data());
      b->relu_forward(s.count(), iy.data(), irelu.data());
      b->batchnorm_forward_inference(fused, 1e-3f, x.data(), gamma.data(), beta.data(), mean.data(),
                                     var.data(), ify.data());
      CHECK(ify == irelu);
    }
  }
}

TEST_CASE("host backends move statistics by Keras's rule, from the shards' mean", "[batch_norm]") {
  for (auto make : {make_reference_backend, make_dnnl_backend}) {
    std::unique_ptr<Backend> b = make(MathMode::kFloat32);
    Floats moving = {0.0f, 1.0f}, summed = {3.0f, 6.0f};  // two shards' means 1 and 2, sum 3
    b->moving_average_update(2, 0.9f, 2, summed.data(), moving.data());
    CHECK(moving[0] == 0.0f * 0.9f + 1.5f * (1.0f - 0.9f));
    CHECK(moving[1] == 1.0f * 0.9f + 3.0f * (1.0f - 0.9f));
  }
}

TEST_CASE("a graph with batch normalization: gradients match finite differences", "[batch_norm]") {
  // conv, bn, relu, then the relu's output added to the conv's: bn's input fans out.
  std::string json = kNormModel;
  json.replace(json.find("relu_in"), 7, "conv");
  std::unique_ptr<Backend> backend = make_reference_backend();
  const int n = 4;
  Model model(spec_of(json), *backend, n);
  model.initialize(2);
  std::vector<std::string> names;
  for (const ParamInfo& p : model.parameter_infos()) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"conv.kernel", "conv.bias", "bn.gamma", "bn.beta",
                                          "logits.kernel", "logits.bias"});
  REQUIRE(model.state_infos().size() == 2);
  CHECK(model.state_infos()[0].name == "bn.moving_mean");
  CHECK(model.state_infos()[1].name == "bn.moving_variance");
  CHECK(model.state().to_host() == Floats{0, 0, 0, 1, 1, 1});
  CHECK(model.statistics().size() == 6);

  Floats x = random_floats(size_t(n) * 50, 11);
  std::vector<int32_t> labels = {0, 2, 1, 2};
  auto loss = [&](Floats* grads) {
    const float* logits = model.forward(x.data(), n, StepKey{1, 0, 0}, true);
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
  // Parameters 0-56 are the convolution's, 57-62 gamma and beta: check all of those.
  Floats params = model.parameters().to_host();
  const float h = 1e-3f;
  const double center = loss(nullptr);
  size_t compared = 0;
  for (size_t i = 0; i < 63; ++i) {
    Floats moved = params;
    moved[i] = params[i] + h;
    model.parameters().from_host(moved);
    double up = loss(nullptr);
    moved[i] = params[i] - h;
    model.parameters().from_host(moved);
    double down = loss(nullptr);
    double forward = (up - center) / h, backward = (center - down) / h;
    if (std::abs(forward - backward) >
        0.1 * std::max({std::abs(forward), std::abs(backward), 1e-2}))
      continue;  // a ReLU's kink
    double numeric = (up - down) / (2 * h);
    INFO("parameter " << i << ": backward " << grads[i] << ", finite difference " << numeric);
    CHECK(std::abs(numeric - grads[i]) / std::max(1e-2, std::abs(numeric)) < 0.05);
    ++compared;
  }
  CHECK(compared > 55);
}

// The model fuses a ReLU into the batch normalization before it when that is its only user, in
// training and in inference; a batch normalization with another user keeps its ReLU apart.
TEST_CASE("a ReLU that is batch normalization's only user runs inside it", "[batch_norm]") {
  std::unique_ptr<Backend> dnnl = make_dnnl_backend();
  auto labels_of = [&](const std::string& json, bool training) {
    ProfiledBackend profiled(*dnnl);
    Model model(spec_of(json), profiled, 4);
    model.initialize(3);
    Floats x = random_floats(4 * 50, 12);
    model.forward(x.data(), 4, StepKey{}, training);
    if (training) model.backward(4);
    std::vector<std::string> labels;
    for (const OpTime& row : profiled.table())
      labels.push_back(row.label.substr(0, row.label.find(' ')));
    return labels;
  };
  const char* kFused = R"({"model": {"input_shape": [5, 5, 2], "layers": [
    {"type": "conv2d", "filters": 3, "kernel_size": 3}, {"type": "batch_normalization"},
    {"type": "relu"}, {"type": "flatten"}, {"type": "dense", "units": 3}]}})";
  auto has = [](const std::vector<std::string>& labels, const char* label) {
    return std::find(labels.begin(), labels.end(), label) != labels.end();
  };
  std::vector<std::string> training = labels_of(kFused, true);
  CHECK(has(training, "batchnorm_forward_training+relu"));
  CHECK(has(training, "batchnorm_backward+relu"));
  CHECK_FALSE(has(training, "relu_forward"));
  CHECK_FALSE(has(training, "relu_backward"));
  std::vector<std::string> inference = labels_of(kFused, false);
  CHECK(has(inference, "batchnorm_forward_inference+relu"));
  CHECK_FALSE(has(inference, "relu_forward"));
  // kNormModel: the add takes batch normalization's output too.
  std::string shared = kNormModel;
  shared.replace(shared.find("relu_in"), 7, "bn");
  training = labels_of(shared, true);
  CHECK(has(training, "batchnorm_forward_training"));
  CHECK(has(training, "relu_forward"));
  CHECK(has(training, "relu_backward"));
}

namespace {

// One training step of json's model (then an inference forward) for the fusion tests, from the
// parameters first_params holds (the first run's own, kept there): the logits, the gradients,
// the inference outputs, and the training step's profile (labels: each row's operation name;
// rows: the whole labels).
struct FusionRun {
  Floats logits, grads, inference;
  std::vector<std::string> labels, rows;
  long count(const char* label) const { return std::count(labels.begin(), labels.end(), label); }
};
FusionRun run_fusion_step(Backend& backend, const std::string& json, int n, const Floats& x,
                          const Floats& dlogits, uint64_t seed, Floats& first_params) {
  ProfiledBackend profiled(backend);
  Model model(spec_of(json), profiled, n);
  model.initialize(seed);
  if (first_params.empty())
    first_params = model.parameters().to_host();
  else
    backend.device().upload(model.parameters().data(), first_params.data(),
                            first_params.size() * sizeof(float));
  FusionRun r;
  const float* logits = model.forward(x.data(), n, StepKey{}, true);
  r.logits.assign(logits, logits + size_t(n) * 3);
  std::copy(dlogits.begin(), dlogits.end(), model.logits_gradient());
  model.backward(n);
  r.grads = model.gradients().to_host();
  for (const OpTime& row : profiled.table()) {
    r.labels.push_back(row.label.substr(0, row.label.find(' ')));
    r.rows.push_back(row.label);
  }
  const float* inferred = model.forward(x.data(), n, StepKey{}, false);
  r.inference.assign(inferred, inferred + size_t(n) * 3);
  return r;
}

}  // namespace

// A ReLU that is an add's only user (a residual block's end) runs inside the add
// (docs/design.md#fusion): one pass for the sum and the ReLU, and the ReLU's mask written straight
// into the first input's gradient, with the last share of the add's own gradient added as it is.
// The model computes what it computes with the two layers apart (here kept apart by an exact
// identity, a Rescaling by 1, between them), bit for bit.
TEST_CASE("a ReLU that is an add's only user runs inside it, with the two layers' bits",
          "[fusion]") {
  const std::string fused = R"({"model": {"input_shape": [6, 6, 2], "layers": [
    {"name": "a", "type": "conv2d", "filters": 4, "kernel_size": 3, "padding": "same"},
    {"name": "b", "type": "conv2d", "filters": 4, "kernel_size": 3, "padding": "same"},
    {"name": "sum", "type": "add", "inputs": ["a", "b"]},
    {"name": "cut", "type": "relu", "inputs": ["sum"]},
    {"name": "c", "type": "conv2d", "filters": 4, "kernel_size": 3, "padding": "same"},
    {"name": "sum2", "type": "add", "inputs": ["cut", "c"]},
    {"type": "flatten"},
    {"name": "logits", "type": "dense", "units": 3}]}})";
  std::string apart = fused;
  apart.replace(apart.find(R"({"name": "cut", "type": "relu", "inputs": ["sum"]})"),
                std::string(R"({"name": "cut", "type": "relu", "inputs": ["sum"]})").size(),
                R"({"name": "same", "type": "rescaling", "scale": 1, "inputs": ["sum"]},
                   {"name": "cut", "type": "relu", "inputs": ["same"]})");
  for (auto make : {make_reference_backend, make_dnnl_backend}) {
    std::unique_ptr<Backend> backend = make(MathMode::kFloat32);
    const int n = 3;
    Floats x = random_floats(size_t(n) * 72, 21), dlogits = random_floats(size_t(n) * 3, 22);
    Floats first_params;
    const FusionRun f = run_fusion_step(*backend, fused, n, x, dlogits, 5, first_params);
    const FusionRun a = run_fusion_step(*backend, apart, n, x, dlogits, 5, first_params);
    INFO(backend->name());
    CHECK(f.logits == a.logits);
    CHECK(f.grads == a.grads);
    CHECK(f.count("add_forward+relu") == 1);
    CHECK(f.count("relu_forward") == 0);
    CHECK(a.count("relu_forward") == 1);
    // The mask is relu_backward's apart; fused, the add applies it as it adds c's share of the
    // gradient, which the model leaves for it (c is the sum's last user in backward).
    CHECK(f.count("relu_backward_added") == 1);
    CHECK(f.count("relu_backward") == 0);
    CHECK(a.count("relu_backward") == 1);
  }
}

// An add that is a batch normalization's only user (a residual block's end: bn(conv(x)) + x,
// then a ReLU) runs inside the normalization's output pass (Layer::fuse_add,
// docs/design.md#fusion). The model computes what it computes with the layers apart (kept apart by
// an exact identity that keeps the layout, a linear Activation, between them), bit for bit, in
// training and inference, blocked (16 channels, on the oneDNN backend where it blocks) and plain;
// the projection's add takes the later of its two normalizations.
TEST_CASE("an add after batch normalization runs inside it, with the layers' bits", "[fusion]") {
  const std::string fused = R"({"model": {"input_shape": [5, 5, 16], "layers": [
    {"name": "stem", "type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same",
     "use_bias": false},
    {"name": "c", "type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same",
     "use_bias": false},
    {"name": "bn", "type": "batch_normalization"},
    {"name": "sum", "type": "add", "inputs": ["bn", "stem"]},
    {"name": "out", "type": "relu"},
    {"name": "d", "type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same"},
    {"name": "bn_d", "type": "batch_normalization"},
    {"name": "e", "type": "conv2d", "filters": 16, "kernel_size": 1, "inputs": ["out"]},
    {"name": "bn_e", "type": "batch_normalization"},
    {"name": "sum2", "type": "add", "inputs": ["bn_d", "bn_e"]},
    {"type": "global_average_pooling2d"},
    {"name": "logits", "type": "dense", "units": 3}]}})";
  std::string apart = fused;
  for (const char* name : {"bn", "bn_e"}) {
    const std::string layer =
        std::string(R"({"name": ")") + name + R"(", "type": "batch_normalization"})";
    apart.replace(apart.find(layer), layer.size(),
                  layer + R"(, {"name": ")" + name +
                      R"(_same", "type": "activation", "activation": "linear"})");
  }
  apart.replace(apart.find(R"(["bn", "stem"])"), 14, R"(["bn_same", "stem"])");
  apart.replace(apart.find(R"(["bn_d", "bn_e"])"), 16, R"(["bn_d", "bn_e_same"])");
  for (auto make : {make_reference_backend, make_dnnl_backend}) {
    std::unique_ptr<Backend> backend = make(MathMode::kFloat32);
    const int n = 3;
    Floats x = random_floats(size_t(n) * 400, 31), dlogits = random_floats(size_t(n) * 3, 32);
    Floats first_params;
    const FusionRun f = run_fusion_step(*backend, fused, n, x, dlogits, 7, first_params);
    const FusionRun a = run_fusion_step(*backend, apart, n, x, dlogits, 7, first_params);
    INFO(backend->name());
    CHECK(f.logits == a.logits);
    CHECK(f.grads == a.grads);
    CHECK(f.inference == a.inference);
    CHECK(f.count("batchnorm_add_forward_training+relu") == 1);
    CHECK(f.count("batchnorm_add_forward_training") == 1);
    CHECK(f.count("add_forward+relu") + f.count("add_forward") == 0);
    CHECK(a.count("add_forward+relu") == 1);
    CHECK(a.count("add_forward") == 1);
    // The fused pass ran in blocks of channels where the backend blocks them.
    const bool blocked_add = std::any_of(f.rows.begin(), f.rows.end(), [](const std::string& r) {
      return r.rfind("batchnorm_add", 0) == 0 && r.find(" blocked") != std::string::npos;
    });
    CHECK(blocked_add == backend->blocks_channels());
  }
}

// Batch normalization writes a bf16 copy of its output for the convolution after it, and of its
// input's gradient for the convolution before it (docs/design.md#rounded-copies), where the
// backend makes rounded copies (oneDNN in mixed_bfloat16 with AVX512_BF16). The convolutions
// read them instead of rounding the tensors themselves: the model computes what it computes with
// the copies cut off (an exact identity, a linear Activation, after every convolution and every
// normalization), bit for bit, over three training steps on different examples with an inference
// after each (a copy from an earlier pass is never read), the last on a smaller batch. Where a
// convolution reads only the copy of its output's gradient, the normalization does not write the
// float gradient at all, and where convolutions alone read a normalization's output, that
// output is written only as its copy.
TEST_CASE("convolutions read the rounded copies batch normalization writes, same bits",
          "[fusion][bf16]") {
  if (!cpu_supports(MathMode::kBfloat16)) return;  // test_backend_parity checks the refusal
  const std::string with_copies = R"({"model": {"input_shape": [5, 5, 16], "layers": [
    {"name": "stem", "type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same",
     "use_bias": false},
    {"name": "bn0", "type": "batch_normalization"},
    {"name": "in", "type": "relu"},
    {"name": "c0", "type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same",
     "use_bias": false},
    {"name": "bn_c0", "type": "batch_normalization"},
    {"type": "relu"},
    {"name": "c", "type": "conv2d", "filters": 16, "kernel_size": 3, "padding": "same",
     "use_bias": false},
    {"name": "bn_c", "type": "batch_normalization"},
    {"name": "sum", "type": "add", "inputs": ["bn_c", "in"]},
    {"name": "out", "type": "relu"},
    {"name": "d", "type": "conv2d", "filters": 32, "kernel_size": 3, "strides": 2,
     "padding": "same", "use_bias": false},
    {"name": "bn_d", "type": "batch_normalization"},
    {"name": "e", "type": "conv2d", "filters": 32, "kernel_size": 1, "strides": 2,
     "inputs": ["out"]},
    {"name": "bn_e", "type": "batch_normalization"},
    {"name": "sum2", "type": "add", "inputs": ["bn_d", "bn_e"]},
    {"type": "global_average_pooling2d"},
    {"name": "logits", "type": "dense", "units": 3}]}})";
  std::string cut = with_copies;
  for (const char* name : {"stem", "bn0", "c0", "bn_c0", "c", "bn_c", "d", "bn_d", "e", "bn_e"}) {
    const std::string key = std::string(R"({"name": ")") + name + "\"";
    const std::string::size_type at = cut.find(key);
    const std::string::size_type end = cut.find('}', at) + 1;
    cut.replace(at, key.size(), std::string(R"({"name": ")") + name + "_raw\"");
    cut.insert(end + 4, std::string(R"(, {"name": ")") + name +
                            R"(", "type": "activation", "activation": "linear"})");
  }
  INFO(cut);
  std::unique_ptr<Backend> backend = make_dnnl_backend(MathMode::kBfloat16);
  const int n = 3;
  struct Run {
    Floats logits, grads, inference;
    std::array<size_t, 2> copies{};
  };
  Floats first_params;  // the first model's, given to the second (its nodes are numbered apart)
  auto run = [&](const std::string& json) {
    Model model(spec_of(json), *backend, n);
    model.initialize(11);
    if (first_params.empty())
      first_params = model.parameters().to_host();
    else
      backend->device().upload(model.parameters().data(), first_params.data(),
                               first_params.size() * sizeof(float));
    Run r;
    r.copies = model.rounded_copies();
    // The last step on a smaller batch: the convolutions' answers are asked per batch.
    for (uint64_t step = 0; step < 3; ++step) {
      const int m = step < 2 ? n : n - 1;
      Floats x = random_floats(size_t(m) * 400, 40 + step);
      Floats dlogits = random_floats(size_t(m) * 3, 50 + step);
      const float* logits = model.forward(x.data(), m, StepKey{}, true);
      r.logits.insert(r.logits.end(), logits, logits + size_t(m) * 3);
      std::copy(dlogits.begin(), dlogits.end(), model.logits_gradient());
      model.backward(m);
      Floats grads = model.gradients().to_host();
      r.grads.insert(r.grads.end(), grads.begin(), grads.end());
      Floats other = random_floats(size_t(m) * 400, 60 + step);
      const float* inferred = model.forward(other.data(), m, StepKey{}, false);
      r.inference.insert(r.inference.end(), inferred, inferred + size_t(m) * 3);
    }
    return r;
  };
  const Run copied = run(with_copies), apart = run(cut);
  CHECK(copied.logits == apart.logits);
  CHECK(copied.grads == apart.grads);
  CHECK(copied.inference == apart.inference);
  CHECK(apart.copies == std::array<size_t, 2>{0, 0});
  if (backend->makes_rounded_copies()) {
    // The outputs of bn0 (c0 reads it), bn_c0 (c) and the block (d and e); the gradients of
    // stem, c0, c, d and e's outputs.
    CHECK(copied.copies == std::array<size_t, 2>{3, 5});
    // c0's and c's backward read dy's copy alone, so bn_c0 and bn_c leave their float dx
    // unwritten, and c alone reads bn_c0's output, which bn_c0 writes only as its copy
    // (NormShape::rounded_only): the results above are equal only if nothing read those.
    ConvShape c;
    c.n = n, c.c = c.k = 16, c.h = c.w = 5, c.kh = c.kw = 3;
    c.pad_top = c.pad_bottom = c.pad_left = c.pad_right = 1, c.bias = 0;
    c.x_layout = c.y_layout = Layout::kBlocked;
    CHECK(backend->conv2d_backward_reads_rounded_only(c));
    CHECK(backend->conv2d_forward_reads_rounded_only(c));
    c.n = n - 1;
    CHECK(backend->conv2d_backward_reads_rounded_only(c));
    CHECK(backend->conv2d_forward_reads_rounded_only(c));
  } else {
    CHECK(copied.copies == std::array<size_t, 2>{0, 0});
  }
}

// The copies batch normalization writes in its passes have the bits of AVX512_BF16's rounding
// (the convolutions' own) at every width, subnormals, NaNs, infinities and ties included: channels
// with a zero gamma output their beta, and the others values of every size.
TEST_CASE("batch normalization's rounded copies have AVX512_BF16's bits", "[batch_norm][bf16]") {
  using direct_conv::Vectors;
  if (!bf16_rounding::vectorized()) return;  // the copies are made only where it runs
  const NormShape blocked{3, 32, 7, false, Layout::kBlocked};
  const size_t count = blocked.count();
  Floats x = random_floats(count, 70), gamma = random_floats(32, 71), beta = random_floats(32, 72);
  auto of_bits = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  };
  // NaNs (whose payload would carry into the exponent if rounded as numbers), subnormals,
  // infinities, the largest floats (one rounds up to infinity), zeros, ties to even both ways,
  // the smallest normal.
  const float specials[] = {of_bits(0x7fffffffu),
                            of_bits(0xffffffffu),
                            std::nanf(""),
                            1e-40f,
                            -1e-40f,
                            INFINITY,
                            -INFINITY,
                            3.4028235e38f,
                            -3.3e38f,
                            0.0f,
                            -0.0f,
                            1.00390625f,
                            1.01171875f,
                            1.17549435e-38f};
  for (size_t ch = 0; ch < std::size(specials); ++ch) {
    gamma[ch] = 0;  // y = beta
    beta[ch] = specials[ch];
  }
  for (size_t i = 0; i < count; i += 5) x[i] *= 1e30f;  // large values in the other channels
  const Floats addend = random_floats(count, 74), dy = random_floats(count, 73);
  auto bits_of = [](const Floats& f) {
    std::vector<uint32_t> bits(f.size());
    std::memcpy(bits.data(), f.data(), f.size() * sizeof(float));
    return bits;
  };
  // The passes with a copy and without, each way: plain; with a ReLU, its backward's mask from y
  // and from x; with an add and its ReLU.
  enum Way { kPlainWay, kReluFromY, kReluFromX, kAddRelu };
  for (Way way : {kPlainWay, kReluFromY, kReluFromX, kAddRelu}) {
    for (Vectors v : {Vectors::kPlain, Vectors::kAvx2, Vectors::kAvx512}) {
      if (!direct_conv::runs(v)) continue;
      INFO(direct_conv::vectors_name(v) << " way " << way);
      NormShape s = blocked;
      s.relu = way == kReluFromY || way == kReluFromX;
      const NormAddend add = way == kAddRelu ? NormAddend{addend.data(), true} : NormAddend{};
      struct Pass {
        Floats y, dx;
        std::vector<uint16_t> y16, dx16;
      };
      // only: the passes write the copies alone (NormShape::rounded_only) where they may; y and
      // dx keep their 7s.
      auto run = [&](bool rounded, bool only = false) {
        Pass r{Floats(count, 7.0f), Floats(count, 7.0f), std::vector<uint16_t>(count),
               std::vector<uint16_t>(count)};
        Floats mean(32), var(32), scale(32), shift(32), dgamma(32), dbeta(32);
        NormShape t = s;
        t.rounded = rounded ? r.y16.data() : nullptr;
        const bool from_x = way == kReluFromX;
        // The forward's copy alone where its backward does not read y (no add taken in).
        const bool y_alone = only && (way == kPlainWay || from_x);
        t.rounded_only = y_alone;
        host_batchnorm_forward_training(t, 1e-3f, x.data(), gamma.data(), beta.data(), r.y.data(),
                                        mean.data(), var.data(), v, from_x ? scale.data() : nullptr,
                                        from_x ? shift.data() : nullptr, add);
        t.rounded = rounded ? r.dx16.data() : nullptr;
        t.rounded_only = only;
        host_batchnorm_backward(t, 1e-3f, x.data(), y_alone ? nullptr : r.y.data(), dy.data(),
                                gamma.data(), mean.data(), var.data(), r.dx.data(), dgamma.data(),
                                dbeta.data(), v, from_x ? scale.data() : nullptr,
                                from_x ? shift.data() : nullptr);
        return r;
      };
      const Pass with = run(true), alone = run(false), copy_only = run(true, true);
      // The values are those of the passes without a copy; the copies, AVX512_BF16's rounding.
      CHECK(bits_of(with.y) == bits_of(alone.y));
      CHECK(bits_of(with.dx) == bits_of(alone.dx));
      std::vector<uint16_t> expected(count);
      REQUIRE(bf16_rounding::round_vectorized(with.y.data(), count, expected.data()));
      CHECK(with.y16 == expected);
      REQUIRE(bf16_rounding::round_vectorized(with.dx.data(), count, expected.data()));
      CHECK(with.dx16 == expected);
      // The copy alone: the same copies, and dx not written.
      CHECK(copy_only.y16 == with.y16);
      CHECK(copy_only.dx16 == with.dx16);
      CHECK(copy_only.dx == Floats(count, 7.0f));
      if (way == kPlainWay || way == kReluFromX)
        CHECK(copy_only.y == Floats(count, 7.0f));
      else
        CHECK(bits_of(copy_only.y) == bits_of(with.y));
    }
  }
}

TEST_CASE("training normalizes by the batch, inference by the moving statistics", "[batch_norm]") {
  const char* json = R"({"model": {"input_shape": [1, 1, 2], "layers": [
    {"type": "flatten"}, {"type": "batch_normalization", "momentum": 0.5, "epsilon": 1e-9}]}})";
  std::unique_ptr<Backend> backend = make_reference_backend();
  Model model(spec_of(json), *backend, 4);
  model.initialize(1);
  // Feature 0: 1 3 5 7 (mean 4, variance 5); feature 1: 2 2 4 4 (mean 3, variance 1).
  Floats x = {1, 2, 3, 2, 5, 4, 7, 4};
  const float* y = model.forward(x.data(), 4, StepKey{}, true);
  CHECK(y[0] == Approx(-3 / std::sqrt(5.0)));
  CHECK(y[1] == Approx(-1.0));
  CHECK(model.statistics().to_host() == Floats{4, 3, 5, 1});  // means, then variances
  model.update_state(1);
  CHECK(model.state().to_host() == Floats{2, 1.5, 3, 1});  // half the initial, half the batch's
  y = model.forward(x.data(), 4, StepKey{}, false);
  CHECK(y[0] == Approx((1 - 2) / std::sqrt(3.0)));
  CHECK(y[1] == Approx(0.5));
}

TEST_CASE("batch_normalization takes Keras's keys and refuses what it cannot do", "[batch_norm]") {
  auto error = [](const std::string& keys) {
    try {
      spec_of(R"({"model": {"input_shape": [2, 2, 1], "layers": [{"type": "batch_normalization")" +
              keys + R"(}, {"type": "flatten"}, {"type": "dense", "units": 2}]}})");
    } catch (const common::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(error(R"(, "axis": -1, "momentum": 0.9, "epsilon": 0.001, "center": false)") == "accepted");
  CHECK(error(R"(, "axis": [3])") == "accepted");
  CHECK_THAT(error(R"(, "axis": 1)"), StartsWith("model.layers[0].axis: axis 1 is not supported"));
  CHECK(error(R"(, "synchronized": true)") == "accepted");
  CHECK_THAT(error(R"(, "synchronized": 1)"), StartsWith("model.layers[0].synchronized:"));
  CHECK_THAT(error(R"(, "momentum": 2)"), StartsWith("model.layers[0].momentum:"));
  CHECK_THAT(error(R"(, "renorm": true)"), StartsWith("model.layers[0]: unknown key \"renorm\""));
}
