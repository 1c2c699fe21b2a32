// See frame.h.
#include "worker/comm/frame.h"

#include <fmt/format.h>

namespace dtrain::comm {
namespace {

void put_u32(unsigned char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(in[i]) << (8 * i);
  return v;
}

}  // namespace

void encode_header(const FrameHeader& header, unsigned char out[kFrameHeaderBytes]) {
  put_u32(out, static_cast<uint32_t>(header.type));
  put_u32(out + 4, header.length);
}

FrameHeader decode_header(const unsigned char in[kFrameHeaderBytes]) {
  return FrameHeader{static_cast<FrameType>(get_u32(in)), get_u32(in + 4)};
}

const char* frame_type_name(FrameType type) {
  switch (type) {
    case FrameType::kHello:
      return "hello";
    case FrameType::kChallenge:
      return "challenge";
    case FrameType::kProof:
      return "proof";
    case FrameType::kAccept:
      return "accept";
    case FrameType::kData:
      return "data";
    case FrameType::kAbort:
      return "abort";
    case FrameType::kGoodbye:
      return "goodbye";
  }
  return "unknown";
}

std::string check_header(const FrameHeader& header) {
  uint32_t limit = 0;
  switch (header.type) {
    case FrameType::kHello:
    case FrameType::kChallenge:
    case FrameType::kProof:
    case FrameType::kAccept:
      limit = kMaxHandshakePayload;
      break;
    case FrameType::kGoodbye:
      limit = 0;
      break;
    case FrameType::kAbort:
      limit = kMaxAbortPayload;
      break;
    case FrameType::kData:
      limit = kMaxDataPayload;
      break;
    default:
      return fmt::format("unknown frame type {}", static_cast<uint32_t>(header.type));
  }
  if (header.length > limit) {
    return fmt::format("{} frame of {} bytes exceeds the limit of {}", frame_type_name(header.type),
                       header.length, limit);
  }
  return "";
}

}  // namespace dtrain::comm
