// What a peer sends before it is authenticated (worker/comm/frame.h, handshake.h): the 8-byte
// frame header and the hello. A header that passes check_header stays within its type's bound;
// a hello that decodes encodes back to the same bytes.
#include <vector>

#include "test/fuzz/fuzz_support.h"
#include "worker/comm/frame.h"
#include "worker/comm/handshake.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  if (size >= comm::kFrameHeaderBytes) {
    const comm::FrameHeader header = comm::decode_header(data);
    if (comm::check_header(header).empty()) {
      fuzz::require(header.length <= comm::kMaxDataPayload, "an accepted frame is bounded");
      unsigned char again[comm::kFrameHeaderBytes];
      comm::encode_header(header, again);
      fuzz::require(std::equal(again, again + comm::kFrameHeaderBytes, data),
                    "an accepted header encodes to the same bytes");
    }
    comm::frame_type_name(header.type);
  }
  const std::vector<unsigned char> bytes(data, data + size);
  comm::Hello hello;
  if (!fuzz::accepts([&] { hello = comm::decode_hello(bytes); })) return 0;
  fuzz::require(comm::encode_hello(hello) == bytes, "a decoded hello encodes to the same bytes");
  comm::check_hello(hello, "job", 0, 0, 0, 2);
  return 0;
}
