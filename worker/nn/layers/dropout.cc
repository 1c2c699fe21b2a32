// Keras's Dropout (inverted: keep with probability 1 - rate, scale by 1 / (1 - rate)); the
// identity outside training. The mask is a pure function of (seed, epoch, step, the layer's
// index, element), the same on every backend.
// Its keys and shape rules: worker/spec/layers/dropout.h.
#include "worker/spec/layers/dropout.h"

#include "worker/nn/layers/layer_parts.h"
#include "worker/nn/random.h"

namespace dtrain::nn::layers {
namespace {

class Dropout : public Layer {
 public:
  Dropout(float rate, Dims in, const LayerContext& c)
      : rate_(rate),
        index_(c.index),
        dims_(in),
        mask_(c.backend.device(), in.size() * static_cast<size_t>(c.max_batch)) {}
  void forward(Backend& b, const ForwardArgs& a) override {
    size_t count = dims_.size() * static_cast<size_t>(a.n);
    training_ = a.training;
    if (!a.training) {
      b.device().copy(a.y, a.x[0], count * sizeof(float));
      return;
    }
    // random_key(seed, epoch, step, 1000 + index, i) == mix64(stream ^ i) for this stream.
    uint64_t stream = mix64(mix64(mix64(mix64(a.key.seed) ^ static_cast<uint64_t>(a.key.epoch)) ^
                                  static_cast<uint64_t>(a.key.step)) ^
                            static_cast<uint64_t>(1000 + index_));
    b.dropout_forward(count, rate_, stream, a.x[0], a.y, mask_.data());
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (!a.dx[0]) return;
    size_t count = dims_.size() * static_cast<size_t>(a.n);
    if (training_) {
      b.multiply(count, a.dy, mask_.data(), a.dx[0]);
    } else {
      b.device().copy(a.dx[0], a.dy, count * sizeof(float));
    }
  }

 private:
  float rate_;
  int index_;
  Dims dims_;
  Buffer<float> mask_;
  bool training_ = true;
};

}  // namespace

std::unique_ptr<Layer> make_dropout(const LayerConfig& config, const std::vector<Dims>& in,
                                    const LayerContext& c) {
  return std::make_unique<Dropout>(static_cast<const DropoutConfig&>(config).keys().rate, in[0], c);
}

}  // namespace dtrain::nn::layers
