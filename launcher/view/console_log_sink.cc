// See console_log_sink.h. One sink wraps the logger's sinks: they still format and colour each
// line; this sink only brackets their writes with the console's erase and redraw.
#include "launcher/view/console_log_sink.h"

#include <spdlog/sinks/sink.h>
#include <spdlog/spdlog.h>

#include <mutex>
#include <vector>

namespace dtrain::launcher {
namespace {

class ConsoleLogSink final : public spdlog::sinks::sink {
 public:
  ConsoleLogSink(Console& console, std::vector<spdlog::sink_ptr> inner)
      : console_(console), inner_(std::move(inner)) {}

  void log(const spdlog::details::log_msg& message) override {
    std::lock_guard<std::mutex> lock(mutex_);
    console_.print_outside([&] {
      for (const auto& sink : inner_) {
        if (!sink->should_log(message.level)) continue;
        sink->log(message);
        sink->flush();
      }
    });
  }
  void flush() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& sink : inner_) sink->flush();
  }
  void set_pattern(const std::string& pattern) override {
    for (const auto& sink : inner_) sink->set_pattern(pattern);
  }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    for (const auto& sink : inner_) sink->set_formatter(formatter->clone());
  }

 private:
  Console& console_;
  std::vector<spdlog::sink_ptr> inner_;
  std::mutex mutex_;
};

}  // namespace

struct ConsoleLogRoute::Saved {
  std::shared_ptr<spdlog::logger> logger;
  std::vector<spdlog::sink_ptr> sinks;
};

ConsoleLogRoute::ConsoleLogRoute(Console& console) {
  if (!console.interactive()) return;
  std::shared_ptr<spdlog::logger> logger = spdlog::default_logger();
  if (!logger) return;
  saved_ = std::make_unique<Saved>(Saved{logger, logger->sinks()});
  logger->sinks() = {std::make_shared<ConsoleLogSink>(console, saved_->sinks)};
}

ConsoleLogRoute::~ConsoleLogRoute() {
  if (saved_) saved_->logger->sinks() = saved_->sinks;
}

}  // namespace dtrain::launcher
