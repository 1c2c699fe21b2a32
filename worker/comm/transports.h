// The transports, as a table (NCCL's habit): each entry says whether it can serve this worker and
// builds its communicator. comm_factory.cc walks the table in order of preference; a new
// transport is one entry here and one folder under comm/. Nothing else names the transports.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/ring_identity.h"
#include "worker/mem/device.h"
#include "worker/spec/communication.h"

namespace dtrain::comm {

/// Each CPU rank's shared-memory window for its gradients: models of up to 128M parameters keep
/// them there; larger ones go through the slots (a copy in and out, same bits).
inline constexpr size_t kTrainingWindowBytes = size_t{512} << 20;

/// What a transport is chosen for, and the TCP ring every transport bootstraps over, connected
/// on first use. One thread.
class TransportContext {
 public:
  /// id, options and device must outlive it.
  TransportContext(const RingIdentity& id, const CommOptions& options, Communication choice,
                   nn::Device& device)
      : id(id), options(options), choice(choice), device(device) {}

  /// The authenticated TCP ring (a SoloCommunicator for a world of one); the first call makes
  /// the rendezvous (blocks up to options.rendezvous_seconds; IoError naming who it waited for).
  Communicator& bootstrap();
  /// Hands the bootstrap over, connecting it first if no one has yet.
  std::unique_ptr<Communicator> take_bootstrap();

  const RingIdentity& id;
  const CommOptions& options;
  const Communication choice;
  nn::Device& device;

 private:
  std::unique_ptr<Communicator> bootstrap_;
};

struct Transport {
  Communication choice;  ///< the train.communication value that asks for this transport alone
  const char* name;      ///< in logs and errors: "NCCL", "shared memory", "TCP ring"
  /// Reduces device memory itself (NCCL), so only a GPU worker's "auto" considers it. A host
  /// transport is wrapped by the factory: a communication thread on the CPU, host staging on a
  /// GPU; in a world of one the factory returns the bootstrap instead.
  bool on_device;
  /// Whether it can serve ctx here; when not, *why_not says why. May run collectives on
  /// ctx.bootstrap(): every rank asks the same entries in the same order, so all agree.
  bool (*usable)(TransportContext& ctx, std::string* why_not);
  /// Builds it over ctx.bootstrap() (taking it when it keeps it). nullptr, with *why_not, when
  /// set-up finds it cannot serve (every rank agrees). Throws IoError when a peer fails.
  std::unique_ptr<Communicator> (*make)(TransportContext& ctx, std::string* why_not);
};

/// Every transport, in the order "auto" prefers them: NCCL, shared memory, the TCP ring.
const std::vector<Transport>& transports();

}  // namespace dtrain::comm
