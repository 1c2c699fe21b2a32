// The listening side of the rendezvous: listens on this worker's TF_CONFIG address for the whole
// job, runs each incoming connection's handshake on a short-lived thread with a deadline, hands
// the one authenticated connection from the ring predecessor to the caller, and refuses and logs
// everything else (port scanners, stray workers of other attempts, wrong tokens, garbage,
// oversized or half-sent frames) without disturbing the job. What an unauthenticated peer costs
// is bounded: a fixed number of handshake slots, a handshake-sized frame, and a rate-limited log.
#pragma once

#include <condition_variable>
#include <list>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "common/unique_fd.h"
#include "worker/comm/ring_identity.h"
#include "worker/comm/tcp/tcp_socket.h"

namespace dtrain::comm {

/// Logs the first `budget` refusals of each interval, and the first of each kind (up to 2 x budget
/// kinds), one by one; only counts the rest, with one summary line when the interval ends: a
/// flood of connections cannot flood the log. Not thread-safe; the acceptor calls it under its
/// lock.
class RefusalLog {
 public:
  RefusalLog(int budget, double interval_seconds);
  void refused(const std::string& peer, const std::string& reason, double now);
  /// Logs how many refusals went unlogged once their interval has ended.
  void flush(double now);

 private:
  int budget_;
  double interval_;
  double started_ = -1;  ///< when the current interval began; < 0: none
  int logged_ = 0;
  int unlogged_ = 0;
  std::set<std::string> kinds_;  ///< reasons (without the peer) logged in this interval
};

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

  /// How many connections were refused or closed unauthenticated so far (for tests and logs).
  int refused() const;

 private:
  /// A connection whose handshake thread is running.
  struct Pending {
    int fd;
    double accepted_at;    ///< monotonic seconds
    bool evicted = false;  ///< shut down to make room for a newer connection
  };

  void accept_loop();
  bool ready_to_accept(int& wait_ms) const;
  void accept_one();
  void evict_oldest();
  void join_finished_handshakes();
  void handshake(int fd);
  void authenticate(int fd, const std::string& peer, const Deadline& deadline);
  std::string hand_over(common::UniqueFd& owned, const std::string& peer, const Deadline& deadline);
  bool forget_pending(int fd);

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
  double paused_until_ = 0;  ///< accept() ran out of descriptors: retry after this time
  RefusalLog refusals_;
  std::list<Pending> pending_;         ///< in accept order, oldest first
  std::list<std::thread> handshakes_;  ///< finished ones are joined by the accept loop
  std::list<std::thread::id> finished_;
  std::thread thread_;
};

}  // namespace dtrain::comm
