// MESHRT_VECTOR_CLONES: a hot loop compiled for x86-64-v4 (AVX-512) and x86-64-v3 (AVX2 and
// FMA) besides the library's x86-64 (SSE2) baseline, the loader picking the one this CPU runs
// (an ifunc). The levels, not "avx512f" and "avx2": those enable no FMA, and MathF32's
// polynomials then take a multiply and an add per term (the GELU pass 419 against 336 us). Not
// in sanitizer builds: the ifunc's resolver runs while the loader relocates, before the
// sanitizer's runtime has started, and instrumented it crashes there (TSan's
// __tsan_func_entry). Internal to meshrt_kernels.
#pragma once

#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define MESHRT_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define MESHRT_SANITIZED 1
#endif
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(MESHRT_SANITIZED)
#define MESHRT_VECTOR_CLONES [[gnu::target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")]]
#else
#define MESHRT_VECTOR_CLONES
#endif
