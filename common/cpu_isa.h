// Which vector instructions the oneDNN of this build (Debian 12's 2.6) dispatches to on this CPU,
// found without linking oneDNN: the launcher refuses a mixed_bfloat16 job the CPU here cannot
// compute before anything starts, with the words the worker uses (docs/design.md#preconditions),
// and it must not link the worker's backends for that (docs/design.md#one-reading-of-a-job).
// The rule is oneDNN's: the best of its instruction sets that the CPU has (cpuid) and the OS has
// enabled (XCR0), capped by ONEDNN_MAX_CPU_ISA (else DNNL_MAX_CPU_ISA), as dnnl's
// get_effective_cpu_isa() answers. test_nn checks the two agree under every cap.
#pragma once

#include <string>

namespace dtrain::common {

/// oneDNN's name of the instruction set it dispatches to here: "avx512_core_amx",
/// "avx512_core_bf16", "avx512_core_vnni", "avx512_core", "avx2_vnni", "avx2", "avx", "sse41"
/// or "other". Read once per process, as oneDNN reads its cap.
const std::string& dispatch_cpu_isa();

/// True when that instruction set has bf16 products (AVX512_BF16 or AMX): mixed_bfloat16 trains
/// on this CPU. oneDNN would emulate them on plain AVX-512, slower than float32.
bool cpu_has_bf16_products();

}  // namespace dtrain::common
