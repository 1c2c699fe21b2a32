// See random_translation.h.
#include "worker/spec/layers/random_translation.h"

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::nn::layers {
namespace {

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

Dims RandomTranslationConfig::output_dims(const std::vector<Dims>& in,
                                          const std::string& where) const {
  refuse_sequence(in, where, "random_translation");
  if (in[0].flat())
    throw common::ConfigError(
        fmt::format("{}: random_translation needs an image, not a flat "
                    "input of {}",
                    where, in[0].c));
  return in[0];
}

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
  return std::make_unique<RandomTranslationConfig>(k);
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
