// A simulated LoopClock (launcher/process/loop_clock.h) for the supervisor's unit tests: time
// stands still while the loop has work, and advance() jumps it to the earliest pending timer, whose
// handlers are then posted to the loop in expiry order (ties in the order they were armed). A test
// run on it is a sequence of events, the same at every run and on any machine, however busy.
#pragma once

#include <algorithm>
#include <boost/asio/error.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "launcher/process/loop_clock.h"

namespace dtrain::testing {

class SimClock : public launcher::LoopClock {
 public:
  explicit SimClock(boost::asio::io_context& io, double start = 1000) : io_(io), now_(start) {}

  double now() const override { return now_; }
  std::unique_ptr<launcher::LoopTimer> make_timer() override {
    return std::make_unique<Timer>(this);
  }
  /// Jumps to the earliest pending expiry and posts the handlers due then; false when no timer
  /// waits (nothing would ever happen).
  bool advance() {
    double next = std::numeric_limits<double>::infinity();
    for (Timer* t : timers_)
      if (!t->waiting_.empty()) next = std::min(next, t->expiry_);
    if (next == std::numeric_limits<double>::infinity()) return false;
    now_ = std::max(now_, next);
    std::vector<std::pair<uint64_t, Timer*>> due;
    for (Timer* t : timers_)
      if (!t->waiting_.empty() && t->expiry_ <= now_) due.emplace_back(t->armed_, t);
    std::sort(due.begin(), due.end());
    for (auto& [order, t] : due) t->fire({});
    return true;
  }

 private:
  class Timer : public launcher::LoopTimer {
   public:
    explicit Timer(SimClock* clock) : clock_(clock), expiry_(clock->now_) {
      clock_->timers_.insert(this);
    }
    ~Timer() override { clock_->timers_.erase(this); }
    void expires_after(double seconds) override {
      fire(boost::asio::error::operation_aborted);
      expiry_ = clock_->now_ + std::max(0.0, seconds);
      armed_ = clock_->next_armed_++;
    }
    void async_wait(Handler handler) override {
      // An expiry already passed runs at the loop's next turn, as Asio's does.
      if (expiry_ <= clock_->now_) {
        boost::asio::post(clock_->io_, [h = std::move(handler)] { h({}); });
        return;
      }
      waiting_.push_back(std::move(handler));
    }
    void cancel() noexcept override { fire(boost::asio::error::operation_aborted); }

   private:
    friend class SimClock;
    void fire(boost::system::error_code ec) {
      std::vector<Handler> handlers = std::move(waiting_);
      waiting_.clear();
      for (Handler& h : handlers) boost::asio::post(clock_->io_, [h = std::move(h), ec] { h(ec); });
    }
    SimClock* clock_;
    double expiry_;
    uint64_t armed_ = 0;
    std::vector<Handler> waiting_;
  };

  boost::asio::io_context& io_;
  double now_;
  uint64_t next_armed_ = 0;
  std::set<Timer*> timers_;
};

}  // namespace dtrain::testing
