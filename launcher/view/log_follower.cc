// See log_follower.h. Linux only: inotify for wake-ups, pread() for reading at an offset.
#include "launcher/view/log_follower.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <tuple>
#include <utility>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/json.h"

namespace dtrain::launcher {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr size_t kChunkBytes = 64 * 1024;
constexpr int kPollMs = 100;
constexpr auto kStateCheckInterval = std::chrono::milliseconds(250);

/// chief, workers, other types, evaluator.
int type_rank(const std::string& type) {
  if (type == common::kChief) return 0;
  if (type == common::kWorker) return 1;
  if (type == common::kEvaluator) return 3;
  return 2;
}

bool prints_before(const LogFile& a, const LogFile& b) {
  return std::make_tuple(type_rank(a.task.type), a.task.type, a.task.index) <
         std::make_tuple(type_rank(b.task.type), b.task.type, b.task.index);
}

bool is_regular_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

}  // namespace

std::optional<common::TaskId> parse_log_file_name(const std::string& name) {
  const std::string suffix = ".log";
  if (name.size() <= suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  std::string stem = name.substr(0, name.size() - suffix.size());
  size_t dash = stem.rfind('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 == stem.size()) return std::nullopt;
  std::string type = stem.substr(0, dash);
  std::string digits = stem.substr(dash + 1);
  bool type_ok = std::all_of(type.begin(), type.end(),
                             [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; });
  bool digits_ok = digits.size() <= 9 && std::all_of(digits.begin(), digits.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
  if (!type_ok || !digits_ok) return std::nullopt;
  return common::TaskId{type, std::stoi(digits)};
}

std::vector<LogFile> find_log_files(const common::RunDir& run) {
  std::vector<LogFile> files;
  std::error_code ec;
  for (fs::directory_iterator it(run.logs_dir(), ec), end; !ec && it != end; it.increment(ec)) {
    std::optional<common::TaskId> task = parse_log_file_name(it->path().filename().string());
    std::error_code type_ec;
    if (task && it->is_regular_file(type_ec)) files.push_back({*task, it->path().string()});
  }
  std::sort(files.begin(), files.end(), prints_before);
  return files;
}

bool run_is_over(const common::RunDir& run) {
  try {
    std::string text = common::read_file(run.state_json());
    common::JsonDocument doc = common::JsonDocument::parse(text, run.state_json());
    common::JsonNode root = doc.root();
    if (!root.is_object()) return false;
    std::optional<common::JsonNode> status = root.find("status");
    if (status && status->is_string() && common::is_final_status(status->as_string())) return true;
    if (std::optional<common::JsonNode> pid = root.find("launcher_pid")) {
      auto value = static_cast<pid_t>(pid->as_int(1, std::numeric_limits<pid_t>::max()));
      if (::kill(value, 0) != 0 && errno == ESRCH) return true;
    }
  } catch (const common::IoError&) {
    // Not written yet, or being replaced: keep following.
  } catch (const common::ConfigError&) {
    // Not (yet) what the launcher writes: keep following.
  }
  return false;
}

// ---- LogLineSplitter ----

void LogLineSplitter::feed(std::string_view bytes, std::vector<std::string>& out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t end = bytes.find_first_of("\r\n", pos);
    if (end == std::string_view::npos) end = bytes.size();
    if (end > pos) {
      partial_.append(bytes.substr(pos, end - pos));
      after_cr_ = false;
    }
    if (end == bytes.size()) return;
    char terminator = bytes[end];
    bool adds_no_line = partial_.empty() && (terminator == '\r' || after_cr_);
    if (!adds_no_line) out.push_back(std::move(partial_));
    partial_.clear();
    after_cr_ = terminator == '\r';
    pos = end + 1;
  }
}

std::optional<std::string> LogLineSplitter::take_partial() {
  if (partial_.empty()) return std::nullopt;
  return std::exchange(partial_, std::string());
}

// ---- LogReader ----

LogReader::LogReader(LogFile file, const LogFilter* filter)
    : file_(std::move(file)), filter_(filter && filter->active() ? filter : nullptr) {
  fd_.reset(::open(file_.path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd_.valid()) {
    throw common::IoError(
        fmt::format("cannot open log file {}: {}", file_.path, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd_.get(), &st) == 0) {
    auto since_epoch =
        std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec);
    clock_.modified = WallTime(std::chrono::duration_cast<WallTime::duration>(since_epoch));
  }
}

uint64_t LogReader::file_size() const {
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) {
    throw common::IoError(fmt::format("cannot stat {}: {}", file_.path, std::strerror(errno)));
  }
  return static_cast<uint64_t>(st.st_size);
}

std::string LogReader::read_range(uint64_t begin, uint64_t end) const {
  std::string bytes(end - begin, '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::pread(fd_.get(), bytes.data() + done, bytes.size() - done,
                        static_cast<off_t>(begin + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw common::IoError(fmt::format("cannot read {}: {}", file_.path, std::strerror(errno)));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

void LogReader::send(const std::string& line, LineSink& sink) {
  if (!filter_ || filter_->keep(line, clock_)) sink.line(file_.task, line);
}

void LogReader::read_filtered_tail(std::optional<size_t> max_lines, LineSink& sink,
                                   bool rest_is_a_line) {
  std::deque<std::string> kept;
  auto take = [&](std::string& line) {
    if (!filter_->keep(line, clock_)) return;
    if (!max_lines) return sink.line(file_.task, line);
    kept.push_back(std::move(line));
    if (kept.size() > *max_lines) kept.pop_front();
  };
  read_lines(take);
  if (rest_is_a_line) {
    if (std::optional<std::string> rest = splitter_.take_partial()) take(*rest);
  }
  for (const std::string& line : kept) sink.line(file_.task, line);
}

void LogReader::read_tail(std::optional<size_t> max_lines, LineSink& sink, bool rest_is_a_line) {
  if (filter_) return read_filtered_tail(max_lines, sink, rest_is_a_line);
  if (!max_lines) {
    read_lines([&](std::string& line) { sink.line(file_.task, line); });
    if (rest_is_a_line) flush_partial(sink);
    return;
  }
  uint64_t end = file_size();
  // Read a growing span back from the end until it holds max_lines lines that surely begin at a
  // line start (the span's first, possibly cut, segment is skipped), or the whole file.
  for (uint64_t span = kChunkBytes;; span *= 2) {
    uint64_t begin = end > span ? end - span : 0;
    std::string bytes = read_range(begin, end);
    size_t from = 0;
    bool after_cr = false;
    if (begin > 0) {
      size_t cut = bytes.find_first_of("\r\n");
      if (cut == std::string::npos) continue;
      from = cut + 1;
      after_cr = bytes[cut] == '\r';
    }
    LogLineSplitter splitter(after_cr);
    std::vector<std::string> lines;
    splitter.feed(std::string_view(bytes).substr(from), lines);
    std::optional<std::string> rest = rest_is_a_line ? splitter.take_partial() : std::nullopt;
    if (rest) lines.push_back(std::move(*rest));
    if (begin > 0 && lines.size() < *max_lines) continue;
    size_t first = lines.size() > *max_lines ? lines.size() - *max_lines : 0;
    for (size_t i = first; i < lines.size(); ++i) sink.line(file_.task, lines[i]);
    splitter_ = std::move(splitter);
    offset_ = begin + bytes.size();
    return;
  }
}

void LogReader::read_new(LineSink& sink) {
  clock_.live = true;
  read_lines([&](std::string& line) { send(line, sink); });
}

void LogReader::read_lines(const std::function<void(std::string&)>& take) {
  std::string buffer(kChunkBytes, '\0');
  std::vector<std::string> lines;
  while (true) {
    ssize_t n = ::pread(fd_.get(), buffer.data(), buffer.size(), static_cast<off_t>(offset_));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw common::IoError(fmt::format("cannot read {}: {}", file_.path, std::strerror(errno)));
    }
    if (n == 0) return;
    offset_ += static_cast<uint64_t>(n);
    lines.clear();
    splitter_.feed(std::string_view(buffer.data(), static_cast<size_t>(n)), lines);
    for (std::string& line : lines) take(line);
  }
}

void LogReader::flush_partial(LineSink& sink) {
  if (std::optional<std::string> rest = splitter_.take_partial()) send(*rest, sink);
}

// ---- LogFollower ----

/// inotify on the run directory (for logs/ appearing) and on logs/ (files created or appended).
/// Invalid when inotify is unavailable; the follower then wakes on its poll interval only.
class LogFollower::Watcher {
 public:
  explicit Watcher(const common::RunDir& run) : logs_dir_(run.logs_dir()) {
    fd_.reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    if (fd_.valid()) ::inotify_add_watch(fd_.get(), run.root().c_str(), IN_CREATE | IN_MOVED_TO);
    refresh();
  }
  int fd() const { return fd_.get(); }
  /// Adds the watch on logs/ once that folder exists.
  void refresh() {
    if (!fd_.valid() || logs_watched_) return;
    uint32_t mask = IN_CREATE | IN_MODIFY | IN_MOVED_TO | IN_CLOSE_WRITE;
    logs_watched_ = ::inotify_add_watch(fd_.get(), logs_dir_.c_str(), mask) >= 0;
  }
  /// Reads and drops pending events: every wake-up rescans everything anyway.
  void drain() {
    alignas(inotify_event) char buffer[4096];
    while (fd_.valid() && ::read(fd_.get(), buffer, sizeof buffer) > 0) {
    }
  }

 private:
  std::string logs_dir_;
  common::UniqueFd fd_;
  bool logs_watched_ = false;
};

LogFollower::LogFollower(common::RunDir run, std::optional<common::TaskId> only, LineSink& sink,
                         const LogFilter* filter)
    : run_(std::move(run)), only_(std::move(only)), sink_(sink), filter_(filter) {}

LogFollower::~LogFollower() = default;

std::vector<LogFile> LogFollower::present_files() const {
  if (!only_) return find_log_files(run_);
  if (!is_regular_file(run_.log_file(*only_))) return {};
  return {LogFile{*only_, run_.log_file(*only_)}};
}

void LogFollower::discover(std::optional<size_t> max_lines) {
  for (LogFile& file : present_files()) {
    auto known = std::find_if(readers_.begin(), readers_.end(),
                              [&](const LogReader& r) { return r.file().path == file.path; });
    if (known != readers_.end()) continue;
    auto at = std::upper_bound(
        readers_.begin(), readers_.end(), file,
        [](const LogFile& f, const LogReader& r) { return prints_before(f, r.file()); });
    at = readers_.emplace(at, std::move(file), filter_);
    at->read_tail(max_lines, sink_);
  }
}

void LogFollower::read_all() {
  for (LogReader& reader : readers_) reader.read_new(sink_);
}

size_t LogFollower::print(std::optional<size_t> max_lines) {
  std::vector<LogFile> files = present_files();
  for (LogFile& file : files) {
    LogReader reader(std::move(file), filter_);
    reader.read_tail(max_lines, sink_, /*rest_is_a_line=*/true);
  }
  sink_.flush();
  return files.size();
}

bool LogFollower::wait(Watcher& watcher, int stop_fd, int timeout_ms) {
  pollfd fds[2] = {};
  nfds_t count = 0;
  if (watcher.fd() >= 0) fds[count++] = {watcher.fd(), POLLIN, 0};
  int stop_index = -1;
  if (stop_fd >= 0) {
    stop_index = static_cast<int>(count);
    fds[count++] = {stop_fd, POLLIN, 0};
  }
  int rc = ::poll(fds, count, timeout_ms);
  if (rc < 0 && errno != EINTR) {
    throw common::IoError(fmt::format("logs: poll failed: {}", std::strerror(errno)));
  }
  watcher.drain();
  watcher.refresh();
  return !(rc > 0 && stop_index >= 0 && (fds[stop_index].revents & (POLLIN | POLLHUP)) != 0);
}

void LogFollower::follow(std::optional<size_t> max_lines, int stop_fd) {
  Watcher watcher(run_);
  discover(max_lines);
  sink_.flush();
  Clock::time_point next_check = Clock::now();
  while (true) {
    Clock::time_point now = Clock::now();
    if (now >= next_check) {
      if (run_is_over(run_)) break;
      next_check = now + kStateCheckInterval;
    }
    auto until_check =
        std::chrono::duration_cast<std::chrono::milliseconds>(next_check - now).count();
    int timeout_ms = static_cast<int>(std::clamp<int64_t>(until_check, 0, kPollMs));
    bool go_on = wait(watcher, stop_fd, timeout_ms);
    discover(std::nullopt);  // files that appear while following are read from their start
    read_all();
    sink_.flush();
    if (!go_on) break;
  }
  discover(std::nullopt);
  read_all();
  for (LogReader& reader : readers_) reader.flush_partial(sink_);
  sink_.flush();
}

}  // namespace dtrain::launcher
