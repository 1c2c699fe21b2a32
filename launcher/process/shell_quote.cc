// See shell_quote.h.
#include "launcher/process/shell_quote.h"

namespace dtrain::launcher {

std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char ch : text) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

}  // namespace dtrain::launcher
