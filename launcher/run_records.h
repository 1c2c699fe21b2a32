// What the launcher writes about a run besides the logs: events.jsonl (one line per spawn, exit,
// signal, restart, with wall and monotonic times; appended, never rewritten) and state.json
// (replaced atomically). Knows file formats, not supervisor logic.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "common/json.h"
#include "common/run_dir.h"
#include "common/unique_fd.h"

namespace dtrain::launcher {

class RunRecorder {
 public:
  /// Opens (creates) events.jsonl for appending. Throws IoError naming the file.
  explicit RunRecorder(common::RunDir run_dir);

  /// Appends {"time": ..., "mono": ..., "event": kind, <fields>} as one line.
  void event(std::string_view kind, const std::function<void(common::JsonWriter&)>& fields = {});

  /// Replaces state.json with json (a complete object). Throws IoError.
  void write_state(const std::string& json);

  const common::RunDir& run_dir() const { return run_dir_; }

 private:
  common::RunDir run_dir_;
  common::UniqueFd events_;
};

}  // namespace dtrain::launcher
