// What the layers that move pixels share (zero_padding2d, random_crop, random_flip): a Layer
// whose forward is backend.h's remap2d with one PixelMap per example, chosen by the subclass
// (from the step's key in training, fixed in inference), and whose backward is its transpose.
// The maps of the last forward are kept for the backward.
#pragma once

#include <vector>

#include "worker/nn/layers/layer_parts.h"
#include "worker/nn/random.h"

namespace dtrain::nn::layers {

class Remapped : public Layer {
 public:
  Remapped(Dims in, Dims out) : in_(in), out_(out) {}
  void forward(Backend& b, const ForwardArgs& a) override {
    maps_.resize(static_cast<size_t>(a.n));
    for (int i = 0; i < a.n; ++i) maps_[static_cast<size_t>(i)] = map(a, i);
    b.remap2d_forward(a.n, in_.c, in_.h, in_.w, out_.h, out_.w, maps_.data(), a.x[0], a.y);
  }
  void backward(Backend& b, const BackwardArgs& a, const std::function<void(size_t)>&) override {
    if (a.dx[0])
      b.remap2d_backward(a.n, in_.c, in_.h, in_.w, out_.h, out_.w, maps_.data(), a.dy, a.dx[0]);
  }

 protected:
  /// Example i's map in this forward.
  virtual PixelMap map(const ForwardArgs& a, int i) const = 0;
  /// A draw for example i of this step's shard: a pure function of (seed, epoch, step, the
  /// layer's index, shard, example, which) (docs/design.md#augmentation).
  static uint64_t draw(const ForwardArgs& a, int index, int i, int which) {
    return random_key(a.key.seed, static_cast<uint64_t>(a.key.epoch),
                      static_cast<uint64_t>(a.key.step), 3000 + static_cast<uint64_t>(index),
                      (static_cast<uint64_t>(a.key.shard) << 32 | static_cast<uint64_t>(i)) * 4 +
                          static_cast<uint64_t>(which));
  }
  Dims in_, out_;

 private:
  std::vector<PixelMap> maps_;
};

}  // namespace dtrain::nn::layers
