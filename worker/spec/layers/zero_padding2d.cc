// See zero_padding2d.h.
#include "worker/spec/layers/zero_padding2d.h"

#include <fmt/format.h>

#include <tuple>
#include <vector>

namespace dtrain::nn::layers {

Dims ZeroPadding2dConfig::output_dims(const std::vector<Dims>& in, const std::string& where) const {
  refuse_sequence(in, where, "zero_padding2d");
  return {in[0].c, in[0].h + k_.top + k_.bottom, in[0].w + k_.left + k_.right};
}

std::unique_ptr<LayerConfig> parse_zero_padding2d(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "padding"});
  PaddingKeys p;
  if (auto n = node.find("padding")) {
    std::vector<common::JsonNode> items =
        n->is_array() ? n->as_array() : std::vector<common::JsonNode>{};
    if (!n->is_array()) {
      p.top = p.bottom = p.left = p.right = static_cast<int>(n->as_int(0, 1024));
    } else if (items.size() == 2 && !items[0].is_array()) {
      p.top = p.bottom = static_cast<int>(items[0].as_int(0, 1024));
      p.left = p.right = static_cast<int>(items[1].as_int(0, 1024));
    } else if (items.size() == 2) {
      std::tie(p.top, p.bottom) = int_or_pair(items[0], 0, 1024);
      std::tie(p.left, p.right) = int_or_pair(items[1], 0, 1024);
    } else {
      n->fail(
          fmt::format("expected an integer, [rows, columns] or [[top, bottom], [left, right]], "
                      "found {}",
                      n->describe()));
    }
  }
  return std::make_unique<ZeroPadding2dConfig>(p);
}

// Keras's ZeroPadding2D.get_config(): padding as ((top, bottom), (left, right)).
std::vector<KerasKeySpec> keras_keys_zero_padding2d() {
  return {{"padding", KerasKey::kRead}, {"data_format", KerasKey::kChannelsLast}};
}

}  // namespace dtrain::nn::layers
