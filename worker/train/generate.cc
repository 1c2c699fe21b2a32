// See generate.h.
#include "worker/train/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "common/run_dir.h"
#include "worker/data/batcher.h"
#include "worker/data/text_data.h"
#include "worker/nn/backend.h"
#include "worker/nn/model.h"
#include "worker/spec/model_spec.h"
#include "worker/train/evaluator.h"
#include "worker/train/safetensors.h"

namespace dtrain::train {
namespace {

using common::ConfigError;

/// The vocabulary model.json records: a token's text, and a prompt's tokens.
struct Vocabulary {
  std::string kind;  ///< "characters", "bytes" or "tokens"
  std::vector<std::string> symbols;
  int size = 0;

  std::string text(int id) const {
    if (kind == "characters") return symbols[static_cast<size_t>(id)];
    if (kind == "bytes") return std::string(1, static_cast<char>(id));
    return fmt::format("{} ", id);  // tokens: ids, space-separated
  }
  std::vector<int> encode(const std::string& prompt) const {
    std::vector<int> ids;
    if (kind == "bytes") {
      for (char c : prompt) ids.push_back(static_cast<uint8_t>(c));
    } else if (kind == "characters") {
      data::CharacterVocabulary v = data::encode_characters(prompt, "--prompt");
      for (uint16_t local : v.ids) {
        const std::string& c = v.symbols[local];
        auto it = std::find(symbols.begin(), symbols.end(), c);
        if (it == symbols.end()) {
          throw ConfigError(fmt::format(
              "--prompt: the character \"{}\" is not in the model's vocabulary of {} characters",
              c == "\n" ? "\\n" : c, symbols.size()));
        }
        ids.push_back(static_cast<int>(it - symbols.begin()));
      }
    } else {
      for (const std::string& word : split_words(prompt)) {
        int id = -1;
        try {
          size_t used = 0;
          id = std::stoi(word, &used);
          if (used != word.size()) id = -1;
        } catch (const std::exception&) {
          id = -1;
        }
        if (id < 0 || id >= size) {
          throw ConfigError(fmt::format(
              "--prompt: \"{}\" is not a token id below {} (a tokens model's prompt is ids)", word,
              size));
        }
        ids.push_back(id);
      }
    }
    return ids;
  }
  static std::vector<std::string> split_words(const std::string& s) {
    std::vector<std::string> words;
    std::string word;
    for (char c : s) {
      if (c == ' ' || c == '\n' || c == '\t' || c == ',') {
        if (!word.empty()) words.push_back(word), word.clear();
      } else {
        word += c;
      }
    }
    if (!word.empty()) words.push_back(word);
    return words;
  }
};

Vocabulary read_vocabulary(const std::string& json, const std::string& where) {
  common::JsonDocument doc = common::JsonDocument::parse(json, where);
  Vocabulary v;
  v.kind = doc.root().at("kind").as_string();
  if (v.kind == "characters") {
    for (const common::JsonNode& s : doc.root().at("symbols").as_array())
      v.symbols.push_back(s.as_string());
    v.size = static_cast<int>(v.symbols.size());
  } else if (v.kind == "bytes") {
    v.size = 256;
  } else if (v.kind == "tokens") {
    v.size = static_cast<int>(doc.root().at("size").as_int(1, 65536));
  } else {
    throw ConfigError(fmt::format("{}: unknown vocabulary kind \"{}\"", where, v.kind));
  }
  return v;
}

}  // namespace

void generate_text(const GenerateOptions& options,
                   const std::function<void(const std::string&)>& emit) {
  if (options.tokens < 0) throw ConfigError("--tokens: expected 0 or more");
  if (!(options.temperature > 0) || !std::isfinite(options.temperature))
    throw ConfigError(
        fmt::format("--temperature: expected a number above 0, not {}", options.temperature));
  if (options.top_k < 0) throw ConfigError("--top-k: expected 0 (every token) or more");
  const std::string path = common::RunDir(options.run_dir).model_dir() + "/model.safetensors";
  if (!std::filesystem::exists(path)) {
    throw ConfigError(fmt::format(
        "{}: no final model (a run writes it when training ends; dtrain generate samples from it)",
        path));
  }
  SafetensorsFile file = read_safetensors(path);
  auto vocabulary_entry = file.metadata.find("vocabulary");
  if (vocabulary_entry == file.metadata.end()) {
    throw ConfigError(fmt::format(
        "{}: not a language model (it was not trained on a \"text\" or \"tokens\" source)", path));
  }
  const Vocabulary vocabulary = read_vocabulary(vocabulary_entry->second, path + ": vocabulary");
  common::JsonDocument architecture =
      common::JsonDocument::parse(file.metadata.at("architecture"), path + ": architecture");
  nn::ModelSpec spec = nn::parse_model_spec(architecture.root());
  const nn::Dims out = spec.output_dims();
  if (!spec.sequence || !out.sequence || out.h != spec.height) {
    throw ConfigError(fmt::format(
        "{}: the model does not map a sequence of tokens to each position's next token", path));
  }
  const int window = spec.height, classes = out.w;
  std::unique_ptr<nn::Backend> backend = nn::make_dnnl_backend(nn::MathMode::kFloat32);
  nn::Model model(spec, *backend, 1);
  if (!load_weights(model, file))
    throw ConfigError(fmt::format("{}: its tensors do not fit its architecture", path));

  std::vector<int> context = vocabulary.encode(options.prompt);
  if (context.empty()) throw ConfigError("--prompt: empty (give at least one token)");
  emit(options.prompt);
  nn::Buffer<float> input(backend->device(), static_cast<size_t>(window));
  std::vector<float> ids(static_cast<size_t>(window)), logits(static_cast<size_t>(classes));
  data::SplitMix64 rng(options.seed);
  for (int made = 0; made < options.tokens; ++made) {
    const size_t used = std::min(context.size(), static_cast<size_t>(window));
    std::fill(ids.begin(), ids.end(), 0.0f);
    for (size_t t = 0; t < used; ++t)
      ids[t] = static_cast<float>(context[context.size() - used + t]);
    input.from_host(ids);
    const float* y = model.forward(input.data(), 1, {}, false);
    backend->device().download(logits.data(), y + (used - 1) * static_cast<size_t>(classes),
                               logits.size() * sizeof(float));
    // logits / temperature, the top k kept, softmax in double, one draw.
    // Only ids the vocabulary names (the output may be wider, as nanoGPT's padded vocabulary).
    const int named = std::min(classes, vocabulary.size);
    std::vector<double> scaled(static_cast<size_t>(named));
    for (size_t k = 0; k < scaled.size(); ++k) scaled[k] = logits[k] / options.temperature;
    if (options.top_k > 0 && options.top_k < named) {
      std::vector<double> sorted = scaled;
      std::nth_element(sorted.begin(), sorted.begin() + (options.top_k - 1), sorted.end(),
                       std::greater<double>());
      const double kth = sorted[static_cast<size_t>(options.top_k - 1)];
      for (double& v : scaled)
        if (v < kth) v = -INFINITY;
    }
    const double top = *std::max_element(scaled.begin(), scaled.end());
    double total = 0;
    for (double& v : scaled) total += (v = std::exp(v - top));
    double u = static_cast<double>(rng.next() >> 11) * 0x1.0p-53 * total;
    int id = named - 1;
    for (int k = 0; k < named; ++k) {
      if (u < scaled[static_cast<size_t>(k)]) {
        id = k;
        break;
      }
      u -= scaled[static_cast<size_t>(k)];
    }
    context.push_back(id);
    emit(vocabulary.text(id));
  }
}

}  // namespace dtrain::train
