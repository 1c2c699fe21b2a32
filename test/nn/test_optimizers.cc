// RMSprop and AdamW on both host backends against a naive scalar transcription of Keras 3's
// update_step (keras/src/optimizers/rmsprop.py, adamw.py = adam.py plus the base optimizer's
// _apply_weight_decay), several steps in a row so the slots carry over. The transcription keeps
// Keras's order of operations and runs in double; the backends must agree within float rounding.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <vector>

#include "worker/nn/backend.h"

using namespace dtrain::nn;

namespace {

// Keras 3 RMSprop.update_step for one scalar.
struct KerasRmsprop {
  RmspropParams p;
  double velocity = 0, momentum = 0, average_grad = 0;
  double step(double w, double g) {
    velocity = p.rho * velocity + (1 - p.rho) * g * g;
    double denominator;
    if (p.centered) {
      average_grad = p.rho * average_grad + (1 - p.rho) * g;
      denominator = velocity - average_grad * average_grad + p.epsilon;
    } else {
      denominator = velocity + p.epsilon;
    }
    double increment = p.learning_rate * g / std::sqrt(denominator);
    if (p.momentum > 0) {
      momentum = p.momentum * momentum + increment;
      return w - momentum;
    }
    return w - increment;
  }
};

// Keras 3 AdamW: variable -= variable * weight_decay * lr, then Adam.update_step at t.
struct KerasAdamW {
  AdamWParams p;
  double m = 0, v = 0;
  double step(double w, double g, int64_t t) {
    w = w - w * p.weight_decay * p.learning_rate;
    double alpha = p.learning_rate * std::sqrt(1 - std::pow(double{p.beta_2}, double(t))) /
                   (1 - std::pow(double{p.beta_1}, double(t)));
    m += (g - m) * (1 - p.beta_1);
    v += (g * g - v) * (1 - p.beta_2);
    return w - m * alpha / (std::sqrt(v) + p.epsilon);
  }
};

std::vector<float> weights() {
  return {0.5f, -1.25f, 2.0f, 0.0f, -0.01f, 3.5f, 1e-3f};
}

// Gradients of step t (1-based): varied signs and sizes, none the same twice.
std::vector<float> gradients(int64_t t) {
  std::vector<float> g = weights();
  for (size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<float>(std::sin(0.7 * double(t) + 1.3 * double(i)) * (0.1 + double(i)));
  return g;
}

std::vector<std::unique_ptr<Backend>> host_backends() {
  std::vector<std::unique_ptr<Backend>> all;
  all.push_back(make_reference_backend());
  all.push_back(make_dnnl_backend());
  return all;
}

}  // namespace

TEST_CASE("RMSprop follows Keras's update, with momentum and centered, on both host backends") {
  RmspropParams p;
  SECTION("Keras's defaults") {}
  SECTION("momentum") {
    p.momentum = 0.8f;
  }
  SECTION("centered") {
    p.centered = true;
  }
  SECTION("momentum and centered, another rate and rho") {
    p.momentum = 0.5f, p.centered = true, p.learning_rate = 0.01f, p.rho = 0.7f;
  }
  CHECK(RmspropParams{}.learning_rate == 0.001f);  // Keras's defaults
  CHECK(RmspropParams{}.rho == 0.9f);
  CHECK(RmspropParams{}.epsilon == 1e-7f);
  for (auto& backend : host_backends()) {
    INFO(backend->name());
    std::vector<float> w = weights(), velocity(w.size(), 0), mom(w.size(), 0), avg(w.size(), 0);
    std::vector<KerasRmsprop> want(w.size(), KerasRmsprop{p});
    std::vector<double> want_w(w.begin(), w.end());
    for (int64_t t = 1; t <= 5; ++t) {
      std::vector<float> g = gradients(t);
      backend->rmsprop_update(p, w.size(), w.data(), g.data(), velocity.data(),
                              p.momentum > 0 ? mom.data() : nullptr,
                              p.centered ? avg.data() : nullptr);
      for (size_t i = 0; i < w.size(); ++i) want_w[i] = want[i].step(want_w[i], g[i]);
    }
    for (size_t i = 0; i < w.size(); ++i) {
      INFO("element " << i);
      CHECK(w[i] == Approx(want_w[i]).epsilon(1e-5).margin(1e-7));
      CHECK(velocity[i] == Approx(want[i].velocity).epsilon(1e-5).margin(1e-9));
      if (p.momentum > 0) CHECK(mom[i] == Approx(want[i].momentum).epsilon(1e-5).margin(1e-9));
      if (p.centered) CHECK(avg[i] == Approx(want[i].average_grad).epsilon(1e-5).margin(1e-9));
    }
  }
}

TEST_CASE("AdamW follows Keras's decoupled decay then Adam, on both host backends") {
  AdamWParams p;
  SECTION("Keras's defaults") {}
  SECTION("a large decay and rate") {
    p.weight_decay = 0.1f, p.learning_rate = 0.05f;
  }
  CHECK(AdamWParams{}.weight_decay == 0.004f);
  for (auto& backend : host_backends()) {
    INFO(backend->name());
    std::vector<float> w = weights(), m(w.size(), 0), v(w.size(), 0);
    std::vector<KerasAdamW> want(w.size(), KerasAdamW{p});
    std::vector<double> want_w(w.begin(), w.end());
    for (int64_t t = 1; t <= 5; ++t) {
      std::vector<float> g = gradients(t);
      backend->adamw_update(p, t, w.size(), w.data(), g.data(), m.data(), v.data());
      for (size_t i = 0; i < w.size(); ++i) want_w[i] = want[i].step(want_w[i], g[i], t);
    }
    for (size_t i = 0; i < w.size(); ++i) {
      INFO("element " << i);
      CHECK(w[i] == Approx(want_w[i]).epsilon(1e-5).margin(1e-7));
      CHECK(m[i] == Approx(want[i].m).epsilon(1e-5).margin(1e-9));
      CHECK(v[i] == Approx(want[i].v).epsilon(1e-5).margin(1e-9));
    }
  }
}

TEST_CASE("AdamW's decay is not Adam's: with weight_decay 0 they agree, otherwise not") {
  auto backend = make_reference_backend();
  std::vector<float> g = gradients(1);
  std::vector<float> adam_w = weights(), adam_m(g.size(), 0), adam_v(g.size(), 0);
  backend->adam_update(AdamParams{}, 1, g.size(), adam_w.data(), g.data(), adam_m.data(),
                       adam_v.data());
  for (float decay : {0.0f, 0.004f}) {
    AdamWParams p;
    p.weight_decay = decay;
    std::vector<float> w = weights(), m(g.size(), 0), v(g.size(), 0);
    backend->adamw_update(p, 1, g.size(), w.data(), g.data(), m.data(), v.data());
    CHECK((w == adam_w) == (decay == 0.0f));
  }
}
