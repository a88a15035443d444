// f32 transcendentals that GCC vectorizes inside a plain `for` loop at -O3 (with -march=native
// and with plain x86-64 SSE2): branch-free (selects, no calls, no tables), integer tricks on the
// bits instead of frexp/ldexp, rounding by the 1.5 * 2^23 trick instead of rintf (SSE2 has no
// round instruction), no std::fma (a libm call without FMA hardware). Usable from CUDA
// (MESHRT_HD). Special values follow libm: nan propagates, exp(-inf) = 0, exp(x > ln(FLT_MAX))
// = inf, log(0) = -inf, log(x < 0) = nan, tanh(+-inf) = +-1, subnormal inputs and results are
// exact where libm's are.
//
// Methods: exp, log, sin, cos and tanh are Cephes' single-precision routines (S. L. Moshier,
// "Methods and Programs for Mathematical Functions", 1989): Cody-Waite argument reduction
// (W. J. Cody and W. Waite, "Software Manual for the Elementary Functions", 1980) with the
// constant split so that n * C1 is exact, then Cephes' minimax polynomials on the reduced range.
// sigmoid and gelu are written through exp so that their small negative tails do not cancel
// (1 + tanh(u) = 2 / (1 + exp(-2u))). pow computes y * log2(x) and 2^t in double
// (converted lane-wise, still vectorized), then rounds once to f32.
//
// Max error against double-precision libm, stated and asserted by tests/unit/MathF32Test.cpp
// (measured over every 251st f32 bit pattern): exp 0.96 ulp, log 0.77, sin 1.50 and cos 1.46
// for |x| <= 8192, tanh 1.31, sigmoid 2.61, gelu 2.24 for x >= -1 and 4 + 2.43 |2u| below
// (its argument 2u rounded in f32; see gelu), pow 0.75.
// All vectorize at -O3 with -march=native (AVX-512) and all but pow with plain x86-64 (SSE2).
#pragma once

#include "meshrt/HostDevice.h"

#include <cstdint>
#include <cstring>

namespace meshrt::kernels::f32 {
namespace detail {

MESHRT_HD_INLINE uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
MESHRT_HD_INLINE float fromBits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}
MESHRT_HD_INLINE uint64_t bits64(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
MESHRT_HD_INLINE double fromBits64(uint64_t b) {
  double x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

/// cond ? a : b as bit operations: a ternary on floats becomes a branch that GCC will not
/// if-convert for plain SSE2 under -ftrapping-math (the default), as its float compares may trap.
MESHRT_HD_INLINE float select(bool cond, float a, float b) {
  uint32_t mask = 0u - uint32_t(cond);
  return fromBits((bits(a) & mask) | (bits(b) & ~mask));
}
MESHRT_HD_INLINE double select(bool cond, double a, double b) {
  uint64_t mask = 0u - uint64_t(cond);
  return fromBits64((bits64(a) & mask) | (bits64(b) & ~mask));
}

constexpr float kInf = __builtin_huge_valf();
constexpr float kNaN = __builtin_nanf("");

/// Round to nearest (ties to even) for |x| < 2^22: adding 1.5 * 2^23 pushes the fraction out.
MESHRT_HD_INLINE float roundToInt(float x) {
  constexpr float kShift = 0x1.8p23f;
  return (x + kShift) - kShift;
}

MESHRT_HD_INLINE float absolute(float x) {
  return fromBits(bits(x) & 0x7fffffffu);
}
MESHRT_HD_INLINE float copySign(float magnitude, float sign) {
  return fromBits((bits(magnitude) & 0x7fffffffu) | (bits(sign) & 0x80000000u));
}

/// 2^n for integer-valued n in [-126, 127], built in the exponent field.
MESHRT_HD_INLINE float pow2(float n) {
  return fromBits(uint32_t(int32_t(n) + 127) << 23);
}

/// exp on the reduced range: x = n ln2 + r, |r| <= ln2/2; returns e^r and n.
MESHRT_HD_INLINE float expReduced(float x, float& n) {
  constexpr float kLog2e = 1.44269504088896341f;
  // Cody-Waite: ln2 = kC1 + kC2 with kC1 exact in 9 bits, so n * kC1 is exact for |n| < 2^15.
  constexpr float kC1 = 0.693359375f, kC2 = -2.12194440e-4f;
  n = roundToInt(x * kLog2e);
  float r = (x - n * kC1) - n * kC2;
  float r2 = r * r;
  // Cephes expf's minimax polynomial: e^r = 1 + r + r^2 P(r).
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r2 + r + 1.0f;
}

/// e^x 2^k for x in expReduced's range and integer k with -150 <= n + k <= 250: 2^(n + k) as
/// two factors so that each stays normal and a subnormal result rounds once, at the end.
MESHRT_HD_INLINE float expScaled(float x, float k) {
  float n;
  float p = expReduced(x, n);
  n = n + k;
  float half = roundToInt(n * 0.5f - 0.25f); // floor(n / 2) for integer n
  return p * pow2(half) * pow2(n - half);
}

} // namespace detail

MESHRT_HD_INLINE float exp(float x) {
  using namespace detail;
  constexpr float kMax = 88.7228240966796875f; // the largest float x with e^x < FLT_MAX
  constexpr float kMin = -104.0f;              // e^x rounds to 0 below
  // Clamped (nan passes: both comparisons are false) so that 2^n stays in range; the split
  // 2^n = 2^(n/2) * 2^(n - n/2) rounds subnormal results once, at the last multiply. A lane
  // below kMin computes e^0 (its result is replaced by 0 below), not e^kMin: that multiply
  // underflows, and on Intel cores every vector multiply with a subnormal or underflowing
  // result takes a microcode assist (~150 cycles). A softmax over masked scores (-1e9 in half
  // of the causal attention's lanes) ran 3.9x slower for it (bench_mathf32's "exp masked").
  bool over = x > kMax, under = x < kMin, nan = x != x;
  // nan takes the e^0 path too (its int conversion in pow2 would be undefined), then passes.
  float clamped = select(over, kMax, select(under | nan, 0.0f, x));
  float result = expScaled(clamped, 0.0f);
  result = select(over, kInf, result);
  result = select(under, 0.0f, result);
  return select(nan, x, result);
}

MESHRT_HD_INLINE float log(float x) {
  using namespace detail;
  // Subnormals: scaled by 2^23 into the normal range, the exponent corrected after.
  bool tiny = x < 0x1p-126f;
  float scaled = select(tiny, x * 0x1p23f, x);
  uint32_t b = bits(scaled);
  float e = float(int32_t(b >> 23) - 126) - select(tiny, 23.0f, 0.0f);
  // The mantissa in [0.5, 1), moved to [sqrt(0.5), sqrt(2)) so that |m - 1| <= 0.29.
  float m = fromBits((b & 0x007fffffu) | 0x3f000000u);
  bool low = m < 0.707106781186547524f;
  e = select(low, e - 1.0f, e);
  m = select(low, m + m - 1.0f, m - 1.0f);
  float z = m * m;
  // Cephes logf's minimax polynomial: log(1 + m) = m - m^2/2 + m^3 P(m).
  float p = 7.0376836292e-2f;
  p = p * m - 1.1514610310e-1f;
  p = p * m + 1.1676998740e-1f;
  p = p * m - 1.2420140846e-1f;
  p = p * m + 1.4249322787e-1f;
  p = p * m - 1.6668057665e-1f;
  p = p * m + 2.0000714765e-1f;
  p = p * m - 2.4999993993e-1f;
  p = p * m + 3.3333331174e-1f;
  float y = m * z * p;
  // e * ln2 added in two parts (Cody-Waite), the small one first.
  y = y + e * -2.12194440e-4f;
  y = y - 0.5f * z;
  float result = m + y + e * 0.693359375f;
  result = select(x == kInf, kInf, result);
  result = select(x == 0.0f, -kInf, result);
  result = select(x < 0.0f, kNaN, result);
  return select(x != x, x, result);
}

MESHRT_HD_INLINE float tanh(float x) {
  using namespace detail;
  float a = absolute(x);
  // |x| < 0.625: Cephes tanhf's odd minimax polynomial x + x^3 P(x^2).
  float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  float small = p * z * x + x;
  // Otherwise 1 - 2 / (e^{2|x|} + 1), which rounds to exactly 1 from |x| ~ 9.01 on: |x| is
  // clamped to 10 (nan too; it passes below), so e^{2|x|} needs none of exp's range checks.
  float clamped = select(!(a <= 10.0f), 10.0f, a);
  float n;
  float reduced = expReduced(clamped + clamped, n);
  float large = copySign(1.0f - 2.0f / (reduced * pow2(n) + 1.0f), x);
  float result = select(a < 0.625f, small, large);
  return detail::select(x != x, x, result);
}

MESHRT_HD_INLINE float sigmoid(float x) {
  // e = e^{-|x|} never overflows; for x < 0, e / (1 + e) keeps the tail's relative precision.
  float e = exp(-detail::absolute(x));
  float inverse = 1.0f / (1.0f + e);
  float result = detail::select(x < 0.0f, e * inverse, inverse);
  return detail::select(x != x, x, result);
}

/// GELU, tanh approximation as meshc defines it: 0.5 x (1 + tanh(0.7978845608 (x + 0.044715
/// x^3))), computed as x / (1 + e^{-2u}) (the same function; no cancellation for x < 0), all in
/// f32. For x < 0 the result is x e^{2u} / (1 + e^{2u}), whose relative error is the absolute
/// error of 2u ~ -0.14 x^3: 2u rounded in f32 costs about 2 |2u| ulps there (bound 4 + 2.5 |2u|
/// ulp, 165 at x ~ -9.6 where the result is ~1e-30; within 4 ulp for x >= -1). Computing 2u in
/// double (or compensated f32) kept 4 ulp everywhere but cost 1.6x the time of this loop.
/// -inf gives -0 (the limit; the interpreter's double formula gives nan there).
MESHRT_HD_INLINE float gelu(float x) {
  constexpr float kTwoSqrt2OverPi = float(2.0 * 0.79788456080286535588);
  constexpr float kCubic = float(2.0 * 0.79788456080286535588 * 0.044715);
  // x < -20 (or -inf): the result underflows to -0 from x ~ -11.6 on, so -20 gives the same -0
  // with every step finite.
  float bounded = detail::select(x < -20.0f, -20.0f, x);
  float minusTwoU = bounded * (-kTwoSqrt2OverPi - kCubic * (bounded * bounded));
  // e^{-2u} is below 2^-115 past -80 (1 + it is 1) and the result below 2^-150 past 125 (-0
  // there as at 125); nan takes -80 and passes through `bounded`.
  minusTwoU = detail::select(!(minusTwoU >= -80.0f), -80.0f, minusTwoU);
  minusTwoU = detail::select(minusTwoU > 125.0f, 125.0f, minusTwoU);
  // Past 60 both terms of x / (1 + e^{-2u}) are scaled by 2^-64, so that e^{-2u} (up to e^125)
  // stays finite and 2^(n - 64) normal; the one division then rounds a subnormal result once.
  bool scaled = minusTwoU > 60.0f;
  float n;
  float reduced = detail::expReduced(minusTwoU, n);
  float scale = detail::select(scaled, 0x1p-64f, 1.0f);
  float e = reduced * detail::pow2(n + detail::select(scaled, -64.0f, 0.0f));
  return (bounded * scale) / (scale + e);
}

namespace detail {

/// sin and cos of x: Cephes sinf/cosf's octants and polynomials. j = the octant of |x| rounded
/// to even, so r = |x| - j pi/4 lies in [-pi/4, pi/4]. The reduction is Cody-Waite in double
/// (pi/4 in two parts, the first 26 bits long so that j * part is exact): Cephes' f32 split loses
/// ~14 ulp near multiples of pi at |x| ~ 5000.
MESHRT_HD_INLINE void sinCosReduced(float a, float& r, uint32_t& j) {
  constexpr float kFourOverPi = 1.27323954473516f;
  constexpr double kPio4High = 0x1.921fb58000000p-1, kPio4Low = -0x1.dde973dcb3b3ap-28;
  // Clamped: beyond 2^24 the octant is meaningless (and the int conversion would overflow).
  float clamped = select(a < 0x1p24f, a, 0.0f);
  float octant = float(int32_t(clamped * kFourOverPi));
  j = uint32_t(int32_t(octant));
  octant = select((j & 1u) != 0, octant + 1.0f, octant);
  j = (j + 1u) & ~1u;
  double n = double(octant);
  r = float((double(clamped) - n * kPio4High) - n * kPio4Low);
}
MESHRT_HD_INLINE float sinPoly(float r) {
  float z = r * r;
  float p = -1.9515295891e-4f;
  p = p * z + 8.3321608736e-3f;
  p = p * z - 1.6666654611e-1f;
  return p * z * r + r;
}
MESHRT_HD_INLINE float cosPoly(float r) {
  float z = r * r;
  float p = 2.443315711809948e-5f;
  p = p * z - 1.388731625493765e-3f;
  p = p * z + 4.166664568298827e-2f;
  return p * z * z - 0.5f * z + 1.0f;
}

} // namespace detail

MESHRT_HD_INLINE float sin(float x) {
  using namespace detail;
  float a = absolute(x), r;
  uint32_t j;
  sinCosReduced(a, r, j);
  float y = select((j & 2u) != 0, cosPoly(r), sinPoly(r));
  bool negate = ((j & 4u) != 0) != (x < 0.0f);
  y = select(negate, -y, y);
  y = select(x == 0.0f, x, y); // sin(-0) = -0
  return select(a == kInf, kNaN, select(x != x, x, y));
}

MESHRT_HD_INLINE float cos(float x) {
  using namespace detail;
  float a = absolute(x), r;
  uint32_t j;
  sinCosReduced(a, r, j);
  float y = select((j & 2u) != 0, sinPoly(r), cosPoly(r));
  bool negate = ((j & 4u) != 0) != ((j & 2u) != 0);
  y = select(negate, -y, y);
  return select(a == kInf, kNaN, select(x != x, x, y));
}

/// x^y with std::pow's special cases for floats (C99 Annex F): pow(x, +-0) = 1 and pow(1, y) = 1
/// even for nan; a negative x needs an integer y (an odd one keeps the sign); zeros and infs
/// by the sign and parity of y.
MESHRT_HD_INLINE float pow(float x, float y) {
  using namespace detail;
  float a = absolute(x);
  // y's parity: |y| >= 2^24 is an even integer (whole = 0); below, the int conversion is exact.
  float ay = absolute(y);
  bool big = !(ay < 0x1p24f); // nan too: its int conversion would be undefined
  int32_t whole = int32_t(select(big, 0.0f, y));
  bool integer = big | (float(whole) == y);
  // log2|x|: |x| = m 2^e with m in [sqrt(0.5), sqrt(2)) split in f32 as log does, then the
  // series in double (f32's 24 bits of log2 would cost y * log2|x| up to 2^7 ulps of 2^t).
  bool tiny = a < 0x1p-126f;
  uint32_t b = bits(select(tiny, a * 0x1p23f, a));
  float ef = float(int32_t(b >> 23) - 126) - select(tiny, 23.0f, 0.0f);
  float mf = fromBits((b & 0x007fffffu) | 0x3f000000u);
  bool low = mf < 0.707106781186547524f;
  double e = double(select(low, ef - 1.0f, ef));
  double m = double(select(low, mf + mf, mf));
  // log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172: the series to s^15 is below
  // 1e-13 relative, far under the f32 result's half ulp.
  double s = (m - 1.0) / (m + 1.0), s2 = s * s;
  double series = 1.0 / 15;
  series = series * s2 + 1.0 / 13;
  series = series * s2 + 1.0 / 11;
  series = series * s2 + 1.0 / 9;
  series = series * s2 + 1.0 / 7;
  series = series * s2 + 1.0 / 5;
  series = series * s2 + 1.0 / 3;
  series = series * s2 + 1.0;
  constexpr double kTwoOverLn2 = 2.8853900817779268; // 2 / ln 2
  double t = double(y) * (e + s * series * kTwoOverLn2);
  // 2^t = 2^n e^{f ln2}, n = round(t), |f| <= 0.5; clamped to +-160, where the f32 result
  // overflows to inf or underflows to 0 by itself.
  // (a nan t, from a nan x or y, takes 160: the result is set to nan below).
  double clampedT = select(!(t <= 160.0), 160.0, select(t < -160.0, -160.0, t));
  constexpr double kShift = 0x1.8p52;
  double n = (clampedT + kShift) - kShift;
  double f = (clampedT - n) * 0.6931471805599453; // ln 2
  // e^f, |f| <= 0.347, Taylor to f^11: error below 1e-13 relative.
  double q = 1.0 / 39916800;
  q = q * f + 1.0 / 3628800;
  q = q * f + 1.0 / 362880;
  q = q * f + 1.0 / 40320;
  q = q * f + 1.0 / 5040;
  q = q * f + 1.0 / 720;
  q = q * f + 1.0 / 120;
  q = q * f + 1.0 / 24;
  q = q * f + 1.0 / 6;
  q = q * f + 0.5;
  q = q * f + 1.0;
  q = q * f + 1.0;
  // Scaled in f32 as exp does (2^n in two normal halves; subnormals round at the last step).
  float nf = float(n);
  float half = roundToInt(nf * 0.5f - 0.25f);
  float magnitude = float(q) * pow2(half) * pow2(nf - half);
  bool negativeY = y < 0.0f;
  // The log path covers finite x != 0, 1 and infinite or zero results; fix the rest.
  magnitude = select(a == 0.0f, select(negativeY, kInf, 0.0f), magnitude);
  magnitude = select(a == kInf, select(negativeY, 0.0f, kInf), magnitude);
  magnitude = select((a == 1.0f) & (ay == kInf), 1.0f, magnitude);
  bool negativeX = (bits(x) >> 31) != 0; // -0 included
  // A negative x (or -0) with an odd integer y flips the sign: whole's low bit moved to the
  // sign (integer masks, as a bool from it would not vectorize).
  uint32_t flip = (uint32_t(whole) << 31) & bits(x) & (0u - uint32_t(integer));
  float result = fromBits(bits(magnitude) ^ flip);
  result = select(negativeX & !integer & (a != kInf) & (a != 0.0f), kNaN, result);
  result = select((x != x) | (y != y), kNaN, result);
  result = select((y == 0.0f) | (x == 1.0f), 1.0f, result);
  return result;
}

} // namespace meshrt::kernels::f32
