// See tfevents_reader.h.
#include "test/train/tfevents_reader.h"

#include <catch2/catch.hpp>
#include <filesystem>

#include "common/json.h"

namespace dtrain::testing {
namespace {

Scalar scalar(const common::JsonNode& v, int64_t step) {
  CHECK(v.at("kind").as_string() == "tensor");
  CHECK(v.at("dtype").as_int(0, 100) == 1);
  CHECK(v.at("rank").as_int(0, 100) == 0);
  CHECK(v.at("plugin").as_string() == "scalars");
  CHECK(v.at("data_class").as_int(0, 100) == 1);
  return {v.at("tag").as_string(), step, v.at("value").as_number(-1e300, 1e300)};
}

}  // namespace

ProcessResult run_tfevents_reader(const std::string& path) {
  std::string python = std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  return run_process(
      {python, std::string(DTRAIN_SOURCE_DIR) + "/test/train/read_tfevents.py", path});
}

std::vector<EventFile> read_events(const std::string& path) {
  ProcessResult r = run_tfevents_reader(path);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  common::JsonDocument doc = common::JsonDocument::parse(r.out, "read_tfevents.py");
  std::vector<EventFile> files;
  for (const common::JsonNode& f : doc.root().at("files").as_array()) {
    EventFile file;
    file.name = f.at("name").as_string();
    std::vector<common::JsonNode> events = f.at("events").as_array();
    REQUIRE(!events.empty());
    if (auto v = events[0].find("file_version")) file.file_version = v->as_string();
    CHECK(events[0].at("values").as_array().empty());
    for (size_t i = 1; i < events.size(); ++i) {
      CHECK_FALSE(events[i].find("file_version"));
      int64_t step = events[i].at("step").as_int(0, int64_t{1} << 40);
      file.wall_times.push_back(events[i].at("wall_time").as_number(1e9, 1e10));
      for (const common::JsonNode& v : events[i].at("values").as_array())
        file.scalars.push_back(scalar(v, step));
    }
    files.push_back(file);
  }
  return files;
}

ScalarsByTag by_tag(const std::vector<EventFile>& files) {
  ScalarsByTag out;
  for (const EventFile& f : files) {
    for (const Scalar& s : f.scalars) {
      INFO(s.tag << " at " << s.step);
      CHECK(out[s.tag].emplace(s.step, s.value).second);
    }
  }
  return out;
}

std::set<std::string> tags(const ScalarsByTag& m) {
  std::set<std::string> out;
  for (const auto& [tag, steps] : m) out.insert(tag);
  return out;
}

}  // namespace dtrain::testing
