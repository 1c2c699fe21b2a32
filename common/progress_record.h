// A training worker's progress record (docs/design.md#frozen-workers): 64 bytes in a file the
// launcher names in DTRAIN_PROGRESS_FILE, mapped shared by the worker, which updates it with plain
// atomic stores at every collective and step (no system call). The launcher reads it without the
// worker's help, so a stopped, deadlocked or cut-off worker is found by what its record stopped
// saying, and the rank the others wait for by how far its count of collectives lags theirs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dtrain::common {

/// The file's bytes, little-endian (x86-64 and arm64 Linux), 64 in all.
struct ProgressRecord {
  uint32_t magic;        ///< kProgressMagic
  uint32_t version;      ///< 1
  uint32_t pid;          ///< the writer
  uint32_t generation;   ///< of the group it is in
  uint64_t begun;        ///< collectives begun (every rank begins the same sequence)
  uint64_t ended;        ///< collectives ended (returned or failed); begun - ended = 1: inside one
  uint64_t global_step;  ///< steps finished
  uint64_t step_micros;  ///< the last step's wall time in microseconds (0 before one)
  uint64_t phase;        ///< a ProgressPhase (0 in records written before it existed)
  uint64_t reserved;
};
static_assert(sizeof(ProgressRecord) == 64, "the progress record is 64 bytes");

inline constexpr uint32_t kProgressMagic = 0x52505444;  // "DTPR"

/// What the worker does between its collectives. A busy phase may run long without a collective
/// (a checkpoint on a slow disk, validation), and the launcher's freeze watch does not count it
/// against the worker.
enum class ProgressPhase : uint32_t {
  kStepping = 0,    ///< training steps (and everything not named below)
  kSaving = 1,      ///< writing a checkpoint, the final model or the epoch's files
  kValidating = 2,  ///< evaluating the validation data
};

/// A record's phase field as this launcher reads it: a value it does not know is some busy phase
/// of a newer worker.
inline ProgressPhase progress_phase(uint64_t value) {
  return value <= static_cast<uint64_t>(ProgressPhase::kValidating)
             ? static_cast<ProgressPhase>(value)
             : ProgressPhase::kSaving;
}

/// What the launcher reads of a record.
struct ProgressSample {
  int pid = 0;
  int generation = 0;
  uint64_t begun = 0, ended = 0, global_step = 0;
  double step_seconds = 0;
  ProgressPhase phase = ProgressPhase::kStepping;
  bool in_collective() const { return begun > ended; }
  bool busy() const { return phase != ProgressPhase::kStepping; }
};

/// The worker's side. Not thread-safe: one thread (the trainer's) writes.
class ProgressRecordWriter {
 public:
  /// Creates or truncates path (mode 0600) and maps it. An empty path makes a writer that writes
  /// nothing. Throws IoError naming the path when it cannot.
  explicit ProgressRecordWriter(const std::string& path);
  ~ProgressRecordWriter();
  ProgressRecordWriter(const ProgressRecordWriter&) = delete;
  ProgressRecordWriter& operator=(const ProgressRecordWriter&) = delete;

  void set_generation(int generation);
  void begin_collective();
  void end_collective();
  void finished_step(int64_t global_step, double seconds);
  void set_phase(ProgressPhase phase);

 private:
  ProgressRecord* record_ = nullptr;
};

/// Marks a busy phase on a writer (may be null) for as long as it lives, then stepping again.
class BusyPhase {
 public:
  BusyPhase(ProgressRecordWriter* writer, ProgressPhase phase) : writer_(writer) {
    if (writer_) writer_->set_phase(phase);
  }
  ~BusyPhase() {
    if (writer_) writer_->set_phase(ProgressPhase::kStepping);
  }
  BusyPhase(const BusyPhase&) = delete;
  BusyPhase& operator=(const BusyPhase&) = delete;

 private:
  ProgressRecordWriter* writer_;
};

/// The record at path; nullopt when there is none (yet), it is short, or not a record.
std::optional<ProgressSample> read_progress_record(const std::string& path);

}  // namespace dtrain::common
