// Catch2's main, compiled once and shared by every test executable, with a listener that repeats
// every failed assertion at the end of the run. The suites' workers and launchers write their
// logs to the same output, so Catch's own report of a failure sits in the middle of thousands of
// lines; CI keeps only the head and the tail of a failed suite's output, and the summary is the
// tail.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

namespace {

class FailureSummary : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(Catch::TestCaseInfo const& info) override { test_case_ = info.name; }

  bool assertionEnded(Catch::AssertionStats const& stats) override {
    const Catch::AssertionResult& r = stats.assertionResult;
    if (r.isOk()) return true;
    std::string text = "\n" + test_case_ + "\n  " + r.getSourceInfo().file + ":" +
                       std::to_string(r.getSourceInfo().line) + ": FAILED";
    if (r.hasExpression()) text += "\n  " + r.getExpressionInMacro();
    if (r.hasExpandedExpression()) text += "\n  with expansion: " + tail(r.getExpandedExpression());
    if (r.hasMessage()) text += "\n  " + tail(r.getMessage());
    for (const Catch::MessageInfo& info : stats.infoMessages)
      text += "\n  with: " + tail(info.message);
    failures_.push_back(text);
    return true;
  }

  void testRunEnded(Catch::TestRunStats const&) override {
    if (failures_.empty()) return;
    std::printf("\n== %zu failed assertion(s), repeated from above ==\n", failures_.size());
    for (const std::string& f : failures_) std::printf("%s\n", f.c_str());
    std::fflush(stdout);
  }

 private:
  // The end of a long text (an INFO of a process's whole output): what it ended with matters.
  static std::string tail(const std::string& text) {
    constexpr size_t kKeep = 1500;
    return text.size() <= kKeep ? text : "[...] " + text.substr(text.size() - kKeep);
  }
  std::string test_case_;
  std::vector<std::string> failures_;
};

}  // namespace

CATCH_REGISTER_LISTENER(FailureSummary)
