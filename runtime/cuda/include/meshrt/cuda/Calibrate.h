// The GPU measurements behind `meshc calibrate --backend nccl` (header-only, CUDA C++: meshc
// writes a two-line probe that includes this and builds it with nvcc as it builds generated
// CUDA, so what is measured is what generated code gets: GEMMs through meshrt::cuda::einsum2 in
// the math modes the runner offers, NCCL collectives on device buffers of each rank's GPU).
//
// The probe prints one JSON object on stdout (world rank 0), the CPU probe's fields where they
// mean the same (meshrt/Calibrate.h):
//   {"backend": "nccl", "ranks": 2, "devices": 2, "device_name": "...", "memory_bytes": ...,
//    "gemm": [{"m": 2048, "n": 2048, "k": 2048, "flops_per_s": ...}, ...],       (fp32)
//    "gemm_bf16": [...],                                 (bf16 operands, fp32 accumulation)
//    "stream_bytes_per_s": ..., "gemm_small": [{"m": 16, ..., "seconds": ...}, ...],
//    "collectives": [{"kind": "all_reduce", "bytes": 4, "seconds": ...}, ...]}
// Device times are CUDA-event times of the best of several repetitions on rank 0's GPU;
// collectives are the median over repetitions of the slowest rank's wall time to completion.
#pragma once

#include "meshrt/Calibrate.h"
#include "meshrt/Nccl.h"
#include "meshrt/cuda/Cuda.h"

#include <cuda_runtime_api.h>

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshrt::cuda::calibrate {

using meshrt::calibrate::gemmJson;
using meshrt::calibrate::number;

/// Device memory for one measurement (cudaMalloc'd, zero-filled, freed at scope end).
class DeviceBuffer {
public:
  explicit DeviceBuffer(size_t bytes) {
    check(cudaMalloc(&data_, bytes), "calibrate: cudaMalloc");
    check(cudaMemset(data_, 0, bytes), "calibrate: cudaMemset");
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* get() const { return static_cast<float*>(data_); }

private:
  void* data_ = nullptr;
};

/// The best CUDA-event time of `body()` (work enqueued on `stream`) over `repetitions`, after
/// one warm-up run.
template <class Body> double bestDeviceSeconds(cudaStream_t stream, int repetitions, Body body) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "calibrate: cudaEventCreate");
  check(cudaEventCreate(&stop), "calibrate: cudaEventCreate");
  body();
  check(cudaStreamSynchronize(stream), "calibrate: warm-up");
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repetitions; ++r) {
    check(cudaEventRecord(start, stream), "calibrate: cudaEventRecord");
    body();
    check(cudaEventRecord(stop, stream), "calibrate: cudaEventRecord");
    check(cudaEventSynchronize(stop), "calibrate: cudaEventSynchronize");
    float milliseconds = 0;
    check(cudaEventElapsedTime(&milliseconds, start, stop), "calibrate: cudaEventElapsedTime");
    best = std::min(best, 1e-3 * milliseconds);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

/// out[n, n] = a[n, n] . b[n, n], row-major, as a GemmDims of generated code describes it.
inline Gemm squareGemm(int64_t n) {
  return Gemm{{}, {n}, {n}, {n}, {}, {n}, {1}, {}, {n}, {1}, {}, {n}, {1}};
}

/// Best time of one n^3 GEMM through einsum2 in the current context's math mode.
inline double gemmSeconds(int64_t n, int repetitions) {
  size_t bytes = size_t(n) * size_t(n) * sizeof(float);
  DeviceBuffer a(bytes), b(bytes), out(bytes);
  Gemm gemm = squareGemm(n);
  return bestDeviceSeconds(current().stream, repetitions,
                           [&] { einsum2(out.get(), a.get(), b.get(), gemm); });
}

/// The fused elementwise loop a = b + s c, as a generated kernel runs it.
__global__ void triad(float* a, const float* b, const float* c, float s, size_t count) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x)
    a[i] = b[i] + s * c[i];
}

/// Bytes read and written per second by triad over `count` floats per array.
inline double streamBytesPerSecond(size_t count, int repetitions) {
  DeviceBuffer a(count * sizeof(float)), b(count * sizeof(float)), c(count * sizeof(float));
  cudaStream_t stream = current().stream;
  double seconds = bestDeviceSeconds(stream, repetitions, [&] {
    triad<<<1024, 256, 0, stream>>>(a.get(), b.get(), c.get(), 1.5f, count);
  });
  return 3.0 * sizeof(float) * double(count) / seconds;
}

/// One JSON array of `sizes`' GEMM rates (FLOP/s) in the current math mode.
inline std::string gemmRates(const std::vector<int64_t>& sizes, int repetitions) {
  std::string json;
  for (int64_t n : sizes)
    json += (json.empty() ? "" : ", ") +
            gemmJson(n, "flops_per_s",
                     2.0 * double(n) * double(n) * double(n) / gemmSeconds(n, repetitions));
  return json;
}

/// The probe: `probe [--launch threads|mpi] [--ranks N] [--max-bytes B] [--quick]`. Threads
/// (the default outside mpirun): one rank per visible GPU of this process, N of them.
inline int probeMain(int argc, char** argv) {
  nccl::NcclOptions options;
  try {
    options = nccl::NcclOptions::fromArgs(argc, argv);
  } catch (const std::invalid_argument& error) {
    std::fprintf(stderr, "probe: %s\n", error.what());
    return 2;
  }
  meshrt::calibrate::ProbeArgs args;
  if (!args.parse(argc, argv)) return 2;
  int devices = nccl::deviceCount();
  if (options.launch == nccl::NcclLaunch::Threads && devices < args.ranks) {
    std::fprintf(stderr, "probe: %d ranks need %d CUDA devices; %d visible\n", args.ranks,
                 args.ranks, devices);
    return 1;
  }
  int repetitions = args.quick ? 3 : 10;
  size_t maxBytes = args.quick ? args.maxBytes / 16 : args.maxBytes;
  std::string report;
  try {
    bool first = nccl::launch(Mesh({{"x", args.ranks}}), options, [&](Communicator& comm) {
      auto& device = static_cast<nccl::NcclCommunicator&>(comm);
      Context context{device.device(), device.stream(), MathMode::FP32};
      Scope scope(context);
      std::string collectives;
      if (args.ranks > 1) {
        size_t count = maxBytes / sizeof(float) + size_t(args.ranks);
        DeviceBuffer in(count * sizeof(float)), out(count * sizeof(float));
        collectives = meshrt::calibrate::collectivesJson(
            meshrt::calibrate::collectiveTimes(comm, in.get(), out.get(), maxBytes, repetitions,
                                               [&] { device.synchronize("calibrate"); }));
      }
      if (comm.rank() != 0) return;
      std::vector<int64_t> sizes =
          args.quick ? std::vector<int64_t>{2048} : std::vector<int64_t>{2048, 4096, 8192};
      std::string gemm = gemmRates(sizes, repetitions);
      std::string gemmBf16;
      {
        Context bf16{device.device(), device.stream(), MathMode::BF16};
        Scope bf16Scope(bf16);
        gemmBf16 = gemmRates(sizes, repetitions);
      }
      double stream =
          streamBytesPerSecond(args.quick ? (size_t(32) << 20) : (size_t(256) << 20), repetitions);
      std::string gemmSmall;
      for (int64_t n : {16, 32, 64, 128})
        gemmSmall += (gemmSmall.empty() ? "" : ", ") +
                     gemmJson(n, "seconds", gemmSeconds(n, args.quick ? 20 : 100));
      size_t freeBytes = 0, totalBytes = 0;
      check(cudaMemGetInfo(&freeBytes, &totalBytes), "calibrate: cudaMemGetInfo");
      cudaDeviceProp properties{};
      check(cudaGetDeviceProperties(&properties, device.device()),
            "calibrate: cudaGetDeviceProperties");
      report = std::string("{\"backend\": \"nccl\", \"ranks\": ") + std::to_string(args.ranks) +
               ", \"devices\": " + std::to_string(devices) + ", \"device_name\": \"" +
               properties.name + "\", \"memory_bytes\": " + number(double(totalBytes)) +
               ", \"gemm\": [" + gemm + "], \"gemm_bf16\": [" + gemmBf16 +
               "], \"stream_bytes_per_s\": " + number(stream) + ", \"gemm_small\": [" + gemmSmall +
               "], \"collectives\": [" + collectives + "]}";
    });
    if (first) std::fputs((report + "\n").c_str(), stdout);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "probe: %s\n", error.what());
    return 1;
  }
  return 0;
}

} // namespace meshrt::cuda::calibrate
