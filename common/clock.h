// Time stamps for records and logs: wall time as UTC ISO-8601, and a monotonic clock reading.
#pragma once

#include <string>

namespace dtrain::common {

/// "2026-11-21T19:45:00.123Z".
std::string utc_timestamp();

/// Seconds on the monotonic clock (CLOCK_MONOTONIC); only differences mean anything.
double monotonic_seconds();

}  // namespace dtrain::common
