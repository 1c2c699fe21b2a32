// Exit codes shared by dtrain and dtrain-worker (docs/design.md#exit-codes), and how main() maps
// exceptions onto them. Classifying a *child's* exit is the launcher's job, not this file's.
#pragma once

#include <functional>

namespace dtrain::common {

inline constexpr int kExitSuccess = 0;
inline constexpr int kExitFailure = 1;  ///< IoError or other runtime failure: restartable
inline constexpr int kExitConfig = 2;   ///< ConfigError: a person must fix the input
inline constexpr int kExitBug = 3;      ///< EnforceError: an internal invariant broke
/// dtrain-worker: the loss or the weights became NaN or infinite (TerminateOnNaN). Not
/// restarted: the same data would give the same NaN.
inline constexpr int kExitNonFinite = 4;
inline constexpr int kExitTensorFlowPreempted = 42;  ///< TensorFlow's code after a preemption
/// A shell reports a child's death by signal N as exit code kExitSignalBase + N.
inline constexpr int kExitSignalBase = 128;
inline constexpr int kExitInterrupted = 130;  ///< 128 + SIGINT, from a shell: preempted
inline constexpr int kExitKilled = 137;       ///< 128 + SIGKILL, from a shell: preempted
inline constexpr int kExitPreempted = 143;  ///< dtrain-worker after a preemption save (128+SIGTERM)

/// Runs body and turns what it throws into an exit code, printing one line "<program>: error: ..."
/// to stderr. Never lets an exception escape; used only by main().
int run_main(const char* program, const std::function<int()>& body);

}  // namespace dtrain::common
