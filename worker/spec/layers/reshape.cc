// See reshape.h.
#include "worker/spec/layers/reshape.h"

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

namespace dtrain::nn::layers {

Dims ReshapeConfig::output_dims(const std::vector<Dims>& in, const std::string& where) const {
  refuse_sequence(in, where, "reshape");
  const long long size = static_cast<long long>(in[0].size());
  long long known = 1;
  for (int v : k_.target)
    if (v > 0) known *= v;
  std::vector<int> t = k_.target;
  for (int& v : t) {
    if (v == -1) v = static_cast<int>(size / known);
  }
  long long product = 1;
  for (int v : t) product *= v;
  if (product != size || size % known != 0) {
    throw common::ConfigError(
        fmt::format("{}: target_shape {} does not hold the input's {} "
                    "values ({}x{}x{})",
                    where, shape_text(), size, in[0].h, in[0].w, in[0].c));
  }
  if (t.size() == 1) return {t[0], 1, 1};
  return {t[2], t[0], t[1]};
}

std::string ReshapeConfig::shape_text() const {
  std::string text = "[";
  for (size_t i = 0; i < k_.target.size(); ++i)
    text += (i ? ", " : "") + std::to_string(k_.target[i]);
  return text + "]";
}

std::unique_ptr<LayerConfig> parse_reshape(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "target_shape"});
  common::JsonNode shape = node.at("target_shape");
  std::vector<int> target;
  for (const common::JsonNode& v : shape.as_array())
    target.push_back(static_cast<int>(v.as_int(-1, 1 << 24)));
  if (target.size() != 1 && target.size() != 3) {
    shape.fail(fmt::format("expected [units] or [height, width, channels], found {} sizes",
                           target.size()));
  }
  int inferred = 0;
  for (int v : target) {
    if (v == 0) shape.fail("a size of 0 (expected sizes from 1, or one -1)");
    inferred += v == -1;
  }
  if (inferred > 1) shape.fail("more than one -1 (at most one size is inferred)");
  return std::make_unique<ReshapeConfig>(ReshapeKeys{std::move(target)});
}

// Keras's Reshape.get_config() (keras/src/layers/reshaping/reshape.py).
std::vector<KerasKeySpec> keras_keys_reshape() {
  return {{"target_shape", KerasKey::kRead}};
}

}  // namespace dtrain::nn::layers
