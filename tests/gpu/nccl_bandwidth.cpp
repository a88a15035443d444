// NCCL all-reduce bus bandwidth through meshrt's NCCL backend (tests/gpu/run.sh), as
// nccl-tests reports it: algorithm bandwidth = bytes / time, bus bandwidth = algorithm
// bandwidth * 2(n-1)/n, on every visible GPU (one thread-rank each), sizes 1 MiB .. 1 GiB.
#include "meshrt/Nccl.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  int devices = meshrt::nccl::deviceCount();
  if (argc > 1) devices = std::min(devices, std::atoi(argv[1]));
  if (devices < 1) {
    std::fprintf(stderr, "nccl_bandwidth: no CUDA device\n");
    return 1;
  }
  meshrt::Mesh mesh({{"data", devices}});
  std::vector<size_t> sizes;
  for (size_t bytes = size_t(1) << 20; bytes <= (size_t(1) << 30); bytes *= 4)
    sizes.push_back(bytes);
  std::vector<double> milliseconds(sizes.size());
  try {
    meshrt::nccl::runNccl(mesh, [&](meshrt::Communicator& world) {
      auto& nccl = dynamic_cast<meshrt::nccl::NcclCommunicator&>(world);
      float* buffer = nullptr;
      meshrt::nccl::checkCuda(cudaMalloc(&buffer, sizes.back()), "bench", world.rank(),
                              "cudaMalloc");
      meshrt::nccl::checkCuda(cudaMemset(buffer, 0, sizes.back()), "bench", world.rank(),
                              "cudaMemset");
      for (size_t i = 0; i < sizes.size(); ++i) {
        size_t count = sizes[i] / sizeof(float);
        int iterations = sizes[i] >= (size_t(256) << 20) ? 5 : 20;
        world.allReduce(buffer, count); // warm-up
        world.barrier();
        auto start = std::chrono::steady_clock::now();
        for (int k = 0; k < iterations; ++k)
          world.allReduce(buffer, count);
        nccl.synchronize("allReduce");
        double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count() /
            iterations;
        world.barrier();
        if (world.rank() == 0) milliseconds[i] = ms;
      }
      cudaFree(buffer);
    });
  } catch (const std::exception& error) {
    std::fprintf(stderr, "nccl_bandwidth: %s\n", error.what());
    return 1;
  }
  std::printf("NCCL all-reduce (f32 sum) on %d GPUs through meshrt::nccl\n", devices);
  std::printf("%12s %10s %12s %12s\n", "bytes", "time ms", "algbw GB/s", "busbw GB/s");
  for (size_t i = 0; i < sizes.size(); ++i) {
    double algbw = double(sizes[i]) / (milliseconds[i] * 1e-3) / 1e9;
    double busbw = algbw * 2.0 * (devices - 1) / devices;
    std::printf("%12zu %10.3f %12.1f %12.1f\n", sizes[i], milliseconds[i], algbw, busbw);
  }
  return 0;
}
