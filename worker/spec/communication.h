// train.communication, parsed once into a value the factory switches on: which transport carries
// the collectives. Names only; what each choice builds is comm_factory.h's and transports.h's.
#pragma once

#include <string>

namespace dtrain::comm {

/// auto: NCCL on GPUs, shared memory when every rank is on this host, else the TCP ring.
enum class Communication { kAuto, kRing, kShm, kNccl };

/// The job file's name: "auto", "ring", "shm" or "nccl".
const char* communication_name(Communication communication);

/// The choice named name; ConfigError naming the choices for any other name.
Communication parse_communication(const std::string& name);

}  // namespace dtrain::comm
