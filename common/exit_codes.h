// Exit codes shared by dtrain and dtrain-worker (docs/design.md#exit-codes), and how main() maps
// exceptions onto them. Classifying a *child's* exit is the launcher's job, not this file's.
#pragma once

#include <functional>

namespace dtrain::common {

inline constexpr int kExitSuccess = 0;
inline constexpr int kExitFailure = 1;  ///< IoError or other runtime failure: restartable
inline constexpr int kExitConfig = 2;   ///< ConfigError: a person must fix the input
inline constexpr int kExitBug = 3;      ///< EnforceError: an internal invariant broke
inline constexpr int kExitTensorFlowPreempted = 42;
inline constexpr int kExitPreempted = 143;  ///< dtrain-worker after a preemption save (128+SIGTERM)

/// Runs body and turns what it throws into an exit code, printing one line "<program>: error: ..."
/// to stderr. Never lets an exception escape; used only by main().
int run_main(const char* program, const std::function<int()>& body);

}  // namespace dtrain::common
