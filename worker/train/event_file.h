// TensorBoard event files: TFRecord framing (length, masked CRC-32C of the length, data, masked
// CRC-32C of the data) around tensorflow.Event protobufs encoded by hand, only the fields a
// scalar summary needs, and an append-only writer that never leaves half a record behind.
// It knows nothing of Keras's tags (tensorboard.h) and does not read event files (the tests'
// read_tfevents.py does, written from the format's specification).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/unique_fd.h"

namespace dtrain::train {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF) of
/// bytes: crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view bytes);
/// TFRecord's masked CRC of bytes: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(std::string_view bytes);
/// One TFRecord: uint64 LE length, uint32 LE masked CRC of those 8 bytes, the data, uint32 LE
/// masked CRC of the data.
std::string tfrecord(std::string_view data);

/// One named float of a summary.
struct ScalarValue {
  std::string tag;
  float value = 0;
};

/// The first Event of every file: {wall_time, file_version} (TF2 writes "brain.Event:2").
std::string encode_file_version_event(double wall_time, std::string_view file_version);
/// Event{wall_time, step, summary{value...}} with every value written as TF2's tf.summary.scalar
/// writes it (Keras's TensorBoard callback): `tensor`, a rank-0 DT_FLOAT TensorProto, with
/// metadata {plugin_data {plugin_name "scalars"}, data_class DATA_CLASS_SCALAR}.
std::string encode_scalar_event(double wall_time, int64_t step,
                                const std::vector<ScalarValue>& values);

/// Seconds since the Unix epoch now, as Event.wall_time.
double wall_time_now();

/// Appends events to one file that it creates in dir (made with its parents when missing),
/// named as TF2 names them: events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n>.v2, n the
/// first number that makes the name new. Records are buffered and flush() writes them with one
/// write(2) on an O_APPEND descriptor, so the file holds whole records only: a write that
/// stops part-way (disk full) is cut back to the last whole record. The first failure (folder
/// or file not creatable, a write error) is logged once as a warning, and every later record is
/// dropped: summaries never stop training and never throw. Single-threaded; not copyable.
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::string& dir);
  /// Flushes what is buffered.
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// Buffers one event (an encoded tensorflow.Event) as a TFRecord.
  void add(std::string_view event);
  /// Writes the buffered records (one write), without fsync. Nothing to do after a failure.
  void flush();
  /// The file's path ("" when it could not be created).
  const std::string& path() const { return path_; }
  /// True once writing failed: nothing more is written.
  bool failed() const { return failed_; }

 private:
  void fail(const std::string& what, const std::string& cause);
  void open_in(const std::string& dir);

  common::UniqueFd fd_;
  std::string path_;
  std::string pending_;  ///< whole records not yet written
  uint64_t size_ = 0;    ///< bytes of whole records in the file
  bool failed_ = false;
};

}  // namespace dtrain::train
