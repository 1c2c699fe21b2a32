// See input_stager.h.
#include "worker/train/input_stager.h"

#include <algorithm>

#include "common/errors.h"

namespace dtrain::train {

InputStager::InputStager(nn::Device& device, size_t example_floats, int batch, int example_labels)
    : device_(device),
      example_floats_(example_floats),
      batch_(batch),
      example_labels_(static_cast<size_t>(example_labels)) {
  size_t images = example_floats * static_cast<size_t>(batch);
  size_t labels = example_labels_ * static_cast<size_t>(batch);
  for (int i = 0; i < kSlots; ++i) {
    slots_.push_back(Slot{nn::PinnedBuffer<float>(device, images),
                          nn::PinnedBuffer<int32_t>(device, labels),
                          nn::Buffer<float>(device, images), nn::Buffer<int32_t>(device, labels)});
  }
}

void InputStager::stage(int slot, const float* images, const int32_t* labels, int n) {
  DT_ENFORCE(slot >= 0 && slot < kSlots && n > 0 && n <= batch_, "stage slot {} with {} examples",
             slot, n);
  Slot& s = slots_[static_cast<size_t>(slot)];
  // The copy stream runs uploads in order; this slot's last one was two stages ago.
  device_.wait_upload_sources();
  size_t floats = example_floats_ * static_cast<size_t>(n);
  std::copy(images, images + floats, s.pinned_images.data());
  size_t label_count = example_labels_ * static_cast<size_t>(n);
  std::copy(labels, labels + label_count, s.pinned_labels.data());
  device_.upload_async(s.images.data(), s.pinned_images.data(), floats * sizeof(float));
  device_.upload_async(s.labels.data(), s.pinned_labels.data(), sizeof(int32_t) * label_count);
}

}  // namespace dtrain::train
