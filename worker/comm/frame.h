// Wire frames between workers: an 8-byte header (type, payload length; little-endian) and a
// payload whose length is bounded per type. Encoding and checking only; sockets are elsewhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dtrain::comm {

enum class FrameType : uint32_t {
  kHello = 1,      ///< client -> server: who I am, client nonce
  kChallenge = 2,  ///< server -> client: server nonce, server's proof
  kProof = 3,      ///< client -> server: client's proof
  kAccept = 4,     ///< server -> client: handshake done
  kData = 5,       ///< collective payload
  kAbort = 6,      ///< "this worker failed", with a message; then the link closes
  kGoodbye = 7,    ///< "this worker is done and closes its end"; no payload
};

inline constexpr size_t kFrameHeaderBytes = 8;
inline constexpr uint32_t kMaxHandshakePayload = 1024;
inline constexpr uint32_t kMaxAbortPayload = 4096;
inline constexpr uint32_t kMaxDataPayload = 16u << 20;

struct FrameHeader {
  FrameType type = FrameType::kData;
  uint32_t length = 0;
};

void encode_header(const FrameHeader& header, unsigned char out[kFrameHeaderBytes]);
FrameHeader decode_header(const unsigned char in[kFrameHeaderBytes]);

/// "" when the header is acceptable (known type, length within its bound); else why not.
std::string check_header(const FrameHeader& header);

const char* frame_type_name(FrameType type);

}  // namespace dtrain::comm
