// See train_section.h.
#include "launcher/plan/train_section.h"

#include "common/errors.h"

namespace dtrain::launcher {

std::optional<train::TrainConfig> read_train_section(const common::JobSpec& spec) {
  if (!spec.command.empty() || !spec.train_json) return std::nullopt;
  try {
    return train::parse_train_config(*spec.train_json, spec.source);
  } catch (const common::ConfigError&) {
    return std::nullopt;  // check_train_section says what is wrong
  }
}

}  // namespace dtrain::launcher
