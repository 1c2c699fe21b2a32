// See sequential.h.
#include "worker/nn/sequential.h"

#include <cstring>

#include "common/errors.h"
#include "worker/nn/random.h"

namespace dtrain::nn {

Sequential::Sequential(const ModelSpec& spec, Backend& backend, int max_batch,
                       size_t extra_gradient_slots)
    : backend_(backend), max_batch_(max_batch) {
  dims_.push_back({spec.channels, spec.height, spec.width});
  size_t offset = 0;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    layers_.push_back(make_layer(spec.layers[i], static_cast<int>(i), dims_.back(), max_batch));
    dims_.push_back(layers_.back()->output_dims());
    offsets_.push_back(offset);
    for (ParamInfo info : layers_.back()->params()) {
      info.offset += offset;
      infos_.push_back(info);
    }
    for (const ParamInfo& info : layers_.back()->params()) offset += info.count;
  }
  softmax_output_ = spec.layers.back().activation == Activation::kSoftmax;
  Dims last = dims_.back();
  if (last.h != 1 || last.w != 1) {
    throw common::ConfigError(
        fmt::format("model.layers[{}]: the model must end in a flat output (a dense layer); "
                    "it ends in {}x{}x{}",
                    spec.layers.size() - 1, last.h, last.w, last.c));
  }
  parameters_.assign(offset, 0.0f);
  gradients_.assign(offset + extra_gradient_slots, 0.0f);
  for (const Dims& d : dims_) {
    activations_.emplace_back(d.size() * static_cast<size_t>(max_batch));
    deltas_.emplace_back(d.size() * static_cast<size_t>(max_batch));
  }
}

Sequential::~Sequential() = default;

void Sequential::initialize(uint64_t seed) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->initialize(parameters_.data() + offsets_[i], random_key(seed, 0x1a7e5, i));
  }
}

const float* Sequential::forward(const float* images, int n, const StepKey& key, bool training) {
  DT_ENFORCE(n > 0 && n <= max_batch_, "batch of {} for a model built for {}", n, max_batch_);
  std::memcpy(activations_[0].data(), images,
              sizeof(float) * dims_[0].size() * static_cast<size_t>(n));
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->forward(backend_, n, activations_[i].data(), activations_[i + 1].data(),
                        parameters_.data() + offsets_[i], key, training);
  }
  return activations_.back().data();
}

void Sequential::backward(const float* dlogits, int n) {
  std::memcpy(deltas_.back().data(), dlogits,
              sizeof(float) * dims_.back().size() * static_cast<size_t>(n));
  for (size_t i = layers_.size(); i-- > 0;) {
    float* dx = i == 0 ? nullptr : deltas_[i].data();  // nobody needs the input's gradient
    layers_[i]->backward(backend_, n, activations_[i].data(), activations_[i + 1].data(),
                         deltas_[i + 1].data(), dx, parameters_.data() + offsets_[i],
                         gradients_.data() + offsets_[i]);
  }
}

}  // namespace dtrain::nn
