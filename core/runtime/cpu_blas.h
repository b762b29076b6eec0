// Whether the CPU BLAS under LibTorch runs kernels far below this CPU.
//
// Debian's LibTorch does its CPU GEMMs in OpenBLAS, which picks its kernels
// by the CPU's model number. On virtual machines that hide the model (a
// "Intel(R) Xeon(R) Processor" with AVX-512) it falls back to Prescott, its
// SSE3 kernels: the CPU quickstart's step took 0.87 s there against 0.37 s
// with OPENBLAS_CORETYPE=SkylakeX. OpenBLAS reads that variable when it is
// loaded, before main, so the host can only say so.
#pragma once

#include <optional>
#include <string>

namespace dflash::runtime {

struct CpuFeatures {
  bool avx2_fma = false;  // what OpenBLAS's Haswell kernels need
  bool avx512 = false;    // F, CD, BW, DQ and VL: what its SkylakeX kernels need
};

// The OPENBLAS_CORETYPE to suggest, or nothing: `detected` is OpenBLAS's
// name for the kernels it chose; only cores without AVX2 kernels on a CPU
// that has AVX2 get a suggestion (the best the CPU supports).
std::optional<std::string> suggested_openblas_core(const std::string& detected, const CpuFeatures& cpu);

// The running OpenBLAS's core name (openblas_get_corename), or nothing when
// LibTorch's BLAS is not OpenBLAS.
std::optional<std::string> loaded_openblas_core();

// This CPU's features, as the compiler's runtime check reads them.
CpuFeatures this_cpu();

// One warning line for this process, or nothing: nothing when
// OPENBLAS_CORETYPE is set already (the user chose) or there is nothing to gain.
std::optional<std::string> openblas_core_warning();

}  // namespace dflash::runtime
