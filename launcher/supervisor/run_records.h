// What the launcher writes about a run besides the logs: events.jsonl (one line per spawn, exit,
// signal, restart, with wall and monotonic times; appended, never rewritten) and state.json
// (replaced atomically). Knows file formats, not supervisor logic. A failed write throws nothing
// (its callers are Asio handlers): the first failure is kept for the supervisor to act on.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "common/json.h"
#include "common/run_dir.h"
#include "common/unique_fd.h"

namespace dtrain::launcher {

class RunRecorder {
 public:
  /// Opens (creates) events.jsonl for appending and sets aside kReserveBytes in reserve_file()
  /// for the final records of a disk that fills up. Throws IoError naming the file.
  explicit RunRecorder(common::RunDir run_dir);
  /// Removes the reserve file.
  ~RunRecorder();
  RunRecorder(const RunRecorder&) = delete;
  RunRecorder& operator=(const RunRecorder&) = delete;

  static constexpr size_t kReserveBytes = 256 * 1024;

  /// Appends {"time": ..., "mono": ..., "event": kind, <fields>} as one line.
  void event(std::string_view kind, const std::function<void(common::JsonWriter&)>& fields = {});

  /// Replaces state.json with json (a complete object).
  void write_state(const std::string& json);

  /// Gives the reserved space back to the file system, so that the last event and the final
  /// state.json fit on a full disk. Call it once the workers are gone.
  void release_reserve();

  /// The first write that failed, "cannot append to <path>: <reason>"; nullopt while none has.
  const std::optional<std::string>& write_error() const { return write_error_; }

  const common::RunDir& run_dir() const { return run_dir_; }

 private:
  void note_error(std::string what);

  common::RunDir run_dir_;
  common::UniqueFd events_;
  std::optional<std::string> write_error_;
};

}  // namespace dtrain::launcher
