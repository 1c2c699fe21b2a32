// The pieces the oneDNN backend builds its operations from: a tensor staged between the caller's
// plain float32 buffer and the layout and type a primitive chose, the bf16 rounding of a buffer,
// and the convolution and matrix-product primitives made once per shape. Internal to the CPU
// backend (the dnnl_* files are the only ones that include oneDNN); no layer sees these types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <dnnl.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/nn/backend.h"
#include "worker/nn/bf16_weight_grad.h"

namespace dtrain::nn::dnnl_parts {

using dnnl::memory;

/// A tensor as a primitive wants it: the caller's own memory when the primitive takes the plain
/// float32 layout, else the primitive's memory, filled from the caller's buffer (an input) or
/// emptied into it (an output) by a reorder at each call.
class Staged {
 public:
  Staged() = default;
  Staged(const memory::desc& plain, const memory::desc& wanted, const dnnl::engine& engine);
  /// The primitive's memory holding data (reordered now unless the layouts agree).
  memory in(const void* data, dnnl::stream& stream);
  /// data reordered into `into` (memory of the wanted layout), or nothing when the layouts agree.
  void fill(const void* data, memory& into, dnnl::stream& stream);
  /// Whether the primitive takes the caller's layout itself (no reorder, no memory of its own).
  bool same() const { return same_; }
  /// The memory the primitive writes; store() moves it into data.
  memory out(void* data);
  void store(void* data, dnnl::stream& stream);

 private:
  dnnl::engine engine_;
  memory::desc plain_;
  bool same_ = true;
  /// The wanted layout is the caller's with bf16 values, rounded by bf16_rounding's loops.
  bool rounds_ = false;
  memory inner_;
  dnnl::reorder to_inner_, to_plain_;
};

/// Float32 buffers rounded to bf16 (bf16_rounding.h: round to nearest even, subnormals to zero,
/// as oneDNN's reorder does), each kept under the address of its source so that the backward
/// pass can use the copy the forward made.
class Rounder {
 public:
  explicit Rounder(const dnnl::engine& engine) : engine_(engine) {}
  /// count floats at source rounded now, kept under source.
  const uint16_t* round(const float* source, size_t count, dnnl::stream& stream);
  /// The copy round() made of source when it had count floats and nothing dropped it since,
  /// else round(source, count).
  const uint16_t* reuse(const float* source, size_t count, dnnl::stream& stream);
  /// Room for a copy of count floats at source that the caller fills now (a rounding made
  /// elsewhere, bf16_rounding::pack_vectorized's plain output), kept as round() keeps its own.
  uint16_t* slot(const float* source, size_t count);
  /// Drops every copy of memory that overlaps [begin, begin + count) (its source changed).
  void drop(const float* begin, size_t count);

 private:
  struct Copy {
    size_t count = 0;
    size_t capacity = 0;
    std::unique_ptr<uint16_t[]> bits;
  };
  dnnl::reorder& converter(size_t count);
  dnnl::engine engine_;
  std::map<const float*, Copy> copies_;
  std::map<size_t, dnnl::reorder> converters_;
};

/// The primitives of one convolution shape, in one math mode (float32, or bf16 inputs with
/// float32 outputs), each tensor in the layout oneDNN prefers (blocked channels), staged from
/// and to the callers' buffers (OIHW weights; activations in the shape's layouts). The forward
/// keeps its blocked copy of each x it is given (one buffer per x address, reused every step), so
/// that backward() need not make it again; backward() stages dy once for both of its products
/// (docs/design.md#convolution-layouts).
class Conv {
 public:
  Conv(const ConvShape& s, MathMode mode, const dnnl::engine& engine);
  /// x16: x's rounded copy (null: none), read instead of rounding x where the primitives take x
  /// as x's own layout with bf16 values (docs/design.md#rounded-copies).
  void forward(dnnl::stream& st, const float* x, const float* w, const float* b, float* y,
               bool relu, const uint16_t* x16 = nullptr);
  void backward_data(dnnl::stream& st, const float* dy, const float* w, float* dx);
  void backward_weights(dnnl::stream& st, const float* x, const float* dy, float* dw, float* db);
  /// Backend::conv2d_backward: x unchanged since forward() was given it; dy16 as forward's x16.
  void backward(dnnl::stream& st, const float* x, const float* dy, const float* w, float* dx,
                float* dw, float* db, const std::function<void()>& weights_done,
                const uint16_t* dy16 = nullptr);
  /// True when backward() given dy16 reads it as it is and never dy: both backward products
  /// take dy in one layout, the copy's.
  bool reads_rounded_dy_only() const { return rounded_dy_ != memory::desc(); }
  /// True when forward() given x16 reads it as it is and never x, and keeps it for backward(),
  /// which then reads it rather than x.
  bool reads_rounded_x_only() const { return rounded_src_ != memory::desc() && keep_src_; }
  /// The implementations oneDNN dispatched to ("jit:avx512_core", ...).
  std::vector<std::string> implementations() const { return implementations_; }

 private:
  /// The two backward products on dy (and x) already in the primitives' layouts.
  void run_backward_data(dnnl::stream& st, const memory& diff_dst, const float* w, float* dx);
  void run_backward_weights(dnnl::stream& st, const memory& src, const memory& diff_dst, float* dw,
                            float* db);
  struct Forward {
    dnnl::convolution_forward primitive;
    Staged src, weights, dst;
  };
  dnnl::engine engine_;
  memory::desc bias_;
  Forward plain_, relu_;
  dnnl::convolution_backward_data backward_data_;
  Staged bd_diff_dst_, bd_weights_, bd_diff_src_;
  dnnl::convolution_backward_weights backward_weights_;
  Staged bw_src_, bw_diff_dst_, bw_diff_weights_;
  /// True when both forwards and the weight gradient take x in one blocked layout, so the
  /// forward's copy serves the backward; the copies, by x's address.
  bool keep_src_ = false;
  struct Kept {
    memory copy;
    bool borrowed = false;  ///< the caller's rounded copy (forward's x16), not memory of its own
  };
  std::map<const float*, Kept> kept_src_;
  memory::desc kept_desc_;
  /// True when both backward products take dy in one layout.
  bool share_dy_ = false;
  /// The layouts that a rounded copy of x (every primitive's x) and of dy (both backward
  /// products' dy) serves as it is; empty where it does not.
  memory::desc rounded_src_, rounded_dy_;
  /// True when the weight gradient is bf16_weight_grad's (both its inputs bf16 in blocks of 16
  /// channels), not oneDNN's; its scratch.
  bool own_weights_ = false;
  ConvShape shape_;
  bf16_weight_grad::Scratch weights_scratch_;
  std::vector<std::string> implementations_;
};

/// Row-major C = A B (+ bias row) (then ReLU) with A (m x k) and B (k x n) given by their
/// strides, so transposes and row blocks are views; in float32, or on bf16 copies of A and B
/// with float32 C. Made once per shape.
struct MatmulShape {
  int64_t m = 0, n = 0, k = 0;
  int64_t a_row = 0, a_col = 0, b_row = 0, b_col = 0, ldc = 0;
  bool bias = false, relu = false, bf16 = false;
  /// bf16 only: B in the blocked layout the primitive prefers (b_row and b_col unused), so that
  /// it does not pack B at each call (bf16_rounding.h, pack_vectorized).
  bool packed_b = false;
};
class Matmul {
 public:
  Matmul(const MatmulShape& s, const dnnl::engine& engine);
  /// a and b are float* or (bf16) uint16_t*; bias may be null unless the shape has one.
  void run(dnnl::stream& st, const void* a, const void* b, const float* bias, float* c);
  std::string implementation() const { return implementation_; }
  /// Whether B is in the layout bf16_rounding::pack_vectorized writes (BA16a64b2a).
  bool b_blocked_64() const;

 private:
  dnnl::engine engine_;
  MatmulShape shape_;
  memory::desc a_, b_, c_, bias_;
  dnnl::matmul primitive_;
  std::string implementation_;
};

}  // namespace dtrain::nn::dnnl_parts
