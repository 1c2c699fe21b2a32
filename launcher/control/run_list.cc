// See run_list.h.
#include "launcher/control/run_list.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "common/errors.h"
#include "common/json.h"
#include "common/run_dir.h"
#include "launcher/control/control_client.h"

namespace dtrain::launcher {
namespace fs = std::filesystem;
namespace {

RunSummary summarize(const std::string& dir) {
  RunSummary run;
  run.dir = dir;
  try {
    auto [text, daemon] = read_state(dir);
    // A row only for state that parses as an object; anything else is a row that says so.
    if (!common::JsonDocument::parse(text, "state").root().is_object())
      throw common::ConfigError("state.json is not an object");
    run.state = text;
    run.daemon = daemon;
  } catch (const common::ConfigError&) {
    run.problem =
        fs::exists(common::RunDir(dir).state_json()) ? "unreadable state.json" : "never launched";
  } catch (const std::exception& e) {
    run.problem = e.what();
  }
  return run;
}

std::string text_or(const common::JsonNode& root, const char* key, const std::string& otherwise) {
  auto node = root.find(key);
  if (!node || node->is_null()) return otherwise;
  return node->is_string() ? node->as_string() : node->dump();
}

// "epoch 3/5" from the first worker that reported progress; "-" when none did.
std::string progress(const common::JsonNode& root) {
  auto workers = root.find("workers");
  if (!workers || !workers->is_array()) return "-";
  for (const common::JsonNode& w : workers->as_array()) {
    if (!w.is_object()) continue;
    auto p = w.find("last_progress");
    if (!p || !p->is_object() || !p->find("epoch")) continue;
    return fmt::format("epoch {}/{}", text_or(*p, "epoch", "?"), text_or(*p, "epochs", "?"));
  }
  return "-";
}

}  // namespace

std::vector<RunSummary> list_runs(const std::string& runs_root) {
  std::error_code ec;
  if (!fs::is_directory(runs_root, ec)) {
    throw common::ConfigError(
        fmt::format("status: there is no ./{}: give RUN_DIR or JOB_FILE (see dtrain status --help)",
                    runs_root));
  }
  std::vector<std::string> dirs;
  for (fs::directory_iterator it(runs_root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_directory(type_ec)) dirs.push_back(it->path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  std::vector<RunSummary> runs;
  for (const std::string& dir : dirs) runs.push_back(summarize(dir));
  return runs;
}

std::string format_run_table(const std::vector<RunSummary>& runs) {
  const char* row = "{:<28} {:<20} {:<16} {:>7} {:>8} {:>11} {:<8} {:<11} {}\n";
  std::string out = fmt::format(fmt::runtime(row), "RUN", "JOB", "STATUS", "ATTEMPT", "RESTARTS",
                                "PREEMPTIONS", "LAUNCHER", "PROGRESS", "UPDATED");
  for (const RunSummary& run : runs) {
    if (run.state.empty()) {
      out +=
          fmt::format(fmt::runtime(row), run.dir, "-", run.problem, "-", "-", "-", "-", "-", "-");
      continue;
    }
    common::JsonDocument doc = common::JsonDocument::parse(run.state, "state");
    const common::JsonNode& s = doc.root();
    out += fmt::format(fmt::runtime(row), run.dir, text_or(s, "job", "-"),
                       text_or(s, "status", "-"), text_or(s, "attempt", "-"),
                       text_or(s, "restarts", "-"), text_or(s, "preemptions", "-"),
                       run.daemon ? "running" : "gone", progress(s), text_or(s, "updated_at", "-"));
  }
  return out;
}

std::string format_run_json(const std::vector<RunSummary>& runs) {
  common::JsonWriter out;
  out.begin_array();
  for (const RunSummary& run : runs) {
    out.begin_object().key("run_dir").value(fs::absolute(run.dir).lexically_normal().string());
    out.key("daemon").value(run.daemon ? "running" : "gone");
    if (run.state.empty()) {
      out.key("problem").value(run.problem).end_object();
      continue;
    }
    common::JsonDocument doc = common::JsonDocument::parse(run.state, "state");
    for (const auto& [key, value] : doc.root().as_object())
      if (key != "daemon" && key != "run_dir") out.key(key).raw(value.dump());
    out.end_object();
  }
  return out.end_array().str();
}

}  // namespace dtrain::launcher
