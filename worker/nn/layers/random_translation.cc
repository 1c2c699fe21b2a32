// Keras's RandomTranslation: height_factor and width_factor (a number f in [-1, 1] for [-|f|,
// |f|], or [lower, upper]) of the image's size, fill_mode "reflect" (or "wrap", "constant",
// "nearest"), interpolation "bilinear" (or "nearest"), fill_value 0. In training each example is
// shifted by its own fractional (dy, dx) drawn from (seed, epoch, step, shard, example), so
// resume, recovery and elastic stay exact; in inference it is the identity. backend.h's
// translate2d does the reading and its transpose the backward.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/errors.h"
#include "worker/nn/layers/layer_keys.h"
#include "worker/nn/random.h"

namespace dtrain::nn::layers {
namespace {

struct TranslationKeys {
  float height_lower = 0, height_upper = 0, width_lower = 0, width_upper = 0;
  bool bilinear = true;
  FillMode fill = FillMode::kReflect;
  float fill_value = 0;
};

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

class TranslationConfig : public LayerConfig {
 public:
  explicit TranslationConfig(const TranslationKeys& k) : k_(k) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    refuse_sequence(in, where, "random_translation");
    if (in[0].flat())
      throw common::ConfigError(
          fmt::format("{}: random_translation needs an image, not a flat "
                      "input of {}",
                      where, in[0].c));
    return in[0];
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext& c) const override {
    return std::make_unique<RandomTranslation>(k_, in[0], c.index);
  }
  bool draws_randomness() const override { return true; }

 private:
  TranslationKeys k_;
};

// Keras's factor: f in [-1, 1] for [-|f|, |f|], or [lower, upper] (sorted), each in [-1, 1].
void parse_factor(const common::JsonNode& node, float* lower, float* upper) {
  if (node.is_array()) {
    std::vector<common::JsonNode> pair = node.as_array();
    if (pair.size() != 2)
      node.fail(fmt::format("expected a number or [lower, upper], found {}", node.describe()));
    *lower = static_cast<float>(pair[0].as_number(-1, 1));
    *upper = static_cast<float>(pair[1].as_number(-1, 1));
    if (*lower > *upper) std::swap(*lower, *upper);
    return;
  }
  const float f = std::fabs(static_cast<float>(node.as_number(-1, 1)));
  *lower = -f, *upper = f;
}

}  // namespace

std::unique_ptr<LayerConfig> parse_random_translation(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "height_factor", "width_factor", "fill_mode",
                   "interpolation", "fill_value"});
  TranslationKeys k;
  parse_factor(node.at("height_factor"), &k.height_lower, &k.height_upper);
  parse_factor(node.at("width_factor"), &k.width_lower, &k.width_upper);
  if (auto n = node.find("fill_mode")) {
    const std::string mode = n->as_string();
    if (mode == "reflect")
      k.fill = FillMode::kReflect;
    else if (mode == "wrap")
      k.fill = FillMode::kWrap;
    else if (mode == "constant")
      k.fill = FillMode::kConstant;
    else if (mode == "nearest")
      k.fill = FillMode::kNearest;
    else
      n->fail(fmt::format(
          "expected \"reflect\", \"wrap\", \"constant\" or \"nearest\", found \"{}\"", mode));
  }
  if (auto n = node.find("interpolation")) {
    const std::string mode = n->as_string();
    if (mode != "bilinear" && mode != "nearest")
      n->fail(fmt::format("expected \"bilinear\" or \"nearest\", found \"{}\"", mode));
    k.bilinear = mode == "bilinear";
  }
  if (auto n = node.find("fill_value"))
    k.fill_value = static_cast<float>(n->as_number(-3.4e38, 3.4e38));
  return std::make_unique<TranslationConfig>(k);
}

// Keras's RandomTranslation.get_config() (and its image preprocessing base's).
std::vector<KerasKeySpec> keras_keys_random_translation() {
  return {{"height_factor", KerasKey::kRead},
          {"width_factor", KerasKey::kRead},
          {"fill_mode", KerasKey::kRead},
          {"interpolation", KerasKey::kRead},
          {"seed", KerasKey::kSeed},
          {"fill_value", KerasKey::kRead},
          {"data_format", KerasKey::kChannelsLast},
          {"bounding_box_format", KerasKey::kNull}};
}

}  // namespace dtrain::nn::layers
