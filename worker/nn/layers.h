// The layers of a Sequential model. Each knows its output size, its parameters (views into the
// model's flat buffers), Keras's initialisation, and forward/backward through a Backend. Buffers
// are owned by the Sequential; layers keep only their own scratch (ReLU gradient, pooling
// workspace, dropout mask), in the backend device's memory. Flatten is a view: no memory, no work.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/nn/backend.h"
#include "worker/nn/model_spec.h"

namespace dtrain::nn {

/// Size of one example's activation: channels x height x width (dense: units x 1 x 1).
struct Dims {
  int c = 1, h = 1, w = 1;
  size_t size() const { return static_cast<size_t>(c) * h * w; }
};

/// One named parameter tensor inside the flat buffer.
struct ParamInfo {
  std::string name;            ///< "layers.0.conv2d.kernel"
  std::vector<int64_t> shape;  ///< conv kernel k,c,kh,kw; dense kernel in,out; bias n
  size_t offset = 0;           ///< in floats, into the flat parameter buffer
  size_t count = 0;
};

/// A range of a flat parameter or gradient buffer: [offset, offset + count), in floats.
struct ParamRange {
  size_t offset = 0;
  size_t count = 0;
};

/// Gradients of a dense kernel larger than this are produced in pieces of about this many floats
/// (whole rows), so the all-reduce of the first piece starts while the rest are computed.
constexpr size_t kGradientPieceFloats = size_t{1} << 19;

/// Where a draw comes from: randomness depends only on these and the layer index.
struct StepKey {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t step = 0;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual Dims output_dims() const = 0;
  /// Parameter tensors relative to this layer's start in the flat buffer.
  virtual std::vector<ParamInfo> params() const { return {}; }
  /// The pieces in which backward produces this layer's gradients, relative to the layer's start,
  /// in the order it enqueues them; together they cover every parameter. Default: one piece.
  virtual std::vector<ParamRange> gradient_pieces() const;
  /// Keras initialisation of this layer's parameters (glorot_uniform kernels, zero biases), into
  /// HOST memory.
  virtual void initialize(float*, uint64_t) const {}
  /// True when the output is the input itself, reinterpreted (flatten): forward and backward are
  /// never called, and the model gives the output no memory of its own.
  virtual bool is_view() const { return false; }
  /// y = layer(x) for n examples, all pointers in the backend's device memory. params points at
  /// this layer's parameters.
  virtual void forward(Backend& b, int n, const float* x, float* y, const float* params,
                       const StepKey& key, bool training) = 0;
  /// Given x, y and dy: writes this layer's gradients into grads, calling
  /// gradients_enqueued(k) (when set) as soon as piece k of gradient_pieces() is enqueued (when
  /// unset, a layer may produce its gradients in fewer, larger operations), then
  /// writes dx (unless null), so the gradients' all-reduce can start before dx is computed.
  virtual void backward(Backend& b, int n, const float* x, const float* y, const float* dy,
                        float* dx, const float* params, float* grads,
                        const std::function<void(size_t piece)>& gradients_enqueued) = 0;
};

/// Builds layer index of spec for the given input dims and largest batch, with its scratch on the
/// backend's device. Throws ConfigError "model.layers[i]: ..." when the shapes do not fit (a
/// kernel larger than its input, ...).
std::unique_ptr<Layer> make_layer(const LayerSpec& spec, int index, Dims input, int max_batch,
                                  Backend& backend);

}  // namespace dtrain::nn
