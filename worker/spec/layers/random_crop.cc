// See random_crop.h.
#include "worker/spec/layers/random_crop.h"

#include <fmt/format.h>

namespace dtrain::nn::layers {

Dims RandomCropConfig::output_dims(const std::vector<Dims>& in, const std::string& where) const {
  refuse_sequence(in, where, "random_crop");
  if (k_.height > in[0].h || k_.width > in[0].w) {
    throw common::ConfigError(fmt::format("{}: a {}x{} crop does not fit the {}x{} input", where,
                                          k_.height, k_.width, in[0].h, in[0].w));
  }
  return {in[0].c, k_.height, k_.width};
}

std::unique_ptr<LayerConfig> parse_random_crop(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "height", "width"});
  RandomCropKeys k;
  k.height = static_cast<int>(node.at("height").as_int(1, 1 << 14));
  k.width = static_cast<int>(node.at("width").as_int(1, 1 << 14));
  return std::make_unique<RandomCropConfig>(k);
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
