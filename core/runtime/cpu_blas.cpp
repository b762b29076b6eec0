#include "runtime/cpu_blas.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>

namespace dflash::runtime {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// OpenBLAS's x86-64 cores whose kernels stop short of AVX2 (its dynamic
// arch's core names, lower-cased).
bool below_avx2(const std::string& core) {
  static const std::array<const char*, 20> kOld = {
      "unknown",   "katmai", "coppermine",  "northwood", "prescott",  "banias",     "atom",
      "core2",     "penryn", "dunnington",  "nehalem",   "athlon",    "opteron",    "opteron_sse3",
      "barcelona", "nano",   "sandybridge", "bobcat",    "bulldozer", "piledriver"};
  const std::string name = lower(core);
  return std::find(kOld.begin(), kOld.end(), name) != kOld.end();
}

}  // namespace

std::optional<std::string> suggested_openblas_core(const std::string& detected, const CpuFeatures& cpu) {
  if (!below_avx2(detected) || !cpu.avx2_fma) return std::nullopt;
  return std::string(cpu.avx512 ? "SkylakeX" : "Haswell");
}

std::optional<std::string> loaded_openblas_core() {
  // Looked up, not linked: a LibTorch on MKL (or another BLAS) has no such symbol.
  using CoreName = char* (*)();
  auto core_name = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (core_name == nullptr) return std::nullopt;
  const char* name = core_name();
  if (name == nullptr) return std::nullopt;
  return std::string(name);
}

CpuFeatures this_cpu() {
  CpuFeatures f;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#endif
  return f;
}

std::optional<std::string> openblas_core_warning() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return std::nullopt;
  const std::optional<std::string> core = loaded_openblas_core();
  if (!core) return std::nullopt;
  const CpuFeatures cpu = this_cpu();
  const std::optional<std::string> better = suggested_openblas_core(*core, cpu);
  if (!better) return std::nullopt;
  return "OpenBLAS runs its " + *core + " kernels on this CPU, which has " + (cpu.avx512 ? "AVX-512" : "AVX2") +
         " (it did not recognise the CPU's model): CPU matrix products run several times slower than they can. "
         "Run with OPENBLAS_CORETYPE=" + *better + " in the environment (e.g. export OPENBLAS_CORETYPE=" + *better + ")";
}

}  // namespace dflash::runtime
