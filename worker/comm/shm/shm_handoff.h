// How the segment's descriptor reaches the other ranks of a host: rank 0 listens on a UNIX
// socket in the abstract namespace (no file is created; the name dies with the socket) and sends
// the memfd with SCM_RIGHTS to each peer that proves, by SO_PEERCRED, to be the process the
// bootstrap named. Only the hand-off: no segment layout, no collectives.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "worker/comm/ring_identity.h"

namespace dtrain::comm {

/// "dtrain-shm-" + 16 hex digits of a hash of token, job, attempt and rank 0's pid: the abstract
/// name (without its leading NUL) rank 0 listens on. The token only enters through the hash.
std::string shm_socket_name(const RingIdentity& id, pid_t rank0_pid);

/// Rank 0's listening socket, closed (and its name gone) when this object is destroyed.
class FdServer {
 public:
  /// Binds and listens (backlog: every peer can connect before any accept). Throws IoError,
  /// e.g. when the name is taken.
  FdServer(const std::string& name, int peers);

  /// Accepts connections until every rank 1..size-1 has said its rank from the process
  /// pids[rank] (same user) and has been sent fd; strangers are closed and skipped. Blocks up to
  /// timeout_seconds in all, then throws IoError naming the ranks that never came.
  void hand_out(int fd, const std::vector<pid_t>& pids, const RingIdentity& id,
                double timeout_seconds);

 private:
  common::UniqueFd listener_;
  std::string name_;
};

/// A peer: connects to rank 0's socket and says its rank. Never blocks for long (the server
/// listens before any peer connects). Throws IoError, e.g. ECONNREFUSED from another network
/// namespace, where the name does not exist.
common::UniqueFd connect_to_fd_server(const std::string& name, int rank);

/// A peer: waits up to timeout_seconds for rank 0 (process rank0_pid, same user) to send the
/// segment's descriptor on connection. Throws IoError naming what it waited for.
common::UniqueFd receive_segment_fd(int connection, pid_t rank0_pid, double timeout_seconds);

}  // namespace dtrain::comm
