// See control_client.h.
#include "launcher/control/control_client.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "common/atomic_file.h"
#include "common/clock.h"
#include "common/control_protocol.h"
#include "common/errors.h"
#include "common/run_dir.h"
#include "common/unique_fd.h"
#include "launcher/control/control_server.h"

namespace dtrain::launcher {

std::optional<std::string> ask_launcher(const std::string& run_dir, const std::string& request) {
  std::string path = control_socket_path(run_dir);
  common::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (!fd.valid() || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return std::nullopt;
  // Another user may have bound the socket first: never hand it a request, nor trust its reply.
  std::optional<unsigned> peer = common::control_peer_uid(fd.get());
  if (!peer || !common::trusted_control_peer(*peer, ::geteuid())) {
    throw common::IoError(fmt::format(
        "the control socket {} is served by uid {}, not by this user (uid {}); not talking to it",
        path, peer ? std::to_string(*peer) : "?", ::geteuid()));
  }
  std::string line = request + "\n";
  if (::send(fd.get(), line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
    return std::nullopt;
  std::string reply;
  double deadline = common::monotonic_seconds() + kReplySeconds;
  char buffer[4096];
  while (reply.find('\n') == std::string::npos) {
    pollfd p{fd.get(), POLLIN, 0};
    int left = static_cast<int>((deadline - common::monotonic_seconds()) * 1000);
    if (left <= 0 || ::poll(&p, 1, left) <= 0) {
      throw common::IoError(
          fmt::format("the launcher at {} did not answer within {:.0f} s", path, kReplySeconds));
    }
    ssize_t n = ::recv(fd.get(), buffer, sizeof buffer, 0);
    if (n <= 0) return std::nullopt;
    reply.append(buffer, static_cast<size_t>(n));
  }
  return reply.substr(0, reply.find('\n'));
}

std::pair<std::string, bool> read_state(const std::string& run_dir) {
  if (std::optional<std::string> reply = ask_launcher(run_dir, R"({"request":"status"})"))
    return {*reply, true};
  std::string path = common::RunDir(run_dir).state_json();
  try {
    return {common::read_file(path), false};
  } catch (const common::IoError&) {
    throw common::ConfigError(
        fmt::format("{}: no launcher answers and there is no state.json: was this run ever "
                    "launched?",
                    run_dir));
  }
}

}  // namespace dtrain::launcher
