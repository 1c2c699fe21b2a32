// The client side of a launcher's control socket, shared by `dtrain status` and `dtrain stop`:
// one JSON request line, one reply line, and the fall-back to state.json when no launcher answers.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace dtrain::launcher {

/// Seconds a connected launcher has to answer.
inline constexpr double kReplySeconds = 5;

/// Sends request (one JSON object, no newline) to run_dir's launcher and returns its reply line;
/// nullopt when no launcher listens. Blocks up to kReplySeconds; throws IoError when a connected
/// launcher does not answer in that time, or when the socket is served by another user (not
/// root), who may have bound it first.
std::optional<std::string> ask_launcher(const std::string& run_dir, const std::string& request);

/// The run's state JSON and whether a launcher gave it (true) or it was read from state.json
/// (false). Throws ConfigError when neither exists.
std::pair<std::string, bool> read_state(const std::string& run_dir);

}  // namespace dtrain::launcher
