// The consumer test's user kernel. Generated CUDA calls it in device code (the CUDA consumer
// test), so it is __host__ __device__ under nvcc; plain C++ elsewhere.
#pragma once

#ifdef __CUDACC__
#define CONSUMER_HD __host__ __device__
#else
#define CONSUMER_HD
#endif

CONSUMER_HD inline float leaky(float x) {
  return x > 0 ? x : 0.125f * x;
}
