// A Keras-style Sequential model: layers in order, parameters and gradients each in ONE flat
// buffer (layers hold offsets into them), activations kept for the backward pass. The trainer
// hands the gradient buffer to the communicator in one piece. Single-threaded; not copyable.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/nn/backend.h"
#include "worker/nn/layers.h"
#include "worker/nn/model_spec.h"

namespace dtrain::nn {

class Sequential {
 public:
  /// Builds the layers for batches of up to max_batch examples. The gradient buffer gets
  /// extra_gradient_slots floats after the gradients, for values that travel in the same
  /// all-reduce. Throws ConfigError naming the layer when shapes do not fit. backend must outlive
  /// the model.
  Sequential(const ModelSpec& spec, Backend& backend, int max_batch,
             size_t extra_gradient_slots = 0);
  ~Sequential();
  Sequential(const Sequential&) = delete;
  Sequential& operator=(const Sequential&) = delete;

  /// Keras initialisation, a pure function of seed.
  void initialize(uint64_t seed);

  /// Runs n <= max_batch examples (NCHW images); returns the logits (n x classes), valid until
  /// the next forward().
  const float* forward(const float* images, int n, const StepKey& key, bool training);
  /// From dlogits of the last forward(): overwrites the gradient buffer.
  void backward(const float* dlogits, int n);

  int classes() const { return static_cast<int>(dims_.back().size()); }
  Dims input_dims() const { return dims_.front(); }
  bool softmax_output() const { return softmax_output_; }

  std::vector<float>& parameters() { return parameters_; }
  const std::vector<float>& parameters() const { return parameters_; }
  /// The parameters' gradients, then the extra slots.
  std::vector<float>& gradients() { return gradients_; }
  /// Every parameter tensor with its offset in the flat buffers, in layer order.
  const std::vector<ParamInfo>& parameter_infos() const { return infos_; }

 private:
  Backend& backend_;
  int max_batch_;
  bool softmax_output_ = false;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<size_t> offsets_;  ///< each layer's first parameter
  std::vector<Dims> dims_;       ///< input, then each layer's output
  std::vector<ParamInfo> infos_;
  std::vector<float> parameters_, gradients_;
  std::vector<std::vector<float>> activations_, deltas_;
};

}  // namespace dtrain::nn
