// The model's tensors as one named set (docs/design.md#the-model-as-a-graph): its parameters,
// its non-trainable state (moving statistics) and each optimizer slot, in that order, named as
// checkpoints name them. Checkpoints, the state a survivor sends a joiner, the final model and
// the evaluator all go through it, so a new kind of state travels everywhere at once. Host
// copies only; the device's buffers stay the model's and the optimizer's.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "worker/nn/model.h"
#include "worker/train/safetensors.h"

namespace dtrain::train {

/// A tensor of the training state that is neither the model's nor the optimizer's (a callback's
/// state), kept in host memory by its owner.
struct HostTensor {
  std::string name;  ///< "callbacks.early_stopping.state", ...
  std::vector<int64_t> shape;
  std::vector<float>* data = nullptr;
};

class ModelTensors {
 public:
  /// slots: the optimizer's (name, buffer) pairs, each laid out as the parameters; may be empty
  /// (the evaluator's model has none).
  ModelTensors(nn::Model& model, std::vector<std::pair<std::string, nn::Buffer<float>*>> slots);

  /// Copies every buffer to the host (a sync) and returns a view of each tensor: parameters
  /// ("layers.0.conv2d.kernel"), state, then "optimizer.<slot>.<parameter>". Valid until the next
  /// download().
  const std::vector<TensorView>& download();
  /// The views of the last download (to restore into), as download() returned them.
  const std::vector<TensorView>& views() const { return views_; }
  /// The host copies of the last download, one per buffer (to broadcast or restore into).
  std::vector<std::vector<float>>& host() { return host_; }
  /// Copies the host copies back into the buffers.
  void upload();
  /// Host tensors carried after the optimizer slots ("callbacks.<name>..."): download copies
  /// them, upload writes them back. Their owner must outlive this.
  void add_host_tensors(std::vector<HostTensor> tensors);
  /// How many of download()'s views are the model's weights (parameters and state: what the
  /// final model holds); the rest are optimizer slots.
  size_t weight_count() const;

 private:
  nn::Model& model_;
  std::vector<std::pair<std::string, nn::Buffer<float>*>> slots_;
  std::vector<HostTensor> extras_;
  std::vector<std::vector<float>> host_;  ///< parameters, state, then each slot
  std::vector<TensorView> views_;
};

}  // namespace dtrain::train
