// The oneDNN backend against the reference, method by method, on the same random inputs: conv
// (odd sizes, kernels 1-5, strides 1-3, valid, Keras "same" and asymmetric padding), dense, relu,
// max pooling (outputs and dx only: the two workspaces have different formats), softmax
// cross-entropy, SGD and Adam; and bit-identical repeat runs of the oneDNN backend. Tolerances
// are float32 rounding-error bounds, derived where each is used; nothing here checks speed.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "test/support/mean_loss.h"
#include "worker/nn/backend.h"
#include "worker/nn/bf16_rounding.h"
#include "worker/nn/bf16_weight_grad.h"
#include "worker/nn/direct_conv.h"
#include "worker/nn/streamed_update.h"
#include "worker/train/loss_scale.h"

using namespace dtrain::nn;

namespace {

using Floats = std::vector<float>;

/// float32's unit roundoff: one rounding changes a value by at most this fraction of it.
constexpr double kUnit = 0x1p-24;

class Rng {
 public:
  explicit Rng(uint32_t seed) : engine_(seed) {}
  double uniform(double lo, double hi) { return lo + (hi - lo) * (engine_() / 4294967296.0); }
  int integer(int lo, int hi) { return lo + static_cast<int>(engine_() % (hi - lo + 1)); }
  Floats floats(size_t count, double lo, double hi) {
    Floats out(count);
    for (float& v : out) v = static_cast<float>(uniform(lo, hi));
    return out;
  }

 private:
  std::mt19937 engine_;
};

/// The oneDNN backend and its oracle in one math mode: in mixed_bfloat16 the reference rounds
/// each product's inputs to bf16 and sums exactly, so the same float32 bounds hold.
struct Backends {
  explicit Backends(MathMode mode = MathMode::kFloat32)
      : dnnl(make_dnnl_backend(mode)), ref(make_reference_backend(mode)) {}
  std::unique_ptr<Backend> dnnl;
  std::unique_ptr<Backend> ref;
};

Floats abs_of(Floats v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

/// Checks |got[i] - want[i]| <= tolerance[i] everywhere and names the worst element.
void check_within(const std::string& what, const Floats& got, const Floats& want,
                  const std::vector<double>& tolerance) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double excess = std::fabs(double{got[i]} - want[i]) - tolerance[i];
    if (excess > worst || std::isnan(got[i])) worst = std::isnan(got[i]) ? 1.0 : excess, at = i;
  }
  INFO(what << ": element " << at << " of " << got.size() << ": oneDNN " << got[at] << " reference "
            << want[at] << " tolerance " << tolerance[at]);
  CHECK(worst <= 0.0);
}

/// For outputs that are sums of `terms` products (bias included), computed in float32 in any
/// order, with or without FMA: the error is at most gamma_terms * sum|products| (Higham, Accuracy
/// and Stability, 3.1), and the reference adds one rounding of its double sum, u * |y|. The sum
/// of |products| per element is the reference run on |inputs|; 1% covers its own rounding.
void check_sums(const std::string& what, const Floats& got, const Floats& want,
                const Floats& magnitude, double terms) {
  std::vector<double> tolerance(magnitude.size());
  for (size_t i = 0; i < magnitude.size(); ++i)
    tolerance[i] = 1.01 * (terms + 2) * kUnit * magnitude[i];
  check_within(what, got, want, tolerance);
}

void check_equal(const std::string& what, const Floats& got, const Floats& want) {
  check_within(what, got, want, std::vector<double>(got.size(), 0.0));
}

std::string describe(const ConvShape& s) {
  std::ostringstream out;
  out << "conv n=" << s.n << " c=" << s.c << " h=" << s.h << " w=" << s.w << " k=" << s.k
      << " kernel " << s.kh << "x" << s.kw << " stride " << s.sh << "x" << s.sw << " pads "
      << s.pad_top << "/" << s.pad_bottom << " " << s.pad_left << "/" << s.pad_right;
  return out.str();
}

enum class Padding { kValid, kKerasSame, kAsymmetric };

/// Padding along one axis: Keras "same" puts the odd one at the end; kAsymmetric always pads
/// one more at the end (never more than kernel - 1 in all, as Keras never does).
void pad_axis(Padding mode, int size, int kernel, int stride, int* before, int* after) {
  *before = *after = 0;
  if (mode == Padding::kKerasSame) {
    int total = std::max(((size + stride - 1) / stride - 1) * stride + kernel - size, 0);
    *before = total / 2, *after = total - total / 2;
  } else if (mode == Padding::kAsymmetric && kernel >= 2) {
    *before = (kernel - 2) / 2, *after = *before + 1;
  }
}

ConvShape random_conv_shape(Rng& rng, Padding mode) {
  ConvShape s;
  s.n = 3, s.c = rng.integer(2, 5), s.h = rng.integer(5, 13), s.w = rng.integer(5, 13);
  s.k = rng.integer(1, 6), s.kh = rng.integer(1, 5), s.kw = rng.integer(1, 5);
  s.sh = rng.integer(1, 3), s.sw = rng.integer(1, 3);
  pad_axis(mode, s.h, s.kh, s.sh, &s.pad_top, &s.pad_bottom);
  pad_axis(mode, s.w, s.kw, s.sw, &s.pad_left, &s.pad_right);
  return s;
}

struct ConvData {
  Floats x, w, b, dy;
};

ConvData random_conv_data(const ConvShape& s, Rng& rng) {
  return {rng.floats(s.input_count(), -1, 1), rng.floats(s.weight_count(), -1, 1),
          rng.floats(s.k, -1, 1), rng.floats(s.output_count(), -1, 1)};
}

void check_conv_parity(Backends& be, const ConvShape& s, const ConvData& d) {
  Floats got(s.output_count()), want(s.output_count()), mag(s.output_count());
  be.dnnl->conv2d_forward(s, d.x.data(), d.w.data(), d.b.data(), got.data());
  be.ref->conv2d_forward(s, d.x.data(), d.w.data(), d.b.data(), want.data());
  be.ref->conv2d_forward(s, abs_of(d.x).data(), abs_of(d.w).data(), abs_of(d.b).data(), mag.data());
  check_sums("conv y", got, want, mag, s.c * s.kh * s.kw + 1);

  got.assign(s.input_count(), 0), want.assign(s.input_count(), 0), mag.assign(s.input_count(), 0);
  be.dnnl->conv2d_backward_data(s, d.dy.data(), d.w.data(), got.data());
  be.ref->conv2d_backward_data(s, d.dy.data(), d.w.data(), want.data());
  be.ref->conv2d_backward_data(s, abs_of(d.dy).data(), abs_of(d.w).data(), mag.data());
  check_sums("conv dx", got, want, mag, s.k * s.kh * s.kw);

  Floats got_w(s.weight_count()), want_w(s.weight_count()), mag_w(s.weight_count());
  Floats got_b(s.k), want_b(s.k), mag_b(s.k);
  be.dnnl->conv2d_backward_weights(s, d.x.data(), d.dy.data(), got_w.data(), got_b.data());
  be.ref->conv2d_backward_weights(s, d.x.data(), d.dy.data(), want_w.data(), want_b.data());
  be.ref->conv2d_backward_weights(s, abs_of(d.x).data(), abs_of(d.dy).data(), mag_w.data(),
                                  mag_b.data());
  check_sums("conv dw", got_w, want_w, mag_w, s.n * s.oh() * s.ow());
  if (s.bias) check_sums("conv db", got_b, want_b, mag_b, s.n * s.oh() * s.ow());
}

void check_dense_parity(Backends& be, int n, int in, int out, Rng& rng) {
  const Floats x = rng.floats(n * in, -1, 1), w = rng.floats(in * out, -1, 1);
  const Floats b = rng.floats(out, -1, 1), dy = rng.floats(n * out, -1, 1);
  Floats got(n * out), want(n * out), mag(n * out);
  be.dnnl->dense_forward(n, in, out, x.data(), w.data(), b.data(), got.data());
  be.ref->dense_forward(n, in, out, x.data(), w.data(), b.data(), want.data());
  be.ref->dense_forward(n, in, out, abs_of(x).data(), abs_of(w).data(), abs_of(b).data(),
                        mag.data());
  check_sums("dense y", got, want, mag, in + 1);

  got.assign(n * in, 0), want.assign(n * in, 0), mag.assign(n * in, 0);
  be.dnnl->dense_backward_data(n, in, out, dy.data(), w.data(), got.data());
  be.ref->dense_backward_data(n, in, out, dy.data(), w.data(), want.data());
  be.ref->dense_backward_data(n, in, out, abs_of(dy).data(), abs_of(w).data(), mag.data());
  check_sums("dense dx", got, want, mag, out);

  Floats got_w(in * out), want_w(in * out), mag_w(in * out), got_b(out), want_b(out), mag_b(out);
  be.dnnl->dense_backward_weights(n, in, out, x.data(), dy.data(), got_w.data(), got_b.data());
  be.ref->dense_backward_weights(n, in, out, x.data(), dy.data(), want_w.data(), want_b.data());
  be.ref->dense_backward_weights(n, in, out, abs_of(x).data(), abs_of(dy).data(), mag_w.data(),
                                 mag_b.data());
  check_sums("dense dw", got_w, want_w, mag_w, n);
  check_sums("dense db", got_b, want_b, mag_b, n);
}

/// count distinct values (multiples of 1/64, exact in float) in random order: pools see no ties.
Floats distinct_values(size_t count, Rng& rng) {
  Floats out(count);
  for (size_t i = 0; i < count; ++i) out[i] = (static_cast<float>(i) - count / 2.0f) / 64;
  for (size_t i = count - 1; i > 0; --i)
    std::swap(out[i], out[rng.integer(0, static_cast<int>(i))]);
  return out;
}

/// A workspace of the backend's own size and format, aligned for any element type.
std::vector<uint64_t> workspace_for(Backend& be, const PoolShape& s) {
  return std::vector<uint64_t>(be.maxpool_workspace_bytes(s) / sizeof(uint64_t) + 1);
}

/// Maxima are copied, so y must match exactly; dx sums the dy of every window (at most
/// ceil(kh/sh) * ceil(kw/sw)) whose maximum an input is.
void check_pool_parity(Backends& be, const PoolShape& s, Rng& rng) {
  const size_t in_count = s.input_count();
  const size_t out_count = static_cast<size_t>(s.n) * s.c * s.oh() * s.ow();
  const Floats x = distinct_values(in_count, rng), dy = rng.floats(out_count, -1, 1);
  auto ws_dnnl = workspace_for(*be.dnnl, s), ws_ref = workspace_for(*be.ref, s);
  Floats got(out_count), want(out_count);
  be.dnnl->maxpool_forward(s, x.data(), got.data(), ws_dnnl.data());
  be.ref->maxpool_forward(s, x.data(), want.data(), ws_ref.data());
  check_equal("pool y", got, want);

  Floats got_dx(in_count), want_dx(in_count), mag(in_count);
  be.dnnl->maxpool_backward(s, dy.data(), ws_dnnl.data(), got_dx.data());
  be.ref->maxpool_backward(s, dy.data(), ws_ref.data(), want_dx.data());
  be.ref->maxpool_backward(s, abs_of(dy).data(), ws_ref.data(), mag.data());
  const int overlap = ((s.kh + s.sh - 1) / s.sh) * ((s.kw + s.sw - 1) / s.sw);
  check_sums("pool dx", got_dx, want_dx, mag, overlap);
}

/// Logits in [-4, 4] whose top two in each row differ by at least 1e-3, so that the arg-max
/// cannot depend on rounding.
Floats separated_logits(int n, int classes, Rng& rng) {
  Floats out;
  for (int i = 0; i < n; ++i) {
    Floats row;
    do {
      row = rng.floats(classes, -4, 4);
      std::sort(row.begin(), row.end());
    } while (classes > 1 && row[classes - 1] - row[classes - 2] < 1e-3f);
    for (int j = classes - 1; j > 0; --j) std::swap(row[j], row[rng.integer(0, j)]);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

/// Loss: per row log(sum_j exp(z_j - max)) - (z_label - max). In float32 the sum of C terms
/// costs C u relative, exp and log a few u each plus u |z - max| <= 8 u from their arguments, and
/// the mean of n rows n u: 4 (C + n + 8 + 2 * 8) u (1 + |loss|) leaves a factor 4 for libm or
/// oneDNN's exp. dlogits = (p - onehot) / n with |p - onehot| <= 1, and p carries the same
/// relative error: 4 (C + 8 + 2 * 8) u / n. The count of correct rows must match exactly.
void check_softmax_parity(Backends& be, int n, int classes, Rng& rng) {
  const Floats logits = separated_logits(n, classes, rng);
  std::vector<int32_t> labels(n);
  for (int i = 0; i < n; ++i) {
    auto row = logits.begin() + static_cast<std::ptrdiff_t>(i) * classes;
    labels[i] = i % 2 == 0 ? static_cast<int32_t>(std::max_element(row, row + classes) - row)
                           : rng.integer(0, classes - 1);
  }
  Floats got(logits.size()), want(logits.size());
  int got_correct = -1, want_correct = -2;
  const float got_loss = dtrain::testing::mean_softmax_loss(
      *be.dnnl, n, classes, logits.data(), labels.data(), got.data(), &got_correct);
  const float want_loss = dtrain::testing::mean_softmax_loss(
      *be.ref, n, classes, logits.data(), labels.data(), want.data(), &want_correct);
  const double loss_bound = 4 * (classes + n + 8 + 16) * kUnit * (1 + std::fabs(want_loss));
  check_within("softmax loss", {got_loss}, {want_loss}, {loss_bound});
  check_within("softmax dlogits", got, want,
               std::vector<double>(got.size(), 4 * (classes + 8 + 16) * kUnit / n));
  CHECK(got_correct == want_correct);
}

/// Each new value is a few float32 operations on terms no larger than |w| + |v| + |g| (learning
/// rate and momentum are at most 1), each rounding once: 8 u of that sum bounds them.
void check_sgd_parity(Backends& be, const SgdParams& p, Rng& rng) {
  const size_t count = 1001;
  const Floats w = rng.floats(count, -2, 2), g = rng.floats(count, -1, 1);
  const Floats v = rng.floats(count, -0.5, 0.5);
  Floats got_w = w, want_w = w, got_v = v, want_v = v;
  const bool momentum = p.momentum != 0.0f;
  be.dnnl->sgd_update(p, count, got_w.data(), g.data(), momentum ? got_v.data() : nullptr);
  be.ref->sgd_update(p, count, want_w.data(), g.data(), momentum ? want_v.data() : nullptr);
  std::vector<double> w_bound(count), v_bound(count);
  for (size_t i = 0; i < count; ++i) {
    w_bound[i] = 8 * kUnit * (std::fabs(w[i]) + std::fabs(v[i]) + std::fabs(g[i]));
    v_bound[i] = 8 * kUnit * (std::fabs(v[i]) + std::fabs(g[i]));
  }
  check_within("sgd w", got_w, want_w, w_bound);
  if (momentum) check_within("sgd velocity", got_v, want_v, v_bound);
}

/// m and v: two products and a sum, 8 u (|m| + |g|) and 8 u (v + g^2). w: 8 u |w| for the
/// subtraction plus the update's error. Keras computes lr_t in float32, where 1 - beta_2^t loses
/// up to log2(1 / (1 - beta_2)) ~ 10 bits at small t, so allow 2048 u of the update, whose size
/// is at most lr_t (|m| + |g|) / (sqrt(v_new) + epsilon).
void check_adam_parity(Backends& be, const AdamParams& p, int64_t step, Rng& rng) {
  const size_t count = 1001;
  const Floats w = rng.floats(count, -2, 2), g = rng.floats(count, -1, 1);
  const Floats m = rng.floats(count, -0.5, 0.5), v = rng.floats(count, 0, 0.5);
  Floats got_w = w, want_w = w, got_m = m, want_m = m, got_v = v, want_v = v;
  be.dnnl->adam_update(p, step, count, got_w.data(), g.data(), got_m.data(), got_v.data());
  be.ref->adam_update(p, step, count, want_w.data(), g.data(), want_m.data(), want_v.data());
  const double t = static_cast<double>(step);
  const double lr_t = p.learning_rate * std::sqrt(1 - std::pow(double{p.beta_2}, t)) /
                      (1 - std::pow(double{p.beta_1}, t));
  std::vector<double> w_bound(count), m_bound(count), v_bound(count);
  for (size_t i = 0; i < count; ++i) {
    const double update =
        lr_t * (std::fabs(m[i]) + std::fabs(g[i])) / (std::sqrt(want_v[i]) + p.epsilon);
    w_bound[i] = 8 * kUnit * std::fabs(w[i]) + 2048 * kUnit * update;
    m_bound[i] = 8 * kUnit * (std::fabs(m[i]) + std::fabs(g[i]));
    v_bound[i] = 8 * kUnit * (v[i] + double{g[i]} * g[i]);
  }
  check_within("adam w", got_w, want_w, w_bound);
  check_within("adam m", got_m, want_m, m_bound);
  check_within("adam v", got_v, want_v, v_bound);
}

/// Conv, relu and pooling, forward and backward, on a shape large enough that oneDNN splits the
/// work across threads; appends every output.
void run_conv_layers(Backend& be, Rng& rng, std::vector<Floats>& out) {
  ConvShape s;
  s.n = 8, s.c = 16, s.h = 27, s.w = 27, s.k = 16, s.kh = 3, s.kw = 3;
  s.pad_top = s.pad_left = s.pad_bottom = s.pad_right = 1;
  const ConvData d = random_conv_data(s, rng);
  Floats y(s.output_count()), dx(s.input_count()), dw(s.weight_count()), db(s.k);
  be.conv2d_forward(s, d.x.data(), d.w.data(), d.b.data(), y.data());
  be.conv2d_backward_data(s, d.dy.data(), d.w.data(), dx.data());
  be.conv2d_backward_weights(s, d.x.data(), d.dy.data(), dw.data(), db.data());
  PoolShape p;
  p.n = 8, p.c = 16, p.h = 27, p.w = 27, p.kh = 3, p.kw = 3, p.sh = 2, p.sw = 2;
  auto ws = workspace_for(be, p);
  Floats pooled(static_cast<size_t>(p.n) * p.c * p.oh() * p.ow()), pool_dx(y.size());
  be.relu_forward(y.size(), y.data(), y.data());
  be.maxpool_forward(p, y.data(), pooled.data(), ws.data());
  be.maxpool_backward(p, pooled.data(), ws.data(), pool_dx.data());
  be.relu_backward(y.size(), y.data(), pool_dx.data(), pool_dx.data());
  out.insert(out.end(), {y, dx, dw, db, pooled, pool_dx});
}

/// Dense, softmax cross-entropy, and three steps of each optimizer on the dense gradient.
void run_dense_layers(Backend& be, Rng& rng, std::vector<Floats>& out) {
  const int n = 64, in = 301, classes = 10;
  const Floats x = rng.floats(n * in, -1, 1), w = rng.floats(in * classes, -1, 1);
  const Floats b = rng.floats(classes, -1, 1);
  Floats logits(n * classes), dlogits(n * classes), dx(n * in), dw(in * classes), db(classes);
  const std::vector<int32_t> labels(n, 3);
  int correct = 0;
  be.dense_forward(n, in, classes, x.data(), w.data(), b.data(), logits.data());
  float loss = dtrain::testing::mean_softmax_loss(be, n, classes, logits.data(), labels.data(),
                                                  dlogits.data(), &correct);
  be.dense_backward_data(n, in, classes, dlogits.data(), w.data(), dx.data());
  be.dense_backward_weights(n, in, classes, x.data(), dlogits.data(), dw.data(), db.data());
  out.insert(out.end(), {logits, dlogits, {loss, float(correct)}, dx, dw, db});

  Floats velocity(dw.size()), m(dw.size()), v(dw.size()), w_sgd = w, w_adam = w;
  SgdParams sgd;
  sgd.momentum = 0.9f, sgd.nesterov = true;
  for (int64_t step = 1; step <= 3; ++step) {
    be.sgd_update(sgd, dw.size(), w_sgd.data(), dw.data(), velocity.data());
    be.adam_update(AdamParams{}, step, dw.size(), w_adam.data(), dw.data(), m.data(), v.data());
  }
  out.insert(out.end(), {w_sgd, velocity, w_adam, m, v});
}

/// Every output of every method of one backend, on inputs drawn from a fixed seed.
std::vector<Floats> run_everything(Backend& be) {
  Rng rng(7);
  std::vector<Floats> out;
  run_conv_layers(be, rng, out);
  run_dense_layers(be, rng, out);
  return out;
}

bool bit_identical(const Floats& a, const Floats& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("oneDNN conv2d matches the reference on random shapes", "[parity]") {
  Backends be;
  Rng rng(101);
  for (Padding mode : {Padding::kValid, Padding::kKerasSame, Padding::kAsymmetric}) {
    for (int trial = 0; trial < 25; ++trial) {
      const ConvShape s = random_conv_shape(rng, mode);
      INFO(describe(s));
      check_conv_parity(be, s, random_conv_data(s, rng));
    }
  }
}

/// The fused ReLU forward against conv then ReLU, exactly; and the weight gradient of ReLU's
/// masked gradient against the reference's (y, the fused output, has zeros where the mask cuts).
void check_relu_fused(Backends& be, const ConvShape& s, const ConvData& d,
                      const std::string& what) {
  Floats fused(s.output_count()), apart(s.output_count());
  be.dnnl->conv2d_relu_forward(s, d.x.data(), d.w.data(), d.b.data(), fused.data());
  be.dnnl->conv2d_forward(s, d.x.data(), d.w.data(), d.b.data(), apart.data());
  be.ref->relu_forward(apart.size(), apart.data(), apart.data());
  check_equal(what + " + relu", fused, apart);
  Floats scratch(s.output_count()), got_w(s.weight_count()), want_w(s.weight_count());
  Floats got_b(s.k), want_b(s.k), mag_w(s.weight_count()), mag_b(s.k);
  be.dnnl->conv2d_relu_backward_weights(s, d.x.data(), fused.data(), d.dy.data(), got_w.data(),
                                        got_b.data(), scratch.data());
  be.ref->conv2d_relu_backward_weights(s, d.x.data(), fused.data(), d.dy.data(), want_w.data(),
                                       want_b.data(), scratch.data());
  be.ref->conv2d_backward_weights(s, abs_of(d.x).data(), abs_of(d.dy).data(), mag_w.data(),
                                  mag_b.data());
  check_sums(what + " relu dw", got_w, want_w, mag_w, s.n * s.oh() * s.ow());
  check_sums(what + " relu db", got_b, want_b, mag_b, s.n * s.oh() * s.ow());
}

/// Shapes whose channels oneDNN blocks (8, 16, 32 in and out), the tutorial's first layer, and
/// the fused ReLU forward against conv then ReLU.
void check_blocked_convs(MathMode mode) {
  Backends be(mode);
  Rng rng(111);
  const int shapes[][4] = {{1, 32, 28, 3}, {8, 8, 9, 3}, {16, 16, 7, 1}, {32, 16, 6, 3}};
  for (const auto& shape : shapes) {
    ConvShape s;
    s.n = 4, s.c = shape[0], s.k = shape[1], s.h = s.w = shape[2], s.kh = s.kw = shape[3];
    pad_axis(Padding::kKerasSame, s.h, s.kh, s.sh, &s.pad_top, &s.pad_bottom);
    pad_axis(Padding::kKerasSame, s.w, s.kw, s.sw, &s.pad_left, &s.pad_right);
    INFO(describe(s) << " in " << math_mode_name(mode));
    const ConvData d = random_conv_data(s, rng);
    check_conv_parity(be, s, d);
    check_relu_fused(be, s, d, "conv");
    // A layer without a bias (its b zeros, its db unread): oneDNN's primitives without one.
    ConvShape unbiased = s;
    unbiased.bias = 0;
    ConvData zero_bias = d;
    std::fill(zero_bias.b.begin(), zero_bias.b.end(), 0.0f);
    INFO("without a bias");
    check_conv_parity(be, unbiased, zero_bias);
  }
}

TEST_CASE("oneDNN conv2d in blocked layouts matches the reference, ReLU fused", "[parity]") {
  check_blocked_convs(MathMode::kFloat32);
}

/// Convolutions with few input channels run direct_conv.h's loops: rows shorter than a vector,
/// exactly one, and longer ones with an overlapping last vector; padding, row strides, one image
/// (fewer images than threads), ReLU fused forward and masked backward.
void check_direct_convs(MathMode mode) {
  Backends be(mode);
  Rng rng(131);
  // n, c, h, w, k, kh, kw, sh, padding
  const int shapes[][9] = {{3, 1, 28, 28, 32, 3, 3, 1, 0}, {2, 3, 16, 16, 5, 3, 3, 1, 1},
                           {1, 1, 40, 17, 3, 5, 5, 2, 1},  {4, 4, 9, 9, 2, 2, 2, 1, 0},
                           {2, 2, 7, 35, 4, 4, 4, 3, 2},   {3, 3, 5, 5, 6, 1, 1, 1, 0}};
  for (const auto& shape : shapes) {
    ConvShape s;
    s.n = shape[0], s.c = shape[1], s.h = shape[2], s.w = shape[3], s.k = shape[4];
    s.kh = shape[5], s.kw = shape[6], s.sh = shape[7];
    const Padding padding = shape[8] == 0   ? Padding::kValid
                            : shape[8] == 1 ? Padding::kKerasSame
                                            : Padding::kAsymmetric;
    pad_axis(padding, s.h, s.kh, s.sh, &s.pad_top, &s.pad_bottom);
    pad_axis(padding, s.w, s.kw, s.sw, &s.pad_left, &s.pad_right);
    INFO(describe(s) << " in " << math_mode_name(mode));
    const ConvData d = random_conv_data(s, rng);
    check_conv_parity(be, s, d);
    check_relu_fused(be, s, d, "direct conv");
  }
  CHECK_THAT(be.dnnl->implementations(), Catch::Contains("direct:nchw"));
}

TEST_CASE("oneDNN backend's direct loops for few input channels match the reference", "[parity]") {
  check_direct_convs(MathMode::kFloat32);
}

// The backend runs the widest loops this CPU has; the narrower ones (what a CPU without AVX-512,
// or without AVX2, runs) are the same source compiled for each width, checked here directly.
TEST_CASE("the direct convolution's loops match the reference at every vector width the CPU runs",
          "[parity]") {
  using direct_conv::Vectors;
  Backends be;
  Rng rng(141);
  for (Vectors vectors : {Vectors::kAvx512, Vectors::kAvx2, Vectors::kPlain}) {
    if (!direct_conv::runs(vectors)) {
      WARN("this CPU does not run the " << direct_conv::vectors_name(vectors) << " loops");
      continue;
    }
    for (bool bf16 : {false, true}) {
      ConvShape s;
      s.n = 3, s.c = 2, s.h = 11, s.w = 37, s.k = 5, s.kh = 3, s.kw = 4, s.sh = 2;
      pad_axis(Padding::kKerasSame, s.h, s.kh, s.sh, &s.pad_top, &s.pad_bottom);
      pad_axis(Padding::kKerasSame, s.w, s.kw, s.sw, &s.pad_left, &s.pad_right);
      INFO(describe(s) << " " << direct_conv::vectors_name(vectors) << (bf16 ? " bf16" : ""));
      REQUIRE(direct_conv::suits(s));
      auto ref = make_reference_backend(bf16 ? MathMode::kBfloat16 : MathMode::kFloat32);
      const ConvData d = random_conv_data(s, rng);
      Floats got(s.output_count()), want(s.output_count()), mag(s.output_count());
      direct_conv::forward(s, d.x.data(), d.w.data(), d.b.data(), got.data(), false, bf16, vectors);
      ref->conv2d_forward(s, d.x.data(), d.w.data(), d.b.data(), want.data());
      be.ref->conv2d_forward(s, abs_of(d.x).data(), abs_of(d.w).data(), abs_of(d.b).data(),
                             mag.data());
      check_sums("direct conv y", got, want, mag, s.c * s.kh * s.kw + 1);
      Floats relu_y(s.output_count()), got_w(s.weight_count()), want_w(s.weight_count());
      Floats mag_w(s.weight_count()), got_b(s.k), want_b(s.k), mag_b(s.k);
      Floats scratch(s.output_count());
      direct_conv::forward(s, d.x.data(), d.w.data(), d.b.data(), relu_y.data(), true, bf16,
                           vectors);
      direct_conv::backward_weights(s, d.x.data(), relu_y.data(), d.dy.data(), got_w.data(),
                                    got_b.data(), bf16, vectors);
      ref->conv2d_relu_backward_weights(s, d.x.data(), relu_y.data(), d.dy.data(), want_w.data(),
                                        want_b.data(), scratch.data());
      be.ref->conv2d_backward_weights(s, abs_of(d.x).data(), abs_of(d.dy).data(), mag_w.data(),
                                      mag_b.data());
      check_sums("direct conv relu dw", got_w, want_w, mag_w, s.n * s.oh() * s.ow());
      check_sums("direct conv relu db", got_b, want_b, mag_b, s.n * s.oh() * s.ow());
    }
  }
}

TEST_CASE("oneDNN dense matches the reference with odd sizes", "[parity]") {
  Backends be;
  Rng rng(102);
  const int shapes[][3] = {{3, 5, 7},   {1, 1, 1},  {5, 33, 11},
                           {3, 127, 9}, {7, 9, 65}, {64, 31, 10}};
  for (const auto& shape : shapes) {
    INFO("dense n=" << shape[0] << " in=" << shape[1] << " out=" << shape[2]);
    check_dense_parity(be, shape[0], shape[1], shape[2], rng);
  }
}

TEST_CASE("oneDNN max pooling matches the reference: outputs and dx", "[parity]") {
  Backends be;
  Rng rng(103);
  const int windows[][4] = {{2, 2, 2, 2}, {3, 3, 2, 2}, {3, 3, 1, 1}, {2, 3, 1, 2}};
  for (const auto& win : windows) {
    for (int trial = 0; trial < 6; ++trial) {
      PoolShape s;
      s.n = 3, s.c = rng.integer(2, 5), s.h = rng.integer(5, 13), s.w = rng.integer(5, 13);
      s.kh = win[0], s.kw = win[1], s.sh = win[2], s.sw = win[3];
      INFO("pool c=" << s.c << " h=" << s.h << " w=" << s.w << " window " << s.kh << "x" << s.kw
                     << " stride " << s.sh << "x" << s.sw);
      check_pool_parity(be, s, rng);
    }
  }
}

TEST_CASE("oneDNN relu matches the reference exactly, in place too, a share added", "[parity]") {
  Backends be;
  Rng rng(104);
  Floats x = rng.floats(1001, -1, 1);
  for (size_t i = 0; i < x.size(); i += 7) x[i] = 0.0f;
  const Floats dy = rng.floats(x.size(), -1, 1);
  Floats got(x.size()), want(x.size()), in_place = x;
  be.dnnl->relu_forward(x.size(), x.data(), got.data());
  be.ref->relu_forward(x.size(), x.data(), want.data());
  be.dnnl->relu_forward(in_place.size(), in_place.data(), in_place.data());
  check_equal("relu y", got, want);
  check_equal("relu y in place", in_place, want);

  Floats got_dx(x.size()), want_dx(x.size()), in_place_dx = dy;
  be.dnnl->relu_backward(x.size(), want.data(), dy.data(), got_dx.data());
  be.ref->relu_backward(x.size(), want.data(), dy.data(), want_dx.data());
  be.dnnl->relu_backward(x.size(), want.data(), in_place_dx.data(), in_place_dx.data());
  check_equal("relu dx", got_dx, want_dx);
  check_equal("relu dx in place", in_place_dx, want_dx);

  // The last share added as the mask is applied: the bits of add, then relu_backward (the
  // reference runs the default, which does just that), in place too; over 2^16 values, so the
  // host loop splits over the threads.
  Floats y = rng.floats(70001, -1, 1), g = rng.floats(y.size(), -1, 1),
         share = rng.floats(y.size(), -1, 1);
  for (size_t i = 0; i < y.size(); i += 5) y[i] = 0.0f;
  Floats got_added(y.size()), want_added(y.size()), in_place_added = g;
  be.dnnl->relu_backward_added(y.size(), y.data(), g.data(), share.data(), got_added.data());
  be.ref->relu_backward_added(y.size(), y.data(), g.data(), share.data(), want_added.data());
  be.dnnl->relu_backward_added(y.size(), y.data(), in_place_added.data(), share.data(),
                               in_place_added.data());
  check_equal("relu dx with a share added", got_added, want_added);
  check_equal("relu dx with a share added, in place", in_place_added, want_added);
}

TEST_CASE("oneDNN softmax cross-entropy matches the reference", "[parity]") {
  Backends be;
  Rng rng(105);
  const int shapes[][2] = {{3, 2}, {3, 5}, {3, 10}, {7, 11}, {64, 10}, {1, 3}};
  for (const auto& shape : shapes) {
    INFO("softmax n=" << shape[0] << " classes=" << shape[1]);
    check_softmax_parity(be, shape[0], shape[1], rng);
  }
}

TEST_CASE("oneDNN SGD and Adam updates match the reference", "[parity]") {
  Backends be;
  Rng rng(106);
  for (const SgdParams& p : {SgdParams{0.01f, 0.0f, false}, SgdParams{0.1f, 0.9f, false},
                             SgdParams{0.05f, 0.5f, true}}) {
    INFO("sgd lr=" << p.learning_rate << " momentum=" << p.momentum << " nesterov=" << p.nesterov);
    check_sgd_parity(be, p, rng);
  }
  for (const AdamParams& p : {AdamParams{}, AdamParams{0.01f, 0.8f, 0.99f, 1e-5f}}) {
    for (int64_t step : {1, 2, 7, 1000}) {
      INFO("adam lr=" << p.learning_rate << " beta_1=" << p.beta_1 << " step " << step);
      check_adam_parity(be, p, step, rng);
    }
  }
}

// Large updates stream their arrays out (streamed_update.h); the same update over the same
// arrays in calls too small to stream uses plain stores. Both must give the same bits, for every
// optimizer and variant, from a start that is not 16-byte aligned and with a ragged tail.
TEST_CASE("oneDNN's streamed optimizer updates give the bits of plain stores", "[parity]") {
  namespace su = streamed_update;
  const int64_t n = su::kStreamAt + 3 * su::kBlock + 7, piece = 1000;
  REQUIRE(piece < su::kStreamAt);
  using Update =
      std::function<void(Backend&, size_t, float*, const float*, float*, float*, float*)>;
  SgdParams sgd{0.05f, 0.0f, false, {}}, momentum{0.05f, 0.9f, false, {}},
      nesterov{0.05f, 0.9f, true, {}};
  RmspropParams rms{0.01f, 0.9f, 0.0f, 1e-7f, false, {}}, rms_momentum = rms, rms_centered = rms,
                                                          rms_both = rms;
  rms_momentum.momentum = rms_both.momentum = 0.5f;
  rms_centered.centered = rms_both.centered = true;
  const std::vector<std::pair<std::string, Update>> updates = {
      {"sgd", [&](Backend& b, size_t c, float* w, const float* g, float*, float*,
                  float*) { b.sgd_update(sgd, c, w, g, nullptr); }},
      {"sgd momentum", [&](Backend& b, size_t c, float* w, const float* g, float* s1, float*,
                           float*) { b.sgd_update(momentum, c, w, g, s1); }},
      {"sgd nesterov", [&](Backend& b, size_t c, float* w, const float* g, float* s1, float*,
                           float*) { b.sgd_update(nesterov, c, w, g, s1); }},
      {"adam", [&](Backend& b, size_t c, float* w, const float* g, float* s1, float* s2,
                   float*) { b.adam_update(AdamParams{}, 3, c, w, g, s1, s2); }},
      {"adamw", [&](Backend& b, size_t c, float* w, const float* g, float* s1, float* s2,
                    float*) { b.adamw_update(AdamWParams{}, 3, c, w, g, s1, s2); }},
      {"rmsprop", [&](Backend& b, size_t c, float* w, const float* g, float* s1, float* s2,
                      float* s3) { b.rmsprop_update(rms, c, w, g, s1, s2, s3); }},
      {"rmsprop momentum", [&](Backend& b, size_t c, float* w, const float* g, float* s1, float* s2,
                               float* s3) { b.rmsprop_update(rms_momentum, c, w, g, s1, s2, s3); }},
      {"rmsprop centered", [&](Backend& b, size_t c, float* w, const float* g, float* s1, float* s2,
                               float* s3) { b.rmsprop_update(rms_centered, c, w, g, s1, s2, s3); }},
      {"rmsprop centered momentum",
       [&](Backend& b, size_t c, float* w, const float* g, float* s1, float* s2, float* s3) {
         b.rmsprop_update(rms_both, c, w, g, s1, s2, s3);
       }},
  };
  auto be = make_dnnl_backend();
  Rng rng(171);
  for (const auto& [name, update] : updates) {
    INFO(name);
    // Four arrays one float past a 64-byte boundary: the same phase in all, so they stream.
    std::vector<Floats> streamed(4), plain(4);
    for (Floats& a : streamed) a = rng.floats(n + 16, 0.01, 1);  // positive: slots stay valid
    for (int a = 0; a < 4; ++a) plain[a] = streamed[a];
    const Floats before = streamed[0];
    const Floats g = rng.floats(n + 16, -1, 1);
    auto run = [&](std::vector<Floats>& arrays, int64_t first, int64_t count) {
      float* at[4];
      for (int a = 0; a < 4; ++a) at[a] = arrays[a].data() + 1 + first;
      update(*be, count, at[0], g.data() + 1 + first, at[1], at[2], at[3]);
    };
    float* w = streamed[0].data() + 1;
    REQUIRE(reinterpret_cast<uintptr_t>(w) % 16 != 0);
    CHECK(su::streams(n, w, streamed[1].data() + 1, streamed[2].data() + 1));
    run(streamed, 0, n);
    for (int64_t first = 0; first < n; first += piece)
      run(plain, first, std::min(piece, n - first));
    for (int a = 0; a < 4; ++a) {
      INFO("array " << a);
      CHECK(bit_identical(streamed[a], plain[a]));
    }
    CHECK_FALSE(bit_identical(streamed[0], before));
  }
  // Arrays at different phases fall back to plain stores.
  Floats a(64), b(64);
  CHECK_FALSE(su::streams(su::kStreamAt, a.data(), b.data() + 1));
  CHECK_FALSE(su::streams(su::kStreamAt - 1, a.data(), b.data()));
}

TEST_CASE("host backends unscale gradients exactly and flag any infinity or NaN", "[parity]") {
  // Sizes around the vector widths and OpenMP's split; each bad value alone, at the ends and
  // inside; a scale that is not a power of two, so a multiply by its inverse would differ.
  for (auto* make :
       {+[] { return make_dnnl_backend(); }, +[] { return make_reference_backend(); }}) {
    std::unique_ptr<Backend> b = make();
    Rng rng(107);
    for (size_t n : {size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{1000}, size_t{4099}}) {
      Floats g = rng.floats(n, -1e3, 1e3), expected = g;
      for (float& v : expected) v /= 3.0f;
      float flag = 0.0f;
      const float three = 3.0f, two = 2.0f, half = 0.5f;  // scales live in device memory
      b->unscale_gradients(n, &three, g.data(), &flag);
      INFO("n " << n);
      CHECK(std::memcmp(g.data(), expected.data(), n * sizeof(float)) == 0);
      CHECK(flag == 0.0f);
      for (float bad : {INFINITY, -INFINITY, NAN}) {
        for (size_t at : {size_t{0}, n / 2, n - 1}) {
          Floats h = rng.floats(n, -1.0, 1.0);
          h[at] = bad;
          float raised = 0.0f;
          b->unscale_gradients(n, &two, h.data(), &raised);
          INFO("bad " << bad << " at " << at);
          CHECK(raised == 1.0f);
          b->unscale_gradients(n, &two, expected.data(), &raised);  // finite: it stays raised
          CHECK(raised == 1.0f);
          b->unscale_gradients(n, &two, h.data(), nullptr);  // no check asked for
        }
      }
      // Finite but overflowing once divided by a scale below one: flagged as well.
      Floats big(n, 3e38f);
      float overflow = 0.0f;
      b->unscale_gradients(n, &half, big.data(), &overflow);
      CHECK(overflow == 1.0f);
    }
  }
}

TEST_CASE("host backends apply Keras's loss-scale rule in device memory, as LossScale does",
          "[parity]") {
  // A random run of finite and non-finite steps, growth every 3, from a scale near the top (so
  // a doubling that would overflow is refused), against the host's reference rule.
  for (auto* make :
       {+[] { return make_dnnl_backend(); }, +[] { return make_reference_backend(); }}) {
    std::unique_ptr<Backend> b = make();
    dtrain::train::LossScaleSpec spec;
    spec.enabled = true, spec.growth_steps = 3;
    dtrain::train::LossScale rule(spec);
    rule.set_state({0x1p125f, 0});
    Floats state = {0x1p125f, 0, 0, 0, 0};
    std::mt19937 rng(5);
    int64_t skipped = 0;
    for (int step = 0; step < 200; ++step) {
      bool finite = rng() % 4 != 0;
      state[Backend::kNonfinite] = finite ? 0.0f : 1.0f;
      b->update_loss_scale(state.data(), spec.growth_steps);
      skipped += rule.update(finite) ? 0 : 1;
      INFO("step " << step << (finite ? " finite" : " not finite"));
      REQUIRE(state[Backend::kLossScale] == rule.scale());
      REQUIRE(state[Backend::kGoodSteps] == static_cast<float>(rule.good_steps()));
      REQUIRE(state[Backend::kNonfinite] == 0.0f);  // cleared for the next step
      REQUIRE(state[Backend::kPreviousSkipped] == (finite ? 0.0f : 1.0f));  // kept for it
      REQUIRE(state[Backend::kSkipped] == static_cast<float>(skipped));
    }
    CHECK(skipped > 20);
    // A long run of overflows: the scale halves down to 1 and stays there (tf.keras's floor),
    // never to 0, on the device as in the rule; the steps are still skipped.
    for (int step = 0; step < 140; ++step) {
      state[Backend::kNonfinite] = 1.0f;
      b->update_loss_scale(state.data(), spec.growth_steps);
      REQUIRE(!rule.update(false));
      REQUIRE(state[Backend::kLossScale] == rule.scale());
    }
    CHECK(rule.scale() == 1.0f);
    CHECK(state[Backend::kSkipped] == static_cast<float>(skipped + 140));
  }
}

TEST_CASE("host backends' updates follow a loss scale's gate: skipped, or one step back",
          "[parity]") {
  // Each update three ways beside an ungated one: the skip flag raised (nothing changes); the
  // flag of the step before raised (the update of a count one lower: its rate, Adam's step - 1);
  // both flags present and lowered (the plain update, bit for bit).
  for (auto* make :
       {+[] { return make_dnnl_backend(); }, +[] { return make_reference_backend(); }}) {
    std::unique_ptr<Backend> b = make();
    Rng rng(9);
    const size_t n = 1031;
    const Floats w0 = rng.floats(n, -1, 1), g = rng.floats(n, -1, 1), s1 = rng.floats(n, 0, 1),
                 s2 = rng.floats(n, 0, 1), s3 = rng.floats(n, -0.1, 0.1);
    const float up = 1.0f, down = 0.0f;
    const float rate = 0.05f, rate_back = 0.04f;
    const int64_t step = 7;
    // One optimizer's update of copies of w0 and its slots: {w, slot, slot, slot}.
    using Update = std::function<std::vector<Floats>(SkipGate, float, int64_t)>;
    auto run = [&](auto&& apply) -> Update {
      return [&, apply](SkipGate gate, float lr, int64_t t) {
        std::vector<Floats> x = {w0, s1, s2, s3};
        apply(gate, lr, t, x);
        return x;
      };
    };
    std::vector<std::pair<const char*, Update>> updates = {
        {"sgd", run([&](SkipGate gate, float lr, int64_t, std::vector<Floats>& x) {
           b->sgd_update({lr, 0.9f, true, gate}, n, x[0].data(), g.data(), x[1].data());
         })},
        {"adam", run([&](SkipGate gate, float lr, int64_t t, std::vector<Floats>& x) {
           b->adam_update({lr, 0.9f, 0.999f, 1e-7f, gate}, t, n, x[0].data(), g.data(), x[1].data(),
                          x[2].data());
         })},
        {"adamw", run([&](SkipGate gate, float lr, int64_t t, std::vector<Floats>& x) {
           b->adamw_update({lr, 0.004f, 0.9f, 0.999f, 1e-7f, gate}, t, n, x[0].data(), g.data(),
                           x[1].data(), x[2].data());
         })},
        {"rmsprop", run([&](SkipGate gate, float lr, int64_t, std::vector<Floats>& x) {
           b->rmsprop_update({lr, 0.9f, 0.5f, 1e-7f, true, gate}, n, x[0].data(), g.data(),
                             x[1].data(), x[2].data(), x[3].data());
         })},
    };
    for (auto& [name, update] : updates) {
      INFO(name);
      const std::vector<Floats> plain = update({}, rate, step);
      CHECK(plain[0] != w0);
      CHECK(update({&up, &down, rate_back}, rate, step) == std::vector<Floats>{w0, s1, s2, s3});
      CHECK(update({&up, &up, rate_back}, rate, step) == std::vector<Floats>{w0, s1, s2, s3});
      CHECK(update({&down, &down, rate_back}, rate, step) == plain);
      CHECK(update({&down, &up, rate_back}, rate, step) == update({}, rate_back, step - 1));
      CHECK(update({&down, &up, rate_back}, rate, step) != plain);
    }
  }
}

TEST_CASE("oneDNN gives bit-identical results on repeat runs", "[parity]") {
  auto first = make_dnnl_backend();
  const std::vector<Floats> a = run_everything(*first);
  const std::vector<Floats> b = run_everything(*first);
  const std::vector<Floats> c = run_everything(*make_dnnl_backend());
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() == c.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("output " << i << " of " << a.size());
    CHECK(bit_identical(a[i], b[i]));
    CHECK(bit_identical(a[i], c[i]));
  }
}

// mixed_bfloat16 (docs/design.md#mixed-precision): where the CPU has bf16 products, oneDNN's
// results equal the reference that rounds every product's input to bf16, within float32's
// bounds: the rounding happened, and only there. Where it has none, the backend is refused.
TEST_CASE("oneDNN mixed_bfloat16 matches the bf16-rounding reference, or is refused", "[bf16]") {
  if (!cpu_supports(MathMode::kBfloat16)) {
    WARN("this CPU (" << cpu_isa_name() << ") has no bf16 products: checking the refusal");
    CHECK_THROWS_WITH(make_dnnl_backend(MathMode::kBfloat16),
                      Catch::Contains("cannot compute in mixed_bfloat16"));
    return;
  }
  CHECK(make_dnnl_backend(MathMode::kBfloat16)->implementations().empty() == false);
  Backends be(MathMode::kBfloat16);
  Rng rng(121);
  for (Padding mode : {Padding::kValid, Padding::kKerasSame}) {
    for (int trial = 0; trial < 10; ++trial) {
      const ConvShape s = random_conv_shape(rng, mode);
      INFO(describe(s));
      check_conv_parity(be, s, random_conv_data(s, rng));
    }
  }
  check_blocked_convs(MathMode::kBfloat16);
  check_direct_convs(MathMode::kBfloat16);
  const int shapes[][3] = {{3, 5, 7}, {1, 1, 1}, {7, 9, 65}, {64, 301, 10}};
  for (const auto& shape : shapes) {
    INFO("dense n=" << shape[0] << " in=" << shape[1] << " out=" << shape[2]);
    check_dense_parity(be, shape[0], shape[1], shape[2], rng);
  }
  CHECK_THAT(be.dnnl->implementations(), Catch::Contains("bf16"));
}

// The backward pass may use the bf16 copy of the weights the forward made; an optimizer update
// of those weights in between must not leave it stale.
namespace {

// t (n x c x hw, NCHW floats) rounded to bf16 in blocks of 16 channels (nChw16c), and its
// values back as floats in NCHW.
struct Blocked16 {
  std::vector<uint16_t> bits;
  std::vector<double> values;
};
Blocked16 block_rounded(const Floats& t, int n, int c, int hw) {
  std::vector<uint16_t> plain(t.size());
  REQUIRE(bf16_rounding::round_vectorized(t.data(), t.size(), plain.data()));
  Blocked16 b{std::vector<uint16_t>(t.size()), std::vector<double>(t.size())};
  for (int i = 0; i < n; ++i)
    for (int ch = 0; ch < c; ++ch)
      for (int p = 0; p < hw; ++p) {
        const size_t at = (static_cast<size_t>(i) * c + ch) * hw + p;
        b.bits[((static_cast<size_t>(i) * (c / 16) + ch / 16) * hw + p) * 16 + ch % 16] = plain[at];
        const uint32_t word = static_cast<uint32_t>(plain[at]) << 16;
        float f;
        std::memcpy(&f, &word, sizeof f);
        b.values[at] = f;
      }
  return b;
}

}  // namespace

// bf16_weight_grad's kernel (docs/design.md#the-bf16-weight-gradient) against the sum in double
// over the same bf16 values: odd and even batches (a last example paired with zeros), padding
// on every side or none, kernels 1x1 to 5x5 and 2x3, strides 1 to 3, several blocks of channels
// each way; the same bits at one thread and two.
TEST_CASE("the bf16 weight gradient's kernel matches the sum of its products", "[bf16]") {
  ConvShape probe;
  probe.c = probe.k = 16, probe.h = probe.w = 4, probe.kh = probe.kw = 3, probe.bias = 0;
  probe.x_layout = probe.y_layout = Layout::kBlocked;
  if (!bf16_weight_grad::suits(probe)) {
    CHECK_FALSE(bf16_rounding::vectorized());  // it runs wherever the rounding loops do
    return;
  }
  Rng rng(151);
  // n, c, k, h, w, kh, kw, pad top/bottom/left/right, strides
  const int shapes[][13] = {
      {3, 16, 16, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1}, {4, 32, 16, 5, 5, 3, 3, 0, 0, 0, 0, 1, 1},
      {1, 16, 32, 6, 9, 5, 5, 2, 2, 2, 2, 1, 1}, {2, 16, 16, 4, 4, 1, 1, 0, 0, 0, 0, 1, 1},
      {5, 32, 48, 6, 5, 2, 3, 0, 1, 1, 1, 1, 1}, {3, 16, 32, 8, 8, 3, 3, 0, 1, 0, 1, 2, 2},
      {2, 16, 32, 7, 9, 1, 1, 0, 0, 0, 0, 2, 2}, {2, 16, 16, 9, 7, 3, 2, 1, 1, 0, 0, 2, 3}};
  for (const auto& v : shapes) {
    ConvShape s;
    s.n = v[0], s.c = v[1], s.k = v[2], s.h = v[3], s.w = v[4], s.kh = v[5], s.kw = v[6];
    s.pad_top = v[7], s.pad_bottom = v[8], s.pad_left = v[9], s.pad_right = v[10];
    s.sh = v[11], s.sw = v[12];
    s.bias = 0;
    s.x_layout = s.y_layout = Layout::kBlocked;
    INFO(describe(s));
    REQUIRE(bf16_weight_grad::suits(s));
    const int oh = s.oh(), ow = s.ow();
    const Blocked16 x = block_rounded(rng.floats(s.input_count(), -1, 1), s.n, s.c, s.h * s.w);
    const Blocked16 dy = block_rounded(rng.floats(s.output_count(), -1, 1), s.n, s.k, oh * ow);
    bf16_weight_grad::Scratch scratch;
    Floats dw(s.weight_count());
    bf16_weight_grad::compute(s, x.bits.data(), dy.bits.data(), dw.data(), scratch);
    for (int k = 0; k < s.k; ++k)
      for (int c = 0; c < s.c; ++c)
        for (int i = 0; i < s.kh; ++i)
          for (int j = 0; j < s.kw; ++j) {
            double sum = 0, magnitude = 0;
            for (int n = 0; n < s.n; ++n)
              for (int p = 0; p < oh; ++p)
                for (int q = 0; q < ow; ++q) {
                  const int r = p * s.sh + i - s.pad_top, col = q * s.sw + j - s.pad_left;
                  if (r < 0 || r >= s.h || col < 0 || col >= s.w) continue;
                  const double term = dy.values[((size_t(n) * s.k + k) * oh + p) * ow + q] *
                                      x.values[((size_t(n) * s.c + c) * s.h + r) * s.w + col];
                  sum += term;
                  magnitude += std::fabs(term);
                }
            const float got = dw[((size_t(k) * s.c + c) * s.kh + i) * s.kw + j];
            INFO("k " << k << " c " << c << " i " << i << " j " << j);
            REQUIRE(std::fabs(got - sum) <= 1e-6 * magnitude + 1e-30);
          }
    // Tasks own their weights: the same bits on one thread.
    Floats alone(s.weight_count());
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    bf16_weight_grad::compute(s, x.bits.data(), dy.bits.data(), alone.data(), scratch);
    omp_set_num_threads(threads);
    CHECK(std::memcmp(alone.data(), dw.data(), dw.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("oneDNN mixed_bfloat16 rounds weights again after an update", "[bf16]") {
  if (!cpu_supports(MathMode::kBfloat16)) return;  // the case above checks the refusal
  Backends be(MathMode::kBfloat16);
  Rng rng(122);
  const int n = 4, in = 33, out = 5;
  const Floats x = rng.floats(n * in, -1, 1), b = rng.floats(out, -1, 1);
  const Floats dy = rng.floats(n * out, -1, 1), g = rng.floats(in * out, -1, 1);
  Floats w = rng.floats(in * out, -1, 1), y(n * out), got(n * in), want(n * in);
  be.dnnl->dense_forward(n, in, out, x.data(), w.data(), b.data(), y.data());
  SgdParams sgd;
  sgd.learning_rate = 0.5f;
  be.dnnl->sgd_update(sgd, w.size(), w.data(), g.data(), nullptr);
  be.dnnl->dense_backward_data(n, in, out, dy.data(), w.data(), got.data());
  be.ref->dense_backward_data(n, in, out, dy.data(), w.data(), want.data());
  Floats mag(n * in);
  be.ref->dense_backward_data(n, in, out, abs_of(dy).data(), abs_of(w).data(), mag.data());
  check_sums("dense dx after the update", got, want, mag, out);
}

TEST_CASE("oneDNN mixed_bfloat16 gives bit-identical results on repeat runs", "[bf16]") {
  if (!cpu_supports(MathMode::kBfloat16)) return;
  auto first = make_dnnl_backend(MathMode::kBfloat16);
  const std::vector<Floats> a = run_everything(*first);
  const std::vector<Floats> b = run_everything(*make_dnnl_backend(MathMode::kBfloat16));
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("output " << i << " of " << a.size());
    CHECK(bit_identical(a[i], b[i]));
  }
}
