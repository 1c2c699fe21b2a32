// What dtrain refuses in a Keras 3 model file (worker/spec/keras_model.h), one case per kind of
// mistake, each a ConfigError whose message starts with the file, the layer, its class and the
// key: a value dtrain does not compute, a key it does not know, a class it does not have, a
// custom class, a keras_history naming no layer, a cycle, shapes that do not fit, more than one
// input or output, a shared layer, an input without fixed sizes, Keras 2's format; and through
// train.model.keras, with the job file's path in front. MultiHeadAttention's call arguments
// beyond causal self-attention; keras_hub's classes from another package.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "test/support/temp_dir.h"
#include "test/train/keras_fixtures.h"
#include "worker/spec/keras_model.h"
#include "worker/spec/train_config.h"

using namespace dtrain;
namespace kf = dtrain::testing::keras;
using Catch::Matchers::StartsWith;

namespace {

std::string error_of(const std::string& json) {
  try {
    train::translate_keras_model(json, "model.json");
  } catch (const common::ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

// The chain fixture with one key of layer i set: 0 input_layer, 1 conv2d, 2 max_pooling2d,
// 3 conv2d_1, 4 re_lu, 5 dropout, 6 flatten, 7 dense, 8 dense_1.
std::string chain_with(size_t i, const std::string& key, const std::string& json) {
  std::vector<kf::Layer> layers = kf::chain_layers();
  layers[i].config.set(key, json);
  return kf::sequential(layers);
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  if (at == std::string::npos) throw std::logic_error("fixture lacks " + from);
  return text.replace(at, from.size(), to);
}

const char* kOrthogonal =
    R"({"module": "keras.initializers", "class_name": "Orthogonal", "config": {"seed": null, )"
    R"("gain": 1.0}, "registered_name": null})";

}  // namespace

TEST_CASE("a Keras key at a value dtrain does not compute is refused naming it", "[keras]") {
  struct Case {
    size_t layer;
    const char* key;
    std::string value;
    std::string message;
  };
  const std::vector<Case> cases = {
      {3, "data_format", R"("channels_first")",
       R"(layer "conv2d_1" (Conv2D): data_format: "channels_first" is not supported (dtrain )"
       R"(computes channels_last))"},
      {1, "dilation_rate", "[2, 2]",
       R"(layer "conv2d" (Conv2D): dilation_rate: [2,2] is not supported (dtrain computes 1))"},
      {1, "groups", "2", R"(layer "conv2d" (Conv2D): groups: 2 is not supported)"},
      {1, "activation", R"("softmax")",
       R"(layer "conv2d" (Conv2D): activation: softmax only on a dense layer)"},
      {1, "trainable", "false",
       R"(layer "conv2d" (Conv2D): trainable: false is not supported (dtrain trains every )"},
      {1, "dtype",
       R"({"module": "keras", "class_name": "DTypePolicy", "config": {"name": "mixed_float16"}, )"
       R"("registered_name": null})",
       R"(layer "conv2d" (Conv2D): dtype: DTypePolicy "mixed_float16" is not supported (dtrain )"
       R"(computes float32 here; mixed precision is train.dtype_policy))"},
      {1, "lora_rank", "4",
       R"(layer "conv2d" (Conv2D): lora_rank: 4 is not supported (dtrain )"
       R"(supports only null))"},
      {2, "padding", R"("full")",
       R"(layer "max_pooling2d" (MaxPooling2D): padding: expected "valid" or "same", found )"
       R"("full")"},
      {4, "max_value", "6.0",
       R"(layer "re_lu" (ReLU): max_value: 6.0 is not supported (dtrain supports only null))"},
      {4, "negative_slope", "0.1",
       R"(layer "re_lu" (ReLU): negative_slope: 0.1 is not supported (dtrain computes 0))"},
      {5, "noise_shape", "[null, 1, 1, 6]",
       R"(layer "dropout" (Dropout): noise_shape: [null,1,1,6] is not supported)"},
      {6, "data_format", R"("channels_first")",
       R"(layer "flatten" (Flatten): data_format: "channels_first" is not supported)"},
      {7, "activation", R"("elu")",
       R"(layer "dense" (Dense): activation: "elu" is not supported (dtrain computes linear, )"
       R"(relu, softmax, sigmoid, tanh, gelu or silu))"},
      {7, "use_bias", "0", R"(layer "dense" (Dense): use_bias: expected true or false)"},
      {7, "kernel_initializer", kOrthogonal,
       R"(layer "dense" (Dense): kernel_initializer.config: unknown key "gain")"},
      {7, "kernel_initializer", R"("orthogonal")",
       R"(layer "dense" (Dense): kernel_initializer: initializer orthogonal is not supported )"
       R"((dtrain has glorot_uniform, glorot_normal, he_normal, he_uniform, lecun_normal, )"
       R"(lecun_uniform))"},
      {7, "bias_initializer", R"("ones")",
       R"(layer "dense" (Dense): bias_initializer: "ones" is not supported (dtrain computes )"
       R"(Zeros))"},
      {7, "kernel_regularizer",
       R"({"module": "keras.regularizers", "class_name": "OrthogonalRegularizer", "config": )"
       R"({"factor": 0.01, "mode": "rows"}, "registered_name": null})",
       R"(layer "dense" (Dense): kernel_regularizer.class_name: regularizer )"
       R"(OrthogonalRegularizer is not supported (dtrain has L1, L2 and L1L2))"},
      {3, "bias_regularizer",
       R"({"module": "keras.regularizers", "class_name": "L2", "config": {"l2": -0.5}, )"
       R"("registered_name": null})",
       R"(layer "conv2d_1" (Conv2D): bias_regularizer.config.l2: expected a number from 0 )"},
      {3, "kernel_regularizer",
       R"({"module": "keras.regularizers", "class_name": "L1", "config": {"l2": 0.5}, )"
       R"("registered_name": null})",
       R"(layer "conv2d_1" (Conv2D): kernel_regularizer.config: unknown key "l2")"},
      {3, "kernel_regularizer",
       R"({"module": "my_package", "class_name": "L2", "config": {"l2": 0.5}, )"
       R"("registered_name": null})",
       R"(layer "conv2d_1" (Conv2D): kernel_regularizer.module: "my_package" is not Keras's )"},
      {7, "units", "0", R"(layer "dense" (Dense): units: expected an integer from 1)"},
      {7, "kernel_sizes", "3",
       R"(layer "dense" (Dense): kernel_sizes: not a key of Dense that dtrain knows (it knows: )"
       R"(name, trainable, dtype, activity_regularizer, units, activation, )"},
      {0, "batch_shape", "[32, 8, 8, 1]",
       R"(layer "input_layer" (InputLayer): batch_shape[0]: a fixed batch size (32) is not )"},
      {0, "batch_shape", "[null, null, null, 1]",
       R"(layer "input_layer" (InputLayer): batch_shape[1]: a size that varies (null) is not )"},
      {0, "sparse", "true", R"(layer "input_layer" (InputLayer): sparse: true is not supported)"},
  };
  for (const Case& c : cases) {
    INFO(c.key << " = " << c.value);
    CHECK_THAT(error_of(chain_with(c.layer, c.key, c.value)),
               StartsWith("model.json: " + c.message));
  }
}

TEST_CASE("issue 44's classes refuse a value dtrain does not compute, naming it", "[keras]") {
  // InputLayer, Rescaling, RandomTranslation, AveragePooling2D, Reshape, Flatten, Dense.
  auto layers = [] {
    return std::vector<kf::Layer>{
        kf::input_layer("input_layer", "[null, 8, 8, 1]"),
        kf::rescaling("rescaling", "0.5", "0.0", "[null, 8, 8, 1]"),
        kf::random_translation("random_translation", "0.1", "0.1", "[null, 8, 8, 1]"),
        kf::average_pooling2d("average_pooling2d", "[2, 2]", "[2, 2]", "valid", "[null, 4, 4, 1]"),
        kf::reshape("reshape", "[16]", "[null, 16]"),
        kf::flatten("flatten", "[null, 16]"),
        kf::dense("dense", 3, "linear", "[null, 3]")};
  };
  CHECK(error_of(kf::sequential(layers())) == "accepted");
  struct Case {
    size_t layer;
    const char* key;
    std::string value;
    std::string message;
  };
  const std::vector<Case> cases = {
      {1, "scale", "[0.5, 0.25]",
       R"(layer "rescaling" (Rescaling): scale: expected a number (dtrain has no per-channel )"},
      {2, "fill_mode", R"("mirror")",
       R"(layer "random_translation" (RandomTranslation): fill_mode: expected "reflect", )"},
      {2, "height_factor", "-1.5",
       R"(layer "random_translation" (RandomTranslation): height_factor: expected a number )"
       R"(from -1 to 1)"},
      {2, "interpolation", R"("bicubic")",
       R"(layer "random_translation" (RandomTranslation): interpolation: expected )"
       R"("bilinear" or "nearest")"},
      {2, "data_format", R"("channels_first")",
       R"(layer "random_translation" (RandomTranslation): data_format: "channels_first" is not )"},
      {3, "padding", R"("causal")",
       R"(layer "average_pooling2d" (AveragePooling2D): padding: expected "valid" or "same")"},
      {3, "data_format", R"("channels_first")",
       R"(layer "average_pooling2d" (AveragePooling2D): data_format: "channels_first" is not )"},
      {4, "target_shape", "[4, 4]",
       R"(layer "reshape" (Reshape): target_shape: expected [units] or [height, width, )"},
      {6, "activation", R"("hard_silu")",
       R"(layer "dense" (Dense): activation: "hard_silu" is not supported)"},
      {6, "bias_regularizer", R"("orthogonal_regularizer")",
       R"(layer "dense" (Dense): bias_regularizer: regularizer orthogonal_regularizer is not )"
       R"(supported (dtrain has L1, L2 and L1L2))"},
  };
  for (const Case& c : cases) {
    INFO(c.key << " = " << c.value);
    std::vector<kf::Layer> model = layers();
    model[c.layer].config.set(c.key, c.value);
    CHECK_THAT(error_of(kf::sequential(model)), StartsWith("model.json: " + c.message));
  }
  // A Reshape whose target does not hold its input, in the file's terms.
  std::vector<kf::Layer> model = layers();
  model[4].config.set("target_shape", "[15]");
  CHECK_THAT(error_of(kf::sequential(model)),
             StartsWith("model.json: layer \"reshape\" (Reshape): target_shape [15] does not "
                        "hold the input's 16 values"));
}

TEST_CASE("a Keras class dtrain does not have, or a custom one, is refused naming it", "[keras]") {
  std::vector<kf::Layer> layers = kf::chain_layers();
  layers[4].class_name = "GroupNormalization";
  layers[4].config = kf::Obj().set("name", R"("group_normalization")").set("axis", "-1");
  CHECK_THAT(error_of(kf::sequential(layers)),
             StartsWith("model.json: layer \"group_normalization\" (GroupNormalization): the "
                        "class GroupNormalization is not supported (dtrain reads InputLayer, "
                        "Conv2D, MaxPooling2D, Flatten, Dense, Dropout, ReLU, Add, Concatenate, "));
  // Activation is read, but only with an activation dtrain computes.
  layers[4].class_name = "Activation";
  layers[4].config = kf::Obj().set("name", R"("activation")").set("activation", R"("elu")");
  CHECK_THAT(error_of(kf::sequential(layers)),
             StartsWith("model.json: layer \"activation\" (Activation): activation: \"elu\" is "
                        "not supported (dtrain computes linear, relu, softmax, sigmoid, tanh, "
                        "gelu or silu)"));
  const std::string custom = replaced(kf::sequential_fixture(),
                                      R"("module": "keras.layers", )"
                                      R"("class_name": "Conv2D")",
                                      R"("module": "my_layers", "class_name": "Conv2D")");
  CHECK_THAT(error_of(custom), StartsWith("model.json: layer \"conv2d\" (Conv2D): module: "
                                          "\"my_layers\" is not Keras's own"));
  CHECK_THAT(error_of(replaced(kf::sequential_fixture(), R"("class_name": "Sequential")",
                               R"("class_name": "Conv2D")")),
             StartsWith("model.json: class_name: Conv2D is not a model dtrain reads "
                        "(Sequential or Functional)"));
  CHECK_THAT(error_of(R"({"class_name": "Sequential", "config": {"name": "s", "layers": []},
                          "keras_version": "2.15.0", "backend": "tensorflow"})"),
             StartsWith("model.json: keras_version: \"2.15.0\": this is Keras 2's format"));
}

TEST_CASE("a Keras graph dtrain cannot build is refused naming the layer", "[keras]") {
  const std::string residual = kf::functional_fixture();
  // keras_history naming no layer.
  CHECK_THAT(error_of(replaced(residual, R"("keras_history": ["conv2d_1", 0, 0])",
                               R"("keras_history": ["conv2d_9", 0, 0])")),
             StartsWith("model.json: layer \"conv2d_2\" (Conv2D): inbound_nodes[0].args[0]: "
                        "keras_history names \"conv2d_9\", which is no layer of the model"));
  // A cycle: conv2d_1 takes conv2d_2, which takes conv2d_1.
  std::vector<kf::Layer> layers = kf::residual_layers();
  layers[2].inputs = {"conv2d_2"};
  CHECK_THAT(error_of(kf::functional(layers, R"(["input_layer", 0, 0])", R"(["dense", 0, 0])")),
             StartsWith("model.json: layer \"conv2d_1\" (Conv2D): its inputs lead back to it (the "
                        "layers form a cycle)"));
  // Shapes that do not fit: the projection without its strides adds 8x8 to 4x4.
  layers = kf::residual_layers();
  layers[8].config.set("strides", "[1, 1]");
  CHECK_THAT(error_of(kf::functional(layers, R"(["input_layer", 0, 0])", R"(["dense", 0, 0])")),
             StartsWith("model.json: layer \"add_1\" (Add): add needs inputs of one shape"));
  // A kernel larger than its input (a 4x4 input pooled to 2x2, then a 3x3 valid convolution).
  std::vector<kf::Layer> chain = kf::chain_layers();
  chain[0] = kf::input_layer("input_layer", "[null, 4, 4, 1]");
  CHECK_THAT(error_of(kf::sequential(chain)),
             StartsWith("model.json: layer \"conv2d_1\" (Conv2D): a 3x3 kernel does not fit the "
                        "2x2 input"));
  // Two inputs, two outputs.
  layers = kf::residual_layers();
  layers.insert(layers.begin() + 1, kf::input_layer("input_layer_1", "[null, 8, 8, 1]"));
  CHECK_THAT(error_of(kf::functional(layers, R"([["input_layer", 0, 0], ["input_layer_1", 0, 0]])",
                                     R"(["dense", 0, 0])")),
             StartsWith("model.json: config.input_layers: dtrain models have one input; this one "
                        "has 2"));
  CHECK_THAT(error_of(kf::functional(kf::residual_layers(), R"(["input_layer", 0, 0])",
                                     R"([["dense", 0, 0], ["flatten", 0, 0]])")),
             StartsWith("model.json: config.output_layers: dtrain models have one output; this "
                        "one has 2"));
  // A layer called twice (shared weights).
  CHECK_THAT(error_of(replaced(residual, R"("name": "conv2d_2", "inbound_nodes": [)",
                               R"("name": "conv2d_2", "inbound_nodes": [{"args": [], )"
                               R"("kwargs": {}}, )")),
             StartsWith("model.json: layer \"conv2d_2\" (Conv2D): inbound_nodes: the layer is "
                        "called 2 times (shared weights)"));
  // A Sequential never given its input's shape.
  chain = kf::chain_layers();
  chain.erase(chain.begin());
  chain[0].build_config = false;  // never built
  std::string unbuilt =
      replaced(kf::sequential(chain), R"(, "build_input_shape": [null, 8, 8, 4])", "");
  CHECK_THAT(error_of(unbuilt),
             StartsWith("model.json: config: the model has no input shape (no InputLayer"));
}

TEST_CASE("train.model.keras reads the file and its mistakes name the job's key", "[keras]") {
  testing::TempDir dir;
  const std::string model = dir.path() + "/model.json";
  auto job = [&](const std::string& model_object) {
    return R"({"model": )" + model_object + R"(, "loss": {"type":
        "sparse_categorical_crossentropy", "from_logits": true}, "data": {"source": "synthetic",
        "examples": 16, "classes": 3}})";
  };
  const std::string keras = R"({"keras": ")" + model + R"("})";
  common::write_file_atomically(model, kf::functional_fixture());
  train::TrainConfig c = train::parse_train_config(job(keras), "job.json");
  CHECK(c.model.nodes.size() == 14);
  CHECK(c.model_json == train::translate_keras_model(kf::functional_fixture(), "x").model_json);
  common::write_file_atomically(model, chain_with(3, "groups", "4"));
  auto error = [&](const std::string& text) {
    try {
      train::parse_train_config(text, "job.json");
    } catch (const common::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(error(job(keras)),
             StartsWith("job.json: train.model.keras: " + model +
                        ": layer \"conv2d_1\" (Conv2D): groups: 4 is not supported"));
  CHECK_THAT(error(job(R"({"keras": ")" + dir.path() + R"(/none.json"})")),
             StartsWith("job.json: train.model.keras: " + dir.path() + "/none.json: cannot open"));
  CHECK_THAT(error(job(R"({"keras": "model.json", "input_shape": [8, 8, 1]})")),
             StartsWith("job.json: train.model: unknown key \"input_shape\""));
  // A softmax output from Keras meets the loss's check as a job file's would.
  common::write_file_atomically(model, kf::sequential_fixture());
  CHECK_THAT(error(job(keras)), StartsWith("job.json: train.loss: from_logits is true but the "
                                           "last layer already applies softmax"));
}

TEST_CASE("MultiHeadAttention's call is read as causal self-attention, anything else refused",
          "[keras]") {
  // gpt_layers()[3] is the attention, called as attention(x, x, use_causal_mask=True) on
  // layer_normalization; [1] is the token_and_position_embedding, another tensor.
  const std::vector<kf::Layer> gpt = kf::gpt_layers();
  auto with = [&](const std::vector<std::string>& more_args, const std::string& kwargs) {
    std::vector<kf::Layer> layers = gpt;
    layers[3].more_args = more_args;
    layers[3].kwargs = kwargs;
    return kf::functional(layers, R"(["input_layer", 0, 0])", R"(["dense_2", 0, 0])");
  };
  const std::string x = "layer_normalization", other = "token_and_position_embedding";
  const std::string other_tensor = kf::tensor_of(gpt[1]), x_tensor = kf::tensor_of(gpt[2]);
  const std::string label =
      "model.json: layer \"multi_head_attention\" (MultiHeadAttention): inbound_nodes[0].";
  // Self-attention in every spelling Keras writes: key the same tensor, positional or keyword;
  // the other arguments at their defaults.
  for (const std::string& json :
       {with({x, x}, R"({"use_causal_mask": true})"),
        with({x}, R"({"key": )" + x_tensor + R"(, "use_causal_mask": true})"),
        with({}, R"({"value": )" + x_tensor + R"(, "use_causal_mask": true})"),
        with({x}, R"({"attention_mask": null, "return_attention_scores": false, )"
                  R"("training": null, "use_causal_mask": true})")}) {
    INFO(json);
    CHECK(error_of(json) == "accepted");
  }
  CHECK(train::translate_keras_model(with({x}, "{}"), "m")
            .model_json.find(
                R"("name":"multi_head_attention","type":"multi_head_attention","inputs":)"
                R"(["layer_normalization"],"num_heads":2,"key_dim":8,"value_dim":8,"dropout":0.0,)"
                R"("use_bias":false})") != std::string::npos);
  // Cross-attention: value or key from another tensor.
  CHECK_THAT(error_of(with({other}, "{}")),
             StartsWith(label + "args[1]: value: the output of \"token_and_position_embedding\" "
                                "is not supported (dtrain's MultiHeadAttention is self-attention: "
                                "its value is the tensor it is called on, "
                                "\"layer_normalization\")"));
  CHECK_THAT(error_of(with({x, other}, "{}")),
             StartsWith(label + "args[2]: key: the output of \"token_and_position_embedding\""));
  CHECK_THAT(error_of(with({x}, R"({"key": )" + other_tensor + "}")),
             StartsWith(label + "kwargs.key: key: the output of \"token_and_position_embedding\""));
  // Other arguments at values dtrain does not compute.
  CHECK_THAT(error_of(with({x}, R"({"attention_mask": )" + other_tensor + "}")),
             StartsWith(label + "kwargs.attention_mask: an object is not supported (dtrain "
                                "supports only null)"));
  CHECK_THAT(error_of(with({x}, R"({"return_attention_scores": true})")),
             StartsWith(label + "kwargs.return_attention_scores: true is not supported (dtrain "
                                "supports only false)"));
  CHECK_THAT(error_of(with({x}, R"({"training": true})")),
             StartsWith(label + "kwargs.training: true is not supported (dtrain supports only "
                                "null)"));
  CHECK_THAT(error_of(with({x}, R"({"use_causal_mask": "yes"})")),
             StartsWith(label + "kwargs.use_causal_mask: \"yes\" is not supported (true or "
                                "false)"));
  CHECK_THAT(error_of(replaced(with({x}, R"({"marker": 1})"), R"(], "kwargs": {"marker": 1})",
                               ", null, null, null, null, null, false, null, false, null], "
                               R"("kwargs": {})")),
             StartsWith(label + "args[10]: MultiHeadAttention's call takes at most 10 "
                                "arguments"));
  CHECK_THAT(error_of(with({x}, R"({"scores": null})")),
             StartsWith(label + "kwargs.scores: not an argument of MultiHeadAttention's call "
                                "that dtrain knows (it knows: value, key, query_mask, "
                                "value_mask, key_mask, attention_mask, return_attention_scores, "
                                "training, use_causal_mask)"));
  CHECK_THAT(error_of(with({x}, R"({"value": )" + x_tensor + "}")),
             StartsWith(label + "kwargs.value: given also as a positional argument"));
  // Attention over another axis.
  std::vector<kf::Layer> layers = gpt;
  layers[3].config.set("attention_axes", "[2]");
  CHECK_THAT(error_of(kf::functional(layers, R"(["input_layer", 0, 0])", R"(["dense_2", 0, 0])")),
             StartsWith("model.json: layer \"multi_head_attention\" (MultiHeadAttention): "
                        "attention_axes: [2] is not supported (dtrain attends over the "
                        "sequence's axis: null or [1])"));
}

TEST_CASE("keras_hub's classes are read as keras_hub's, a custom module stays refused", "[keras]") {
  const std::string gpt = kf::gpt_fixture();
  const std::string hub_module =
      R"("module": "keras_hub.src.layers.modeling.token_and_position_embedding")";
  CHECK(error_of(gpt) == "accepted");
  CHECK(error_of(replaced(gpt, hub_module, R"("module": "keras_hub.layers")")) == "accepted");
  const std::string label =
      "model.json: layer \"token_and_position_embedding\" (TokenAndPositionEmbedding): ";
  CHECK_THAT(error_of(replaced(gpt, hub_module, R"("module": "my_layers")")),
             StartsWith(label + "module: \"my_layers\" is not Keras's own: "
                                "TokenAndPositionEmbedding is a custom class"));
  CHECK_THAT(error_of(replaced(gpt, R"("registered_name": "keras_hub>TokenAndPositionEmbedding")",
                               R"("registered_name": "mine>TokenAndPositionEmbedding")")),
             StartsWith(label + "registered_name: \"mine>TokenAndPositionEmbedding\" is a "
                                "registered custom class"));
  CHECK_THAT(
      error_of(replaced(replaced(gpt, hub_module, R"("module": "keras.layers")"),
                        R"("registered_name": "keras_hub>TokenAndPositionEmbedding")",
                        R"("registered_name": null)")),
      StartsWith(label + "module: keras's TokenAndPositionEmbedding is not a class dtrain reads "
                         "(it reads keras_hub's)"));
  // Keras's own classes are not keras_hub's.
  CHECK_THAT(error_of(replaced(gpt, R"("module": "keras.layers", "class_name": "Add")",
                               R"("module": "keras_hub.layers", "class_name": "Add")")),
             StartsWith("model.json: layer \"add\" (Add): module: keras_hub's Add is not a class "
                        "dtrain reads (it reads keras's)"));
}
