// The rendezvous handshake's messages and checks: magic, protocol version, job, attempt,
// generation, rank and
// world size, then mutual proof of DTRAIN_TOKEN by HMAC-SHA256 over fresh nonces (OpenSSL).
// Pure functions over bytes; which socket they travel on is the acceptor's and connector's job.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::comm {

inline constexpr uint32_t kMagic = 0x4E525444;   // "DTRN"
inline constexpr uint16_t kProtocolVersion = 2;  ///< 2: the generation after the attempt

using Nonce = std::array<unsigned char, 32>;
using Mac = std::array<unsigned char, 32>;

/// Who a connecting worker says it is.
struct Hello {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint32_t attempt = 0;
  uint32_t generation = 0;  ///< docs/design.md#in-place-recovery
  std::string job;
  Nonce nonce{};
};

std::vector<unsigned char> encode_hello(const Hello& hello);
/// Throws IoError("malformed hello: ...") when bytes are not a hello.
Hello decode_hello(const std::vector<unsigned char>& bytes);

/// "" when hello is what this worker expects from its ring predecessor; else the reason to refuse.
std::string check_hello(const Hello& hello, const std::string& job, uint32_t attempt,
                        uint32_t generation, uint32_t world_size, uint32_t expected_rank);

/// Fresh random nonce (OpenSSL RAND_bytes). Throws IoError if the generator fails.
Nonce random_nonce();

/// HMAC-SHA256 keyed by token over role, both nonces and the hello bytes: what each side sends
/// to prove it knows the token. role is "server" or "client" so one proof cannot be replayed
/// as the other.
Mac handshake_mac(const std::string& token, const std::string& role, const Nonce& first,
                  const Nonce& second, const std::vector<unsigned char>& hello_bytes);

/// Constant-time comparison.
bool macs_equal(const Mac& a, const Mac& b);

}  // namespace dtrain::comm
