// Generated-einsum throughput against raw cuBLAS on the same shapes (tests/gpu/run.sh): the
// path generated CUDA takes for an einsum (meshrt::cuda::einsum2 with the GemmDims the emitter
// writes, including any operand packing) against one cublasSgemm / cublasSgemmStridedBatched
// call on dense row-major operands, in each precision mode. Prints one line per shape: GFLOP/s
// of both and their ratio. Needs a GPU; builds anywhere nvcc is.
#include "meshrt/cuda/Cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

namespace {

using meshrt::cuda::check;
using meshrt::cuda::checkCublas;

struct Shape {
  const char* name;
  int64_t batch, m, n, k;
  bool transposedB; // b stored [n, k] (e.g. q . k^T)
};

double seconds(cudaStream_t stream, int iterations, const std::function<void()>& body) {
  body(); // warm-up (cuBLAS heuristics, allocations)
  check(cudaStreamSynchronize(stream), "sync");
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i)
    body();
  check(cudaStreamSynchronize(stream), "sync");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
         iterations;
}

} // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "einsum_bench: no CUDA device\n");
    return 1;
  }
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  // Transformer-layer shapes (batch*seq tokens x d_model x d_ff, attention per head).
  const Shape shapes[] = {{"ffn_in  [8192x1024]x[1024x4096]", 1, 8192, 4096, 1024, false},
                          {"ffn_out [8192x4096]x[4096x1024]", 1, 8192, 1024, 4096, false},
                          {"qkv     [8192x1024]x[1024x3072]", 1, 8192, 3072, 1024, false},
                          {"scores  64x[512x64]x[512x64]^T", 64, 512, 512, 64, true},
                          {"mix     64x[512x512]x[512x64]", 64, 512, 64, 512, false}};
  std::printf("%-34s %-5s %12s %12s %8s\n", "shape", "mode", "meshc GF/s", "cuBLAS GF/s", "ratio");
  for (meshrt::cuda::MathMode mode :
       {meshrt::cuda::MathMode::FP32, meshrt::cuda::MathMode::TF32, meshrt::cuda::MathMode::BF16}) {
    meshrt::cuda::Context context;
    context.stream = stream;
    context.math = mode;
    meshrt::cuda::Scope scope(context);
    for (const Shape& s : shapes) {
      size_t aCount = size_t(s.batch * s.m * s.k), bCount = size_t(s.batch * s.k * s.n),
             cCount = size_t(s.batch * s.m * s.n);
      float *a, *b, *c;
      check(cudaMalloc(&a, aCount * 4), "malloc");
      check(cudaMalloc(&b, bCount * 4), "malloc");
      check(cudaMalloc(&c, cCount * 4), "malloc");
      std::vector<float> ones(std::max({aCount, bCount}), 0.01f);
      check(cudaMemcpy(a, ones.data(), aCount * 4, cudaMemcpyHostToDevice), "copy");
      check(cudaMemcpy(b, ones.data(), bCount * 4, cudaMemcpyHostToDevice), "copy");
      // The GemmDims the emitter writes for out[b, m, n] = a[b, m, k] * b[b, k, n] (or [b, n, k]).
      meshrt::cuda::Gemm g;
      g.batch = {s.batch};
      g.m = {s.m};
      g.n = {s.n};
      g.k = {s.k};
      g.aBatch = {s.m * s.k};
      g.aM = {s.k};
      g.aK = {1};
      g.bBatch = {s.k * s.n};
      g.bK = s.transposedB ? std::vector<int64_t>{1} : std::vector<int64_t>{s.n};
      g.bN = s.transposedB ? std::vector<int64_t>{s.k} : std::vector<int64_t>{1};
      g.outBatch = {s.m * s.n};
      g.outM = {s.n};
      g.outN = {1};
      int iterations = 20;
      double meshc = seconds(stream, iterations, [&] { meshrt::cuda::einsum2(c, a, b, g); });
      cublasHandle_t handle = context.cublas();
      cublasComputeType_t compute = meshrt::cuda::computeTypeOf(mode);
      float one = 1, zero = 0;
      double raw = seconds(stream, iterations, [&] {
        checkCublas(cublasGemmStridedBatchedEx(
                        handle, s.transposedB ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, int(s.n),
                        int(s.m), int(s.k), &one, b, CUDA_R_32F, int(s.transposedB ? s.k : s.n),
                        s.k * s.n, a, CUDA_R_32F, int(s.k), s.m * s.k, &zero, c, CUDA_R_32F,
                        int(s.n), s.m * s.n, int(s.batch), compute, CUBLAS_GEMM_DEFAULT),
                    "cublasGemmStridedBatchedEx");
      });
      double flops = 2.0 * double(s.batch) * double(s.m) * double(s.n) * double(s.k);
      std::printf("%-34s %-5s %12.0f %12.0f %8.2f\n", s.name, meshrt::cuda::mathModeName(mode),
                  flops / meshc / 1e9, flops / raw / 1e9, raw / meshc);
      cudaFree(a);
      cudaFree(b);
      cudaFree(c);
    }
  }
  std::printf("(ratio = cuBLAS time / meshc time; both with the mode's compute type on the fp32 "
              "operands: meshc adds its operand tables and any packing of a strided operand)\n");
  return 0;
}
