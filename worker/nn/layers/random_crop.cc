// Keras's RandomCrop: height, width. In training each example is cut at an offset drawn from
// (seed, epoch, step, shard, example), so resume, recovery and elastic stay exact; in inference
// the centre is cut (Keras's training crop draws one offset per batch; dtrain draws one per
// example). With ZeroPadding2D before it, the CIFAR-style "pad and crop".
#include <fmt/format.h>

#include "common/errors.h"
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

class CropConfig : public LayerConfig {
 public:
  CropConfig(int height, int width) : height_(height), width_(width) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    refuse_sequence(in, where, "random_crop");
    if (height_ > in[0].h || width_ > in[0].w) {
      throw common::ConfigError(fmt::format("{}: a {}x{} crop does not fit the {}x{} input", where,
                                            height_, width_, in[0].h, in[0].w));
    }
    return {in[0].c, height_, width_};
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext& c) const override {
    return std::make_unique<RandomCrop>(in[0], output_dims(in, ""), c.index);
  }
  bool draws_randomness() const override { return true; }

 private:
  int height_, width_;
};

}  // namespace

std::unique_ptr<LayerConfig> parse_random_crop(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "height", "width"});
  return std::make_unique<CropConfig>(static_cast<int>(node.at("height").as_int(1, 1 << 14)),
                                      static_cast<int>(node.at("width").as_int(1, 1 << 14)));
}

// Keras's RandomCrop.get_config() (and its image preprocessing base's).
std::vector<KerasKeySpec> keras_keys_random_crop() {
  return {{"height", KerasKey::kRead},
          {"width", KerasKey::kRead},
          {"seed", KerasKey::kSeed},
          {"data_format", KerasKey::kChannelsLast},
          {"bounding_box_format", KerasKey::kNull}};
}

}  // namespace dtrain::nn::layers
