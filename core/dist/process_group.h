// Joining the ranks of a run the way the PyTorch ecosystem does: the
// torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), a rendezvous at MASTER_ADDR:MASTER_PORT, then
// c10d's ProcessGroupNCCL for CUDA devices or ProcessGroupGloo for the CPU.
// `torchrun --no-python … dflash-host …` and `dflash-host launch` set that
// environment; with none of it the host is one process, exactly as before.
//
// The rendezvous store is our own (rendezvous/store_server.h), not c10d's
// TCPStore: rank 0 serves it on MASTER_ADDR's address only, and serves only
// ranks that prove the run secret ($DFLASH_RUN_SECRET: the launcher makes
// one; under torchrun the user exports it). Under torchrun's agent store
// (TORCHELASTIC_USE_AGENT_STORE=True) rank 0 serves it on a port of its
// own, and the agent's store only carries its address, signed with the
// secret so that no one else can redirect the ranks.
#pragma once

#include "dist/collective.h"
#include "dist/rendezvous/run_secret.h"

#include <optional>
#include <string>

namespace dflash::dist {

struct LaunchEnvironment {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  // torchrun's agent hosts a store (TORCHELASTIC_USE_AGENT_STORE=True):
  // rank 0 then serves the run's store on a port of its own and publishes
  // its signed address there; otherwise rank 0 serves it at MASTER_PORT.
  bool agent_store = false;
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: which attempt of the group this is
  // How this rank proves it belongs to the run (never logged).
  std::optional<rendezvous::RunSecret> secret;
};

// `text` as a whole number in [least, most]; nullopt when it is not one (the
// callers name the flag or variable). The launcher's flags and the
// environment both read their numbers with it.
std::optional<int> parse_bounded_int(const std::string& text, int least, int most);

// nullopt when none of the variables is set. Throws std::invalid_argument
// naming the variable when some are set but not all, or one is malformed
// (RANK ≥ WORLD_SIZE, a port outside 1…65535), or the run secret is
// missing or too short.
std::optional<LaunchEnvironment> launch_environment();

// This rank's device: "cuda" becomes "cuda:LOCAL_RANK" (one GPU per local
// rank); "cpu" stays. Throws std::invalid_argument for "cuda:N" with several
// local ranks (they would share one GPU).
std::string rank_device(const std::string& device, const LaunchEnvironment& env);

// The rendezvous and the process group; `device` chooses the backend.
// Failures name the store's address and the ranks that did not join within
// `timeout_s`; a rank whose secret is not rank 0's is refused, and told so.
std::unique_ptr<Collective> join(const LaunchEnvironment& env, const std::string& device, double timeout_s);

}  // namespace dflash::dist
