// Who this worker is in the ring and what the rendezvous checks: shared by the acceptor, the
// connector and the TCP link, which use it for the handshake and to name peers in errors.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dtrain::comm {

struct RingIdentity {
  std::string job;
  uint32_t attempt = 0;
  uint32_t generation = 0;  ///< re-formations in place (docs/design.md#in-place-recovery)
  int rank = 0;
  int size = 1;
  std::string token;                   ///< DTRAIN_TOKEN; "" means no authentication
  std::vector<std::string> names;      ///< per rank, e.g. "worker:1"
  std::vector<std::string> addresses;  ///< per rank, "host:port" from TF_CONFIG

  int next() const { return (rank + 1) % size; }
  int previous() const { return (rank + size - 1) % size; }
  /// "worker:1 (rank 1)".
  std::string describe(int r) const {
    return names[static_cast<size_t>(r)] + " (rank " + std::to_string(r) + ")";
  }
};

/// Time-outs of the TCP ring; all generous by default, all named in the errors they cause.
struct CommOptions {
  double rendezvous_seconds = 60;   ///< for the whole ring to connect
  double handshake_seconds = 5;     ///< for one incoming connection to prove itself
  double collective_seconds = 600;  ///< for one send_recv of a collective
  /// Asked while the ring connects (every 0.1-0.5 s): true gives the rendezvous up at once with
  /// IoError (the launcher's notice named a newer generation: docs/design.md#in-place-recovery).
  /// Any thread may make it true. Empty: never.
  std::function<bool()> superseded;
};

}  // namespace dtrain::comm
