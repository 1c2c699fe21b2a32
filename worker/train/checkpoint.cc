// See checkpoint.h. Metadata values are strings (safetensors' rule); numbers are written with
// %.17g so they read back exactly.
#include "worker/train/checkpoint.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
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

TrainingState state_of(const std::map<std::string, std::string>& m, const std::string& path) {
  auto get = [&](const char* key) {
    auto it = m.find(key);
    if (it == m.end()) throw common::IoError(fmt::format("{}: metadata has no \"{}\"", path, key));
    return it->second;
  };
  if (get("format") != kFormat || get("format_version") != kFormatVersion) {
    throw common::IoError(
        fmt::format("{}: not a dtrain checkpoint of format version {}", path, kFormatVersion));
  }
  TrainingState s;
  s.epoch = std::stoll(get("epoch"));
  s.step = std::stoll(get("step"));
  s.global_step = std::stoll(get("global_step"));
  s.optimizer_iterations = std::stoll(get("optimizer_iterations"));
  s.epoch_loss_sum = std::stod(get("epoch_loss_sum"));
  s.epoch_correct = std::stod(get("epoch_correct"));
  s.epoch_seen = std::stod(get("epoch_seen"));
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

SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 8)
    throw common::IoError(fmt::format("{}: truncated ({} bytes)", path, bytes.size()));
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i)
    length |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[static_cast<size_t>(i)]))
              << (8 * i);
  if (length > bytes.size() - 8) throw common::IoError(fmt::format("{}: truncated header", path));
  const char* data = bytes.data() + 8 + length;
  size_t data_size = bytes.size() - 8 - length;
  SafetensorsFile file;
  try {
    common::JsonDocument doc =
        common::JsonDocument::parse(std::string_view(bytes.data() + 8, length), path);
    for (const auto& [name, node] : doc.root().as_object()) {
      if (name == "__metadata__") {
        for (const auto& [key, value] : node.as_object()) file.metadata[key] = value.as_string();
        continue;
      }
      if (node.at("dtype").as_string() != "F32") node.fail("only F32 tensors are supported");
      Tensor t;
      size_t elements = 1;
      for (const common::JsonNode& d : node.at("shape").as_array()) {
        t.shape.push_back(d.as_int(0, int64_t{1} << 40));
        elements *= static_cast<size_t>(t.shape.back());
      }
      std::vector<common::JsonNode> offsets = node.at("data_offsets").as_array();
      size_t begin = static_cast<size_t>(offsets.at(0).as_int(0, int64_t{1} << 50));
      size_t end = static_cast<size_t>(offsets.at(1).as_int(0, int64_t{1} << 50));
      if (end < begin || end > data_size || end - begin != elements * sizeof(float))
        node.fail("bad data_offsets");
      t.data.resize(elements);
      std::memcpy(t.data.data(), data + begin, end - begin);
      file.tensors[name] = std::move(t);
    }
  } catch (const common::ConfigError& e) {
    throw common::IoError(fmt::format("{}: bad header: {}", path, e.what()));
  }
  std::string expected = fmt::format("crc32:{:08x}", checksum_of(file.metadata, data, data_size));
  if (file.metadata["checksum"] != expected) {
    throw common::IoError(fmt::format("{}: checksum mismatch (file says {}, data gives {})", path,
                                      file.metadata["checksum"], expected));
  }
  return file;
}

CheckpointStore::CheckpointStore(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

std::string CheckpointStore::save(const TrainingState& state,
                                  const std::vector<TensorView>& tensors,
                                  const std::string& architecture) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw common::IoError(fmt::format("cannot create {}: {}", dir_, ec.message()));
  std::string name = fmt::format("ckpt-{:010}.safetensors", state.global_step);
  common::write_file_atomically(dir_ + "/" + name,
                                encode_safetensors(tensors, state_metadata(state, architecture)));
  std::vector<std::string> all = candidates();  // newest first, the new one included
  common::JsonWriter index;
  index.begin_object().key("latest").value(name).key("all").begin_array();
  for (size_t i = 0; i < all.size() && i < static_cast<size_t>(keep_); ++i) index.value(all[i]);
  common::write_file_atomically(dir_ + "/" + kIndex, index.end_array().end_object().str() + "\n");
  for (size_t i = static_cast<size_t>(keep_); i < all.size(); ++i)
    fs::remove(dir_ + "/" + all[i], ec);
  return dir_ + "/" + name;
}

// Checkpoint files in the folder, newest (highest global step) first. The index only says
// which is newest; the folder is the truth, so a lost or damaged index loses nothing.
std::vector<std::string> CheckpointStore::candidates() const {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::string n = entry.path().filename().string();
    if (n.rfind("ckpt-", 0) == 0 && n.size() > 17 && n.substr(n.size() - 12) == ".safetensors")
      names.push_back(n);
  }
  std::sort(names.rbegin(), names.rend());
  return names;
}

std::optional<LoadedCheckpoint> CheckpointStore::load_latest(
    const std::string& architecture) const {
  for (const std::string& name : candidates()) {
    std::string path = dir_ + "/" + name;
    try {
      SafetensorsFile file = decode_safetensors(common::read_file(path), path);
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

void CheckpointStore::remove_all() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
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
