// TF_CONFIG (common/tf_config.h): what parses must format back to a TF_CONFIG that parses to
// the same cluster and task.
#include "common/tf_config.h"
#include "test/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dtrain;
  common::TfConfig first;
  if (!fuzz::accepts([&] { first = common::parse_tf_config(fuzz::as_text(data, size)); })) return 0;
  std::string text;
  if (!fuzz::accepts([&] { text = common::format_tf_config(first.cluster, first.task); })) return 0;
  common::TfConfig second;
  fuzz::require(fuzz::accepts([&] { second = common::parse_tf_config(text); }),
                "a formatted TF_CONFIG parses");
  fuzz::require(common::format_tf_config(second.cluster, second.task) == text,
                "TF_CONFIG formats the same after a round trip");
  return 0;
}
