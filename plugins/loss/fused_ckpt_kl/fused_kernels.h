// CUDA kernels of fused_ckpt_kl: the softmax arithmetic of one chunk in two
// passes over its [rows, V] logits (bandwidth-bound; the GEMMs stay cuBLAS).
// Free of LibTorch types so nvcc never compiles LibTorch headers.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dflash::fused {

enum class Element { kFloat32, kBFloat16, kFloat16 };

// Pass 1, per row: lse(z), lse(z/T), lse(u/T) (when u is given), z[target]
// and argmax(z). All outputs are [rows] arrays on the device. `valid` (may be
// null: every row counts) marks the rows the loss keeps: an
// ignored row is not read, and gets zeros and argmax −1.
void row_statistics(Element element, const void* z, const void* u, int64_t rows, int64_t vocab,
                    const int64_t* targets, const bool* valid, float inv_temperature, float* lse_z, float* lse_zt,
                    float* lse_ut, float* z_target, int64_t* argmax, cudaStream_t stream);

// Pass 2, per row: KL(softmax(u/T) ‖ softmax(z/T)) into kl_rows (when u is
// given), and, when write_grad, the gradient of the row loss with respect to
// z written over z in place:
//   g = c·[ce_scale·(softmax(z) − onehot(target)) + kl_scale·(softmax(z/T) − softmax(u/T))]
// `valid` (may be null) as for row_statistics: an ignored row is not read,
// its gradient written as zeros and its KL 0.
void gradient_and_kl(Element element, void* z, const void* u, int64_t rows, int64_t vocab, const int64_t* targets,
                     const bool* valid, const float* coefficient, float ce_scale, float kl_scale,
                     float inv_temperature, const float* lse_z, const float* lse_zt, const float* lse_ut,
                     float* kl_rows, bool write_grad, cudaStream_t stream);

}  // namespace dflash::fused
