// Support for generated code, part 1 of 5 (meshc/GeneratedSupport.h includes them in order):
// buffers, views and the arena; dtype rounding and the per-element functions; the f32 math of
// the fused loops; strided iteration.
#pragma once

#include "meshc/TensorFile.h"
#include "meshc/VectorMath.h"
#include "meshrt/Checkpoint.h"
#include "meshrt/Comm.h"
#include "meshrt/Random.h"
#include "meshrt/kernels/Einsum.h"
#include "meshrt/kernels/Fill.h"
#include "meshrt/kernels/MathF32.h"
#include "meshrt/kernels/SoftmaxStats.h"

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>

namespace meshc::gen {

using Buffer = std::vector<float>;
using Shape = std::vector<int64_t>;

// The RNG fills of run()'s random ops and of the params (the CUDA support header has its own,
// which fill on the host and upload).
using meshrt::kernels::fillParam;
using meshrt::kernels::fillRandomInt;
using meshrt::kernels::fillRandomNormal;
using meshrt::kernels::fillRandomUniform;

/// A local shard (or a whole tensor) with its shape, as the generated API takes and returns.
struct Tensor {
  Shape shape;
  Buffer data;
};

/// A value's storage as the support functions read and write it: a Buffer or an arena slot.
using View = std::span<float>;
using ConstView = std::span<const float>;

/// One block of memory per generated object holding every temporary of run(): each value lives
/// in a slot at a byte offset the generator assigned by liveness (values whose live ranges do
/// not overlap share bytes). Allocated once, in the constructor.
class Arena {
public:
  static constexpr size_t kAlignment = 64;

  explicit Arena(size_t bytes)
      : bytes_(bytes), memory_(static_cast<float*>(::operator new(std::max(bytes, kAlignment),
                                                                  std::align_val_t(kAlignment)))) {}

  size_t bytes() const { return bytes_; }

  /// The slot at `byteOffset`, zeroed (as a freshly allocated buffer: no stale data).
  View slot(size_t byteOffset, size_t count) { return fill(byteOffset, count, 0.0f); }
  /// The slot at `byteOffset` as it is (a statement that writes every element comes next).
  View view(size_t byteOffset, size_t count) { return at(byteOffset, count); }
  /// The slot at `byteOffset` with every element `value`.
  View fill(size_t byteOffset, size_t count, float value) {
    View view = at(byteOffset, count);
    std::fill(view.begin(), view.end(), value);
    return view;
  }
  /// The slot at `byteOffset` holding a copy of `from`.
  View copy(size_t byteOffset, ConstView from) {
    View view = at(byteOffset, from.size());
    std::copy(from.begin(), from.end(), view.begin());
    return view;
  }

private:
  View at(size_t byteOffset, size_t count) {
    if (byteOffset % kAlignment != 0 || byteOffset + count * sizeof(float) > bytes_)
      throw std::logic_error("arena slot [" + std::to_string(byteOffset) + ", +" +
                             std::to_string(count * sizeof(float)) + ") outside the arena of " +
                             std::to_string(bytes_) + " bytes");
    return View(memory_.get() + byteOffset / sizeof(float), count);
  }

  struct AlignedDelete {
    void operator()(float* memory) const {
      ::operator delete(memory, std::align_val_t(kAlignment));
    }
  };
  size_t bytes_;
  std::unique_ptr<float, AlignedDelete> memory_;
};

inline int64_t product(const Shape& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes)
    n *= s;
  return n;
}

inline std::string shapeString(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

/// Throws std::invalid_argument unless `tensor` has exactly `expected` shape and data size.
inline void checkShape(const char* what, const std::string& name, const Tensor& tensor,
                       const Shape& expected) {
  if (tensor.shape != expected || int64_t(tensor.data.size()) != product(expected))
    throw std::invalid_argument(std::string(what) + " '" + name + "': expected shape " +
                                shapeString(expected) + " (" + std::to_string(product(expected)) +
                                " elements) but got shape " + shapeString(tensor.shape) + " with " +
                                std::to_string(tensor.data.size()) + " elements");
}

//===------------------------------------------------------------------------------------------===//
// Scalars: dtype rounding and the per-element functions (computed as the interpreter does).
// MESHRT_HD: the CUDA target's fused kernels (meshc/CudaSupport.h) call these same bodies.
//===------------------------------------------------------------------------------------------===//

MESHRT_HD inline float roundBF16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7F800000u) == 0x7F800000u) return x;
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  bits &= 0xFFFF0000u;
  std::memcpy(&x, &bits, 4);
  return x;
}

namespace detail {
/// a where `condition`, else b: on the bits, so that a loop of several such choices stays one
/// basic block that GCC vectorizes (chained conditional expressions left control flow).
MESHRT_HD inline uint64_t selectBits(bool condition, uint64_t a, uint64_t b) {
  uint64_t mask = uint64_t(0) - uint64_t(condition);
  return (a & mask) | (b & ~mask);
}
/// The bits of 2^exponent for a normal double's exponent.
MESHRT_HD inline uint64_t powerOfTwoBits(int exponent) {
  return uint64_t(exponent + 1023) << 52;
}
} // namespace detail

/// x rounded to a float format of `mantissaBits` bits after the point whose normal numbers
/// start at 2^minExponent (below it, subnormals: one quantum 2^(minExponent - mantissaBits)),
/// to nearest, ties to even; past maxFinite infinity; zeros, infinities and NaN unchanged: the
/// interpreter's roundToFormat (ilogb, ldexp, nearbyint), computed on the bits without a branch
/// or a libm call so that the generated loops vectorize (the calls made each bf16 value of
/// ViT's feed-forward cost 15-28 ns). A normal result is the magnitude's mantissa rounded at
/// its bit `52 - mantissaBits`; a subnormal one (a + c) - c, c a quantum times 2^52, which the
/// FPU rounds to a multiple of the quantum.
MESHRT_HD inline double roundToFormat(double x, int mantissaBits, int minExponent,
                                      double maxFinite) {
  uint64_t bits, maxBits;
  std::memcpy(&bits, &x, 8);
  std::memcpy(&maxBits, &maxFinite, 8);
  uint64_t sign = bits & 0x8000000000000000ull, magnitudeBits = bits ^ sign;
  int shift = 52 - mantissaBits;
  uint64_t unit = uint64_t(1) << shift;
  uint64_t normalBits =
      (magnitudeBits + (unit / 2 - 1) + ((magnitudeBits >> shift) & 1)) & ~(unit - 1);
  uint64_t scaleBits = detail::powerOfTwoBits(minExponent - mantissaBits + 52);
  double magnitude, scale;
  std::memcpy(&magnitude, &magnitudeBits, 8);
  std::memcpy(&scale, &scaleBits, 8);
  double subnormal = (magnitude + scale) - scale;
  uint64_t subnormalBits;
  std::memcpy(&subnormalBits, &subnormal, 8);
  constexpr uint64_t kInfinityBits = 0x7FF0000000000000ull;
  uint64_t rounded = detail::selectBits(magnitudeBits < detail::powerOfTwoBits(minExponent),
                                        subnormalBits, normalBits);
  rounded = detail::selectBits(rounded > maxBits, kInfinityBits, rounded);
  rounded = detail::selectBits(magnitudeBits >= kInfinityBits, magnitudeBits, rounded) | sign;
  double result;
  std::memcpy(&result, &rounded, 8);
  return result;
}

MESHRT_HD inline float roundF16(float x) {
  return float(roundToFormat(x, 10, -14, 65504.0));
}

/// i32 wrap of an integral value (two's complement), as the interpreter's roundTo(i32): nan is
/// 0, beyond +-2^63 the nearer i32 bound. Branch-free (selects; the conversion sees 0 where it
/// would overflow), so that a fused loop that computes an i32 value vectorizes: with branches,
/// xlnet's loss-gradient loop (its permutation's i32 mask, exp of log-probabilities) stayed
/// scalar, "control flow in loop", 12.7 us a [2, 16, 64] run against 1.0 branch-free.
MESHRT_HD inline float wrapI32(double x) {
  using meshrt::kernels::f32::detail::select;
  double whole = std::trunc(x);
  bool inRange = std::fabs(whole) < 0x1p63; // false for nan
  float wrapped = float(int32_t(uint32_t(uint64_t(int64_t(select(inRange, whole, 0.0))))));
  float bound = select(x > 0, 2147483647.0f, -2147483648.0f);
  return select(x != x, 0.0f, select(inRange, wrapped, bound));
}

/// Cast to i32 (both targets): meshrt::kernels::castToI32, held as the float it fits exactly.
MESHRT_HD inline float castToI32(double x) {
  return float(meshrt::kernels::castToI32(x));
}

// Computed in double and returned unrounded: the caller rounds once to the result dtype.
MESHRT_HD inline double sigmoid(double x) {
  // One exp of -|x| for both signs (the same values as exp(-x) for x >= 0 and exp(x) below),
  // no branch around the call: the loop vectorizes (meshc/VectorMath.h).
  double e = std::exp(-std::fabs(x));
  return x >= 0 ? 1 / (1 + e) : e / (1 + e);
}

MESHRT_HD inline double gelu(double x) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  return 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}

//===------------------------------------------------------------------------------------------===//
// f32 math of the fused loops: computed in f32 (the interpreter computes in double and rounds
// once; the difference is a few f32 ulps, inside the comparison tolerance of docs/codegen.md)
//===------------------------------------------------------------------------------------------===//

// meshrt::kernels::f32: branch-free, vectorized by the C++ compiler inside the fused loops
// (accuracy per function in tests/unit/MathF32Test.cpp, at most 4 ulp).
MESHRT_HD_INLINE float fexp(float x) {
  return meshrt::kernels::f32::exp(x);
}
MESHRT_HD_INLINE float flog(float x) {
  return meshrt::kernels::f32::log(x);
}
MESHRT_HD_INLINE float ftanh(float x) {
  return meshrt::kernels::f32::tanh(x);
}
MESHRT_HD_INLINE float fsin(float x) {
  return meshrt::kernels::f32::sin(x);
}
MESHRT_HD_INLINE float fcos(float x) {
  return meshrt::kernels::f32::cos(x);
}
MESHRT_HD_INLINE float fpow(float x, float y) {
  return meshrt::kernels::f32::pow(x, y);
}
MESHRT_HD_INLINE float fsqrt(float x) {
  return std::sqrt(x);
}
MESHRT_HD_INLINE float fsigmoid(float x) {
  return meshrt::kernels::f32::sigmoid(x);
}
MESHRT_HD_INLINE float fgelu(float x) {
  return meshrt::kernels::f32::gelu(x);
}
MESHRT_HD_INLINE float ffloor(float x) {
  return std::floor(x);
}
MESHRT_HD_INLINE float fceil(float x) {
  return std::ceil(x);
}
/// Halves to even: the default rounding mode, as the interpreter's std::nearbyint.
MESHRT_HD_INLINE float fround(float x) {
  return std::nearbyint(x);
}

/// `value` where `mask` (meshrt::dropoutKeepMask) keeps the element, else +0: bit operations,
/// which vectorize where a float ternary or a bool would stay a branch.
MESHRT_HD_INLINE float keepOrZero(uint32_t mask, float value) {
  using namespace meshrt::kernels::f32::detail;
  return fromBits(bits(value) & mask);
}

/// max(x, 0), +0 for x <= 0 and nan, as the interpreter's relu: bit operations, so that a loop
/// that relus then computes in double (dropout's scale) still vectorizes; with a ternary, GCC
/// moves the double multiply under a branch it cannot if-convert (the mlp's relu-dropout loop ran
/// 13.3 us a [32, 256] run against 7.1 on one Zen 4 core).
MESHRT_HD_INLINE float relu(float x) {
  return meshrt::kernels::f32::detail::select(x > 0.0f, x, 0.0f);
}

/// A comparison's value, 1 where `holds` else +0, and where's `condition != 0 ? a : b`, as bit
/// operations for the same reason: the backward of a relu's dropout (a compare, a where and the
/// double scale) ran 4.65 us a [32, 256] run with ternaries against 1.58.
MESHRT_HD_INLINE float flag(bool holds) {
  return meshrt::kernels::f32::detail::select(holds, 1.0f, 0.0f);
}
MESHRT_HD_INLINE float where(float condition, float a, float b) {
  return meshrt::kernels::f32::detail::select(condition != 0.0f, a, b);
}

MESHRT_HD_INLINE float maximum(float a, float b) {
  return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
}
MESHRT_HD_INLINE float minimum(float a, float b) {
  return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
}

/// i32 division: truncating, 0 on division by zero.
MESHRT_HD inline float divI32(float a, float b) {
  int64_t x = int64_t(a), y = int64_t(b);
  return y == 0 ? 0.0f : wrapI32(double(x / y));
}

/// Whether element a of a row (elements `stride` apart) comes before element b in top_k's
/// order: NaN first, then descending, ties to the lower position. A strict total order, the
/// interpreter's stable sort's, so that both targets select the same positions.
MESHRT_HD inline bool topKBefore(const float* row, int64_t stride, int64_t a, int64_t b) {
  float u = row[a * stride], v = row[b * stride];
  if (std::isnan(u) != std::isnan(v)) return std::isnan(u);
  if (!std::isnan(u) && u != v) return u > v;
  return a < b;
}

/// Element i's place in a row of n in topKBefore's order (how many come before it): CUDA's
/// top_k, one thread per element, writes i at this place when it is below k.
MESHRT_HD inline int64_t topKRank(const float* row, int64_t stride, int64_t n, int64_t i) {
  int64_t rank = 0;
  for (int64_t t = 0; t < n; ++t)
    rank += topKBefore(row, stride, t, i) ? 1 : 0;
  return rank;
}

/// i32 floor division and modulo (Python's // and %, the modulo taking the divisor's sign);
/// by zero: quotient 0 and modulo a, so that a == b * (a // b) + a % b always holds.
MESHRT_HD inline int64_t floorQuotient(int64_t x, int64_t y) {
  if (y == 0) return 0;
  int64_t q = x / y;
  return (x % y != 0 && (x < 0) != (y < 0)) ? q - 1 : q;
}
MESHRT_HD inline float floorDivI32(float a, float b) {
  return wrapI32(double(floorQuotient(int64_t(a), int64_t(b))));
}
MESHRT_HD inline float modI32(float a, float b) {
  int64_t x = int64_t(a), y = int64_t(b);
  return wrapI32(double(x - y * floorQuotient(x, y)));
}

MESHRT_HD inline float powI32(float a, float b) {
  int64_t base = int64_t(a), exponent = int64_t(b);
  if (exponent < 0) return base == 1 ? 1 : base == -1 ? (exponent % 2 ? -1 : 1) : 0;
  uint32_t result = 1, factor = uint32_t(base);
  for (; exponent > 0; exponent >>= 1) {
    if (exponent & 1) result *= factor;
    factor *= factor;
  }
  return float(int32_t(result));
}

/// Rounds a whole buffer to a narrow float dtype (bf16 / f16) after an op that computed in f32.
inline void roundBufferBF16(View data) {
  for (float& x : data)
    x = roundBF16(x);
}
inline void roundBufferF16(View data) {
  for (float& x : data)
    x = roundF16(x);
}

//===------------------------------------------------------------------------------------------===//
// Strided iteration
//===------------------------------------------------------------------------------------------===//

/// Calls fn(offsets) for every point of the box `sizes` in row-major order; offsets[k] is the
/// running sum of index * strides[k][dim] (plus base[k]).
template <size_t N, typename Fn>
inline void forEach(const Shape& sizes, const std::array<Shape, N>& strides,
                    std::array<int64_t, N> offsets, Fn&& fn) {
  int64_t total = product(sizes);
  if (total <= 0) return;
  size_t rank = sizes.size();
  if (rank == 0) {
    fn(offsets);
    return;
  }
  // The innermost dim is a plain loop; the counter handles the outer ones.
  int64_t inner = sizes[rank - 1];
  std::array<int64_t, N> step;
  for (size_t k = 0; k < N; ++k)
    step[k] = strides[k][rank - 1];
  std::vector<int64_t> counter(rank, 0);
  for (int64_t n = 0; n < total; n += inner) {
    std::array<int64_t, N> at = offsets;
    for (int64_t i = 0; i < inner; ++i) {
      fn(at);
      for (size_t k = 0; k < N; ++k)
        at[k] += step[k];
    }
    for (size_t d = rank - 1; d-- > 0;) {
      for (size_t k = 0; k < N; ++k)
        offsets[k] += strides[k][d];
      if (++counter[d] < sizes[d]) break;
      for (size_t k = 0; k < N; ++k)
        offsets[k] -= strides[k][d] * sizes[d];
      counter[d] = 0;
    }
  }
}

inline Shape rowMajorStrides(const Shape& sizes) {
  Shape strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= sizes[i];
  }
  return strides;
}

/// Every offset of the box `sizes` through `strides`, row-major.
inline std::vector<int64_t> offsetsOf(const Shape& sizes, const Shape& strides) {
  std::vector<int64_t> offsets;
  offsets.reserve(size_t(std::max<int64_t>(0, product(sizes))));
  forEach<1>(sizes, {strides}, {0},
             [&](const std::array<int64_t, 1>& at) { offsets.push_back(at[0]); });
  return offsets;
}

/// out[box point] = in[box point] through their strides (transpose, rename, broadcast copy).
inline void copyStrided(float* out, const Shape& sizes, const Shape& outStrides, const float* in,
                        const Shape& inStrides, int64_t inBase = 0) {
  forEach<2>(sizes, {outStrides, inStrides}, {0, inBase},
             [&](const std::array<int64_t, 2>& at) { out[at[0]] = in[at[1]]; });
}

} // namespace meshc::gen
