// See comm_factory.h.
#include "worker/comm/comm_factory.h"

#include "common/env_vars.h"
#include "common/errors.h"
#include "worker/comm/ring_communicator.h"
#include "worker/comm/tcp_ring_link.h"

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

}  // namespace dtrain::comm
