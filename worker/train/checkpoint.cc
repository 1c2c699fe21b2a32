// See checkpoint.h. Metadata values are strings (safetensors' rule); numbers are written with
// %.17g so they read back exactly.
#include "worker/train/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/json.h"

namespace dtrain::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "dtrain-checkpoint";
constexpr const char* kFormatVersion = "1";
constexpr const char* kIndex = "checkpoint.json";
constexpr int64_t kMaxEpochs = int64_t{1} << 20;  ///< train.epochs' own limit
constexpr int64_t kMaxSteps = int64_t{1} << 50;
/// The Python safetensors package's limit too; dtrain's headers are a few KB.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

uint32_t checksum_of(const std::map<std::string, std::string>& metadata, const char* data,
                     size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& [key, value] : metadata) {
    if (key == "checksum") continue;
    std::string entry = key + "=" + value + "\n";
    crc = crc32(crc, reinterpret_cast<const Bytef*>(entry.data()), static_cast<uInt>(entry.size()));
  }
  for (size_t done = 0; done < size;) {  // crc32 takes at most uInt bytes at a time
    uInt chunk = static_cast<uInt>(std::min<size_t>(size - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data + done), chunk);
    done += chunk;
  }
  return static_cast<uint32_t>(crc);
}

std::string number(double v) {
  return fmt::format("{:.17g}", v);
}

std::map<std::string, std::string> state_metadata(const TrainingState& s,
                                                  const std::string& architecture) {
  return {{"format", kFormat},
          {"format_version", kFormatVersion},
          {"architecture", architecture},
          {"epoch", std::to_string(s.epoch)},
          {"step", std::to_string(s.step)},
          {"global_step", std::to_string(s.global_step)},
          {"optimizer_iterations", std::to_string(s.optimizer_iterations)},
          {"epoch_loss_sum", number(s.epoch_loss_sum)},
          {"epoch_correct", number(s.epoch_correct)},
          {"epoch_seen", number(s.epoch_seen)}};
}

// Metadata value key of a checkpoint as an integer in [0, max]: the checksum only proves the file
// is as written, not that whoever wrote it was dtrain.
const std::string& value_of(const std::map<std::string, std::string>& m, const char* key,
                            const std::string& path) {
  auto it = m.find(key);
  if (it == m.end()) throw common::IoError(fmt::format("{}: metadata has no \"{}\"", path, key));
  return it->second;
}

int64_t integer_of(const std::map<std::string, std::string>& m, const char* key, int64_t max,
                   const std::string& path) {
  const std::string& text = value_of(m, key, path);
  int64_t value = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0 || value > max) {
    throw common::IoError(
        fmt::format("{}: metadata \"{}\": expected an integer from 0 to {}, "
                    "found \"{}\"",
                    path, key, max, text.substr(0, 40)));
  }
  return value;
}

// Metadata value key as a finite number >= 0 (a running sum of losses, hits or examples).
double sum_of(const std::map<std::string, std::string>& m, const char* key,
              const std::string& path) {
  const std::string& text = value_of(m, key, path);
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value) || value < 0) {
    throw common::IoError(fmt::format("{}: metadata \"{}\": expected a number >= 0, found \"{}\"",
                                      path, key, text.substr(0, 40)));
  }
  return value;
}

TrainingState state_of(const std::map<std::string, std::string>& m, const std::string& path) {
  auto format = m.find("format"), version = m.find("format_version");
  if (format == m.end() || format->second != kFormat || version == m.end() ||
      version->second != kFormatVersion) {
    throw common::IoError(
        fmt::format("{}: not a dtrain checkpoint of format version {}", path, kFormatVersion));
  }
  TrainingState s;
  s.epoch = integer_of(m, "epoch", kMaxEpochs, path);
  s.step = integer_of(m, "step", kMaxSteps, path);
  s.global_step = integer_of(m, "global_step", kMaxSteps, path);
  s.optimizer_iterations = integer_of(m, "optimizer_iterations", kMaxSteps, path);
  s.epoch_loss_sum = sum_of(m, "epoch_loss_sum", path);
  s.epoch_correct = sum_of(m, "epoch_correct", path);
  s.epoch_seen = sum_of(m, "epoch_seen", path);
  if (s.step > s.global_step) {
    throw common::IoError(fmt::format("{}: step {} of its epoch is past its global step {}", path,
                                      s.step, s.global_step));
  }
  return s;
}

}  // namespace

std::string encode_safetensors(const std::vector<TensorView>& tensors,
                               std::map<std::string, std::string> metadata) {
  std::string data;
  for (const TensorView& t : tensors)
    data.append(reinterpret_cast<const char*>(t.data), t.count * sizeof(float));
  metadata["checksum"] =
      fmt::format("crc32:{:08x}", checksum_of(metadata, data.data(), data.size()));
  common::JsonWriter w;
  w.begin_object().key("__metadata__").begin_object();
  for (const auto& [key, value] : metadata) w.key(key).value(value);
  w.end_object();
  size_t offset = 0;
  for (const TensorView& t : tensors) {
    w.key(t.name).begin_object().key("dtype").value("F32").key("shape").begin_array();
    for (int64_t d : t.shape) w.value(d);
    w.end_array().key("data_offsets").begin_array().value(static_cast<uint64_t>(offset));
    offset += t.count * sizeof(float);
    w.value(static_cast<uint64_t>(offset)).end_array().end_object();
  }
  std::string header = w.end_object().str();
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::string out(8, '\0');
  uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(length >> (8 * i));
  return out + header + data;
}

namespace {

// One tensor's entry in a safetensors header.
struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  ///< byte offsets in the data section
};

// A parsed header: what the data section must hold.
struct Header {
  std::map<std::string, std::string> metadata;
  std::vector<TensorEntry> tensors;
  size_t data_end = 0;      ///< the largest end offset: the data section's size, as promised
  uint64_t data_start = 0;  ///< where the data section begins in the file
};

TensorEntry tensor_entry(const std::string& name, const common::JsonNode& node) {
  if (node.at("dtype").as_string() != "F32") node.fail("only F32 tensors are supported");
  TensorEntry t{name, {}, 0, 0};
  uint64_t elements = 1;
  for (const common::JsonNode& d : node.at("shape").as_array()) {
    t.shape.push_back(d.as_int(0, int64_t{1} << 40));
    elements *= static_cast<uint64_t>(t.shape.back());
    if (elements > (uint64_t{1} << 40)) node.fail("shape has more than 2^40 elements");
  }
  std::vector<common::JsonNode> offsets = node.at("data_offsets").as_array();
  if (offsets.size() != 2) node.fail("data_offsets must be [begin, end]");
  t.begin = static_cast<size_t>(offsets[0].as_int(0, int64_t{1} << 50));
  t.end = static_cast<size_t>(offsets[1].as_int(0, int64_t{1} << 50));
  if (t.end < t.begin || t.end - t.begin != elements * sizeof(float)) node.fail("bad data_offsets");
  return t;
}

Header parse_header(std::string_view text, const std::string& path) {
  Header header;
  try {
    common::JsonDocument doc = common::JsonDocument::parse(text, path);
    for (const auto& [name, node] : doc.root().as_object()) {
      if (name == "__metadata__") {
        for (const auto& [key, value] : node.as_object()) header.metadata[key] = value.as_string();
        continue;
      }
      header.tensors.push_back(tensor_entry(name, node));
      header.data_end = std::max(header.data_end, header.tensors.back().end);
    }
  } catch (const common::ConfigError& e) {
    throw common::IoError(fmt::format("{}: bad header: {}", path, e.what()));
  }
  return header;
}

// The tensors of header from the data section, once its checksum matches.
SafetensorsFile assemble(Header header, const char* data, size_t data_size,
                         const std::string& path) {
  if (header.data_end > data_size) {
    throw common::IoError(fmt::format("{}: bad header: data_offsets go to byte {}, the data has {}",
                                      path, header.data_end, data_size));
  }
  std::string expected = fmt::format("crc32:{:08x}", checksum_of(header.metadata, data, data_size));
  if (header.metadata["checksum"] != expected) {
    throw common::IoError(fmt::format("{}: checksum mismatch (file says {}, data gives {})", path,
                                      header.metadata["checksum"], expected));
  }
  SafetensorsFile file;
  for (const TensorEntry& e : header.tensors) {
    Tensor t{e.shape, std::vector<float>((e.end - e.begin) / sizeof(float))};
    std::memcpy(t.data.data(), data + e.begin, e.end - e.begin);
    file.tensors[e.name] = std::move(t);
  }
  file.metadata = std::move(header.metadata);
  return file;
}

uint64_t header_length(const char* first8) {
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i)
    length |= static_cast<uint64_t>(static_cast<unsigned char>(first8[i])) << (8 * i);
  return length;
}

// The header of the file at path, read without its data section.
Header read_header(int fd, uint64_t size, const std::string& path) {
  if (size < 8) throw common::IoError(fmt::format("{}: truncated ({} bytes)", path, size));
  uint64_t length = header_length(common::read_exactly(fd, 8, path).data());
  if (length > size - 8 || length > kMaxHeaderBytes) {
    throw common::IoError(fmt::format("{}: truncated header ({} bytes announced, {} in the file)",
                                      path, length, size - 8));
  }
  Header header = parse_header(common::read_exactly(fd, static_cast<size_t>(length), path), path);
  header.data_start = 8 + length;
  return header;
}

}  // namespace

SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 8)
    throw common::IoError(fmt::format("{}: truncated ({} bytes)", path, bytes.size()));
  uint64_t length = header_length(bytes.data());
  if (length > bytes.size() - 8) throw common::IoError(fmt::format("{}: truncated header", path));
  Header header = parse_header(std::string_view(bytes.data() + 8, length), path);
  return assemble(std::move(header), bytes.data() + 8 + length, bytes.size() - 8 - length, path);
}

SafetensorsFile read_safetensors(const std::string& path) {
  uint64_t size = 0;
  common::UniqueFd fd = common::open_regular_file(path, &size);
  Header header = read_header(fd.get(), size, path);
  uint64_t data_size = size - header.data_start;
  if (data_size != header.data_end) {  // the header promises the data section's size exactly
    throw common::IoError(fmt::format("{}: the header describes {} bytes of data, the file has {}",
                                      path, header.data_end, data_size));
  }
  std::string data = common::read_exactly(fd.get(), header.data_end, path);
  return assemble(std::move(header), data.data(), data.size(), path);
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  uint64_t size = 0;
  common::UniqueFd fd = common::open_regular_file(path, &size);
  return read_header(fd.get(), size, path).metadata;
}

CheckpointStore::CheckpointStore(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

namespace {

std::string checkpoint_name(int64_t global_step) {
  return fmt::format("ckpt-{:010}.safetensors", global_step);
}

bool has_checkpoint_name(const std::string& n) {
  return n.rfind("ckpt-", 0) == 0 && n.size() > 17 && n.substr(n.size() - 12) == ".safetensors";
}

// A half-written checkpoint or index left by a kill during write_file_atomically.
bool is_temporary(const std::string& n) {
  return n.find(".tmp.") != std::string::npos &&
         (n.rfind(".ckpt-", 0) == 0 || n.rfind(std::string(".") + kIndex, 0) == 0);
}

}  // namespace

std::string CheckpointStore::save(const TrainingState& state,
                                  const std::vector<TensorView>& tensors,
                                  const std::string& architecture) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw common::IoError(fmt::format("cannot create {}: {}", dir_, ec.message()));
  std::string name = checkpoint_name(state.global_step);
  std::string path = dir_ + "/" + name;
  fs::file_status status = fs::status(path, ec);
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    throw common::ConfigError(fmt::format(
        "{}: something that is not a checkpoint file (a folder?) is in the way of this run's "
        "checkpoint; remove it",
        path));
  }
  common::write_file_atomically(path,
                                encode_safetensors(tensors, state_metadata(state, architecture)));
  std::vector<std::string> kept = prune(name, architecture);
  common::JsonWriter index;
  index.begin_object().key("latest").value(name).key("all").begin_array();
  for (const std::string& n : kept) index.value(n);
  common::write_file_atomically(dir_ + "/" + kIndex, index.end_array().end_object().str() + "\n");
  return path;
}

// Keeps the newest `keep` checkpoints of this model, the one just written first, and deletes the
// older ones of this model. A file for another model, one that cannot be read, or one of a later
// step than this run has reached is not this run's to delete: it is left alone and reported once
// (it does not count towards `keep`, so it cannot push out the checkpoints this run writes).
std::vector<std::string> CheckpointStore::prune(const std::string& written,
                                                const std::string& architecture) {
  std::vector<std::string> kept = {written};
  for (const std::string& name : candidates()) {
    if (name == written) continue;
    std::string path = dir_ + "/" + name;
    std::string why;
    try {
      auto metadata = read_safetensors_metadata(path);
      if (metadata["architecture"] != architecture) why = "it is for another model architecture";
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (why.empty() && name > written) why = "its step is later than this run's";
    if (!why.empty()) {
      if (reported_.insert(name).second)
        spdlog::warn("keeping {}, which is not this run's to prune: {}", path, why);
      continue;
    }
    if (kept.size() < static_cast<size_t>(keep_)) {
      kept.push_back(name);
    } else {
      std::error_code ec;
      fs::remove(path, ec);
    }
  }
  return kept;
}

// Checkpoint files in the folder, newest (highest global step) first. The index only says
// which is newest; the folder is the truth, so a lost or damaged index loses nothing. Only
// regular files count: a folder with a checkpoint's name is reported once and passed over.
std::vector<std::string> CheckpointStore::candidates() const {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::string n = entry.path().filename().string();
    if (!has_checkpoint_name(n)) continue;
    std::error_code type_ec;
    if (entry.is_regular_file(type_ec)) {
      names.push_back(n);
    } else if (reported_.insert(n).second) {
      spdlog::warn("skipping {}: not a regular file, so not a checkpoint", entry.path().string());
    }
  }
  std::sort(names.rbegin(), names.rend());
  return names;
}

std::optional<LoadedCheckpoint> CheckpointStore::load_latest(
    const std::string& architecture) const {
  for (const std::string& name : candidates()) {
    std::string path = dir_ + "/" + name;
    try {
      SafetensorsFile file = read_safetensors(path);
      if (file.metadata["architecture"] != architecture) {
        throw common::IoError(fmt::format("{}: written for another model architecture", path));
      }
      TrainingState state = state_of(file.metadata, path);
      return LoadedCheckpoint{path, state, std::move(file)};
    } catch (const std::exception& e) {
      spdlog::warn("skipping checkpoint {}: {}", path, e.what());
    }
  }
  return std::nullopt;
}

// Deletes only what a store writes (checkpoints, the index, their temporaries), then the folder
// if that left it empty: whatever else is in it, or wherever it points, is not the store's.
void CheckpointStore::remove_all() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::string n = entry.path().filename().string();
    std::error_code type_ec;
    bool ours = has_checkpoint_name(n) || n == kIndex || is_temporary(n);
    if (ours && !entry.is_directory(type_ec)) fs::remove(entry.path(), type_ec);
  }
  fs::remove(dir_, ec);  // fails, as it should, unless the folder is now empty
}

void restore_tensors(const LoadedCheckpoint& checkpoint, const std::vector<TensorView>& into) {
  for (const TensorView& v : into) {
    auto it = checkpoint.file.tensors.find(v.name);
    bool slot = v.name.rfind("optimizer.", 0) == 0;
    if (it == checkpoint.file.tensors.end() && slot) {  // the optimizer changed: a fresh slot
      spdlog::warn("{}: no tensor {}; it starts from zero", checkpoint.path, v.name);
      std::fill_n(const_cast<float*>(v.data), v.count, 0.0f);
      continue;
    }
    if (it == checkpoint.file.tensors.end()) {
      throw common::ConfigError(fmt::format(
          "{}: has no tensor {}, which the model needs (shape [{}]); remove the file to resume "
          "from the checkpoint before it",
          checkpoint.path, v.name, fmt::join(v.shape, ", ")));
    }
    const Tensor& t = it->second;
    if (t.shape != v.shape || t.data.size() != v.count) {
      throw common::ConfigError(fmt::format(
          "{}: tensor {} has shape [{}] ({} values), the model's is [{}] ({} values); remove the "
          "file to resume from the checkpoint before it",
          checkpoint.path, v.name, fmt::join(t.shape, ", "), t.data.size(),
          fmt::join(v.shape, ", "), v.count));
    }
    std::copy(t.data.begin(), t.data.end(), const_cast<float*>(v.data));
  }
}

void write_final_model(const std::string& model_dir, const std::vector<TensorView>& weights,
                       const std::string& architecture_json) {
  std::error_code ec;
  fs::create_directories(model_dir, ec);
  if (ec) throw common::IoError(fmt::format("cannot create {}: {}", model_dir, ec.message()));
  common::write_file_atomically(model_dir + "/model.safetensors",
                                encode_safetensors(weights, {{"format", "dtrain-model"},
                                                             {"architecture", architecture_json}}));
  common::write_file_atomically(model_dir + "/model.json", architecture_json + "\n");
}

}  // namespace dtrain::train
