// A probe of the invariant linear's warpgroup-MMA products (issue 41;
// invariant_linear.cu's launch_products_wgmma, which only sm_90a builds run):
// wgmma m64nNk16 with both operands read from shared memory (the weights as
// A, 64 features a warpgroup; x's rows as B, N = the rows rounded up to 8),
// against the mma.sync kernel the default build runs. For each of the scale
// model's projections (scale_harness.cuh) and each row count it checks
//   - the result against the mma.sync kernel's (both sum in fp32; they may
//     round differently, not by more than bf16's step),
//   - that a row gets the same bits alone (N = 8) as among the others,
// and times both. Needs sm_90a:
//   nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a -O3 -Iplugins/shared/cuda_kernels \
//     bench/invariant_linear/wgmma_probe.cu -o wgmma_probe && ./wgmma_probe
// (scripts/device.sh linear_kernels runs it.)
#include "invariant_linear.cu"
#include "scale_harness.cuh"

#include <algorithm>
#include <cmath>
#include <string>

using namespace dflash::cuda_kernels;
using namespace scale_harness;

// Optional arguments: one shape's name and one row count (for a profiler).
int main(int argc, char** argv) {
  std::vector<Shape> shapes = scale_shapes();
  std::vector<int64_t> row_counts = {1, 16, 17, 33, 65, 129};
  if (argc > 1) shapes.erase(std::remove_if(shapes.begin(), shapes.end(), [&](const Shape& s) { return std::string(s.name) != argv[1]; }), shapes.end());
  if (argc > 2) row_counts = {std::stoll(argv[2])};
  cudaStream_t st; CK(cudaStreamCreate(&st));
  printf("%-8s %4s %-12s %9s %8s %s\n", "shape", "rows", "kernel", "us", "GB/s", "checks");
  for (const Shape& sh : shapes) {
    const int64_t wbytes = sh.out * sh.in * 2;
    const RotatingWeights w(sh);
    Bf* x = filled(129 * sh.in, 3, 2.f);
    Bf *out, *ref, *alone; float* ws;
    CK(cudaMalloc(&out, 129 * sh.out * 2)); CK(cudaMalloc(&ref, 129 * sh.out * 2)); CK(cudaMalloc(&alone, sh.out * 2));
    const int64_t splits = invariant_linear_splits(sh.out, sh.in);
    CK(cudaMalloc(&ws, splits * 129 * sh.out * 4));
    for (int64_t rows : row_counts) {
      auto call = [&](int i, int64_t r, void* o) { return linear_call(x, w[i], nullptr, nullptr, o, ws, r, sh.out, sh.in, splits); };
      auto mma = [&](int i) { LinearCall c = call(i, rows, out); launch_products_for_rows<Bf>(c, st); launch_add_runs<Bf>(c, st); };
      // The variants: 4 stages, each stage's products waited for; 6 stages
      // with one stage's products kept running (what the sm_90a build runs);
      // blocks of four warpgroups (256 features, 5 stages, up to 80 rows a
      // block; set_invariant_linear_warpgroups).
      auto products = [&](const LinearCall& c, int variant) {
        if (variant == 0) launch_products_wgmma<Bf, 4, 0>(c, st);
        else if (variant == 1) launch_products_wgmma<Bf, 6, 1>(c, st);
        else {
          set_invariant_linear_warpgroups(4);
          launch_products_wgmma<Bf>(c, st);
          set_invariant_linear_warpgroups(2);
        }
      };
      const char* const names[] = {"wgmma s4", "wgmma s6i1", "wgmma 4wg"};
      auto wg = [&](int i, int64_t r, void* o, int variant) {
        LinearCall c = call(i, r, o);
        products(c, variant);
        launch_add_runs<Bf>(c, st);
      };
      auto host = [&](Bf* p, int64_t n) { std::vector<Bf> v(n); CK(cudaMemcpy(v.data(), p, n * 2, cudaMemcpyDeviceToHost)); return v; };
      mma(0); CK(cudaMemcpyAsync(ref, out, rows * sh.out * 2, cudaMemcpyDeviceToDevice, st)); CK(cudaStreamSynchronize(st));
      const double t_mma = time_calls(st, mma);
      printf("%-8s %4lld %-12s %9.2f %8.0f\n", sh.name, (long long)rows, "mma.sync", t_mma, wbytes / t_mma / 1e3);
      for (int variant : {0, 1, 2}) {
        try {
          auto check = [&]() {
            wg(0, rows, out, variant); CK(cudaStreamSynchronize(st));
            const std::vector<Bf> a = host(out, rows * sh.out), b = host(ref, rows * sh.out);
            double worst = 0, scale = 0; int64_t same = 0;
            for (int64_t i = 0; i < rows * sh.out; ++i) {
              const double u = __bfloat162float(a[i]), v = __bfloat162float(b[i]);
              worst = std::max(worst, std::fabs(u - v)); scale = std::max(scale, std::fabs(v));
              same += (*reinterpret_cast<const uint16_t*>(&a[i]) == *reinterpret_cast<const uint16_t*>(&b[i]));
            }
            return std::make_pair(worst / std::max(scale, 1e-30), (double)same / (rows * sh.out));
          };
          auto [err, same] = check();
          // a row alone (N = 8) against the same row among the others
          bool alone_same = true;
          for (int64_t r : {int64_t{0}, rows - 1}) {
            LinearCall c1 = linear_call(x + r * sh.in, w[0], nullptr, nullptr, alone, ws, 1, sh.out, sh.in, splits);
            products(c1, variant);
            launch_add_runs<Bf>(c1, st);
            CK(cudaStreamSynchronize(st));
            const std::vector<Bf> a = host(alone, sh.out), b = host(out + r * sh.out, sh.out);
            alone_same = alone_same && std::equal(a.begin(), a.end(), b.begin(), [](Bf u, Bf v) {
              return *reinterpret_cast<const uint16_t*>(&u) == *reinterpret_cast<const uint16_t*>(&v); });
          }
          const double t = time_calls(st, [&](int i) { wg(i, rows, out, variant); });
          printf("%-8s %4lld %-12s %9.2f %8.0f error %.1e, %.1f%% bits as mma.sync, row alone %s\n", sh.name, (long long)rows,
                 names[variant], t, wbytes / t / 1e3, err, 100 * same, alone_same ? "identical" : "DIFFERENT");
        } catch (const std::exception& e) { printf("%-8s %4lld %s: %s\n", sh.name, (long long)rows, names[variant], e.what()); cudaGetLastError(); }
        fflush(stdout);
      }
    }
    cudaFree(x); cudaFree(out); cudaFree(ref); cudaFree(alone); cudaFree(ws);
  }
  return 0;
}
