// See cpu_isa.h. Each instruction set of oneDNN 2.6 is a bit mask that contains the masks of
// those it extends (dnnl_types.h's dnnl_cpu_isa_t); a cap allows the sets whose bits it contains.
#include "common/cpu_isa.h"

#include <cpuid.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>

namespace dtrain::common {
namespace {

struct Isa {
  const char* name;  ///< oneDNN's, lower case; its cap's is the same in any case
  unsigned bits;     ///< dnnl_cpu_isa_t
};

// Best first, as oneDNN tries them.
constexpr Isa kIsas[] = {
    {"avx512_core_amx", 0x3e7},
    {"avx512_core_bf16", 0xe7},
    {"avx512_core_vnni", 0x67},
    {"avx512_core", 0x27},
    {"avx2_vnni", 0x407},
    {"avx2", 0x7},
    {"avx", 0x3},
    {"sse41", 0x1},
};

struct Cpuid {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Cpuid cpuid(unsigned leaf, unsigned subleaf) {
  Cpuid r;
  if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) return {};
  return r;
}

uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(unsigned word, int n) {
  return (word >> n) & 1u;
}

// Whether this CPU and OS have isa (oneDNN's cpu_isa_traits: the features each set needs).
bool has(const std::string& isa) {
  const Cpuid l1 = cpuid(1, 0), l7 = cpuid(7, 0), l71 = cpuid(7, 1);
  const bool osxsave = bit(l1.c, 27);
  const uint64_t xcr = osxsave ? xcr0() : 0;
  const bool sse41 = bit(l1.c, 19);
  const bool avx = sse41 && bit(l1.c, 28) && osxsave && (xcr & 0x6) == 0x6;
  const bool avx2 = avx && bit(l7.b, 5);
  const bool avx512_core = avx2 && (xcr & 0xe6) == 0xe6 && bit(l7.b, 16) && bit(l7.b, 17) &&
                           bit(l7.b, 30) && bit(l7.b, 31);
  const bool vnni = avx512_core && bit(l7.c, 11);
  const bool bf16 = vnni && bit(l71.a, 5);
  const bool amx =
      bf16 && bit(l7.d, 22) && bit(l7.d, 24) && bit(l7.d, 25) && (xcr & 0x60000) == 0x60000;
  if (isa == "avx512_core_amx") return amx;
  if (isa == "avx512_core_bf16") return bf16;
  if (isa == "avx512_core_vnni") return vnni;
  if (isa == "avx512_core") return avx512_core;
  if (isa == "avx2_vnni") return avx2 && bit(l71.a, 4);
  if (isa == "avx2") return avx2;
  if (isa == "avx") return avx;
  return isa == "sse41" && sse41;
}

// The cap's bits: every set when unset, "ALL", or a name oneDNN does not take (the deprecated
// AVX512_MIC among them). oneDNN ignores the case of the value.
unsigned cap_bits() {
  const char* text = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (!text) text = std::getenv("DNNL_MAX_CPU_ISA");
  if (!text) return ~0u;
  std::string value(text);
  std::transform(value.begin(), value.end(), value.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  for (const Isa& isa : kIsas)
    if (value == isa.name) return isa.bits;
  return ~0u;
}

}  // namespace

const std::string& dispatch_cpu_isa() {
  static const std::string name = [] {
    const unsigned cap = cap_bits();
    for (const Isa& isa : kIsas)
      if ((isa.bits & ~cap) == 0 && has(isa.name)) return std::string(isa.name);
    return std::string("other");
  }();
  return name;
}

bool cpu_has_bf16_products() {
  const std::string& isa = dispatch_cpu_isa();
  return isa == "avx512_core_bf16" || isa == "avx512_core_amx";
}

}  // namespace dtrain::common
