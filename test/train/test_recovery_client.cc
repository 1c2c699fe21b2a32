// The worker's recovery client on its own (docs/design.md#the-workers-recovery-client), against
// the real ControlClient on a real UNIX socket whose far end stands in for the launcher: a reform
// answered with a new generation and members changes them in one place, the group's included; a
// refused or unanswered reform is NoRecovery naming why; a group that breaks before it forms asks
// for the next generation. And the join itself (share_whole_state), over an in-process ring of
// two: the member that holds nothing receives exactly the holder's named set, a host tensor of a
// new kind included, and its whole position.
#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

#include "common/control_protocol.h"
#include "common/errors.h"
#include "test/comm/in_process_link.h"
#include "test/support/temp_dir.h"
#include "worker/comm/ring_communicator.h"
#include "worker/nn/backend.h"
#include "worker/spec/train_config.h"
#include "worker/train/model_parts.h"
#include "worker/train/recovery_client.h"
#include "worker/train/whole_state.h"

using namespace dtrain;
using Catch::Matchers::Contains;

namespace {

const char* kTrain = R"({"model": {"input_shape": [4, 4], "layers": [
    {"type": "flatten"}, {"type": "dense", "units": 3}]},
  "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
  "optimizer": {"type": "adam", "learning_rate": 0.01},
  "data": {"source": "synthetic", "examples": 32, "classes": 3},
  "per_worker_batch_size": 8, "epochs": 1, "seed": 1, "tensorboard": false})";

// The launcher's side of one reform request on a real UNIX socket: reads the request line, then
// writes reply (nothing: it never answers) and holds the connection until the client is done.
class FakeLauncher {
 public:
  FakeLauncher(const std::string& path, std::string reply)
      : path_(path), listener_(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener_, 4) == 0);
    thread_ = std::thread([this, reply] {
      int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0) return;
      char c = 0;
      while (::read(fd, &c, 1) == 1 && c != '\n') request_.push_back(c);
      if (!reply.empty()) (void)!::write(fd, reply.data(), reply.size());
      while (::read(fd, &c, 1) == 1) {  // until the client closes its end
      }
      ::close(fd);
    });
  }
  ~FakeLauncher() {
    ::shutdown(listener_, SHUT_RDWR);
    thread_.join();
    ::close(listener_);
    ::unlink(path_.c_str());
  }
  std::string address() const { return std::string(common::kControlScheme) + path_; }
  /// The request it read (call once the client has had its answer).
  std::optional<common::ReformRequest> request() const {
    return common::parse_reform_request(request_);
  }

 private:
  std::string path_;
  int listener_;
  std::string request_;
  std::thread thread_;
};

// rank's place in a cluster of size workers, as TF_CONFIG would give it.
comm::RingIdentity cluster_ring(int rank, int size, int generation) {
  comm::RingIdentity ring;
  ring.job = "recovery";
  ring.generation = static_cast<uint32_t>(generation);
  ring.rank = rank, ring.size = size;
  for (int r = 0; r < size; ++r) {
    ring.names.push_back(fmt::format("worker:{}", r));
    ring.addresses.push_back(fmt::format("localhost:{}", 20000 + r));
  }
  return ring;
}

// A model, its optimizer and their named set, on the host.
struct NamedModel {
  explicit NamedModel(const train::TrainConfig& config)
      : backend(nn::make_dnnl_backend(config.math)),
        parts(train::build_model_parts(config, *backend, 3)),
        tensors(*parts.model, parts.optimizer->slots()) {}
  std::unique_ptr<nn::Backend> backend;
  train::ModelParts parts;
  train::ModelTensors tensors;
};

// A position whose every field differs from TrainingState's defaults.
train::Position sample_position() {
  train::Position p;
  p.state = {2, 5, 29, 28, 11.25, 30, 40, 1024, 3, 4.5, 40, 3};
  p.epoch_metrics = R"({"epoch": 2, "loss": 0.5})";
  return p;
}

train::HeldState holding(const train::Position& p) {
  train::HeldState held;
  held.holding = true;
  held.global_step = p.state.global_step, held.epoch = p.state.epoch, held.step = p.state.step;
  held.position = [p] { return p; };
  return held;
}

}  // namespace

TEST_CASE("a reform answered with a generation and members changes them in one place") {
  testing::TempDir dir;
  train::TrainConfig config = train::parse_train_config(kTrain, "job.json");
  NamedModel model(config);
  FakeLauncher launcher(dir.path() + "/control.sock",
                        common::format_reform_reply({true, 3, "", "0,2"}) + "\n");
  common::ControlClient control(launcher.address());
  train::RecoveryOptions options;
  options.task = "worker:0";
  options.attempt = 1;
  options.ring = cluster_ring(0, 3, 1);
  options.members = std::vector<int>{0, 1, 2};
  options.in_place = true;
  options.reply_seconds = 10;
  std::vector<comm::RingIdentity> rings;  // what the factory was asked to make
  train::RecoveryClient recovery(
      options,
      [&](const comm::RingIdentity& ring) {
        rings.push_back(ring);
        return std::make_unique<comm::SoloCommunicator>();
      },
      control);
  comm::GroupCommunicator& group = recovery.form();
  CHECK(group.generation() == 1);
  REQUIRE(rings.size() == 1);
  CHECK(rings[0].size == 3);
  CHECK(recovery.shards()->held == 1);

  const train::Position held = sample_position();
  train::Position shared =
      recovery.rejoin("worker:1 (rank 1) closed the link", true, model.tensors, holding(held));
  // The request named the broken generation, the whole step held, the step in flight and what
  // broke; the answer is the generation now, everywhere it is asked.
  std::optional<common::ReformRequest> request = launcher.request();
  REQUIRE(request);
  CHECK(request->task == "worker:0");
  CHECK(request->attempt == 1);
  CHECK(request->generation == 1);
  CHECK(request->whole_step == held.state.global_step);
  CHECK(request->in_flight);
  CHECK(request->what == "worker:1 (rank 1) closed the link");
  CHECK(recovery.generation() == 3);
  CHECK(group.generation() == 3);
  CHECK(recovery.members() == std::vector<int>{0, 2});
  std::optional<comm::ShardPlan> shards = recovery.shards();
  REQUIRE(shards);
  CHECK(shards->virtual_size == 3);
  CHECK(shards->first == 0);
  CHECK(shards->held == 2);  // its own shard and the missing rank 1's
  REQUIRE(rings.size() == 2);
  CHECK(rings[1].generation == 3);
  CHECK(rings[1].size == 2);  // the members' ring
  CHECK(rings[1].names == std::vector<std::string>{"worker:0", "worker:2"});
  CHECK(shared.state.global_step == held.state.global_step);  // alone, it shares its own
  CHECK(shared.epoch_metrics == held.epoch_metrics);
}

TEST_CASE("a refused or unanswered reform is NoRecovery naming why") {
  testing::TempDir dir;
  train::TrainConfig config = train::parse_train_config(kTrain, "job.json");
  NamedModel model(config);
  train::RecoveryOptions options;
  options.ring = cluster_ring(0, 2, 0);
  options.in_place = true;
  options.reply_seconds = 0.5;
  auto solo = [](const comm::RingIdentity&) { return std::make_unique<comm::SoloCommunicator>(); };
  {
    FakeLauncher launcher(dir.path() + "/refused.sock",
                          common::format_reform_reply({false, 0, "the job is stopping"}) + "\n");
    common::ControlClient control(launcher.address());
    train::RecoveryClient recovery(options, solo, control);
    recovery.form();
    std::string why;
    try {
      recovery.rejoin("lost", false, model.tensors, holding(sample_position()));
    } catch (const train::NoRecovery& e) {
      why = e.what();
    }
    CHECK(why == "no recovery in place: the job is stopping");
    CHECK(recovery.generation() == 0);  // nothing changed
    CHECK_FALSE(recovery.elastic());
    CHECK(recovery.members() == std::vector<int>{0, 1});
  }
  {
    FakeLauncher launcher(dir.path() + "/silent.sock", "");
    common::ControlClient control(launcher.address());
    train::RecoveryClient recovery(options, solo, control);
    recovery.form();
    CHECK_THROWS_WITH(recovery.rejoin("lost", false, model.tensors, holding(sample_position())),
                      Contains("did not answer the reform request"));
  }
  common::ControlClient none("");
  options.in_place = false;
  train::RecoveryClient recovery(options, solo, none);
  recovery.form();
  CHECK_THROWS_AS(recovery.rejoin("lost", false, model.tensors, holding(sample_position())),
                  train::NoRecovery);
}

TEST_CASE("a group that breaks before it first forms asks for the next generation in place") {
  testing::TempDir dir;
  train::RecoveryOptions options;
  options.ring = cluster_ring(1, 2, 0);
  options.in_place = true;
  options.reply_seconds = 10;
  // Generation 0's rendezvous fails (a member was killed while it loaded its data).
  auto factory = [](const comm::RingIdentity& ring) -> std::unique_ptr<comm::Communicator> {
    if (ring.generation == 0) throw common::IoError("worker:0 (rank 0) closed the link");
    return std::make_unique<comm::SoloCommunicator>();
  };
  {
    FakeLauncher launcher(dir.path() + "/start.sock",
                          common::format_reform_reply({true, 1, ""}) + "\n");
    common::ControlClient control(launcher.address());
    train::RecoveryClient recovery(options, factory, control);
    CHECK(recovery.form().generation() == 1);
    CHECK(recovery.generation() == 1);
    std::optional<common::ReformRequest> request = launcher.request();
    REQUIRE(request);
    CHECK(request->whole_step == -1);  // it holds no state yet
    CHECK_THAT(request->what, Contains("closed the link"));
  }
  common::ControlClient none("");
  options.in_place = false;
  train::RecoveryClient recovery(options, factory, none);
  CHECK_THROWS_AS(recovery.form(), comm::GroupBroken);
}

TEST_CASE("a join sends exactly the model's named set and the whole position") {
  train::TrainConfig config = train::parse_train_config(kTrain, "job.json");
  NamedModel holder(config), joiner(config);
  // A kind of state the recovery client has never heard of travels as well.
  std::vector<float> holder_extra = {1.5f, -2.0f, 3.25f}, joiner_extra(3, 0.0f);
  holder.tensors.add_host_tensors({{"callbacks.new_kind.state", {3}, &holder_extra}});
  joiner.tensors.add_host_tensors({{"callbacks.new_kind.state", {3}, &joiner_extra}});
  // The holder's state differs from the joiner's everywhere: every tensor gets other values.
  holder.tensors.download();
  for (std::vector<float>& host : holder.tensors.host())
    for (size_t i = 0; i < host.size(); ++i) host[i] = 0.25f * static_cast<float>(i % 17) + 7;
  holder.tensors.upload();
  std::vector<std::string> sent_names;
  for (const train::TensorView& v : holder.tensors.download()) sent_names.push_back(v.name);
  const std::vector<std::vector<float>> sent_values = holder.tensors.host();
  REQUIRE(sent_names.back() == "callbacks.new_kind.state");
  REQUIRE(joiner.parts.model->parameters().to_host() != holder.parts.model->parameters().to_host());

  auto links = testing::make_in_process_ring(2);
  comm::RingCommunicator rank0(std::move(links[0]), 0, 2), rank1(std::move(links[1]), 1, 2);
  const train::Position position = sample_position();
  train::Position received;
  std::string error;
  std::thread second([&] {
    try {
      train::HeldState none;  // a process that has just started
      none.stored = [] { return std::optional<train::Position>(); };
      received = train::share_whole_state(rank1, joiner.tensors, none);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  train::HeldState held = holding(position);
  held.stored = [] { return std::optional<train::Position>(); };
  train::Position own = train::share_whole_state(rank0, holder.tensors, held);
  second.join();
  REQUIRE(error.empty());

  CHECK(own.state.global_step == position.state.global_step);
  CHECK(std::memcmp(&received.state, &position.state, sizeof position.state) == 0);
  CHECK(received.epoch_metrics == position.epoch_metrics);
  // The joiner's device buffers and host tensors are the holder's, tensor by tensor, by name.
  std::vector<std::string> got_names;
  for (const train::TensorView& v : joiner.tensors.download()) got_names.push_back(v.name);
  CHECK(got_names == sent_names);
  CHECK(joiner.tensors.host() == sent_values);
  CHECK(joiner_extra == holder_extra);
  CHECK(joiner.parts.model->parameters().to_host() == holder.parts.model->parameters().to_host());
}
