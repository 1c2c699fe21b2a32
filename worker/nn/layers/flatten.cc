// Keras's Flatten: a view (an NCHW example is already flat), so the model never calls its
// forward or backward and gives it no memory.
#include "common/errors.h"
#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

class Flatten : public Layer {
 public:
  bool is_view() const override { return true; }
  void forward(Backend&, const ForwardArgs&) override {
    DT_ENFORCE(false, "flatten is a view; its forward is never called");
  }
  void backward(Backend&, const BackwardArgs&, const std::function<void(size_t)>&) override {
    DT_ENFORCE(false, "flatten is a view; its backward is never called");
  }
};

class FlattenConfig : public LayerConfig {
 public:
  Dims output_dims(const std::vector<Dims>& in, const std::string&) const override {
    return {static_cast<int>(in[0].size()), 1, 1};
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>&, const LayerContext&) const override {
    return std::make_unique<Flatten>();
  }
};

}  // namespace

std::unique_ptr<LayerConfig> parse_flatten(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs"});
  return std::make_unique<FlattenConfig>();
}

// Keras's Flatten.get_config() (keras/src/layers/reshaping/flatten.py).
std::vector<KerasKeySpec> keras_keys_flatten() {
  return {{"data_format", KerasKey::kChannelsLast}};
}

}  // namespace dtrain::nn::layers
