// Keras's ZeroPadding2D: padding an int, a pair (rows, columns) or ((top, bottom), (left,
// right)) of zeros around each image.
// Its keys and shape rules: worker/spec/layers/zero_padding2d.h.
#include "worker/spec/layers/zero_padding2d.h"

#include "worker/nn/layers/remapped.h"

namespace dtrain::nn::layers {
namespace {

class ZeroPadding2D : public Remapped {
 public:
  ZeroPadding2D(const PaddingKeys& p, Dims in, Dims out) : Remapped(in, out), p_(p) {}

 protected:
  PixelMap map(const ForwardArgs&, int) const override { return {-p_.top, -p_.left, 1, 1}; }

 private:
  PaddingKeys p_;
};

}  // namespace

std::unique_ptr<Layer> make_zero_padding2d(const LayerConfig& config, const std::vector<Dims>& in,
                                           const LayerContext& /*c*/) {
  const PaddingKeys& k = static_cast<const ZeroPadding2dConfig&>(config).keys();
  return std::make_unique<ZeroPadding2D>(k, in[0], config.output_dims(in, ""));
}

}  // namespace dtrain::nn::layers
