// Formatting of enforce failures; kept out of line so the macros stay small at call sites.
#include "common/errors.h"

namespace dtrain::common::detail {

void throw_enforce(const char* file, int line, const char* condition, const std::string& message) {
  std::string text = fmt::format("{}:{}: enforce failed: {}", file, line, condition);
  if (!message.empty()) text += fmt::format(": {}", message);
  throw EnforceError(text);
}

}  // namespace dtrain::common::detail
