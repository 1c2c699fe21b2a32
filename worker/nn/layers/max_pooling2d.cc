// Keras's MaxPooling2D: pool_size (default 2), strides (default pool_size), padding "valid".
// The forward keeps the workspace its backward needs, sized for the largest batch.
#include <fmt/format.h>

#include "common/errors.h"
#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

struct PoolKeys {
  int pool_h = 2, pool_w = 2;
  int stride_h = 2, stride_w = 2;
};

class MaxPool2D : public Layer {
 public:
  MaxPool2D(const PoolKeys& k, Dims in, const LayerContext& c) {
    shape_.c = in.c, shape_.h = in.h, shape_.w = in.w;
    shape_.kh = k.pool_h, shape_.kw = k.pool_w, shape_.sh = k.stride_h, shape_.sw = k.stride_w;
    workspace_ = Buffer<unsigned char>(c.backend.device(),
                                       c.backend.maxpool_workspace_bytes(at(c.max_batch)));
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    PoolShape s = at(a.n);
    DT_ENFORCE(b.maxpool_workspace_bytes(s) <= workspace_.size(), "pool workspace for batch {}",
               a.n);
    b.maxpool_forward(s, a.x[0], a.y, workspace_.data());
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (a.dx[0]) b.maxpool_backward(at(a.n), a.dy, workspace_.data(), a.dx[0]);
  }

 private:
  PoolShape at(int n) const {
    PoolShape s = shape_;
    s.n = n;
    return s;
  }
  PoolShape shape_;
  Buffer<unsigned char> workspace_;
};

class PoolConfig : public LayerConfig {
 public:
  explicit PoolConfig(const PoolKeys& keys) : k_(keys) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    const Dims& x = in[0];
    if (k_.pool_h > x.h || k_.pool_w > x.w) {
      throw common::ConfigError(fmt::format("{}: a {}x{} pool does not fit the {}x{} input", where,
                                            k_.pool_h, k_.pool_w, x.h, x.w));
    }
    return {x.c, (x.h - k_.pool_h) / k_.stride_h + 1, (x.w - k_.pool_w) / k_.stride_w + 1};
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext& c) const override {
    return std::make_unique<MaxPool2D>(k_, in[0], c);
  }

 private:
  PoolKeys k_;
};

}  // namespace

std::unique_ptr<LayerConfig> parse_max_pooling2d(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "pool_size", "strides", "padding"});
  PoolKeys k;
  if (auto n = node.find("pool_size")) std::tie(k.pool_h, k.pool_w) = int_or_pair(*n, 1, 64);
  std::tie(k.stride_h, k.stride_w) = std::pair{k.pool_h, k.pool_w};  // Keras: pool_size
  if (auto n = node.find("strides"); n && !n->is_null())
    std::tie(k.stride_h, k.stride_w) = int_or_pair(*n, 1, 64);
  if (auto n = node.find("padding"); n && n->as_string() != "valid")
    n->fail("only \"valid\" padding is supported for pooling");
  return std::make_unique<PoolConfig>(k);
}

// Keras's MaxPooling2D.get_config() (keras/src/layers/pooling/base_pooling.py).
std::vector<KerasKeySpec> keras_keys_max_pooling2d() {
  return {{"pool_size", KerasKey::kRead},
          {"padding", KerasKey::kRead},
          {"strides", KerasKey::kRead},
          {"data_format", KerasKey::kChannelsLast}};
}

}  // namespace dtrain::nn::layers
