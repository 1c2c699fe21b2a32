// A model as a graph of layers (docs/design.md#the-model-as-a-graph), built from a ModelSpec:
// nodes in topological order, parameters and gradients each in ONE flat buffer on the backend's
// device and non-trainable state in a third (layers hold offsets into them), activations and
// their gradients on the device too, kept for the backward pass. Where an activation feeds
// several layers its gradient is the sum of theirs, added in a fixed order (the last user
// first). Views (flatten) share their input's memory. Nothing is read back to the host unless
// asked. Single-threaded; not copyable.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/nn/backend.h"
#include "worker/nn/layer.h"
#include "worker/spec/model_spec.h"

namespace dtrain::nn {

/// A piece of the flat gradient buffer that backward enqueues in one go, and its node.
struct GradientPiece {
  size_t offset = 0;
  size_t count = 0;
  size_t layer = 0;
};

class Model {
 public:
  /// Builds the layers for batches of up to max_batch examples. backend must outlive the model.
  /// gradient_memory (floats of the backend's device that outlive the model; may be null) holds
  /// the gradients when they fit in gradient_floats, instead of memory of the model's own.
  Model(const ModelSpec& spec, Backend& backend, int max_batch, float* gradient_memory = nullptr,
        size_t gradient_floats = 0);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  /// Keras's initialisation of parameters and state, a pure function of seed (computed on the
  /// host, then uploaded).
  void initialize(uint64_t seed);

  /// The sum over every worker's batch that training forwards hand the layers that take their
  /// statistics over the group (synchronized batch normalization); unset: each batch alone.
  /// TrainStep sets it; fn must outlive the model or be reset.
  void set_group_sum(GroupSum fn) { group_sum_ = std::move(fn); }
  /// Enqueues n <= max_batch examples (NCHW images in device memory, which must stay unchanged
  /// until backward() has been enqueued); returns the logits (n x classes, device memory), valid
  /// until the next forward(). training: dropout and training-only layers act.
  const float* forward(const float* images, int n, const StepKey& key, bool training);
  /// Where the loss writes dlogits (n x classes, device memory) before backward().
  float* logits_gradient() { return deltas_[root_[output_]]; }
  /// Enqueues the backward pass of the last forward(): overwrites the gradient buffer. After
  /// gradient piece k (of gradient_pieces()) is enqueued, calls gradients_enqueued(k), so its
  /// all-reduce can start while the rest of backward runs.
  void backward(int n, const std::function<void(size_t piece)>& gradients_enqueued = {});
  /// The pieces of the flat gradient buffer in the order backward produces them: last node
  /// first, each node's pieces in its own order; contiguous, each below the one before.
  const std::vector<GradientPiece>& gradient_pieces() const { return pieces_; }

  /// The loss's classes: the output's size, or a sequence's features (a language model's
  /// vocabulary); it classifies positions() rows per example.
  int classes() const { return spec_.units(); }
  int positions() const { return spec_.output_dims().positions(); }
  Dims input_dims() const { return spec_.input_dims(); }
  size_t layer_count() const { return layers_.size(); }
  const ModelSpec& spec() const { return spec_; }
  /// True when some layer draws randomness per step (dropout).
  bool has_random_layers() const { return has_random_layers_; }

  Buffer<float>& parameters() { return parameters_; }
  const Buffer<float>& parameters() const { return parameters_; }
  /// Non-trainable state (moving statistics); empty when no layer has any.
  Buffer<float>& state() { return state_; }
  /// The batch statistics the last training forward wrote (Layer::statistics_count, in node
  /// order); empty when no layer writes any. The step sums them over the virtual shards in place,
  /// then calls update_state.
  Buffer<float>& statistics() { return statistics_; }
  /// Each layer's state from the statistics, summed over `shards` batches (one per virtual shard
  /// of the global batch).
  void update_state(int shards);
  Buffer<float>& gradients() { return gradients_; }
  /// True when the gradients live in the constructor's (or move_gradients') gradient_memory.
  bool gradients_lent() const { return !gradients_.owned(); }
  /// Puts the gradients in gradient_memory as the constructor does (null, or too small: memory of
  /// the model's own), leaving memory lent before: a new group's window after a re-formation
  /// (docs/design.md#in-place-recovery). The gradients' values are not kept (backward rewrites
  /// them every step).
  void move_gradients(float* gradient_memory, size_t gradient_floats);
  /// Node i's parameters in the flat buffers (count 0 for nodes without).
  const std::vector<ParamRange>& layer_ranges() const { return ranges_; }
  /// Every parameter tensor with its offset in the flat parameter buffer, in node order, named
  /// "<node's prefix><tensor>".
  const std::vector<ParamInfo>& parameter_infos() const { return infos_; }
  /// Every state tensor with its offset in the flat state buffer, named the same way.
  const std::vector<ParamInfo>& state_infos() const { return state_infos_; }
  /// How node i's output (and its gradient) lies in memory (docs/design.md#blocked-activations).
  Layout layout(size_t i) const { return layouts_[root_[i] == kInput ? i : root_[i]]; }
  /// The rounded copies the model keeps (plan_rounded_copies()): of activations, and of
  /// gradients.
  std::array<size_t, 2> rounded_copies() const;
  /// Whether nodes i and j's output gradients are one buffer (share_gradients()).
  bool shares_gradient(size_t i, size_t j) const { return deltas_[i] == deltas_[j]; }

 private:
  /// Lays out the parameters, state, statistics and gradient pieces; returns the floats of the
  /// first three.
  std::array<size_t, 3> lay_out();
  /// Fuses each ReLU that is the only user of a layer that can take it in: the ReLU becomes a
  /// view of that layer; then each add of two inputs into the later of them where that layer
  /// can take it in (Layer::fuse_add) (docs/design.md#fusion).
  void fuse();
  /// Gives each node that is not a view its activation and gradient memory, and plans which
  /// input gradients are added rather than written.
  void plan_memory();
  /// Gives two inputs of a layer that passes them one gradient (Add) one gradient buffer, where
  /// nothing writes either between that layer's backward and the last read of the other: the
  /// copy of the gradient is then not made (docs/design.md#fusion).
  void share_gradients();
  /// Marks the shares of a gradient that the model leaves for its producer to add
  /// (Layer::takes_gradient_addend) rather than adding them itself: the last share, when scratch
  /// holds it untouched until the producer's backward (docs/design.md#fusion).
  void defer_last_shares();
  /// Where the backend blocks channels: blocks every activation that its producer and all its
  /// users can take blocked (Layer::blocking), and tells each layer its layouts.
  void choose_layouts();
  /// Where the backend makes rounded copies: a copy beside each activation that a layer which
  /// writes_rounded() writes and a layer which reads_rounded() reads as its first input, and
  /// beside each gradient of such a reader's output that one such writer alone writes
  /// (docs/design.md#rounded-copies).
  void plan_rounded_copies();

  ModelSpec spec_;
  Backend& backend_;
  int max_batch_;
  bool has_random_layers_ = false;
  GroupSum group_sum_;
  bool grouped_forward_ = false;  ///< the last forward handed the layers group_sum_
  size_t output_ = 0;
  std::vector<std::unique_ptr<Layer>> layers_;
  /// Node i is a view: its layer's is_view(), or a ReLU fused into its input's layer; its
  /// forward and backward never run.
  std::vector<bool> view_;
  /// Node i's forward is done by one of its inputs, which took it in (Layer::fuse_add); that
  /// input's add_taken_ is i (kNone for every other node), and it writes i's output.
  std::vector<bool> forward_done_;
  std::vector<size_t> add_taken_;
  static constexpr size_t kNone = static_cast<size_t>(-2);
  std::vector<ParamRange> ranges_, state_ranges_, statistics_ranges_;
  std::vector<GradientPiece> pieces_;
  std::vector<size_t> first_piece_;  ///< node i's first piece in pieces_
  std::vector<ParamInfo> infos_, state_infos_;
  Buffer<float> parameters_, state_, statistics_, gradients_;
  std::vector<Buffer<float>> storage_;  ///< activation and gradient memory (views have none)
  /// Node i's output memory is node root_[i]'s (itself, or what a view reinterprets); the
  /// model's input is kInput.
  static constexpr size_t kInput = static_cast<size_t>(-1);
  std::vector<size_t> root_;
  std::vector<Layout> layouts_;  ///< by node (a view's is its root's)
  /// By node: its output needs a gradient (it, or a node before it, has parameters).
  std::vector<bool> needs_gradient_;
  std::vector<const float*> activations_;  ///< by node (a view's is its root's)
  std::vector<float*> deltas_;             ///< gradient w.r.t. each node's output, by node
  /// Per node, per input: true when the input's gradient already holds another user's share,
  /// so this one is computed into scratch_ and added.
  std::vector<std::vector<bool>> accumulates_;
  Buffer<float> scratch_;
  /// Per node, per input: its share, computed into scratch_, is left there for the input's
  /// producer (defer_last_shares); pending_[r], during backward: node r's share left in scratch_.
  std::vector<std::vector<bool>> defers_;
  std::vector<const float*> pending_;
  /// Rounded copies (plan_rounded_copies), host memory (only a host backend makes them): by
  /// root, of its activation, and of its output's gradient; empty where there is none. Per node,
  /// where its training forward writes its output's copy, and backward its input's gradient's
  /// (null: nowhere); and the copies of its first input and of its output's gradient it reads.
  std::vector<std::vector<uint16_t>> rounded_activations_, rounded_deltas_;
  std::vector<uint16_t*> writes_y_rounded_, writes_dx_rounded_;
  std::vector<const uint16_t*> reads_x_rounded_, reads_dy_rounded_;
  std::vector<size_t> dx_rounded_reader_;  ///< by writer: the node that reads its dx's copy
  /// By writer: the nodes that read its output, when all of them read its copy (else none).
  std::vector<std::vector<size_t>> y_rounded_readers_;
  // Per node, the pointers its last forward was given (kept for backward, reused every step).
  std::vector<std::vector<const float*>> inputs_;
  std::vector<std::vector<float*>> input_deltas_;
};

}  // namespace dtrain::nn
