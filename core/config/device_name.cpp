#include "config/device_name.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "config/config_schema.h"

namespace dflash::config {

const char* const kDeviceNames = "cpu, cuda or cuda:N";

namespace {

// The largest CUDA device index accepted: LibTorch's DeviceIndex is int8_t
// in some versions.
constexpr int kMaxDeviceIndex = 127;

bool is_index(const std::string& digits) {
  if (digits.empty() || digits.size() > 3 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  if (digits.size() > 1 && digits[0] == '0') return false;
  return std::stoi(digits) <= kMaxDeviceIndex;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

// "cuda" with whatever follows `prefix` in `text` as its index: "1", ":1" -> "cuda:1".
std::string cuda_with_index_after(const std::string& text, const std::string& prefix) {
  std::string rest = text.substr(prefix.size());
  if (!rest.empty() && rest[0] == ':') rest.erase(0, 1);
  if (rest.empty()) return "cuda";
  return is_index(rest) ? "cuda:" + rest : "";
}

}  // namespace

bool is_device_name(const std::string& text) {
  if (text == "cpu" || text == "cuda") return true;
  return text.rfind("cuda:", 0) == 0 && is_index(text.substr(5));
}

std::string device_name_hint(const std::string& text) {
  const std::string name = lower(text);
  if (is_device_name(name)) return name;
  for (const char* other : {"gpu", "nvidia"}) {  // what people call a CUDA device
    if (name.rfind(other, 0) == 0) return cuda_with_index_after(name, other);
  }
  if (name.rfind("cuda", 0) == 0) return cuda_with_index_after(name, "cuda");
  return detail::closest_match(name, {"cpu", "cuda"});
}

}  // namespace dflash::config
