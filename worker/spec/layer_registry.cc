// See layer_registry.h. A new kind adds one line to kKinds and the include of its header, which
// declares its parse and keras_keys functions (worker/spec/layers/<type>.h).
#include "worker/spec/layer_registry.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "worker/spec/layers/activation.h"
#include "worker/spec/layers/add.h"
#include "worker/spec/layers/average_pooling2d.h"
#include "worker/spec/layers/batch_normalization.h"
#include "worker/spec/layers/concatenate.h"
#include "worker/spec/layers/conv2d.h"
#include "worker/spec/layers/dense.h"
#include "worker/spec/layers/dropout.h"
#include "worker/spec/layers/embedding.h"
#include "worker/spec/layers/flatten.h"
#include "worker/spec/layers/global_average_pooling2d.h"
#include "worker/spec/layers/layer_normalization.h"
#include "worker/spec/layers/max_pooling2d.h"
#include "worker/spec/layers/multi_head_attention.h"
#include "worker/spec/layers/position_embedding.h"
#include "worker/spec/layers/random_crop.h"
#include "worker/spec/layers/random_flip.h"
#include "worker/spec/layers/random_translation.h"
#include "worker/spec/layers/relu.h"
#include "worker/spec/layers/rescaling.h"
#include "worker/spec/layers/reshape.h"
#include "worker/spec/layers/token_and_position_embedding.h"
#include "worker/spec/layers/zero_padding2d.h"

namespace dtrain::nn {

namespace {

constexpr LayerKind kKinds[] = {
    {"conv2d", "Conv2D", layers::parse_conv2d, layers::keras_keys_conv2d, true},
    {"max_pooling2d", "MaxPooling2D", layers::parse_max_pooling2d, layers::keras_keys_max_pooling2d,
     true},
    {"flatten", "Flatten", layers::parse_flatten, layers::keras_keys_flatten, true},
    {"dense", "Dense", layers::parse_dense, layers::keras_keys_dense, true},
    {"dropout", "Dropout", layers::parse_dropout, layers::keras_keys_dropout, true},
    {"relu", "ReLU", layers::parse_relu, layers::keras_keys_relu, true},
    {"add", "Add", layers::parse_add, layers::keras_keys_add, false},
    {"concatenate", "Concatenate", layers::parse_concatenate, layers::keras_keys_concatenate,
     false},
    {"activation", "Activation", layers::parse_activation_layer, layers::keras_keys_activation,
     false},
    {"batch_normalization", "BatchNormalization", layers::parse_batch_normalization,
     layers::keras_keys_batch_normalization, false},
    {"global_average_pooling2d", "GlobalAveragePooling2D", layers::parse_global_average_pooling2d,
     layers::keras_keys_global_average_pooling2d, false},
    {"zero_padding2d", "ZeroPadding2D", layers::parse_zero_padding2d,
     layers::keras_keys_zero_padding2d, false},
    {"random_crop", "RandomCrop", layers::parse_random_crop, layers::keras_keys_random_crop, false},
    {"random_flip", "RandomFlip", layers::parse_random_flip, layers::keras_keys_random_flip, false},
    {"average_pooling2d", "AveragePooling2D", layers::parse_average_pooling2d,
     layers::keras_keys_average_pooling2d, false},
    {"rescaling", "Rescaling", layers::parse_rescaling, layers::keras_keys_rescaling, false},
    {"reshape", "Reshape", layers::parse_reshape, layers::keras_keys_reshape, false},
    {"random_translation", "RandomTranslation", layers::parse_random_translation,
     layers::keras_keys_random_translation, false},
    {"embedding", "Embedding", layers::parse_embedding, layers::keras_keys_embedding, false},
    {"layer_normalization", "LayerNormalization", layers::parse_layer_normalization,
     layers::keras_keys_layer_normalization, false},
    {"multi_head_attention", "MultiHeadAttention", layers::parse_multi_head_attention,
     layers::keras_keys_multi_head_attention, false, "keras",
     layers::keras_call_multi_head_attention},
    {"position_embedding", "PositionEmbedding", layers::parse_position_embedding,
     layers::keras_keys_position_embedding, false, "keras_hub"},
    {"token_and_position_embedding", "TokenAndPositionEmbedding",
     layers::parse_token_and_position_embedding, layers::keras_keys_token_and_position_embedding,
     false, "keras_hub"},
};

}  // namespace

const LayerKind* find_layer_kind(std::string_view type) {
  for (const LayerKind& kind : kKinds) {
    if (type == kind.type) return &kind;
  }
  return nullptr;
}

std::string closest_layer_type(std::string_view typo) {
  // Levenshtein distance, two rows.
  auto distance = [](std::string_view a, std::string_view b) {
    std::vector<size_t> row(b.size() + 1), next(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      next[0] = i;
      for (size_t j = 1; j <= b.size(); ++j)
        next[j] = std::min({row[j] + 1, next[j - 1] + 1, row[j - 1] + (a[i - 1] != b[j - 1])});
      row.swap(next);
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_distance = 3;  // a typo: at most two edits
  for (const LayerKind& kind : kKinds) {
    size_t d = distance(typo, kind.type);
    if (d < best_distance) best = kind.type, best_distance = d;
  }
  return best;
}

const LayerKind* find_keras_class(std::string_view keras_class) {
  for (const LayerKind& kind : kKinds) {
    if (keras_class == kind.keras_class) return &kind;
  }
  return nullptr;
}

std::string keras_class_list() {
  std::string list;
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    if (i > 0) list += i + 1 == std::size(kKinds) ? " and " : ", ";
    list += kKinds[i].keras_class;
  }
  return list;
}

std::vector<const LayerKind*> layer_kinds() {
  std::vector<const LayerKind*> kinds;
  for (const LayerKind& kind : kKinds) kinds.push_back(&kind);
  return kinds;
}

std::string layer_type_list() {
  std::string list;
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    if (i > 0) list += i + 1 == std::size(kKinds) ? " or " : ", ";
    list += kKinds[i].type;
  }
  return list;
}

}  // namespace dtrain::nn
