// Keras's Reshape: target_shape [units] (a flat output) or [height, width, channels], one size
// may be -1 (inferred). Keras reshapes the channels-last order of the elements; dtrain's
// activations are NCHW, so the layer is a fixed permutation of each example: read the input in
// channels-last order, lay the output out as NCHW. Where both orders agree (one channel, or a
// flat shape, on each side) it is a view, as flatten is.
// Its keys and shape rules: worker/spec/layers/reshape.h.
#include "worker/spec/layers/reshape.h"

#include <cstdint>
#include <vector>

#include "common/errors.h"
#include "worker/nn/layers/layer_parts.h"

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

}  // namespace

std::unique_ptr<Layer> make_reshape(const LayerConfig& config, const std::vector<Dims>& in,
                                    const LayerContext& c) {
  return std::make_unique<Reshape>(in[0], config.output_dims(in, ""), c);
}

}  // namespace dtrain::nn::layers
