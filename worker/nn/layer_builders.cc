// See layer_builders.h. A new kind adds its make_<type> (defined in worker/nn/layers/<type>.cc) to
// the declarations below and one line to kBuilders.
#include "worker/nn/layer_builders.h"

#include "common/errors.h"

namespace dtrain::nn {

namespace layers {

/// A kind's builder, defined in worker/nn/layers/<type>.cc: the Layer of a config of its kind
/// (which it static_casts to the kind's config class) for inputs of these sizes.
using Builder = std::unique_ptr<Layer>(const LayerConfig& config, const std::vector<Dims>& in,
                                       const LayerContext& c);
// Each kind's, declared through the function type: "Builder make_dense" declares
// std::unique_ptr<Layer> make_dense(const LayerConfig&, ...).
Builder make_conv2d, make_max_pooling2d, make_flatten, make_dense, make_dropout, make_relu,
    make_add, make_concatenate, make_activation, make_batch_normalization,
    make_global_average_pooling2d, make_zero_padding2d, make_random_crop, make_random_flip,
    make_average_pooling2d, make_rescaling, make_reshape, make_random_translation, make_embedding,
    make_layer_normalization, make_multi_head_attention, make_position_embedding,
    make_token_and_position_embedding;

}  // namespace layers

namespace {

struct BuilderEntry {
  const char* type;  ///< the job file's "type", as in the spec registry
  layers::Builder* make;
};

constexpr BuilderEntry kBuilders[] = {
    {"conv2d", layers::make_conv2d},
    {"max_pooling2d", layers::make_max_pooling2d},
    {"flatten", layers::make_flatten},
    {"dense", layers::make_dense},
    {"dropout", layers::make_dropout},
    {"relu", layers::make_relu},
    {"add", layers::make_add},
    {"concatenate", layers::make_concatenate},
    {"activation", layers::make_activation},
    {"batch_normalization", layers::make_batch_normalization},
    {"global_average_pooling2d", layers::make_global_average_pooling2d},
    {"zero_padding2d", layers::make_zero_padding2d},
    {"random_crop", layers::make_random_crop},
    {"random_flip", layers::make_random_flip},
    {"average_pooling2d", layers::make_average_pooling2d},
    {"rescaling", layers::make_rescaling},
    {"reshape", layers::make_reshape},
    {"random_translation", layers::make_random_translation},
    {"embedding", layers::make_embedding},
    {"layer_normalization", layers::make_layer_normalization},
    {"multi_head_attention", layers::make_multi_head_attention},
    {"position_embedding", layers::make_position_embedding},
    {"token_and_position_embedding", layers::make_token_and_position_embedding},
};

const BuilderEntry* find_builder(std::string_view type) {
  for (const BuilderEntry& entry : kBuilders) {
    if (type == entry.type) return &entry;
  }
  return nullptr;
}

}  // namespace

std::unique_ptr<Layer> make_layer(const NodeSpec& node, const std::vector<Dims>& in,
                                  const LayerContext& c) {
  const BuilderEntry* entry = find_builder(node.type);
  DT_ENFORCE(entry, "layer type \"{}\" ({}) has no builder in layer_builders.cc", node.type,
             node.path);
  return entry->make(*node.config, in, c);
}

bool has_layer_builder(std::string_view type) {
  return find_builder(type) != nullptr;
}

}  // namespace dtrain::nn
