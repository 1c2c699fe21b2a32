// See elementwise_kernels.h. One thread per element.
#include "worker/mem/cuda/cuda_check.h"
#include "worker/nn/cuda/elementwise_kernels.h"
#include "worker/nn/random.h"

namespace dtrain::nn::cuda {
namespace {

constexpr int kThreads = 256;
int blocks_for(size_t n) {
  return static_cast<int>((n + kThreads - 1) / kThreads);
}

__device__ size_t element_index() {
  return blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
}

__global__ void add_kernel(const float* x, float* y, size_t n) {
  size_t i = element_index();
  if (i < n) y[i] += x[i];
}

__global__ void multiply_kernel(const float* a, const float* b, float* y, size_t n) {
  size_t i = element_index();
  if (i < n) y[i] = a[i] * b[i];
}

__global__ void dropout_kernel(const float* x, float* y, float* mask, size_t n, float rate,
                               uint64_t key) {
  size_t i = element_index();
  if (i >= n) return;
  float keep = unit_float(mix64(key ^ i)) >= rate ? 1.0f / (1.0f - rate) : 0.0f;
  mask[i] = keep;
  y[i] = x[i] * keep;
}

// A dynamic loss scale's gate (SkipGate): the step's flag and the step before's, in device
// memory (null: none). The rates come in two: the usual one and the one for a count one lower.
struct Gate {
  const float* skip;
  const float* previous;
};

__device__ bool gate_skips(Gate gate) {
  return gate.skip != nullptr && *gate.skip != 0.0f;
}

__device__ float gate_pick(Gate gate, float usual, float after_skip) {
  return gate.previous != nullptr && *gate.previous != 0.0f ? after_skip : usual;
}

__global__ void sgd_kernel(float* w, const float* g, float* v, size_t n, float lr_usual,
                           float lr_after_skip, float mu, bool nesterov, Gate gate) {
  size_t i = element_index();
  if (i >= n || gate_skips(gate)) return;
  const float lr = gate_pick(gate, lr_usual, lr_after_skip);
  if (v == nullptr) {
    w[i] -= lr * g[i];
    return;
  }
  v[i] = mu * v[i] - lr * g[i];
  w[i] += nesterov ? mu * v[i] - lr * g[i] : v[i];
}

// decay 0 is plain Adam; AdamW first decays the weight (w -= w * weight_decay * lr).
__global__ void adam_kernel(float* w, const float* g, float* m, float* v, size_t n,
                            float decay_usual, float lr_usual, float decay_after_skip,
                            float lr_after_skip, float b1, float b2, float eps, Gate gate) {
  size_t i = element_index();
  if (i >= n || gate_skips(gate)) return;
  const float decay = gate_pick(gate, decay_usual, decay_after_skip);
  const float lr = gate_pick(gate, lr_usual, lr_after_skip);
  if (decay != 0.0f) w[i] -= w[i] * decay;
  m[i] += (g[i] - m[i]) * (1.0f - b1);
  v[i] += (g[i] * g[i] - v[i]) * (1.0f - b2);
  w[i] -= lr * m[i] / (sqrtf(v[i]) + eps);
}

__global__ void rmsprop_kernel(float* w, const float* g, float* velocity, float* mom, float* avg,
                               size_t n, float lr_usual, float lr_after_skip, float rho, float mu,
                               float eps, Gate gate) {
  size_t i = element_index();
  if (i >= n || gate_skips(gate)) return;
  const float lr = gate_pick(gate, lr_usual, lr_after_skip);
  velocity[i] = rho * velocity[i] + (1.0f - rho) * g[i] * g[i];
  float denominator = velocity[i] + eps;
  if (avg != nullptr) {
    avg[i] = rho * avg[i] + (1.0f - rho) * g[i];
    denominator = velocity[i] - avg[i] * avg[i] + eps;
  }
  float increment = lr * g[i] / sqrtf(denominator);
  if (mom != nullptr) {
    mom[i] = mu * mom[i] + increment;
    increment = mom[i];
  }
  w[i] -= increment;
}

__global__ void scale_kernel(float* x, size_t n, const float* factor) {
  size_t i = element_index();
  if (i < n) x[i] *= *factor;
}

// Every thread that finds a non-finite value stores the same 1: no atomics needed.
__global__ void unscale_kernel(float* g, size_t n, const float* scale, float* nonfinite) {
  size_t i = element_index();
  if (i >= n) return;
  float value = g[i] / *scale;
  g[i] = value;
  if (nonfinite != nullptr && !isfinite(value)) *nonfinite = 1.0f;
}

// One thread: Keras's dynamic rule, as HostBackend::update_loss_scale.
__global__ void update_loss_scale_kernel(float* state, float growth_steps) {
  float& scale = state[Backend::kLossScale];
  float& good = state[Backend::kGoodSteps];
  if (state[Backend::kNonfinite] != 0.0f) {
    scale = fmaxf(scale / 2, 1.0f);
    good = 0;
    state[Backend::kSkipped] += 1;
  } else if ((good += 1) >= growth_steps) {
    good = 0;
    if (isfinite(scale * 2)) scale *= 2;
  }
  state[Backend::kPreviousSkipped] = state[Backend::kNonfinite];
  state[Backend::kNonfinite] = 0;
}

}  // namespace

void launch_add(size_t count, const float* x, float* y, cudaStream_t stream) {
  if (count == 0) return;
  add_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, y, count);
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_multiply(size_t count, const float* a, const float* b, float* y, cudaStream_t stream) {
  if (count == 0) return;
  multiply_kernel<<<blocks_for(count), kThreads, 0, stream>>>(a, b, y, count);
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_dropout(size_t count, float rate, uint64_t key, const float* x, float* y, float* mask,
                    cudaStream_t stream) {
  if (count == 0) return;
  dropout_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, y, mask, count, rate, key);
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_sgd(const SgdParams& p, size_t count, float* w, const float* g, float* velocity,
                cudaStream_t stream) {
  if (count == 0) return;
  sgd_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
      w, g, p.momentum == 0.0f ? nullptr : velocity, count, p.learning_rate,
      p.gate.learning_rate_after_skip, p.momentum, p.nesterov, Gate{p.gate.skip, p.gate.previous});
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_adam(float lr_t, float lr_t_after_skip, const AdamParams& p, size_t count, float* w,
                 const float* g, float* m, float* v, cudaStream_t stream) {
  if (count == 0) return;
  adam_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
      w, g, m, v, count, 0.0f, lr_t, 0.0f, lr_t_after_skip, p.beta_1, p.beta_2, p.epsilon,
      Gate{p.gate.skip, p.gate.previous});
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_rmsprop(const RmspropParams& p, size_t count, float* w, const float* g, float* velocity,
                    float* momentum_slot, float* average_gradient, cudaStream_t stream) {
  if (count == 0) return;
  rmsprop_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
      w, g, velocity, p.momentum > 0.0f ? momentum_slot : nullptr,
      p.centered ? average_gradient : nullptr, count, p.learning_rate,
      p.gate.learning_rate_after_skip, p.rho, p.momentum, p.epsilon,
      Gate{p.gate.skip, p.gate.previous});
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_adamw(float decay, float lr_t, float decay_after_skip, float lr_t_after_skip,
                  const AdamWParams& p, size_t count, float* w, const float* g, float* m, float* v,
                  cudaStream_t stream) {
  if (count == 0) return;
  adam_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
      w, g, m, v, count, decay, lr_t, decay_after_skip, lr_t_after_skip, p.beta_1, p.beta_2,
      p.epsilon, Gate{p.gate.skip, p.gate.previous});
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_scale(size_t count, const float* factor, float* x, cudaStream_t stream) {
  if (count == 0) return;
  scale_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, count, factor);
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_unscale(size_t count, const float* scale, float* g, float* nonfinite,
                    cudaStream_t stream) {
  if (count == 0) return;
  unscale_kernel<<<blocks_for(count), kThreads, 0, stream>>>(g, count, scale, nonfinite);
  DT_CUDA_CHECK(cudaGetLastError());
}

void launch_update_loss_scale(float* state, int64_t growth_steps, cudaStream_t stream) {
  update_loss_scale_kernel<<<1, 1, 0, stream>>>(state, static_cast<float>(growth_steps));
  DT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dtrain::nn::cuda
