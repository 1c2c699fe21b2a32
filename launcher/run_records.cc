// See run_records.h.
#include "launcher/run_records.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/errors.h"

namespace dtrain::launcher {

RunRecorder::RunRecorder(common::RunDir run_dir) : run_dir_(std::move(run_dir)) {
  std::string path = run_dir_.events_jsonl();
  events_.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!events_.valid())
    throw common::IoError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
}

void RunRecorder::event(std::string_view kind,
                        const std::function<void(common::JsonWriter&)>& fields) {
  common::JsonWriter w;
  w.begin_object()
      .key("time")
      .value(common::utc_timestamp())
      .key("mono")
      .value(common::monotonic_seconds())
      .key("event")
      .value(kind);
  if (fields) fields(w);
  std::string line = w.end_object().str() + "\n";
  // One write() with O_APPEND: a line is never split, even if the launcher dies right after.
  if (::write(events_.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    throw common::IoError(
        fmt::format("cannot append to {}: {}", run_dir_.events_jsonl(), std::strerror(errno)));
  }
}

void RunRecorder::write_state(const std::string& json) {
  common::write_file_atomically(run_dir_.state_json(), json + "\n");
}

}  // namespace dtrain::launcher
