// How the HF target plugins turn their loaders' and models' exceptions into
// the ABI's error codes, one definition for both: bad input a caller can fix
// (std::invalid_argument, naming what is wrong) is INVALID_ARGUMENT; a
// folder that cannot be read or is not supported (any other exception from
// the loader, naming the file, key or tensor) is NOT_FOUND. sdk::Error
// passes through with its own code.
#pragma once

#include <dflash/sdk/core.hpp>

#include <exception>
#include <stdexcept>

namespace dflash::hf {

template <class F>
decltype(auto) invalid_argument_as_error(F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    throw sdk::Error(DFLASH_ERR_INVALID_ARGUMENT, e.what());
  }
}

template <class F>
decltype(auto) load_errors_as_not_found(F&& f) {
  try {
    return f();
  } catch (const sdk::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw sdk::Error(DFLASH_ERR_NOT_FOUND, e.what());
  }
}

}  // namespace dflash::hf
