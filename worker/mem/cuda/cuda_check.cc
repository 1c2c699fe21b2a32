// See cuda_check.h.
#include "worker/mem/cuda/cuda_check.h"

#include <fmt/format.h>

#include "common/errors.h"

namespace dtrain::nn::cuda {

void throw_vendor_error(const char* library, const char* call, const std::string& what,
                        const char* file, int line) {
  throw common::IoError(
      fmt::format("{}:{}: {} call {} failed: {}", file, line, library, call, what));
}

}  // namespace dtrain::nn::cuda
