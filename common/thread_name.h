// Names the calling thread as ps, top and /proc/PID/task/TID/comm show it ("dt-comm"), so that a
// worker's CPU time can be split by thread (scripts/bench-worker.sh). Linux keeps 15 bytes.
#pragma once

#include <pthread.h>

namespace dtrain::common {

inline void name_this_thread(const char* name) {
  ::pthread_setname_np(::pthread_self(), name);
}

}  // namespace dtrain::common
