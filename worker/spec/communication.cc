// See communication.h.
#include "worker/spec/communication.h"

#include <fmt/format.h>

#include "common/errors.h"

namespace dtrain::comm {

const char* communication_name(Communication communication) {
  switch (communication) {
    case Communication::kAuto:
      return "auto";
    case Communication::kRing:
      return "ring";
    case Communication::kShm:
      return "shm";
    case Communication::kNccl:
      return "nccl";
  }
  return "?";
}

Communication parse_communication(const std::string& name) {
  for (Communication c :
       {Communication::kAuto, Communication::kRing, Communication::kShm, Communication::kNccl}) {
    if (name == communication_name(c)) return c;
  }
  throw common::ConfigError(fmt::format(
      "train.communication: \"{}\": expected \"auto\", \"ring\", \"shm\" or \"nccl\"", name));
}

}  // namespace dtrain::comm
