// MESHRT_HD marks the functions that run on the host and in CUDA kernels alike (the scalar math
// shared by generated C++ and CUDA, the RNG); MESHRT_HD_INLINE also forces them inline on the
// host: generated loops call them per element, and a call (which GCC chooses in large
// translation units) stops the loop's vectorization.
#pragma once

#ifdef __CUDACC__
#define MESHRT_HD __host__ __device__
#define MESHRT_HD_INLINE __host__ __device__ __forceinline__
#else
#define MESHRT_HD
#define MESHRT_HD_INLINE inline __attribute__((always_inline))
#endif
