// See comm_factory.h.
#include "worker/comm/comm_factory.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "common/env_vars.h"
#include "common/errors.h"
#include "worker/comm/host_staged_communicator.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/ring_communicator.h"
#include "worker/comm/shm_communicator.h"
#include "worker/comm/tcp_ring_link.h"
#include "worker/comm/threaded_communicator.h"

namespace dtrain::comm {

RingIdentity ring_identity(const common::TfConfig& tf, const std::string& job, int attempt,
                           const std::string& token) {
  std::optional<int> rank = tf.cluster.ring_rank(tf.task);
  if (!rank) {
    throw common::ConfigError(fmt::format(
        "TF_CONFIG: task {} does not train, so it has no place in the ring", tf.task.text()));
  }
  RingIdentity id;
  id.job = job.empty() ? "dtrain" : job;
  id.attempt = static_cast<uint32_t>(attempt);
  id.rank = *rank;
  id.size = tf.cluster.ring_size();
  id.token = token;
  for (const common::TaskId& task : tf.cluster.training_tasks()) {
    id.names.push_back(task.text());
    id.addresses.push_back(tf.cluster.address(task));
  }
  return id;
}

int attempt_from_environment() {
  std::string text = common::get_env_or_default(common::kEnvAttempt);
  if (text.empty() || text.size() > 9 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    throw common::ConfigError(
        fmt::format("{}=\"{}\": expected a number", common::kEnvAttempt.name, text));
  }
  return std::stoi(text);
}

RingIdentity ring_identity_from_environment(const common::TfConfig& tf,
                                            const std::string& fallback_job) {
  return ring_identity(tf, common::get_env(common::kEnvJob).value_or(fallback_job),
                       attempt_from_environment(), common::get_env_or_default(common::kEnvToken));
}

std::unique_ptr<Communicator> make_communicator(const RingIdentity& id,
                                                const CommOptions& options) {
  if (id.size == 1) return std::make_unique<SoloCommunicator>();
  return std::make_unique<RingCommunicator>(rendezvous(id, options), id.rank, id.size);
}

namespace {

// True when two ranks train on the same GPU (same host name and PCI bus id): NCCL refuses that.
bool ranks_share_a_gpu(Communicator& ring, const nn::Device& device) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string where = std::string(host) + "/" + device.location();
  char mine[320] = {};
  std::strncpy(mine, where.c_str(), sizeof mine - 1);
  std::vector<uint8_t> all = ring.all_gather(mine, sizeof mine);
  std::set<std::string> places;
  for (size_t r = 0; r < all.size() / sizeof mine; ++r) {
    places.insert(std::string(reinterpret_cast<const char*>(all.data() + r * sizeof mine)));
  }
  return places.size() < all.size() / sizeof mine;
}

// The host-memory transport for id's ranks: shared memory (with windows of window_bytes) when
// every rank is on this host and communication allows it ("shm", "auto"), else the TCP ring. The
// ring is the bootstrap either way; with shared memory it is closed once the segment is set up.
// ConfigError for "shm" when a rank is elsewhere.
std::unique_ptr<Communicator> host_transport(std::unique_ptr<Communicator> ring,
                                             const RingIdentity& id,
                                             const std::string& communication,
                                             size_t window_bytes) {
  if (communication != "shm" && communication != "auto") return ring;
  std::string why;
  ShmOptions options;
  options.window_bytes = window_bytes;
  std::unique_ptr<Communicator> shm = ShmCommunicator::create(*ring, id, options, &why);
  if (shm) return shm;
  if (communication == "shm") {
    throw common::ConfigError(fmt::format(
        "train.communication: \"shm\" needs every worker on one host and able to share memory "
        "({}); use \"ring\" or \"auto\"",
        why));
  }
  spdlog::info("shared memory not used ({}): TCP ring", why);
  return ring;
}

const char* transport_name(const Communicator& c) {
  return dynamic_cast<const ShmCommunicator*>(&c) ? "shared memory" : "TCP ring";
}

}  // namespace

std::unique_ptr<Communicator> make_training_communicator(const RingIdentity& id,
                                                         const CommOptions& options,
                                                         nn::Device& device,
                                                         const std::string& communication) {
  bool gpu = device.kind() == nn::DeviceKind::kCuda;
  if (communication == "nccl" && !gpu) {
    throw common::ConfigError(
        nccl_available()
            ? "train.communication: \"nccl\": NCCL needs a GPU worker, and this one trains on the "
              "CPU "
              "(train.device); use \"ring\" or \"auto\""
            : "train.communication: \"nccl\" needs dtrain's CUDA build with NCCL; this build is "
              "CPU-only; use \"ring\" or \"auto\"");
  }
  std::unique_ptr<Communicator> ring = make_communicator(id, options);
  if (gpu && communication != "ring" && communication != "shm") {
    if (communication == "auto" && id.size > 1 && ranks_share_a_gpu(*ring, device)) {
      std::unique_ptr<Communicator> host =
          host_transport(std::move(ring), id, communication, /*window_bytes=*/0);
      spdlog::info(
          "communication: {} staged through host memory (workers share GPU {}, and NCCL refuses "
          "two ranks on one GPU)",
          transport_name(*host), device.location());
      return std::make_unique<HostStagedCommunicator>(std::move(host), device);
    }
    spdlog::info("communication: NCCL {} ({} rank(s))", nccl_version_string(), id.size);
    return make_nccl_communicator(std::move(ring), device);
  }
  if (id.size == 1) return ring;
  // A CPU trainer keeps its gradients in the window (Trainer), where peers sum them in place.
  std::unique_ptr<Communicator> host =
      host_transport(std::move(ring), id, communication, gpu ? 0 : kTrainingWindowBytes);
  if (gpu) {
    spdlog::info("communication: {} staged through host memory", transport_name(*host));
    return std::make_unique<HostStagedCommunicator>(std::move(host), device);
  }
  spdlog::info("communication: {}, gradient buckets reduced on a communication thread",
               transport_name(*host));
  return std::make_unique<ThreadedCommunicator>(std::move(host));
}

}  // namespace dtrain::comm
