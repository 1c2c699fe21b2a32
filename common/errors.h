// Error kinds sorted by what the caller does next, and the DT_ENFORCE* checks that throw them.
// Only main() turns these into exit codes (see exit_codes.h); nothing here exits or logs.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace dtrain::common {

/// A person must fix the input (job file, TF_CONFIG, flags, data files): exit 2, never restarted.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A peer, file or socket failed or timed out: the group is restarted.
class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An internal invariant broke: a bug in dtrain.
class EnforceError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {
[[noreturn]] void throw_enforce(const char* file, int line, const char* condition,
                                const std::string& message);
}  // namespace detail

}  // namespace dtrain::common

/// DT_ENFORCE(cond, fmt, args...): throws EnforceError naming file:line, the condition and the
/// message.
#define DT_ENFORCE(cond, ...)                                                 \
  do {                                                                        \
    if (!(cond)) {                                                            \
      ::dtrain::common::detail::throw_enforce(__FILE__, __LINE__, #cond,      \
                                              ::fmt::format("" __VA_ARGS__)); \
    }                                                                         \
  } while (false)

/// DT_ENFORCE_EQ(a, b, fmt, args...): as DT_ENFORCE, and the message carries both values.
#define DT_ENFORCE_EQ(a, b, ...)                                                           \
  do {                                                                                     \
    const auto& dt_lhs_ = (a);                                                             \
    const auto& dt_rhs_ = (b);                                                             \
    if (!(dt_lhs_ == dt_rhs_)) {                                                           \
      ::dtrain::common::detail::throw_enforce(                                             \
          __FILE__, __LINE__, #a " == " #b,                                                \
          ::fmt::format("{} vs {}. {}", dt_lhs_, dt_rhs_, ::fmt::format("" __VA_ARGS__))); \
    }                                                                                      \
  } while (false)
