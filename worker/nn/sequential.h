// A Keras-style Sequential model: layers in order, parameters and gradients each in ONE flat
// buffer on the backend's device (layers hold offsets into them), activations and deltas on the
// device too, kept for the backward pass. Views (flatten) share their input's memory. The model
// never reads anything back to the host except when asked (parameters_to_host). Single-threaded;
// not copyable.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/nn/backend.h"
#include "worker/nn/layers.h"
#include "worker/nn/model_spec.h"

namespace dtrain::nn {

/// A piece of the flat gradient buffer that backward enqueues in one go, and its layer.
struct GradientPiece {
  size_t offset = 0;
  size_t count = 0;
  size_t layer = 0;
};

class Sequential {
 public:
  /// Builds the layers for batches of up to max_batch examples. Throws ConfigError naming the
  /// layer when shapes do not fit. backend must outlive the model.
  /// gradient_memory (floats of the backend's device that outlive the model; may be null) holds
  /// the gradients when they fit in gradient_floats, instead of memory of the model's own.
  Sequential(const ModelSpec& spec, Backend& backend, int max_batch,
             float* gradient_memory = nullptr, size_t gradient_floats = 0);
  ~Sequential();
  Sequential(const Sequential&) = delete;
  Sequential& operator=(const Sequential&) = delete;

  /// Keras initialisation, a pure function of seed (computed on the host, then uploaded).
  void initialize(uint64_t seed);

  /// Enqueues n <= max_batch examples (NCHW images in device memory, which must stay unchanged
  /// until backward() has been enqueued); returns the logits (n x classes, device memory), valid
  /// until the next forward().
  const float* forward(const float* images, int n, const StepKey& key, bool training);
  /// Where the loss writes dlogits (n x classes, device memory) before backward().
  float* logits_gradient() { return deltas_.back(); }
  /// Enqueues the backward pass of the last forward(): overwrites the gradient buffer. After
  /// gradient piece k (of gradient_pieces()) is enqueued, calls gradients_enqueued(k), so its
  /// all-reduce can start while the rest of backward runs.
  void backward(int n, const std::function<void(size_t piece)>& gradients_enqueued = {});
  /// The pieces of the flat gradient buffer in the order backward produces them: last layer
  /// first, each layer's pieces in its own order; contiguous, each below the one before.
  const std::vector<GradientPiece>& gradient_pieces() const { return pieces_; }

  int classes() const { return static_cast<int>(dims_.back().size()); }
  Dims input_dims() const { return dims_.front(); }
  size_t layer_count() const { return layers_.size(); }
  /// True when some layer draws randomness per step (dropout).
  bool has_random_layers() const { return has_random_layers_; }

  Buffer<float>& parameters() { return parameters_; }
  const Buffer<float>& parameters() const { return parameters_; }
  Buffer<float>& gradients() { return gradients_; }
  /// True when the gradients live in the constructor's (or move_gradients') gradient_memory.
  bool gradients_lent() const { return !gradients_.owned(); }
  /// Puts the gradients in gradient_memory as the constructor does (null, or too small: memory of
  /// the model's own), leaving memory lent before: a new group's window after a re-formation
  /// (docs/design.md#in-place-recovery). The gradients' values are not kept (backward rewrites
  /// them every step).
  void move_gradients(float* gradient_memory, size_t gradient_floats);
  /// Layer i's parameters in the flat buffers (count 0 for layers without).
  const std::vector<ParamRange>& layer_ranges() const { return ranges_; }
  /// Every parameter tensor with its offset in the flat buffers, in layer order.
  const std::vector<ParamInfo>& parameter_infos() const { return infos_; }

 private:
  Backend& backend_;
  int max_batch_;
  bool has_random_layers_ = false;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<ParamRange> ranges_;
  std::vector<GradientPiece> pieces_;
  std::vector<size_t> first_piece_;  ///< layer i's first piece in pieces_
  std::vector<Dims> dims_;           ///< input, then each layer's output
  std::vector<ParamInfo> infos_;
  Buffer<float> parameters_, gradients_;
  std::vector<Buffer<float>> storage_;     ///< activation and delta memory (views have none)
  std::vector<const float*> activations_;  ///< [0]: the caller's input, then each layer's output
  std::vector<float*> deltas_;             ///< gradient w.r.t. activations_[i] ([0] is null)
};

}  // namespace dtrain::nn
