// See backend.h: the few helpers of the backends' interface that are not inline (a refusal of an
// operation a backend lacks, and the names of math modes and elementwise activations).
#include "worker/nn/backend.h"

#include <cstdlib>

#include "common/errors.h"

namespace dtrain::nn {

void Backend::unsupported(const char* operation) const {
  DT_ENFORCE(false, "{} is not on the {} backend yet", operation, name());
  std::abort();  // DT_ENFORCE(false, ...) always throws
}

const char* math_mode_name(MathMode mode) {
  switch (mode) {
    case MathMode::kFloat32:
      return "float32";
    case MathMode::kTf32:
      return "tf32";
    case MathMode::kBfloat16:
      return "mixed_bfloat16";
    case MathMode::kFloat16:
      return "mixed_float16";
  }
  return "?";
}

const char* eltwise_name(Eltwise f) {
  switch (f) {
    case Eltwise::kSigmoid:
      return "sigmoid";
    case Eltwise::kTanh:
      return "tanh";
    case Eltwise::kGelu:
      return "gelu";
    case Eltwise::kSwish:
      return "swish";
  }
  return "?";
}

}  // namespace dtrain::nn
