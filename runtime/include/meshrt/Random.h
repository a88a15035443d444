// The layout-invariant RNG shared by the reference interpreter and generated code (host and
// CUDA). Every random value is a pure function of (stream key, global element index, draw), so
// any shard of any layout reproduces exactly the values of the unsharded tensor.
//
// Stream definition (generated code must reproduce it bit for bit):
//   key          = streamKey(seed, name) = mix64(fnv1a64(name) ^ mix64(seed + 0x9E3779B97F4A7C15))
//   block(b, d)  = Philox4x32-10 of counter {lo32(b), hi32(b), d, 0}, key {lo32(key), hi32(key)}
//   word(i, d)   = block(i / 4, d).v[i % 4]: the element with global index i takes word i mod 4
//                  of the call with counter i / 4, so one call serves four consecutive elements
//   uniform01(i, d)       = ((word(i, d) >> 9) + 0.5) * 2^-23, in (0, 1), exact in float
//   uniformIndex(i, bound) = (uint64(word(i, 0)) * bound) >> 32, in [0, bound)
//   normal(i, d): Box-Muller on the word pair of i's half of its call, p = i & ~1:
//                  r = sqrt(-2 ln uniform01(p, d)), t = 2 pi uniform01(p + 1, d);
//                  even i: r cos t, odd i: r sin t (the two are independent standard normals)
//   truncatedNormal(i)    = normal(i, d) for the first d = 0, 1, ... with |normal(i, d)| <= 2
//                  (a redraw recomputes i's own call at draw d; the values of other elements
//                  never depend on whether i was redrawn)
//   dropout keeps element i iff uniform01(i, 0) >= rate (dropoutKeep)
// `index` is the element's row-major index over its tensor type's dims at global sizes.
// Streams: inputs "input/<name>"; params "param/<path>"; random ops their `stream` attribute;
// dropout "<stream>#<step>". Orthogonal init takes its Gaussian matrix from draw 0 and its chi
// norms from draw 1 (same index).
// A contiguous run of global indices is filled with one Philox call per 4 elements by the
// forEach* helpers below (host code); a lone element (a CUDA thread) computes its own call.
#pragma once

#include "meshrt/HostDevice.h"

#include <cmath>
#include <cstdint>
#include <string_view>

namespace meshrt {

struct Philox4x32 {
  uint32_t v[4];
};

/// Philox4x32's round multipliers and key schedule (Weyl increments per round).
constexpr uint32_t kPhiloxMul0 = 0xD2511F53u, kPhiloxMul1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u, kPhiloxWeyl1 = 0xBB67AE85u;

/// Philox4x32-10 (Salmon et al., SC'11), as in Random123's philox4x32.
MESHRT_HD_INLINE Philox4x32 philox4x32(Philox4x32 counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = kPhiloxMul0, kMul1 = kPhiloxMul1;
  constexpr uint32_t kWeyl0 = kPhiloxWeyl0, kWeyl1 = kPhiloxWeyl1;
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

/// 64-bit FNV-1a over bytes, continuing from `hash` (the offset basis starts one).
constexpr uint64_t fnv1a64(std::string_view bytes, uint64_t hash = 0xCBF29CE484222325ull) {
  for (char c : bytes) {
    hash ^= uint64_t(static_cast<unsigned char>(c));
    hash *= 0x100000001B3ull;
  }
  return hash;
}

/// The key of a stream whose name hashes (fnv1a64) to `nameHash`.
constexpr uint64_t streamKeyOfHash(uint64_t seed, uint64_t nameHash) {
  return mix64(nameHash ^ mix64(seed + 0x9E3779B97F4A7C15ull));
}

/// Key of the stream `name` ("input/x", "param/block[0]/w", a dropout stream "...#step").
constexpr uint64_t streamKey(uint64_t seed, std::string_view name) {
  return streamKeyOfHash(seed, fnv1a64(name));
}

/// streamKey(seed, "<name>#<step>") (a train step's dropout stream) without building the string:
/// the hash goes on over '#' and the step's decimal digits.
constexpr uint64_t stepStreamKey(uint64_t seed, std::string_view name, uint64_t step) {
  char digits[20];
  int count = 0;
  do {
    digits[count++] = char('0' + step % 10);
    step /= 10;
  } while (step > 0);
  uint64_t hash = fnv1a64("#", fnv1a64(name));
  for (int k = count; k-- > 0;)
    hash = fnv1a64(std::string_view(&digits[k], 1), hash);
  return streamKeyOfHash(seed, hash);
}

/// The four 32-bit words of call `block` of a stream; `draw` numbers redraws.
MESHRT_HD_INLINE Philox4x32 randomBlock(uint64_t key, uint64_t block, uint32_t draw = 0) {
  return philox4x32(Philox4x32{{uint32_t(block), uint32_t(block >> 32), draw, 0u}}, uint32_t(key),
                    uint32_t(key >> 32));
}

/// The 32 random bits of element `index`: word index % 4 of call index / 4.
MESHRT_HD_INLINE uint32_t randomWord(uint64_t key, uint64_t index, uint32_t draw = 0) {
  return randomBlock(key, index >> 2, draw).v[index & 3];
}

/// Maps 32 random bits to (0, 1): 23 bits plus a half step, exactly representable in float.
MESHRT_HD_INLINE double bitsToUnit(uint32_t bits) {
  return (double(bits >> 9) + 0.5) * (1.0 / 8388608.0);
}

/// Box-Muller from a word pair: radius from the first word, angle from the second; the cosine
/// branch is the even element's value, the sine branch the odd one's. The one formula of both
/// the per-element and the run paths, so that they agree bit for bit.
MESHRT_HD_INLINE double boxMullerRadius(uint32_t bits) {
  return std::sqrt(-2.0 * std::log(bitsToUnit(bits)));
}
MESHRT_HD_INLINE double boxMullerAngle(uint32_t bits) {
  return 6.283185307179586476925 * bitsToUnit(bits);
}
MESHRT_HD_INLINE double boxMullerBranch(double radius, double angle, bool sine) {
  return radius * (sine ? std::sin(angle) : std::cos(angle));
}

MESHRT_HD_INLINE double uniform01(uint64_t key, uint64_t index, uint32_t draw = 0) {
  return bitsToUnit(randomWord(key, index, draw));
}

/// A standard normal sample: element `index`'s branch of the Box-Muller pair it shares with its
/// neighbour (index ^ 1).
MESHRT_HD_INLINE double normal(uint64_t key, uint64_t index, uint32_t draw = 0) {
  Philox4x32 bits = randomBlock(key, index >> 2, draw);
  unsigned pair = unsigned(index & 2);
  return boxMullerBranch(boxMullerRadius(bits.v[pair]), boxMullerAngle(bits.v[pair + 1]),
                         (index & 1) != 0);
}

/// A uniform integer in [0, bound) for 0 < bound <= 2^32 (multiply-shift; bias < bound/2^32).
MESHRT_HD_INLINE uint32_t uniformIndex(uint64_t key, uint64_t index, uint64_t bound,
                                       uint32_t draw = 0) {
  return uint32_t((uint64_t(randomWord(key, index, draw)) * bound) >> 32);
}

/// The truncation bound of truncated_normal (in standard deviations).
constexpr double kTruncation = 2.0;
/// Redraws give up after this many draws (P(|z| > 2)^1000 is 0 in double).
constexpr uint32_t kMaxDraws = 1000;

/// A standard normal conditioned on |z| <= 2: redraws element `index` alone with draw numbers
/// 1, 2, ..., starting from its draw-0 value `first`.
MESHRT_HD_INLINE double truncateNormal(uint64_t key, uint64_t index, double first) {
  double z = first;
  for (uint32_t draw = 1; !(std::fabs(z) <= kTruncation); ++draw) {
    if (draw == kMaxDraws) return 0;
    z = normal(key, index, draw);
  }
  return z;
}

MESHRT_HD_INLINE double truncatedNormal(uint64_t key, uint64_t index) {
  return truncateNormal(key, index, normal(key, index));
}

/// Dropout's mask from an element's word: keep iff its uniform01 >= rate.
MESHRT_HD_INLINE bool dropoutKeepsWord(uint32_t word, double rate) {
  return bitsToUnit(word) >= rate;
}

/// randomWord's value with the word chosen by selects instead of an index, so that a loop over
/// elements calling it vectorizes (generated code's fused dropout loops).
MESHRT_HD_INLINE uint32_t randomWordSelected(uint64_t key, uint64_t index) {
  Philox4x32 bits = randomBlock(key, index >> 2);
  uint32_t odd = uint32_t(index & 1), upper = uint32_t(index & 2);
  uint32_t low = odd ? bits.v[1] : bits.v[0], high = odd ? bits.v[3] : bits.v[2];
  return upper ? high : low;
}

/// dropoutKeep's test in integers: uniform01(word) >= rate exactly when (word >> 9) >= this
/// threshold ((w + 0.5) 2^-23 >= rate <=> w >= rate 2^23 - 0.5, all exact in double).
MESHRT_HD_INLINE uint32_t dropoutThreshold(double rate) {
  double threshold = std::ceil(rate * 8388608.0 - 0.5);
  return threshold <= 0 ? 0u : threshold >= 8388608.0 ? 8388608u : uint32_t(threshold);
}

/// dropoutKeep with a threshold from dropoutThreshold(rate): the same mask, vectorizable.
MESHRT_HD_INLINE bool dropoutKeepBelow(uint64_t key, uint64_t index, uint32_t threshold) {
  return (randomWordSelected(key, index) >> 9) >= threshold;
}

/// The same as all ones (keep) or zero bits: a loop that ands a value with it vectorizes, where
/// a bool stays a branch.
MESHRT_HD_INLINE uint32_t dropoutKeepMask(uint64_t key, uint64_t index, uint32_t threshold) {
  return (randomWordSelected(key, index) >> 9) >= threshold ? ~0u : 0u;
}

/// philox4x32 of the counters {block + l, 0, 0} for l < kLanes at once, each of the four words
/// in an array over the blocks (host code): every statement is then one operation on kLanes
/// lanes, which vectorizes as eight 32-bit lanes (the high half of a product by the even/odd
/// widening multiplies); philox4x32 per block leaves the compiler four 64-bit products per
/// vector and the words to shuffle. The same bits. Its round is philox4x32's written with the
/// low halves as 32-bit products: one round body for both cost the lanes 30% (low halves of
/// 64-bit products) or the scalar calls 36% (two multiplies a product).
struct PhiloxLanes {
  static constexpr int kLanes = 8;
  uint32_t v[4][kLanes];
};
inline PhiloxLanes philoxLanes(uint64_t key, uint64_t block) {
  constexpr uint32_t kMul0 = kPhiloxMul0, kMul1 = kPhiloxMul1;
  constexpr uint32_t kWeyl0 = kPhiloxWeyl0, kWeyl1 = kPhiloxWeyl1;
  constexpr int kLanes = PhiloxLanes::kLanes;
  PhiloxLanes c;
  for (int l = 0; l < kLanes; ++l) {
    uint64_t counter = block + uint64_t(l);
    c.v[0][l] = uint32_t(counter);
    c.v[1][l] = uint32_t(counter >> 32);
    c.v[2][l] = 0u;
    c.v[3][l] = 0u;
  }
  uint32_t key0 = uint32_t(key), key1 = uint32_t(key >> 32);
  for (int round = 0; round < 10; ++round) {
    for (int l = 0; l < kLanes; ++l) {
      uint32_t hi0 = uint32_t((uint64_t(kMul0) * c.v[0][l]) >> 32), lo0 = kMul0 * c.v[0][l];
      uint32_t hi1 = uint32_t((uint64_t(kMul1) * c.v[2][l]) >> 32), lo1 = kMul1 * c.v[2][l];
      uint32_t next0 = hi1 ^ c.v[1][l] ^ key0, next2 = hi0 ^ c.v[3][l] ^ key1;
      c.v[0][l] = next0;
      c.v[1][l] = lo1;
      c.v[2][l] = next2;
      c.v[3][l] = lo0;
    }
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return c;
}

/// dropoutKeepMask of the elements first .. first + count - 1 into out[0 .. count - 1], one Philox
/// call per four elements, eight calls at a time (philoxLanes: 1M masks 2.43 -> 1.58 ms on an
/// AVX2 core, at -O3 -march=native): what a fused loop draws for a run of points before
/// computing them.
inline void dropoutKeepMasks(uint64_t key, uint64_t first, int64_t count, uint32_t threshold,
                             uint32_t* __restrict out) {
  int64_t k = 0;
  for (; k < count && ((first + uint64_t(k)) & 3) != 0; ++k)
    out[k] = dropoutKeepMask(key, first + uint64_t(k), threshold);
  uint64_t firstBlock = (first + uint64_t(k)) >> 2;
  int64_t blocks = (count - k) / 4;
  uint32_t* __restrict blockOut = out + k;
  // Whole groups of kLanes calls, then one group of which only the first calls are kept.
  constexpr int kLanes = PhiloxLanes::kLanes;
  int64_t whole = blocks - blocks % kLanes;
  for (int64_t b = 0; b < whole; b += kLanes) {
    PhiloxLanes bits = philoxLanes(key, firstBlock + uint64_t(b));
    for (int l = 0; l < kLanes; ++l)
      for (int w = 0; w < 4; ++w)
        blockOut[4 * (b + l) + w] = (bits.v[w][l] >> 9) >= threshold ? ~0u : 0u;
  }
  if (whole < blocks) {
    PhiloxLanes bits = philoxLanes(key, firstBlock + uint64_t(whole));
    for (int l = 0; l < int(blocks - whole); ++l)
      for (int w = 0; w < 4; ++w)
        blockOut[4 * (whole + l) + w] = (bits.v[w][l] >> 9) >= threshold ? ~0u : 0u;
  }
  for (k += 4 * blocks; k < count; ++k)
    out[k] = dropoutKeepMask(key, first + uint64_t(k), threshold);
}

/// Whether dropout keeps element `index` (key: streamKey(seed, "<stream>#<step>")).
MESHRT_HD_INLINE bool dropoutKeep(uint64_t key, uint64_t index, double rate) {
  return dropoutKeepsWord(randomWord(key, index), rate);
}

//===------------------------------------------------------------------------------------------===//
// Runs: the same values for the global indices [first, first + count), one Philox call per four
// elements (host code; fn(k, value) for k = 0 .. count - 1, in order).
//===------------------------------------------------------------------------------------------===//

/// fn(k, word(first + k, draw)).
template <typename Fn>
inline void forEachRandomWord(uint64_t key, uint64_t first, uint64_t count, Fn&& fn,
                              uint32_t draw = 0) {
  uint64_t index = first, end = first + count;
  while (index < end) {
    Philox4x32 bits = randomBlock(key, index >> 2, draw);
    uint64_t blockEnd = (index | 3) + 1;
    if (blockEnd > end) blockEnd = end;
    for (; index < blockEnd; ++index)
      fn(index - first, bits.v[index & 3]);
  }
}

/// fn(k, uniform01(key, first + k)).
template <typename Fn>
inline void forEachUniform01(uint64_t key, uint64_t first, uint64_t count, Fn&& fn) {
  forEachRandomWord(key, first, count, [&](uint64_t k, uint32_t word) { fn(k, bitsToUnit(word)); });
}

/// fn(k, uniformIndex(key, first + k, bound)).
template <typename Fn>
inline void forEachUniformIndex(uint64_t key, uint64_t first, uint64_t count, uint64_t bound,
                                Fn&& fn) {
  forEachRandomWord(key, first, count, [&](uint64_t k, uint32_t word) {
    fn(k, uint32_t((uint64_t(word) * bound) >> 32));
  });
}

/// fn(k, normal(key, first + k, draw)): one radius and angle per pair of elements.
template <typename Fn>
inline void forEachNormal(uint64_t key, uint64_t first, uint64_t count, Fn&& fn,
                          uint32_t draw = 0) {
  uint64_t end = first + count;
  for (uint64_t pairStart = first & ~uint64_t(1); pairStart < end; pairStart += 2) {
    Philox4x32 bits = randomBlock(key, pairStart >> 2, draw);
    for (; pairStart < end; pairStart += 2) {
      unsigned pair = unsigned(pairStart & 2);
      double radius = boxMullerRadius(bits.v[pair]), angle = boxMullerAngle(bits.v[pair + 1]);
      if (pairStart >= first) fn(pairStart - first, boxMullerBranch(radius, angle, false));
      if (pairStart + 1 < end) fn(pairStart + 1 - first, boxMullerBranch(radius, angle, true));
      if (pair == 2) break; // the call's last pair: the next pair needs the next call
    }
  }
}

/// fn(k, truncatedNormal(key, first + k)).
template <typename Fn>
inline void forEachTruncatedNormal(uint64_t key, uint64_t first, uint64_t count, Fn&& fn) {
  forEachNormal(key, first, count,
                [&](uint64_t k, double z) { fn(k, truncateNormal(key, first + k, z)); });
}

/// fn(k, dropoutKeep(key, first + k, rate)).
template <typename Fn>
inline void forEachDropoutKeep(uint64_t key, uint64_t first, uint64_t count, double rate, Fn&& fn) {
  forEachRandomWord(key, first, count,
                    [&](uint64_t k, uint32_t word) { fn(k, dropoutKeepsWord(word, rate)); });
}

} // namespace meshrt
