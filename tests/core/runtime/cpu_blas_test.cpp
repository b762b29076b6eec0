// The CPU BLAS check (core/runtime/cpu_blas.h): which OpenBLAS cores get a
// suggestion, which one, and that the running OpenBLAS (Debian's LibTorch
// links it) is found and named.
#include "runtime/cpu_blas.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <cstdlib>

namespace {
using dflash::runtime::CpuFeatures;
using dflash::runtime::suggested_openblas_core;

TEST(CpuBlas, CoresWithoutAvx2KernelsOnAnAvx2CpuGetTheBestTheCpuRuns) {
  EXPECT_EQ(suggested_openblas_core("Prescott", {true, true}), "SkylakeX");
  EXPECT_EQ(suggested_openblas_core("Prescott", {true, false}), "Haswell");
  EXPECT_EQ(suggested_openblas_core("core2", {true, false}), "Haswell");  // any case
  EXPECT_EQ(suggested_openblas_core("Sandybridge", {true, true}), "SkylakeX");
}

TEST(CpuBlas, NoSuggestionWhereNothingIsGained) {
  EXPECT_FALSE(suggested_openblas_core("Haswell", {true, true}));   // AVX2 kernels already
  EXPECT_FALSE(suggested_openblas_core("SkylakeX", {true, true}));
  EXPECT_FALSE(suggested_openblas_core("Zen", {true, false}));
  EXPECT_FALSE(suggested_openblas_core("Prescott", {false, false}));  // the CPU has nothing better
  EXPECT_FALSE(suggested_openblas_core("armv8", {false, false}));
}

TEST(CpuBlas, TheRunningOpenBlasIsNamedAndTheWarningFollowsTheRule) {
  (void)torch::mm(torch::ones({4, 4}), torch::ones({4, 4}));  // LibTorch's BLAS is loaded and initialised
  const auto core = dflash::runtime::loaded_openblas_core();
  if (!core) GTEST_SKIP() << "LibTorch's CPU BLAS here is not OpenBLAS";
  EXPECT_FALSE(core->empty());
  const auto suggestion = suggested_openblas_core(*core, dflash::runtime::this_cpu());
  const auto warning = dflash::runtime::openblas_core_warning();
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) {
    EXPECT_FALSE(warning) << "the user chose a core: no warning";
  } else {
    ASSERT_EQ(warning.has_value(), suggestion.has_value());
    if (warning) {
      EXPECT_NE(warning->find(*core), std::string::npos) << *warning;
      EXPECT_NE(warning->find("OPENBLAS_CORETYPE=" + *suggestion), std::string::npos) << *warning;
    }
  }
  std::printf("OpenBLAS core here: %s; suggestion: %s\n", core->c_str(), suggestion ? suggestion->c_str() : "none");
}

}  // namespace
