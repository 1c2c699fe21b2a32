// make_nccl_communicator() of the CPU-only build: there is no NCCL to run, so asking for it is
// a ConfigError a person fixes by choosing the ring or a CUDA build. Nothing else lives here.
#include "common/errors.h"
#include "worker/comm/nccl/nccl_communicator.h"

namespace dtrain::comm {

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> /*bootstrap*/,
                                                     nn::Device& /*device*/) {
  throw common::ConfigError(
      "communication: \"nccl\" needs dtrain's CUDA build; this build is CPU-only");
}

bool nccl_available() {
  return false;
}

std::string nccl_version_string() {
  return "none";
}

}  // namespace dtrain::comm
