// See handshake.h. The one file that uses OpenSSL.
#include "worker/comm/handshake.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/errors.h"

namespace dtrain::comm {
namespace {

void put(std::vector<unsigned char>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

uint64_t get(const std::vector<unsigned char>& in, size_t& at, int bytes) {
  if (at + static_cast<size_t>(bytes) > in.size())
    throw common::IoError("malformed hello: too short");
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(in[at + static_cast<size_t>(i)]) << (8 * i);
  at += static_cast<size_t>(bytes);
  return v;
}

}  // namespace

std::vector<unsigned char> encode_hello(const Hello& h) {
  std::vector<unsigned char> out;
  put(out, h.magic, 4);
  put(out, h.version, 2);
  put(out, h.rank, 4);
  put(out, h.world_size, 4);
  put(out, h.attempt, 4);
  put(out, h.generation, 4);
  put(out, h.job.size(), 2);
  out.insert(out.end(), h.job.begin(), h.job.end());
  out.insert(out.end(), h.nonce.begin(), h.nonce.end());
  return out;
}

Hello decode_hello(const std::vector<unsigned char>& bytes) {
  Hello h;
  size_t at = 0;
  h.magic = static_cast<uint32_t>(get(bytes, at, 4));
  if (h.magic != kMagic)
    throw common::IoError(fmt::format("malformed hello: bad magic {:#x}", h.magic));
  h.version = static_cast<uint16_t>(get(bytes, at, 2));
  h.rank = static_cast<uint32_t>(get(bytes, at, 4));
  h.world_size = static_cast<uint32_t>(get(bytes, at, 4));
  h.attempt = static_cast<uint32_t>(get(bytes, at, 4));
  h.generation = static_cast<uint32_t>(get(bytes, at, 4));
  size_t job_size = get(bytes, at, 2);
  if (at + job_size + h.nonce.size() != bytes.size())
    throw common::IoError("malformed hello: bad length");
  h.job.assign(bytes.begin() + static_cast<long>(at),
               bytes.begin() + static_cast<long>(at + job_size));
  std::copy(bytes.end() - static_cast<long>(h.nonce.size()), bytes.end(), h.nonce.begin());
  return h;
}

std::string check_hello(const Hello& h, const std::string& job, uint32_t attempt,
                        uint32_t generation, uint32_t world_size, uint32_t expected_rank) {
  if (h.version != kProtocolVersion) {
    return fmt::format("protocol version {} (this worker speaks {})", h.version, kProtocolVersion);
  }
  if (h.job != job) return fmt::format("job \"{}\" (this job is \"{}\")", h.job, job);
  if (h.attempt != attempt)
    return fmt::format("attempt {} (this group is attempt {})", h.attempt, attempt);
  if (h.generation != generation) {  // a member of another generation never rejoins
    return fmt::format("generation {} (this group is generation {})", h.generation, generation);
  }
  if (h.world_size != world_size) {
    return fmt::format("world size {} (this group has {})", h.world_size, world_size);
  }
  if (h.rank != expected_rank) {
    return fmt::format("rank {} (only rank {} connects here)", h.rank, expected_rank);
  }
  return "";
}

Nonce random_nonce() {
  Nonce nonce{};
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    throw common::IoError("OpenSSL RAND_bytes failed");
  }
  return nonce;
}

Mac handshake_mac(const std::string& token, const std::string& role, const Nonce& first,
                  const Nonce& second, const std::vector<unsigned char>& hello_bytes) {
  std::vector<unsigned char> message(role.begin(), role.end());
  message.insert(message.end(), first.begin(), first.end());
  message.insert(message.end(), second.begin(), second.end());
  message.insert(message.end(), hello_bytes.begin(), hello_bytes.end());
  Mac mac{};
  unsigned int length = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), message.data(), message.size(),
       mac.data(), &length);
  DT_ENFORCE_EQ(length, mac.size(), "HMAC-SHA256 length");
  return mac;
}

bool macs_equal(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace dtrain::comm
