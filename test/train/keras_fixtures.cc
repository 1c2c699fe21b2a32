// See keras_fixtures.h. Keras's side: keras/src/layers/layer.py (name, trainable, dtype first),
// each class's get_config, keras/src/models/sequential.py and functional.py, and
// keras/src/saving/serialization_lib.py; the zip as Python's zipfile writes stored members.
#include "test/train/keras_fixtures.h"

#include <map>
#include <stdexcept>

namespace dtrain::testing::keras {
namespace {

const char* kGlorot =
    R"({"module": "keras.initializers", "class_name": "GlorotUniform", "config": {"seed": null, )"
    R"("input_axes": null, "output_axes": null}, "registered_name": null})";
const char* kZeros = R"({"module": "keras.initializers", "class_name": "Zeros", "config": {}, )"
                     R"("registered_name": null})";

std::string quoted(const std::string& text) {
  return "\"" + text + "\"";
}

Obj base(const std::string& name) {
  Obj o;
  o.set("name", quoted(name)).set("trainable", "true").set("dtype", kPolicy);
  return o;
}

Layer make(const char* class_name, Obj config, const std::string& out, bool build_config) {
  Layer l;
  l.class_name = class_name;
  l.config = std::move(config);
  l.output_shape = out;
  l.build_config = build_config;
  return l;
}

std::string envelope(const Layer& l, const std::string& build_input) {
  const bool hub = l.class_name == "TokenAndPositionEmbedding";
  std::string text = hub ? R"({"module": "keras_hub.src.layers.modeling.)"
                           R"(token_and_position_embedding", "class_name": ")" +
                               l.class_name + R"(", "config": )" + l.config.str() +
                               R"(, "registered_name": "keras_hub>)" + l.class_name + "\""
                         : R"({"module": "keras.layers", "class_name": ")" + l.class_name +
                               R"(", "config": )" + l.config.str() + R"(, "registered_name": null)";
  if (l.build_config && l.class_name == "MultiHeadAttention") {
    text += R"(, "build_config": {"shapes_dict": {"query_shape": )" + build_input +
            R"(, "value_shape": )" + build_input + "}}";
  } else if (l.build_config) {
    text += R"(, "build_config": {"input_shape": )" + build_input + "}";
  }
  return text;
}

std::string tensor(const Layer& from) {
  return R"({"class_name": "__keras_tensor__", "config": {"shape": )" + from.output_shape +
         R"(, "dtype": ")" + from.dtype + R"(", "keras_history": [")" + from.name() +
         R"(", 0, 0]}})";
}

void put(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint32_t crc32_of(const std::string& data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

}  // namespace

Obj& Obj::set(const std::string& key, const std::string& json) {
  for (auto& [k, v] : members) {
    if (k == key) {
      v = json;
      return *this;
    }
  }
  members.emplace_back(key, json);
  return *this;
}

Obj& Obj::erase(const std::string& key) {
  for (auto it = members.begin(); it != members.end(); ++it) {
    if (it->first == key) {
      members.erase(it);
      break;
    }
  }
  return *this;
}

std::string Obj::str() const {
  std::string text = "{";
  for (const auto& [k, v] : members) text += (text.size() > 1 ? ", " : "") + quoted(k) + ": " + v;
  return text + "}";
}

std::string Layer::name() const {
  for (const auto& [k, v] : config.members) {
    if (k == "name") return v.substr(1, v.size() - 2);
  }
  throw std::logic_error("a fixture layer without a name");
}

Layer input_layer(const std::string& name, const std::string& batch_shape) {
  Obj c;
  c.set("batch_shape", batch_shape).set("dtype", R"("float32")").set("sparse", "false");
  c.set("ragged", "false").set("name", quoted(name)).set("optional", "false");
  return make("InputLayer", c, batch_shape, false);
}

Layer conv2d(const std::string& name, int filters, const std::string& kernel,
             const std::string& strides, const std::string& padding, const std::string& activation,
             const std::string& out) {
  Obj c = base(name);
  c.set("filters", std::to_string(filters)).set("kernel_size", kernel).set("strides", strides);
  c.set("padding", quoted(padding)).set("data_format", R"("channels_last")");
  c.set("dilation_rate", "[1, 1]").set("groups", "1").set("activation", quoted(activation));
  c.set("use_bias", "true").set("kernel_initializer", kGlorot).set("bias_initializer", kZeros);
  c.set("kernel_regularizer", "null").set("bias_regularizer", "null");
  c.set("activity_regularizer", "null").set("kernel_constraint", "null");
  c.set("bias_constraint", "null");
  return make("Conv2D", c, out, true);
}

Layer max_pooling2d(const std::string& name, const std::string& out) {
  Obj c = base(name);
  c.set("pool_size", "[2, 2]").set("padding", R"("valid")").set("strides", "[2, 2]");
  c.set("data_format", R"("channels_last")");
  return make("MaxPooling2D", c, out, false);
}

Layer flatten(const std::string& name, const std::string& out) {
  Obj c = base(name);
  c.set("data_format", R"("channels_last")");
  return make("Flatten", c, out, true);
}

Layer dense(const std::string& name, int units, const std::string& activation,
            const std::string& out) {
  Obj c = base(name);
  c.set("units", std::to_string(units)).set("activation", quoted(activation));
  c.set("use_bias", "true").set("kernel_initializer", kGlorot).set("bias_initializer", kZeros);
  c.set("kernel_regularizer", "null").set("bias_regularizer", "null");
  c.set("kernel_constraint", "null").set("bias_constraint", "null");
  c.set("quantization_config", "null");
  return make("Dense", c, out, true);
}

Layer dropout(const std::string& name, const std::string& rate, const std::string& out) {
  Obj c = base(name);
  c.set("rate", rate).set("seed", "null").set("noise_shape", "null");
  return make("Dropout", c, out, false);
}

Layer relu(const std::string& name, const std::string& out) {
  Obj c = base(name);
  c.set("max_value", "null").set("negative_slope", "0.0").set("threshold", "0.0");
  return make("ReLU", c, out, false);
}

Layer add(const std::string& name, const std::string& out) {
  Layer l = make("Add", base(name), out, true);
  l.list_call = true;
  return l;
}

Layer batch_normalization(const std::string& name, const std::string& out) {
  Obj c = base(name);
  c.set("axis", "-1").set("momentum", "0.99").set("epsilon", "0.001").set("center", "true");
  c.set("scale", "true").set("beta_initializer", kZeros);
  c.set("gamma_initializer", R"({"module": "keras.initializers", "class_name": "Ones", )"
                             R"("config": {}, "registered_name": null})");
  c.set("moving_mean_initializer", kZeros);
  c.set("moving_variance_initializer",
        R"({"module": "keras.initializers", "class_name": "Ones", "config": {}, )"
        R"("registered_name": null})");
  c.set("beta_regularizer", "null").set("gamma_regularizer", "null");
  c.set("beta_constraint", "null").set("gamma_constraint", "null");
  c.set("synchronized", "false").set("renorm", "false").set("renorm_clipping", "null");
  c.set("renorm_momentum", "0.99");
  return make("BatchNormalization", c, out, true);
}

Layer global_average_pooling2d(const std::string& name, const std::string& out) {
  Obj c = base(name);
  c.set("data_format", R"("channels_last")").set("keepdims", "false");
  return make("GlobalAveragePooling2D", c, out, false);
}

Layer zero_padding2d(const std::string& name, int padding, const std::string& out) {
  Obj c = base(name);
  const std::string p = std::to_string(padding);
  c.set("padding", "[[" + p + ", " + p + "], [" + p + ", " + p + "]]");
  c.set("data_format", R"("channels_last")");
  return make("ZeroPadding2D", c, out, false);
}

Layer random_crop(const std::string& name, int height, int width, const std::string& out) {
  Obj c = base(name);
  c.set("data_format", R"("channels_last")").set("height", std::to_string(height));
  c.set("width", std::to_string(width)).set("seed", "null");
  return make("RandomCrop", c, out, false);
}

Layer random_flip(const std::string& name, const std::string& mode, const std::string& out) {
  Obj c = base(name);
  c.set("data_format", R"("channels_last")").set("seed", "null").set("mode", quoted(mode));
  return make("RandomFlip", c, out, false);
}

Layer average_pooling2d(const std::string& name, const std::string& pool,
                        const std::string& strides, const std::string& padding,
                        const std::string& out) {
  Obj c = base(name);
  c.set("pool_size", pool).set("padding", quoted(padding)).set("strides", strides);
  c.set("data_format", R"("channels_last")");
  return make("AveragePooling2D", c, out, false);
}

Layer activation(const std::string& name, const std::string& activation, const std::string& out) {
  Obj c = base(name);
  c.set("activation", quoted(activation));
  return make("Activation", c, out, false);
}

Layer rescaling(const std::string& name, const std::string& scale, const std::string& offset,
                const std::string& out) {
  Obj c = base(name);
  c.set("scale", scale).set("offset", offset);
  return make("Rescaling", c, out, false);
}

Layer reshape(const std::string& name, const std::string& target_shape, const std::string& out) {
  Obj c = base(name);
  c.set("target_shape", target_shape);
  return make("Reshape", c, out, false);
}

Layer random_translation(const std::string& name, const std::string& height_factor,
                         const std::string& width_factor, const std::string& out) {
  Obj c = base(name);
  c.set("height_factor", height_factor).set("width_factor", width_factor);
  c.set("fill_mode", R"("reflect")").set("interpolation", R"("bilinear")").set("seed", "null");
  c.set("fill_value", "0.0").set("data_format", R"("channels_last")");
  return make("RandomTranslation", c, out, false);
}

Layer conv2d_no_bias(const std::string& name, int filters, const std::string& kernel,
                     const std::string& strides, const std::string& out) {
  Layer l = conv2d(name, filters, kernel, strides, "same", "linear", out);
  l.config.set("use_bias", "false");
  return l;
}

Layer on(Layer layer, std::vector<std::string> inputs) {
  layer.inputs = std::move(inputs);
  return layer;
}

std::string sequential(const std::vector<Layer>& layers) {
  std::string entries, input = layers.front().output_shape;
  for (size_t i = 0; i < layers.size(); ++i) {
    entries += (i ? ", " : "") + envelope(layers[i], i ? layers[i - 1].output_shape : "") + "}";
  }
  return R"({"module": "keras", "class_name": "Sequential", "config": {"name": "sequential", )"
         R"("trainable": true, "dtype": )" +
         std::string(kPolicy) + R"(, "layers": [)" + entries + R"(], "build_input_shape": )" +
         input + R"(}, "registered_name": null, "build_config": {"input_shape": )" + input + "}}";
}

std::string functional(const std::vector<Layer>& layers, const std::string& input_layers,
                       const std::string& output_layers) {
  std::map<std::string, const Layer*> by_name;
  for (const Layer& l : layers) by_name[l.name()] = &l;
  std::string entries;
  for (const Layer& l : layers) {
    std::string shapes, tensors;
    for (const std::string& input : l.inputs) {
      const Layer& from = *by_name.at(input);
      shapes += (shapes.empty() ? "" : ", ") + from.output_shape;
      tensors += (tensors.empty() ? "" : ", ") + tensor(from);
    }
    if (l.list_call) shapes = "[" + shapes + "]", tensors = "[" + tensors + "]";
    for (const std::string& arg : l.more_args) tensors += ", " + tensor(*by_name.at(arg));
    std::string nodes =
        l.inputs.empty() ? "[]" : R"([{"args": [)" + tensors + R"(], "kwargs": )" + l.kwargs + "}]";
    entries += (entries.empty() ? "" : ", ") + envelope(l, shapes) + R"(, "name": ")" + l.name() +
               R"(", "inbound_nodes": )" + nodes + "}";
  }
  return R"({"module": "keras.src.models.functional", "class_name": "Functional", "config": )"
         R"({"name": "functional", "trainable": true, "layers": [)" +
         entries + R"(], "input_layers": )" + input_layers + R"(, "output_layers": )" +
         output_layers +
         R"(}, "registered_name": "Functional", "build_config": {"input_shape": null}})";
}

Layer token_input(const std::string& name, int length) {
  Layer l = input_layer(name, "[null, " + std::to_string(length) + "]");
  l.config.set("dtype", R"("int32")");
  l.dtype = "int32";
  return l;
}

Layer token_and_position_embedding(const std::string& name, int vocabulary, int length, int dim,
                                   const std::string& out) {
  Obj c = base(name);
  c.set("vocabulary_size", std::to_string(vocabulary));
  c.set("sequence_length", std::to_string(length)).set("embedding_dim", std::to_string(dim));
  c.set("embeddings_initializer",
        R"({"module": "keras.initializers", "class_name": "RandomUniform", "config": )"
        R"({"seed": null, "minval": -0.05, "maxval": 0.05}, "registered_name": null})");
  c.set("tie_weights", "true").set("mask_zero", "false");
  return make("TokenAndPositionEmbedding", c, out, true);
}

Layer layer_normalization(const std::string& name, const std::string& out) {
  Obj c = base(name);
  c.set("axis", "[2]").set("epsilon", "0.001").set("center", "false").set("scale", "true");
  c.set("rms_scaling", "false").set("beta_initializer", kZeros);
  c.set("gamma_initializer", R"({"module": "keras.initializers", "class_name": "Ones", )"
                             R"("config": {}, "registered_name": null})");
  c.set("beta_regularizer", "null").set("gamma_regularizer", "null");
  c.set("beta_constraint", "null").set("gamma_constraint", "null");
  return make("LayerNormalization", c, out, true);
}

Layer multi_head_attention(const std::string& name, int heads, int key_dim,
                           const std::string& out) {
  Obj c = base(name);
  c.set("num_heads", std::to_string(heads)).set("key_dim", std::to_string(key_dim));
  c.set("value_dim", std::to_string(key_dim)).set("dropout", "0.0").set("use_bias", "false");
  c.set("use_gate", "false").set("output_shape", "null").set("attention_axes", "[1]");
  c.set("sliding_window", "null").set("kernel_initializer", kGlorot);
  c.set("bias_initializer", kZeros).set("kernel_regularizer", "null");
  c.set("bias_regularizer", "null").set("activity_regularizer", "null");
  c.set("kernel_constraint", "null").set("bias_constraint", "null").set("seed", "null");
  return make("MultiHeadAttention", c, out, true);
}

Layer dense_no_bias(const std::string& name, int units, const std::string& activation,
                    const std::string& out) {
  Layer l = dense(name, units, activation, out);
  l.config.set("use_bias", "false");
  return l;
}

Layer self_attention(Layer layer, const std::string& x) {
  layer.inputs = {x};
  layer.more_args = {x};
  layer.kwargs = R"({"use_causal_mask": true})";
  return layer;
}

std::string tensor_of(const Layer& layer) {
  return tensor(layer);
}

std::vector<Layer> gpt_layers() {
  const std::string seq = "[null, 8, 16]";
  return {token_input("input_layer", 8),
          on(token_and_position_embedding("token_and_position_embedding", 11, 8, 16, seq),
             {"input_layer"}),
          on(layer_normalization("layer_normalization", seq), {"token_and_position_embedding"}),
          self_attention(multi_head_attention("multi_head_attention", 2, 8, seq),
                         "layer_normalization"),
          on(add("add", seq), {"token_and_position_embedding", "multi_head_attention"}),
          on(layer_normalization("layer_normalization_1", seq), {"add"}),
          on(dense_no_bias("dense", 32, "gelu", "[null, 8, 32]"), {"layer_normalization_1"}),
          on(dense_no_bias("dense_1", 16, "linear", seq), {"dense"}),
          on(add("add_1", seq), {"add", "dense_1"}),
          on(layer_normalization("layer_normalization_2", seq), {"add_1"}),
          on(dense_no_bias("dense_2", 11, "linear", "[null, 8, 11]"), {"layer_normalization_2"})};
}

std::string gpt_fixture() {
  return functional(gpt_layers(), R"(["input_layer", 0, 0])", R"(["dense_2", 0, 0])");
}

std::vector<Layer> chain_layers() {
  return {input_layer("input_layer", "[null, 8, 8, 1]"),
          conv2d("conv2d", 4, "[3, 3]", "[1, 1]", "same", "relu", "[null, 8, 8, 4]"),
          max_pooling2d("max_pooling2d", "[null, 4, 4, 4]"),
          conv2d("conv2d_1", 6, "[3, 3]", "[1, 1]", "valid", "linear", "[null, 2, 2, 6]"),
          relu("re_lu", "[null, 2, 2, 6]"),
          dropout("dropout", "0.25", "[null, 2, 2, 6]"),
          flatten("flatten", "[null, 24]"),
          dense("dense", 16, "relu", "[null, 16]"),
          dense("dense_1", 3, "softmax", "[null, 3]")};
}

std::vector<Layer> residual_layers() {
  const std::string wide = "[null, 8, 8, 4]", narrow = "[null, 4, 4, 8]";
  return {input_layer("input_layer", "[null, 8, 8, 1]"),
          on(conv2d("conv2d", 4, "[3, 3]", "[1, 1]", "same", "relu", wide), {"input_layer"}),
          on(conv2d("conv2d_1", 4, "[3, 3]", "[1, 1]", "same", "relu", wide), {"conv2d"}),
          on(conv2d("conv2d_2", 4, "[3, 3]", "[1, 1]", "same", "linear", wide), {"conv2d_1"}),
          on(add("add", wide), {"conv2d", "conv2d_2"}),
          on(relu("re_lu", wide), {"add"}),
          on(conv2d("conv2d_3", 8, "[3, 3]", "[2, 2]", "same", "relu", narrow), {"re_lu"}),
          on(conv2d("conv2d_4", 8, "[3, 3]", "[1, 1]", "same", "linear", narrow), {"conv2d_3"}),
          on(conv2d("conv2d_5", 8, "[1, 1]", "[2, 2]", "valid", "linear", narrow), {"re_lu"}),
          on(add("add_1", narrow), {"conv2d_4", "conv2d_5"}),
          on(relu("re_lu_1", narrow), {"add_1"}),
          on(max_pooling2d("max_pooling2d", "[null, 2, 2, 8]"), {"re_lu_1"}),
          on(dropout("dropout", "0.25", "[null, 2, 2, 8]"), {"max_pooling2d"}),
          on(flatten("flatten", "[null, 32]"), {"dropout"}),
          on(dense("dense", 3, "linear", "[null, 3]"), {"flatten"})};
}

std::vector<Layer> resnet_layers() {
  const std::string image = "[null, 8, 8, 1]", wide = "[null, 8, 8, 4]";
  return {input_layer("input_layer", image),
          on(zero_padding2d("zero_padding2d", 2, "[null, 12, 12, 1]"), {"input_layer"}),
          on(random_crop("random_crop", 8, 8, image), {"zero_padding2d"}),
          on(random_flip("random_flip", "horizontal", image), {"random_crop"}),
          on(conv2d_no_bias("conv2d", 4, "[3, 3]", "[1, 1]", wide), {"random_flip"}),
          on(batch_normalization("batch_normalization", wide), {"conv2d"}),
          on(relu("re_lu", wide), {"batch_normalization"}),
          on(conv2d_no_bias("conv2d_1", 4, "[3, 3]", "[1, 1]", wide), {"re_lu"}),
          on(batch_normalization("batch_normalization_1", wide), {"conv2d_1"}),
          on(add("add", wide), {"re_lu", "batch_normalization_1"}),
          on(relu("re_lu_1", wide), {"add"}),
          on(global_average_pooling2d("global_average_pooling2d", "[null, 4]"), {"re_lu_1"}),
          on(dense("dense", 3, "linear", "[null, 3]"), {"global_average_pooling2d"})};
}

std::string resnet_fixture() {
  return functional(resnet_layers(), R"(["input_layer", 0, 0])", R"(["dense", 0, 0])");
}

std::string sequential_fixture() {
  return sequential(chain_layers());
}

std::string functional_fixture() {
  return functional(residual_layers(), R"(["input_layer", 0, 0])", R"(["dense", 0, 0])");
}

std::string zip_archive(const std::vector<std::pair<std::string, std::string>>& members) {
  std::string zip, directory;
  for (const auto& [name, data] : members) {
    const uint32_t crc = crc32_of(data);
    const uint64_t offset = zip.size();
    put(zip, 0x04034b50, 4);  // local header: version 20, no flags, stored, 1980-01-01
    put(zip, 20, 2), put(zip, 0, 2), put(zip, 0, 2), put(zip, 0, 2), put(zip, 0x21, 2);
    put(zip, crc, 4), put(zip, data.size(), 4), put(zip, data.size(), 4);
    put(zip, name.size(), 2), put(zip, 0, 2);
    zip += name + data;
    put(directory, 0x02014b50, 4);  // made by Unix 2.0, needs 2.0
    put(directory, 0x0314, 2), put(directory, 20, 2), put(directory, 0, 2), put(directory, 0, 2);
    put(directory, 0, 2), put(directory, 0x21, 2), put(directory, crc, 4);
    put(directory, data.size(), 4), put(directory, data.size(), 4);
    put(directory, name.size(), 2), put(directory, 0, 2), put(directory, 0, 2);
    put(directory, 0, 2), put(directory, 0, 2), put(directory, 0600u << 16, 4);
    put(directory, offset, 4);
    directory += name;
  }
  const uint64_t directory_offset = zip.size();
  zip += directory;
  put(zip, 0x06054b50, 4), put(zip, 0, 2), put(zip, 0, 2);
  put(zip, members.size(), 2), put(zip, members.size(), 2);
  put(zip, directory.size(), 4), put(zip, directory_offset, 4), put(zip, 0, 2);
  return zip;
}

std::string keras_archive(const std::string& config_json) {
  const std::string hdf5_signature("\x89HDF\r\n\x1a\n", 8);
  return zip_archive(
      {{"metadata.json", R"({"keras_version": "3.12.0", "date_saved": "2026-08-21@16:09:11"})"},
       {"config.json", config_json},
       {"model.weights.h5", hdf5_signature + std::string(56, '\0')}});
}

}  // namespace dtrain::testing::keras
