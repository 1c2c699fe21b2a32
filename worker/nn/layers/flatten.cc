// Keras's Flatten: a view (an NCHW example is already flat), so the model never calls its
// forward or backward and gives it no memory.
// Its keys and shape rules: worker/spec/layers/flatten.h.
#include "worker/spec/layers/flatten.h"

#include "common/errors.h"
#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

class Flatten : public Layer {
 public:
  bool is_view() const override { return true; }
  void forward(Backend&, const ForwardArgs&) override {
    DT_ENFORCE(false, "flatten is a view; its forward is never called");
  }
  void backward(Backend&, const BackwardArgs&, const std::function<void(size_t)>&) override {
    DT_ENFORCE(false, "flatten is a view; its backward is never called");
  }
};

}  // namespace

std::unique_ptr<Layer> make_flatten(const LayerConfig& /*config*/, const std::vector<Dims>& /*in*/,
                                    const LayerContext& /*c*/) {
  return std::make_unique<Flatten>();
}

}  // namespace dtrain::nn::layers
