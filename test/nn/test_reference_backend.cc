// The reference backend against calculus and arithmetic: every backward pass against central
// finite differences of L = sum(y * r) (so dy = r), small cases worked by hand (layouts, padding,
// first-max ties, a known softmax), and Keras's SGD and Adam steps computed by hand. The oneDNN
// backend is not tested here: test_backend_parity.cc compares it with this one.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "test/support/mean_loss.h"
#include "worker/nn/backend.h"

using namespace dtrain::nn;

namespace {

using Floats = std::vector<float>;

class Rng {
 public:
  explicit Rng(uint32_t seed) : engine_(seed) {}
  double uniform(double lo, double hi) { return lo + (hi - lo) * (engine_() / 4294967296.0); }
  Floats floats(size_t count, double lo, double hi) {
    Floats out(count);
    for (float& v : out) v = static_cast<float>(uniform(lo, hi));
    return out;
  }

 private:
  std::mt19937 engine_;
};

double weighted_sum(const Floats& y, const Floats& r) {
  double sum = 0.0;
  for (size_t i = 0; i < y.size(); ++i) sum += double{y[i]} * r[i];
  return sum;
}

// Every function checked is piecewise linear in the perturbed input (or smooth, for the loss),
// and the test inputs keep each perturbation inside one linear piece, so a large step costs no
// truncation error and divides float rounding noise in the objective by 2 * kStep.
constexpr double kStep = 1e-2;
constexpr double kAbsTol = 1e-4;
constexpr double kRelTol = 1e-2;

/// Checks analytic[i] against (L(in + h e_i) - L(in - h e_i)) / (2h) for every i, where h is
/// the step the float input actually took; and that the gradient is not trivially zero.
void check_gradient(const std::string& what, Floats input, const Floats& analytic,
                    const std::function<double(const Floats&)>& objective) {
  REQUIRE(input.size() == analytic.size());
  double worst = 0.0, worst_numeric = 0.0, largest = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < input.size(); ++i) {
    const float saved = input[i];
    input[i] = static_cast<float>(saved + kStep);
    const double up = input[i], loss_up = objective(input);
    input[i] = static_cast<float>(saved - kStep);
    const double down = input[i], loss_down = objective(input);
    input[i] = saved;
    const double numeric = (loss_up - loss_down) / (up - down);
    const double ratio =
        std::fabs(numeric - analytic[i]) / (kAbsTol + kRelTol * std::fabs(numeric));
    if (ratio > worst) worst = ratio, worst_at = i, worst_numeric = numeric;
    largest = std::max(largest, std::fabs(double{analytic[i]}));
  }
  INFO(what << ": element " << worst_at << " analytic " << analytic[worst_at] << " numeric "
            << worst_numeric);
  CHECK(worst <= 1.0);
  CHECK(largest > 1e-2);
}

/// Keras "same" padding along one axis: (before, after), the extra one at the end.
std::pair<int, int> same_padding(int size, int kernel, int stride) {
  int out = (size + stride - 1) / stride;
  int total = std::max((out - 1) * stride + kernel - size, 0);
  return {total / 2, total - total / 2};
}

ConvShape conv_shape(int n, int c, int h, int w, int k, int kh, int kw, int sh, int sw, bool same) {
  ConvShape s;
  s.n = n, s.c = c, s.h = h, s.w = w, s.k = k, s.kh = kh, s.kw = kw, s.sh = sh, s.sw = sw;
  if (same) {
    std::tie(s.pad_top, s.pad_bottom) = same_padding(h, kh, sh);
    std::tie(s.pad_left, s.pad_right) = same_padding(w, kw, sw);
  }
  return s;
}

void check_conv_gradients(const ConvShape& s, uint32_t seed) {
  auto be = make_reference_backend();
  Rng rng(seed);
  const Floats x = rng.floats(s.input_count(), -1, 1), w = rng.floats(s.weight_count(), -1, 1);
  const Floats b = rng.floats(s.k, -1, 1), r = rng.floats(s.output_count(), -1, 1);
  auto objective = [&](const Floats& xx, const Floats& ww, const Floats& bb) {
    Floats y(s.output_count());
    be->conv2d_forward(s, xx.data(), ww.data(), bb.data(), y.data());
    return weighted_sum(y, r);
  };
  Floats dx(s.input_count()), dw(s.weight_count()), db(s.k);
  be->conv2d_backward_data(s, r.data(), w.data(), dx.data());
  be->conv2d_backward_weights(s, x.data(), r.data(), dw.data(), db.data());
  check_gradient("conv dx", x, dx, [&](const Floats& v) { return objective(v, w, b); });
  check_gradient("conv dw", w, dw, [&](const Floats& v) { return objective(x, v, b); });
  check_gradient("conv db", b, db, [&](const Floats& v) { return objective(x, w, v); });
}

/// count distinct values spaced 0.05 apart (far more than 2 * kStep), in shuffled order.
Floats distinct_values(size_t count, uint32_t seed) {
  Floats out(count);
  for (size_t i = 0; i < count; ++i) out[i] = 0.05f * (static_cast<float>(i) - count / 2.0f);
  std::mt19937 engine(seed);
  for (size_t i = count - 1; i > 0; --i) std::swap(out[i], out[engine() % (i + 1)]);
  return out;
}

}  // namespace

TEST_CASE("reference conv2d gradients match finite differences", "[reference]") {
  const ConvShape shapes[] = {
      conv_shape(2, 3, 7, 5, 4, 3, 3, 1, 1, false),  // stride 1, valid
      conv_shape(2, 2, 9, 7, 3, 3, 2, 2, 2, false),  // stride 2, valid, leftover rows
      conv_shape(1, 3, 5, 7, 2, 4, 4, 1, 1, true),   // same: pads 1 before, 2 after
      conv_shape(2, 2, 9, 7, 3, 2, 4, 2, 2, true),   // same, stride 2: pads 0/1 and 1/2
      conv_shape(1, 1, 5, 5, 2, 3, 3, 1, 2, true),   // mixed strides
  };
  uint32_t seed = 1;
  for (const ConvShape& s : shapes) {
    INFO("conv c=" << s.c << " h=" << s.h << " w=" << s.w << " k=" << s.k << " kernel " << s.kh
                   << "x" << s.kw << " stride " << s.sh << "x" << s.sw << " pads " << s.pad_top
                   << "/" << s.pad_bottom << " " << s.pad_left << "/" << s.pad_right);
    check_conv_gradients(s, seed++);
  }
}

TEST_CASE("reference dense gradients match finite differences", "[reference]") {
  const int n = 3, in = 5, out = 7;
  auto be = make_reference_backend();
  Rng rng(11);
  const Floats x = rng.floats(n * in, -1, 1), w = rng.floats(in * out, -1, 1);
  const Floats b = rng.floats(out, -1, 1), r = rng.floats(n * out, -1, 1);
  auto objective = [&](const Floats& xx, const Floats& ww, const Floats& bb) {
    Floats y(n * out);
    be->dense_forward(n, in, out, xx.data(), ww.data(), bb.data(), y.data());
    return weighted_sum(y, r);
  };
  Floats dx(n * in), dw(in * out), db(out);
  be->dense_backward_data(n, in, out, r.data(), w.data(), dx.data());
  be->dense_backward_weights(n, in, out, x.data(), r.data(), dw.data(), db.data());
  check_gradient("dense dx", x, dx, [&](const Floats& v) { return objective(v, w, b); });
  check_gradient("dense dw", w, dw, [&](const Floats& v) { return objective(x, v, b); });
  check_gradient("dense db", b, db, [&](const Floats& v) { return objective(x, w, v); });
}

TEST_CASE("reference relu gradient matches finite differences", "[reference]") {
  auto be = make_reference_backend();
  Rng rng(21);
  Floats x = rng.floats(40, 0.1, 1.0);  // at least 0.1 away from the kink
  for (size_t i = 0; i < x.size(); i += 2) x[i] = -x[i];
  const Floats r = rng.floats(x.size(), -1, 1);
  Floats y(x.size()), dx(x.size());
  be->relu_forward(x.size(), x.data(), y.data());
  be->relu_backward(x.size(), y.data(), r.data(), dx.data());
  check_gradient("relu dx", x, dx, [&](const Floats& v) {
    Floats out(v.size());
    be->relu_forward(v.size(), v.data(), out.data());
    return weighted_sum(out, r);
  });
}

TEST_CASE("reference max pooling gradient matches finite differences", "[reference]") {
  auto be = make_reference_backend();
  const int windows[][4] = {{2, 2, 2, 2}, {3, 3, 2, 2}, {3, 3, 1, 1}, {3, 2, 1, 2}};
  uint32_t seed = 31;
  for (const auto& win : windows) {
    PoolShape s;
    s.n = 2, s.c = 3, s.h = 7, s.w = 9, s.kh = win[0], s.kw = win[1], s.sh = win[2], s.sw = win[3];
    INFO("pool " << s.kh << "x" << s.kw << " stride " << s.sh << "x" << s.sw);
    const size_t in_count = s.input_count();
    const size_t out_count = static_cast<size_t>(s.n) * s.c * s.oh() * s.ow();
    REQUIRE(be->maxpool_workspace_bytes(s) == out_count * sizeof(int32_t));
    const Floats x = distinct_values(in_count, seed++), r = Rng(seed++).floats(out_count, -1, 1);
    auto pool = [&](const Floats& v, std::vector<int32_t>& ws) {
      Floats y(out_count);
      be->maxpool_forward(s, v.data(), y.data(), ws.data());
      return y;
    };
    std::vector<int32_t> ws(out_count);
    pool(x, ws);
    Floats dx(in_count);
    be->maxpool_backward(s, r.data(), ws.data(), dx.data());
    check_gradient("pool dx", x, dx, [&](const Floats& v) {
      std::vector<int32_t> scratch(out_count);
      return weighted_sum(pool(v, scratch), r);
    });
  }
}

TEST_CASE("reference softmax cross-entropy gradient matches finite differences", "[reference]") {
  const int n = 3, classes = 5;
  auto be = make_reference_backend();
  const Floats logits = Rng(41).floats(n * classes, -2, 2);
  const int32_t labels[n] = {4, 0, 2};
  Floats dlogits(logits.size()), scratch(logits.size());
  int correct = 0;
  dtrain::testing::mean_softmax_loss(*be, n, classes, logits.data(), labels, dlogits.data(),
                                     &correct);
  check_gradient("softmax dlogits", logits, dlogits, [&](const Floats& v) {
    int ignored = 0;
    return dtrain::testing::mean_softmax_loss(*be, n, classes, v.data(), labels, scratch.data(),
                                              &ignored);
  });
}

TEST_CASE("reference conv2d on a 3x3 input with a 2x2 kernel, by hand", "[reference]") {
  auto be = make_reference_backend();
  const float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w[4] = {1, 2, 3, 4}, b[1] = {0.5f};
  ConvShape s = conv_shape(1, 1, 3, 3, 1, 2, 2, 1, 1, false);
  float y[4];
  be->conv2d_forward(s, x, w, b, y);
  // y00 = 1*1 + 2*2 + 4*3 + 5*4 = 37, then 47, 67, 77; plus the bias.
  CHECK(Floats(y, y + 4) == Floats{37.5f, 47.5f, 67.5f, 77.5f});

  const float ones[4] = {1, 1, 1, 1};
  float dx[9], dw[4], db[1];
  be->conv2d_backward_data(s, ones, w, dx);
  CHECK(Floats(dx, dx + 9) == Floats{1, 3, 2, 4, 10, 6, 3, 7, 4});  // sums of covering taps
  be->conv2d_backward_weights(s, x, ones, dw, db);
  CHECK(Floats(dw, dw + 4) == Floats{12, 16, 24, 28});  // sums of each tap's 2x2 inputs
  CHECK(db[0] == 4.0f);

  // Keras "same" at stride 1 pads one row below and one column right, with zeros.
  s = conv_shape(1, 1, 3, 3, 1, 2, 2, 1, 1, true);
  REQUIRE((s.pad_top == 0 && s.pad_bottom == 1 && s.pad_left == 0 && s.pad_right == 1));
  float same[9];
  be->conv2d_forward(s, x, w, b, same);
  CHECK(same[2] == 3 * 1 + 6 * 3 + 0.5f);  // right column: taps 0 and 2 only
  CHECK(same[8] == 9 * 1 + 0.5f);          // corner: tap 0 only
}

TEST_CASE("reference conv2d reads weights as OIHW and activations as NCHW", "[reference]") {
  auto be = make_reference_backend();
  // Two images, two channels of 1x2 pixels; two 1x1 filters: w[o][i] = {{1, 2}, {3, 4}}.
  const float x[8] = {1, 1, 10, 10, 2, 2, 20, 20}, w[4] = {1, 2, 3, 4}, b[2] = {0, 0};
  ConvShape s = conv_shape(2, 2, 1, 2, 2, 1, 1, 1, 1, false);
  float y[8];
  be->conv2d_forward(s, x, w, b, y);
  CHECK(Floats(y, y + 8) == Floats{21, 21, 43, 43, 42, 42, 86, 86});
}

TEST_CASE("reference dense uses Keras's in x out kernel, by hand", "[reference]") {
  auto be = make_reference_backend();
  const float x[6] = {1, 2, 3, 4, 5, 6}, w[6] = {1, 0, 0, 1, 1, 1}, b[2] = {0.5f, -1};
  float y[4];
  be->dense_forward(2, 3, 2, x, w, b, y);
  CHECK(Floats(y, y + 4) == Floats{4.5f, 4, 10.5f, 10});
  const float dy[4] = {1, 0, 0, 1};
  float dx[6], dw[6], db[2];
  be->dense_backward_data(2, 3, 2, dy, w, dx);
  CHECK(Floats(dx, dx + 6) == Floats{1, 0, 1, 0, 1, 1});  // dy w^T
  be->dense_backward_weights(2, 3, 2, x, dy, dw, db);
  CHECK(Floats(dw, dw + 6) == Floats{1, 4, 2, 5, 3, 6});  // x^T dy
  CHECK(Floats(db, db + 2) == Floats{1, 1});
}

TEST_CASE("reference relu, by hand and in place", "[reference]") {
  auto be = make_reference_backend();
  Floats v = {-1, 0, 2.5f, -0.0f, 3};
  be->relu_forward(v.size(), v.data(), v.data());
  CHECK(v == Floats{0, 0, 2.5f, 0, 3});
  Floats g = {1, 2, 3, 4, 5};
  be->relu_backward(g.size(), v.data(), g.data(), g.data());
  CHECK(g == Floats{0, 0, 3, 0, 5});  // y == 0 passes nothing, even where x was 0
}

TEST_CASE("reference 2x2 max pooling keeps the first maximum, by hand", "[reference]") {
  auto be = make_reference_backend();
  PoolShape s;
  s.h = 4, s.w = 4;
  const float x[16] = {1, 3, 2, 0,   //
                       4, 2, 5, 5,   // a tie for the first maximum in window (0, 1)
                       0, 7, 1, 1,   //
                       6, 6, 1, 1};  // window (1, 1) is all ties
  REQUIRE(be->maxpool_workspace_bytes(s) == 4 * sizeof(int32_t));
  int32_t argmax[4];
  float y[4];
  be->maxpool_forward(s, x, y, argmax);
  CHECK(Floats(y, y + 4) == Floats{4, 5, 7, 1});
  CHECK(std::vector<int32_t>(argmax, argmax + 4) == std::vector<int32_t>{4, 6, 9, 10});
  const float dy[4] = {10, 20, 30, 40};
  float dx[16];
  be->maxpool_backward(s, dy, argmax, dx);
  CHECK(Floats(dx, dx + 16) == Floats{0, 0, 0, 0, 10, 0, 20, 0, 0, 30, 40, 0, 0, 0, 0, 0});

  // Overlapping 2x2 windows at stride 1 that all pick the centre add their gradients there.
  s.h = 3, s.w = 3, s.sh = 1, s.sw = 1;
  const float peak[9] = {0, 1, 0, 1, 9, 1, 0, 1, 0}, dy2[4] = {1, 2, 3, 4};
  float y2[4], dx2[9];
  be->maxpool_forward(s, peak, y2, argmax);
  CHECK(Floats(y2, y2 + 4) == Floats{9, 9, 9, 9});
  be->maxpool_backward(s, dy2, argmax, dx2);
  CHECK(Floats(dx2, dx2 + 9) == Floats{0, 0, 0, 0, 10, 0, 0, 0, 0});
}

TEST_CASE("reference softmax cross-entropy of two known rows", "[reference]") {
  auto be = make_reference_backend();
  // Row 0: equal logits, so p = 1/3 each, loss ln 3, and the arg-max is the first maximum,
  // class 0: correct. Row 1: p = (1, 2, 1) / 4, label 1, loss ln 2, correct.
  const float logits[6] = {0, 0, 0, 0, std::log(2.0f), 0};
  const int32_t labels[2] = {0, 1};
  float dlogits[6];
  int correct = -1;
  float loss = dtrain::testing::mean_softmax_loss(*be, 2, 3, logits, labels, dlogits, &correct);
  CHECK(loss == Approx((std::log(3.0) + std::log(2.0)) / 2).epsilon(1e-6));
  CHECK(correct == 2);
  const double want[6] = {-1.0 / 3, 1.0 / 6, 1.0 / 6, 0.125, -0.25, 0.125};  // (p - onehot) / 2
  for (int i = 0; i < 6; ++i) CHECK(dlogits[i] == Approx(want[i]).margin(1e-7));

  // Huge logits do not overflow: the row maximum is subtracted first.
  const float big[3] = {1000, 1000, 1000};
  const int32_t label = 2;
  loss = dtrain::testing::mean_softmax_loss(*be, 1, 3, big, &label, dlogits, &correct);
  CHECK(loss == Approx(std::log(3.0)).epsilon(1e-6));
  CHECK(dlogits[2] == Approx(1.0 / 3 - 1).epsilon(1e-6));
  CHECK(correct == 0);
}

TEST_CASE("reference SGD takes Keras's steps: plain, momentum, nesterov", "[reference]") {
  auto be = make_reference_backend();
  const Floats g1 = {0.5f, -1}, g2 = {-1, 0.25f};
  auto two_steps = [&](float momentum, bool nesterov, Floats& velocity) {
    SgdParams p;
    p.learning_rate = 0.1f, p.momentum = momentum, p.nesterov = nesterov;
    Floats w = {1, -2};
    float* v = momentum == 0 ? nullptr : velocity.data();
    be->sgd_update(p, 2, w.data(), g1.data(), v);
    be->sgd_update(p, 2, w.data(), g2.data(), v);
    return w;
  };
  Floats v = {0, 0};
  Floats w = two_steps(0, false, v);  // w -= 0.1 g, twice
  CHECK(w[0] == Approx(1.05));
  CHECK(w[1] == Approx(-1.925));
  w = two_steps(0.9f, false, v);  // v = 0.9 v - 0.1 g; w += v
  CHECK(v[0] == Approx(0.055));   // 0.9 * -0.05 + 0.1
  CHECK(v[1] == Approx(0.065));   // 0.9 * 0.1 - 0.025
  CHECK(w[0] == Approx(1.005));   // 1 - 0.05 + 0.055
  CHECK(w[1] == Approx(-1.835));  // -2 + 0.1 + 0.065
  v = {0, 0};
  w = two_steps(0.9f, true, v);  // w += 0.9 v - 0.1 g, with the new v
  CHECK(v[0] == Approx(0.055));
  CHECK(w[0] == Approx(1.0545));   // 1 + (-0.045 - 0.05) + (0.0495 + 0.1)
  CHECK(w[1] == Approx(-1.7765));  // -2 + (0.09 + 0.1) + (0.0585 - 0.025)
}

TEST_CASE("reference Adam takes Keras's bias-corrected steps", "[reference]") {
  auto be = make_reference_backend();
  AdamParams p;
  p.learning_rate = 0.1f;
  Floats w = {1, -2}, m = {0, 0}, v = {0, 0};
  const Floats g1 = {0.5f, -1}, g2 = {-1, 0.25f};
  // Hyper-parameters are float32, as in Keras: 1 - beta_2 = 1 - 0.999f = 0.0009999871.
  // Step 1: m = 0.1 g, v = 0.001 g^2, lr_t = 0.1 sqrt(0.001) / 0.1 = 0.0316226, so w moves by
  // almost exactly lr: 0.1 * (1 - epsilon / (|g| sqrt(0.001))).
  be->adam_update(p, 1, 2, w.data(), g1.data(), m.data(), v.data());
  CHECK(m[0] == Approx(0.05000001192).epsilon(1e-6));
  CHECK(v[0] == Approx(0.0002499967813).epsilon(1e-6));
  CHECK(w[0] == Approx(0.900000631).epsilon(1e-6));
  CHECK(w[1] == Approx(-1.900000315).epsilon(1e-6));
  // Step 2: m = 0.9 m + 0.1 g = (-0.055, -0.065), v = 0.999 v + 0.001 g^2 = (0.00124973,
  // 0.00106149), lr_t = 0.1 sqrt(1 - 0.999^2) / (1 - 0.9^2) = 0.0235315.
  be->adam_update(p, 2, 2, w.data(), g2.data(), m.data(), v.data());
  CHECK(m[0] == Approx(-0.05500001431).epsilon(1e-6));
  CHECK(v[1] == Approx(0.001061486346).epsilon(1e-6));
  CHECK(w[0] == Approx(0.936610882).epsilon(1e-6));
  CHECK(w[1] == Approx(-1.853053642).epsilon(1e-6));
}
