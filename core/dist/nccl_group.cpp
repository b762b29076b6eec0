// ProcessGroupNCCL for ranks on CUDA devices. Compiled with NCCL where
// LibTorch has CUDA (DFLASH_HOST_NCCL); elsewhere it says NCCL is absent.
#include "dist/c10d_collective.h"

#if DFLASH_HOST_NCCL
#include "log/log.h"

#include <dflash/sdk/torch_compat.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <c10/cuda/CUDAFunctions.h>
#endif

#include <stdexcept>

namespace dflash::dist::detail {

#if DFLASH_HOST_NCCL

bool nccl_available() { return true; }

std::unique_ptr<Collective> join_nccl(const c10::intrusive_ptr<c10d::Store>& store, const LaunchEnvironment& env,
                                      const c10::Device& device, std::chrono::milliseconds timeout,
                                      std::unique_ptr<Watch> watch) {
  // NCCL's communicator lives on the current device: this rank's.
  c10::cuda::set_device(device.index());
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> group;
  try {
    group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, env.rank, env.world_size, options);
  } catch (const std::exception& e) {
    throw CollectiveError(watch->diagnose("the NCCL process group", e.what()));
  }
  log::info("rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) + " joined (NCCL, " + device.str() + ")");
  // Its communicators end with the run, not at exit (NCCL warns otherwise).
  auto close = [](c10d::ProcessGroupNCCL& g) {
#if DFLASH_TORCH_AT_LEAST(2, 4)
    g.shutdown();
#else
    (void)g;
#endif
  };
  return std::make_unique<C10dCollective<c10d::ProcessGroupNCCL>>(group, env.rank, env.world_size, device, std::move(watch),
                                                                  close);
}

#else

bool nccl_available() { return false; }

std::unique_ptr<Collective> join_nccl(const c10::intrusive_ptr<c10d::Store>&, const LaunchEnvironment&, const c10::Device&,
                                      std::chrono::milliseconds, std::unique_ptr<Watch>) {
  throw std::logic_error("join_nccl without NCCL");
}

#endif

}  // namespace dflash::dist::detail
