// See keras_layer.h. Keras's side, read from keras-team/keras: Layer.get_config (name, trainable,
// dtype; activity_regularizer when one is set), each class's get_config, dtype_policies/ (a
// policy serialized as a DTypePolicy object; older Keras 3 wrote the name), initializers/
// (GlorotUniform's seed, input_axes and output_axes), and InputLayer.get_config.
#include "worker/spec/keras_layer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>

#include "common/errors.h"

namespace dtrain::train::keras {
namespace {

using nn::KerasKey;

// A value as a message shows it: a Keras object by its class_name, anything else as JSON
// (shortened).
std::string shown(const common::JsonNode& value) {
  if (value.is_object()) {
    if (auto c = value.find("class_name"); c && c->is_string()) return c->as_string();
  }
  std::string text = value.dump();
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

// ConfigError "<path>: <value> is not supported (<why>)".
[[noreturn]] void refuse(const common::JsonNode& value, const std::string& why) {
  value.fail(fmt::format("{} is not supported ({})", shown(value), why));
}

bool written_as(const common::JsonNode& value, std::initializer_list<std::string_view> texts) {
  const std::string text = value.dump();
  return std::find(texts.begin(), texts.end(), text) != texts.end();
}

// kernel_initializer or bias_initializer: Keras's serialized object of class_name, or the name a
// hand-written file may give ("glorot_uniform").
void check_initializer(const common::JsonNode& value, std::string_view class_name,
                       std::string_view alias) {
  const std::string why = fmt::format("dtrain computes {}", class_name);
  if (value.is_string()) {
    const std::string name = value.as_string();
    if (name != class_name && name != alias) refuse(value, why);
    return;
  }
  if (!value.is_object()) refuse(value, why);
  value.check_keys({"module", "class_name", "config", "registered_name"});
  if (check_keras_class(value) != class_name) refuse(value, why);
  std::optional<common::JsonNode> config = value.find("config");
  if (!config) return;
  if (class_name != "GlorotUniform") {
    config->check_keys({});
    return;
  }
  config->check_keys({"seed", "input_axes", "output_axes"});
  // Any seed: dtrain's initialisation draws from train.seed (docs/train-config.md).
  if (auto seed = config->find("seed"); seed && !seed->is_null())
    seed->as_int(INT64_MIN, INT64_MAX);
  for (const char* axes : {"input_axes", "output_axes"}) {
    if (auto n = config->find(axes); n && !n->is_null())
      refuse(*n, "dtrain computes the kernel's own fans: null");
  }
}

// One key the kind lists; true when it is written on for the kind's parse.
bool take(const common::JsonNode& value, KerasKey how) {
  switch (how) {
    case KerasKey::kRead:
      return true;
    case KerasKey::kActivation:
      if (!value.is_null() &&
          !written_as(value, {R"("linear")", R"("relu")", R"("softmax")", R"("sigmoid")",
                              R"("tanh")", R"("gelu")", R"("silu")", R"("swish")"}))
        refuse(value, "dtrain computes linear, relu, softmax, sigmoid, tanh, gelu or silu");
      return true;
    case KerasKey::kNull:
      if (!value.is_null()) refuse(value, "dtrain supports only null");
      return false;
    case KerasKey::kOne:
      if (!written_as(value, {"1", "[1,1]"})) refuse(value, "dtrain computes 1");
      return false;
    case KerasKey::kZero:
      if (!written_as(value, {"0", "0.0", "-0.0"})) refuse(value, "dtrain computes 0");
      return false;
    case KerasKey::kChannelsLast:
      if (!value.is_null() && !written_as(value, {R"("channels_last")"}))
        refuse(value, "dtrain computes channels_last");
      return false;
    case KerasKey::kGlorotUniform:
      check_initializer(value, "GlorotUniform", "glorot_uniform");
      return false;
    case KerasKey::kZeros:
      check_initializer(value, "Zeros", "zeros");
      return false;
    case KerasKey::kSeed:  // not used: dtrain draws from train.seed
      if (!value.is_null()) value.as_int(INT64_MIN, INT64_MAX);
      return false;
    case KerasKey::kOnes:
      check_initializer(value, "Ones", "ones");
      return false;
    case KerasKey::kFalse:
      if (!written_as(value, {"false"})) refuse(value, "dtrain supports only false");
      return false;
    case KerasKey::kInitializer:  // handled by the caller
      return true;
    case KerasKey::kRegularizer:
      return !value.is_null();
    case KerasKey::kUnusedNumber:
      value.as_number(-1e300, 1e300);
      return false;
    case KerasKey::kSequenceAxis:
      if (!value.is_null() && !written_as(value, {"[1]", "1"}))
        refuse(value, "dtrain attends over the sequence's axis: null or [1]");
      return false;
  }
  return false;
}

}  // namespace

std::string check_keras_class(const common::JsonNode& envelope) {
  std::string class_name = envelope.at("class_name").as_nonempty_string();
  if (auto module = envelope.find("module")) {
    std::string name = module->as_string();
    if (name != "keras" && name.rfind("keras.", 0) != 0 && name != "keras_hub" &&
        name.rfind("keras_hub.", 0) != 0) {
      module->fail(
          fmt::format("\"{}\" is not Keras's own: {} is a custom class, which dtrain "
                      "does not read",
                      name, class_name));
    }
  }
  if (auto registered = envelope.find("registered_name"); registered && !registered->is_null()) {
    std::string name = registered->as_string();
    if (name != class_name && name != "keras_hub>" + class_name) {
      registered->fail(
          fmt::format("\"{}\" is a registered custom class, which dtrain does not read", name));
    }
  }
  return class_name;
}

std::string keras_package(const common::JsonNode& envelope) {
  auto module = envelope.find("module");
  auto registered = envelope.find("registered_name");
  const std::string from_module = module && module->is_string() ? module->as_string() : "";
  const std::string from_registry =
      registered && registered->is_string() ? registered->as_string() : "";
  if (from_module.rfind("keras_hub", 0) == 0 || from_registry.rfind("keras_hub>", 0) == 0)
    return "keras_hub";
  return from_module.empty() ? "" : "keras";
}

void check_dtype(const common::JsonNode& value) {
  const char* why = "dtrain computes float32 here; mixed precision is train.dtype_policy";
  if (value.is_null()) return;
  if (value.is_string()) {
    if (value.as_string() != "float32") refuse(value, why);
    return;
  }
  if (!value.is_object()) refuse(value, why);
  value.check_keys({"module", "class_name", "config", "registered_name"});
  std::string class_name = check_keras_class(value);
  if (class_name != "DTypePolicy" && class_name != "FloatDTypePolicy") refuse(value, why);
  common::JsonNode config = value.at("config");
  config.check_keys({"name"});
  common::JsonNode name = config.at("name");
  if (!written_as(name, {R"("float32")"}))
    value.fail(fmt::format("{} {} is not supported ({})", class_name, shown(name), why));
}

void write_layer_keys(const common::JsonNode& config, const nn::LayerKind& kind,
                      common::JsonWriter& w) {
  const std::vector<nn::KerasKeySpec> keys = kind.keras_keys();
  for (const auto& [key, value] : config.as_object()) {
    if (key == "name") continue;
    if (key == "trainable") {
      if (!value.as_bool()) value.fail("false is not supported (dtrain trains every layer)");
      continue;
    }
    if (key == "dtype") {
      check_dtype(value);
      continue;
    }
    if (key == "activity_regularizer") {
      if (!value.is_null()) refuse(value, "dtrain supports only null");
      continue;
    }
    auto it = std::find_if(keys.begin(), keys.end(),
                           [&](const nn::KerasKeySpec& k) { return key == k.key; });
    if (it == keys.end()) {
      std::string known = "name, trainable, dtype, activity_regularizer";
      for (const nn::KerasKeySpec& k : keys) known += fmt::format(", {}", k.key);
      value.fail(
          fmt::format("not a key of {} that dtrain knows (it knows: {})", kind.keras_class, known));
    }
    if (it->how == nn::KerasKey::kInitializer) {  // checked by the kind, recorded by name
      std::string name = value.is_string() ? value.as_string()
                         : value.is_object() && value.find("class_name")
                             ? value.at("class_name").as_string()
                             : std::string();
      bool plain = name == "GlorotUniform" || name == "glorot_uniform";  // the default...
      if (auto init = value.is_object() ? value.find("config") : std::nullopt) {
        for (const char* axes : {"input_axes", "output_axes"})  // ...unless it says more
          if (auto n = init->find(axes); n && !n->is_null()) plain = false;
      }
      if (!plain) w.key(key).raw(value.dump());
      continue;
    }
    if (take(value, it->how)) w.key(key).raw(value.dump());
  }
}

bool is_token_dtype(const common::JsonNode& value) {
  if (value.is_object()) {  // a DTypePolicy named so
    auto config = value.find("config");
    auto name = config && config->is_object() ? config->find("name") : std::nullopt;
    return name && is_token_dtype(*name);
  }
  return written_as(value, {R"("int32")", R"("int64")"});
}

std::vector<int> input_layer_shape(const common::JsonNode& config) {
  config.check_keys({"batch_shape", "dtype", "sparse", "ragged", "name", "optional"});
  for (const char* key : {"sparse", "ragged", "optional"}) {
    if (auto n = config.find(key); n && n->as_bool())
      n->fail("true is not supported (dtrain feeds one dense float32 input)");
  }
  std::vector<int> shape = batch_shape(config.at("batch_shape"));
  if (auto n = config.find("dtype"); n && !(shape.size() == 1 && is_token_dtype(*n)))
    check_dtype(*n);
  return shape;
}

std::vector<int> batch_shape(const common::JsonNode& value) {
  std::vector<common::JsonNode> dims = value.as_array();
  if (dims.size() < 2 || dims.size() > 4) {
    refuse(value,
           "dtrain takes images, [null, height, width, channels] or [null, height, width], or "
           "token ids, [null, sequence_length]");
  }
  if (!dims[0].is_null()) {
    dims[0].fail(
        fmt::format("a fixed batch size ({}) is not supported (dtrain's is "
                    "train.per_worker_batch_size): give null",
                    shown(dims[0])));
  }
  std::vector<int> shape;
  for (size_t i = 1; i < dims.size(); ++i) {
    if (dims[i].is_null()) {
      dims[i].fail(
          "a size that varies (null) is not supported (dtrain needs the height, width "
          "and channels, or the sequence length)");
    }
    shape.push_back(static_cast<int>(dims[i].as_int(1, 1 << 14)));
  }
  if (shape.size() == 2) shape.push_back(1);  // [h, w]; [T] stays: token ids
  return shape;
}

}  // namespace dtrain::train::keras
