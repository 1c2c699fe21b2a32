// Elementwise kernels of the CUDA backend: add, multiply, dropout, the optimizers (SGD, Adam,
// RMSprop, AdamW) and loss scaling, each enqueued on the given stream with nothing read back, so
// they can be captured in a CUDA graph. The formulas are the Backend's (backend.h). Include only
// from CUDA sources; the backend's parameter checks stay in cuda_backend.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "worker/nn/backend.h"

namespace dtrain::nn::cuda {

void launch_add(size_t count, const float* x, float* y, cudaStream_t stream);
void launch_multiply(size_t count, const float* a, const float* b, float* y, cudaStream_t stream);
void launch_dropout(size_t count, float rate, uint64_t key, const float* x, float* y, float* mask,
                    cudaStream_t stream);
void launch_sgd(const SgdParams& p, size_t count, float* w, const float* g, float* velocity,
                cudaStream_t stream);
/// lr_t: Adam's bias-corrected rate for the step (computed on the host); lr_t_after_skip the
/// one the step uses when p.gate says the step before was skipped.
void launch_adam(float lr_t, float lr_t_after_skip, const AdamParams& p, size_t count, float* w,
                 const float* g, float* m, float* v, cudaStream_t stream);
void launch_rmsprop(const RmspropParams& p, size_t count, float* w, const float* g, float* velocity,
                    float* momentum_slot, float* average_gradient, cudaStream_t stream);
/// decay: weight_decay x the step's rate; lr_t as for Adam; each also after a skip.
void launch_adamw(float decay, float lr_t, float decay_after_skip, float lr_t_after_skip,
                  const AdamWParams& p, size_t count, float* w, const float* g, float* m, float* v,
                  cudaStream_t stream);

/// x *= *factor (device memory).
void launch_scale(size_t count, const float* factor, float* x, cudaStream_t stream);
/// g /= *scale (device memory); *nonfinite = 1 where a result is not finite (nonfinite may be
/// null: no check).
void launch_unscale(size_t count, const float* scale, float* g, float* nonfinite,
                    cudaStream_t stream);
/// Backend::update_loss_scale: one thread on the stream.
void launch_update_loss_scale(float* state, int64_t growth_steps, cudaStream_t stream);

}  // namespace dtrain::nn::cuda
