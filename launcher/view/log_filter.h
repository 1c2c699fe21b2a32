// `dtrain logs --since/--grep`: parsing the --since value, finding the time a log line carries,
// and deciding per line whether it is printed. Pure: no file reading, no command line; the clock
// is injected. Which lines are read (tails, following) is LogReader's (log_follower.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace re2 {
class RE2;  // <re2/re2.h>, kept out of this header
}

namespace dtrain::launcher {

using WallTime = std::chrono::system_clock::time_point;

/// Parses a --since value: a duration before now ("90s", "10m", "2h", "1d", or several, "1h30m"),
/// or a time "2026-11-25T10:00:00" / "2026-11-25 10:00:00" with optional fractional seconds and
/// an optional zone ("Z", "+01:00", "-0500"); without a zone it is local time (TZ). Throws
/// ConfigError naming the value and the accepted forms.
WallTime parse_since(const std::string& text, WallTime now);

/// Parses a whole time text as parse_since's time forms do; nullopt when it is not one.
std::optional<WallTime> parse_time(std::string_view text);

/// The time a log line starts with: "2026-11-21 19:40:01.123 I [worker 1] ..." (dtrain's spdlog
/// pattern, local time), any ISO-8601 time at the start of the line (optionally in '['), or the
/// attempt header's "... started 2026-11-21T19:45:00.123Z ====". nullopt for other lines.
std::optional<WallTime> line_time(std::string_view line);

/// The time state of one log file, for lines that carry no time of their own.
struct LineClock {
  std::optional<WallTime> last;  ///< the time of the last timed line read from the file
  WallTime modified;             ///< the file's modification time when it was opened
  bool live = false;             ///< true once lines are read as they are appended (-f)
};

/// Keeps the lines that match --grep and are not older than --since. Rule for a line without a
/// time: while following, the time it was read (it was just written); otherwise the time of the
/// last timed line before it in its file (a continuation: progress bars, tracebacks, a program's
/// print()s between log lines); before any timed line, the file's modification time (nothing in
/// a file is newer than that). Not thread-safe; const methods only read.
class LogFilter {
 public:
  /// grep: a regular expression in RE2's syntax (grep -E's, plus \d \w \s and lazy repeats; no
  /// back-references), searched for anywhere in the line's text as written in the log file, in
  /// time linear in the line's length and without recursion, so a line of megabytes is fine. An
  /// invalid one is a ConfigError naming it. now: the clock for followed lines.
  LogFilter(std::optional<WallTime> since, const std::optional<std::string>& grep,
            std::function<WallTime()> now = std::chrono::system_clock::now);

  /// False when no --since or --grep was given: every line is kept.
  bool active() const { return since_.has_value() || grep_ != nullptr; }
  bool has_since() const { return since_.has_value(); }

  /// Whether to print line; updates clock with the line's time (so call it for every line of a
  /// file, in order, kept or not).
  bool keep(std::string_view line, LineClock& clock) const;

 private:
  bool matches(std::string_view line) const;

  std::optional<WallTime> since_;
  std::shared_ptr<const re2::RE2> grep_;  ///< null: no --grep
  std::function<WallTime()> now_;
};

}  // namespace dtrain::launcher
