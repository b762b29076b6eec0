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

std::unique_ptr<Collective> join_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                                      const c10::Device& device, std::chrono::milliseconds timeout,
                                      std::unique_ptr<Watch> watch, GroupMakers makers) {
  // NCCL's communicator lives on the current device: this rank's.
  c10::cuda::set_device(device.index());
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> group;
  try {
    group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
  } catch (const std::exception& e) {
    throw CollectiveError(watch->diagnose("the NCCL process group", e.what()));
  }
  log::info("rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " joined (NCCL, " + device.str() + ")");
  // Its communicators end with the run, not at exit (NCCL warns otherwise).
  auto close = [](c10d::ProcessGroupNCCL& g) {
#if DFLASH_TORCH_AT_LEAST(2, 4)
    g.shutdown();
#else
    (void)g;
#endif
  };
  return std::make_unique<C10dCollective<c10d::ProcessGroupNCCL>>(group, rank, world_size, device, std::move(watch), close,
                                                                  std::move(makers));
}

#else

bool nccl_available() { return false; }

std::unique_ptr<Collective> join_nccl(const c10::intrusive_ptr<c10d::Store>&, int, int, const c10::Device&,
                                      std::chrono::milliseconds, std::unique_ptr<Watch>, GroupMakers) {
  throw std::logic_error("join_nccl without NCCL");
}

#endif

}  // namespace dflash::dist::detail
