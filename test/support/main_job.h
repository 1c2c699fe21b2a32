// The main job's "train" object (the tutorial CNN on Fashion-MNIST, SGD with momentum, batch 64
// per worker), as job-file text for tests that launch it on other hosts or under Slurm with
// fewer steps; and a small residual network's, the ResNet job's kinds of layer and optimizer in
// little. Text only; the tests write the rest of the job file.
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

/// `"train": {...}` of a small ResNet (configs/resnet-fashion-mnist.json's layers and optimizer
/// in little: a random flip, batch normalization, an identity and a projection shortcut, global
/// average pooling; nesterov SGD with weight decay and a warm-up), validation on.
inline std::string resnet_job_train(int epochs, int steps_per_epoch) {
  return R"("train": {
  "model": {"input_shape": [28, 28, 1], "layers": [
    {"name": "flip", "type": "random_flip", "mode": "horizontal"},
    {"name": "stem", "type": "conv2d", "filters": 8, "kernel_size": 3, "padding": "same",
     "use_bias": false, "kernel_initializer": "he_normal"},
    {"name": "stem_bn", "type": "batch_normalization"},
    {"name": "stem_relu", "type": "relu"},
    {"name": "b1_conv1", "type": "conv2d", "filters": 8, "kernel_size": 3, "padding": "same",
     "use_bias": false},
    {"name": "b1_bn1", "type": "batch_normalization"},
    {"name": "b1_relu1", "type": "relu"},
    {"name": "b1_conv2", "type": "conv2d", "filters": 8, "kernel_size": 3, "padding": "same",
     "use_bias": false},
    {"name": "b1_bn2", "type": "batch_normalization", "momentum": 0.9},
    {"name": "b1_add", "type": "add", "inputs": ["stem_relu", "b1_bn2"]},
    {"name": "b1_out", "type": "relu"},
    {"name": "b2_conv", "type": "conv2d", "filters": 16, "kernel_size": 3, "strides": 2,
     "padding": "same", "use_bias": false},
    {"name": "b2_bn", "type": "batch_normalization"},
    {"name": "b2_proj", "type": "conv2d", "filters": 16, "kernel_size": 1, "strides": 2,
     "use_bias": false, "inputs": ["b1_out"]},
    {"name": "b2_add", "type": "add", "inputs": ["b2_proj", "b2_bn"]},
    {"name": "b2_out", "type": "relu"},
    {"name": "pool", "type": "global_average_pooling2d"},
    {"name": "logits", "type": "dense", "units": 10}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": {"type": "sgd", "momentum": 0.9, "nesterov": true, "weight_decay": 0.0005,
    "learning_rate": {"type": "cosine_decay", "initial_learning_rate": 0.0,
                      "warmup_target": 0.05, "warmup_steps": 10}},
  "data": {"source": "idx", "dir": "/usr/share/datasets/fashion-mnist"},
  "per_worker_batch_size": 64, "epochs": )" +
         std::to_string(epochs) + R"(, "steps_per_epoch": )" + std::to_string(steps_per_epoch) +
         R"(, "validation": true, "seed": 42})";
}

}  // namespace dtrain::testing
