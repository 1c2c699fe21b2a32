// What a training worker tells the launcher over DTRAIN_CONTROL, read from a real UNIX socket:
// restored_step once, right after the restore (0 on a fresh start, the checkpoint's global step
// on a resume), and global_step in every progress message, up to the run's last step, with the
// worker's own compute and all-reduce wait seconds per step (on the host, each report's steps).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "common/control_protocol.h"
#include "test/support/temp_dir.h"
#include "test/train/solo_fit.h"
#include "worker/comm/ring_communicator.h"
#include "worker/train/trainer.h"

using namespace dtrain;

namespace {

const char* kTrain = R"({"model": {"input_shape": [4, 4], "layers": [
    {"type": "flatten"}, {"type": "dense", "units": 3}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": "rmsprop",
  "data": {"source": "synthetic", "examples": 96, "classes": 3},
  "per_worker_batch_size": 8, "epochs": 2, "seed": 1, "tensorboard": false})";

// A listening UNIX socket standing in for the launcher's control server.
class Listener {
 public:
  explicit Listener(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd_, 4) == 0);
  }
  ~Listener() { ::close(fd_); }
  std::string address() const { return std::string(common::kControlScheme) + path_; }
  // Everything the one client sent before it closed its connection.
  std::vector<common::ControlMessage> messages() {
    int client = ::accept(fd_, nullptr, nullptr);
    REQUIRE(client >= 0);
    ::shutdown(client, SHUT_WR);
    timeval timeout{10, 0};  // a guard only: the client has closed
    ::setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    std::string text;
    char buffer[4096];
    for (ssize_t n; (n = ::recv(client, buffer, sizeof buffer, 0)) > 0;) text.append(buffer, n);
    ::close(client);
    std::vector<common::ControlMessage> out;
    for (size_t start = 0, end; (end = text.find('\n', start)) != std::string::npos;
         start = end + 1) {
      auto m = common::parse_control_message(std::string_view(text).substr(start, end - start));
      REQUIRE(m);
      out.push_back(*m);
    }
    return out;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

TEST_CASE("restored_step comes once after the restore; every progress has global_step") {
  testing::TempDir dir;
  train::TrainConfig c = train::parse_train_config(kTrain, "job.json");
  c.backup.delete_on_success = false;
  std::string run = dir.path() + "/run";
  {
    Listener launcher(dir.path() + "/stopped.sock");
    {
      common::ControlClient control(launcher.address());
      CHECK_THROWS_AS(testing::solo_fit(c, run, {.stop_after = 3, .control = &control}),
                      train::Preempted);
    }  // closed: the listener reads to the end
    std::vector<common::ControlMessage> sent = launcher.messages();
    REQUIRE_FALSE(sent.empty());
    CHECK(sent.front().type == common::ControlMessageType::kHeartbeat);
    CHECK(sent.front().restored_step == 0);  // a fresh start
  }
  Listener launcher(dir.path() + "/resumed.sock");
  {
    common::ControlClient control(launcher.address());
    testing::solo_fit(c, run, {.control = &control});
  }
  std::vector<common::ControlMessage> sent = launcher.messages();
  REQUIRE(sent.size() >= 2);
  CHECK(sent.front().restored_step == 4);  // asked during step 3, agreed and saved after step 4
  int restored = 0, progress = 0;
  int64_t last = 0;
  for (const common::ControlMessage& m : sent) {
    restored += m.restored_step.has_value();
    if (m.type != common::ControlMessageType::kProgress) continue;
    ++progress;
    REQUIRE(m.global_step);
    REQUIRE(m.compute_seconds_per_step);  // a CPU run: every report has steps behind it
    REQUIRE(m.wait_seconds_per_step);
    CHECK(*m.compute_seconds_per_step > 0);
    CHECK(*m.compute_seconds_per_step < 5);
    CHECK(*m.wait_seconds_per_step >= 0);
    CHECK(*m.global_step >= last);
    last = *m.global_step;
  }
  CHECK(restored == 1);
  CHECK(progress >= 2);   // each epoch's end at least
  CHECK(last == 2 * 12);  // 96 examples / 8 a step, two epochs
}
