// What a layer of a model is before it is built (docs/design.md#the-model-as-a-graph): an
// example's size (Dims), Keras's activations, a layer's work for the benchmarks' bounds
// (LayerCost), and a layer's parsed keys (LayerConfig), which know the shapes but no memory. The
// built layer (worker/nn/layer.h's Layer) and everything that runs belong to the worker's runtime.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "worker/spec/shapes.h"

namespace dtrain::nn {

/// Size of one example's activation: channels x height x width (dense: units x 1 x 1). A
/// sequence (docs/design.md#sequences) is h positions of w features each, Keras's (T, D), stored
/// row-major (position by position), with c 1: a language model's token ids are h positions of
/// 1 (the id, a float), its embeddings and logits h positions of D and V.
struct Dims {
  int c = 1, h = 1, w = 1;
  bool sequence = false;
  size_t size() const { return static_cast<size_t>(c) * h * w; }
  bool flat() const { return !sequence && h == 1 && w == 1; }
  /// Rows of a per-position operation over n examples (a dense layer on a sequence, the loss):
  /// n x positions.
  int positions() const { return sequence ? h : 1; }
  bool operator==(const Dims& o) const {
    return c == o.c && h == o.h && w == o.w && sequence == o.sequence;
  }
  bool operator!=(const Dims& o) const { return !(*this == o); }
};

/// Keras's activations dtrain computes: the last four through Backend::eltwise_* (eltwise_of).
enum class Activation { kLinear, kRelu, kSoftmax, kSigmoid, kTanh, kGelu, kSwish };

/// The work of one layer, per example, for benchmarks' bounds (bench/): multiply-adds of its
/// forward pass, and its products' shapes.
struct LayerCost {
  double macs = 0;    ///< forward multiply-adds per example
  int matmul_in = 0;  ///< a dense layer's in x out (0: none)
  int matmul_out = 0;
  int matmul_rows = 1;  ///< its product's rows per example (a sequence's positions)
  /// More products of the same kind (attention's four projections), each {in, out, rows}.
  std::vector<std::array<int, 3>> more_matmuls;
  /// An attention's scores and weighted sum, for one example (n = 1; heads 0: none).
  AttentionShape attention{1, 1, 0, 1, 1, false, 1};
  size_t conv_output = 0;  ///< a convolution's output elements per example (0: none)
  ConvShape conv;          ///< a convolution's shape for one example (n = 1), when conv_output
};

/// One layer's keys, parsed and checked: knows its kind's shape rules, not how to run it (a kind's
/// builder in worker/nn/layer_builders.cc makes its Layer from it). No memory, no backend; shared
/// by a ModelSpec's copies.
class LayerConfig {
 public:
  virtual ~LayerConfig() = default;
  /// How many inputs it takes: 1, or 0 for two or more (add, concatenate).
  virtual int arity() const { return 1; }
  /// The output size for these input sizes; ConfigError "<where>: ..." when they do not fit (a
  /// kernel larger than its input, adding different shapes).
  virtual Dims output_dims(const std::vector<Dims>& in, const std::string& where) const = 0;
  /// The activation applied last (a softmax output means probabilities, for the loss's check).
  virtual Activation activation() const { return Activation::kLinear; }
  /// True when its forward draws randomness per step in training (dropout, augmentation).
  virtual bool draws_randomness() const { return false; }
  /// True when its training forward takes statistics over every worker's batch (a GroupSum:
  /// synchronized batch normalization), so each worker must run its forward and backward in step
  /// with the others: a member holding several virtual shards cannot.
  virtual bool sums_over_group() const { return false; }
  /// False where these keys need operations whose parity has not passed on a GPU, in a kind
  /// whose others have (a new activation or padding): the model refuses a GPU job with it.
  virtual bool gpu_tested() const { return true; }
  virtual LayerCost cost(const std::vector<Dims>& /*in*/) const { return {}; }
};

}  // namespace dtrain::nn
