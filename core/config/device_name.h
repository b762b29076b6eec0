// The device names a configuration may give (train.device, or any string
// property a schema marks "format": "device"): the one definition the
// schema validator, and so `config`, `plan`, `train`, `eval` and `ab`, check
// them by, before LibTorch ever parses one.
#pragma once

#include <string>

namespace dflash::config {

// What is accepted, for messages: "cpu, cuda or cuda:N".
extern const char* const kDeviceNames;

// "cpu", "cuda", or "cuda:N" with N from 0 to 127 (the largest index every
// LibTorch's DeviceIndex holds) written without leading zeros.
bool is_device_name(const std::string& text);

// For a string that is not a device name, the name it most likely means
// ("gpu" -> "cuda", "CUDA:1" -> "cuda:1", "cuda1" -> "cuda:1", "cpux" ->
// "cpu"); empty when there is no good guess.
std::string device_name_hint(const std::string& text);

}  // namespace dflash::config
