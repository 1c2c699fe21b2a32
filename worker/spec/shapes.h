// The plain shapes and enums of backend operations that a layer's keys and shape rules name
// (a convolution's and an attention's shape for the benchmarks' bounds, the elementwise
// activations, a translation's fill mode), so the spec library states them without the backend
// (worker/nn/backend.h includes this). Data only: no operation, no memory.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtrain::nn {

/// How a backend holds an image-like activation (and its gradient) in memory
/// (docs/design.md#blocked-activations): plain NCHW, or its channels in blocks of kChannelBlock,
/// innermost (oneDNN's nChw16c: element (n, c, h, w) at ((n * C / 16 + c / 16) * H * W + h * W +
/// w) * 16 + c % 16), as the CPU's convolution kernels read and write them. Only a tensor whose
/// channels are a multiple of kChannelBlock is ever blocked. Four bytes, so a shape holding one
/// has no padding (shapes are cache keys byte for byte).
enum class Layout : int32_t { kPlain, kBlocked };
constexpr int kChannelBlock = 16;

/// A 2-D convolution with bias. Padding is explicit (Keras "same" may pad more at the end).
struct ConvShape {
  int n = 1, c = 1, h = 1, w = 1;  ///< input
  int k = 1, kh = 1, kw = 1;       ///< filters and kernel size
  int sh = 1, sw = 1;              ///< strides
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  /// x and dx's layout, and y and dy's (the oneDNN backend's; every other backend: plain).
  Layout x_layout = Layout::kPlain, y_layout = Layout::kPlain;
  /// 0 for a layer without a bias (Conv2D's use_bias false): its b is zeros and nobody reads its
  /// db, so a backend may leave both out (the oneDNN backend does). An int, as every other field:
  /// no padding in a shape a backend keys its primitives by (its bytes).
  int32_t bias = 1;
  int oh() const { return (h + pad_top + pad_bottom - kh) / sh + 1; }
  int ow() const { return (w + pad_left + pad_right - kw) / sw + 1; }
  size_t input_count() const { return static_cast<size_t>(n) * c * h * w; }
  size_t weight_count() const { return static_cast<size_t>(k) * c * kh * kw; }
  size_t output_count() const { return static_cast<size_t>(n) * k * oh() * ow(); }
};

/// Scaled dot-product attention (MultiHeadAttention's core, docs/design.md#attention): n
/// examples of t positions, per head. q and k are (n, t, heads, key_dim) and v and y (n, t,
/// heads, value_dim), row-major, as the projections write them; probs (n, heads, t, t). With
/// qkv_row set, the rows of q, k and v (and of dq, dk and dv) are qkv_row floats apart: three
/// column blocks of one (n, t, qkv_row) tensor, as one projection writes them side by side.
struct AttentionShape {
  int n = 1, t = 1, heads = 1, key_dim = 1, value_dim = 1;
  bool causal = false;  ///< position i attends to positions 0..i only
  float scale = 1;      ///< the scores' factor: 1 / sqrt(key_dim)
  int qkv_row = 0;      ///< 0: q, k and v each a tensor of its own
  /// Floats from one position's q (or k) to the next's, and v's; y's is heads * value_dim.
  size_t qk_stride() const {
    return qkv_row ? static_cast<size_t>(qkv_row) : static_cast<size_t>(heads) * key_dim;
  }
  size_t v_stride() const {
    return qkv_row ? static_cast<size_t>(qkv_row) : static_cast<size_t>(heads) * value_dim;
  }
  size_t y_stride() const { return static_cast<size_t>(heads) * value_dim; }
  /// Keras's attention dropout, in training: each probability is kept with 1 - dropout (and
  /// scaled by 1 / (1 - dropout)) or dropped, by backend.h's attention_keep(); probs stays the
  /// undropped softmax, and the backward draws the same mask again from `stream`.
  float dropout = 0;
  uint64_t stream = 0;
};

/// Elementwise activations beyond ReLU, by Keras's names: sigmoid 1 / (1 + exp(-x)), tanh,
/// gelu x * (1 + erf(x / sqrt 2)) / 2 (Keras's default, approximate=False), swish (Keras's silu)
/// x * sigmoid(x).
enum class Eltwise { kSigmoid, kTanh, kGelu, kSwish };

/// Where a translation reads outside the input, Keras's fill modes (scipy's names in brackets):
/// reflect (symmetric: d c b a | a b c d | d c b a), wrap, constant (fill_value), nearest (edge).
enum class FillMode { kReflect, kWrap, kConstant, kNearest };

}  // namespace dtrain::nn
