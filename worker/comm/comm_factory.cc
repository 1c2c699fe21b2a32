// See comm_factory.h.
#include "worker/comm/comm_factory.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "common/env_vars.h"
#include "common/errors.h"
#include "worker/comm/host_staged_communicator.h"
#include "worker/comm/ring_communicator.h"
#include "worker/comm/tcp/tcp_ring_link.h"
#include "worker/comm/threaded_communicator.h"
#include "worker/comm/transports.h"

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

namespace {

int count_from_environment(const common::EnvVar& var) {
  std::string text = common::get_env_or_default(var);
  if (text.empty() || text.size() > 9 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    throw common::ConfigError(fmt::format("{}=\"{}\": expected a number", var.name, text));
  }
  return std::stoi(text);
}

}  // namespace

int attempt_from_environment() {
  return count_from_environment(common::kEnvAttempt);
}

int generation_from_environment() {
  return count_from_environment(common::kEnvGeneration);
}

RingIdentity ring_identity_from_environment(const common::TfConfig& tf,
                                            const std::string& fallback_job) {
  RingIdentity id =
      ring_identity(tf, common::get_env(common::kEnvJob).value_or(fallback_job),
                    attempt_from_environment(), common::get_env_or_default(common::kEnvToken));
  id.generation = static_cast<uint32_t>(generation_from_environment());
  return id;
}

std::unique_ptr<Communicator> make_communicator(const RingIdentity& id,
                                                const CommOptions& options) {
  if (id.size == 1) return std::make_unique<SoloCommunicator>();
  return std::make_unique<RingCommunicator>(rendezvous(id, options), id.rank, id.size);
}

namespace {

// Whether the walk over the table looks at t for this choice: the named transport alone, or for
// "auto" each in turn, where an on-device transport needs a GPU worker.
bool considered(const Transport& t, Communication communication, bool gpu) {
  switch (communication) {
    case Communication::kAuto:
      return gpu || !t.on_device;
    case Communication::kRing:
    case Communication::kShm:
    case Communication::kNccl:
      return t.choice == communication;
  }
  return false;
}

// A host transport with what the trainer needs around it: a communication thread on the CPU
// (asynchronous buckets), staging through host memory on a GPU.
std::unique_ptr<Communicator> wrap_host_transport(std::unique_ptr<Communicator> host,
                                                  const Transport& t, nn::Device& device) {
  if (device.kind() == nn::DeviceKind::kCuda) {
    spdlog::info("communication: {} staged through host memory", t.name);
    return std::make_unique<HostStagedCommunicator>(std::move(host), device);
  }
  spdlog::info("communication: {}, gradient buckets reduced on a communication thread", t.name);
  return std::make_unique<ThreadedCommunicator>(std::move(host));
}

}  // namespace

std::unique_ptr<Communicator> make_training_communicator(const RingIdentity& id,
                                                         const CommOptions& options,
                                                         nn::Device& device,
                                                         Communication communication) {
  const bool gpu = device.kind() == nn::DeviceKind::kCuda;
  TransportContext ctx(id, options, communication, device);
  const std::vector<Transport>& table = transports();
  std::string passed_over;  // "auto": the last transport not used, and why
  for (const Transport& t : table) {
    if (!considered(t, communication, gpu)) continue;
    if (!passed_over.empty()) spdlog::info("{}: {}", std::exchange(passed_over, ""), t.name);
    if (!t.on_device && id.size == 1) return ctx.take_bootstrap();  // a world of one
    std::string why;
    std::unique_ptr<Communicator> made;
    if (t.usable(ctx, &why)) made = t.make(ctx, &why);
    if (made && t.on_device) return made;
    if (made) return wrap_host_transport(std::move(made), t, device);
    if (communication != Communication::kAuto) {
      throw common::ConfigError(
          fmt::format("train.communication: \"{}\": {} cannot be used here: {}; use \"ring\" or "
                      "\"auto\"",
                      communication_name(communication), t.name, why));
    }
    passed_over = fmt::format("{} not used ({})", t.name, why);
  }
  // The TCP ring is always usable, so "auto" never gets here.
  throw common::EnforceError(fmt::format("no transport for train.communication \"{}\"",
                                         communication_name(communication)));
}

}  // namespace dtrain::comm
