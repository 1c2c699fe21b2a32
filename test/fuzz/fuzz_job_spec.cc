// Job files and the cluster specs in them (common/job_spec.h, cluster_spec.h): parse, resolve
// the cluster, print it back as JSON. An accepted job must print to JSON that parses again.
#include "common/job_spec.h"
#include "common/json.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  const std::string text(fuzz::as_text(data, size));
  common::JobSpec spec;
  if (!fuzz::accepts([&] { spec = common::parse_job_spec(text, "fuzz.json"); })) return 0;
  common::ClusterSpec cluster;
  if (!fuzz::accepts([&] { cluster = common::resolve_cluster(spec); })) return 0;
  const std::string printed = common::job_spec_to_json(spec, cluster);
  fuzz::require(fuzz::accepts([&] { common::JsonDocument::parse(printed, "printed job"); }),
                "an accepted job prints as JSON that parses");
  return 0;
}
