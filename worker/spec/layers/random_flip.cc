// See random_flip.h.
#include "worker/spec/layers/random_flip.h"

#include <fmt/format.h>

#include <string>

namespace dtrain::nn::layers {

Dims RandomFlipConfig::output_dims(const std::vector<Dims>& in, const std::string& where) const {
  refuse_sequence(in, where, "random_flip");
  return in[0];
}

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
  return std::make_unique<RandomFlipConfig>(
      RandomFlipKeys{mode != "vertical", mode != "horizontal"});
}

// Keras's RandomFlip.get_config() (and its image preprocessing base's).
std::vector<KerasKeySpec> keras_keys_random_flip() {
  return {{"mode", KerasKey::kRead},
          {"seed", KerasKey::kSeed},
          {"data_format", KerasKey::kChannelsLast},
          {"bounding_box_format", KerasKey::kNull}};
}

}  // namespace dtrain::nn::layers
