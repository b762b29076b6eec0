// Runs `f` and returns the ConfigError it must throw.
#pragma once

#include "config/config_schema.h"

#include <gtest/gtest.h>

template <typename F>
dflash::config::ConfigError config_error(F&& f) {
  try {
    f();
  } catch (const dflash::config::ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "expected a ConfigError";
  return dflash::config::ConfigError("<none>", "<no error thrown>");
}
