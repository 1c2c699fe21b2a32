// The one place that chooses a Communicator: alone (world size 1), or the first transport of the
// table (transports.h: NCCL, shared memory, the TCP ring) that train.communication asks for and
// that can serve this worker, wrapped for the trainer (a communication thread on the host, staged
// through the host on a GPU). Also builds the ring identity from TF_CONFIG and the environment.
#pragma once

#include <memory>
#include <string>

#include "common/tf_config.h"
#include "worker/comm/communicator.h"
#include "worker/comm/ring_identity.h"
#include "worker/mem/device.h"
#include "worker/spec/communication.h"

namespace dtrain::comm {

/// Rank, size, names and addresses of the training ring (chief first, then workers, TF_CONFIG's
/// rule). Throws ConfigError when the task does not train (evaluator, ps).
RingIdentity ring_identity(const common::TfConfig& tf, const std::string& job, int attempt,
                           const std::string& token);

/// ring_identity() with the job from DTRAIN_JOB (else fallback_job), the attempt from
/// DTRAIN_ATTEMPT and the generation from DTRAIN_GENERATION (ConfigError when either is not a
/// number) and the token from DTRAIN_TOKEN.
RingIdentity ring_identity_from_environment(const common::TfConfig& tf,
                                            const std::string& fallback_job);

/// The attempt in DTRAIN_ATTEMPT (0 when unset); ConfigError when it is not a number.
int attempt_from_environment();
/// The generation in DTRAIN_GENERATION (0 when unset); ConfigError when it is not a number.
int generation_from_environment();

/// A SoloCommunicator for a ring of one, else a RingCommunicator over TCP after rendezvous
/// (blocks up to options.rendezvous_seconds; IoError naming who it waited for). Host memory only.
std::unique_ptr<Communicator> make_communicator(const RingIdentity& id, const CommOptions& options);

/// The communicator for training on device, for train.communication, chosen by walking the
/// transport table (transports.h) in order: the named transport alone, or for auto each in turn.
/// - nccl: NCCL over the ring's rendezvous; ConfigError naming NCCL for a host device or a
///   CPU-only build.
/// - ring: the TCP ring; on the host with a communication thread (asynchronous buckets), on a
///   GPU staged through host memory.
/// - shm: shared memory (shm/shm_communicator.h), set up over the ring, which is then closed; like
///   the ring on the host (communication thread) and on a GPU (staged). On the host it has
///   windows of kTrainingWindowBytes (transports.h; address space; pages only as written) for the
///   gradients.
///   ConfigError when a rank is on another host.
/// - auto: NCCL for GPU workers unless two of them share one GPU (NCCL refuses that; the ranks
///   compare host name and PCI bus id over the ring); otherwise shared memory when every rank is
///   on this host, else the ring, as above.
/// Logs what it chose and why. Blocks for the rendezvous as make_communicator().
std::unique_ptr<Communicator> make_training_communicator(const RingIdentity& id,
                                                         const CommOptions& options,
                                                         nn::Device& device,
                                                         Communication communication);

}  // namespace dtrain::comm
