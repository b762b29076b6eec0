// Capturing one decoding step as a CUDA graph and replaying it.
//
// A step of a small model at batch 1 is a few hundred kernels of a few
// microseconds each; launched one by one from the host, the launches (and
// LibTorch's per-operation overhead) cost far more than the GPU work. A graph
// launches them all at once. What a graph bakes in: every tensor address it
// touches (static inputs, weights, caches, the tables it reads) and every
// host-side number (shapes, loop bounds). So a step that is captured takes its
// per-step inputs from device memory that the caller refills before each
// replay, and the caller drops its graphs whenever a buffer they read moves.
//
// Header-only, so each plugin compiles it with its own build; without a CUDA
// LibTorch (DFLASH_CUDA_GRAPHS 0) capture always fails with a reason and the
// caller runs its step eagerly.
#pragma once

#include "graph_stats.h"
#include "host_upload.h"

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#ifndef DFLASH_CUDA_GRAPHS
#define DFLASH_CUDA_GRAPHS 0
#endif

#if DFLASH_CUDA_GRAPHS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace dflash::decode_support {

// Whether this build can capture graphs at all.
inline constexpr bool kCudaGraphs = DFLASH_CUDA_GRAPHS != 0;

// One captured step.
class CudaGraph {
 public:
  // Launches the captured kernels on the current stream of the graph's device.
  void replay() {
#if DFLASH_CUDA_GRAPHS
    graph_.replay();
#endif
  }

 private:
  friend class CudaGraphPool;
#if DFLASH_CUDA_GRAPHS
  at::cuda::CUDAGraph graph_;
#endif
};

// A step shape's graph and how it fared. Its first use runs eagerly (lazy
// initialisation happens there, not inside a capture), the second captures it
// (CudaGraphPool::replay), later ones replay it; a failed capture is not tried
// again. A plugin's graph entry adds its static inputs and outputs.
struct GraphedStep {
  int64_t uses = 0;
  bool failed = false;
  std::unique_ptr<CudaGraph> graph;
  // Whether this use goes through the graph (counting it): false on the first
  // use and after a failed capture.
  bool take() { return !failed && (graph != nullptr || ++uses >= 2); }
};

// Graphs that run one at a time on one stream share one memory pool: what one
// graph's intermediates occupy, another may reuse. Outputs of a graph live in
// the pool too, so a caller copies what it keeps out of them before the next
// replay of any graph of the pool.
class CudaGraphPool {
 public:
  explicit CudaGraphPool(c10::Device device) : device_(device) {}
  CudaGraphPool(const CudaGraphPool&) = delete;
  CudaGraphPool& operator=(const CudaGraphPool&) = delete;

  // Runs `body` once eagerly on a side stream (the warm-up: lazy
  // initialisation, cuBLAS workspaces for that stream), then captures it.
  // `body` must be idempotent (the warm-up and every replay do the same
  // work), take its per-step inputs from device memory, and must not
  // synchronise with the host. Returns nullptr with the reason in `error` when
  // this build has no CUDA graphs or the capture fails; nothing is left
  // capturing then, and the caller runs its step eagerly.
  std::unique_ptr<CudaGraph> capture(const std::function<void()>& body, std::string& error) {
#if DFLASH_CUDA_GRAPHS
    if (!device_.is_cuda()) {
      error = "not a CUDA device";
      return nullptr;
    }
    const c10::cuda::CUDAGuard guard(device_);
    c10::cuda::device_synchronize();  // everything queued so far is done: the side stream needs no event
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index());
    auto graph = std::unique_ptr<CudaGraph>(new CudaGraph());
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      try {
        body();
      } catch (const std::exception& e) {
        error = std::string("the warm-up run failed: ") + e.what();
        c10::cuda::device_synchronize();
        return nullptr;
      }
      side.synchronize();
      if (!pool_started_) {
        pool_ = at::cuda::graph_pool_handle();
        pool_started_ = true;
      }
      bool capturing = false;
      try {
        graph->graph_.capture_begin(pool_);
        capturing = true;
        body();
        capturing = false;
        graph->graph_.capture_end();
      } catch (const std::exception& e) {
        error = std::string("capture failed: ") + e.what();
        if (capturing) {
          try {
            graph->graph_.capture_end();  // ends the stream's capture mode
          } catch (...) {
          }
        }
        (void)cudaGetLastError();  // an invalidated capture leaves its error for the next launch check
        return nullptr;
      }
    }
    c10::cuda::device_synchronize();
    return graph;
#else
    (void)body;
    error = "this build has no CUDA graphs (LibTorch without CUDA)";
    return nullptr;
#endif
  }

  // Captures `body` into `step` unless it holds its graph already (see
  // capture), then replays it, counting both in `stats`. False when the
  // capture failed — recorded in step.failed, stats.failed and
  // stats.last_error — and the caller runs the step eagerly.
  bool replay(GraphedStep& step, GraphStats& stats, const std::function<void()>& body) {
    if (!step.graph) {
      std::string error;
      step.graph = capture(body, error);
      if (!step.graph) {
        step.failed = true;
        ++stats.failed;
        stats.last_error = error;
        return false;
      }
      ++stats.captured;
    }
    step.graph->replay();
    ++stats.replayed;
    return true;
  }

  // Call after destroying every graph captured so far: the next capture
  // starts a new pool. PyTorch keeps a pool whose graphs are all gone until
  // its last block is freed, and refuses to capture into it meanwhile (an
  // internal assert, "use_count > 0", seen when an evaluation's graphs were
  // dropped for training and the next evaluation captured again).
  void renew() {
#if DFLASH_CUDA_GRAPHS
    pool_started_ = false;
#endif
  }

 private:
  c10::Device device_;
#if DFLASH_CUDA_GRAPHS
  decltype(at::cuda::graph_pool_handle()) pool_{};
  bool pool_started_ = false;
#endif
};

}  // namespace dflash::decode_support
