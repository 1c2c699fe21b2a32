// A `train` section the worker's reader takes, for launcher tests whose plans depend on it: the
// plan reads the device and the transport through that reader (launcher/plan/train_section.h),
// and a section it refuses is planned with the worker's defaults.
#pragma once

#include <string>

namespace dtrain::testing {

/// The smallest train object that parses, with keys (`, "device": "cuda"`, ...) added at its end.
inline std::string train_with(const std::string& keys) {
  return R"({"model": {"input_shape": [4, 4, 1], "layers": [{"type": "flatten"},
      {"type": "dense", "units": 3, "activation": "softmax"}]})" +
         keys + "}";
}

}  // namespace dtrain::testing
