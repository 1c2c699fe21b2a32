// Reading a run's worker logs for `dtrain logs`: finding logs/<type>-<index>.log, the last lines
// of a file, new lines as they are appended (inotify, with a short poll as the fallback), and
// whether the run is over (state.json, launcher pid). Knows no command line, prefixes or colour:
// lines go to a LineSink. Log files are append-only; nothing here handles truncation. Which
// lines pass --since/--grep is LogFilter's (log_filter.h); here only where it is applied.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/cluster_spec.h"
#include "common/run_dir.h"
#include "common/unique_fd.h"
#include "launcher/view/log_filter.h"

namespace dtrain::launcher {

/// One log file of a run.
struct LogFile {
  common::TaskId task;
  std::string path;
};

/// "worker-1.log" -> {"worker", 1}; nullopt for any other name (no index, other suffix, ...).
std::optional<common::TaskId> parse_log_file_name(const std::string& name);

/// The log files under run.logs_dir() in printing order: chief, workers by index, other types,
/// evaluator. Empty when logs/ does not exist. Throws nothing.
std::vector<LogFile> find_log_files(const common::RunDir& run);

/// True when state.json's "status" is final (common::is_final_status), or its "launcher_pid" is
/// no longer alive (kill(pid, 0) fails with ESRCH). A missing or unreadable state.json is "not
/// over": the launcher may not have written it yet. Throws nothing; does not block.
bool run_is_over(const common::RunDir& run);

/// Cuts log bytes into lines for printing, at '\n' and '\r'. "\r\n" is one line end, and a '\r'
/// that ends an empty segment adds no line, so a progress bar's leading '\r' adds no blank line.
/// Bytes after the last line end are held until their end arrives.
/// (launcher/process/line_splitter.h is the writing side's splitter: it keeps every byte and
/// terminator.)
class LogLineSplitter {
 public:
  /// after_cr: the byte before the first one fed was '\r' (so a leading '\n' ends nothing).
  explicit LogLineSplitter(bool after_cr = false) : after_cr_(after_cr) {}

  /// Appends each line completed by bytes to out, without its line end.
  void feed(std::string_view bytes, std::vector<std::string>& out);
  /// The held unterminated rest, if not empty; it is cleared.
  std::optional<std::string> take_partial();

 private:
  std::string partial_;
  bool after_cr_;
};

/// Receives lines in printing order. Called on the caller's thread only.
class LineSink {
 public:
  virtual ~LineSink() = default;
  virtual void line(const common::TaskId& task, std::string_view text) = 0;
  /// End of a batch of lines: the moment to flush output.
  virtual void flush() = 0;
};

/// Reads one log file: its last lines, then what is appended, keeping a byte offset and the
/// partial last line. Owns the file descriptor. Reads never block beyond disk I/O. With an
/// active filter only the lines it keeps are sent, and "the last lines" are the last kept ones.
class LogReader {
 public:
  /// Opens file.path; throws IoError naming it when it cannot be opened. filter (may be null)
  /// must outlive the reader.
  explicit LogReader(LogFile file, const LogFilter* filter = nullptr);

  const LogFile& file() const { return file_; }
  /// Sends the last max_lines complete lines (all when nullopt) to sink and moves the offset to
  /// the end; the unterminated rest is held, or, with rest_is_a_line (reading once, not
  /// following), counted as the last line and sent. Reads only the end of a big file, unless
  /// a filter is active: then the whole file, since a line's time may be an earlier line's.
  void read_tail(std::optional<size_t> max_lines, LineSink& sink, bool rest_is_a_line = false);
  /// Sends the lines completed by bytes appended since the last read; from now on the filter
  /// takes lines without a time of their own as written when they are read.
  void read_new(LineSink& sink);
  /// Sends the held partial line, if any, as a line of its own.
  void flush_partial(LineSink& sink);

 private:
  std::string read_range(uint64_t begin, uint64_t end) const;
  uint64_t file_size() const;
  /// Reads from the offset to the end, handing each completed line to take.
  void read_lines(const std::function<void(std::string&)>& take);
  /// read_tail with an active filter: every line from the offset, the last max_lines kept.
  void read_filtered_tail(std::optional<size_t> max_lines, LineSink& sink, bool rest_is_a_line);
  /// Sends line unless the filter drops it.
  void send(const std::string& line, LineSink& sink);

  LogFile file_;
  const LogFilter* filter_;
  LineClock clock_;
  common::UniqueFd fd_;
  uint64_t offset_ = 0;
  LogLineSplitter splitter_;
};

/// Prints the log files of one run to a sink: once, or following them until the run is over.
/// Single-threaded; the sink must outlive it.
class LogFollower {
 public:
  /// only: the one task whose log to read; nullopt for every log file of the run. filter (may
  /// be null) must outlive the follower.
  LogFollower(common::RunDir run, std::optional<common::TaskId> only, LineSink& sink,
              const LogFilter* filter = nullptr);
  ~LogFollower();
  LogFollower(const LogFollower&) = delete;
  LogFollower& operator=(const LogFollower&) = delete;

  /// Sends the last max_lines lines (all when nullopt) of each file present now, a final
  /// unterminated line included, in file order; flushes. Returns the number of files read.
  size_t print(std::optional<size_t> max_lines);

  /// Sends the last max_lines lines of each file present now, then every new complete line of
  /// those and of files that appear later, until run_is_over() (checked every 250 ms) or until
  /// stop_fd (if >= 0) is readable; then sends what is left, held partial lines included.
  /// Flushes after each batch. Wakes on inotify events or every 100 ms at the latest, so a line
  /// is sent within ~100 ms of being written. Runs as long as the run does: no overall time-out.
  void follow(std::optional<size_t> max_lines, int stop_fd);

 private:
  class Watcher;

  /// The selected log files that exist now, in printing order.
  std::vector<LogFile> present_files() const;
  /// Opens readers for files not seen before; new ones are read from max_lines back.
  void discover(std::optional<size_t> max_lines);
  void read_all();
  /// Waits for a change or the poll interval; false when stop_fd became readable.
  bool wait(Watcher& watcher, int stop_fd, int timeout_ms);

  common::RunDir run_;
  std::optional<common::TaskId> only_;
  LineSink& sink_;
  const LogFilter* filter_;
  std::vector<LogReader> readers_;
};

}  // namespace dtrain::launcher
