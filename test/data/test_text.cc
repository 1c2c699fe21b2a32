// The "text" and "tokens" data sources (worker/data/text_data.h): the characters' vocabulary,
// the splits, windows and their labels, training windows drawn from (seed, epoch, step,
// example), the bad inputs (each a ConfigError naming the file), and tiny-shakespeare itself.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/json.h"
#include "test/support/config_error.h"
#include "test/support/temp_dir.h"
#include "worker/data/batcher.h"
#include "worker/data/dataset.h"
#include "worker/data/text_data.h"

using namespace dtrain::data;
using Catch::Contains;
using dtrain::common::JsonDocument;
using dtrain::testing::config_error;
using dtrain::testing::TempDir;

namespace {

DataConfig parse(const std::string& json) {
  JsonDocument doc = JsonDocument::parse(json, "train.data");
  return parse_data_config(doc.root());
}

std::string write(const TempDir& dir, const std::string& name, const std::string& bytes) {
  std::string path = dir.path() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string tokens_file(const TempDir& dir, const std::string& name,
                        const std::vector<uint16_t>& ids) {
  return write(
      dir, name,
      std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint16_t)));
}

DataConfig text_config(const std::string& path) {
  DataConfig c;
  c.source = "text";
  c.path = path;
  c.validation_split = 0.1;
  return c;
}

std::string shakespeare() {
  return std::string(DTRAIN_SOURCE_DIR) + "/data/tiny-shakespeare/input.txt";
}

}  // namespace

TEST_CASE("characters are numbered in code point order, multi-byte ones too", "[text]") {
  CharacterVocabulary v = encode_characters(
      "ba\xc3\xa9\xe4\xb8\xad"
      "a\n",
      "t.txt");
  REQUIRE(v.symbols == std::vector<std::string>{"\n", "a", "b", "\xc3\xa9", "\xe4\xb8\xad"});
  REQUIRE(v.ids == std::vector<uint16_t>{2, 1, 3, 4, 1, 0});
}

TEST_CASE("text that is not UTF-8 is refused at the byte that breaks it", "[text]") {
  for (std::string bad : {std::string("ab\xff"), std::string("ab\xc3"), std::string("a\x80"),
                          std::string("\xc0\xaf"), std::string("\xed\xa0\x80")}) {
    std::string message = config_error([&] { encode_characters(bad, "poem.txt"); });
    REQUIRE_THAT(message, Contains("poem.txt: byte"));
    REQUIRE_THAT(message, Contains("not valid UTF-8"));
  }
}

TEST_CASE("a text file splits 90/10 into windows whose labels are the next tokens", "[text]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 100; ++i) text += static_cast<char>('a' + i % 7);
  std::string path = write(dir, "t.txt", text);
  auto [train, test] = load_data(text_config(path), {8});
  REQUIRE(train.token_count == 90);
  REQUIRE(test.token_count == 10);
  REQUIRE(train.classes == 7);
  REQUIRE(train.symbols.size() == 7);
  REQUIRE(train.count == (90 - 1) / 8);
  REQUIRE(test.count == 1);
  REQUIRE(train.positions() == 8);
  std::vector<float> x(2 * 8);
  std::vector<int32_t> y(2 * 8);
  copy_nchw(train, 1, 2, x.data());
  copy_labels(train, 1, 2, y.data());
  for (int k = 0; k < 16; ++k) {
    REQUIRE(x[k] == static_cast<float>((8 + k) % 7));  // window 1 starts at token 8
    REQUIRE(y[k] == (9 + k) % 7);
  }
  copy_nchw(test, 0, 1, x.data());
  REQUIRE(x[0] == static_cast<float>(90 % 7));
}

TEST_CASE("the bytes vocabulary takes any file", "[text]") {
  TempDir dir;
  std::string bytes;
  for (int i = 0; i < 300; ++i) bytes += static_cast<char>(i % 256);
  DataConfig c = text_config(write(dir, "b.bin", bytes));
  c.vocabulary = "bytes";
  auto [train, test] = load_data(c, {4});
  REQUIRE(train.classes == 256);
  std::vector<float> x(4);
  copy_nchw(train, 0, 1, x.data());
  REQUIRE(x == std::vector<float>{0, 1, 2, 3});
  REQUIRE(test.count > 0);
}

TEST_CASE("tokens files are mapped, with their own validation file or a split", "[text]") {
  TempDir dir;
  std::vector<uint16_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>(i % 500);
  std::string train_bin = tokens_file(dir, "train.bin", ids);
  std::string val_bin =
      tokens_file(dir, "val.bin", std::vector<uint16_t>(ids.begin(), ids.begin() + 65));
  DataConfig c = parse(R"({"source": "tokens", "path": ")" + train_bin +
                       R"(", "validation_path": ")" + val_bin + R"(", "vocabulary_size": 500})");
  auto [train, test] = load_data(c, {64});
  REQUIRE(train.token_count == 1000);
  REQUIRE(test.token_count == 65);
  REQUIRE(test.count == 1);
  REQUIRE(train.classes == 500);
  REQUIRE(train.vocabulary == "tokens");
  std::vector<float> x(64);
  copy_nchw(train, 2, 1, x.data());
  REQUIRE(x[0] == 128.0f);
  // Without a validation file the last tenth validates.
  c = parse(R"({"source": "tokens", "path": ")" + train_bin + R"(", "vocabulary_size": 500})");
  auto [first, last] = load_data(c, {64});
  REQUIRE(first.token_count == 900);
  REQUIRE(last.token_count == 100);
  // Validation not needed: its file is not read.
  c.validation_path = dir.path() + "/missing.bin";
  c.validation_split = 0;
  REQUIRE(load_data(c, {64}, false).second.count == 0);
}

TEST_CASE("bad text inputs exit 2 naming the file", "[text]") {
  TempDir dir;
  std::string empty = write(dir, "empty.txt", "");
  REQUIRE_THAT(config_error([&] { load_data(text_config(empty), {8}); }),
               Contains("empty.txt: the file is empty"));
  std::string short_text = write(dir, "short.txt", std::string(50, 'x'));
  REQUIRE_THAT(config_error([&] { load_data(text_config(short_text), {8}); }),
               Contains("short.txt (its last 10%, validation_split 0.1): 5 tokens, fewer than one "
                        "window of sequence_length 8"));
  REQUIRE_THAT(config_error([&] { load_data(text_config(short_text), {64}); }),
               Contains("short.txt (its first 90%, training): 45 tokens"));
  std::string latin1 =
      write(dir, "latin1.txt", std::string(40, 'a') + "\xe9" + std::string(40, 'b'));
  REQUIRE_THAT(config_error([&] { load_data(text_config(latin1), {4}); }),
               Contains("latin1.txt: byte 40 (0xe9) is not valid UTF-8"));
  std::string big = tokens_file(dir, "big.bin", {1, 2, 3, 70, 4, 5, 6, 7, 8, 9, 10, 11});
  DataConfig tokens =
      parse(R"({"source": "tokens", "path": ")" + big + R"(", "vocabulary_size": 65})");
  REQUIRE_THAT(config_error([&] { load_data(tokens, {2}); }),
               Contains("big.bin: token 3 is 70, not below vocabulary_size 65"));
  std::string odd = write(dir, "odd.bin", "abc");
  tokens.path = odd;
  REQUIRE_THAT(config_error([&] { load_data(tokens, {2}); }),
               Contains("odd.bin: 3 bytes is not a whole number of token ids"));
  tokens.path = write(dir, "empty.bin", "");
  REQUIRE_THAT(config_error([&] { load_data(tokens, {2}); }),
               Contains("empty.bin: the file is empty"));
  tokens.path = dir.path() + "/absent.bin";
  REQUIRE_THAT(config_error([&] { load_data(tokens, {2}); }), Contains("absent.bin: cannot open"));
  // A folder or a FIFO is refused at once (a FIFO with no writer would be waited for forever).
  tokens.path = dir.path();
  REQUIRE_THAT(config_error([&] { load_data(tokens, {2}); }),
               Contains("not a regular file (a folder)"));
  const std::string fifo = dir.path() + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  REQUIRE_THAT(config_error([&] { load_data(text_config(fifo), {2}); }),
               Contains("fifo: not a regular file (a FIFO)"));
}

TEST_CASE("text keys are checked where they are given", "[text]") {
  REQUIRE_THAT(config_error([] { parse(R"({"source": "text"})"); }), Contains("needs \"path\""));
  REQUIRE_THAT(
      config_error([] { parse(R"({"source": "text", "path": "a", "vocabulary": "words"})"); }),
      Contains("vocabulary: expected \"characters\" or \"bytes\""));
  REQUIRE_THAT(config_error([] { parse(R"({"source": "tokens", "path": "a"})"); }),
               Contains("needs \"vocabulary_size\""));
  REQUIRE_THAT(
      config_error([] { parse(R"({"source": "text", "path": "a", "vocabulary_size": 9})"); }),
      Contains("vocabulary_size: only used with \"source\": \"tokens\""));
  REQUIRE_THAT(
      config_error([] { parse(R"({"source": "npz", "path": "a", "sequence_length": 9})"); }),
      Contains("only used with \"source\": \"text\" or \"tokens\""));
  REQUIRE_THAT(config_error([] { parse(R"({"source": "text", "path": "a", "x_train": "x"})"); }),
               Contains("only used with \"source\": \"npz\""));
  REQUIRE_THAT(config_error([] { parse(R"({"source": "idx", "path": "a"})"); }),
               Contains("only used with \"source\": \"npz\", \"text\" or \"tokens\""));
  REQUIRE(parse(R"({"source": "text", "path": "a"})").validation_split == 0.1);
  REQUIRE(parse(R"({"source": "text", "path": "a", "validation_split": 0.25})").validation_split ==
          0.25);
  TempDir dir;
  std::string path = write(dir, "t.txt", std::string(200, 'a') + "b");
  DataConfig c = text_config(path);
  c.sequence_length = 16;
  REQUIRE_THAT(config_error([&] { load_data(c, {8}); }),
               Contains("data.sequence_length is 16 but model.input_shape is [8]"));
  REQUIRE_THAT(config_error([&] {
                 load_data(c, {28, 28, 1});
               }),
               Contains("model.input_shape must be [sequence_length], not [28, 28, 1]"));
  DataConfig images;
  images.source = "synthetic";
  REQUIRE_THAT(config_error([&] { load_data(images, {8}); }),
               Contains("model.input_shape [8] is a sequence of token ids"));
  Dataset train = load_data(text_config(path), {8}).first;
  REQUIRE_THAT(config_error([&] { check_labels_below(train, 1); }),
               Contains("its vocabulary has 2 tokens (characters) but the model's output has 1"));
  check_labels_below(train, 2);
}

TEST_CASE("training windows are drawn from (seed, epoch, step, example)", "[text]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 5000; ++i) text += static_cast<char>('a' + (i * 7919) % 26);
  Dataset train = load_data(text_config(write(dir, "t.txt", text)), {16}).first;
  BatchStreamOptions o;
  o.seed = 7, o.epoch = 2, o.batch_size = 4, o.steps = 10, o.worker_count = 2;
  BatchStream first(train, o);
  o.worker_index = 1;
  BatchStream second(train, o);
  std::set<int64_t> seen;
  for (int64_t step = 0; step < 10; ++step) {
    Batch a = first.batch_at(step), b = second.batch_at(step);
    REQUIRE(a.labels.size() == 4 * 16);
    REQUIRE(a.images == first.batch_at(step).images);  // a pure function
    std::vector<int64_t> offsets = first.ids_at(step), theirs = second.ids_at(step);
    for (int j = 0; j < 4; ++j) {
      // Worker 1 holds examples 4..7 of the step's global batch.
      REQUIRE(offsets[j] == window_offset(train, 7, 2, step, j));
      REQUIRE(theirs[j] == window_offset(train, 7, 2, step, 4 + j));
      REQUIRE(offsets[j] >= 0);
      REQUIRE(offsets[j] + 16 < train.token_count);
      seen.insert(offsets[j]);
      for (int t = 0; t < 16; ++t) {
        REQUIRE(a.images[j * 16 + t] == static_cast<float>(train.tokens.get()[offsets[j] + t]));
        REQUIRE(a.labels[j * 16 + t] == train.tokens.get()[offsets[j] + t + 1]);
      }
    }
  }
  REQUIRE(seen.size() > 30);  // 40 draws over 4,483 offsets: almost all distinct
  REQUIRE(window_offset(train, 7, 3, 0, 0) != window_offset(train, 7, 2, 0, 0));
}

TEST_CASE("tiny-shakespeare: 65 characters, nanoGPT's split", "[text]") {
  auto [train, test] = load_data(text_config(shakespeare()), {64});
  REQUIRE(train.classes == 65);
  REQUIRE(train.token_count == 1003854);
  REQUIRE(test.token_count == 111540);
  REQUIRE(train.symbols.front() == "\n");
  REQUIRE(train.symbols[1] == " ");
  REQUIRE(test.count == (111540 - 1) / 64);
  std::vector<float> x(64);
  copy_nchw(train, 0, 1, x.data());
  std::string first;
  for (float id : x) first += train.symbols[static_cast<size_t>(id)];
  REQUIRE(first.rfind("First Citizen:\nBefore we proceed any further, hear me speak.", 0) == 0);
}
