// Input batches on their way to the model's device: each of kSlots slots has pinned host memory
// and device memory for one batch's images and labels. A batch is copied into a slot's pinned
// memory and uploaded on the device's copy stream, so the upload of step s + 1 overlaps with the
// compute of step s. Labels travel with their images. It does not produce batches (BatchStream
// does) and does not decide when the compute may read a slot (ready() does).
#pragma once

#include <cstdint>
#include <vector>

#include "worker/mem/device.h"

namespace dtrain::train {

class InputStager {
 public:
  static constexpr int kSlots = 2;
  /// Room for batches of up to batch examples of example_floats floats and example_labels labels
  /// each (a sequence's positions; 1 for a classifier).
  InputStager(nn::Device& device, size_t example_floats, int batch, int example_labels = 1);

  /// Copies n examples into slot's pinned memory and enqueues their upload on the copy stream,
  /// after the compute work enqueued so far. Call it for step s + 1 BEFORE enqueueing step s's
  /// compute, so the upload waits only for step s - 1, which last read this slot. Blocks only
  /// until this slot's previous upload has read its pinned memory.
  void stage(int slot, const float* images, const int32_t* labels, int n);
  /// Makes the compute stream's next work wait for every staged upload.
  void ready() { device_.wait_uploads(); }

  const float* images(int slot) const { return slots_[static_cast<size_t>(slot)].images.data(); }
  const int32_t* labels(int slot) const { return slots_[static_cast<size_t>(slot)].labels.data(); }

 private:
  struct Slot {
    nn::PinnedBuffer<float> pinned_images;
    nn::PinnedBuffer<int32_t> pinned_labels;
    nn::Buffer<float> images;
    nn::Buffer<int32_t> labels;
  };
  nn::Device& device_;
  size_t example_floats_;
  int batch_;
  size_t example_labels_;
  std::vector<Slot> slots_;
};

}  // namespace dtrain::train
