// See run_records.h.
#include "launcher/supervisor/run_records.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
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
  std::string reserve = run_dir_.reserve_file();
  common::UniqueFd fd(::open(reserve.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  int error = fd.valid() ? ::posix_fallocate(fd.get(), 0, kReserveBytes) : errno;
  if (error != 0)  // a run that cannot even set this aside still runs, as it did before
    spdlog::warn("cannot reserve {} KiB in {}: {}", kReserveBytes / 1024, reserve,
                 std::strerror(error));
}

RunRecorder::~RunRecorder() {
  release_reserve();
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
  try {
    common::append_line(events_.get(), line, run_dir_.events_jsonl());
  } catch (const common::IoError& e) {
    note_error(e.what());
  }
}

void RunRecorder::write_state(const std::string& json) {
  try {
    common::write_file_atomically(run_dir_.state_json(), json + "\n");
  } catch (const std::exception& e) {
    note_error(e.what());
  }
}

void RunRecorder::release_reserve() {
  ::unlink(run_dir_.reserve_file().c_str());
}

void RunRecorder::note_error(std::string what) {
  if (write_error_) return;  // a full disk fails every write: the first one says it
  spdlog::error("{}", what);
  write_error_ = std::move(what);
}

}  // namespace dtrain::launcher
