// The oneDNN backend's own float32-to-bf16 loop (bf16_rounding.h) against oneDNN's reorder, bit
// for bit: special values, every tail length, random bit patterns, one and two threads; and
// both against the rule they implement (round to nearest even, subnormals to zero, NaN quieted).
// Likewise its packing of a dense kernel into the blocked layout of oneDNN's bf16 matmuls, with
// the plain rounding beside it. Where the CPU lacks AVX512_BF16 the loops must say so and write
// nothing.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "worker/nn/bf16_rounding.h"

using namespace dtrain::nn;

namespace {

float from_bits(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// The rule: subnormal inputs (and zeros) become signed zero, NaN keeps its sign and top bits with
// the quiet bit set, everything else rounds to the nearest bf16, ties to even.
uint16_t rule(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  if (magnitude < 0x00800000u) return static_cast<uint16_t>((bits >> 16) & 0x8000u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Where two bit vectors first differ (-1: nowhere, and the same size), so that a failure names
// one place instead of printing millions of elements.
int64_t first_difference(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::min(a.size(), b.size()));
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return -1;
}

std::vector<float> specials() {
  const uint32_t bits[] = {0x00000000, 0x80000000, 0x00000001, 0x00008000, 0x00018000, 0x007fffff,
                           0x807fffff, 0x00800000, 0x80800000, 0x3f800000, 0x3f808000, 0x3f818000,
                           0x3f80c000, 0x3f807fff, 0x3f800001, 0xbf808000, 0xbf818000, 0x7f7fffff,
                           0xff7fffff, 0x7f7f8000, 0x7f800000, 0xff800000, 0x7f800001, 0xff800001,
                           0x7fc00000, 0xffc00001, 0x7f810000, 0x40490fdb};
  std::vector<float> v;
  for (uint32_t b : bits) v.push_back(from_bits(b));
  return v;
}

std::vector<uint16_t> by_onednn(const std::vector<float>& in) {
  std::vector<uint16_t> out(in.size());
  bf16_rounding::round_onednn(in.data(), in.size(), out.data());
  return out;
}

std::vector<uint16_t> by_loop(const std::vector<float>& in, int threads) {
  std::vector<uint16_t> out(in.size() + 1, 0xabcd);  // one past the end: must stay
  omp_set_num_threads(threads);
  REQUIRE(bf16_rounding::round_vectorized(in.data(), in.size(), out.data()));
  CHECK(out.back() == 0xabcd);
  out.pop_back();
  return out;
}

}  // namespace

// Subnormals and NaN are the instruction's choices: where the CPU lacks AVX512_BF16 (and so the
// backend has no bf16 mode) oneDNN converts in software and may keep subnormals; every CPU agrees
// on the rest.
TEST_CASE("oneDNN's reorder rounds to bf16 by the rule", "[bf16]") {
  std::vector<float> in = specials();
  std::vector<uint16_t> out = by_onednn(in);
  for (size_t i = 0; i < in.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &in[i], sizeof bits);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (!bf16_rounding::vectorized() && (magnitude > 0x7f800000u || magnitude < 0x00800000u))
      continue;
    INFO("input " << i);
    CHECK(out[i] == rule(in[i]));
  }
}

TEST_CASE("the bf16 rounding loop gives oneDNN's bits, or says the CPU lacks it", "[bf16]") {
  if (!bf16_rounding::vectorized()) {
    std::vector<float> in(100, 1.0f);
    std::vector<uint16_t> out(100, 7);
    CHECK_FALSE(bf16_rounding::round_vectorized(in.data(), in.size(), out.data()));
    CHECK(first_difference(out, std::vector<uint16_t>(100, 7)) == -1);
    return;
  }
  const int saved = omp_get_max_threads();
  SECTION("special values, alone and among others") {
    std::vector<float> in = specials();
    std::vector<uint16_t> loop = by_loop(in, 1);
    for (size_t i = 0; i < in.size(); ++i) {
      INFO("input " << i);
      CHECK(loop[i] == rule(in[i]));
    }
    CHECK(first_difference(loop, by_onednn(in)) == -1);
  }
  SECTION("every tail length, and sizes that split over threads") {
    std::mt19937 random(29);
    std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
    std::vector<size_t> sizes;
    for (size_t n = 0; n <= 70; ++n) sizes.push_back(n);
    for (size_t n : {32u * 1024u - 1u, 32u * 1024u, 32u * 1024u + 17u, 100003u}) sizes.push_back(n);
    for (size_t n : sizes) {
      std::vector<float> in(n);
      for (float& v : in) v = uniform(random);
      std::vector<uint16_t> expected = by_onednn(in);
      for (int threads : {1, 2, 3}) {
        INFO("size " << n << ", threads " << threads);
        CHECK(first_difference(by_loop(in, threads), expected) == -1);
      }
    }
  }
  SECTION("random bit patterns: NaNs, subnormals and infinities among them") {
    std::mt19937 random(2026);
    std::vector<float> in(1 << 20);
    for (float& v : in) v = from_bits(static_cast<uint32_t>(random()));
    std::vector<uint16_t> expected = by_onednn(in);
    CHECK(first_difference(by_loop(in, 2), expected) == -1);
    size_t off_rule = 0;
    for (size_t i = 0; i < in.size(); ++i) off_rule += expected[i] != rule(in[i]);
    CHECK(off_rule == 0);
  }
  omp_set_num_threads(saved);
}

TEST_CASE("packing a kernel for bf16 matmuls gives oneDNN's layout, or says it cannot", "[bf16]") {
  std::mt19937 random(7);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  auto kernel = [&](int64_t rows, int64_t cols) {
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (float& v : w) v = uniform(random);
    std::vector<float> odd = specials();  // among them, at either end and inside
    for (size_t i = 0; i < odd.size(); ++i) {
      w[i] = odd[i];
      w[w.size() - 1 - i] = odd[i];
      w[w.size() / 2 + i] = odd[i];
    }
    return w;
  };
  if (!bf16_rounding::vectorized()) {
    std::vector<float> w = kernel(64, 64);
    std::vector<uint16_t> out(w.size(), 7);
    CHECK_FALSE(bf16_rounding::pack_vectorized(w.data(), 64, 64, out.data(), nullptr));
    CHECK(first_difference(out, std::vector<uint16_t>(w.size(), 7)) == -1);
    return;
  }
  const int saved = omp_get_max_threads();
  // The tutorial's 21632 x 128 kernel, a square one, a wide one and the smallest.
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{21632, 128}, {256, 256}, {128, 320}, {64, 64}}) {
    std::vector<float> w = kernel(rows, cols);
    std::vector<uint16_t> blocked(w.size());
    bf16_rounding::pack_onednn(w.data(), rows, cols, blocked.data());
    std::vector<uint16_t> plain = by_onednn(w);
    for (int threads : {1, 2, 3}) {
      INFO(rows << " x " << cols << ", threads " << threads);
      omp_set_num_threads(threads);
      std::vector<uint16_t> b(w.size() + 1, 0xabcd), p(w.size() + 1, 0xabcd);
      REQUIRE(bf16_rounding::pack_vectorized(w.data(), rows, cols, b.data(), p.data()));
      CHECK(b.back() == 0xabcd);
      CHECK(p.back() == 0xabcd);
      b.pop_back(), p.pop_back();
      CHECK(first_difference(b, blocked) == -1);
      CHECK(first_difference(p, plain) == -1);
      std::vector<uint16_t> alone(w.size());  // one output alone: the other pointer null
      REQUIRE(bf16_rounding::pack_vectorized(w.data(), rows, cols, alone.data(), nullptr));
      CHECK(first_difference(alone, blocked) == -1);
      REQUIRE(bf16_rounding::pack_vectorized(w.data(), rows, cols, nullptr, alone.data()));
      CHECK(first_difference(alone, plain) == -1);
    }
  }
  std::vector<float> w = kernel(96, 64);  // 96 rows: not whole blocks of 64
  std::vector<uint16_t> out(w.size(), 7);
  CHECK_FALSE(bf16_rounding::pack_vectorized(w.data(), 96, 64, out.data(), out.data()));
  CHECK(first_difference(out, std::vector<uint16_t>(w.size(), 7)) == -1);
  omp_set_num_threads(saved);
}
