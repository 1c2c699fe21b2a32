// Keras's Concatenate on the channels (axis -1 of NHWC, C of dtrain's NCHW): two or more inputs
// of one height and width, their channels one after another. Its gradient is each input's slice
// of the output's. Copies only: exact on every backend.
// Its keys and shape rules: worker/spec/layers/concatenate.h.
#include "worker/spec/layers/concatenate.h"

#include <utility>

#include "worker/nn/layers/layer_parts.h"

namespace dtrain::nn::layers {
namespace {

class Concatenate : public Layer {
 public:
  Concatenate(std::vector<Dims> in, Dims out) : in_(std::move(in)), out_(out) {}
  void forward(Backend& b, const ForwardArgs& a) override {
    for (int i = 0; i < a.n; ++i) {
      size_t at = static_cast<size_t>(i) * out_.size();
      for (size_t k = 0; k < in_.size(); ++k) {
        const size_t block = in_[k].size();
        b.device().copy(a.y + at, a.x[k] + static_cast<size_t>(i) * block, block * sizeof(float));
        at += block;
      }
    }
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    for (int i = 0; i < a.n; ++i) {
      size_t at = static_cast<size_t>(i) * out_.size();
      for (size_t k = 0; k < in_.size(); ++k) {
        const size_t block = in_[k].size();
        if (a.dx[k])
          b.device().copy(a.dx[k] + static_cast<size_t>(i) * block, a.dy + at,
                          block * sizeof(float));
        at += block;
      }
    }
  }

 private:
  std::vector<Dims> in_;
  Dims out_;
};

}  // namespace

std::unique_ptr<Layer> make_concatenate(const LayerConfig& config, const std::vector<Dims>& in,
                                        const LayerContext& /*c*/) {
  return std::make_unique<Concatenate>(in, config.output_dims(in, ""));
}

}  // namespace dtrain::nn::layers
