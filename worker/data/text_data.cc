// See text_data.h. A "text" file is read whole and encoded once (ids in memory, two bytes each);
// a "tokens" file is mapped read-only and scanned once for ids out of range, never copied.
#include "worker/data/text_data.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>

#include "common/errors.h"

namespace dtrain::data {
namespace {

using common::ConfigError;

constexpr size_t kMaxVocabulary = 65536;  ///< ids are uint16

// path opened for reading, and its size: a regular file, or ConfigError (a FIFO, a device or a
// folder may never end; O_NONBLOCK so that opening a FIFO with no writer does not wait).
std::pair<int, size_t> open_regular(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw ConfigError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int error = errno;
    ::close(fd);
    throw ConfigError(fmt::format("{}: cannot stat: {}", path, std::strerror(error)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ConfigError(fmt::format("{}: not a regular file ({}); data files must be", path,
                                  S_ISDIR(st.st_mode)    ? "a folder"
                                  : S_ISFIFO(st.st_mode) ? "a FIFO"
                                                         : "a device or socket"));
  }
  return {fd, static_cast<size_t>(st.st_size)};
}

std::string read_whole(const std::string& path) {
  auto [fd, size] = open_regular(path);
  std::string bytes(size, '\0');
  size_t done = 0;
  while (done < size) {
    ssize_t got = ::read(fd, bytes.data() + done, size - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      int error = errno;
      ::close(fd);
      throw ConfigError(fmt::format("{}: cannot read: {}", path, std::strerror(error)));
    }
    if (got == 0) break;  // shorter than fstat said: it shrank while read
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  bytes.resize(done);
  return bytes;
}

// The code point starting at text[i] and its length in bytes; 0 length when it is not valid
// UTF-8 (a stray continuation byte, a truncated or overlong sequence, a surrogate, past U+10FFFF).
std::pair<uint32_t, int> decode_one(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(i);
  if (lead < 0x80) return {lead, 1};
  int length = lead >= 0xf0 && lead <= 0xf4 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc2 ? 2 : 0;
  if (lead >= 0xf5) length = 0;
  if (length == 0 || i + static_cast<size_t>(length) > text.size()) return {0, 0};
  uint32_t code = lead & (0xff >> (length + 1));
  for (int k = 1; k < length; ++k) {
    const uint8_t next = byte(i + static_cast<size_t>(k));
    if ((next & 0xc0) != 0x80) return {0, 0};
    code = (code << 6) | (next & 0x3f);
  }
  const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < smallest[length] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff))
    return {0, 0};
  return {code, length};
}

// A split of ids [first, first + count) of a shared corpus, checked to hold one window.
Dataset text_split(std::shared_ptr<const uint16_t> corpus, int64_t first, int64_t count,
                   int sequence_length, const std::string& where) {
  if (count < sequence_length + 1) {
    throw ConfigError(fmt::format(
        "{}: {} tokens, fewer than one window of sequence_length {} (+ 1 for the last label)",
        where, count, sequence_length));
  }
  Dataset data;
  data.tokens = std::shared_ptr<const uint16_t>(corpus, corpus.get() + first);
  data.token_count = count;
  data.height = sequence_length;
  data.width = data.channels = 1;
  data.count = (count - 1) / sequence_length;
  return data;
}

// The file of uint16 ids at path, mapped; every id checked below vocabulary_size.
std::pair<std::shared_ptr<const uint16_t>, int64_t> map_tokens(const std::string& path,
                                                               int vocabulary_size) {
  const auto [fd, size] = open_regular(path);
  const size_t bytes = size;  // a lambda below keeps it (C++17 captures no structured binding)
  if (bytes == 0) {
    ::close(fd);
    throw ConfigError(fmt::format("{}: the file is empty", path));
  }
  if (bytes % 2 != 0) {
    ::close(fd);
    throw ConfigError(fmt::format(
        "{}: {} bytes is not a whole number of token ids (\"source\": \"tokens\" reads uint16 "
        "ids, little-endian, as nanoGPT's train.bin)",
        path, bytes));
  }
  void* mapped = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int error = errno;
  ::close(fd);
  if (mapped == MAP_FAILED)
    throw ConfigError(fmt::format("{}: cannot map: {}", path, std::strerror(error)));
  std::shared_ptr<const uint16_t> ids(
      static_cast<const uint16_t*>(mapped),
      [bytes](const uint16_t* p) { ::munmap(const_cast<uint16_t*>(p), bytes); });
  const auto count = static_cast<int64_t>(bytes / 2);
  const uint16_t* begin = ids.get();
  const uint16_t* bad = std::find_if(begin, begin + count, [&](uint16_t id) {
    return id >= static_cast<uint32_t>(vocabulary_size);
  });
  if (bad != begin + count) {
    throw ConfigError(fmt::format("{}: token {} is {}, not below vocabulary_size {}", path,
                                  bad - begin, *bad, vocabulary_size));
  }
  return {std::move(ids), count};
}

// The last `fraction` of a corpus validates, the rest trains (both at least one window). The
// first floor(count x (1 - fraction)) tokens train, as nanoGPT's prepare.py splits.
std::pair<Dataset, Dataset> split_corpus(std::shared_ptr<const uint16_t> corpus, int64_t count,
                                         double fraction, int sequence_length,
                                         const std::string& path) {
  const auto train = static_cast<int64_t>(static_cast<double>(count) * (1 - fraction));
  const int64_t validation = count - train;
  Dataset first =
      text_split(corpus, 0, train, sequence_length,
                 fmt::format("{} (its first {:g}%, training)", path, 100 * (1 - fraction)));
  Dataset last = text_split(
      corpus, train, validation, sequence_length,
      fmt::format("{} (its last {:g}%, validation_split {:g})", path, 100 * fraction, fraction));
  return {std::move(first), std::move(last)};
}

}  // namespace

CharacterVocabulary encode_characters(const std::string& text, const std::string& where) {
  std::vector<uint32_t> codes;
  codes.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    auto [code, length] = decode_one(text, i);
    if (length == 0) {
      throw ConfigError(fmt::format(
          "{}: byte {} (0x{:02x}) is not valid UTF-8; \"vocabulary\": \"characters\" reads UTF-8 "
          "text, \"bytes\" takes any file",
          where, i, static_cast<uint8_t>(text[i])));
    }
    codes.push_back(code);
    i += static_cast<size_t>(length);
  }
  std::vector<uint32_t> sorted = codes;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  if (sorted.size() > kMaxVocabulary) {
    throw ConfigError(fmt::format(
        "{}: {} distinct characters, more than the {} token ids can name; use \"vocabulary\": "
        "\"bytes\"",
        where, sorted.size(), kMaxVocabulary));
  }
  CharacterVocabulary v;
  for (uint32_t code : sorted) {
    std::string utf8;
    if (code < 0x80) {
      utf8 += static_cast<char>(code);
    } else if (code < 0x800) {
      utf8 += static_cast<char>(0xc0 | (code >> 6));
      utf8 += static_cast<char>(0x80 | (code & 0x3f));
    } else if (code < 0x10000) {
      utf8 += static_cast<char>(0xe0 | (code >> 12));
      utf8 += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      utf8 += static_cast<char>(0x80 | (code & 0x3f));
    } else {
      utf8 += static_cast<char>(0xf0 | (code >> 18));
      utf8 += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
      utf8 += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      utf8 += static_cast<char>(0x80 | (code & 0x3f));
    }
    v.symbols.push_back(std::move(utf8));
  }
  v.ids.resize(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) {
    v.ids[i] = static_cast<uint16_t>(std::lower_bound(sorted.begin(), sorted.end(), codes[i]) -
                                     sorted.begin());
  }
  return v;
}

std::pair<Dataset, Dataset> load_text_splits(const DataConfig& config, int sequence_length,
                                             bool need_test) {
  DT_ENFORCE(sequence_length > 0, "sequence_length {}", sequence_length);
  std::pair<Dataset, Dataset> splits;
  std::vector<std::string> symbols;
  int classes = 0;
  if (config.source == "text") {
    const std::string text = read_whole(config.path);
    if (text.empty()) throw ConfigError(fmt::format("{}: the file is empty", config.path));
    auto ids = std::make_shared<std::vector<uint16_t>>();
    if (config.vocabulary == "bytes") {
      ids->assign(text.begin(), text.end());
      for (uint16_t& id : *ids) id &= 0xff;  // chars may be signed
      classes = 256;
    } else {
      CharacterVocabulary v = encode_characters(text, config.path);
      *ids = std::move(v.ids);
      symbols = std::move(v.symbols);
      classes = static_cast<int>(symbols.size());
    }
    const auto count = static_cast<int64_t>(ids->size());
    std::shared_ptr<const uint16_t> corpus(ids, ids->data());
    splits = split_corpus(corpus, count, config.validation_split, sequence_length, config.path);
  } else {
    DT_ENFORCE(config.source == "tokens", "data source {} is not text", config.source);
    classes = config.vocabulary_size;
    auto [corpus, count] = map_tokens(config.path, classes);
    if (config.validation_path.empty()) {
      splits = split_corpus(corpus, count, config.validation_split, sequence_length, config.path);
    } else {
      splits.first = text_split(corpus, 0, count, sequence_length, config.path);
      if (need_test) {
        auto [validation, validation_count] = map_tokens(config.validation_path, classes);
        splits.second =
            text_split(validation, 0, validation_count, sequence_length, config.validation_path);
      }
    }
  }
  for (Dataset* d : {&splits.first, &splits.second}) {
    d->classes = classes;
    d->vocabulary = config.source == "tokens" ? "tokens" : config.vocabulary;
    d->symbols = symbols;
    d->labels_source = config.path;
  }
  if (!config.validation_path.empty()) splits.second.labels_source = config.validation_path;
  return splits;
}

}  // namespace dtrain::data
