// Keras's Conv2D: filters, kernel_size, strides, padding valid|same (TensorFlow's: the odd pixel
// after), activation, use_bias, kernel_ and bias_regularizer (L1L2 factors on its tensors,
// applied by the step). Kernel k,c,kh,kw (OIHW), glorot_uniform; bias zero. Without a
// bias the backend still gets one, zeros of the layer's own, and its gradient goes to scratch.
#include <fmt/format.h>

#include <algorithm>

#include "worker/nn/layers/layer_keys.h"

namespace dtrain::nn::layers {
namespace {

struct Conv2dKeys {
  int filters = 0;
  int kernel_h = 1, kernel_w = 1;
  int stride_h = 1, stride_w = 1;
  bool same_padding = false;
  bool use_bias = true;
  Activation activation = Activation::kLinear;
  Initializer init = Initializer::kGlorotUniform;
  Regularizer kernel_regularizer, bias_regularizer;
  bool regularized() const {
    return kernel_regularizer.l1 > 0 || kernel_regularizer.l2 > 0 || bias_regularizer.l1 > 0 ||
           bias_regularizer.l2 > 0;
  }
};

/// One example's convolution for these keys and input (n = 1).
ConvShape conv_shape_of(const Conv2dKeys& k, Dims in) {
  ConvShape s;
  s.c = in.c, s.h = in.h, s.w = in.w, s.k = k.filters;
  s.kh = k.kernel_h, s.kw = k.kernel_w, s.sh = k.stride_h, s.sw = k.stride_w;
  if (k.same_padding) {
    std::tie(s.pad_top, s.pad_bottom) = same_padding(in.h, k.kernel_h, k.stride_h);
    std::tie(s.pad_left, s.pad_right) = same_padding(in.w, k.kernel_w, k.stride_w);
  }
  return s;
}

class Conv2D : public Activated {
 public:
  Conv2D(const Conv2dKeys& k, Dims in, Dims out, const LayerContext& c)
      : Activated(k.activation, out, c),
        use_bias_(k.use_bias),
        init_(k.init),
        kernel_regularizer_(k.kernel_regularizer),
        bias_regularizer_(k.bias_regularizer) {
    if (!use_bias_) {  // a zero bias to add, and somewhere for its gradient to go
      no_bias_ = Buffer<float>(c.backend.device(), 2 * static_cast<size_t>(k.filters));
      c.backend.device().fill_zero(no_bias_.data(), no_bias_.bytes());
    }
    shape_ = conv_shape_of(k, in);
  }
  std::vector<ParamInfo> params() const override {
    size_t kernel = shape_.weight_count();
    std::vector<ParamInfo> out = {{"kernel",
                                   {shape_.k, shape_.c, shape_.kh, shape_.kw},
                                   0,
                                   kernel,
                                   kernel_regularizer_.l1,
                                   kernel_regularizer_.l2}};
    if (use_bias_)
      out.push_back({"bias",
                     {shape_.k},
                     kernel,
                     static_cast<size_t>(shape_.k),
                     bias_regularizer_.l1,
                     bias_regularizer_.l2});
    return out;
  }
  void initialize(float* p, float*, uint64_t seed) const override {
    int area = shape_.kh * shape_.kw;
    size_t kernel = shape_.weight_count();
    initialize_kernel(init_, p, kernel, area * shape_.c, area * shape_.k, seed);
    if (use_bias_) std::fill(p + kernel, p + kernel + shape_.k, 0.0f);
  }
  void forward(Backend& b, const ForwardArgs& a) override {
    const float* bias = use_bias_ ? a.params + shape_.weight_count() : no_bias_.data();
    if (relu())
      b.conv2d_relu_forward(at(a.n), a.x[0], a.params, bias, a.y);
    else
      b.conv2d_forward(at(a.n), a.x[0], a.params, bias, op_output(a.y));
    activate(b, a.n, a.y);
  }
  void backward(Backend& b, const BackwardArgs& a,
                const std::function<void(size_t)>& enqueued) override {
    float* db = use_bias_ ? a.grads + shape_.weight_count() : no_bias_.data() + shape_.k;
    if (relu() && !a.dx[0]) {  // nobody needs dx: no dz beyond the weight gradient
      b.conv2d_relu_backward_weights(at(a.n), a.x[0], a.y, a.dy, a.grads, db, scratch());
      if (enqueued) enqueued(0);
      return;
    }
    const float* dz = deactivate(b, a.n, a.y, a.dy);
    // x is the one this layer's forward was given (the model keeps activations until backward).
    b.conv2d_backward(at(a.n), a.x[0], dz, a.params, a.dx[0], a.grads, db, [&] {
      if (enqueued) enqueued(0);
    });
  }

 private:
  ConvShape at(int n) const {
    ConvShape s = shape_;
    s.n = n;
    return s;
  }
  ConvShape shape_;
  bool use_bias_;
  Initializer init_;
  Regularizer kernel_regularizer_, bias_regularizer_;
  Buffer<float> no_bias_;  ///< without a bias: k zeros, then k floats of its unused gradient
};

class Conv2dConfig : public LayerConfig {
 public:
  explicit Conv2dConfig(const Conv2dKeys& keys) : k_(keys) {}
  Dims output_dims(const std::vector<Dims>& in, const std::string& where) const override {
    refuse_sequence(in, where, "conv2d");
    const Dims& x = in[0];
    if (k_.same_padding)
      return {k_.filters, (x.h + k_.stride_h - 1) / k_.stride_h,
              (x.w + k_.stride_w - 1) / k_.stride_w};
    if (k_.kernel_h > x.h || k_.kernel_w > x.w) {
      throw common::ConfigError(fmt::format("{}: a {}x{} kernel does not fit the {}x{} input",
                                            where, k_.kernel_h, k_.kernel_w, x.h, x.w));
    }
    return {k_.filters, (x.h - k_.kernel_h) / k_.stride_h + 1,
            (x.w - k_.kernel_w) / k_.stride_w + 1};
  }
  std::unique_ptr<Layer> make(const std::vector<Dims>& in, const LayerContext& c) const override {
    return std::make_unique<Conv2D>(k_, in[0], output_dims(in, ""), c);
  }
  Activation activation() const override { return k_.activation; }
  bool gpu_tested() const override {
    Eltwise f;
    return !eltwise_of(k_.activation, &f) && !k_.regularized();
  }
  LayerCost cost(const std::vector<Dims>& in) const override {
    Dims out = output_dims(in, "");
    LayerCost cost;
    cost.conv_output = out.size();
    cost.conv = conv_shape_of(k_, in[0]);
    cost.macs = static_cast<double>(out.size()) * in[0].c * k_.kernel_h * k_.kernel_w;
    return cost;
  }

 private:
  Conv2dKeys k_;
};

}  // namespace

std::unique_ptr<LayerConfig> parse_conv2d(const common::JsonNode& node) {
  node.check_keys({"type", "name", "inputs", "filters", "kernel_size", "strides", "padding",
                   "activation", "use_bias", "kernel_initializer", "kernel_regularizer",
                   "bias_regularizer"});
  Conv2dKeys k;
  k.filters = static_cast<int>(node.at("filters").as_int(1, 65536));
  std::tie(k.kernel_h, k.kernel_w) = int_or_pair(node.at("kernel_size"), 1, 64);
  if (auto n = node.find("strides")) std::tie(k.stride_h, k.stride_w) = int_or_pair(*n, 1, 64);
  if (auto n = node.find("padding")) {
    std::string padding = n->as_string();
    if (padding != "valid" && padding != "same")
      n->fail(fmt::format("expected \"valid\" or \"same\", found \"{}\"", padding));
    k.same_padding = padding == "same";
  }
  if (auto n = node.find("use_bias")) k.use_bias = n->as_bool();
  if (auto n = node.find("kernel_initializer")) k.init = parse_initializer(*n);
  if (auto n = node.find("kernel_regularizer")) k.kernel_regularizer = parse_regularizer(*n);
  if (auto n = node.find("bias_regularizer")) k.bias_regularizer = parse_regularizer(*n);
  if (auto n = node.find("activation")) {
    k.activation = parse_activation(*n);
    if (k.activation == Activation::kSoftmax) n->fail("softmax only on a dense layer");
  }
  return std::make_unique<Conv2dConfig>(k);
}

// Keras's Conv2D.get_config() (keras/src/layers/convolutional/base_conv.py): data_format,
// dilation_rate, groups, the initializers and the rest at the values this layer computes.
std::vector<KerasKeySpec> keras_keys_conv2d() {
  return {{"filters", KerasKey::kRead},
          {"kernel_size", KerasKey::kRead},
          {"strides", KerasKey::kRead},
          {"padding", KerasKey::kRead},
          {"data_format", KerasKey::kChannelsLast},
          {"dilation_rate", KerasKey::kOne},
          {"groups", KerasKey::kOne},
          {"activation", KerasKey::kActivation},
          {"use_bias", KerasKey::kRead},
          {"kernel_initializer", KerasKey::kInitializer},
          {"bias_initializer", KerasKey::kZeros},
          {"kernel_regularizer", KerasKey::kRegularizer},
          {"bias_regularizer", KerasKey::kRegularizer},
          {"kernel_constraint", KerasKey::kNull},
          {"bias_constraint", KerasKey::kNull},
          {"lora_rank", KerasKey::kNull},
          {"lora_alpha", KerasKey::kNull}};
}

}  // namespace dtrain::nn::layers
