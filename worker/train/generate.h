// `dtrain generate RUN_DIR` (docs/language-models.md): samples text from a run's final language
// model on the CPU, one token at a time. The model is rebuilt from the architecture its
// safetensors file records, its weights loaded by name, and the prompt encoded with the
// vocabulary recorded beside them. Each step runs the model on the last T tokens (a shorter
// context is padded after its end, which a causal model never reads), takes the logits of the
// context's last position, divides them by the temperature, keeps the top k, and draws from their
// softmax with splitmix64 seeded by --seed: the same seed gives the same text on every machine
// whose backend gives the same logits.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace dtrain::train {

struct GenerateOptions {
  std::string run_dir;
  std::string prompt = "\n";  ///< nanoGPT's sample.py starts from a newline
  int tokens = 500;           ///< new tokens
  double temperature = 1.0;   ///< > 0; below 1 sharper, above flatter
  int top_k = 0;              ///< 0: every token
  uint64_t seed = 1337;
};

/// Samples options.tokens tokens after the prompt and passes each token's text to emit as it is
/// drawn (the prompt first). ConfigError (exit 2) for a run without a language model, a prompt
/// character outside the vocabulary, bad options; IoError for an unreadable model file.
void generate_text(const GenerateOptions& options,
                   const std::function<void(const std::string&)>& emit);

}  // namespace dtrain::train
