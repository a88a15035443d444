// The per-element math of meshrt's kernels: every unary/binary op of the IR (OpKinds.def) and
// every dtype rounding, as MESHRT_HD inline functions so that the CPU loops, generated fused
// loops and (issue 7) CUDA kernels all compute with the same bodies.
//
// Value representation (the contract with generated code): every float dtype (f32, bf16, f16)
// lives in a `float` buffer holding a value already rounded to its dtype, exactly as the
// reference interpreter holds values; after an op whose result is bf16/f16, apply roundBF16 /
// roundF16 (roundTo). i32 lives in `int32_t` buffers; arithmetic wraps (two's complement).
// Float ops compute in float (the interpreter computes in double and rounds once): + - * / and
// sqrt are therefore bit-identical, transcendental functions agree to a few ulps.
// Call these qualified (meshrt::kernels::exp): the names are the IR's op spellings.
#pragma once

#include "meshrt/Random.h" // MESHRT_HD

#include <cmath>
#include <cstdint>
#include <cstring>

namespace meshrt::kernels {

/// The dtypes of the IR, as stored by generated code (see the file comment).
enum class ValueType { F32, BF16, F16, I32 };

MESHRT_HD inline uint32_t bitsOf(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  return bits;
}

MESHRT_HD inline float floatOf(uint32_t bits) {
  float x;
  memcpy(&x, &bits, sizeof x);
  return x;
}

//===------------------------------------------------------------------------------------------===//
// Dtype rounding and casts (bit-exact with the interpreter's roundTo / saturateToI32)
//===------------------------------------------------------------------------------------------===//

/// Round to nearest even to bfloat16 (subnormals kept, overflow to inf, nan unchanged).
MESHRT_HD inline float roundBF16(float x) {
  uint32_t bits = bitsOf(x);
  if ((bits & 0x7F800000u) == 0x7F800000u) return x; // inf, nan
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return floatOf(bits & 0xFFFF0000u);
}

/// Round to nearest even to IEEE binary16 (subnormals below 2^-14, overflow past 65504 to inf).
MESHRT_HD inline float roundF16(float x) {
  if (x == 0 || !(std::fabs(x) <= 3.40282347e38f)) return x; // zero, inf, nan
  int exponent = int((bitsOf(x) >> 23) & 0xFFu) - 127;
  if (exponent < -14) exponent = -14;
  // x * 2^(10 - exponent) is exact and lies in [0, 2048): rint rounds it to 11 bits.
  float toUnits = floatOf(uint32_t(127 + 10 - exponent) << 23);
  float quantum = floatOf(uint32_t(127 + exponent - 10) << 23);
  float rounded = std::nearbyint(x * toUnits) * quantum;
  if (std::fabs(rounded) > 65504.0f) return x > 0 ? INFINITY : -INFINITY;
  return rounded;
}

/// The interpreter's roundToFormat on doubles (used where values are produced in double, e.g.
/// RNG fills, so that rounding happens once, as in the interpreter).
MESHRT_HD inline double roundToFormat(double x, int mantissaBits, int minExponent,
                                      double maxFinite) {
  if (x == 0 || !std::isfinite(x)) return x;
  int exponent = std::ilogb(x);
  if (exponent < minExponent) exponent = minExponent;
  double quantum = std::ldexp(1.0, exponent - mantissaBits);
  double rounded = std::nearbyint(x / quantum) * quantum;
  if (std::fabs(rounded) > maxFinite) return std::copysign(double(INFINITY), x);
  return rounded;
}

/// The largest value of an i32 cast: 2^31 - 128, the largest integer below 2^31 that a float
/// holds. Generated code holds i32 tensors as floats, where 2^31 - 1 would become 2^31.
constexpr int32_t kCastI32Max = 2147483520;

/// The language's cast to i32 (the interpreter's saturateToI32, docs/language.md): truncation
/// toward zero, saturating to [-2^31, kCastI32Max]; nan gives 0. Every float in that range
/// truncates to an integer a float holds exactly, so the result is the same in every target.
MESHRT_HD inline int32_t castToI32(double x) {
  if (x != x) return 0;
  if (x >= double(kCastI32Max)) return kCastI32Max;
  if (x <= -2147483648.0) return -2147483647 - 1;
  return int32_t(x);
}

MESHRT_HD inline int32_t castToI32(float x) {
  return castToI32(double(x));
}

/// Wraps an integer to int32 two's complement (the interpreter's wrapToI32 on integral values).
MESHRT_HD inline int32_t wrapI32(int64_t x) {
  return int32_t(uint32_t(uint64_t(x)));
}

/// Rounds a float-held value to `type` (F32: unchanged; I32: truncate and saturate).
MESHRT_HD inline float roundTo(ValueType type, float x) {
  switch (type) {
  case ValueType::BF16:
    return roundBF16(x);
  case ValueType::F16:
    return roundF16(x);
  case ValueType::I32:
    return float(castToI32(x));
  default:
    return x;
  }
}

/// Rounds a double to `type` exactly as the interpreter does, then stores it as float (exact).
MESHRT_HD inline float roundTo(ValueType type, double x) {
  switch (type) {
  case ValueType::BF16:
    return float(roundToFormat(x, 7, -126, 0x1.FEp127));
  case ValueType::F16:
    return float(roundToFormat(x, 10, -14, 65504.0));
  case ValueType::I32:
    return float(castToI32(x));
  default:
    return float(x);
  }
}

/// The `cast` op from a float-held value to a float dtype, and from i32.
MESHRT_HD inline float castToFloat(ValueType type, float x) {
  return roundTo(type, x);
}
MESHRT_HD inline float castToFloat(ValueType type, int32_t x) {
  return roundTo(type, double(x));
}

//===------------------------------------------------------------------------------------------===//
// Unary ops
//===------------------------------------------------------------------------------------------===//

MESHRT_HD inline float neg(float x) {
  return -x;
}
MESHRT_HD inline float abs(float x) {
  return std::fabs(x);
}
MESHRT_HD inline float exp(float x) {
  return std::exp(x);
}
MESHRT_HD inline float log(float x) {
  return std::log(x);
}
MESHRT_HD inline float sqrt(float x) {
  return std::sqrt(x);
}
MESHRT_HD inline float rsqrt(float x) {
  return 1.0f / std::sqrt(x);
}
MESHRT_HD inline float square(float x) {
  return x * x;
}
MESHRT_HD inline float tanh(float x) {
  return std::tanh(x);
}
MESHRT_HD inline float sin(float x) {
  return std::sin(x);
}
MESHRT_HD inline float cos(float x) {
  return std::cos(x);
}
MESHRT_HD inline float relu(float x) {
  return x > 0 ? x : 0.0f;
}

/// 1/(1+e^-x) without overflow for large |x|.
MESHRT_HD inline float sigmoid(float x) {
  if (x >= 0) return 1.0f / (1.0f + std::exp(-x));
  float e = std::exp(x);
  return e / (1.0f + e);
}

/// x * Phi(x), tanh approximation (the interpreter's constants):
/// 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)), exactly, and one exp is several times cheaper
/// than tanh; no cancellation anywhere, and the same zeros, infinities and nans.
MESHRT_HD inline float gelu(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  float u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
  return x / (1.0f + std::exp(-2.0f * u));
}

MESHRT_HD inline int32_t neg(int32_t x) {
  return int32_t(0u - uint32_t(x));
}
MESHRT_HD inline int32_t abs(int32_t x) {
  return x < 0 ? neg(x) : x;
}
MESHRT_HD inline int32_t square(int32_t x) {
  return int32_t(uint32_t(x) * uint32_t(x));
}
MESHRT_HD inline int32_t relu(int32_t x) {
  return x > 0 ? x : 0;
}

//===------------------------------------------------------------------------------------------===//
// Binary ops
//===------------------------------------------------------------------------------------------===//

MESHRT_HD inline float add(float a, float b) {
  return a + b;
}
MESHRT_HD inline float sub(float a, float b) {
  return a - b;
}
MESHRT_HD inline float mul(float a, float b) {
  return a * b;
}
MESHRT_HD inline float div(float a, float b) {
  return a / b;
}
MESHRT_HD inline float pow(float a, float b) {
  return std::pow(a, b);
}
/// max/min propagate nan (a + b is nan when either is); otherwise std::max/std::min's choice.
MESHRT_HD inline float maximum(float a, float b) {
  return (a != a || b != b) ? a + b : (a < b ? b : a);
}
MESHRT_HD inline float minimum(float a, float b) {
  return (a != a || b != b) ? a + b : (b < a ? b : a);
}

MESHRT_HD inline int32_t add(int32_t a, int32_t b) {
  return int32_t(uint32_t(a) + uint32_t(b));
}
MESHRT_HD inline int32_t sub(int32_t a, int32_t b) {
  return int32_t(uint32_t(a) - uint32_t(b));
}
MESHRT_HD inline int32_t mul(int32_t a, int32_t b) {
  return int32_t(uint32_t(a) * uint32_t(b));
}
/// Truncating division; 0 on division by zero; INT_MIN / -1 wraps to INT_MIN.
MESHRT_HD inline int32_t div(int32_t a, int32_t b) {
  return b == 0 ? 0 : wrapI32(int64_t(a) / int64_t(b));
}
/// Integer power with wrap-around; negative exponents follow integer division (1/b^n).
MESHRT_HD inline int32_t pow(int32_t base, int32_t exponent) {
  if (exponent < 0) return base == 1 ? 1 : base == -1 ? ((exponent & 1) ? -1 : 1) : 0;
  uint32_t result = 1, factor = uint32_t(base);
  for (uint32_t e = uint32_t(exponent); e > 0; e >>= 1) {
    if (e & 1u) result *= factor;
    factor *= factor;
  }
  return int32_t(result);
}
MESHRT_HD inline int32_t maximum(int32_t a, int32_t b) {
  return a < b ? b : a;
}
MESHRT_HD inline int32_t minimum(int32_t a, int32_t b) {
  return b < a ? b : a;
}

/// Comparisons give i32 0/1.
template <typename T> MESHRT_HD inline int32_t lt(T a, T b) {
  return a < b;
}
template <typename T> MESHRT_HD inline int32_t le(T a, T b) {
  return a <= b;
}
template <typename T> MESHRT_HD inline int32_t gt(T a, T b) {
  return a > b;
}
template <typename T> MESHRT_HD inline int32_t ge(T a, T b) {
  return a >= b;
}
template <typename T> MESHRT_HD inline int32_t eq(T a, T b) {
  return a == b;
}
template <typename T> MESHRT_HD inline int32_t ne(T a, T b) {
  return a != b;
}

/// a where cond != 0, else b.
template <typename C, typename T> MESHRT_HD inline T where(C cond, T a, T b) {
  return cond != 0 ? a : b;
}

//===------------------------------------------------------------------------------------------===//
// Pieces of the composite kernels, shared with their CUDA versions
//===------------------------------------------------------------------------------------------===//

/// The shift softmax/logsumexp subtract: the lane max, or 0 when it is not finite (all -inf or
/// an inf), so that the arithmetic then yields nan/inf honestly, as the interpreter does.
MESHRT_HD inline float softmaxShift(float max) {
  return std::isfinite(max) ? max : 0.0f;
}

/// The kept value: x / (1 - rate) computed in double and rounded once, as the interpreter does.
MESHRT_HD inline float dropoutScale(float x, double rate) {
  return float(double(x) * (rate < 1 ? 1 / (1 - rate) : 0.0));
}

} // namespace meshrt::kernels
