// See math_mode.h.
#include "worker/spec/math_mode.h"

namespace dtrain::nn {

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

}  // namespace dtrain::nn
