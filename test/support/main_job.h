// The main job's "train" object (the tutorial CNN on Fashion-MNIST, SGD with momentum, batch 64
// per worker), as job-file text for tests that launch it on other hosts or under Slurm with
// fewer steps. Text only; the tests write the rest of the job file.
#pragma once

#include <string>

namespace dtrain::testing {

/// `"train": {...}` with the given epochs and steps per epoch, validation on.
inline std::string main_job_train(int epochs, int steps_per_epoch) {
  return R"("train": {
  "model": {"input_shape": [28, 28, 1], "layers": [
    {"type": "conv2d", "filters": 32, "kernel_size": 3, "activation": "relu"},
    {"type": "flatten"},
    {"type": "dense", "units": 128, "activation": "relu"},
    {"type": "dense", "units": 10}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": {"type": "sgd", "learning_rate": 0.01, "momentum": 0.9},
  "data": {"source": "idx", "dir": "/usr/share/datasets/fashion-mnist"},
  "per_worker_batch_size": 64, "epochs": )" +
         std::to_string(epochs) + R"(, "steps_per_epoch": )" + std::to_string(steps_per_epoch) +
         R"(, "validation": true, "seed": 42})";
}

}  // namespace dtrain::testing
