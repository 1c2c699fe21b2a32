// Keras's RandomFlip: mode "horizontal", "vertical" or "horizontal_and_vertical" (Keras's
// default). In training each example is flipped each way with probability one half, drawn from
// (seed, epoch, step, shard, example), so resume, recovery and elastic stay exact; in inference
// it is the identity.
#include <fmt/format.h>

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

class FlipConfig : public LayerConfig {
 public:
  FlipConfig(bool horizontal, bool vertical) : horizontal_(horizontal), vertical_(vertical) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    refuse_sequence(in, where, "random_flip");
    return in[0];
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext& c) const override {
    return std::make_unique<RandomFlip>(in[0], horizontal_, vertical_, c.index);
  }
  bool draws_randomness() const override { return true; }

 private:
  bool horizontal_, vertical_;
};

}  // namespace

std::unique_ptr<LayerConfig> parse_random_flip(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "mode"});
  std::string mode = "horizontal_and_vertical";
  if (auto n = node.find("mode")) {
    mode = n->as_string();
    if (mode != "horizontal" && mode != "vertical" && mode != "horizontal_and_vertical") {
      n->fail(fmt::format(
          "expected \"horizontal\", \"vertical\" or \"horizontal_and_vertical\", found \"{}\"",
          mode));
    }
  }
  return std::make_unique<FlipConfig>(mode != "vertical", mode != "horizontal");
}

// Keras's RandomFlip.get_config() (and its image preprocessing base's).
std::vector<KerasKeySpec> keras_keys_random_flip() {
  return {{"mode", KerasKey::kRead},
          {"seed", KerasKey::kSeed},
          {"data_format", KerasKey::kChannelsLast},
          {"bounding_box_format", KerasKey::kNull}};
}

}  // namespace dtrain::nn::layers
