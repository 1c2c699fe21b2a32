// The message of the common::ConfigError a call throws, for tests that check what an error says.
#pragma once

#include <catch2/catch.hpp>
#include <string>

#include "common/errors.h"

namespace dtrain::testing {

/// The message of the ConfigError that fn throws; fails the test when it throws nothing.
template <typename Fn>
std::string config_error(Fn fn) {
  try {
    fn();
  } catch (const common::ConfigError& error) {
    return error.what();
  }
  FAIL("expected a ConfigError");
  return "";
}

}  // namespace dtrain::testing
