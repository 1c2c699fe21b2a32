// TensorBoard summaries end to end: dtrain-worker and a two-worker `dtrain launch` write event
// files that read_tfevents.py (written from the TFRecord and protobuf specifications, not from
// the writer) decodes; every scalar is compared with metrics.jsonl, tags and steps with Keras's;
// a non-chief writes nothing, a resumed run adds files, a flipped byte or a cut file fails the
// reader, and a log_dir that cannot be made only warns. Also the train.tensorboard key.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/json.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"
#include "test/train/tfevents_reader.h"
#include "worker/spec/train_config.h"
#include "worker/train/event_file.h"

using namespace dtrain;
using testing::by_tag;
using testing::EventFile;
using testing::read_events;
using testing::Scalar;
using testing::tags;
namespace fs = std::filesystem;

namespace {

const char* kTrain = R"({
  "model": {"input_shape": [8, 8, 1], "layers": [
    {"type": "conv2d", "filters": 4, "kernel_size": 3, "activation": "relu"},
    {"type": "flatten"}, {"type": "dense", "units": 16, "activation": "relu"},
    {"type": "dense", "units": 4}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": OPTIMIZER,
  "data": {"source": "synthetic", "examples": 512, "classes": 4},
  "per_worker_batch_size": 16, "epochs": EPOCHS, "steps_per_epoch": 8, "validation": true,
  "seed": 7, "device": "cpu", "communication": "ring",
  "backup": {"save_freq": 4, "delete_on_success": false}TENSORBOARD})";

std::string train_json(const std::string& optimizer, int epochs, const std::string& tensorboard) {
  std::string text = kTrain;
  text.replace(text.find("OPTIMIZER"), 9, optimizer);
  text.replace(text.find("EPOCHS"), 6, std::to_string(epochs));
  text.replace(text.find("TENSORBOARD"), 11,
               tensorboard.empty() ? "" : ", \"tensorboard\": " + tensorboard);
  return text;
}

std::string write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

double f32(double x) {
  return static_cast<double>(static_cast<float>(x));
}

std::vector<std::map<std::string, double>> read_metrics(const std::string& run) {
  std::vector<std::map<std::string, double>> out;
  std::ifstream in(run + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    common::JsonDocument doc = common::JsonDocument::parse(line, "metrics.jsonl");
    std::map<std::string, double>& m = out.emplace_back();
    for (const auto& [key, value] : doc.root().as_object()) m[key] = value.as_number(-1e300, 1e300);
  }
  return out;
}

// events.out.tfevents.<10-digit seconds>.<this host>.<pid>.<n>.v2; returns the pid.
int pid_in_name(const std::string& name) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::smatch m;
  std::regex pattern(R"(events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+)\.v2)");
  REQUIRE(std::regex_match(name, m, pattern));
  CHECK(m[2] == std::string(host));
  return std::stoi(m[3]);
}

// Epoch summaries (train/ and validation/) against metrics.jsonl, the float32 of each double.
void check_epochs(const testing::ScalarsByTag& train, const testing::ScalarsByTag& validation,
                  const std::vector<std::map<std::string, double>>& metrics,
                  const std::function<double(size_t)>& rate) {
  for (size_t e = 0; e < metrics.size(); ++e) {
    INFO("epoch index " << e);
    const auto& m = metrics[e];
    CHECK(train.at("epoch_loss").at(e) == f32(m.at("loss")));
    CHECK(train.at("epoch_accuracy").at(e) == f32(m.at("accuracy")));
    CHECK(train.at("epoch_learning_rate").at(e) == f32(rate(e)));
    CHECK(train.at("epoch_samples_per_second").at(e) == f32(m.at("samples_per_second")));
    CHECK(train.at("epoch_steps_per_second").at(e) == Approx(8 / m.at("seconds")).epsilon(1e-6));
    CHECK(validation.at("epoch_loss").at(e) == f32(m.at("val_loss")));
    CHECK(validation.at("epoch_accuracy").at(e) == f32(m.at("val_accuracy")));
    CHECK(validation.at("evaluation_loss_vs_iterations").at(8 * (e + 1)) == f32(m.at("val_loss")));
    CHECK(validation.at("evaluation_accuracy_vs_iterations").at(8 * (e + 1)) ==
          f32(m.at("val_accuracy")));
  }
  for (const auto& [tag, steps] : train) {
    if (tag.rfind("epoch_", 0) == 0) CHECK(steps.size() == metrics.size());
  }
}

// A copy of file with one byte changed (or the last one cut), for the reader to refuse.
std::string damaged_copy(const std::string& file, const std::string& dir, long at, bool cut) {
  std::string bytes = common::read_file(file);
  if (cut) {
    bytes.pop_back();
  } else {
    bytes[at < 0 ? bytes.size() + at : at] ^= 0x20;
  }
  std::string path = dir + "/damaged." + std::to_string(at) + (cut ? ".cut" : "");
  common::write_file_atomically(path, bytes);
  return path;
}

}  // namespace

TEST_CASE("dtrain-worker writes Keras's epoch and batch summaries, equal to metrics.jsonl") {
  testing::TempDir dir;
  std::string run = dir.path() + "/run";
  std::string config =
      write_text(dir.path() + "/train.json",
                 train_json(R"({"type": "adam", "learning_rate": {"type": "cosine_decay",
                     "initial_learning_rate": 0.003, "alpha": 0.1}})",
                            2, R"({"update_freq": 4})"));
  double started = train::wall_time_now();
  auto r = testing::run_process(
      {testing::binary("dtrain-worker"), "--config", config, "--run-dir", run});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  double ended = train::wall_time_now();

  std::vector<EventFile> train_files = read_events(run + "/tensorboard/train");
  std::vector<EventFile> validation_files = read_events(run + "/tensorboard/validation");
  REQUIRE(train_files.size() == 1);
  REQUIRE(validation_files.size() == 1);
  for (const EventFile& f : {train_files[0], validation_files[0]}) {
    CHECK(f.file_version == "brain.Event:2");
    pid_in_name(f.name);
    for (double t : f.wall_times) CHECK((t >= started - 1 && t <= ended + 1));
  }
  CHECK(r.err.find("tensorboard: summaries in " + run + "/tensorboard/train/" +
                   train_files[0].name) != std::string::npos);

  auto train = by_tag(train_files), validation = by_tag(validation_files);
  CHECK(tags(train) == std::set<std::string>{"batch_loss", "batch_accuracy", "epoch_loss",
                                             "epoch_accuracy", "epoch_learning_rate",
                                             "epoch_steps_per_second", "epoch_samples_per_second"});
  CHECK(tags(validation) == std::set<std::string>{"epoch_loss", "epoch_accuracy",
                                                  "evaluation_loss_vs_iterations",
                                                  "evaluation_accuracy_vs_iterations"});
  std::vector<std::map<std::string, double>> metrics = read_metrics(run);
  REQUIRE(metrics.size() == 2);
  // Keras logs the rate of the step after the epoch: cosine from 0.003 to 10% of it over 16 steps.
  check_epochs(train, validation, metrics, [](size_t e) {
    return 0.003 * (0.9 * 0.5 * (1 + std::cos(3.14159265358979 * 8.0 * (e + 1) / 16)) + 0.1);
  });
  // update_freq 4: global steps 4, 8, 12, 16; at an epoch's last step the running mean is the
  // epoch's figure.
  for (const char* tag : {"batch_loss", "batch_accuracy"}) {
    std::set<int64_t> steps;
    for (const auto& [step, value] : train.at(tag)) steps.insert(step);
    CHECK(steps == std::set<int64_t>{4, 8, 12, 16});
  }
  CHECK(train.at("batch_loss").at(8) == train.at("epoch_loss").at(0));
  CHECK(train.at("batch_loss").at(16) == train.at("epoch_loss").at(1));
  CHECK(train.at("batch_accuracy").at(16) == train.at("epoch_accuracy").at(1));
  CHECK(train.at("batch_loss").at(4) != train.at("batch_loss").at(8));

  // The reader checks every CRC: a changed byte anywhere, or a cut file, fails it.
  std::string file = run + "/tensorboard/train/" + train_files[0].name;
  long size = static_cast<long>(fs::file_size(file));
  for (auto [at, cut, expected] :
       std::vector<std::tuple<long, bool, std::string>>{{0, false, "length CRC mismatch"},
                                                        {size / 2, false, "CRC mismatch"},
                                                        {-1, false, "data CRC mismatch"},
                                                        {-1, true, "truncated"}}) {
    auto damaged = testing::run_tfevents_reader(damaged_copy(file, dir.path(), at, cut));
    INFO(at << " " << cut << ": " << damaged.err);
    CHECK(damaged.exit_code == 1);
    CHECK(damaged.err.find(expected) != std::string::npos);
  }
}

TEST_CASE("two workers: only the chief writes; a resumed run adds a file to each folder") {
  testing::TempDir dir;
  std::string run = dir.path() + "/run";
  auto job = [&](int epochs) {
    return write_text(dir.path() + "/job" + std::to_string(epochs) + ".json",
                      R"({"job": "tb", "workers": 2, "restart": {"max_restarts": 0},
                          "train": )" +
                          train_json(R"({"type": "sgd", "learning_rate": 0.05})", epochs, "") +
                          "}");
  };
  testing::ProcessOptions options;
  options.timeout_seconds = 120;
  for (int epochs : {2, 3}) {  // the second launch resumes from the first one's checkpoint
    auto r = testing::run_process(
        {testing::binary("dtrain"), "launch", job(epochs), "--run-dir", run}, options);
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
  }
  // Each launch's chief, by the pid in its log's attempt headers.
  auto pids = [&](int worker) {
    std::vector<int> out;
    std::string log = common::read_file(run + "/logs/worker-" + std::to_string(worker) + ".log");
    std::regex header(R"(==== dtrain: attempt \d+ of worker:\d \(pid (\d+)\))");
    for (std::sregex_iterator it(log.begin(), log.end(), header), end; it != end; ++it)
      out.push_back(std::stoi((*it)[1]));
    return out;
  };
  std::vector<int> chief = pids(0), other = pids(1);
  REQUIRE(chief.size() == 2);
  REQUIRE(other.size() == 2);
  CHECK(common::read_file(run + "/logs/worker-1.log").find("tensorboard") == std::string::npos);

  std::vector<EventFile> train_files = read_events(run + "/tensorboard/train");
  std::vector<EventFile> validation_files = read_events(run + "/tensorboard/validation");
  REQUIRE(train_files.size() == 2);
  REQUIRE(validation_files.size() == 2);
  // Per launch's chief, the steps of a tag: epochs 0 and 1, then epoch 2 (Keras's 0-based
  // epochs); the validation's optimizer iterations 8, 16, then 24.
  auto steps_by_pid = [&](const std::vector<EventFile>& files, const std::string& tag) {
    std::map<int, std::set<int64_t>> out;
    for (const EventFile& f : files) {
      CHECK(f.file_version == "brain.Event:2");
      int pid = pid_in_name(f.name);
      CHECK(std::find(other.begin(), other.end(), pid) == other.end());
      for (const Scalar& s : f.scalars) {
        if (s.tag == tag) out[pid].insert(s.step);
      }
    }
    return out;
  };
  using Steps = std::map<int, std::set<int64_t>>;
  CHECK(steps_by_pid(train_files, "epoch_loss") == Steps{{chief[0], {0, 1}}, {chief[1], {2}}});
  CHECK(steps_by_pid(validation_files, "epoch_loss") == Steps{{chief[0], {0, 1}}, {chief[1], {2}}});
  CHECK(steps_by_pid(validation_files, "evaluation_loss_vs_iterations") ==
        Steps{{chief[0], {8, 16}}, {chief[1], {24}}});
  auto train = by_tag(train_files), validation = by_tag(validation_files);
  CHECK(tags(train) == std::set<std::string>{"epoch_loss", "epoch_accuracy", "epoch_learning_rate",
                                             "epoch_steps_per_second", "epoch_samples_per_second"});
  std::vector<std::map<std::string, double>> metrics = read_metrics(run);
  REQUIRE(metrics.size() == 3);
  check_epochs(train, validation, metrics, [](size_t) { return 0.05; });
}

TEST_CASE("train.tensorboard: on by default, false, update_freq and log_dir; mistakes name it") {
  auto parse = [](const std::string& tensorboard) {
    return train::parse_train_config(train_json(R"({"type": "sgd"})", 1, tensorboard), "job.json")
        .tensorboard;
  };
  train::TensorBoardSpec spec = parse("");
  CHECK((spec.enabled && spec.log_dir == "tensorboard" && spec.update_every_steps == 0));
  CHECK_FALSE(parse("false").enabled);
  CHECK(parse("true").enabled);
  CHECK(parse(R"({"update_freq": "batch"})").update_every_steps == 1);
  CHECK(parse(R"({"update_freq": "epoch"})").update_every_steps == 0);
  spec = parse(R"({"update_freq": 25, "log_dir": "tensorboard/run-2"})");
  CHECK((spec.update_every_steps == 25 && spec.log_dir == "tensorboard/run-2"));
  CHECK(parse(R"({"log_dir": "tb"})").log_dir == "tb");

  auto error = [&](const std::string& tensorboard) {
    try {
      parse(tensorboard);
    } catch (const common::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(error("3").find("job.json: train.tensorboard: expected true, false or an object") == 0);
  CHECK(error(R"({"histogram_freq": 1})").find("job.json: train.tensorboard: unknown key") == 0);
  CHECK(error(R"({"update_freq": 0})").find("job.json: train.tensorboard.update_freq:") == 0);
  CHECK(error(R"({"update_freq": "step"})").find("job.json: train.tensorboard.update_freq:") == 0);
  for (const char* outside : {"/tmp/tb", "../tb", "tb/../../x", "logs", "model/tb", ""}) {
    INFO(outside);
    CHECK(error(fmt::format(R"({{"log_dir": "{}"}})", outside))
              .find("job.json: train.tensorboard.log_dir:") == 0);
  }
  CHECK(error(R"({"log_dir": "backup"})").find("overlap") != std::string::npos);
  CHECK(error(R"({"log_dir": "backup/tb"})").find("overlap") != std::string::npos);
}

TEST_CASE("summaries off write nothing; a log_dir that cannot be made warns, training goes on") {
  testing::TempDir dir;
  auto run_worker = [&](const std::string& run, const std::string& tensorboard) {
    std::string config =
        write_text(dir.path() + "/train.json", train_json(R"({"type": "sgd"})", 1, tensorboard));
    return testing::run_process(
        {testing::binary("dtrain-worker"), "--config", config, "--run-dir", run});
  };
  auto r = run_worker(dir.path() + "/off", "false");
  REQUIRE(r.exit_code == 0);
  CHECK(fs::exists(dir.path() + "/off/metrics.jsonl"));
  CHECK_FALSE(fs::exists(dir.path() + "/off/tensorboard"));

  fs::create_directories(dir.path() + "/blocked");
  write_text(dir.path() + "/blocked/tensorboard", "a file where the folder should be");
  r = run_worker(dir.path() + "/blocked", "");
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("tensorboard: cannot create " + dir.path() + "/blocked/tensorboard/train") !=
        std::string::npos);
  CHECK(r.err.find("(training goes on)") != std::string::npos);
  CHECK(read_metrics(dir.path() + "/blocked").size() == 1);
}

// Issue 25 (7): a chief killed between the epoch checkpoint and metrics.jsonl lost the epoch's
// line and TensorBoard points for good. The kill is simulated by a first run without summaries
// whose last metrics line is then dropped: the state such a kill leaves.
TEST_CASE("an epoch line missing after a kill is written on resume from the checkpoint, once") {
  testing::TempDir dir;
  std::string run = dir.path() + "/run", adam = R"({"type": "adam", "learning_rate": 0.003})";
  auto train = [&](int epochs, const std::string& tensorboard) {
    std::string config =
        write_text(dir.path() + "/train.json", train_json(adam, epochs, tensorboard));
    auto r = testing::run_process(
        {testing::binary("dtrain-worker"), "--config", config, "--run-dir", run});
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    return r;
  };
  train(2, "false");
  std::string text = common::read_file(run + "/metrics.jsonl");
  size_t second = text.find('\n') + 1;
  std::string lost = text.substr(second);
  REQUIRE(lost.find("\"epoch\":2") != std::string::npos);
  write_text(run + "/metrics.jsonl.new", text.substr(0, second));
  fs::rename(run + "/metrics.jsonl.new", run + "/metrics.jsonl");

  auto resumed = train(3, "true");
  CHECK(resumed.err.find("has no line for epoch 2") != std::string::npos);
  std::string after = common::read_file(run + "/metrics.jsonl");
  CHECK(after.substr(0, text.size()) == text);  // the lost line back, as it was written
  std::vector<std::map<std::string, double>> metrics = read_metrics(run);
  REQUIRE(metrics.size() == 3);
  for (size_t e = 0; e < 3; ++e) CHECK(metrics[e]["epoch"] == static_cast<double>(e + 1));
  // This run's event file has the recovered epoch's points (Keras's epoch index 1) and its own.
  auto scalars = by_tag(read_events(run + "/tensorboard/train"));
  REQUIRE(scalars.count("epoch_loss"));
  CHECK(scalars.at("epoch_loss").size() == 2);
  CHECK(scalars.at("epoch_loss").at(1) == f32(metrics[1]["loss"]));
  CHECK(scalars.at("epoch_loss").at(2) == f32(metrics[2]["loss"]));

  train(3, "false");  // nothing left to train and nothing missing: nothing added
  CHECK(read_metrics(run).size() == 3);
}
