#include "fused_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace dflash::fused {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }

template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// Running (max, Σ exp(x − max)) of an online softmax.
struct Lse {
  float m = -FLT_MAX;
  float s = 0.f;
  __device__ void merge(float om, float os) {
    if (os == 0.f) return;
    if (s == 0.f) {
      m = om;
      s = os;
      return;
    }
    const float nm = fmaxf(m, om);
    s = s * __expf(m - nm) + os * __expf(om - nm);
    m = nm;
  }
  __device__ float value() const { return m + logf(s); }
};

__device__ __forceinline__ void warp_merge(Lse& l) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float om = __shfl_xor_sync(0xffffffff, l.m, offset);
    const float os = __shfl_xor_sync(0xffffffff, l.s, offset);
    l.merge(om, os);
  }
}

__device__ __forceinline__ void warp_argmax(float& value, int64_t& index) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float ov = __shfl_xor_sync(0xffffffff, value, offset);
    const int64_t oi = __shfl_xor_sync(0xffffffff, index, offset);
    if (ov > value || (ov == value && oi < index)) {
      value = ov;
      index = oi;
    }
  }
}

// Block-wide merge of an Lse through shared memory; result valid in thread 0.
__device__ Lse block_merge(Lse l, float* sm, float* ss) {
  warp_merge(l);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sm[warp] = l.m;
    ss[warp] = l.s;
  }
  __syncthreads();
  Lse out;
  if (warp == 0) {
    if (lane < blockDim.x / 32) {
      out.m = sm[lane];
      out.s = ss[lane];
    }
    warp_merge(out);
  }
  __syncthreads();
  return out;
}

// Block-wide argmax (ties to the lower index); result valid in thread 0.
__device__ int64_t block_argmax(float best, int64_t index) {
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  warp_argmax(best, index);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = index;
  }
  __syncthreads();
  float v = lane < blockDim.x / 32 ? sv[lane] : -FLT_MAX;
  int64_t i = lane < blockDim.x / 32 ? si[lane] : 0;
  if (warp == 0) warp_argmax(v, i);
  return i;
}

// A pack of logits x·scale (its max `pm` given) added to a running
// (max, Σ exp): one rescale per pack, then one exponential per logit and
// no branch (a per-logit online softmax branches and rescales per logit).
template <int kVec>
__device__ __forceinline__ void add_pack(Lse& l, const float (&x)[kVec], float pm, float scale) {
  const float m = fmaxf(l.m, pm * scale);
  l.s *= __expf(l.m - m);
  l.m = m;
#pragma unroll
  for (int k = 0; k < kVec; ++k) l.s += __expf(x[k] * scale - m);
}

// A pack's logits in fp32 into `x`; returns their max.
template <class T, int kVec>
__device__ __forceinline__ float unpack_max(const Pack<T, kVec>& pack, float (&x)[kVec]) {
  float m = -FLT_MAX;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    x[k] = to_float(pack.v[k]);
    m = fmaxf(m, x[k]);
  }
  return m;
}

// Pass 1, a pack of 16 bytes at a time: each thread loads kUnroll packs of
// z (and u) before any arithmetic, so more bytes are in flight, and lse(z/T)
// comes from the same read (no second read of the row when T ≠ 1). A
// per-logit online softmax (a branch and a rescale per logit) kept this pass
// at 1.9 TB/s on an H200 (docs/performance.md).
constexpr int kUnroll = 2;

// This thread's kUnroll packs of a row of z (and of u, when given): packs
// first, first + stride, …, all loaded before any arithmetic, so more bytes
// are in flight. Packs past the row's end are left unloaded.
template <class T, int kVec>
__device__ __forceinline__ void load_packs(const T* zr, const T* ur, int64_t first, int64_t stride, int64_t packs,
                                           Pack<T, kVec> (&zp)[kUnroll], Pack<T, kVec> (&up)[kUnroll]) {
#pragma unroll
  for (int j = 0; j < kUnroll; ++j) {
    const int64_t p = first + j * stride;
    if (p < packs) {
      zp[j] = *reinterpret_cast<const Pack<T, kVec>*>(zr + p * kVec);
      if (ur) up[j] = *reinterpret_cast<const Pack<T, kVec>*>(ur + p * kVec);
    }
  }
}

template <class T, int kVec>
__global__ void __launch_bounds__(kThreads, 2)
    row_statistics_kernel(const T* __restrict__ z, const T* __restrict__ u, int64_t vocab,
                                  const int64_t* __restrict__ targets, const bool* __restrict__ valid, float inv_t,
                                  float* lse_z, float* lse_zt, float* lse_ut, float* z_target, int64_t* argmax) {
  const int64_t row = blockIdx.x;
  if (valid && !valid[row]) {  // an ignored row: finite zeros, its logits never read
    if (threadIdx.x == 0) {
      lse_z[row] = lse_zt[row] = z_target[row] = 0.f;
      if (u) lse_ut[row] = 0.f;
      argmax[row] = -1;
    }
    return;
  }
  const T* zr = z + row * vocab;
  const T* ur = u ? u + row * vocab : nullptr;
  const int64_t packs = vocab / kVec;
  const bool tempered = inv_t != 1.f;
  Lse lz, lzt, lu;
  float best = -FLT_MAX;
  int64_t best_index = 0;
  const int64_t stride = static_cast<int64_t>(blockDim.x);
  for (int64_t first = threadIdx.x; first < packs; first += stride * kUnroll) {
    Pack<T, kVec> zp[kUnroll], up[kUnroll];
    load_packs(zr, ur, first, stride, packs, zp, up);
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t p = first + j * stride;
      if (p >= packs) break;
      float x[kVec];
      const float pm = unpack_max(zp[j], x);
      if (pm > best) {  // ascending indices: a tie keeps the lower
        int first_max = kVec - 1;
#pragma unroll
        for (int k = kVec - 1; k >= 0; --k)
          if (x[k] == pm) first_max = k;
        best = pm;
        best_index = p * kVec + first_max;
      }
      add_pack(lz, x, pm, 1.f);
      if (tempered) add_pack(lzt, x, pm, inv_t);
      if (ur) {
        float y[kVec];
        add_pack(lu, y, unpack_max(up[j], y), inv_t);
      }
    }
  }
  __shared__ float sm[32], ss[32];
  const Lse rz = block_merge(lz, sm, ss);
  const Lse rzt = tempered ? block_merge(lzt, sm, ss) : Lse();
  const Lse ru = ur ? block_merge(lu, sm, ss) : Lse();
  const int64_t top = block_argmax(best, best_index);
  if (threadIdx.x == 0) {
    argmax[row] = top;
    lse_z[row] = rz.value();
    lse_zt[row] = tempered ? rzt.value() : rz.value();
    if (ur) lse_ut[row] = ru.value();
    z_target[row] = to_float(zr[targets[row]]);
  }
}

// One pack of the second pass: ∂(c·ℓ)/∂z over the pack (in place) and its
// KL terms added to `kl` (with the teacher's pack `up`).
template <class T, int kVec>
__device__ __forceinline__ void gradient_pack(Pack<T, kVec>& zp, const Pack<T, kVec>* up, int64_t base, int64_t target,
                                              float a_ce, float a_kl, float inv_t, float lz, float lzt, float lut,
                                              float& kl) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float x = to_float(zp.v[k]);
    const float softmax_z = __expf(x - lz);
    float g = a_ce * (softmax_z - (base + k == target ? 1.f : 0.f));
    if (up) {
      const float log_q = x * inv_t - lzt;
      const float log_p = to_float(up->v[k]) * inv_t - lut;
      const float p = __expf(log_p);
      kl += p * (log_p - log_q);
      // At T = 1, softmax(z/T) is softmax(z): one exponential saved.
      g += a_kl * ((inv_t == 1.f ? softmax_z : __expf(log_q)) - p);
    }
    zp.v[k] = from_float<T>(g);
  }
}

// Block-wide sum; result valid in thread 0.
__device__ float block_sum(float x) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffff, x, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = x;
  __syncthreads();
  float total = 0.f;
  if (threadIdx.x == 0)
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += partial[w];
  return total;
}

template <class T, int kVec>
__global__ void gradient_and_kl_kernel(T* __restrict__ z, const T* __restrict__ u, int64_t vocab,
                                       const int64_t* __restrict__ targets, const bool* __restrict__ valid,
                                       const float* __restrict__ coefficient, float ce_scale, float kl_scale,
                                       float inv_t, const float* __restrict__ lse_z, const float* __restrict__ lse_zt,
                                       const float* __restrict__ lse_ut, float* kl_rows, bool write_grad) {
  const int64_t row = blockIdx.x;
  T* zr = z + row * vocab;
  const T* ur = u ? u + row * vocab : nullptr;
  if (valid && !valid[row]) {  // an ignored row: a zero gradient written, nothing read
    if (write_grad) {
      Pack<T, kVec> zero;
#pragma unroll
      for (int k = 0; k < kVec; ++k) zero.v[k] = from_float<T>(0.f);
      const int64_t stride = static_cast<int64_t>(blockDim.x) * kVec;
      for (int64_t base = static_cast<int64_t>(threadIdx.x) * kVec; base < vocab; base += stride)
        *reinterpret_cast<Pack<T, kVec>*>(zr + base) = zero;
    }
    if (kl_rows && threadIdx.x == 0) kl_rows[row] = 0.f;
    return;
  }
  const float c = coefficient[row];
  const float a_ce = c * ce_scale, a_kl = c * kl_scale;
  const float lz = lse_z[row], lzt = lse_zt[row];
  const float lut = ur ? lse_ut[row] : 0.f;
  const int64_t target = targets[row];
  float kl = 0.f;
  // As in pass 1: kUnroll packs loaded, then computed and stored.
  const int64_t packs = vocab / kVec, stride = static_cast<int64_t>(blockDim.x);
  for (int64_t first = threadIdx.x; first < packs; first += stride * kUnroll) {
    Pack<T, kVec> zp[kUnroll], up[kUnroll];
    load_packs(zr, ur, first, stride, packs, zp, up);
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t p = first + j * stride;
      if (p >= packs) break;
      gradient_pack(zp[j], ur ? &up[j] : nullptr, p * kVec, target, a_ce, a_kl, inv_t, lz, lzt, lut, kl);
      if (write_grad) *reinterpret_cast<Pack<T, kVec>*>(zr + p * kVec) = zp[j];
    }
  }
  if (kl_rows) {
    const float total = block_sum(kl);
    if (threadIdx.x == 0) kl_rows[row] = total;
  }
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// Calls f(T{}, std::integral_constant<int, kVec>{}) for the element type and
// the widest pack (16 bytes) that divides the row, else packs of one: the one
// place the kernels' template arguments are chosen.
template <class F>
void with_element_and_pack(Element element, int64_t vocab, F&& f) {
  auto with_pack = [&](auto tag) {
    using T = decltype(tag);
    constexpr int kWide = 16 / sizeof(T);
    if (vocab % kWide == 0)
      f(tag, std::integral_constant<int, kWide>{});
    else
      f(tag, std::integral_constant<int, 1>{});
  };
  switch (element) {
    case Element::kFloat32:
      return with_pack(float{});
    case Element::kBFloat16:
      return with_pack(__nv_bfloat16{});
    case Element::kFloat16:
      return with_pack(__half{});
  }
}

}  // namespace

void row_statistics(Element element, const void* z, const void* u, int64_t rows, int64_t vocab,
                    const int64_t* targets, const bool* valid, float inv_temperature, float* lse_z, float* lse_zt,
                    float* lse_ut, float* z_target, int64_t* argmax, cudaStream_t stream) {
  if (rows == 0) return;
  with_element_and_pack(element, vocab, [&](auto tag, auto pack) {
    using T = decltype(tag);
    row_statistics_kernel<T, decltype(pack)::value><<<rows, kThreads, 0, stream>>>(
        static_cast<const T*>(z), static_cast<const T*>(u), vocab, targets, valid, inv_temperature, lse_z, lse_zt,
        lse_ut, z_target, argmax);
  });
  check(cudaGetLastError(), "fused_ckpt_kl row_statistics");
}

void gradient_and_kl(Element element, void* z, const void* u, int64_t rows, int64_t vocab, const int64_t* targets,
                     const bool* valid, const float* coefficient, float ce_scale, float kl_scale,
                     float inv_temperature, const float* lse_z, const float* lse_zt, const float* lse_ut,
                     float* kl_rows, bool write_grad, cudaStream_t stream) {
  if (rows == 0) return;
  with_element_and_pack(element, vocab, [&](auto tag, auto pack) {
    using T = decltype(tag);
    gradient_and_kl_kernel<T, decltype(pack)::value><<<rows, kThreads, 0, stream>>>(
        static_cast<T*>(z), static_cast<const T*>(u), vocab, targets, valid, coefficient, ce_scale, kl_scale,
        inv_temperature, lse_z, lse_zt, lse_ut, kl_rows, write_grad);
  });
  check(cudaGetLastError(), "fused_ckpt_kl gradient_and_kl");
}

}  // namespace dflash::fused
