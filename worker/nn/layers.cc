// See layers.h. Activations (relu) are fused into the conv or dense op's forward and undone
// in backward with the layer's own gradient scratch. Every buffer a layer keeps is a Buffer on
// the backend's device; nothing here touches layer data on the host except initialisation.
#include "worker/nn/layers.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "common/errors.h"
#include "worker/nn/random.h"

namespace dtrain::nn {
namespace {

void glorot_uniform(float* w, size_t count, int fan_in, int fan_out, uint64_t seed) {
  float limit = std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
  for (size_t i = 0; i < count; ++i) w[i] = (2.0f * unit_float(random_key(seed, i)) - 1.0f) * limit;
}

// A layer whose op may be followed by relu (fused into the op's forward); its gradient is
// applied before the op's backward.
class Activated : public Layer {
 protected:
  Activated(Activation activation, Dims out, int max_batch, Backend& backend)
      : activation_(activation), out_(out) {
    if (activation_ == Activation::kRelu)
      delta_ = Buffer<float>(backend.device(), out.size() * static_cast<size_t>(max_batch));
  }
  bool relu() const { return activation_ == Activation::kRelu; }
  // dy through the activation: dy itself when linear (softmax is fused into the loss).
  const float* deactivate(Backend& b, int n, const float* y, const float* dy) {
    if (activation_ != Activation::kRelu) return dy;
    b.relu_backward(out_.size() * static_cast<size_t>(n), y, dy, delta_.data());
    return delta_.data();
  }
  Activation activation_;
  Dims out_;
  Buffer<float> delta_;
};

class Conv2D : public Activated {
 public:
  Conv2D(const LayerSpec& l, int index, Dims in, int max_batch, Backend& backend)
      : Activated(l.activation, output_of(l, in), max_batch, backend), index_(index) {
    shape_.c = in.c, shape_.h = in.h, shape_.w = in.w, shape_.k = l.filters;
    shape_.kh = l.kernel_h, shape_.kw = l.kernel_w, shape_.sh = l.stride_h, shape_.sw = l.stride_w;
    if (l.same_padding) {
      std::tie(shape_.pad_top, shape_.pad_bottom) = same_padding(in.h, l.kernel_h, l.stride_h);
      std::tie(shape_.pad_left, shape_.pad_right) = same_padding(in.w, l.kernel_w, l.stride_w);
    }
  }
  static Dims output_of(const LayerSpec& l, Dims in) {
    auto [c, h, w] = layer_output(l, in.c, in.h, in.w);
    return {c, h, w};
  }
  Dims output_dims() const override { return out_; }
  std::vector<ParamInfo> params() const override {
    size_t kernel = shape_.weight_count();
    std::string base = fmt::format("layers.{}.conv2d.", index_);
    return {{base + "kernel", {shape_.k, shape_.c, shape_.kh, shape_.kw}, 0, kernel},
            {base + "bias", {shape_.k}, kernel, static_cast<size_t>(shape_.k)}};
  }
  void initialize(float* p, uint64_t seed) const override {
    int area = shape_.kh * shape_.kw;
    glorot_uniform(p, params()[0].count, area * shape_.c, area * shape_.k, seed);
    std::fill(p + params()[1].offset, p + params()[1].offset + params()[1].count, 0.0f);
  }
  void forward(Backend& b, int n, const float* x, float* y, const float* p, const StepKey&,
               bool) override {
    if (relu())
      b.conv2d_relu_forward(at(n), x, p, p + params()[1].offset, y);
    else
      b.conv2d_forward(at(n), x, p, p + params()[1].offset, y);
  }
  void backward(Backend& b, int n, const float* x, const float* y, const float* dy, float* dx,
                const float* p, float* g, const std::function<void(size_t)>& enqueued) override {
    if (relu() && !dx) {  // the first layer: no dz needed beyond the weight gradient
      b.conv2d_relu_backward_weights(at(n), x, y, dy, g, g + params()[1].offset, delta_.data());
      if (enqueued) enqueued(0);
      return;
    }
    const float* dz = deactivate(b, n, y, dy);
    b.conv2d_backward_weights(at(n), x, dz, g, g + params()[1].offset);
    if (enqueued) enqueued(0);
    if (dx) b.conv2d_backward_data(at(n), dz, p, dx);
  }

 private:
  ConvShape at(int n) const {
    ConvShape s = shape_;
    s.n = n;
    return s;
  }
  int index_;
  ConvShape shape_;
};

class Dense : public Activated {
 public:
  Dense(const LayerSpec& l, int index, Dims in, int max_batch, Backend& backend)
      : Activated(l.activation, {l.units, 1, 1}, max_batch, backend),
        index_(index),
        in_(static_cast<int>(in.size())) {}
  Dims output_dims() const override { return out_; }
  std::vector<ParamInfo> params() const override {
    size_t kernel = static_cast<size_t>(in_) * out_.c;
    std::string base = fmt::format("layers.{}.dense.", index_);
    return {{base + "kernel", {in_, out_.c}, 0, kernel},
            {base + "bias", {out_.c}, kernel, static_cast<size_t>(out_.c)}};
  }
  // The bias, then the kernel in pieces of whole rows, last rows first.
  std::vector<ParamRange> gradient_pieces() const override {
    size_t kernel = static_cast<size_t>(in_) * out_.c;
    std::vector<ParamRange> pieces = {{kernel, static_cast<size_t>(out_.c)}};
    size_t rows_per_piece = std::max<size_t>(1, kGradientPieceFloats / out_.c);
    for (size_t end = in_; end > 0;) {
      size_t begin = end > rows_per_piece ? end - rows_per_piece : 0;
      pieces.push_back({begin * out_.c, (end - begin) * out_.c});
      end = begin;
    }
    return pieces;
  }
  void initialize(float* p, uint64_t seed) const override {
    glorot_uniform(p, params()[0].count, in_, out_.c, seed);
    std::fill(p + params()[1].offset, p + params()[1].offset + out_.c, 0.0f);
  }
  void forward(Backend& b, int n, const float* x, float* y, const float* p, const StepKey&,
               bool) override {
    if (relu())
      b.dense_relu_forward(n, in_, out_.c, x, p, p + params()[1].offset, y);
    else
      b.dense_forward(n, in_, out_.c, x, p, p + params()[1].offset, y);
  }
  void backward(Backend& b, int n, const float* x, const float* y, const float* dy, float* dx,
                const float* p, float* g, const std::function<void(size_t)>& enqueued) override {
    const float* dz = deactivate(b, n, y, dy);
    // The bias, then the kernel from its last rows to its first: each piece extends the
    // gradients produced so far downwards, so buckets stay contiguous.
    b.dense_backward_bias(n, out_.c, dz, g + params()[1].offset);
    if (!enqueued) {  // nobody waits for pieces: one product for the whole kernel
      b.dense_backward_weight_rows(n, in_, out_.c, x, dz, g, 0, in_);
      if (dx) b.dense_backward_data(n, in_, out_.c, dz, p, dx);
      return;
    }
    enqueued(0);
    std::vector<ParamRange> pieces = gradient_pieces();
    for (size_t k = 1; k < pieces.size(); ++k) {
      int first = static_cast<int>(pieces[k].offset / out_.c);
      int last = static_cast<int>((pieces[k].offset + pieces[k].count) / out_.c);
      b.dense_backward_weight_rows(n, in_, out_.c, x, dz, g, first, last);
      enqueued(k);
    }
    if (dx) b.dense_backward_data(n, in_, out_.c, dz, p, dx);
  }

 private:
  int index_;
  int in_;
};

class MaxPool2D : public Layer {
 public:
  MaxPool2D(const LayerSpec& l, Dims in, int max_batch, Backend& backend) {
    shape_.c = in.c, shape_.h = in.h, shape_.w = in.w;
    shape_.kh = l.pool_h, shape_.kw = l.pool_w, shape_.sh = l.stride_h, shape_.sw = l.stride_w;
    workspace_ =
        Buffer<unsigned char>(backend.device(), backend.maxpool_workspace_bytes(at(max_batch)));
  }
  Dims output_dims() const override { return {shape_.c, shape_.oh(), shape_.ow()}; }
  void forward(Backend& b, int n, const float* x, float* y, const float*, const StepKey&,
               bool) override {
    PoolShape s = at(n);
    DT_ENFORCE(b.maxpool_workspace_bytes(s) <= workspace_.size(), "pool workspace for batch {}", n);
    b.maxpool_forward(s, x, y, workspace_.data());
  }
  void backward(Backend& b, int n, const float*, const float*, const float* dy, float* dx,
                const float*, float*, const std::function<void(size_t)>&) override {
    if (dx) b.maxpool_backward(at(n), dy, workspace_.data(), dx);
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

// Flatten: a view (NCHW is already flat per example), so the model never calls it.
class Flatten : public Layer {
 public:
  explicit Flatten(Dims out) : out_(out) {}
  Dims output_dims() const override { return out_; }
  bool is_view() const override { return true; }
  void forward(Backend&, int, const float*, float*, const float*, const StepKey&, bool) override {
    DT_ENFORCE(false, "flatten is a view; its forward is never called");
  }
  void backward(Backend&, int, const float*, const float*, const float*, float*, const float*,
                float*, const std::function<void(size_t)>&) override {
    DT_ENFORCE(false, "flatten is a view; its backward is never called");
  }

 private:
  Dims out_;
};

// A standalone ReLU layer.
class Relu : public Layer {
 public:
  explicit Relu(Dims dims) : dims_(dims) {}
  Dims output_dims() const override { return dims_; }
  void forward(Backend& b, int n, const float* x, float* y, const float*, const StepKey&,
               bool) override {
    b.relu_forward(dims_.size() * static_cast<size_t>(n), x, y);
  }
  void backward(Backend& b, int n, const float*, const float* y, const float* dy, float* dx,
                const float*, float*, const std::function<void(size_t)>&) override {
    if (dx) b.relu_backward(dims_.size() * static_cast<size_t>(n), y, dy, dx);
  }

 private:
  Dims dims_;
};

// Inverted dropout: keep with probability 1 - rate and scale by 1 / (1 - rate); the mask is a
// pure function of (seed, epoch, step, layer, element), the same on every backend.
class Dropout : public Layer {
 public:
  Dropout(const LayerSpec& l, int index, Dims in, int max_batch, Backend& backend)
      : rate_(l.rate),
        index_(index),
        dims_(in),
        mask_(backend.device(), in.size() * static_cast<size_t>(max_batch)) {}
  Dims output_dims() const override { return dims_; }
  void forward(Backend& b, int n, const float* x, float* y, const float*, const StepKey& key,
               bool training) override {
    size_t count = dims_.size() * static_cast<size_t>(n);
    training_ = training;
    if (!training) {
      b.device().copy(y, x, count * sizeof(float));
      return;
    }
    // random_key(seed, epoch, step, 1000 + index, i) == mix64(stream ^ i) for this stream.
    uint64_t stream = mix64(mix64(mix64(mix64(key.seed) ^ static_cast<uint64_t>(key.epoch)) ^
                                  static_cast<uint64_t>(key.step)) ^
                            static_cast<uint64_t>(1000 + index_));
    b.dropout_forward(count, rate_, stream, x, y, mask_.data());
  }
  void backward(Backend& b, int n, const float*, const float*, const float* dy, float* dx,
                const float*, float*, const std::function<void(size_t)>&) override {
    if (!dx) return;
    size_t count = dims_.size() * static_cast<size_t>(n);
    if (training_) {
      b.multiply(count, dy, mask_.data(), dx);
    } else {
      b.device().copy(dx, dy, count * sizeof(float));
    }
  }

 private:
  float rate_;
  int index_;
  Dims dims_;
  Buffer<float> mask_;
  bool training_ = true;
};

}  // namespace

std::vector<ParamRange> Layer::gradient_pieces() const {
  size_t count = 0;
  for (const ParamInfo& p : params()) count += p.count;
  if (count == 0) return {};
  return {{0, count}};
}

std::unique_ptr<Layer> make_layer(const LayerSpec& l, int index, Dims in, int max_batch,
                                  Backend& backend) {
  auto where = [&] { return fmt::format("model.layers[{}]", index); };
  switch (l.type) {
    case LayerType::kConv2d: {
      Dims out = Conv2D::output_of(l, in);
      if (out.h < 1 || out.w < 1) {
        throw common::ConfigError(fmt::format("{}: a {}x{} kernel does not fit the {}x{} input",
                                              where(), l.kernel_h, l.kernel_w, in.h, in.w));
      }
      return std::make_unique<Conv2D>(l, index, in, max_batch, backend);
    }
    case LayerType::kMaxPooling2d:
      if (l.pool_h > in.h || l.pool_w > in.w) {
        throw common::ConfigError(fmt::format("{}: a {}x{} pool does not fit the {}x{} input",
                                              where(), l.pool_h, l.pool_w, in.h, in.w));
      }
      return std::make_unique<MaxPool2D>(l, in, max_batch, backend);
    case LayerType::kDense:
      if (in.h != 1 || in.w != 1) {
        throw common::ConfigError(
            fmt::format("{}: dense needs flat input ({}x{}x{}); add a flatten layer before it",
                        where(), in.h, in.w, in.c));
      }
      return std::make_unique<Dense>(l, index, in, max_batch, backend);
    case LayerType::kFlatten:
      return std::make_unique<Flatten>(Dims{static_cast<int>(in.size()), 1, 1});
    case LayerType::kRelu:
      return std::make_unique<Relu>(in);
    case LayerType::kDropout:
      return std::make_unique<Dropout>(l, index, in, max_batch, backend);
  }
  DT_ENFORCE(false, "layer type {} has no implementation", static_cast<int>(l.type));
  return nullptr;
}

}  // namespace dtrain::nn
