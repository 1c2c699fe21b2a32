// The event loop's time (docs/design.md#time-on-the-loop): what the supervisor and the remote
// children read as now, and the timers they wait on, through one seam. The launcher runs on the
// steady clock and Asio's timers; the supervisor's unit tests run on a simulated clock
// (test/launcher/sim_clock.h) that jumps from one timer to the next, so they assert order and
// outcome, never how long something took.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/system/error_code.hpp>
#include <functional>
#include <memory>

namespace dtrain::launcher {

/// One timer, as boost::asio::steady_timer behaves: a handler waits for its expiry and runs on
/// the loop, never inside the call that armed it; expires_after and cancel end every pending wait
/// with boost::asio::error::operation_aborted.
class LoopTimer {
 public:
  using Handler = std::function<void(const boost::system::error_code&)>;
  virtual ~LoopTimer() = default;
  /// Expiry seconds from now (a negative delay is now); pending waits are aborted.
  virtual void expires_after(double seconds) = 0;
  virtual void async_wait(Handler handler) = 0;
  virtual void cancel() noexcept = 0;
};

class LoopClock {
 public:
  virtual ~LoopClock() = default;
  /// Seconds; only differences mean anything.
  virtual double now() const = 0;
  virtual std::unique_ptr<LoopTimer> make_timer() = 0;
};

/// The steady clock (common::monotonic_seconds) and Asio timers on io.
std::unique_ptr<LoopClock> make_steady_clock(boost::asio::io_context& io);

}  // namespace dtrain::launcher
