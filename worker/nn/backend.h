// The numeric operations a training step needs, on raw float buffers in the memory of the
// backend's Device (host for CPU, the GPU for CUDA). Two CPU implementations on the host device:
// oneDNN (production) and a naive reference (the test oracle); one CUDA implementation. Layers,
// loss and optimizers call only this, so the host backends run exactly the code path the GPU
// does. Layouts: activations NCHW (or N x features), conv weights OIHW, dense weights in x out
// (Keras's kernel).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "worker/mem/device.h"
#include "worker/nn/random.h"
#include "worker/spec/math_mode.h"
#include "worker/spec/optimizer_params.h"
#include "worker/spec/shapes.h"

namespace dtrain::nn {

/// Max or average pooling. Padding is explicit (Keras "same" pads the odd pixel at the end) and
/// never taken part in: a window's maximum or mean is over its elements inside the input
/// (TensorFlow's "same"). Zero padding is Keras's "valid".
struct PoolShape {
  int n = 1, c = 1, h = 1, w = 1;
  int kh = 2, kw = 2, sh = 2, sw = 2;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int oh() const { return (h + pad_top + pad_bottom - kh) / sh + 1; }
  int ow() const { return (w + pad_left + pad_right - kw) / sw + 1; }
  bool padded() const { return pad_top || pad_bottom || pad_left || pad_right; }
  size_t input_count() const { return static_cast<size_t>(n) * c * h * w; }
  size_t output_count() const { return static_cast<size_t>(n) * c * oh() * ow(); }
};

/// One batch of a float-target loss: n rows of `units` outputs and as many targets.
struct TargetLossShape {
  Loss loss = Loss::kCategorical;
  int n = 1, units = 1;
  /// binary_crossentropy's from_logits: the outputs are logits; else probabilities (the last
  /// layer's sigmoid), clipped to [1e-7, 1 - 1e-7] as Keras clips them.
  bool from_logits = true;
  /// Cross-entropies' label_smoothing: targets t(1 - s) + s / units (categorical), t(1 - s) +
  /// s / 2 (binary).
  float smoothing = 0;
};

/// The dropout factor of probability `index` of probs ((pair x t + i) x t + j): 0, or
/// 1 / (1 - dropout), a pure function of s.stream and index (the Dropout layer's rule).
inline float attention_keep(const AttentionShape& s, size_t index) {
  if (s.dropout <= 0) return 1.0f;
  return unit_float(mix64(s.stream ^ index)) >= s.dropout ? 1.0f / (1.0f - s.dropout) : 0.0f;
}

/// Batch normalization's shape: n examples of c channels of hw pixels each (NCHW), normalized
/// per channel over n x hw values (Keras's BatchNormalization on the channels axis).
struct NormShape {
  int n = 1, c = 1, hw = 1;
  /// A ReLU fused after it: the output is max(y, 0), and backward's dy is the gradient of that
  /// output (masked where it is 0) (docs/design.md#batch-normalization).
  bool relu = false;
  /// x, y and their gradients in blocks of channels (the oneDNN backend's training and
  /// inference passes; not the synchronized layer's pieces).
  Layout layout = Layout::kPlain;
  /// Where the training forward also writes its output y, or the backward its dx, rounded to
  /// bf16 in the same layout: a rounded copy for the convolution that reads that tensor next
  /// (docs/design.md#rounded-copies). Null: nowhere. Only a backend that makes_rounded_copies()
  /// is handed one, and it writes it.
  uint16_t* rounded = nullptr;
  /// With rounded: nobody reads the forward's y (the backward's dx), only its copy
  /// (Backend::conv2d_forward_reads_rounded_only, conv2d_backward_reads_rounded_only), so a pass
  /// that writes the copy beside each value may leave y (dx) unwritten; a backward after such a
  /// forward is given no y (docs/design.md#rounded-copies).
  bool rounded_only = false;
  size_t count() const { return static_cast<size_t>(n) * c * hw; }
};

/// Where one example's output pixels come from (remap2d): output pixel (r, q) reads input pixel
/// (row0 + r * row_step, col0 + q * col_step), or is 0 where that is outside the input. A shift,
/// a crop, zero padding and a flip (a step of -1) are each one map.
struct PixelMap {
  int32_t row0 = 0, col0 = 0, row_step = 1, col_step = 1;
};

/// Eltwise f's name (worker/spec/shapes.h): "sigmoid", "tanh", "gelu", "swish".
const char* eltwise_name(Eltwise f);

/// One example's translation (translate2d): output pixel (r, q) reads the input at (r - dy,
/// q - dx), in pixels, fractions included (Keras's RandomTranslation, an affine_transform).
struct Shift2d {
  float dy = 0, dx = 0;
};
/// n examples of c channels of h x w pixels, read bilinearly (or at the nearest pixel) and
/// filled as `fill` says.
struct TranslateShape {
  int n = 1, c = 1, h = 1, w = 1;
  bool bilinear = true;
  FillMode fill = FillMode::kReflect;
  float fill_value = 0;
  size_t count() const { return static_cast<size_t>(n) * c * h * w; }
};

/// Every method overwrites its outputs (nothing accumulates unless it says so), blocks until the
/// result is in place (host) or is enqueued in order on the device's compute stream (CUDA), and
/// is called from one thread, the same one for the backend's whole life (oneDNN primitives run on
/// the thread that made them). No method waits for the device. Shapes are validated by the
/// layers; a backend may DT_ENFORCE them. Primitives for a shape are made once and reused.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  /// The device whose memory every pointer below is in; owned by the backend.
  virtual Device& device() = 0;
  /// Changes whenever the backend replaces internal scratch memory (a workspace that grew), so a
  /// recorded graph that points into the old memory must be recorded again.
  virtual uint64_t scratch_generation() const { return 0; }
  /// How this backend's products compute (kFloat32 unless it was made for another mode).
  virtual MathMode math_mode() const { return MathMode::kFloat32; }
  /// The kernels the library dispatched to so far, for the log ("convolution jit:avx512_core;
  /// matmul brg:avx512_core_bf16"); empty where the backend does not say.
  virtual std::string implementations() const { return {}; }

  /// Whether this backend holds activations in blocks of channels (Layout::kBlocked) where the
  /// model asks: its convolutions, batch normalization and reorder_channels take them, and every
  /// elementwise operation is indifferent to the layout (docs/design.md#blocked-activations).
  virtual bool blocks_channels() const { return false; }
  /// n examples of c channels (a multiple of kChannelBlock) of hw pixels from x in one layout to
  /// y in the other: to Layout::kBlocked from plain, or back. Data movement only: exact.
  virtual void reorder_channels(int /*n*/, int /*c*/, int /*hw*/, Layout /*to*/, const float* /*x*/,
                                float* /*y*/) {
    unsupported("reorder_channels");
  }

  /// Whether this backend's convolutions read bf16 copies of their input and of their output's
  /// gradient, and its batch normalization writes them (NormShape::rounded), so that the model
  /// keeps a rounded copy beside each such tensor and the convolution does not round it again
  /// (docs/design.md#rounded-copies): the oneDNN backend in mixed_bfloat16 on a CPU with
  /// AVX512_BF16.
  virtual bool makes_rounded_copies() const { return false; }
  /// conv2d_forward with x16, x rounded to bf16 in x's layout (a rounded copy), which the backend
  /// may read instead of rounding x itself: the same y. x16 stays unchanged with x until the
  /// backward of this forward, which may read it too.
  virtual void conv2d_forward_rounded(const ConvShape& s, const float* x, const uint16_t* /*x16*/,
                                      const float* w, const float* b, float* y) {
    conv2d_forward(s, x, w, b, y);
  }
  /// conv2d_backward with dy16, dy rounded to bf16 in dy's layout (a rounded copy), which the
  /// backend may read instead of rounding dy itself: the same gradients.
  virtual void conv2d_backward_rounded(const ConvShape& s, const float* x, const float* dy,
                                       const uint16_t* /*dy16*/, const float* w, float* dx,
                                       float* dw, float* db,
                                       const std::function<void()>& weights_done) {
    conv2d_backward(s, x, dy, w, dx, dw, db, weights_done);
  }
  /// True when conv2d_backward_rounded on s reads dy16 and never dy, so that the normalization
  /// that writes the copy need not write dy itself (NormShape::rounded_only). Asked per call, as
  /// the answer may depend on the batch.
  virtual bool conv2d_backward_reads_rounded_only(const ConvShape& /*s*/) { return false; }
  /// True when conv2d_forward_rounded on s reads x16 and never x, nor does the backward of that
  /// forward (x16 is unchanged until then), so that the normalization that writes the copy need
  /// not write x itself. Asked per call.
  virtual bool conv2d_forward_reads_rounded_only(const ConvShape& /*s*/) { return false; }
  /// y = conv(x, w) + b.  x: n,c,h,w  w: k,c,kh,kw  b: k  y: n,k,oh,ow
  virtual void conv2d_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                              float* y) = 0;
  /// y = relu(conv(x, w) + b): conv2d_forward then relu_forward, in one pass over y where the
  /// backend can fuse them (CUDA: cuDNN's fused convolution or one epilogue kernel).
  virtual void conv2d_relu_forward(const ConvShape& s, const float* x, const float* w,
                                   const float* b, float* y) {
    conv2d_forward(s, x, w, b, y);
    relu_forward(s.output_count(), y, y);
  }
  /// conv2d_backward_weights of dz = dy where y > 0 (ReLU's gradient; y the forward output), with
  /// the mask fused into the reduction where the backend can (CUDA, small filters); else dz is
  /// written to scratch (s.output_count() floats) first.
  virtual void conv2d_relu_backward_weights(const ConvShape& s, const float* x, const float* y,
                                            const float* dy, float* dw, float* db, float* scratch) {
    relu_backward(s.output_count(), y, dy, scratch);
    conv2d_backward_weights(s, x, scratch, dw, db);
  }
  /// A layer's whole backward: conv2d_backward_weights(x, dy), then weights_done() (when set),
  /// then conv2d_backward_data(dy, w) into dx unless dx is null; for an x unchanged since this
  /// shape's last conv2d_forward (or conv2d_relu_forward) of x. A backend may reuse what that
  /// forward made of x, and what the first product made of dy (the oneDNN backend: their blocked
  /// copies, docs/design.md#convolution-layouts).
  virtual void conv2d_backward(const ConvShape& s, const float* x, const float* dy, const float* w,
                               float* dx, float* dw, float* db,
                               const std::function<void()>& weights_done) {
    conv2d_backward_weights(s, x, dy, dw, db);
    if (weights_done) weights_done();
    if (dx) conv2d_backward_data(s, dy, w, dx);
  }
  /// dx from dy and w.
  virtual void conv2d_backward_data(const ConvShape& s, const float* dy, const float* w,
                                    float* dx) = 0;
  /// dw and db from x and dy.
  virtual void conv2d_backward_weights(const ConvShape& s, const float* x, const float* dy,
                                       float* dw, float* db) = 0;

  /// y = x w + b.  x: n,in  w: in,out  b: out  y: n,out
  virtual void dense_forward(int n, int in, int out, const float* x, const float* w, const float* b,
                             float* y) = 0;
  /// y = relu(x w + b): dense_forward then relu_forward, fused where the backend can.
  virtual void dense_relu_forward(int n, int in, int out, const float* x, const float* w,
                                  const float* b, float* y) {
    dense_forward(n, in, out, x, w, b, y);
    relu_forward(static_cast<size_t>(n) * out, y, y);
  }
  /// dx = dy w^T.
  virtual void dense_backward_data(int n, int in, int out, const float* dy, const float* w,
                                   float* dx) = 0;
  /// dw = x^T dy, db = column sums of dy.
  virtual void dense_backward_weights(int n, int in, int out, const float* x, const float* dy,
                                      float* dw, float* db) = 0;
  /// Rows [row_begin, row_end) of dw = x^T dy only (dw points at row 0), so a large kernel's
  /// gradient can be produced, and all-reduced, in pieces.
  virtual void dense_backward_weight_rows(int n, int in, int out, const float* x, const float* dy,
                                          float* dw, int row_begin, int row_end) = 0;
  /// db = column sums of dy.
  virtual void dense_backward_bias(int n, int out, const float* dy, float* db) = 0;
  /// Says that dy (count floats) stays as it is until end_dense_backward(): the dense backward
  /// calls between them that take it may share what the backend makes of it (the oneDNN
  /// backend's bf16 rounding, once for the weight gradient's pieces and dx). A hint: by
  /// default nothing. layers/layer_parts.h's HeldGradient calls both.
  virtual void begin_dense_backward(const float* /*dy*/, size_t /*count*/) {}
  virtual void end_dense_backward() {}

  /// y = max(x, 0); y may be x.
  virtual void relu_forward(size_t count, const float* x, float* y) = 0;
  /// dx = dy where y > 0, else 0 (y is the forward output); dx may be dy.
  virtual void relu_backward(size_t count, const float* y, const float* dy, float* dx) = 0;
  /// dx = dy + addend where y > 0, else 0: a gradient whose last share (addend) is added as the
  /// mask is applied (docs/design.md#fusion). The bits of add then relu_backward, which the
  /// default runs; a backend may do it in one pass. dx may be dy; addend is neither.
  virtual void relu_backward_added(size_t count, const float* y, const float* dy,
                                   const float* addend, float* dx) {
    if (dx != dy) device().copy(dx, dy, count * sizeof(float));
    add(count, addend, dx);
    relu_backward(count, y, dx, dx);
  }

  /// y = f(x) elementwise; y may be x.
  virtual void eltwise_forward(Eltwise /*f*/, size_t /*count*/, const float* /*x*/, float* /*y*/) {
    unsupported("eltwise_forward");
  }
  /// dx = dy * f'(x), x the forward's input; dx may be dy.
  virtual void eltwise_backward(Eltwise /*f*/, size_t /*count*/, const float* /*x*/,
                                const float* /*dy*/, float* /*dx*/) {
    unsupported("eltwise_backward");
  }

  /// Bytes of the workspace max pooling keeps between forward and backward for shape s.
  virtual size_t maxpool_workspace_bytes(const PoolShape& s) = 0;
  virtual void maxpool_forward(const PoolShape& s, const float* x, float* y, void* workspace) = 0;
  /// dx (n,c,h,w) from dy (n,c,oh,ow) and the forward's workspace.
  virtual void maxpool_backward(const PoolShape& s, const float* dy, const void* workspace,
                                float* dx) = 0;

  /// y = x * scale + offset elementwise (Keras's Rescaling, in that order of operations); y may
  /// be x.
  virtual void scale_shift(size_t /*count*/, float /*scale*/, float /*offset*/, const float* /*x*/,
                           float* /*y*/) {
    unsupported("scale_shift");
  }
  /// n examples of m floats each: y[i m + j] = x[i m + index[j]], index (device memory, m of
  /// them) a permutation of [0, m). Data movement only: exact.
  virtual void permute_forward(int /*n*/, int /*m*/, const int32_t* /*index*/, const float* /*x*/,
                               float* /*y*/) {
    unsupported("permute_forward");
  }
  /// Its transpose (and inverse): dx[i m + index[j]] = dy[i m + j].
  virtual void permute_backward(int /*n*/, int /*m*/, const int32_t* /*index*/, const float* /*dy*/,
                                float* /*dx*/) {
    unsupported("permute_backward");
  }

  /// Average pooling (PoolShape: each window's mean over its elements inside the input).
  virtual void avgpool_forward(const PoolShape& /*s*/, const float* /*x*/, float* /*y*/) {
    unsupported("avgpool_forward");
  }
  /// dx (n,c,h,w) from dy (n,c,oh,ow): each output's dy shared evenly by its window's inputs.
  virtual void avgpool_backward(const PoolShape& /*s*/, const float* /*dy*/, float* /*dx*/) {
    unsupported("avgpool_backward");
  }

  /// Sparse categorical cross-entropy of logits (n, classes) against labels (device memory,
  /// each in [0, classes)). Writes the gradient of the MEAN loss, dlogits = (softmax - onehot) / n,
  /// unless dlogits is null, and ADDS to totals[0] the sum of the rows' losses, to totals[1] the
  /// number of rows whose (first) arg-max is the label, and to totals[2] n. Nothing is read back.
  virtual void softmax_cross_entropy(int n, int classes, const float* logits, const int32_t* labels,
                                     float* dlogits, float* totals) = 0;
  /// The same against smoothed targets, as Keras's CategoricalCrossentropy(label_smoothing) on
  /// one-hot labels: t = (1 - smoothing) * onehot + smoothing / classes, row loss -sum t log
  /// softmax, dlogits = (softmax - t) / n; accuracy still against the label. smoothing 0 is
  /// softmax_cross_entropy.
  virtual void softmax_cross_entropy_smoothed(int n, int classes, float smoothing,
                                              const float* logits, const int32_t* labels,
                                              float* dlogits, float* totals) {
    if (smoothing != 0.0f) unsupported("softmax_cross_entropy_smoothed");
    softmax_cross_entropy(n, classes, logits, labels, dlogits, totals);
  }

  /// A loss against float targets (TargetLossShape), as Keras computes it: each row's loss is the
  /// mean over its units (categorical: -sum t log softmax(outputs), the softmax applied here as
  /// for softmax_cross_entropy). targets holds n * units floats' bits (data::target_word), in
  /// device memory. Writes the gradient of the MEAN row loss unless doutputs is null, and ADDS to
  /// totals[0] the rows' loss, to totals[1] the rows' companion metric (categorical: argmax of the
  /// outputs is argmax of the targets; binary: the share of units whose prediction, p > 0.5, is
  /// the target's, t > 0.5; mean_squared_error: the mean absolute error; mean_absolute_error: the
  /// mean squared error) and to totals[2] n. Rows in order, in double: the same bits at any
  /// thread count.
  virtual void target_loss(const TargetLossShape& /*s*/, const float* /*outputs*/,
                           const int32_t* /*targets*/, float* /*doutputs*/, float* /*totals*/) {
    unsupported("target_loss");
  }

  /// y += x.
  virtual void add(size_t count, const float* x, float* y) = 0;
  /// y = x[0] + x[1] + ... + x[inputs - 1], added in that order, then max(y, 0) when relu (Keras's
  /// Add with a ReLU fused after it, docs/design.md#fusion): the bits of a copy, the adds and
  /// relu_forward, which the default runs; a backend may do it in one pass. y is none of x.
  virtual void add_forward(size_t count, const float* const* x, int inputs, bool relu, float* y) {
    device().copy(y, x[0], count * sizeof(float));
    for (int i = 1; i < inputs; ++i) add(count, x[i], y);
    if (relu) relu_forward(count, y, y);
  }

  /// Batch normalization in training: each channel's mean and variance (biased, as Keras's
  /// moments) over the batch, written to mean and var (c floats each), and
  /// y = (x - mean) / sqrt(var + epsilon) * gamma + beta (gamma null: 1; beta null: 0).
  /// Each channel is reduced in a fixed order, so the result does not depend on threads.
  virtual void batchnorm_forward_training(const NormShape& /*s*/, float /*epsilon*/,
                                          const float* /*x*/, const float* /*gamma*/,
                                          const float* /*beta*/, float* /*y*/, float* /*mean*/,
                                          float* /*var*/) {
    unsupported("batchnorm_forward_training");
  }
  /// Batch normalization with given statistics (the moving ones): the same y.
  virtual void batchnorm_forward_inference(const NormShape& /*s*/, float /*epsilon*/,
                                           const float* /*x*/, const float* /*gamma*/,
                                           const float* /*beta*/, const float* /*mean*/,
                                           const float* /*var*/, float* /*y*/) {
    unsupported("batchnorm_forward_inference");
  }
  /// A residual block's batch normalization with the add after it (and the add's ReLU, relu):
  /// batchnorm_forward_training (s.relu false), then y += addend, then max(y, 0) when relu; the
  /// bits of the three, which the default runs; a backend may take the add into its output pass
  /// (docs/design.md#fusion). addend is not y.
  virtual void batchnorm_add_forward_training(const NormShape& s, float epsilon, const float* x,
                                              const float* gamma, const float* beta,
                                              const float* addend, bool relu, float* y, float* mean,
                                              float* var) {
    batchnorm_forward_training(s, epsilon, x, gamma, beta, y, mean, var);
    add(s.count(), addend, y);
    if (relu) relu_forward(s.count(), y, y);
  }
  /// The same after batchnorm_forward_inference.
  virtual void batchnorm_add_forward_inference(const NormShape& s, float epsilon, const float* x,
                                               const float* gamma, const float* beta,
                                               const float* mean, const float* var,
                                               const float* addend, bool relu, float* y) {
    batchnorm_forward_inference(s, epsilon, x, gamma, beta, mean, var, y);
    add(s.count(), addend, y);
    if (relu) relu_forward(s.count(), y, y);
  }
  /// The training forward's gradients, with xhat = (x - mean) / sqrt(var + epsilon) and sums
  /// over each channel's n x hw values: dbeta = sum(dy), dgamma = sum(dy * xhat) (each null when
  /// not wanted), dx = gamma / sqrt(var + epsilon) * (dy - mean(dy) - xhat * mean(dy * xhat))
  /// (null: not wanted; gamma null: 1). With s.relu, dy is first taken as 0 where the forward's
  /// output y (read only then) is not positive, as relu_backward would.
  virtual void batchnorm_backward(const NormShape& /*s*/, float /*epsilon*/, const float* /*x*/,
                                  const float* /*y*/, const float* /*dy*/, const float* /*gamma*/,
                                  const float* /*mean*/, const float* /*var*/, float* /*dx*/,
                                  float* /*dgamma*/, float* /*dbeta*/) {
    unsupported("batchnorm_backward");
  }
  /// Synchronized batch normalization's pieces (docs/design.md#synchronized-batch-normalization),
  /// between which the layer sums over the group. Per channel, over its n x hw values in the
  /// training forward's fixed order: sums = sum(x) (center null), or sum((x - center)^2).
  virtual void batchnorm_sums(const NormShape& /*s*/, const float* /*x*/, const float* /*center*/,
                              float* /*sums*/) {
    unsupported("batchnorm_sums");
  }
  /// batchnorm_backward's dx from sums over a larger batch: totals holds sum(dy) (c floats) then
  /// sum(dy * xhat) (c floats) over `count` values per channel (every worker's), where
  /// batchnorm_backward takes this batch's own. With s.relu, dy is masked by y as there.
  virtual void batchnorm_backward_data(const NormShape& /*s*/, float /*epsilon*/,
                                       const float* /*x*/, const float* /*y*/, const float* /*dy*/,
                                       const float* /*gamma*/, const float* /*mean*/,
                                       const float* /*var*/, const float* /*totals*/,
                                       double /*count*/, float* /*dx*/) {
    unsupported("batchnorm_backward_data");
  }
  /// Keras's Embedding (docs/design.md#sequences): rows token ids (floats holding exact
  /// integers) each pick a row of table (input_dim x output_dim): row r of y (rows x output_dim)
  /// is table row ids[r]. An id that is not an integer in [0, input_dim) is never read through:
  /// the host backends throw EnforceError naming it. Data movement only: exact.
  virtual void embedding_forward(int /*rows*/, int /*input_dim*/, int /*output_dim*/,
                                 const float* /*ids*/, const float* /*table*/, float* /*y*/) {
    unsupported("embedding_forward");
  }
  /// Its gradient: dtable (input_dim x output_dim, overwritten) row k is the sum of dy's rows r
  /// with ids[r] = k, added in token order (r ascending), so the bits do not depend on threads.
  virtual void embedding_backward(int /*rows*/, int /*input_dim*/, int /*output_dim*/,
                                  const float* /*ids*/, const float* /*dy*/, float* /*dtable*/) {
    unsupported("embedding_backward");
  }
  /// Keras's LayerNormalization on the last axis: each of rows rows of `features` values is
  /// normalized by its own mean and biased variance, y = (x - mean) * rstd * gamma + beta with
  /// rstd = 1 / sqrt(var + epsilon) (gamma null: 1; beta null: 0); mean and rstd (rows floats
  /// each) are written for the backward. Each row is reduced in a fixed order.
  virtual void layernorm_forward(int /*rows*/, int /*features*/, float /*epsilon*/,
                                 const float* /*x*/, const float* /*gamma*/, const float* /*beta*/,
                                 float* /*y*/, float* /*mean*/, float* /*rstd*/) {
    unsupported("layernorm_forward");
  }
  /// Its gradients from the forward's mean and rstd, with xhat = (x - mean) * rstd and g = dy *
  /// gamma: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) over each row's features (null: not
  /// wanted); dgamma = sum over rows of dy * xhat, dbeta = sum over rows of dy (each null when
  /// not wanted), summed in row order.
  virtual void layernorm_backward(int /*rows*/, int /*features*/, const float* /*x*/,
                                  const float* /*dy*/, const float* /*gamma*/,
                                  const float* /*mean*/, const float* /*rstd*/, float* /*dx*/,
                                  float* /*dgamma*/, float* /*dbeta*/) {
    unsupported("layernorm_backward");
  }
  /// Attention: probs[b, h, i, :] = softmax over the keys j position i sees of scale * q[b, i, h]
  /// . k[b, j, h] (0 where masked), y[b, i, h] = sum_j probs[b, h, i, j] v[b, j, h]; probs is kept
  /// for the backward. Each (example, head) reduced in a fixed order.
  virtual void attention_forward(const AttentionShape& /*s*/, const float* /*q*/,
                                 const float* /*k*/, const float* /*v*/, float* /*probs*/,
                                 float* /*y*/) {
    unsupported("attention_forward");
  }
  /// Its gradients from the forward's probs: dq, dk and dv (overwritten) from dy.
  virtual void attention_backward(const AttentionShape& /*s*/, const float* /*q*/,
                                  const float* /*k*/, const float* /*v*/, const float* /*probs*/,
                                  const float* /*dy*/, float* /*dq*/, float* /*dk*/,
                                  float* /*dv*/) {
    unsupported("attention_backward");
  }
  /// y (n,c,oh,ow) from x (n,c,h,w), example i by maps[i] (host memory, n of them), every
  /// channel alike. Data movement only: exact.
  virtual void remap2d_forward(int /*n*/, int /*c*/, int /*h*/, int /*w*/, int /*oh*/, int /*ow*/,
                               const PixelMap* /*maps*/, const float* /*x*/, float* /*y*/) {
    unsupported("remap2d_forward");
  }
  /// Its transpose: dx (n,c,h,w) is 0 but where an output pixel read from, which gets that
  /// pixel's dy (maps that read each input pixel at most once, as every map above does).
  virtual void remap2d_backward(int /*n*/, int /*c*/, int /*h*/, int /*w*/, int /*oh*/, int /*ow*/,
                                const PixelMap* /*maps*/, const float* /*dy*/, float* /*dx*/) {
    unsupported("remap2d_backward");
  }
  /// y (n,c,h,w) from x (n,c,h,w), example i translated by shifts[i] (host memory, n of them),
  /// every channel alike: each output pixel a bilinear (or nearest) read of the input, with the
  /// fill mode outside it.
  virtual void translate2d_forward(const TranslateShape& /*s*/, const Shift2d* /*shifts*/,
                                   const float* /*x*/, float* /*y*/) {
    unsupported("translate2d_forward");
  }
  /// Its transpose: dx = the sum, over the output pixels, of dy times each input pixel's weight
  /// in them (the fill value's share has no gradient).
  virtual void translate2d_backward(const TranslateShape& /*s*/, const Shift2d* /*shifts*/,
                                    const float* /*dy*/, float* /*dx*/) {
    unsupported("translate2d_backward");
  }
  /// Keras's moving average of statistics summed over `shards` batches: moving = moving *
  /// momentum + (sum / shards) * (1 - momentum), for count values.
  virtual void moving_average_update(size_t /*count*/, float /*momentum*/, int /*shards*/,
                                     const float* /*sum*/, float* /*moving*/) {
    unsupported("moving_average_update");
  }
  /// Inverted dropout: mask[i] = (unit_float(mix64(key ^ i)) >= rate) / (1 - rate) (random.h),
  /// y = x * mask. y may be x.
  virtual void dropout_forward(size_t count, float rate, uint64_t key, const float* x, float* y,
                               float* mask) = 0;
  /// y = a * b elementwise; y may be a.
  virtual void multiply(size_t count, const float* a, const float* b, float* y) = 0;

  /// Keras SGD on count parameters: v = momentum * v - lr * g; w += v (nesterov: w += momentum * v
  /// - lr * g); without momentum w -= lr * g and velocity is unused (may be null).
  virtual void sgd_update(const SgdParams& p, size_t count, float* w, const float* g,
                          float* velocity) = 0;
  /// Keras Adam, step t >= 1: m, v moments; lr_t = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t);
  /// w -= lr_t * m / (sqrt(v) + epsilon).
  virtual void adam_update(const AdamParams& p, int64_t step, size_t count, float* w,
                           const float* g, float* m, float* v) = 0;
  /// Keras RMSprop: v = rho * v + (1 - rho) * g^2; centered: a = rho * a + (1 - rho) * g and
  /// d = v - a^2 + epsilon, else d = v + epsilon; inc = lr * g / sqrt(d); with momentum
  /// mom = momentum * mom + inc, w -= mom, else w -= inc. momentum_slot is used only when
  /// p.momentum > 0 and average_gradient only when p.centered (otherwise they may be null).
  virtual void rmsprop_update(const RmspropParams& p, size_t count, float* w, const float* g,
                              float* velocity, float* momentum_slot, float* average_gradient) = 0;
  /// Keras 3's weight decay of count parameters (DecayParams), gated as the updates are.
  virtual void decay_weights(const DecayParams& /*p*/, size_t /*count*/, float* /*w*/) {
    unsupported("decay_weights");
  }
  /// Keras's L1L2 regularizer of count weights (docs/design.md#regularizers-and-clipping): g +=
  /// l1 * sign(w) + 2 * l2 * w, and ADDS its penalty l1 * sum|w| + l2 * sum w^2 to *penalty
  /// (one float in device memory; the sums in a fixed order).
  virtual void regularize(size_t /*count*/, float /*l1*/, float /*l2*/, const float* /*w*/,
                          float* /*g*/, float* /*penalty*/) {
    unsupported("regularize");
  }
  /// totals[0] += *penalty * totals[2]: a step's loss sum (StepStats) gains the penalty once per
  /// example, as Keras's mean loss does once per batch.
  virtual void add_penalty(const float* /*penalty*/, float* /*totals*/) {
    unsupported("add_penalty");
  }
  /// ADDS sum g^2 (in a fixed order) to *sum (one float in device memory).
  virtual void sum_squares(size_t /*count*/, const float* /*g*/, float* /*sum*/) {
    unsupported("sum_squares");
  }
  /// Keras's gradient clipping by the norm sqrt(*sum) (sum_squares's): per tensor (clipnorm) g =
  /// g * clip / max(norm, clip); over all (global_clipnorm) g *= clip * min(1 / norm, 1 / clip),
  /// NaN when the norm is not finite.
  virtual void clip_by_norm(size_t /*count*/, float /*clip*/, bool /*global*/, const float* /*sum*/,
                            float* /*g*/) {
    unsupported("clip_by_norm");
  }
  /// Keras AdamW, step t >= 1: the decoupled decay w -= w * weight_decay * lr first (Keras's
  /// _apply_weight_decay, with the step's unadjusted rate), then Adam's update as above.
  virtual void adamw_update(const AdamWParams& p, int64_t step, size_t count, float* w,
                            const float* g, float* m, float* v) = 0;

  /// Loss scaling (docs/design.md#loss-scaling). The scale lives in device memory, so a step
  /// that reads it can be replayed while it changes. x *= *factor (the loss gradient times the
  /// scale).
  virtual void scale(size_t count, const float* factor, float* x) = 0;
  /// g /= *scale (the reduced gradients back to the loss's). When nonfinite is not null, sets
  /// *nonfinite = 1 if any result is infinite or NaN and leaves it as it was otherwise, so one
  /// flag, zeroed by the caller, covers several ranges. Nothing is read back.
  virtual void unscale_gradients(size_t count, const float* scale, float* g, float* nonfinite) = 0;
  /// Keras's dynamic rule on a state in device memory, after a step's unscale and optimizer:
  /// state[kLossScale] the scale, state[kGoodSteps] finite steps in a row, state[kNonfinite] the
  /// step's flag (moved to state[kPreviousSkipped], then cleared), state[kSkipped] steps skipped
  /// so far. Flag raised: the scale halves, the count restarts and the skip count grows. Else the
  /// count grows, and at growth_steps it restarts and the scale doubles unless that overflows.
  /// Nothing is read back.
  virtual void update_loss_scale(float* state, int64_t growth_steps) = 0;
  static constexpr size_t kLossScale = 0, kGoodSteps = 1, kNonfinite = 2, kSkipped = 3,
                          kPreviousSkipped = 4, kLossScaleFloats = 5;

 protected:
  /// An operation this backend does not have yet: EnforceError naming it (a model whose layers
  /// need it is refused before it gets here: worker/nn/model.h).
  [[noreturn]] void unsupported(const char* operation) const;
};

/// The oneDNN backend (dnnl_backend.cc), on its own host device, computing its products in
/// `mode` (kTf32 computes in float32 on the CPU). ConfigError when the CPU cannot compute in
/// `mode` (cpu_supports). It blocks channels (blocks_channels) where the CPU has AVX-512.
std::unique_ptr<Backend> make_dnnl_backend(MathMode mode = MathMode::kFloat32);
/// The same backend keeping every activation plain NCHW (a test's or a benchmark's comparison).
std::unique_ptr<Backend> make_plain_dnnl_backend(MathMode mode = MathMode::kFloat32);
/// Whether this CPU multiplies in `mode` natively (bf16: AVX512_BF16 or AMX, as oneDNN
/// dispatches; fp16: never on the CPU for now), and the ISA oneDNN dispatches to, by name.
bool cpu_supports(MathMode mode);
std::string cpu_isa_name();
/// The vector instruction sets of dtrain's own CPU kernels (the direct convolution, bf16
/// rounding and packing).
enum class VectorIsa { kAvx2, kAvx512, kAvx512Bf16 };
/// Whether dtrain's own kernels may use `isa`: oneDNN dispatches to it or to a wider one. The
/// CPU's own answer, capped as oneDNN is by ONEDNN_MAX_CPU_ISA, so that one setting runs the
/// whole CPU backend as on a smaller CPU (docs/testing.md#a-smaller-cpu). Callers still check
/// the CPU's own flags for what oneDNN's levels do not imply.
bool own_kernels_may_use(VectorIsa isa);
/// The CUDA backend (cuda/cuda_backend.cu) on its own CUDA device (the first visible GPU),
/// computing its products in `mode`. In a CPU-only build it throws ConfigError.
std::unique_ptr<Backend> make_cuda_backend(MathMode mode = MathMode::kFloat32);
/// The naive reference backend (reference_backend.cc): plain loops in double where it matters.
/// In kBfloat16 each product's inputs are rounded to bf16 first (the oracle for that mode);
/// kTf32 computes in float32; kFloat16 is refused.
std::unique_ptr<Backend> make_reference_backend(MathMode mode = MathMode::kFloat32);

}  // namespace dtrain::nn
