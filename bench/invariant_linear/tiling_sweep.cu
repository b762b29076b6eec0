// The invariant linear's tilings side by side (issue 41): each projection of
// the GPU demonstration's scale model (DFLASH_DEMO_SCALE=16: hidden 8192,
// intermediate 24576, 32/16 heads of 64) at the row counts of a chain block
// and of draft trees, for the tiling launch_products_for_rows picks
// ("chosen") and for others, in µs a call and GB/s of weights, each output
// checked bitwise equal to the chosen tiling's (a tiling changes no bit).
// The weights rotate through copies past 512 MB, so no call finds them in L2.
//   invariant_linear_tiling_sweep [shape rows tiling]   (one case, for a profiler)
// Includes the kernel's source: the tilings are its file's own templates.
#include "invariant_linear.cu"
#include "scale_harness.cuh"

#include <string>

using namespace dflash::cuda_kernels;
using namespace scale_harness;
template <class T, int kChunks, int kStages, int kWarps, int kFeatureTiles>
void launch_products_tiled(const LinearCall& c, cudaStream_t stream) {
  switch (tiles_a_block(c.rows)) {
    case 9: launch_products<T, Tiling<9, kChunks, kStages, kWarps, kFeatureTiles>>(c, stream); break;
    case 8: launch_products<T, Tiling<8, kChunks, kStages, kWarps, kFeatureTiles>>(c, stream); break;
    case 6: launch_products<T, Tiling<6, kChunks, kStages, kWarps, kFeatureTiles>>(c, stream); break;
    case 5: launch_products<T, Tiling<5, kChunks, kStages, kWarps, kFeatureTiles>>(c, stream); break;
    case 4: launch_products<T, Tiling<4, kChunks, kStages, kWarps, kFeatureTiles>>(c, stream); break;
    case 3: launch_products<T, Tiling<3, kChunks, kStages, kWarps, kFeatureTiles>>(c, stream); break;
    case 2: launch_products<T, Tiling<2, kChunks, kStages, kWarps, kFeatureTiles>>(c, stream); break;
    default: launch_products<T, Tiling<1, kChunks, kStages, kWarps, kFeatureTiles>>(c, stream); break;
  }
}
struct Variant { std::string name; std::function<void(const LinearCall&, cudaStream_t)> products; };

int main(int argc, char** argv) {
  std::vector<Shape> shapes = scale_shapes();
  std::vector<int64_t> row_counts = {1, 16, 17, 33, 49, 65, 97, 129};
  std::vector<Variant> variants;
#define V(C, S, W, F) variants.push_back({"c" #C "s" #S "w" #W "f" #F, [](const LinearCall& c, cudaStream_t st) { launch_products_tiled<Bf, C, S, W, F>(c, st); }});
  variants.push_back({"chosen", [](const LinearCall& c, cudaStream_t st) { launch_products_for_rows<Bf>(c, st); }});
  V(4, 3, 8, 2) V(2, 4, 8, 2) V(2, 3, 8, 2) V(1, 4, 8, 2) V(1, 6, 8, 2) V(2, 4, 8, 4) V(2, 4, 4, 4)
  if (argc == 4) {
    shapes.erase(std::remove_if(shapes.begin(), shapes.end(), [&](const Shape& s) { return std::string(s.name) != argv[1]; }), shapes.end());
    row_counts = {std::atoll(argv[2])};
    variants.erase(std::remove_if(variants.begin() + 1, variants.end(), [&](const Variant& v) { return v.name != argv[3]; }), variants.end());
  }
  cudaStream_t st; CK(cudaStreamCreate(&st));
  printf("%-8s %4s %-10s %9s %8s %s\n", "shape", "rows", "variant", "us", "GB/s", "bits");
  for (const Shape& sh : shapes) {
    const int64_t wbytes = sh.out * sh.in * 2;
    const RotatingWeights w(sh);
    Bf* x = filled(129 * sh.in, 3, 2.f);
    Bf *out, *ref; float* ws;
    CK(cudaMalloc(&out, 129 * sh.out * 2)); CK(cudaMalloc(&ref, 129 * sh.out * 2));
    const int64_t splits = invariant_linear_splits(sh.out, sh.in);
    CK(cudaMalloc(&ws, std::max<int64_t>(1, 32 * 129 * sh.out) * 4));
    for (int64_t rows : row_counts) {
      auto call = [&](int i, int64_t s) { return linear_call(x, w[i], nullptr, nullptr, out, ws, rows, sh.out, sh.in, s); };
      // The chosen tiling's bits, weights copy 0.
      { LinearCall c = call(0, splits); variants[0].products(c, st); launch_add_runs<Bf>(c, st); CK(cudaMemcpyAsync(ref, out, rows * sh.out * 2, cudaMemcpyDeviceToDevice, st)); CK(cudaStreamSynchronize(st)); }
      auto same = [&]() { std::vector<uint16_t> a(rows * sh.out), b(rows * sh.out); CK(cudaMemcpy(a.data(), out, a.size() * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(b.data(), ref, b.size() * 2, cudaMemcpyDeviceToHost)); return a == b; };
      auto report = [&](const std::string& name, double us, const char* bits) { printf("%-8s %4lld %-10s %9.2f %8.0f %s\n", sh.name, (long long)rows, name.c_str(), us, wbytes / us / 1e3, bits); fflush(stdout); };
      for (const Variant& v : variants) {
        try {
          const double us = time_calls(st, [&](int i) { LinearCall c = call(i, splits); v.products(c, st); launch_add_runs<Bf>(c, st); });
          LinearCall c = call(0, splits); v.products(c, st); launch_add_runs<Bf>(c, st); CK(cudaStreamSynchronize(st));
          report(v.name, us, same() ? "same" : "DIFFERENT");
        } catch (const std::exception& e) { printf("%-8s %4lld %-10s n/a (%s)\n", sh.name, (long long)rows, v.name.c_str(), e.what()); cudaGetLastError(); }
      }
    }
    cudaFree(x); cudaFree(out); cudaFree(ref); cudaFree(ws);
  }
  return 0;
}
