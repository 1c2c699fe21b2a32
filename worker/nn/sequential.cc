// See sequential.h.
#include "worker/nn/sequential.h"

#include "common/errors.h"
#include "worker/nn/random.h"

namespace dtrain::nn {

Sequential::Sequential(const ModelSpec& spec, Backend& backend, int max_batch,
                       float* gradient_memory, size_t gradient_floats)
    : backend_(backend), max_batch_(max_batch) {
  dims_.push_back({spec.channels, spec.height, spec.width});
  size_t offset = 0;
  for (size_t i = 0; i < spec.layers.size(); ++i) {
    layers_.push_back(
        make_layer(spec.layers[i], static_cast<int>(i), dims_.back(), max_batch, backend));
    has_random_layers_ |= spec.layers[i].type == LayerType::kDropout;
    dims_.push_back(layers_.back()->output_dims());
    ParamRange range{offset, 0};
    for (ParamInfo info : layers_.back()->params()) {
      info.offset += offset;
      infos_.push_back(info);
      range.count += info.count;
    }
    ranges_.push_back(range);
    offset += range.count;
  }
  Dims last = dims_.back();
  if (last.h != 1 || last.w != 1) {
    throw common::ConfigError(
        fmt::format("model.layers[{}]: the model must end in a flat output (a dense layer); "
                    "it ends in {}x{}x{}",
                    spec.layers.size() - 1, last.h, last.w, last.c));
  }
  first_piece_.assign(layers_.size(), 0);
  for (size_t i = layers_.size(); i-- > 0;) {
    first_piece_[i] = pieces_.size();
    for (const ParamRange& piece : layers_[i]->gradient_pieces()) {
      pieces_.push_back({ranges_[i].offset + piece.offset, piece.count, i});
    }
  }
  Device& device = backend.device();
  parameters_ = Buffer<float>(device, offset);
  move_gradients(gradient_memory, gradient_floats);
  activations_.push_back(nullptr);  // the caller's input
  deltas_.push_back(nullptr);       // nobody needs the input's gradient
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i]->is_view()) {
      activations_.push_back(activations_.back());
      deltas_.push_back(deltas_.back());
      continue;
    }
    size_t count = dims_[i + 1].size() * static_cast<size_t>(max_batch);
    storage_.emplace_back(device, count);
    activations_.push_back(storage_.back().data());
    storage_.emplace_back(device, count);
    deltas_.push_back(storage_.back().data());
  }
}

Sequential::~Sequential() = default;

void Sequential::move_gradients(float* gradient_memory, size_t gradient_floats) {
  Device& device = backend_.device();
  size_t count = parameters_.size();
  if (gradient_memory != nullptr && count <= gradient_floats) {
    gradients_ = Buffer<float>(device, gradient_memory, count);
    device.fill_zero(gradient_memory, count * sizeof(float));  // as fresh device memory is
  } else if (gradients_.size() != count || !gradients_.owned()) {
    gradients_ = Buffer<float>(device, count);
  }
}

void Sequential::initialize(uint64_t seed) {
  std::vector<float> host(parameters_.size(), 0.0f);
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->initialize(host.data() + ranges_[i].offset, random_key(seed, 0x1a7e5, i));
  }
  parameters_.from_host(host);
}

const float* Sequential::forward(const float* images, int n, const StepKey& key, bool training) {
  DT_ENFORCE(n > 0 && n <= max_batch_, "batch of {} for a model built for {}", n, max_batch_);
  activations_[0] = images;
  // Views share their input's pointer, which for the first layer is the caller's input.
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i]->is_view()) {
      activations_[i + 1] = activations_[i];
      continue;
    }
    layers_[i]->forward(backend_, n, activations_[i], const_cast<float*>(activations_[i + 1]),
                        parameters_.data() + ranges_[i].offset, key, training);
  }
  return activations_.back();
}

void Sequential::backward(int n, const std::function<void(size_t piece)>& gradients_enqueued) {
  for (size_t i = layers_.size(); i-- > 0;) {
    if (layers_[i]->is_view()) continue;
    std::function<void(size_t)> enqueued;
    if (gradients_enqueued && ranges_[i].count > 0)
      enqueued = [&](size_t k) { gradients_enqueued(first_piece_[i] + k); };
    layers_[i]->backward(backend_, n, activations_[i], activations_[i + 1], deltas_[i + 1],
                         deltas_[i], parameters_.data() + ranges_[i].offset,
                         gradients_.data() + ranges_[i].offset, enqueued);
  }
}

}  // namespace dtrain::nn
