// keras_hub's PositionEmbedding (docs/design.md#sequences): a learned table "embeddings"
// (sequence_length, D), glorot_uniform by default; its output, for a sequence of T <=
// sequence_length positions of D features, is the table's first T rows, the same for every example
// (it reads only its input's shape, and gives it no gradient). The table's gradient sums the
// examples' in order. Keras adds it to the token embeddings with an Add layer;
// TokenAndPositionEmbedding (token_and_position_embedding.cc) does both in one.
#include <fmt/format.h>

#include <string>

#include "worker/nn/layers/layer_keys.h"
#include "worker/nn/layers/position_rows.h"

namespace dtrain::nn::layers {
namespace {

class PositionEmbedding : public Layer {
 public:
  PositionEmbedding(int length, Initializer init, Dims in)
      : length_(length), init_(init), t_(in.h), d_(in.w) {}
  std::vector<ParamInfo> params() const override {
    return {{"embeddings", {length_, d_}, 0, static_cast<size_t>(length_) * d_}};
  }
  void initialize(float* p, float*, uint64_t seed) const override {
    initialize_kernel(init_, p, static_cast<size_t>(length_) * d_, length_, d_, seed);
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    position_rows_forward(b, a.n, t_, d_, a.params, a.y);
  }
  void backward(Backend& b, const BackwardArgs& a,
                const std::function<void(size_t)>& enqueued) override {
    position_rows_backward(b, a.n, t_, d_, length_, a.dy, a.grads);
    if (enqueued) enqueued(0);
    if (a.dx[0]) b.device().fill_zero(a.dx[0], static_cast<size_t>(a.n) * t_ * d_ * sizeof(float));
  }

 private:
  int length_;
  Initializer init_;
  int t_, d_;
};

class PositionEmbeddingConfig : public LayerConfig {
 public:
  PositionEmbeddingConfig(int length, Initializer init) : length_(length), init_(init) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    const Dims& x = in[0];
    if (!x.sequence || x.c != 1) {
      throw common::ConfigError(fmt::format(
          "{}: position_embedding takes a sequence (positions x features), not a {}x{}x{} input",
          where, x.h, x.w, x.c));
    }
    if (x.h > length_) {
      throw common::ConfigError(fmt::format(
          "{}: its input has {} positions, more than its sequence_length {}", where, x.h, length_));
    }
    return x;
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext&) const override {
    return std::make_unique<PositionEmbedding>(length_, init_, in[0]);
  }
  bool gpu_tested() const override { return false; }

 private:
  int length_;
  Initializer init_;
};

}  // namespace

std::unique_ptr<LayerConfig> parse_position_embedding(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "sequence_length", "initializer"});
  const int length = static_cast<int>(node.at("sequence_length").as_int(1, 1 << 20));
  Initializer init = Initializer::kGlorotUniform;
  if (auto n = node.find("initializer")) init = parse_initializer(*n);
  return std::make_unique<PositionEmbeddingConfig>(length, init);
}

// keras_hub's PositionEmbedding.get_config() (keras_hub/src/layers/modeling/
// position_embedding.py).
std::vector<KerasKeySpec> keras_keys_position_embedding() {
  return {{"sequence_length", KerasKey::kRead}, {"initializer", KerasKey::kInitializer}};
}

}  // namespace dtrain::nn::layers
