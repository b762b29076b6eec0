// move_cache_rows: a draft tree's accepted path kept in every layer's cache
// with one launch (cuda_kernels.h).
#include "cuda_kernels.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace dflash::cuda_kernels {
namespace {

// One thread per word of a row, per buffer (blockIdx.y). The moves run in
// order within a thread: a row is read before any later move writes it
// (sources increase and never fall below their destination), so buffers
// need no gather first.
template <class Word>
__global__ void move_rows_kernel(CacheRowMoves moves, int64_t words_per_row) {
  const int64_t word = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (word >= words_per_row) return;
  Word* base = static_cast<Word*>(moves.buffers[blockIdx.y]);
  for (int32_t j = 0; j < moves.moves; ++j) {
    const int64_t from = moves.from[j], to = moves.to_start + j;
    if (from != to) base[to * words_per_row + word] = base[from * words_per_row + word];
  }
}

template <class Word>
void launch(const CacheRowMoves& moves, cudaStream_t stream) {
  const int64_t words = moves.row_bytes / static_cast<int64_t>(sizeof(Word));
  constexpr int threads = 128;
  const dim3 grid(static_cast<unsigned>((words + threads - 1) / threads), static_cast<unsigned>(moves.buffers_used));
  move_rows_kernel<Word><<<grid, threads, 0, stream>>>(moves, words);
}

bool all_aligned(const CacheRowMoves& moves, int64_t bytes) {
  if (moves.row_bytes % bytes != 0) return false;
  for (int32_t b = 0; b < moves.buffers_used; ++b)
    if (reinterpret_cast<uintptr_t>(moves.buffers[b]) % static_cast<uintptr_t>(bytes) != 0) return false;
  return true;
}

}  // namespace

void move_cache_rows(const CacheRowMoves& moves, cudaStream_t stream) {
  if (moves.buffers_used < 1 || moves.buffers_used > kMaxCacheRowBuffers || moves.moves < 0 ||
      moves.moves > kMaxCacheRowMoves || moves.row_bytes < 1)
    throw std::invalid_argument("move_cache_rows: " + std::to_string(moves.buffers_used) + " buffers and " +
                                std::to_string(moves.moves) + " moves of " + std::to_string(moves.row_bytes) +
                                "-byte rows (at most " + std::to_string(kMaxCacheRowBuffers) + " and " +
                                std::to_string(kMaxCacheRowMoves) + ")");
  if (moves.moves == 0) return;
  if (all_aligned(moves, 16)) launch<uint4>(moves, stream);
  else if (all_aligned(moves, 4)) launch<uint32_t>(moves, stream);
  else launch<unsigned char>(moves, stream);
}

}  // namespace dflash::cuda_kernels
