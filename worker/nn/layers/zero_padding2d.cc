// Keras's ZeroPadding2D: padding an int, a pair (rows, columns) or ((top, bottom), (left,
// right)) of zeros around each image.
#include <fmt/format.h>

#include "worker/nn/layers/remapped.h"

namespace dtrain::nn::layers {
namespace {

struct Padding {
  int top = 1, bottom = 1, left = 1, right = 1;
};

class ZeroPadding2D : public Remapped {
 public:
  ZeroPadding2D(const Padding& p, Dims in, Dims out) : Remapped(in, out), p_(p) {}

 protected:
  PixelMap map(const ForwardArgs&, int) const override { return {-p_.top, -p_.left, 1, 1}; }

 private:
  Padding p_;
};

class PaddingConfig : public LayerConfig {
 public:
  explicit PaddingConfig(const Padding& p) : p_(p) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    refuse_sequence(in, where, "zero_padding2d");
    return {in[0].c, in[0].h + p_.top + p_.bottom, in[0].w + p_.left + p_.right};
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext&) const override {
    return std::make_unique<ZeroPadding2D>(p_, in[0], output_dims(in, ""));
  }

 private:
  Padding p_;
};

}  // namespace

std::unique_ptr<LayerConfig> parse_zero_padding2d(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "padding"});
  Padding p;
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
  return std::make_unique<PaddingConfig>(p);
}

// Keras's ZeroPadding2D.get_config(): padding as ((top, bottom), (left, right)).
std::vector<KerasKeySpec> keras_keys_zero_padding2d() {
  return {{"padding", KerasKey::kRead}, {"data_format", KerasKey::kChannelsLast}};
}

}  // namespace dtrain::nn::layers
