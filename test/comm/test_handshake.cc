// Frames and the handshake's messages, without sockets: bounds per frame type, hello encoding,
// every refusal reason, and the HMAC proofs.
#include <catch2/catch.hpp>

#include "common/errors.h"
#include "worker/comm/frame.h"
#include "worker/comm/handshake.h"

using namespace dtrain::comm;

TEST_CASE("frame headers round-trip and are bounded per type") {
  unsigned char raw[kFrameHeaderBytes];
  encode_header({FrameType::kData, 123456}, raw);
  FrameHeader h = decode_header(raw);
  CHECK(h.type == FrameType::kData);
  CHECK(h.length == 123456);
  CHECK(check_header(h).empty());
  CHECK(check_header({FrameType::kHello, kMaxHandshakePayload}).empty());
  CHECK(check_header({FrameType::kHello, kMaxHandshakePayload + 1}).find("exceeds the limit") !=
        std::string::npos);
  CHECK(check_header({FrameType::kAbort, kMaxAbortPayload + 1}).find("abort frame") !=
        std::string::npos);
  CHECK(check_header({FrameType::kData, kMaxDataPayload + 1}).find("data frame") !=
        std::string::npos);
  CHECK(check_header({static_cast<FrameType>(99), 0}) == "unknown frame type 99");
}

TEST_CASE("a hello survives encoding, and each mismatch is a named refusal") {
  Hello hello;
  hello.rank = 3;
  hello.world_size = 4;
  hello.attempt = 2;
  hello.generation = 5;
  hello.job = "fashion-mnist";
  hello.nonce = random_nonce();
  Hello back = decode_hello(encode_hello(hello));
  CHECK(back.rank == 3);
  CHECK(back.world_size == 4);
  CHECK(back.attempt == 2);
  CHECK(back.generation == 5);
  CHECK(back.job == "fashion-mnist");
  CHECK(back.nonce == hello.nonce);
  CHECK(check_hello(back, "fashion-mnist", 2, 5, 4, 3).empty());
  CHECK(check_hello(back, "other", 2, 5, 4, 3) == "job \"fashion-mnist\" (this job is \"other\")");
  CHECK(check_hello(back, "fashion-mnist", 3, 5, 4, 3) == "attempt 2 (this group is attempt 3)");
  // A member of an older (or newer) generation of the same attempt is refused.
  CHECK(check_hello(back, "fashion-mnist", 2, 6, 4, 3) ==
        "generation 5 (this group is generation 6)");
  CHECK(check_hello(back, "fashion-mnist", 2, 5, 8, 3) == "world size 4 (this group has 8)");
  CHECK(check_hello(back, "fashion-mnist", 2, 5, 4, 1) == "rank 3 (only rank 1 connects here)");
  back.version = 9;
  CHECK(check_hello(back, "fashion-mnist", 2, 5, 4, 3).find("protocol version 9") == 0);
}

TEST_CASE("malformed hellos are IoErrors, never crashes") {
  std::vector<unsigned char> bytes = encode_hello(Hello{});
  std::vector<unsigned char> bad_magic = bytes;
  bad_magic[0] ^= 0xff;
  CHECK_THROWS_WITH(decode_hello(bad_magic), Catch::StartsWith("malformed hello: bad magic"));
  for (size_t cut : {size_t{0}, size_t{3}, size_t{17}, bytes.size() - 1}) {
    std::vector<unsigned char> truncated(bytes.begin(), bytes.begin() + static_cast<long>(cut));
    CHECK_THROWS_AS(decode_hello(truncated), dtrain::common::IoError);
  }
  std::vector<unsigned char> longer = bytes;
  longer.push_back(0);
  CHECK_THROWS_AS(decode_hello(longer), dtrain::common::IoError);
}

TEST_CASE("HMAC proofs depend on the token, the role and both nonces") {
  Nonce a = random_nonce(), b = random_nonce();
  CHECK(a != b);
  std::vector<unsigned char> hello = encode_hello(Hello{});
  Mac m = handshake_mac("token", "server", a, b, hello);
  CHECK(macs_equal(m, handshake_mac("token", "server", a, b, hello)));
  CHECK_FALSE(macs_equal(m, handshake_mac("tokem", "server", a, b, hello)));
  CHECK_FALSE(macs_equal(m, handshake_mac("token", "client", a, b, hello)));
  CHECK_FALSE(macs_equal(m, handshake_mac("token", "server", b, a, hello)));
  hello[5] ^= 1;
  CHECK_FALSE(macs_equal(m, handshake_mac("token", "server", a, b, hello)));
}
