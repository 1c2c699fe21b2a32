// Keras's Concatenate on the channels (axis -1 of NHWC, C of dtrain's NCHW): two or more inputs
// of one height and width, their channels one after another. Its gradient is each input's slice
// of the output's. Copies only: exact on every backend.
#include <fmt/format.h>

#include "common/errors.h"
#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

class Concatenate : public Layer {
 public:
  Concatenate(std::vector<Dims> in, Dims out) : in_(std::move(in)), out_(out) {}
  void forward(Backend& b, const ForwardArgs& a) override {
    for (int i = 0; i < a.n; ++i) {
      size_t at = static_cast<size_t>(i) * out_.size();
      for (size_t k = 0; k < in_.size(); ++k) {
        const size_t block = in_[k].size();
        b.device().copy(a.y + at, a.x[k] + static_cast<size_t>(i) * block, block * sizeof(float));
        at += block;
      }
    }
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    for (int i = 0; i < a.n; ++i) {
      size_t at = static_cast<size_t>(i) * out_.size();
      for (size_t k = 0; k < in_.size(); ++k) {
        const size_t block = in_[k].size();
        if (a.dx[k])
          b.device().copy(a.dx[k] + static_cast<size_t>(i) * block, a.dy + at,
                          block * sizeof(float));
        at += block;
      }
    }
  }

 private:
  std::vector<Dims> in_;
  Dims out_;
};

class ConcatenateConfig : public LayerConfig {
 public:
  int arity() const override { return 0; }
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    refuse_sequence(in, where, "concatenate");
    Dims out = in[0];
    for (size_t i = 1; i < in.size(); ++i) {
      if (in[i].h != in[0].h || in[i].w != in[0].w) {
        throw common::ConfigError(fmt::format(
            "{}: concatenate needs inputs of one height and width; input 0 is {}x{}x{}, input {} "
            "is {}x{}x{}",
            where, in[0].h, in[0].w, in[0].c, i, in[i].h, in[i].w, in[i].c));
      }
      out.c += in[i].c;
    }
    return out;
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext&) const override {
    return std::make_unique<Concatenate>(in, output_dims(in, ""));
  }
};

}  // namespace

std::unique_ptr<LayerConfig> parse_concatenate(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "axis"});
  if (auto n = node.find("axis")) {
    int64_t axis = n->as_int(-4, 3);
    if (axis != -1 && axis != 3)
      n->fail(fmt::format("axis {} is not supported (the channels: -1, or 3 of NHWC)", axis));
  }
  return std::make_unique<ConcatenateConfig>();
}

// Keras's Concatenate.get_config() (keras/src/layers/merging/concatenate.py).
std::vector<KerasKeySpec> keras_keys_concatenate() {
  return {{"axis", KerasKey::kRead}};
}

}  // namespace dtrain::nn::layers
