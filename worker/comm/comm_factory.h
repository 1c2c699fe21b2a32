// The one place that chooses a Communicator: alone (world size 1) or the TCP ring. (NCCL joins
// here with the CUDA backend.) Also builds the ring identity from TF_CONFIG and the environment.
#pragma once

#include <memory>
#include <string>

#include "common/tf_config.h"
#include "worker/comm/communicator.h"
#include "worker/comm/ring_identity.h"

namespace dtrain::comm {

/// Rank, size, names and addresses of the training ring (chief first, then workers, TF_CONFIG's
/// rule). Throws ConfigError when the task does not train (evaluator, ps).
RingIdentity ring_identity(const common::TfConfig& tf, const std::string& job, int attempt,
                           const std::string& token);

/// ring_identity() with the job from DTRAIN_JOB (else fallback_job), the attempt from
/// DTRAIN_ATTEMPT (ConfigError when it is not a number) and the token from DTRAIN_TOKEN.
RingIdentity ring_identity_from_environment(const common::TfConfig& tf,
                                            const std::string& fallback_job);

/// The attempt in DTRAIN_ATTEMPT (0 when unset); ConfigError when it is not a number.
int attempt_from_environment();

/// A SoloCommunicator for a ring of one, else a RingCommunicator over TCP after rendezvous
/// (blocks up to options.rendezvous_seconds; IoError naming who it waited for).
std::unique_ptr<Communicator> make_communicator(const RingIdentity& id, const CommOptions& options);

}  // namespace dtrain::comm
