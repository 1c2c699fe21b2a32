// The connecting half of the rendezvous, and rendezvous() itself: connect to the next rank,
// retrying until the deadline, prove the token, and wait for the previous rank's connection.
#include <spdlog/spdlog.h>

#include <thread>

#include "common/cluster_spec.h"
#include "common/errors.h"
#include "worker/comm/handshake.h"
#include "worker/comm/tcp/tcp_ring_link.h"

namespace dtrain::comm {
namespace {

// Client half of the handshake (server half: Acceptor::handshake). Throws IoError with the reason.
void prove_identity(int fd, const RingIdentity& id, const CommOptions& options,
                    const std::string& peer) {
  Deadline deadline(options.handshake_seconds, "the handshake");
  Hello hello;
  hello.rank = static_cast<uint32_t>(id.rank);
  hello.world_size = static_cast<uint32_t>(id.size);
  hello.attempt = id.attempt;
  hello.generation = id.generation;
  hello.job = id.job;
  hello.nonce = random_nonce();
  std::vector<unsigned char> hello_bytes = encode_hello(hello);
  write_frame(fd, FrameType::kHello, hello_bytes.data(), hello_bytes.size(), deadline, peer);
  std::vector<unsigned char> challenge = read_frame(fd, FrameType::kChallenge, deadline, peer);
  Nonce server_nonce{};
  Mac server_mac{};
  if (challenge.size() != server_nonce.size() + server_mac.size())
    throw common::IoError("malformed challenge");
  std::copy(challenge.begin(), challenge.begin() + 32, server_nonce.begin());
  std::copy(challenge.begin() + 32, challenge.end(), server_mac.begin());
  if (!macs_equal(server_mac,
                  handshake_mac(id.token, "server", hello.nonce, server_nonce, hello_bytes))) {
    send_abort(fd,
               "wrong token: the server's HMAC of the nonces does not match this worker's token");
    throw common::IoError("it does not know this job's token");
  }
  Mac proof = handshake_mac(id.token, "client", server_nonce, hello.nonce, hello_bytes);
  write_frame(fd, FrameType::kProof, proof.data(), proof.size(), deadline, peer);
  read_frame(fd, FrameType::kAccept, deadline, peer);
}

}  // namespace

common::UniqueFd connect_to_next(const RingIdentity& id, const CommOptions& options,
                                 const Deadline& deadline) {
  const std::string& address = id.addresses[static_cast<size_t>(id.next())];
  common::HostPort hp = common::parse_host_port(address, id.names[static_cast<size_t>(id.next())]);
  std::string peer = id.describe(id.next());
  std::string last_error = "never tried";
  double pause = 0.02;
  while (!deadline.expired()) {
    if (options.superseded && options.superseded()) throw common::IoError(kSuperseded);
    common::UniqueFd fd = connect_once(hp.host, hp.port, 1.0, last_error);
    if (fd.valid()) {
      try {
        prove_identity(fd.get(), id, options, peer);
        return fd;
      } catch (const common::IoError& e) {
        last_error = e.what();  // e.g. a stale worker of an earlier attempt still holds the port
        spdlog::debug("handshake with {} at {} failed: {}", peer, address, last_error);
      }
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(pause));
    pause = std::min(pause * 2, 0.5);
  }
  throw common::IoError(
      fmt::format("rendezvous: {} at {} did not accept within {:.0f} s (last error: {})", peer,
                  address, deadline.seconds(), last_error));
}

std::unique_ptr<TcpRingLink> rendezvous(const RingIdentity& id, const CommOptions& options) {
  DT_ENFORCE(id.size >= 2 && id.rank >= 0 && id.rank < id.size, "ring of {} with rank {}", id.size,
             id.rank);
  DT_ENFORCE_EQ(id.addresses.size(), static_cast<size_t>(id.size));
  if (id.token.empty()) spdlog::warn("DTRAIN_TOKEN is not set: peers are not authenticated");
  auto acceptor = std::make_unique<Acceptor>(id, options);
  Deadline deadline(options.rendezvous_seconds, "the ring to connect");
  common::UniqueFd next = connect_to_next(id, options, deadline);
  common::UniqueFd previous = acceptor->wait_for_previous(deadline);
  spdlog::info("ring connected: {} -> {} -> {}", id.describe(id.previous()), id.describe(id.rank),
               id.describe(id.next()));
  return std::make_unique<TcpRingLink>(id, options, std::move(next), std::move(previous),
                                       std::move(acceptor));
}

}  // namespace dtrain::comm
