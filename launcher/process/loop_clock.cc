// See loop_clock.h.
#include "launcher/process/loop_clock.h"

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <chrono>

#include "common/clock.h"

namespace dtrain::launcher {
namespace {

class SteadyTimer : public LoopTimer {
 public:
  explicit SteadyTimer(boost::asio::io_context& io) : timer_(io) {}
  void expires_after(double seconds) override {
    timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(std::max(0.0, seconds))));
  }
  void async_wait(Handler handler) override { timer_.async_wait(std::move(handler)); }
  void cancel() noexcept override {
    boost::system::error_code ignored;
    timer_.cancel(ignored);
  }

 private:
  boost::asio::steady_timer timer_;
};

class SteadyClock : public LoopClock {
 public:
  explicit SteadyClock(boost::asio::io_context& io) : io_(io) {}
  double now() const override { return common::monotonic_seconds(); }
  std::unique_ptr<LoopTimer> make_timer() override { return std::make_unique<SteadyTimer>(io_); }

 private:
  boost::asio::io_context& io_;
};

}  // namespace

std::unique_ptr<LoopClock> make_steady_clock(boost::asio::io_context& io) {
  return std::make_unique<SteadyClock>(io);
}

}  // namespace dtrain::launcher
