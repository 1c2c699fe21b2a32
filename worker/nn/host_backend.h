// What the two host backends (oneDNN, reference) share: the host device they own and the
// elementwise operations that need no library (add, dropout, multiply, loss scaling).
// Header-only and small; the convolutions, dense layers and the loss stay in each backend.
#pragma once

#include <cmath>
#include <memory>

#include "worker/nn/backend.h"
#include "worker/nn/random.h"

namespace dtrain::nn {

class HostBackend : public Backend {
 public:
  HostBackend() : device_(make_host_device()) {}
  Device& device() override { return *device_; }

  void add(size_t count, const float* x, float* y) override {
    for (size_t i = 0; i < count; ++i) y[i] += x[i];
  }
  void dropout_forward(size_t count, float rate, uint64_t key, const float* x, float* y,
                       float* mask) override {
    float scale = 1.0f / (1.0f - rate);
    for (size_t i = 0; i < count; ++i) {
      mask[i] = unit_float(mix64(key ^ i)) >= rate ? scale : 0.0f;
      y[i] = x[i] * mask[i];
    }
  }
  void multiply(size_t count, const float* a, const float* b, float* y) override {
    for (size_t i = 0; i < count; ++i) y[i] = a[i] * b[i];
  }
  void scale(size_t count, float factor, float* x) override {
    for (size_t i = 0; i < count; ++i) x[i] *= factor;
  }
  void unscale_gradients(size_t count, float scale, float* g, float* nonfinite) override {
    bool finite = true;
    for (size_t i = 0; i < count; ++i) {
      g[i] /= scale;
      finite = finite && std::isfinite(g[i]);
    }
    if (nonfinite != nullptr && !finite) *nonfinite = 1.0f;
  }

 private:
  std::unique_ptr<Device> device_;
};

}  // namespace dtrain::nn
