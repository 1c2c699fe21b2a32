// What a built layer of a Model is (docs/design.md#the-model-as-a-graph): parameters and
// non-trainable state as views into the model's flat buffers, forward and backward through a
// Backend. Its parsed keys (a LayerConfig, which knows the shapes but no memory) are the spec
// library's (worker/spec/layer_config.h). A kind of layer is its spec files in
// worker/spec/layers/, its runtime file in worker/nn/layers/, and one line each of
// worker/spec/layer_registry.cc and layer_builders.cc; nothing else knows its kind. Buffers
// belong to the Model; a layer keeps only its own scratch (a ReLU's gradient, a pooling
// workspace, a dropout mask) in the device's memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/nn/backend.h"
#include "worker/spec/layer_config.h"

namespace dtrain::nn {

/// One named tensor inside a flat buffer (parameters, or non-trainable state).
struct ParamInfo {
  std::string name;            ///< "layers.0.conv2d.kernel" (the model's); "kernel" (a layer's)
  std::vector<int64_t> shape;  ///< conv kernel k,c,kh,kw; dense kernel in,out; bias n
  size_t offset = 0;           ///< in floats, into the flat buffer
  size_t count = 0;
  /// Keras's L1L2 regularizer of a parameter (kernel_regularizer, bias_regularizer): the loss
  /// gains l1 * sum|w| + l2 * sum w^2 (0, 0: none). The step applies it (worker/train).
  float l1 = 0, l2 = 0;
};

/// A range of a flat parameter or gradient buffer: [offset, offset + count), in floats.
struct ParamRange {
  size_t offset = 0;
  size_t count = 0;
};

/// Gradients of a dense kernel larger than this are produced in pieces of about this many floats
/// (whole rows), so the all-reduce of the first piece starts while the rest are computed.
constexpr size_t kGradientPieceFloats = size_t{1} << 19;

/// Where a draw comes from: randomness depends only on these and the layer's index.
struct StepKey {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t step = 0;
  /// The virtual shard of the global batch this forward computes (TrainStep sets it), so that
  /// per-example draws (augmentation) differ across the global batch and do not depend on who
  /// holds the shard. Dropout does not use it (its masks keep their bits).
  int64_t shard = 0;
};

/// Sums count floats of host memory in place over every worker's batch of the training step, in
/// rank order, the same bits on every worker (an all-reduce the step provides:
/// docs/design.md#synchronized-batch-normalization). Every worker calls it at the same points
/// of its step, in the same order.
using GroupSum = std::function<void(float* data, size_t count)>;

/// One call of forward: n examples, every pointer in the backend's device memory.
struct ForwardArgs {
  int n = 0;
  const std::vector<const float*>& x;  ///< one per input, in the node's order
  float* y;
  const float* params;  ///< this layer's parameters (null when it has none)
  float* state;         ///< this layer's non-trainable state (null when it has none)
  const StepKey& key;
  bool training;
  /// Where a training forward writes this layer's batch statistics (statistics_count() floats);
  /// null outside training.
  float* statistics = nullptr;
  /// In a training step of a group: sums over every worker's batch (null: this batch is the
  /// whole batch: a worker alone, a test, or outside training).
  const GroupSum* group = nullptr;
  /// Only to a layer that took an add in (fuse_add): the add's other input; y is then the add's
  /// output.
  const float* addend = nullptr;
  /// Rounded copies (docs/design.md#rounded-copies), in a training forward only: to a layer that
  /// writes_rounded(), where it writes y rounded to bf16 as well; to one that reads_rounded(), x[0]
  /// rounded, which it may read instead (unchanged until its backward). Null: none.
  uint16_t* y_rounded = nullptr;
  const uint16_t* x_rounded = nullptr;
  /// With y_rounded: every layer that reads y reads only its copy (reads_only_rounded_x), so a
  /// layer whose own backward does not need y either may leave y unwritten
  /// (NormShape::rounded_only).
  bool y_rounded_only = false;
};

/// One call of backward, after the forward of the same examples.
struct BackwardArgs {
  int n = 0;
  const std::vector<const float*>& x;
  const float* y;
  const float* dy;
  /// Where each input's gradient goes (overwritten), or null where nobody needs it (the model's
  /// input). The model adds it to the input's gradient itself when that input fans out.
  const std::vector<float*>& dx;
  const float* params;
  float* grads;  ///< this layer's gradients, overwritten
  /// The forward's GroupSum, for the backward of the same step (null when the forward had none).
  const GroupSum* group = nullptr;
  /// Only to a layer that takes_gradient_addend(): when set, the output's gradient is dy +
  /// dy_addend (a user's share the model has not added into dy, docs/design.md#fusion).
  const float* dy_addend = nullptr;
  /// Rounded copies, as ForwardArgs's: where a layer that writes_rounded() writes dx[0] rounded as
  /// well; dy rounded, for a layer that reads_rounded(). Null: none.
  uint16_t* dx_rounded = nullptr;
  const uint16_t* dy_rounded = nullptr;
  /// With dx_rounded: the layer that reads dx[0] reads only its copy (reads_only_rounded_dy), so
  /// dx[0] itself may be left unwritten (NormShape::rounded_only).
  bool dx_rounded_only = false;
};

/// What a layer does with activations in blocks of channels (Layout::kBlocked), which the model
/// hands it where the backend blocks channels (docs/design.md#blocked-activations).
enum class Blocking {
  kNone,     ///< its inputs and output are plain
  kAny,      ///< each input and its output may be either, independently (a convolution)
  kFollows,  ///< its inputs and output share one layout, either (elementwise, normalization)
  kReads,    ///< its inputs may be either; its output is plain (global average pooling)
};

class Layer {
 public:
  virtual ~Layer() = default;
  /// Parameter tensors relative to this layer's start in the flat parameter buffer, named
  /// relative to the layer ("kernel", "bias"), in Keras's order of the layer's weights.
  virtual std::vector<ParamInfo> params() const { return {}; }
  /// Non-trainable state, relative to the layer's start in the model's flat state buffer
  /// ("moving_mean"): checkpointed and shared with the parameters, never all-reduced as a
  /// gradient.
  virtual std::vector<ParamInfo> state() const { return {}; }
  /// Floats of batch statistics its training forward writes each step (BatchNormalization's
  /// mean and variance). The step sums them over the virtual shards of the global batch, in
  /// shard order, before update_state (docs/design.md#batch-normalization). 0: none.
  virtual size_t statistics_count() const { return 0; }
  /// After a training step's statistics were summed over `shards` batches: updates the state
  /// from them (a moving average).
  virtual void update_state(Backend& /*b*/, const float* /*summed*/, int /*shards*/,
                            float* /*state*/) {}
  /// The pieces in which backward produces this layer's gradients, relative to the layer's start,
  /// in the order it enqueues them; together they cover every parameter. Default: one piece.
  virtual std::vector<ParamRange> gradient_pieces() const;
  /// Keras's initialisation of this layer's parameters and state, into HOST memory.
  virtual void initialize(float* /*params*/, float* /*state*/, uint64_t /*seed*/) const {}
  /// True when the output is the input itself, reinterpreted (flatten): forward and backward are
  /// never called, and the model gives the output no memory of its own.
  virtual bool is_view() const { return false; }
  /// True for a plain max(x, 0) of its one input (the ReLU layer, an Activation "relu"): a layer
  /// that can take it in (fuse_relu) may then do its work.
  virtual bool is_relu() const { return false; }
  /// True for Keras's Add (the elementwise sum of its inputs, in order): a layer that can take it
  /// in (fuse_add) may then do its work.
  virtual bool is_add() const { return false; }
  /// Asked when a ReLU is this layer's only user: true when the layer takes max(y, 0) into its own
  /// forward and backward from now on (its y is then the ReLU's output, its dy that output's
  /// gradient), and the model runs the ReLU as a view of it (docs/design.md#fusion).
  virtual bool fuse_relu() { return false; }
  /// True when backward gives every input the same gradient (Add: its dy, masked by a fused
  /// ReLU): the model may then give two inputs one gradient buffer, and backward writes it once,
  /// skipping a dx that is the same memory as one already written (docs/design.md#fusion).
  /// Asked when this layer's only user is an Add of two inputs whose other input is computed
  /// before this layer (relu: a ReLU is fused into the add): true when the layer takes the add
  /// (and its ReLU) into its own forward from now on, writing the add's output from
  /// ForwardArgs::addend; the model then skips the add's forward (its backward still runs), and
  /// this layer's own output is never written (docs/design.md#fusion).
  virtual bool fuse_add(bool /*relu*/) { return false; }
  virtual bool same_gradient_to_inputs() const { return false; }
  /// True when backward takes BackwardArgs::dy_addend: the model may then leave the last share of
  /// this layer's output gradient for it to add as it reads dy (docs/design.md#fusion).
  virtual bool takes_gradient_addend() const { return false; }
  /// True when, in its present layouts, the layer writes the rounded copies it is handed
  /// (ForwardArgs::y_rounded, BackwardArgs::dx_rounded) through the backend (NormShape::rounded):
  /// batch normalization in blocks of channels. Asked once layouts are set, where the backend
  /// makes_rounded_copies().
  virtual bool writes_rounded() const { return false; }
  /// True when the layer may read the copies (ForwardArgs::x_rounded, BackwardArgs::dy_rounded):
  /// a convolution.
  virtual bool reads_rounded() const { return false; }
  /// True when backward on n examples, handed BackwardArgs::dy_rounded, reads that copy and never
  /// dy: a convolution without an activation, where the backend's convolution says so
  /// (Backend::conv2d_backward_reads_rounded_only). Asked at each backward.
  virtual bool reads_only_rounded_dy(Backend& /*b*/, int /*n*/) { return false; }
  /// The same for x[0] in forward on n examples, handed ForwardArgs::x_rounded, and in the
  /// backward of that forward.
  virtual bool reads_only_rounded_x(Backend& /*b*/, int /*n*/) { return false; }
  virtual Blocking blocking() const { return Blocking::kNone; }
  /// The layouts the model chose for its inputs and output (as blocking() allows), once, before
  /// the first forward; every layer starts with all plain.
  virtual void set_layouts(const std::vector<Layout>& /*inputs*/, Layout /*output*/) {}
  virtual void forward(Backend& b, const ForwardArgs& a) = 0;
  /// Writes this layer's gradients, calling gradients_enqueued(k) (when set) as soon as piece k
  /// of gradient_pieces() is enqueued (when unset, a layer may produce its gradients in fewer,
  /// larger operations), then each dx that is not null, so the gradients' all-reduce can start
  /// before dx is computed.
  virtual void backward(Backend& b, const BackwardArgs& a,
                        const std::function<void(size_t piece)>& gradients_enqueued) = 0;
};

/// What a layer is built with besides its config and input sizes.
struct LayerContext {
  int index = 0;      ///< its node's place in the model (randomness and initialisation key on it)
  int max_batch = 1;  ///< scratch is sized for this many examples
  Backend& backend;
};

}  // namespace dtrain::nn
