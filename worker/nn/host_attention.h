// Scaled dot-product attention on the host for the oneDNN backend (backend.h's attention_*
// contract, docs/design.md#attention): one (example, head) pair per task, split over OpenMP's
// threads, each reduced in a fixed order, so the bits depend neither on the thread count nor
// on the vector width the loops run at (compiled for AVX-512, AVX2 and plain, picked at run
// time as host_norm.h's are). The reference backend has its own plain loops (the oracle).
#pragma once

#include "worker/nn/backend.h"
#include "worker/nn/direct_conv.h"

namespace dtrain::nn {

void host_attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                            float* probs, float* y,
                            direct_conv::Vectors vectors = direct_conv::Vectors::kWidest);
void host_attention_backward(const AttentionShape& s, const float* q, const float* k,
                             const float* v, const float* probs, const float* dy, float* dq,
                             float* dk, float* dv,
                             direct_conv::Vectors vectors = direct_conv::Vectors::kWidest);

}  // namespace dtrain::nn
