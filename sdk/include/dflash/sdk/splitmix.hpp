// dflash/sdk/splitmix.hpp — SplitMix64, the one mixing function every seeded
// choice in dflash-host uses (data order, anchors, synthetic data, per-step
// seeds). Fixed and portable, unlike std::*_distribution, so the same seed
// picks the same things with any standard library. Needs nothing else.
#pragma once

#include <cstdint>

namespace dflash::sdk {

constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace dflash::sdk
