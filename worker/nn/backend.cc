// See backend.h: the few helpers of the backends' interface that are not inline (a refusal of an
// operation a backend lacks, and the names of elementwise activations).
#include "worker/nn/backend.h"

#include <cstdlib>

#include "common/errors.h"

namespace dtrain::nn {

void Backend::unsupported(const char* operation) const {
  DT_ENFORCE(false, "{} is not on the {} backend yet", operation, name());
  std::abort();  // DT_ENFORCE(false, ...) always throws
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
