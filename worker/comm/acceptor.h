// The listening side of the rendezvous: listens on this worker's TF_CONFIG address for the whole
// job, runs each incoming connection's handshake on a short-lived thread with a deadline, hands
// the one authenticated connection from the ring predecessor to the caller, and refuses and logs
// everything else (port scanners, stray workers of other attempts, wrong tokens, garbage,
// oversized or half-sent frames) without disturbing the job.
#pragma once

#include <condition_variable>
#include <list>
#include <mutex>
#include <thread>

#include "common/unique_fd.h"
#include "worker/comm/ring_identity.h"
#include "worker/comm/tcp_socket.h"

namespace dtrain::comm {

class Acceptor {
 public:
  /// Binds id.addresses[id.rank] now (IoError naming it when it cannot) and starts the thread.
  Acceptor(const RingIdentity& id, const CommOptions& options);
  /// Stops listening and ends pending handshakes; joins every thread (at most ~100 ms).
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  /// The authenticated connection from the previous rank, once it arrives. Throws IoError
  /// naming that worker and this address when the deadline passes first.
  common::UniqueFd wait_for_previous(const Deadline& deadline);

  /// How many connections were refused so far (for tests and logs).
  int refused() const;

 private:
  void accept_loop();
  void handshake(int fd);
  void refuse(int fd, const std::string& peer, const std::string& reason);

  RingIdentity id_;
  CommOptions options_;
  common::UniqueFd listener_;
  common::UniqueFd wake_read_, wake_write_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  common::UniqueFd previous_;  ///< set once, taken by wait_for_previous
  bool previous_taken_ = false;
  bool stopping_ = false;
  int refused_ = 0;
  std::list<int> pending_fds_;         ///< connections in handshake, to shut down on stop
  std::list<std::thread> handshakes_;  ///< finished ones are joined by the accept loop
  std::list<std::thread::id> finished_;
  std::thread thread_;
};

}  // namespace dtrain::comm
