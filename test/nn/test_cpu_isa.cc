// common/cpu_isa.h reads the instruction set oneDNN dispatches to without oneDNN, for the
// launcher's refusal of a mixed_bfloat16 job on a CPU without bf16 products: it must say what
// oneDNN (the worker's nn::cpu_isa_name, nn::cpu_supports) says, on this CPU and under each cap
// oneDNN takes. oneDNN reads its cap once per process, so each cap runs this program again.
#include <catch2/catch.hpp>
#include <string>

#include "common/cpu_isa.h"
#include "test/support/subprocess.h"
#include "worker/nn/backend.h"

using namespace dtrain;

namespace {

void check_agreement() {
  CHECK(common::dispatch_cpu_isa() == nn::cpu_isa_name());
  CHECK(common::cpu_has_bf16_products() == nn::cpu_supports(nn::MathMode::kBfloat16));
}

}  // namespace

TEST_CASE("the launcher's reading of the CPU is oneDNN's") {
  check_agreement();
}

// Run by the next case, once per cap; hidden from a plain run.
TEST_CASE("cpu isa under the cap of this process", "[.cpu_isa_child]") {
  check_agreement();
}

TEST_CASE("the launcher's reading of the CPU is oneDNN's under every cap") {
  for (const char* cap :
       {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_MIC", "AVX512_CORE", "AVX512_CORE_VNNI",
        "AVX512_CORE_BF16", "AVX512_CORE_AMX", "ALL", "avx2", "NONSENSE"}) {
    testing::ProcessOptions options;
    options.env["ONEDNN_MAX_CPU_ISA"] = cap;
    options.env["DNNL_MAX_CPU_ISA"] = std::nullopt;
    auto r = testing::run_process({"/proc/self/exe", "[.cpu_isa_child]"}, options);
    INFO("ONEDNN_MAX_CPU_ISA=" << cap << "\n" << r.out << r.err);
    CHECK(r.exit_code == 0);
  }
  testing::ProcessOptions dnnl;  // the older name, when the newer is unset
  dnnl.env["ONEDNN_MAX_CPU_ISA"] = std::nullopt;
  dnnl.env["DNNL_MAX_CPU_ISA"] = "AVX2";
  auto r = testing::run_process({"/proc/self/exe", "[.cpu_isa_child]"}, dnnl);
  INFO("DNNL_MAX_CPU_ISA=AVX2\n" << r.out << r.err);
  CHECK(r.exit_code == 0);
}
