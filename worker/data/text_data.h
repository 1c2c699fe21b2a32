// Text for language models (docs/design.md#text-data): `"source": "text"` reads a file and turns
// it into token ids, one per character (the sorted set of its characters, nanoGPT's
// shakespeare_char) or per byte; `"source": "tokens"` maps a flat file of uint16 ids (nanoGPT's
// train.bin and val.bin), so a corpus larger than memory trains. A split is a Dataset whose
// examples are windows of sequence_length tokens: x = t[i, i + T), y = t[i + 1, i + T + 1).
// Training draws its windows' offsets in batcher.h (window_offset); validation takes every
// non-overlapping window. Errors name the file and exit 2 (ConfigError).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "worker/data/dataset.h"

namespace dtrain::data {

/// Ids of a "characters" vocabulary: the sorted set of the text's characters (Unicode code
/// points, as Python's sorted(set(text))), id i for the i-th. Each character's UTF-8 text.
struct CharacterVocabulary {
  std::vector<std::string> symbols;
  std::vector<uint16_t> ids;  ///< the text, one id per character
};

/// text (UTF-8) as characters; ConfigError "<where>: byte B is not valid UTF-8 ..." on a bad
/// sequence, "... more than 65536 distinct characters" past uint16.
CharacterVocabulary encode_characters(const std::string& text, const std::string& where);

/// The train and validation splits of a "text" or "tokens" source whose windows are
/// sequence_length tokens (the model's input_shape [T]). need_test false: the validation split is
/// left empty (count 0) when it would come from its own file.
std::pair<Dataset, Dataset> load_text_splits(const DataConfig& config, int sequence_length,
                                             bool need_test);

}  // namespace dtrain::data
