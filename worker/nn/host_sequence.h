// The sequence layers' operations on the host for the oneDNN backend (backend.h's embedding_* and
// layernorm_* contracts): the embedding's gather and its scatter-add, split over OpenMP's
// threads by table rows so that every row's sum adds its tokens in token order; layer
// normalization's rows split over threads, each row reduced by one thread in a fixed order, and
// its gamma and beta gradients split by features, each summed over the rows in row order. So the
// results do not depend on the thread count, nor on the vector width the loops run at. The
// reference backend has its own plain loops (the oracle).
#pragma once

#include "worker/nn/direct_conv.h"

namespace dtrain::nn {

/// EnforceError naming the first id that is not an integer in [0, input_dim), and its place.
void host_check_token_ids(int rows, int input_dim, const float* ids);
void host_embedding_forward(int rows, int input_dim, int output_dim, const float* ids,
                            const float* table, float* y);
void host_embedding_backward(int rows, int input_dim, int output_dim, const float* ids,
                             const float* dy, float* dtable);

/// vectors: the width the loops run at (direct_conv.h's Vectors); every width gives the same
/// bits.
void host_layernorm_forward(int rows, int features, float epsilon, const float* x,
                            const float* gamma, const float* beta, float* y, float* mean,
                            float* rstd,
                            direct_conv::Vectors vectors = direct_conv::Vectors::kWidest);
void host_layernorm_backward(int rows, int features, const float* x, const float* dy,
                             const float* gamma, const float* mean, const float* rstd, float* dx,
                             float* dgamma, float* dbeta,
                             direct_conv::Vectors vectors = direct_conv::Vectors::kWidest);

}  // namespace dtrain::nn
