// A small character GPT on tiny-shakespeare (docs/language-models.md), for the tests that show a
// guarantee holds for language models too: resume after a kill, recovery in place, elastic
// membership. with_language_model() turns an image job's text into it: its "model" object
// becomes the GPT's and its "data" object the text source; the rest (optimizer, steps, batch,
// recovery) stays as the test wrote it. Text only.
#pragma once

#include <string>

namespace dtrain::testing {

/// A one-block GPT over 16 characters: learned tokens and positions, causal attention with two
/// heads, a GELU MLP with dropout, residual adds and layer normalization, logits per position.
inline const char* kLanguageModel = R"("model": {"input_shape": [16], "layers": [
    {"name": "embed", "type": "token_and_position_embedding", "vocabulary_size": 65,
     "sequence_length": 16, "embedding_dim": 16},
    {"name": "norm1", "type": "layer_normalization"},
    {"name": "attention", "type": "multi_head_attention", "num_heads": 2, "key_dim": 8,
     "causal": true},
    {"name": "res1", "type": "add", "inputs": ["embed", "attention"]},
    {"name": "norm2", "type": "layer_normalization"},
    {"name": "up", "type": "dense", "units": 32, "activation": "gelu"},
    {"type": "dropout", "rate": 0.1},
    {"name": "down", "type": "dense", "units": 16},
    {"name": "res2", "type": "add", "inputs": ["res1", "down"]},
    {"name": "logits", "type": "dense", "units": 65}]},
  )";

/// job with its "model" (up to "loss") replaced by kLanguageModel and its "data" object by the
/// text source on the repository's tiny-shakespeare.
inline std::string with_language_model(std::string job) {
  size_t begin = job.find("\"model\":"), end = job.find("\"loss\":");
  if (begin == std::string::npos || end == std::string::npos || end < begin) return "no model";
  job.replace(begin, end - begin, kLanguageModel);
  begin = job.find("\"data\":");
  end = job.find('}', begin);
  if (begin == std::string::npos || end == std::string::npos) return "no data";
  job.replace(begin, end + 1 - begin,
              std::string(R"("data": {"source": "text", "path": ")") + DTRAIN_SOURCE_DIR +
                  R"(/data/tiny-shakespeare/input.txt"})");
  return job;
}

}  // namespace dtrain::testing
