// The layout-invariant RNG shared by the reference interpreter and generated code (host and
// CUDA). Every random value is a pure function of (stream key, global element index, draw), so
// any shard of any layout reproduces exactly the values of the unsharded tensor.
//
// Keying scheme (generated code must reproduce it bit for bit):
//   key     = streamKey(seed, name) = mix64(fnv1a64(name) ^ mix64(seed + 0x9E3779B97F4A7C15))
//   counter = {lo32(index), hi32(index), draw, 0}, Philox4x32-10 with key {lo32(key), hi32(key)}
//   uniform01(key, index, draw) = ((out[0] >> 9) + 0.5) * 2^-23, in (0, 1), exact in float
//   normal(key, index, draw)    = sqrt(-2 ln u0) * cos(2 pi u1), u0/u1 from out[0]/out[1]
//   uniformIndex(key, index, bound) = (uint64(out[0]) * bound) >> 32, in [0, bound)
// `index` is the element's row-major index over its tensor type's dims at global sizes.
// Streams: inputs "input/<name>"; params "param/<path>"; random ops their `stream` attribute;
// dropout "<stream>#<step>" (keep iff uniform01 >= rate). Draw numbers: truncated_normal redraws
// with draw 1, 2, ... until |z| <= 2; orthogonal takes its Gaussian matrix from draw 0 and its
// chi norms from draw 1 (same index).
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#ifdef __CUDACC__
#define MESHRT_HD __host__ __device__
#else
#define MESHRT_HD
#endif

namespace meshrt {

struct Philox4x32 {
  uint32_t v[4];
};

/// Philox4x32-10 (Salmon et al., SC'11), as in Random123's philox4x32.
MESHRT_HD inline Philox4x32 philox4x32(Philox4x32 counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t product0 = uint64_t(kMul0) * counter.v[0];
    uint64_t product1 = uint64_t(kMul1) * counter.v[2];
    uint32_t hi0 = uint32_t(product0 >> 32), lo0 = uint32_t(product0);
    uint32_t hi1 = uint32_t(product1 >> 32), lo1 = uint32_t(product1);
    counter = Philox4x32{{hi1 ^ counter.v[1] ^ key0, lo1, hi0 ^ counter.v[3] ^ key1, lo0}};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

/// The splitmix64 finalizer: a bijective 64-bit mixer.
MESHRT_HD constexpr uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

/// 64-bit FNV-1a over bytes.
constexpr uint64_t fnv1a64(std::string_view bytes) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (char c : bytes) {
    hash ^= uint64_t(static_cast<unsigned char>(c));
    hash *= 0x100000001B3ull;
  }
  return hash;
}

/// Key of the stream `name` ("input/x", "param/block[0]/w", a dropout stream "...#step").
constexpr uint64_t streamKey(uint64_t seed, std::string_view name) {
  return mix64(fnv1a64(name) ^ mix64(seed + 0x9E3779B97F4A7C15ull));
}

/// The four 32-bit outputs for element `index` of a stream; `draw` numbers redraws.
MESHRT_HD inline Philox4x32 randomBits(uint64_t key, uint64_t index, uint32_t draw = 0) {
  return philox4x32(Philox4x32{{uint32_t(index), uint32_t(index >> 32), draw, 0u}}, uint32_t(key),
                    uint32_t(key >> 32));
}

/// Maps 32 random bits to (0, 1): 23 bits plus a half step, exactly representable in float.
MESHRT_HD inline double bitsToUnit(uint32_t bits) {
  return (double(bits >> 9) + 0.5) * (1.0 / 8388608.0);
}

MESHRT_HD inline double uniform01(uint64_t key, uint64_t index, uint32_t draw = 0) {
  return bitsToUnit(randomBits(key, index, draw).v[0]);
}

/// A standard normal sample (Box-Muller, one sample per element: element-local by design).
MESHRT_HD inline double normal(uint64_t key, uint64_t index, uint32_t draw = 0) {
  Philox4x32 bits = randomBits(key, index, draw);
  double radius = std::sqrt(-2.0 * std::log(bitsToUnit(bits.v[0])));
  return radius * std::cos(6.283185307179586476925 * bitsToUnit(bits.v[1]));
}

/// A uniform integer in [0, bound) for 0 < bound <= 2^32 (multiply-shift; bias < bound/2^32).
MESHRT_HD inline uint32_t uniformIndex(uint64_t key, uint64_t index, uint64_t bound,
                                       uint32_t draw = 0) {
  return uint32_t((uint64_t(randomBits(key, index, draw).v[0]) * bound) >> 32);
}

} // namespace meshrt
