// See train_check.h.
#include "launcher/train_check.h"

#include "worker/train/train_config.h"

namespace dtrain::launcher {

void check_train_section(const common::JobSpec& spec) {
  if (!spec.command.empty() || !spec.train_json) return;
  train::parse_train_config(*spec.train_json, spec.source);
}

}  // namespace dtrain::launcher
