#include "plugin/same_device.h"

namespace dflash::host {

bool same_device(const c10::Device& a, const c10::Device& b) {
  auto index_of = [](const c10::Device& d) { return d.has_index() ? d.index() : c10::DeviceIndex{0}; };
  return a.type() == b.type() && (a.is_cpu() || index_of(a) == index_of(b));
}

}  // namespace dflash::host
