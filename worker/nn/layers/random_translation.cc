// Keras's RandomTranslation: height_factor and width_factor (a number f in [-1, 1] for [-|f|,
// |f|], or [lower, upper]) of the image's size, fill_mode "reflect" (or "wrap", "constant",
// "nearest"), interpolation "bilinear" (or "nearest"), fill_value 0. In training each example is
// shifted by its own fractional (dy, dx) drawn from (seed, epoch, step, shard, example), so
// resume, recovery and elastic stay exact; in inference it is the identity. backend.h's
// translate2d does the reading and its transpose the backward.
// Its keys and shape rules: worker/spec/layers/random_translation.h.
#include "worker/spec/layers/random_translation.h"

#include <vector>

#include "worker/nn/layers/layer_parts.h"
#include "worker/nn/random.h"

namespace dtrain::nn::layers {
namespace {

class RandomTranslation : public Layer {
 public:
  RandomTranslation(const TranslationKeys& k, Dims dims, int index)
      : k_(k), dims_(dims), index_(index) {}
  void forward(Backend& b, const ForwardArgs& a) override {
    const size_t count = dims_.size() * static_cast<size_t>(a.n);
    training_ = a.training;
    if (!a.training) {  // Keras: the identity outside training
      b.device().copy(a.y, a.x[0], count * sizeof(float));
      return;
    }
    shifts_.resize(static_cast<size_t>(a.n));
    for (int i = 0; i < a.n; ++i) {
      shifts_[static_cast<size_t>(i)] = {
          draw(a, i, 0, k_.height_lower, k_.height_upper) * static_cast<float>(dims_.h),
          draw(a, i, 1, k_.width_lower, k_.width_upper) * static_cast<float>(dims_.w)};
    }
    b.translate2d_forward(shape(a.n), shifts_.data(), a.x[0], a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (!a.dx[0]) return;
    if (!training_) {
      b.device().copy(a.dx[0], a.dy, dims_.size() * static_cast<size_t>(a.n) * sizeof(float));
      return;
    }
    b.translate2d_backward(shape(a.n), shifts_.data(), a.dy, a.dx[0]);
  }

 private:
  TranslateShape shape(int n) const {
    TranslateShape s;
    s.n = n, s.c = dims_.c, s.h = dims_.h, s.w = dims_.w;
    s.bilinear = k_.bilinear, s.fill = k_.fill, s.fill_value = k_.fill_value;
    return s;
  }
  // A uniform draw in [lower, upper) for example i of this step's shard: a pure function of
  // (seed, epoch, step, the layer's index, shard, example, which).
  float draw(const ForwardArgs& a, int i, int which, float lower, float upper) const {
    const uint64_t hash =
        random_key(a.key.seed, static_cast<uint64_t>(a.key.epoch),
                   static_cast<uint64_t>(a.key.step), 3000 + static_cast<uint64_t>(index_),
                   (static_cast<uint64_t>(a.key.shard) << 32 | static_cast<uint64_t>(i)) * 4 +
                       static_cast<uint64_t>(which));
    return lower + unit_float(hash) * (upper - lower);
  }
  TranslationKeys k_;
  Dims dims_;
  int index_;
  bool training_ = false;
  std::vector<Shift2d> shifts_;  ///< the last forward's, for the backward
};

}  // namespace

std::unique_ptr<Layer> make_random_translation(const LayerConfig& config,
                                               const std::vector<Dims>& in, const LayerContext& c) {
  const TranslationKeys& k = static_cast<const RandomTranslationConfig&>(config).keys();
  return std::make_unique<RandomTranslation>(k, in[0], c.index);
}

}  // namespace dtrain::nn::layers
