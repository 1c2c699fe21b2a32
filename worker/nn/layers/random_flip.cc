// Keras's RandomFlip: mode "horizontal", "vertical" or "horizontal_and_vertical" (Keras's
// default). In training each example is flipped each way with probability one half, drawn from
// (seed, epoch, step, shard, example), so resume, recovery and elastic stay exact; in inference
// it is the identity.
// Its keys and shape rules: worker/spec/layers/random_flip.h.
#include "worker/spec/layers/random_flip.h"

#include "worker/nn/layers/remapped.h"

namespace dtrain::nn::layers {
namespace {

class RandomFlip : public Remapped {
 public:
  RandomFlip(Dims in, bool horizontal, bool vertical, int index)
      : Remapped(in, in), horizontal_(horizontal), vertical_(vertical), index_(index) {}

 protected:
  PixelMap map(const ForwardArgs& a, int i) const override {
    PixelMap m;
    if (!a.training) return m;
    if (horizontal_ && unit_float(draw(a, index_, i, 0)) < 0.5f)
      m.col0 = in_.w - 1, m.col_step = -1;
    if (vertical_ && unit_float(draw(a, index_, i, 1)) < 0.5f) m.row0 = in_.h - 1, m.row_step = -1;
    return m;
  }

 private:
  bool horizontal_, vertical_;
  int index_;
};

}  // namespace

std::unique_ptr<Layer> make_random_flip(const LayerConfig& config, const std::vector<Dims>& in,
                                        const LayerContext& c) {
  const RandomFlipKeys& k = static_cast<const RandomFlipConfig&>(config).keys();
  return std::make_unique<RandomFlip>(in[0], k.horizontal, k.vertical, c.index);
}

}  // namespace dtrain::nn::layers
