// See log_filter.h. Times are parsed by hand (a cursor over the text) rather than with
// std::get_time, which takes no fractions or zones; local time goes through mktime (TZ).
#include "launcher/view/log_filter.h"

#include <fmt/format.h>
#include <re2/re2.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ctime>

#include "common/errors.h"
#include "common/run_dir.h"

namespace dtrain::launcher {
namespace {

using std::chrono::duration_cast;
using std::chrono::nanoseconds;
using std::chrono::seconds;

/// Reads the text left to right; every take_* leaves the position alone when it fails.
class Cursor {
 public:
  explicit Cursor(std::string_view text) : text_(text) {}
  size_t pos() const { return pos_; }
  bool at_end() const { return pos_ == text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }
  bool take(char c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  /// Exactly count digits.
  std::optional<int> take_digits(size_t count) {
    if (text_.size() - pos_ < count) return std::nullopt;
    int value = 0;
    for (size_t i = 0; i < count; ++i) {
      char c = text_[pos_ + i];
      if (c < '0' || c > '9') return std::nullopt;
      value = value * 10 + (c - '0');
    }
    pos_ += count;
    return value;
  }
  bool at_digit() const { return peek() >= '0' && peek() <= '9'; }

 private:
  std::string_view text_;
  size_t pos_ = 0;
};

// Times are kept in nanoseconds since 1970 (int64): they reach 2262, so later years are no time.
constexpr int kFirstYear = 1970;
constexpr int kLastYear = 2200;
// A longer duration than this means "everything" (and keeps now - duration in range).
constexpr int64_t kLongestDurationSeconds = int64_t{200} * 366 * 86400;

bool is_leap(int year) {
  return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
}

int days_in_month(int year, int month) {
  static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return month == 2 && is_leap(year) ? 29 : kDays[month - 1];
}

/// "YYYY-MM-DD[T ]HH:MM:SS" into tm; false (position unspecified) when it is not that.
bool take_date_time(Cursor& in, std::tm& parts) {
  std::optional<int> year = in.take_digits(4);
  if (!year || !in.take('-')) return false;
  std::optional<int> month = in.take_digits(2);
  if (!month || !in.take('-')) return false;
  std::optional<int> day = in.take_digits(2);
  if (!day || !(in.take('T') || in.take(' '))) return false;
  std::optional<int> hour = in.take_digits(2);
  if (!hour || !in.take(':')) return false;
  std::optional<int> minute = in.take_digits(2);
  if (!minute || !in.take(':')) return false;
  std::optional<int> second = in.take_digits(2);
  if (!second || *year < kFirstYear || *year > kLastYear || *month < 1 || *month > 12 || *day < 1 ||
      *day > days_in_month(*year, *month) || *hour > 23 || *minute > 59 || *second > 59) {
    return false;
  }
  parts = std::tm{};
  parts.tm_year = *year - 1900;
  parts.tm_mon = *month - 1;
  parts.tm_mday = *day;
  parts.tm_hour = *hour;
  parts.tm_min = *minute;
  parts.tm_sec = *second;
  parts.tm_isdst = -1;
  return true;
}

/// ".123" or ",123456" (1 to 9 digits) as nanoseconds; 0 when absent.
std::optional<nanoseconds> take_fraction(Cursor& in) {
  if (!in.take('.') && !in.take(',')) return nanoseconds(0);
  int64_t value = 0;
  int digits = 0;
  for (; in.at_digit(); ++digits) {
    if (digits == 9) return std::nullopt;
    value = value * 10 + *in.take_digits(1);
  }
  if (digits == 0) return std::nullopt;
  for (int i = digits; i < 9; ++i) value *= 10;
  return nanoseconds(value);
}

/// "Z", "+01:00", "-0500" as seconds east of UTC; nullopt when there is no zone; false in
/// valid when there is a broken one.
std::optional<int> take_zone(Cursor& in, bool& valid) {
  valid = true;
  if (in.take('Z')) return 0;
  int sign = in.take('+') ? 1 : in.take('-') ? -1 : 0;
  if (sign == 0) return std::nullopt;
  std::optional<int> hours = in.take_digits(2);
  in.take(':');
  std::optional<int> minutes = in.take_digits(2);
  valid = hours && minutes && *hours <= 23 && *minutes <= 59;
  if (!valid) return std::nullopt;
  return sign * (*hours * 3600 + *minutes * 60);
}

/// A time at the cursor; the cursor ends after it.
std::optional<WallTime> take_time(Cursor& in) {
  std::tm parts{};
  if (!take_date_time(in, parts)) return std::nullopt;
  std::optional<nanoseconds> fraction = take_fraction(in);
  bool zone_valid = true;
  std::optional<int> zone = take_zone(in, zone_valid);
  if (!fraction || !zone_valid) return std::nullopt;
  std::time_t epoch = zone ? ::timegm(&parts) - *zone : std::mktime(&parts);
  if (epoch == static_cast<std::time_t>(-1)) return std::nullopt;
  return WallTime(duration_cast<WallTime::duration>(seconds(epoch) + *fraction));
}

/// "90s", "10m", "2h", "1d", "1h30m": the total, at most kLongestDurationSeconds; nullopt when
/// text is not that.
std::optional<seconds> parse_duration(std::string_view text) {
  Cursor in(text);
  int64_t total = 0;
  while (!in.at_end()) {
    int64_t count = 0;
    int digits = 0;
    for (; in.at_digit(); ++digits) {
      if (digits == 9) return std::nullopt;
      count = count * 10 + *in.take_digits(1);
    }
    if (digits == 0) return std::nullopt;
    if (in.take('s')) {
    } else if (in.take('m')) {
      count *= 60;
    } else if (in.take('h')) {
      count *= 3600;
    } else if (in.take('d')) {
      count *= 86400;
    } else {
      return std::nullopt;
    }
    total = std::min(total + count, kLongestDurationSeconds);  // count < 2^47: no overflow
  }
  if (text.empty()) return std::nullopt;
  return seconds(total);
}

}  // namespace

std::optional<WallTime> parse_time(std::string_view text) {
  Cursor in(text);
  std::optional<WallTime> time = take_time(in);
  if (!time || !in.at_end()) return std::nullopt;
  return time;
}

WallTime parse_since(const std::string& text, WallTime now) {
  if (std::optional<seconds> ago = parse_duration(text)) return now - *ago;
  if (std::optional<WallTime> time = parse_time(text)) return *time;
  throw common::ConfigError(fmt::format(
      "logs: --since \"{}\": expected a duration before now (90s, 10m, 2h, 1d, 1h30m) or a time "
      "(2026-11-25T10:00:00 or \"2026-11-25 10:00:00\", optionally with .fraction and Z or "
      "+01:00; local time without a zone; years 1970 to 2200)",
      text));
}

std::optional<WallTime> line_time(std::string_view line) {
  static const std::string_view kHeader = common::kAttemptHeaderPrefix;
  static const std::string_view kStarted = " started ";
  if (line.substr(0, kHeader.size()) == kHeader) {
    size_t at = line.find(kStarted);
    if (at == std::string_view::npos) return std::nullopt;
    Cursor in(line.substr(at + kStarted.size()));
    return take_time(in);
  }
  Cursor in(line);
  in.take('[');
  std::optional<WallTime> time = take_time(in);
  if (!time || in.at_digit()) return std::nullopt;  // "...:01123" is not a time
  return time;
}

LogFilter::LogFilter(std::optional<WallTime> since, const std::optional<std::string>& grep,
                     std::function<WallTime()> now)
    : since_(since), now_(std::move(now)) {
  if (!grep) return;
  re2::RE2::Options options;
  options.set_log_errors(false);
  auto compiled = std::make_shared<const re2::RE2>(*grep, options);
  if (!compiled->ok()) {
    throw common::ConfigError(
        fmt::format("logs: --grep \"{}\": not a valid regular expression (RE2 syntax): {}", *grep,
                    compiled->error()));
  }
  grep_ = std::move(compiled);
}

bool LogFilter::matches(std::string_view line) const {
  return re2::RE2::PartialMatch(re2::StringPiece(line.data(), line.size()), *grep_);
}

bool LogFilter::keep(std::string_view line, LineClock& clock) const {
  bool recent = true;
  if (since_) {
    std::optional<WallTime> own = line_time(line);
    if (own) clock.last = own;
    WallTime time = own ? *own : clock.live ? now_() : clock.last.value_or(clock.modified);
    recent = time >= *since_;
  }
  return recent && (!grep_ || matches(line));
}

}  // namespace dtrain::launcher
