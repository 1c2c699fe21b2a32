// See event_file.h. Field numbers are those of tensorflow/core/util/event.proto,
// tensorflow/core/framework/summary.proto and tensor.proto (TensorBoard's compat copies, which
// add Summary.Value.metadata = 9 and SummaryMetadata.data_class = 4).
#include "worker/train/event_file.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <utility>

namespace dtrain::train {
namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0u);
    table[i] = crc;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Protobuf wire types.
constexpr int kVarint = 0, kFixed64 = 1, kBytes = 2;
constexpr uint64_t kDtFloat = 1;          // tensorflow.DataType DT_FLOAT
constexpr uint64_t kDataClassScalar = 1;  // tensorboard.DataClass DATA_CLASS_SCALAR

void put_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, kBytes);
  put_varint(out, bytes.size());
  out.append(bytes);
}

void put_double(std::string& out, int field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed64);
  put_little_endian(out, bits, 8);
}

// TensorProto {dtype = 1: DT_FLOAT, tensor_shape = 2: {} (rank 0), float_val = 5: packed [v]}.
std::string scalar_tensor(float value) {
  std::string tensor, packed;
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_little_endian(packed, bits, 4);
  put_key(tensor, 1, kVarint);
  put_varint(tensor, kDtFloat);
  put_bytes(tensor, 2, "");
  put_bytes(tensor, 5, packed);
  return tensor;
}

// SummaryMetadata {plugin_data = 1: {plugin_name = 1: "scalars"}, data_class = 4: scalar}. The
// scalars plugin's content (ScalarPluginData, version 0) serializes to nothing.
std::string scalar_metadata() {
  std::string plugin_data, metadata;
  put_bytes(plugin_data, 1, "scalars");
  put_bytes(metadata, 1, plugin_data);
  put_key(metadata, 4, kVarint);
  put_varint(metadata, kDataClassScalar);
  return metadata;
}

// Event {wall_time = 1, step = 2 (omitted when 0, as proto3 does)}.
std::string event_header(double wall_time, int64_t step) {
  std::string event;
  put_double(event, 1, wall_time);
  if (step != 0) {
    put_key(event, 2, kVarint);
    put_varint(event, static_cast<uint64_t>(step));
  }
  return event;
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (char c : bytes) crc = (crc >> 8) ^ kCrc32cTable[(crc ^ static_cast<uint8_t>(c)) & 0xff];
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view bytes) {
  uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  put_little_endian(record, data.size(), 8);
  put_little_endian(record, masked_crc32c(record), 4);
  record.append(data);
  put_little_endian(record, masked_crc32c(data), 4);
  return record;
}

std::string encode_file_version_event(double wall_time, std::string_view file_version) {
  std::string event = event_header(wall_time, 0);
  put_bytes(event, 3, file_version);
  return event;
}

std::string encode_scalar_event(double wall_time, int64_t step,
                                const std::vector<ScalarValue>& values) {
  const std::string metadata = scalar_metadata();
  std::string summary;
  for (const ScalarValue& v : values) {
    std::string value;  // Summary.Value {tag = 1, tensor = 8, metadata = 9}
    put_bytes(value, 1, v.tag);
    put_bytes(value, 8, scalar_tensor(v.value));
    put_bytes(value, 9, metadata);
    put_bytes(summary, 1, value);
  }
  std::string event = event_header(wall_time, step);
  put_bytes(event, 5, summary);
  return event;
}

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  open_in(dir);
  add(encode_file_version_event(wall_time_now(), "brain.Event:2"));
}

EventFileWriter::~EventFileWriter() {
  flush();
}

void EventFileWriter::open_in(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return fail("cannot create " + dir, error.message());
  char host[256] = "localhost";
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  host[sizeof host - 1] = '\0';
  long long seconds = static_cast<long long>(wall_time_now());
  int cause = 0;
  for (int n = 0; n < 1000 && !fd_.valid(); ++n) {
    path_ = fmt::format("{}/events.out.tfevents.{:010d}.{}.{}.{}.v2", dir, seconds, host,
                        ::getpid(), n);
    fd_.reset(::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644));
    cause = errno;
    if (!fd_.valid() && cause != EEXIST) break;
  }
  if (!fd_.valid()) fail("cannot create " + std::exchange(path_, ""), std::strerror(cause));
}

void EventFileWriter::add(std::string_view event) {
  if (!failed_) pending_ += tfrecord(event);
}

void EventFileWriter::flush() {
  if (failed_ || pending_.empty()) return;
  const ssize_t written = ::write(fd_.get(), pending_.data(), pending_.size());
  if (written == static_cast<ssize_t>(pending_.size())) {
    size_ += pending_.size();
    pending_.clear();
    return;
  }
  std::string cause = written < 0 ? std::strerror(errno) : "short write (disk full?)";
  if (written > 0 && ::ftruncate(fd_.get(), static_cast<off_t>(size_)) != 0) {
    spdlog::warn("tensorboard: cannot cut {} back to its last whole record: {}", path_,
                 std::strerror(errno));
  }
  fail("cannot write to " + path_, cause);
}

void EventFileWriter::fail(const std::string& what, const std::string& cause) {
  failed_ = true;
  pending_.clear();
  fd_.reset();
  spdlog::warn("tensorboard: {}: {}; no more summaries go there in this run (training goes on)",
               what, cause);
}

}  // namespace dtrain::train
