// `dtrain logs --since/--grep`: LogFilter's parsing and per-line rule in-process (time zones set
// with POSIX TZ strings, so no tzdata is needed), then the real dtrain binary on hand-made run
// directories, printing and following.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/run_dir.h"
#include "launcher/view/log_filter.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using dtrain::common::ConfigError;
using dtrain::launcher::line_time;
using dtrain::launcher::LineClock;
using dtrain::launcher::LogFilter;
using dtrain::launcher::parse_since;
using dtrain::launcher::parse_time;
using dtrain::launcher::WallTime;
using dtrain::testing::binary;
using dtrain::testing::run_process;
using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::minutes;
using std::chrono::seconds;

namespace {

/// Sets TZ for the scope (POSIX form, e.g. "XST-3" is UTC+3 with no daylight saving).
class ScopedTz {
 public:
  explicit ScopedTz(const char* tz) {
    if (const char* old = std::getenv("TZ")) old_ = old;
    ::setenv("TZ", tz, 1);
    ::tzset();
  }
  ~ScopedTz() {
    if (old_) {
      ::setenv("TZ", old_->c_str(), 1);
    } else {
      ::unsetenv("TZ");
    }
    ::tzset();
  }

 private:
  std::optional<std::string> old_;
};

/// Seconds since the epoch as a WallTime.
WallTime at(int64_t epoch_seconds) {
  return WallTime(seconds(epoch_seconds));
}

constexpr int64_t kTenUtc = 1637834400;  // 2021-11-25T10:00:00Z

}  // namespace

TEST_CASE("parse_since: durations before now") {
  WallTime now = at(kTenUtc);
  CHECK(parse_since("90s", now) == now - seconds(90));
  CHECK(parse_since("10m", now) == now - minutes(10));
  CHECK(parse_since("2h", now) == now - hours(2));
  CHECK(parse_since("1d", now) == now - hours(24));
  CHECK(parse_since("1h30m", now) == now - minutes(90));
  CHECK(parse_since("0s", now) == now);
  // Longer than 200 years is everything before now: no overflow however long (UBSan found
  // now - 999999999d wrapping round to a time in the future).
  WallTime far_back = parse_since("999999999d", now);
  CHECK(far_back < at(0) - hours(24 * 365 * 100));  // before 1870
  std::string many;
  for (int i = 0; i < 20000; ++i) many += "999999999d";
  CHECK(parse_since(many, now) == far_back);
}

TEST_CASE("parse_since: ISO-8601 times with and without zones") {
  ScopedTz tz("XST-3");  // local time is UTC+3
  WallTime now = at(0);
  CHECK(parse_since("2021-11-25T10:00:00Z", now) == at(kTenUtc));
  CHECK(parse_since("2021-11-25T13:00:00", now) == at(kTenUtc));  // local
  CHECK(parse_since("2021-11-25 13:00:00", now) == at(kTenUtc));
  CHECK(parse_since("2021-11-25T11:00:00+01:00", now) == at(kTenUtc));
  CHECK(parse_since("2021-11-25T05:30:00-0430", now) == at(kTenUtc));
  CHECK(parse_since("2021-11-25T10:00:00.250Z", now) == at(kTenUtc) + milliseconds(250));
  CHECK(parse_since("2021-11-25T10:00:00,5Z", now) == at(kTenUtc) + milliseconds(500));
  CHECK(parse_since("2024-02-29T00:00:00Z", now) == at(1709164800));  // a leap day
}

TEST_CASE("parse_since: anything else is a ConfigError naming the value") {
  WallTime now = at(kTenUtc);
  for (const char* bad : {"",
                          "10",
                          "10x",
                          "m",
                          "-5m",
                          "1.5h",
                          "10m ago",
                          "2021-11-25",
                          "2021-11-25T10:00",
                          "2026-13-01T00:00:00",
                          "2025-02-29T00:00:00",
                          "2021-11-25T24:00:00",
                          "2021-11-25T10:00:00+25:00",
                          "2021-11-25T10:00:00Zjunk",
                          "2021-11-25T10:00:00.",
                          "2021-11-25T10:00:00.1234567890",
                          "1969-12-31T23:59:59Z",
                          "9999999999d",
                          "2201-01-01T00:00:00Z",
                          "9999-12-31T23:59:59Z"}) {
    INFO("value: \"" << bad << "\"");
    try {
      parse_since(bad, now);
      FAIL("accepted");
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()).find("--since \"" + std::string(bad) + "\"") !=
            std::string::npos);
    }
  }
}

TEST_CASE("line_time: dtrain's spdlog lines (local time), ISO starts and attempt headers") {
  ScopedTz tz("XST-3");
  CHECK(line_time("2021-11-25 13:00:00.123 I [worker 1] loss 0.5") ==
        at(kTenUtc) + milliseconds(123));
  CHECK(line_time("[2021-11-25 13:00:00] [info] hi") == at(kTenUtc));
  CHECK(line_time("2021-11-25T10:00:00Z python says hi") == at(kTenUtc));
  CHECK(line_time(dtrain::common::attempt_header(2, {"worker", 0}, 42,
                                                 "2021-11-25T10:00:00.000Z")) == at(kTenUtc));
  CHECK(line_time("Epoch 1/3") == std::nullopt);
  CHECK(line_time("70/70 [=====] - loss: 2021-11-25 13:00:00") == std::nullopt);  // not at start
  CHECK(line_time("2021-11-25 13:00:001 no") == std::nullopt);
  CHECK(line_time("") == std::nullopt);
  // Beyond 2200 is no time (nanoseconds since 1970 end in 2262), not an overflowed one.
  CHECK(line_time("9999-12-31 23:59:59 I far") == std::nullopt);
  CHECK(line_time("2200-12-31T23:59:59Z edge") == at(7289654399));
  CHECK(parse_time("2021-11-25T10:00:00Z") == at(kTenUtc));
  CHECK(parse_time("2021-11-25T10:00:00Z ") == std::nullopt);
}

TEST_CASE("LogFilter --grep: an extended regex searched in the line; a bad pattern names itself") {
  LogFilter filter(std::nullopt, std::string(R"(loss: [0-9]\.[0-4])"));
  LineClock clock;
  CHECK(filter.active());
  CHECK(filter.keep("70/70 - loss: 2.2843", clock));
  CHECK_FALSE(filter.keep("70/70 - loss: 2.9843", clock));
  CHECK_FALSE(filter.keep("", clock));
  CHECK_FALSE(LogFilter(std::nullopt, std::nullopt).active());
  CHECK(LogFilter(std::nullopt, std::string("^$")).keep("", clock));
  for (const char* bad : {"(", "[a-", "a{2,1}", "*x"}) {
    INFO("pattern: " << bad);
    try {
      LogFilter(std::nullopt, std::string(bad));
      FAIL("accepted");
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()).find("--grep \"" + std::string(bad) + "\"") != std::string::npos);
    }
  }
}

TEST_CASE("LogFilter --grep: alternation, the view's own end, NUL bytes and megabyte lines") {
  LineClock clock;
  LogFilter errors(std::nullopt, std::string("Traceback|Error"));
  CHECK(errors.keep("Traceback (most recent call last):", clock));
  CHECK(errors.keep("RuntimeError: boom", clock));
  CHECK_FALSE(errors.keep("all good", clock));
  // The line is a view into a longer buffer: the match ends where the view does.
  std::string buffer = "loss 0.25 Error later";
  std::string_view head(buffer.data(), 9);
  CHECK_FALSE(errors.keep(head, clock));
  CHECK(LogFilter(std::nullopt, std::string("25$")).keep(head, clock));
  CHECK(LogFilter(std::nullopt, std::string("after")).keep(std::string("nul\0after", 9), clock));
  CHECK(LogFilter(std::nullopt, std::string(R"(loss: \d+\.\d{2}\b)")).keep("loss: 0.25 ", clock));
  // std::regex recursed once per character and crashed (SIGSEGV) on such lines; glibc's regexec
  // took minutes (quadratic when nothing matches). RE2 is linear.
  std::string long_line(4 << 20, 'x');
  long_line += " b";
  CHECK(LogFilter(std::nullopt, std::string("x.*b")).keep(long_line, clock));
  CHECK(LogFilter(std::nullopt, std::string("(x|y)* b$")).keep(long_line, clock));
  CHECK_FALSE(LogFilter(std::nullopt, std::string("x.*c")).keep(long_line, clock));
}

TEST_CASE("LogFilter --since: lines without a time take the last timed line's") {
  ScopedTz tz("UTC0");
  WallTime now = at(kTenUtc + 3600);
  LogFilter filter(at(kTenUtc), std::nullopt, [&] { return now; });
  LineClock clock;
  clock.modified = at(kTenUtc + 60);
  CHECK(filter.keep("before any timed line: the file's mtime is after since", clock));
  LineClock old_file;
  old_file.modified = at(kTenUtc - 60);
  CHECK_FALSE(filter.keep("the file was last written before since", old_file));

  CHECK_FALSE(filter.keep("2021-11-25 09:59:59.999 I [worker 0] old", clock));
  CHECK_FALSE(filter.keep("old continuation", clock));
  CHECK(filter.keep("2021-11-25 10:00:00.000 I [worker 0] exactly since", clock));
  CHECK(filter.keep("new continuation", clock));
  CHECK_FALSE(filter.keep("2021-11-25 09:00:00.000 I [worker 0] out of order", clock));
  CHECK_FALSE(filter.keep("continues the older line", clock));

  clock.live = true;  // following: an untimed line was just written
  CHECK(filter.keep("appended while following", clock));
  now = at(kTenUtc - 1);  // a --since in the future of the followed lines
  CHECK_FALSE(filter.keep("appended before since", clock));
}

TEST_CASE("LogFilter: --since and --grep together keep lines that pass both") {
  ScopedTz tz("UTC0");
  LogFilter filter(at(kTenUtc), std::string("loss"));
  LineClock clock;
  CHECK_FALSE(filter.keep("2021-11-25 09:00:00.000 I [chief] loss 1", clock));
  CHECK(filter.keep("2021-11-25 11:00:00.000 I [chief] loss 1", clock));
  CHECK_FALSE(filter.keep("2021-11-25 11:00:00.000 I [chief] accuracy 1", clock));
}

namespace {

/// A run directory with logs/ and a final state.json, under a fresh temporary folder.
struct FilterRun {
  FilterRun() : run(dir.path() + "/run") {
    std::filesystem::create_directories(run.logs_dir());
    dtrain::common::write_file_atomically(run.state_json(), "{\"status\": \"succeeded\"}\n");
  }
  std::string log(int worker) const { return run.log_file({"worker", worker}); }
  void append(int worker, const std::string& text) const {
    std::ofstream(log(worker), std::ios::binary | std::ios::app) << text;
  }
  /// Sets the modification time of worker's log.
  void touch(int worker, WallTime when) const {
    auto delta = when - std::chrono::system_clock::now();
    std::filesystem::last_write_time(
        log(worker),
        std::filesystem::file_time_type::clock::now() +
            std::chrono::duration_cast<std::filesystem::file_time_type::duration>(delta));
  }
  dtrain::testing::TempDir dir;
  dtrain::common::RunDir run;
};

/// "2021-11-25 10:00:00.000" in local time (TZ), as dtrain's spdlog pattern writes it.
std::string spdlog_time(WallTime time) {
  std::time_t t = std::chrono::system_clock::to_time_t(time);
  std::tm parts{};
  ::localtime_r(&t, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S.000", &parts);
  return text;
}

/// Waits (up to 10 s) until the process has printed text.
bool printed(const dtrain::testing::BackgroundProcess& process, const std::string& text) {
  auto deadline = std::chrono::steady_clock::now() + seconds(10);
  while (process.out_so_far().find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

dtrain::testing::ProcessOptions in_tz(const char* tz) {
  dtrain::testing::ProcessOptions options;
  options.env["TZ"] = tz;
  options.timeout_seconds = 30;
  return options;
}

}  // namespace

TEST_CASE("dtrain logs --since/--grep/-n on a hand-made run directory") {
  ScopedTz tz("XST-3");
  FilterRun t;
  t.append(0, dtrain::common::attempt_header(1, {"worker", 0}, 7, "2021-11-25T09:00:00.000Z") +
                  "\nEpoch 1/2\n" + spdlog_time(at(kTenUtc)) + " I [worker 0] loss 2.1\n" +
                  "Epoch 2/2\n" + spdlog_time(at(kTenUtc + 60)) + " I [worker 0] loss 1.4\n" +
                  "Traceback: boom");
  t.append(1, "print() output only\nloss 9\n");  // no times at all: the file's mtime decides
  t.touch(1, at(kTenUtc - 3600));
  std::string dtrain = binary("dtrain");
  auto since = run_process({dtrain, "logs", t.run.root(), "--since", "2021-11-25T10:00:00Z"},
                           in_tz("XST-3"));
  CHECK(since.exit_code == 0);
  CHECK(since.out == "[worker 0] " + spdlog_time(at(kTenUtc)) +
                         " I [worker 0] loss 2.1\n[worker 0] Epoch 2/2\n[worker 0] " +
                         spdlog_time(at(kTenUtc + 60)) +
                         " I [worker 0] loss 1.4\n[worker 0] Traceback: boom\n");
  auto local = run_process(
      {dtrain, "logs", t.run.root(), "--since", "2021-11-25 13:00:30", "--worker", "0", "--raw"},
      in_tz("XST-3"));
  CHECK(local.out == spdlog_time(at(kTenUtc + 60)) + " I [worker 0] loss 1.4\nTraceback: boom\n");
  auto grep = run_process({dtrain, "logs", t.run.root(), "--grep", "loss [0-9]", "-n", "1"},
                          in_tz("XST-3"));
  CHECK(grep.out == "[worker 0] " + spdlog_time(at(kTenUtc + 60)) +
                        " I [worker 0] loss 1.4\n[worker 1] loss 9\n");
  auto old_file = run_process(
      {dtrain, "logs", t.run.root(), "--since", "2021-11-25T08:00:00Z", "--worker", "1"},
      in_tz("XST-3"));
  CHECK(old_file.out == "[worker 1] print() output only\n[worker 1] loss 9\n");
  auto recent = run_process({dtrain, "logs", t.run.root(), "--since", "10m"}, in_tz("XST-3"));
  CHECK(recent.exit_code == 0);
  CHECK(recent.out.empty());
}

TEST_CASE("dtrain logs: a bad --since or --grep is exit 2 with one line naming the value") {
  FilterRun t;
  t.append(0, "x\n");
  std::string dtrain = binary("dtrain");
  for (auto [option, value] : {std::pair{"--since", "yesterday"}, std::pair{"--since", "10"},
                               std::pair{"--grep", "(unclosed"}}) {
    INFO(option << " " << value);
    auto r = run_process({dtrain, "logs", t.run.root(), option, value});
    CHECK(r.exit_code == 2);
    CHECK(r.out.empty());
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find(std::string(option) + " \"" + value + "\"") != std::string::npos);
  }
}

TEST_CASE("dtrain logs -f --since --grep filters followed lines too") {
  FilterRun t;
  dtrain::common::write_file_atomically(
      t.run.state_json(),
      "{\"status\": \"running\", \"launcher_pid\": " + std::to_string(::getpid()) + "}\n");
  WallTime now = std::chrono::system_clock::now();
  t.append(0, dtrain::common::attempt_header(1, {"worker", 0}, 7, "2020-01-01T00:00:00.000Z") +
                  "\nkeep but too old\n" + spdlog_time(now) + " I keep recent\n");
  dtrain::testing::BackgroundProcess logs(
      {binary("dtrain"), "logs", t.run.root(), "-f", "--since", "1h", "--grep", "keep"});
  REQUIRE(printed(logs, "keep recent\n"));  // the initial read is done: what follows is new
  t.append(0, "keep appended\ndrop appended\n" + spdlog_time(now - hours(2)) + " I keep old\n");
  t.append(1, "keep from a new file\n");  // no header: its mtime is now
  REQUIRE(printed(logs, "new file\n"));
  REQUIRE(printed(logs, "keep appended\n"));
  dtrain::common::write_file_atomically(t.run.state_json(), "{\"status\": \"succeeded\"}\n");
  auto r = logs.wait(10);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("keep appended") != std::string::npos);
  CHECK(r.out.find("keep from a new file") != std::string::npos);
  CHECK(r.out.find("drop") == std::string::npos);
  CHECK(r.out.find("old") == std::string::npos);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 3);
}
