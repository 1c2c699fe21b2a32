// Keras 3 model files written by hand, as keras-team/keras writes them (model.to_json(), a
// .keras archive's config.json): each class's get_config keys in its order, the envelope
// serialization_lib gives every object, Sequential's and Functional's configs, KerasTensors in
// inbound_nodes; json.dumps's spacing. A layer is an ordered object the tests may change before
// the model is written. Also a .keras zip as saving_lib writes it (stored members). Test-only.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::testing::keras {

/// A JSON object with its keys in order (as Python's dicts keep them); values are JSON text.
struct Obj {
  std::vector<std::pair<std::string, std::string>> members;
  /// Replaces key's value, or appends the key.
  Obj& set(const std::string& key, const std::string& json);
  Obj& erase(const std::string& key);
  std::string str() const;
};

inline const char* kPolicy =
    R"({"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, )"
    R"("registered_name": null})";

/// One layer of a fixture: its class, config, and (for Functional) what it is called on.
struct Layer {
  std::string class_name;
  Obj config;
  std::string output_shape;         ///< its output's shape: "[null, 8, 8, 4]"
  bool build_config = true;         ///< false for classes built when made (pooling, ReLU, ...)
  std::vector<std::string> inputs;  ///< names of the layers it is called on (Functional)
  bool list_call = false;           ///< called on a list (Add): args [[t, t]]
  /// Layers whose outputs are the call's further positional arguments (MultiHeadAttention's
  /// value: args [query, value]), and the call's kwargs as JSON.
  std::vector<std::string> more_args;
  std::string kwargs = "{}";
  std::string dtype = "float32";  ///< its output's dtype (an int32 InputLayer's: token ids)
  std::string name() const;
};

/// Each class's layer with Keras's defaults but for the arguments, and its output's shape (out).
/// kernel and strides are Keras's standardized tuples ("[3, 3]"); activation "relu", "linear",
/// "softmax".
Layer input_layer(const std::string& name, const std::string& batch_shape);
Layer conv2d(const std::string& name, int filters, const std::string& kernel,
             const std::string& strides, const std::string& padding, const std::string& activation,
             const std::string& out);
Layer max_pooling2d(const std::string& name, const std::string& out);
Layer flatten(const std::string& name, const std::string& out);
Layer dense(const std::string& name, int units, const std::string& activation,
            const std::string& out);
Layer dropout(const std::string& name, const std::string& rate, const std::string& out);
Layer relu(const std::string& name, const std::string& out);
Layer add(const std::string& name, const std::string& out);
/// layer, called on these (Functional).
Layer batch_normalization(const std::string& name, const std::string& out);
Layer global_average_pooling2d(const std::string& name, const std::string& out);
Layer zero_padding2d(const std::string& name, int padding, const std::string& out);
Layer random_crop(const std::string& name, int height, int width, const std::string& out);
Layer random_flip(const std::string& name, const std::string& mode, const std::string& out);
/// AveragePooling2D with pool_size and strides as Keras's tuples ("[2, 2]"), padding "valid" or
/// "same"; Activation with a Keras activation's name.
Layer average_pooling2d(const std::string& name, const std::string& pool,
                        const std::string& strides, const std::string& padding,
                        const std::string& out);
Layer activation(const std::string& name, const std::string& activation, const std::string& out);
/// Rescaling (numbers as JSON), Reshape (target_shape "[4, 4, 1]"), RandomTranslation (factors
/// as JSON; Keras's other defaults).
Layer rescaling(const std::string& name, const std::string& scale, const std::string& offset,
                const std::string& out);
Layer reshape(const std::string& name, const std::string& target_shape, const std::string& out);
Layer random_translation(const std::string& name, const std::string& height_factor,
                         const std::string& width_factor, const std::string& out);
/// conv2d as above without a bias (use_bias false), as ResNets have before batch normalization.
Layer conv2d_no_bias(const std::string& name, int filters, const std::string& kernel,
                     const std::string& strides, const std::string& out);
Layer on(Layer layer, std::vector<std::string> inputs);

/// The sequence layers: an InputLayer of int32 token ids ([null, T]); keras_hub's
/// TokenAndPositionEmbedding (module keras_hub.src.layers.modeling..., registered_name
/// "keras_hub>TokenAndPositionEmbedding"); LayerNormalization on the last axis ([2]) without
/// beta, as GPTs have; MultiHeadAttention without biases as built (attention_axes [1]), to be
/// called as self-attention (self_attention); Dense without bias. out: "[null, 8, 16]".
Layer token_input(const std::string& name, int length);
Layer token_and_position_embedding(const std::string& name, int vocabulary, int length, int dim,
                                   const std::string& out);
Layer layer_normalization(const std::string& name, const std::string& out);
Layer multi_head_attention(const std::string& name, int heads, int key_dim, const std::string& out);
Layer dense_no_bias(const std::string& name, int units, const std::string& activation,
                    const std::string& out);
/// layer called on x as Keras's attention(x, x, use_causal_mask=True) writes it.
Layer self_attention(Layer layer, const std::string& x);
/// A KerasTensor of layer's output, as an inbound node holds it.
std::string tensor_of(const Layer& layer);
/// A miniature GPT on 8 token ids of 11: TokenAndPositionEmbedding (16), one block of
/// LayerNormalization, causal MultiHeadAttention (2 heads of 8), Add, LayerNormalization, Dense
/// (32, gelu), Dense (16), Add; LayerNormalization, Dense (11). Layer names: input_layer,
/// token_and_position_embedding, layer_normalization, multi_head_attention, add,
/// layer_normalization_1, dense, dense_1, add_1, layer_normalization_2, dense_2.
std::vector<Layer> gpt_layers();
std::string gpt_fixture();  ///< functional(gpt_layers())

/// The model file: Sequential's entries, each built on the one before; or Functional's, each
/// with its name and one inbound node calling it on its inputs (KerasTensors with their shapes).
/// input_layers and output_layers as JSON: "[\"input_layer\", 0, 0]".
std::string sequential(const std::vector<Layer>& layers);
std::string functional(const std::vector<Layer>& layers, const std::string& input_layers,
                       const std::string& output_layers);

/// InputLayer [null, 8, 8, 1], Conv2D (same, relu), MaxPooling2D, Conv2D (valid), ReLU, Dropout,
/// Flatten, Dense (relu), Dense (3, softmax): every class that takes one input.
std::vector<Layer> chain_layers();
/// A residual block on [null, 8, 8, 1]: a stem Conv2D, two Conv2Ds added to it, ReLU; a strided
/// block whose shortcut is a 1x1 Conv2D with strides 2 (a projection), Add, ReLU; MaxPooling2D,
/// Dropout, Flatten, Dense (3 units, linear).
std::vector<Layer> residual_layers();
std::string sequential_fixture();  ///< sequential(chain_layers())
std::string functional_fixture();  ///< functional(residual_layers()), single-tensor in and out
/// A ResNet block with augmentation in front: ZeroPadding2D, RandomCrop, RandomFlip, Conv2D
/// without bias, BatchNormalization, ReLU, then conv-BN added to it, ReLU,
/// GlobalAveragePooling2D, Dense; 8x8x1 in, 3 out.
std::vector<Layer> resnet_layers();
std::string resnet_fixture();  ///< functional(resnet_layers())

/// A zip archive of stored members, as Python's zipfile writes (a .keras file: metadata.json,
/// config.json, model.weights.h5).
std::string zip_archive(const std::vector<std::pair<std::string, std::string>>& members);
/// What keras.saving.save_model writes around config_json.
std::string keras_archive(const std::string& config_json);

}  // namespace dtrain::testing::keras
