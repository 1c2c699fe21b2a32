// Keras's Reshape: target_shape [units] (a flat output) or [height, width, channels], one size
// may be -1 (inferred). Keras reshapes the channels-last order of the elements; dtrain's
// activations are NCHW, so the layer is a fixed permutation of each example: read the input in
// channels-last order, lay the output out as NCHW. Where both orders agree (one channel, or a
// flat shape, on each side) it is a view, as flatten is.
#include <fmt/format.h>

#include <vector>

#include "common/errors.h"
#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

// Where NCHW element (c, y, x) of dims d sits in channels-last order.
size_t channels_last_at(const Dims& d, int c, int y, int x) {
  return (static_cast<size_t>(y) * d.w + x) * d.c + c;
}

bool orders_agree(const Dims& d) {
  return d.c == 1 || d.flat();
}

class Reshape : public Layer {
 public:
  Reshape(Dims in, Dims out, const LayerContext& c) : view_(orders_agree(in) && orders_agree(out)) {
    m_ = static_cast<int>(in.size());
    if (view_) return;
    // Channels-last position k of the input, as an NCHW index of the input.
    std::vector<int32_t> input_at(in.size());
    for (int ch = 0; ch < in.c; ++ch)
      for (int y = 0; y < in.h; ++y)
        for (int x = 0; x < in.w; ++x)
          input_at[channels_last_at(in, ch, y, x)] =
              static_cast<int32_t>((static_cast<size_t>(ch) * in.h + y) * in.w + x);
    // Output NCHW element j takes the input's channels-last element at its own channels-last
    // position.
    std::vector<int32_t> index(out.size());
    for (int ch = 0; ch < out.c; ++ch)
      for (int y = 0; y < out.h; ++y)
        for (int x = 0; x < out.w; ++x)
          index[(static_cast<size_t>(ch) * out.h + y) * out.w + x] =
              input_at[channels_last_at(out, ch, y, x)];
    index_ = Buffer<int32_t>(c.backend.device(), index.size());
    index_.from_host(index);
  }
  bool is_view() const override { return view_; }
  void forward(Backend& b, const ForwardArgs& a) override {
    DT_ENFORCE(!view_, "a reshape that is a view is never run");
    b.permute_forward(a.n, m_, index_.data(), a.x[0], a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    DT_ENFORCE(!view_, "a reshape that is a view is never run");
    if (a.dx[0]) b.permute_backward(a.n, m_, index_.data(), a.dy, a.dx[0]);
  }

 private:
  bool view_;
  int m_ = 0;
  Buffer<int32_t> index_;
};

class ReshapeConfig : public LayerConfig {
 public:
  explicit ReshapeConfig(std::vector<int> target) : target_(std::move(target)) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    refuse_sequence(in, where, "reshape");
    const long long size = static_cast<long long>(in[0].size());
    long long known = 1;
    for (int v : target_)
      if (v > 0) known *= v;
    std::vector<int> t = target_;
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
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext& c) const override {
    return std::make_unique<Reshape>(in[0], output_dims(in, ""), c);
  }

 private:
  std::string shape_text() const {
    std::string text = "[";
    for (size_t i = 0; i < target_.size(); ++i)
      text += (i ? ", " : "") + std::to_string(target_[i]);
    return text + "]";
  }
  std::vector<int> target_;
};

}  // namespace

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
  return std::make_unique<ReshapeConfig>(std::move(target));
}

// Keras's Reshape.get_config() (keras/src/layers/reshaping/reshape.py).
std::vector<KerasKeySpec> keras_keys_reshape() {
  return {{"target_shape", KerasKey::kRead}};
}

}  // namespace dtrain::nn::layers
