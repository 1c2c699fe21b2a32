// Keras's RandomCrop: height, width. In training each example is cut at an offset drawn from
// (seed, epoch, step, shard, example), so resume, recovery and elastic stay exact; in inference
// the centre is cut (Keras's training crop draws one offset per batch; dtrain draws one per
// example). With ZeroPadding2D before it, the CIFAR-style "pad and crop".
// Its keys and shape rules: worker/spec/layers/random_crop.h.
#include "worker/spec/layers/random_crop.h"

#include "worker/nn/layers/remapped.h"

namespace dtrain::nn::layers {
namespace {

class RandomCrop : public Remapped {
 public:
  RandomCrop(Dims in, Dims out, int index) : Remapped(in, out), index_(index) {}

 protected:
  PixelMap map(const ForwardArgs& a, int i) const override {
    const int rows = in_.h - out_.h + 1, cols = in_.w - out_.w + 1;
    if (!a.training) return {(in_.h - out_.h) / 2, (in_.w - out_.w) / 2, 1, 1};
    return {static_cast<int32_t>(draw(a, index_, i, 0) % static_cast<uint64_t>(rows)),
            static_cast<int32_t>(draw(a, index_, i, 1) % static_cast<uint64_t>(cols)), 1, 1};
  }

 private:
  int index_;
};

}  // namespace

std::unique_ptr<Layer> make_random_crop(const LayerConfig& config, const std::vector<Dims>& in,
                                        const LayerContext& c) {
  return std::make_unique<RandomCrop>(in[0], config.output_dims(in, ""), c.index);
}

}  // namespace dtrain::nn::layers
