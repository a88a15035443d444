// Support code for the C++ that `meshc --emit=cpp` generates: local shard buffers, strided
// loops, einsum through OpenBLAS, reductions, the "along a dim" ops (softmax, layer_norm,
// cumsum, shift) with their in-op collectives when the dim is split, data movement, the
// layout-invariant RNG fills, and the pack/unpack around meshrt's chunked collectives.
//
// Value representation: every tensor is row-major floats over its LOCAL shape. Inputs, outputs
// and parameters own a std::vector<float>; run()'s temporaries are views (std::span) of slots of
// the class's Arena, at byte offsets the generator assigns by liveness.
// Float dtypes hold values already rounded to their dtype (bf16/f16 re-rounded after every op,
// as the reference interpreter does); i32 values are held as exact integers in float (exact up
// to 2^24, enough for ids, positions and masks).
//
// Header-only on purpose: generated code includes it next to meshrt's headers; it needs meshrt
// (Comm.h, Random.h), meshrt_kernels (f32 einsums go through meshrt::kernels::EinsumPlan) and
// cblas. einsum2 below is the local GEMM path kept for the narrow-dtype variant and as a checked
// fallback.
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

/// i32 wrap of an integral value (two's complement), as the interpreter's roundTo(i32).
MESHRT_HD inline float wrapI32(double x) {
  if (std::isnan(x)) return 0;
  x = std::trunc(x);
  if (std::fabs(x) >= 0x1p63) return x > 0 ? 2147483647.0f : -2147483648.0f;
  return float(int32_t(uint32_t(uint64_t(int64_t(x)))));
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

//===------------------------------------------------------------------------------------------===//
// Shards and the layout-invariant RNG
//===------------------------------------------------------------------------------------------===//

/// This rank's block index along a dim split over `axes` (row-major over the axes, in order).
inline int64_t blockIndex(meshrt::Communicator& world, const std::vector<std::string>& axes) {
  int64_t index = 0;
  for (const std::string& axis : axes)
    index = index * world.mesh().axisSize(axis) + world.coord(axis);
  return index;
}

/// The global start of this rank's shard of a dim split over `axes`, `localSize` per shard.
inline int64_t shardStart(meshrt::Communicator& world, const std::vector<std::string>& axes,
                          int64_t localSize) {
  return blockIndex(world, axes) * localSize;
}

/// The same for any world rank of `mesh`.
inline int64_t shardStartOf(const meshrt::Mesh& mesh, int rank,
                            const std::vector<std::string>& axes, int64_t localSize) {
  std::vector<int> coords = mesh.coords(rank);
  int64_t index = 0;
  for (const std::string& axis : axes)
    index = index * mesh.axisSize(axis) + coords[size_t(mesh.axisIndex(axis))];
  return index * localSize;
}

/// Returns `world` after checking that its mesh is the plan's (else std::invalid_argument);
/// generated constructors call it first, before creating subgroups of the planned axes.
inline meshrt::Communicator& checkedWorld(meshrt::Communicator& world, const meshrt::Mesh& planned,
                                          const char* program) {
  if (!(world.mesh() == planned))
    throw std::invalid_argument(std::string(program) + ": compiled for mesh " + planned.str() +
                                " but the communicator's mesh is " + world.mesh().str());
  return world;
}

enum class DType { F32, BF16, F16, I32 };

/// Rounds a value computed in double to its dtype once, as the interpreter does.
MESHRT_HD inline float roundValue(DType dtype, double x) {
  switch (dtype) {
  case DType::F32:
    return float(x);
  case DType::BF16:
    return float(roundToFormat(x, 7, -126, 0x1.FEp127));
  case DType::F16:
    return float(roundToFormat(x, 10, -14, 65504.0));
  case DType::I32:
    return wrapI32(x);
  }
  return float(x);
}

/// The global row-major index of the local shard's first element, given each dim's shard
/// start and the global strides.
inline int64_t globalBase(const Shape& starts, const Shape& globalStrides) {
  int64_t base = 0;
  for (size_t i = 0; i < starts.size(); ++i)
    base += starts[i] * globalStrides[i];
  return base;
}

/// The local shard of a global row-major tensor: starts[d] + local index along every dim.
inline Buffer sliceShard(const Buffer& global, const Shape& localSizes, const Shape& globalStrides,
                         const Shape& starts) {
  Buffer out(size_t(product(localSizes)));
  copyStrided(out.data(), localSizes, rowMajorStrides(localSizes), global.data(), globalStrides,
              globalBase(starts, globalStrides));
  return out;
}

/// Gathers every rank's shard into the global tensor on every rank (one all-gather over the
/// world). `startsOf(rank)` gives a world rank's shard starts; only the ranks for which
/// `holds(rank)` is true have one (the others pass zeros of the shard's size).
template <typename StartsOf, typename Holds = bool (*)(int)>
inline Buffer gatherShards(
    meshrt::Communicator& world, const Buffer& local, const Shape& localSizes,
    const Shape& globalSizes, StartsOf&& startsOf, Holds&& holds = [](int) { return true; }) {
  size_t count = local.size();
  Buffer all(count * size_t(world.size()));
  world.allGather(local.data(), all.data(), count);
  Buffer global(size_t(product(globalSizes)), 0.0f);
  Shape globalStrides = rowMajorStrides(globalSizes), localStrides = rowMajorStrides(localSizes);
  for (int rank = 0; rank < world.size(); ++rank) {
    if (!holds(rank)) continue;
    Shape starts = startsOf(rank);
    copyStrided(global.data() + globalBase(starts, globalStrides), localSizes, globalStrides,
                all.data() + size_t(rank) * count, localStrides);
  }
  return global;
}

//===------------------------------------------------------------------------------------------===//
// Params: shards with their layouts (getParam/setParam, checkpoints) and bucketed reductions
//===------------------------------------------------------------------------------------------===//

/// One param's shard on this rank, as the generated paramShards() lists them: enough to gather
/// the global value, scatter one in, or write and reshard a checkpoint.
struct ParamShard {
  std::string path;            // `ffn/w_in`, or `ffn/w_in@m` for optimizer state
  bool optimizerState = false; // a slot of optimizer state (ParamRole::OptimizerState)
  std::string dtype;           // "f32", "bf16", ... (values are held in float buffers)
  Shape globalShape, localShape;
  std::vector<std::string> dims;              // the dim names, in storage order
  std::vector<std::vector<std::string>> axes; // per dim: the mesh axes splitting it, major first
  Buffer* data = nullptr;                     // this rank's shard, row-major over localShape
  /// Pipeline stages: held only by the ranks of the stages in `stages` (one bit per coordinate
  /// along `stageAxis`; 0: every rank). Elsewhere `data` is empty.
  std::string stageAxis;
  uint64_t stages = 0;

  /// Whether world rank `rank` of `mesh` holds its shard.
  bool heldBy(const meshrt::Mesh& mesh, int rank) const {
    return stages == 0 || ((stages >> mesh.coords(rank)[size_t(mesh.axisIndex(stageAxis))]) & 1);
  }
};

/// One param as the generated paramShards() lists it: a table of constants, which compilers
/// build in no time (the same list as ParamShard initializers took seconds per hundred params).
struct ParamSpec {
  const char* path;
  bool optimizerState;
  const char* dtype;
  /// Per dim, `name:global:local:axis+axis` (no axes: nothing after the last colon), dims
  /// separated by spaces: "vocab:96:48:model d_model:64:64:".
  const char* dims;
  /// Pipeline stages: the stages holding it along `stageAxis` (ParamShard::stages; 0: every).
  uint64_t stages = 0;
  const char* stageAxis = "";
};

/// The pieces of `text` between `separator`s (none for an empty text).
inline std::vector<std::string> splitText(std::string_view text, char separator) {
  std::vector<std::string> parts;
  while (!text.empty()) {
    size_t end = std::min(text.find(separator), text.size());
    parts.emplace_back(text.substr(0, end));
    text.remove_prefix(std::min(end + 1, text.size()));
  }
  return parts;
}

/// One dim of a ParamSpec's `dims`.
struct ParamDim {
  std::string name;
  int64_t global = 0, local = 0;
  std::vector<std::string> axes;
};
inline std::vector<ParamDim> paramDims(const ParamSpec& spec) {
  std::vector<ParamDim> dims;
  for (const std::string& dim : splitText(spec.dims, ' ')) {
    size_t a = dim.find(':'), b = dim.find(':', a + 1), c = dim.find(':', b + 1);
    dims.push_back({dim.substr(0, a), std::stoll(dim.substr(a + 1, b - a - 1)),
                    std::stoll(dim.substr(b + 1, c - b - 1)),
                    splitText(std::string_view(dim).substr(c + 1), '+')});
  }
  return dims;
}

/// The shards `specs` describe over the buffers `data` (one per spec), as ParamShard or the
/// CUDA support's device ParamShard.
template <class Shard, class Storage, size_t N>
std::vector<Shard> paramShardsOf(const ParamSpec (&specs)[N], Storage* const (&data)[N]) {
  std::vector<Shard> shards(N);
  for (size_t k = 0; k < N; ++k) {
    Shard& shard = shards[k];
    shard.path = specs[k].path;
    shard.optimizerState = specs[k].optimizerState;
    shard.dtype = specs[k].dtype;
    shard.data = data[k];
    shard.stages = specs[k].stages;
    shard.stageAxis = specs[k].stageAxis;
    for (ParamDim& dim : paramDims(specs[k])) {
      shard.dims.push_back(std::move(dim.name));
      shard.globalShape.push_back(dim.global);
      shard.localShape.push_back(dim.local);
      shard.axes.push_back(std::move(dim.axes));
    }
  }
  return shards;
}

/// A param's initializer, as the generated constructor's table lists it (one row per row of the
/// class's ParamSpec table): the IR initializer's kind, the param's dtype and the initializer's
/// keyword arguments (sema gives every kind at most two; an unused slot has a null name).
struct ParamInit {
  const char* kind;
  DType dtype;
  std::pair<const char*, double> args[2];
};

/// How a generated constructor initializes one param on this rank (paramFill).
struct ParamFill {
  size_t count = 0;             // local elements
  bool constant = false;        // zeros, ones, constant: `value` everywhere
  double value = 0;             // rounded to the dtype as the interpreter does
  meshrt::kernels::Shard shard; // else: the RNG fill of this rank's shard
  meshrt::kernels::Init init;
  meshrt::kernels::ValueType type = meshrt::kernels::ValueType::F32;
};

/// The fill of param `spec` on this rank, or nullopt when this rank's pipeline stage (`stage`;
/// -1: no stages) does not hold it. Random initializers are keyed like the interpreter's, by the
/// global index at this rank's shard, so every mesh holds the same global values.
inline std::optional<ParamFill> paramFill(meshrt::Communicator& world, int stage,
                                          const ParamSpec& spec, const ParamInit& init) {
  if (stage >= 0 && spec.stages != 0 && !((spec.stages >> stage) & 1)) return std::nullopt;
  ParamFill fill;
  std::pair<std::string_view, double> a0{init.args[0].first ? init.args[0].first : "",
                                         init.args[0].second},
      a1{init.args[1].first ? init.args[1].first : "", init.args[1].second};
  fill.init = !init.args[0].first   ? meshrt::kernels::makeInit(init.kind)
              : !init.args[1].first ? meshrt::kernels::makeInit(init.kind, {a0})
                                    : meshrt::kernels::makeInit(init.kind, {a0, a1});
  fill.count = 1;
  for (const ParamDim& dim : paramDims(spec)) {
    fill.count *= size_t(dim.local);
    fill.shard.globalShape.push_back(dim.global);
    fill.shard.offset.push_back(dim.axes.empty() ? 0 : shardStart(world, dim.axes, dim.local));
    fill.shard.localShape.push_back(dim.local);
  }
  using meshrt::kernels::InitKind;
  fill.constant = fill.init.kind == InitKind::Zeros || fill.init.kind == InitKind::Ones ||
                  fill.init.kind == InitKind::Constant;
  fill.value = fill.init.kind == InitKind::Ones ? 1.0 : fill.init.value; // zeros: value 0
  fill.type = init.dtype == DType::BF16  ? meshrt::kernels::ValueType::BF16
              : init.dtype == DType::F16 ? meshrt::kernels::ValueType::F16
              : init.dtype == DType::I32 ? meshrt::kernels::ValueType::I32
                                         : meshrt::kernels::ValueType::F32;
  return fill;
}

/// The generated constructor's param initialization: every param of the class's table this
/// rank holds sized to its local shard and filled by its initializer (one loop over constant
/// tables, which compilers build in no time, instead of a block of code per param), random ones
/// through `fill` (meshrt::kernels::fillParam's signature; the CUDA support's uploads).
template <class Storage, size_t N, class Fill>
void initParamsWith(const Fill& fill, meshrt::Communicator& world, uint64_t seed, int stage,
                    const ParamSpec (&specs)[N], const ParamInit (&inits)[N],
                    Storage* const (&data)[N]) {
  for (size_t k = 0; k < N; ++k) {
    std::optional<ParamFill> param = paramFill(world, stage, specs[k], inits[k]);
    if (!param) continue;
    if (param->constant) {
      data[k]->assign(param->count, roundValue(inits[k].dtype, param->value));
    } else {
      data[k]->resize(param->count);
      fill(data[k]->data(), param->shard, seed, specs[k].path, param->init, param->type);
    }
  }
}

template <size_t N>
void initParams(meshrt::Communicator& world, uint64_t seed, int stage, const ParamSpec (&specs)[N],
                const ParamInit (&inits)[N], Buffer* const (&data)[N]) {
  initParamsWith([](auto&&... args) { meshrt::kernels::fillParam(args...); }, world, seed, stage,
                 specs, inits, data);
}

/// The global starts of `rank`'s shard of `shard`.
inline Shape shardStartsOf(const meshrt::Mesh& mesh, int rank, const ParamShard& shard) {
  Shape starts;
  for (size_t d = 0; d < shard.localShape.size(); ++d)
    starts.push_back(
        shard.axes[d].empty() ? 0 : shardStartOf(mesh, rank, shard.axes[d], shard.localShape[d]));
  return starts;
}

/// The params as meshrt checkpoint tensors (generated save() and load()), pointing into the
/// shards' buffers.
inline std::vector<meshrt::CheckpointTensor> checkpointTensors(std::vector<ParamShard>& shards) {
  std::vector<meshrt::CheckpointTensor> tensors;
  for (ParamShard& shard : shards) {
    meshrt::CheckpointTensor tensor;
    tensor.name = shard.path;
    tensor.dtype = shard.dtype;
    tensor.storage = meshrt::DType::F32;
    tensor.data = shard.data->data();
    tensor.count = shard.data->size();
    for (size_t d = 0; d < shard.dims.size(); ++d)
      tensor.dims.push_back({shard.dims[d], shard.globalShape[d], shard.axes[d]});
    tensor.heldAxis = shard.stageAxis;
    tensor.heldMask = shard.stages;
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

/// The generated save(): every param shard as a new checkpoint under `dir` (collective).
inline void saveParams(meshrt::Communicator& world, const std::string& dir,
                       std::vector<ParamShard>& shards, const meshrt::CheckpointInfo& info) {
  meshrt::saveCheckpoint(world, dir, checkpointTensors(shards), info);
}

/// The generated load(): the latest checkpoint under `dir` into the param shards (collective).
inline meshrt::CheckpointInfo loadParams(meshrt::Communicator& world, const std::string& dir,
                                         std::vector<ParamShard>& shards) {
  return meshrt::loadCheckpoint(world, dir, checkpointTensors(shards));
}

inline ParamShard& findParamShard(std::vector<ParamShard>& shards, const std::string& path,
                                  const char* program) {
  for (ParamShard& shard : shards)
    if (shard.path == path) return shard;
  throw std::invalid_argument(std::string(program) + ": no param named '" + path + "'");
}

/// The global value of a param from every rank's shard (collective over `world`). A param of
/// some stages only: the other ranks contribute zeros, which no holder's shard overlaps.
inline Tensor gatherParam(meshrt::Communicator& world, const ParamShard& shard) {
  const meshrt::Mesh& mesh = world.mesh();
  bool held = shard.heldBy(mesh, world.rank());
  Buffer zeros = held ? Buffer() : Buffer(size_t(product(shard.localShape)), 0.0f);
  return Tensor{shard.globalShape,
                gatherShards(
                    world, held ? *shard.data : zeros, shard.localShape, shard.globalShape,
                    [&](int rank) { return shardStartsOf(mesh, rank, shard); },
                    [&](int rank) { return shard.heldBy(mesh, rank); })};
}

/// Sets this rank's shard of a param from its global value (no communication; nothing on a rank
/// of a stage that does not hold it).
inline void scatterParam(meshrt::Communicator& world, ParamShard& shard, const Tensor& global) {
  checkShape("global param", shard.path, global, shard.globalShape);
  if (!shard.heldBy(world.mesh(), world.rank())) return;
  *shard.data = sliceShard(global.data, shard.localShape, rowMajorStrides(shard.globalShape),
                           shardStartsOf(world.mesh(), world.rank(), shard));
}

/// A train step's update: the param's storage takes the step's new value.
inline void copyValues(View to, ConstView from) {
  std::copy(from.begin(), from.end(), to.begin());
}

/// Zeroes a subroutine's argument before a kernel that writes only part of it.
inline void zero(View to) {
  std::fill(to.begin(), to.end(), 0.0f);
}

/// Resolves the partial sums of several values over one group with one all-reduce: packed into
/// one buffer, reduced, unpacked (the planner's bucketed_all_reduce_sum).
inline void allReduceBucket(meshrt::Communicator& group, std::span<const View> values) {
  size_t total = 0;
  for (View value : values)
    total += value.size();
  Buffer packed(total);
  size_t at = 0;
  for (View value : values) {
    std::copy(value.begin(), value.end(), packed.begin() + std::ptrdiff_t(at));
    at += value.size();
  }
  group.allReduce(packed.data(), packed.size(), meshrt::ReduceOp::Sum);
  at = 0;
  for (View value : values) {
    std::copy(packed.begin() + std::ptrdiff_t(at),
              packed.begin() + std::ptrdiff_t(at + value.size()), value.begin());
    at += value.size();
  }
}
inline void allReduceBucket(meshrt::Communicator& group, std::initializer_list<View> values) {
  allReduceBucket(group, std::span<const View>(values.begin(), values.size()));
}

/// An all-reduce that schedule-collectives split into this start and a wait placed just before
/// the first statement that touches its values: meshrt's non-blocking collective (a bucket is
/// one collective), which progresses while the statements between run. `ViewT`: the target's
/// span (host here, device in meshc/CudaSupport.h).
template <typename ViewT>
inline meshrt::Request startAllReduceOf(meshrt::Communicator& group,
                                        std::initializer_list<ViewT> values, meshrt::ReduceOp op) {
  std::array<meshrt::Segment<float>, 16> small;
  std::vector<meshrt::Segment<float>> large;
  meshrt::Segment<float>* segments = small.data();
  if (values.size() > small.size()) {
    large.resize(values.size());
    segments = large.data();
  }
  size_t k = 0;
  for (ViewT value : values)
    segments[k++] = meshrt::Segment<float>{value.data(), value.size()};
  return group.startAllReduce<float>(segments, values.size(), op);
}

inline meshrt::Request startAllReduce(meshrt::Communicator& group,
                                      std::initializer_list<View> values, meshrt::ReduceOp op) {
  return startAllReduceOf<View>(group, values, op);
}

//===------------------------------------------------------------------------------------------===//
// Einsum
//===------------------------------------------------------------------------------------------===//

/// A two-operand einsum as batched GEMM: out[b, m, n] = sum_k a[b, m, k] * b[b, k, n], where
/// each of b/m/n/k is a group of dims given by sizes and per-tensor strides. Operands whose
/// (m, k) / (k, n) groups are already contiguous in either order go to sgemm directly
/// (transposes folded into the call); others are packed first.
struct GemmDims {
  Shape batch, m, n, k;       // sizes of each group
  Shape aBatch, aM, aK;       // strides of a
  Shape bBatch, bK, bN;       // strides of b
  Shape outBatch, outM, outN; // strides of out
};

namespace detail {
/// Whether the group `sizes` through `strides` is one contiguous run with unit inner stride,
/// i.e. linear index * unit.
inline bool flatStride(const Shape& sizes, const Shape& strides, int64_t& unit) {
  unit = 0;
  int64_t expect = -1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 1) continue;
    if (expect < 0) {
      unit = strides[i];
      expect = strides[i] * sizes[i];
    } else {
      if (strides[i] != expect) return false;
      expect *= sizes[i];
    }
  }
  if (expect < 0) unit = 1; // empty or all size-1
  return true;
}

inline Shape concat(const Shape& a, const Shape& b) {
  Shape out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}
} // namespace detail

/// An f32 einsum of the generated code, planned on its first run (after the runner has set the
/// thread counts its GEMM's library primitive is created for) and shared by the ranks and by
/// every call site of the source file that computes it: one namespace-scope constant per
/// distinct einsum (a function-local static EinsumPlan per call site cost a guard and an
/// initializer each to compile).
class SharedEinsum {
public:
  explicit SharedEinsum(meshrt::kernels::EinsumSpec spec) : spec_(std::move(spec)) {}
  const meshrt::kernels::EinsumPlan& plan() const {
    std::call_once(once_, [this] { plan_.emplace(spec_); });
    return *plan_;
  }

private:
  meshrt::kernels::EinsumSpec spec_;
  mutable std::once_flag once_;
  mutable std::optional<meshrt::kernels::EinsumPlan> plan_;
};

/// A causal attention GEMM of the generated code (Gemm::Causal, causal-attention-blocks): the
/// f32 einsum `spec` (dense operands) over the lower triangle of `block` x `block` tiles of the
/// query dim `row` and the key dim `col`, as one EinsumPlan per block over the operands' own
/// strides (built on first use, shared as SharedEinsum's).
/// Blocks::Keys: key block j is taken against the query positions from j * block on (fewer,
/// taller GEMMs than row blocks: oneDNN's kernels are faster on tall blocks; bench/README.md).
///   With `weights` < 0 (the scores: row and col out dims) the entries above the blocks'
///   diagonal are written as `fill` (the masked softmax that alone reads them puts its fill there
///   anyway), or left as they are when `fillAbove` is false (the softmax is a
///   causalMaskedSoftmax, which never reads them). With `weights` >= 0 (a key gradient:
///   probs^T . d_context or d_scores^T . q, the query positions contracted with that operand,
///   zero above the diagonal) the query positions before the block are left out.
/// Blocks::Queries (probs . v: `col` contracted with operand `weights`, zero above the
/// diagonal): query block i is taken against the key positions below (i + 1) * block.
/// Where the weights' zeros are a softmax's (zero unless a whole row was masked), `check` reads
/// them at run time: Check::Every every entry above the blocks' diagonal, Check::Tails one per
/// row (the weights are a causalMaskedSoftmax's: past each row's prefix, which ends within its
/// block, its entries are all equal); a query block with a nonzero one is taken against every
/// key position (Queries), and any makes the whole einsum run (Keys), so the result is the
/// whole einsum's, up to the order of the sums. Check::None: the zeros are exact (a
/// where(causal mask, x, 0)). A factor's inf or NaN at a position the triangle leaves out does
/// not reach the result (0 * inf would).
class CausalEinsum {
public:
  enum class Blocks { Keys, Queries };
  enum class Check { None, Every, Tails };

  CausalEinsum(meshrt::kernels::EinsumSpec spec, int row, int col, int64_t block, Blocks blocks,
               int weights, Check check, float fill = 0.0f, bool fillAbove = true)
      : spec_(std::move(spec)), row_(row), col_(col), block_(block), blocks_(blocks),
        weights_(weights), check_(check), fill_(fill), fillAbove_(fillAbove) {}

  void run(const float* a, const float* b, float* out, float alpha) const {
    std::call_once(once_, [this] { plan(); });
    size_t count = parts_.size();
    // The query blocks with a nonzero weight above the diagonal (a wholly masked row).
    thread_local std::vector<char> whole;
    whole.assign(count, 0);
    if (weights_ >= 0 && check_ != Check::None)
      forSegments(size_t(weights_), weights_ ? b : a,
                  [&](const float* x, int64_t n, int64_t stride, int64_t i) {
                    if (whole[size_t(i)]) return;
                    if (check_ == Check::Tails)
                      n = 1; // the rest of the row's tail equals its first
                    // Any nonzero bit pattern (-0 too: then every key, as exact), one OR
                    // per element (a contiguous run vectorizes).
                    uint32_t bits = 0;
                    auto word = [](const float* at) {
                      uint32_t u;
                      std::memcpy(&u, at, sizeof u);
                      return u;
                    };
                    if (stride == 1)
                      for (int64_t c = 0; c < n; ++c)
                        bits |= word(x + c);
                    else
                      for (int64_t c = 0; c < n; ++c)
                        bits |= word(x + c * stride);
                    if (bits) whole[size_t(i)] = 1;
                  });
    if (blocks_ == Blocks::Keys && std::find(whole.begin(), whole.end(), 1) != whole.end()) {
      all_->run(a, b, out, alpha, 0.0f); // a key block meets every query row before it
      return;
    }
    for (size_t i = 0; i < count; ++i) {
      // Key blocks write disjoint columns (or key positions); query blocks disjoint query rows.
      const Part& part = parts_[i];
      const auto& plan = whole[i] ? *part.whole : part.lower;
      plan.run(a + part.offsets[0], b + part.offsets[1], out + part.offsets[2], alpha, 0.0f);
    }
    if (blocks_ == Blocks::Keys && weights_ < 0 && fillAbove_)
      forSegments(2, out, [&](const float* x, int64_t n, int64_t stride, int64_t) {
        float* y = const_cast<float*>(x);
        if (stride == 1) {
          std::fill_n(y, n, fill_);
          return;
        }
        for (int64_t c = 0; c < n; ++c)
          y[c * stride] = fill_;
      });
  }

private:
  /// One block's GEMM (key blocks: a key block's column of the triangle; query blocks: a query
  /// block's row of it, and `whole`, the same rows against every key position).
  struct Part {
    meshrt::kernels::EinsumPlan lower;
    std::optional<meshrt::kernels::EinsumPlan> whole;
    int64_t offsets[3] = {0, 0, 0};
  };

  /// Dense strides of operand k (2: the output) over the full sizes.
  Shape denseStrides(size_t k) const {
    const std::vector<int>& dims = k < 2 ? spec_.operands[k].dims : spec_.out.dims;
    Shape strides(dims.size(), 1);
    for (size_t d = dims.size(); d-- > 1;)
      strides[d - 1] = strides[d] * spec_.sizes[size_t(dims[d])];
    return strides;
  }
  int64_t strideOf(size_t k, int dim) const {
    const std::vector<int>& dims = k < 2 ? spec_.operands[k].dims : spec_.out.dims;
    Shape strides = denseStrides(k);
    for (size_t d = 0; d < dims.size(); ++d)
      if (dims[d] == dim) return strides[d];
    return 0;
  }

  /// Calls visit(start, count, col stride, query block) for the part above the blocks'
  /// diagonal of every line along `col` of operand k (2: the output) at `base`: the key
  /// positions from the end of the line's query block on.
  template <class Visit> void forSegments(size_t k, const float* base, Visit visit) const {
    const std::vector<int>& dims = k < 2 ? spec_.operands[k].dims : spec_.out.dims;
    Shape strides = denseStrides(k), extents, walk;
    int64_t colStride = 0;
    size_t rowAt = 0;
    for (size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] == col_) {
        colStride = strides[d];
        continue;
      }
      if (dims[d] == row_) rowAt = extents.size();
      extents.push_back(spec_.sizes[size_t(dims[d])]);
      walk.push_back(strides[d]);
    }
    // An odometer over the other dims (no division per line).
    Shape index(extents.size(), 0);
    int64_t lines = product(extents), offset = 0;
    for (int64_t line = 0; line < lines; ++line) {
      int64_t block = index[rowAt] / block_, from = (block + 1) * block_;
      if (from < size_) visit(base + offset + from * colStride, size_ - from, colStride, block);
      for (size_t d = extents.size(); d-- > 0;) {
        offset += walk[d];
        if (++index[d] < extents[d]) break;
        offset -= walk[d] * extents[d];
        index[d] = 0;
      }
    }
  }

  void plan() const {
    size_ = spec_.sizes[size_t(row_)];
    auto blockSpec = [&](int64_t rows, int64_t cols) {
      meshrt::kernels::EinsumSpec spec = spec_;
      spec.sizes[size_t(row_)] = rows;
      spec.sizes[size_t(col_)] = cols;
      for (size_t k = 0; k < 2; ++k)
        spec.operands[k].strides = denseStrides(k);
      spec.out.strides = denseStrides(2);
      return spec;
    };
    for (int64_t i = 0; i * block_ < size_; ++i) {
      int64_t start = i * block_;
      if (blocks_ == Blocks::Keys) { // key block i against the query rows from its start on
        Part part{meshrt::kernels::EinsumPlan(blockSpec(size_ - start, block_)), std::nullopt, {}};
        for (size_t k = 0; k < 3; ++k)
          part.offsets[k] = start * (strideOf(k, row_) + strideOf(k, col_));
        parts_.push_back(std::move(part));
        continue;
      }
      // query block i against the keys below its end (or all of them)
      Part part{meshrt::kernels::EinsumPlan(blockSpec(block_, start + block_)), std::nullopt, {}};
      if (check_ != Check::None) part.whole.emplace(blockSpec(block_, size_));
      for (size_t k = 0; k < 3; ++k)
        part.offsets[k] = start * strideOf(k, row_);
      parts_.push_back(std::move(part));
    }
    if (blocks_ == Blocks::Keys && weights_ >= 0 && check_ != Check::None)
      all_.emplace(blockSpec(size_, size_));
  }

  meshrt::kernels::EinsumSpec spec_;
  int row_, col_;
  int64_t block_;
  Blocks blocks_;
  int weights_;
  Check check_;
  float fill_;
  bool fillAbove_;
  mutable std::once_flag once_;
  mutable std::vector<Part> parts_;
  mutable std::optional<meshrt::kernels::EinsumPlan> all_; // Keys with a check: the whole einsum
  mutable int64_t size_ = 0;
};

inline void einsum2(float* out, const float* a, const float* b, const GemmDims& d) {
  int64_t M = product(d.m), N = product(d.n), K = product(d.k), B = product(d.batch);
  if (M == 0 || N == 0 || B == 0) return;
  // A as row-major [M, K] (lda) or its transpose.
  int64_t mUnit, kUnitA, kUnitB, nUnit, outMUnit, outNUnit;
  Buffer aPacked, bPacked, outPacked;
  bool aDirect =
      detail::flatStride(d.m, d.aM, mUnit) && detail::flatStride(d.k, d.aK, kUnitA) &&
      ((kUnitA == 1 && (M == 1 || mUnit >= K)) || (mUnit == 1 && (K == 1 || kUnitA >= M)));
  bool bDirect =
      detail::flatStride(d.k, d.bK, kUnitB) && detail::flatStride(d.n, d.bN, nUnit) &&
      ((nUnit == 1 && (K == 1 || kUnitB >= N)) || (kUnitB == 1 && (N == 1 || nUnit >= K)));
  bool outDirect = detail::flatStride(d.m, d.outM, outMUnit) &&
                   detail::flatStride(d.n, d.outN, outNUnit) && outNUnit == 1 &&
                   (M == 1 || outMUnit >= N);
  if (!aDirect) aPacked.resize(size_t(M * K));
  if (!bDirect) bPacked.resize(size_t(K * N));
  if (!outDirect) outPacked.resize(size_t(M * N));
  std::vector<int64_t> aBatch = offsetsOf(d.batch, d.aBatch), bBatch = offsetsOf(d.batch, d.bBatch),
                       outBatch = offsetsOf(d.batch, d.outBatch);
  Shape mk = detail::concat(d.m, d.k), kn = detail::concat(d.k, d.n), mn = detail::concat(d.m, d.n);
  Shape mkStrides = rowMajorStrides(mk), knStrides = rowMajorStrides(kn),
        mnStrides = rowMajorStrides(mn);
  Shape aStrides = detail::concat(d.aM, d.aK), bStrides = detail::concat(d.bK, d.bN),
        outStrides = detail::concat(d.outM, d.outN);
  for (int64_t batch = 0; batch < B; ++batch) {
    const float* aPtr = a + aBatch[size_t(batch)];
    const float* bPtr = b + bBatch[size_t(batch)];
    float* outPtr = out + outBatch[size_t(batch)];
    CBLAS_TRANSPOSE transA = CblasNoTrans, transB = CblasNoTrans;
    int64_t lda = K, ldb = N, ldc = N;
    if (aDirect) {
      if (kUnitA == 1 && (M == 1 || mUnit >= K)) {
        lda = M == 1 ? std::max<int64_t>(K, 1) : mUnit;
      } else {
        transA = CblasTrans;
        lda = K == 1 ? std::max<int64_t>(M, 1) : kUnitA;
      }
    } else {
      copyStrided(aPacked.data(), mk, mkStrides, aPtr, aStrides);
      aPtr = aPacked.data();
    }
    if (bDirect) {
      if (nUnit == 1 && (K == 1 || kUnitB >= N)) {
        ldb = K == 1 ? std::max<int64_t>(N, 1) : kUnitB;
      } else {
        transB = CblasTrans;
        ldb = N == 1 ? std::max<int64_t>(K, 1) : nUnit;
      }
    } else {
      copyStrided(bPacked.data(), kn, knStrides, bPtr, bStrides);
      bPtr = bPacked.data();
    }
    float* cPtr = outDirect ? outPtr : outPacked.data();
    if (outDirect) ldc = M == 1 ? std::max<int64_t>(N, 1) : outMUnit;
    if (K == 0) {
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
          cPtr[i * ldc + j] = 0;
    } else {
      cblas_sgemm(CblasRowMajor, transA, transB, int(M), int(N), int(K), 1.0f, aPtr, int(lda), bPtr,
                  int(ldb), 0.0f, cPtr, int(ldc));
    }
    if (!outDirect) copyStrided(outPtr, mn, outStrides, outPacked.data(), mnStrides);
  }
}

/// The same contraction accumulated in double (cblas_dgemm on double copies), for narrow result
/// dtypes (bf16, f16): the sum is then rounded once to the dtype, as the interpreter does, so
/// the rounding agrees instead of flipping an ulp where float accumulation lands near a tie.
inline void einsum2Double(float* out, const float* a, const float* b, const GemmDims& d) {
  int64_t M = product(d.m), N = product(d.n), K = product(d.k), B = product(d.batch);
  if (M == 0 || N == 0 || B == 0) return;
  // Each group walked with one stride where it can be (the usual dense layouts): a plain
  // strided copy per matrix. The tables of offsetsOf and the vectors allocated per call cost 4x
  // the dgemm (ViT's bf16 feed-forward, 68 x 64 x 128: 107 us against 21).
  int64_t mA, kA, kB, nB, mOut, nOut;
  bool flat = detail::flatStride(d.m, d.aM, mA) && detail::flatStride(d.k, d.aK, kA) &&
              detail::flatStride(d.k, d.bK, kB) && detail::flatStride(d.n, d.bN, nB) &&
              detail::flatStride(d.m, d.outM, mOut) && detail::flatStride(d.n, d.outN, nOut);
  std::vector<int64_t> aOffsets, bOffsets, outOffsets;
  if (!flat) {
    aOffsets = offsetsOf(detail::concat(d.m, d.k), detail::concat(d.aM, d.aK));
    bOffsets = offsetsOf(detail::concat(d.k, d.n), detail::concat(d.bK, d.bN));
    outOffsets = offsetsOf(detail::concat(d.m, d.n), detail::concat(d.outM, d.outN));
  }
  std::vector<int64_t> aBatch = offsetsOf(d.batch, d.aBatch), bBatch = offsetsOf(d.batch, d.bBatch),
                       outBatch = offsetsOf(d.batch, d.outBatch);
  thread_local std::vector<double> aPacked, bPacked, cPacked;
  aPacked.resize(size_t(M * K));
  bPacked.resize(size_t(K * N));
  cPacked.assign(size_t(M * N), 0.0);
  for (int64_t batch = 0; batch < B; ++batch) {
    const float* aBase = a + aBatch[size_t(batch)];
    const float* bBase = b + bBatch[size_t(batch)];
    float* outBase = out + outBatch[size_t(batch)];
    if (flat) {
      for (int64_t i = 0; i < M; ++i)
        for (int64_t k = 0; k < K; ++k)
          aPacked[size_t(i * K + k)] = aBase[i * mA + k * kA];
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j)
          bPacked[size_t(k * N + j)] = bBase[k * kB + j * nB];
    } else {
      for (size_t i = 0; i < aOffsets.size(); ++i)
        aPacked[i] = aBase[aOffsets[i]];
      for (size_t i = 0; i < bOffsets.size(); ++i)
        bPacked[i] = bBase[bOffsets[i]];
    }
    if (K > 0)
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(M), int(N), int(K), 1.0,
                  aPacked.data(), int(K), bPacked.data(), int(N), 0.0, cPacked.data(), int(N));
    if (flat) {
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
          outBase[i * mOut + j * nOut] = float(cPacked[size_t(i * N + j)]);
    } else {
      for (size_t i = 0; i < outOffsets.size(); ++i)
        outBase[outOffsets[i]] = float(cPacked[i]);
    }
  }
}

/// Any einsum: iterates the result's dims plus the contracted dims (sizes `space`), each
/// operand through its strides over that space; accumulates in double. `outDims` leading dims
/// of the space are the result's.
inline void einsumGeneric(float* out, const Shape& outSizes, const Shape& contracted,
                          const std::vector<const float*>& operands,
                          const std::vector<Shape>& outerStrides,
                          const std::vector<Shape>& innerStrides) {
  int64_t outCount = product(outSizes);
  std::vector<std::vector<int64_t>> inner(operands.size());
  for (size_t k = 0; k < operands.size(); ++k)
    inner[k] = offsetsOf(contracted, innerStrides[k]);
  int64_t innerCount = product(contracted);
  std::vector<Shape> strides(operands.size() + 1);
  strides[0] = rowMajorStrides(outSizes);
  for (size_t k = 0; k < operands.size(); ++k)
    strides[k + 1] = outerStrides[k];
  std::vector<int64_t> base(operands.size() + 1, 0), counter(outSizes.size(), 0);
  for (int64_t n = 0; n < outCount; ++n) {
    double sum = 0;
    for (int64_t i = 0; i < innerCount; ++i) {
      double term = 1;
      for (size_t k = 0; k < operands.size(); ++k)
        term *= double(operands[k][base[k + 1] + inner[k][size_t(i)]]);
      sum += term;
    }
    out[base[0]] = float(sum);
    for (size_t d = outSizes.size(); d-- > 0;) {
      for (size_t k = 0; k <= operands.size(); ++k)
        base[k] += strides[k][d];
      if (++counter[d] < outSizes[d]) break;
      for (size_t k = 0; k <= operands.size(); ++k)
        base[k] -= strides[k][d] * outSizes[d];
      counter[d] = 0;
    }
  }
}

//===------------------------------------------------------------------------------------------===//
// Reductions
//===------------------------------------------------------------------------------------------===//

enum class Reduce { Sum, Max, Min, LogSumExp };

/// out[o] = reduce over the lane (sizes `lane`, strides `laneStrides` in `in`) at the operand
/// offset `inOuter` of o; Sum is multiplied by `scale` (mean: 1 / global count).
namespace detail {

/// Whether `strides` walk `sizes` as one dense row-major run (dims of size 1 aside) whose
/// elements are `unit` apart.
inline bool denseRun(const Shape& sizes, const Shape& strides, int64_t unit) {
  int64_t expected = unit;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

/// The sum of term(x[i]) over a run of `count` floats, in double: eight independent
/// accumulators, so that the compiler vectorizes the loop without reassociating one sum.
template <class Term> inline double sumRun(const float* x, int64_t count, Term term) {
  double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= count; i += 8)
    for (int j = 0; j < 8; ++j)
      partial[j] += term(x[i + j]);
  for (; i < count; ++i)
    partial[i % 8] += term(x[i]);
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7]));
}

inline double sumRun(const float* x, int64_t count) {
  return sumRun(x, count, [](float v) { return double(v); });
}

/// The sum of e^(x - max) over a run: f32 exponentials summed in double.
inline double sumExpRun(const float* x, int64_t count, float max) {
  return sumRun(x, count, [max](float v) { return double(meshrt::kernels::f32::exp(v - max)); });
}

/// The sum of term(x[i]) over a run at f32 speed: sixteen f32 lanes (one vector) summed over
/// blocks of 256 elements, each block's lanes then added in double. A lane adds at most 16 terms
/// before its sum goes to double, so the error is at most ~16 u of the terms' magnitudes (u =
/// 2^-24), inside the f32 rtol of docs/architecture.md (1024 u) however long the run.
template <class Term> inline double sumLanes(const float* x, int64_t count, Term term) {
  constexpr int64_t kBlock = 256;
  double total = 0;
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    int64_t end = std::min(count, begin + kBlock), i = begin;
    float partial[16] = {};
    for (; i + 16 <= end; i += 16)
      for (int j = 0; j < 16; ++j)
        partial[j] += term(x[i + j]);
    for (; i < end; ++i)
      partial[0] += term(x[i]);
    double block = 0;
    for (int j = 0; j < 16; ++j)
      block += double(partial[j]);
    total += block;
  }
  return total;
}

/// The largest of a run, sixteen lanes at a time; NaNs are passed over, as std::max(max, x)
/// passes them.
inline float maxRun(const float* x, int64_t count) {
  float partial[16];
  std::fill(partial, partial + 16, -INFINITY);
  int64_t i = 0;
#if defined(__AVX512F__) && !defined(__CUDACC__)
  // One 16-lane vector (GCC's vector extension; lane j takes the elements i + j as below, so
  // the result is the same): GCC does not vectorize the loop below (a conditional on floats is
  // no MAX_EXPR without -ffinite-math-only), which ran scalar at 0.27 ns per element, a fifth
  // of a 128-key softmax row's time. Only with AVX-512: for SSE2 or AVX2 GCC lowers a 64-byte
  // vector's conditional to ~7x slower code than the scalar loop.
  using Float16 = float __attribute__((vector_size(64)));
  Float16 lanes;
  std::memcpy(&lanes, partial, sizeof lanes);
  for (; i + 16 <= count; i += 16) {
    Float16 v;
    std::memcpy(&v, x + i, sizeof v);
    lanes = v > lanes ? v : lanes;
  }
  std::memcpy(partial, &lanes, sizeof partial);
#endif
  for (; i + 16 <= count; i += 16)
    for (int j = 0; j < 16; ++j)
      partial[j] = x[i + j] > partial[j] ? x[i + j] : partial[j];
  for (; i < count; ++i)
    partial[0] = x[i] > partial[0] ? x[i] : partial[0];
  float max = partial[0];
  for (int j = 1; j < 16; ++j)
    max = partial[j] > max ? partial[j] : max;
  return max;
}

/// The largest element of runs of `count` elements at `starts` from `x`, or a NaN if any is
/// one (the reduction's max propagates NaNs, which maxRun passes over).
inline float maxOfRuns(const float* x, const std::vector<int64_t>& starts, int64_t count) {
  float max = -INFINITY;
  bool nan = false;
  for (int64_t start : starts) {
    const float* run = x + start;
    float runMax = maxRun(run, count);
    max = runMax > max ? runMax : max;
    for (int64_t i = 0; i < count; ++i)
      nan |= run[i] != run[i];
  }
  return nan ? NAN : max;
}

/// Points from which a reduction or a row op is split over OpenMP's threads.
constexpr int64_t kParallelPoints = 1 << 15;

/// Whether the lanes of a cumsum (`outer` sizes at `outerStrides`, one lane dim of `length` at
/// `laneStride`) tile one dense row-major box: then the dims above the lane form `above` blocks
/// and those below it one dense run of `inner` (= laneStride) elements.
inline bool cumsumBox(const Shape& outer, const Shape& outerStrides, int64_t length,
                      int64_t laneStride, int64_t& above, int64_t& inner) {
  std::vector<std::pair<int64_t, int64_t>> dims; // (stride, size), sizes > 1
  for (size_t d = 0; d < outer.size(); ++d)
    if (outer[d] != 1) dims.emplace_back(outerStrides[d], outer[d]);
  if (length != 1) dims.emplace_back(laneStride, length);
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (auto [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  inner = length == 1 ? expected : laneStride;
  above = expected / (inner * length);
  return true;
}
} // namespace detail

inline void reduce(float* out, const Shape& outSizes, const float* in, const Shape& inOuter,
                   const Shape& lane, const Shape& laneStrides, Reduce kind, double scale) {
  // The common sums without index tables: a mean over the last dims (each output a dense run of
  // the operand), and a bias gradient (the lane is the outer dims, the outputs one dense row).
  int64_t laneCount = product(lane), outCount = product(outSizes);
  // Outputs are independent: large sums are split over OpenMP's threads (one unless the
  // caller asks for more), each output summed in the same order either way.
  [[maybe_unused]] bool parallel = outCount > 1 && laneCount * outCount >= detail::kParallelPoints;
  if (kind == Reduce::Sum && detail::denseRun(lane, laneStrides, 1) &&
      detail::denseRun(outSizes, inOuter, laneCount)) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
    for (int64_t o = 0; o < outCount; ++o)
      out[o] = float(detail::sumRun(in + o * laneCount, laneCount) * scale);
    return;
  }
  if (kind == Reduce::Sum && detail::denseRun(outSizes, inOuter, 1) &&
      detail::denseRun(lane, laneStrides, outCount)) {
    // A block of columns per thread (one pass over the rows each), its sums on the stack.
    constexpr int64_t kMaxBlock = 2048;
    int64_t threads = 1;
#ifdef _OPENMP
    if (parallel) threads = omp_get_max_threads();
#endif
    int64_t block = std::min(kMaxBlock, (outCount + threads - 1) / threads);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
    for (int64_t first = 0; first < outCount; first += block) {
      int64_t count = std::min(block, outCount - first);
      double sums[kMaxBlock];
      std::fill(sums, sums + count, 0.0);
      for (int64_t row = 0; row < laneCount; ++row) {
        const float* x = in + row * outCount + first;
        for (int64_t o = 0; o < count; ++o)
          sums[o] += double(x[o]);
      }
      for (int64_t o = 0; o < count; ++o)
        out[first + o] = float(sums[o] * scale);
    }
    return;
  }
  // A sum over one middle dim of a dense box whose outputs keep the box's order (a cumsum's
  // gradient, performer.mesh:87: out[a, i] = sum_j in[a, j, i]): a lane position at a time over
  // the contiguous run of outputs below it, each output summed in the same order as below.
  int64_t above = 0, inner = 0;
  if (kind == Reduce::Sum && lane.size() == 1 && std::is_sorted(inOuter.rbegin(), inOuter.rend()) &&
      detail::cumsumBox(outSizes, inOuter, lane[0], laneStrides[0], above, inner)) {
    thread_local std::vector<double> sums;
    for (int64_t a = 0; a < above; ++a) {
      sums.assign(size_t(inner), 0.0);
      for (int64_t j = 0; j < lane[0]; ++j) {
        const float* x = in + (a * lane[0] + j) * inner;
        for (int64_t i = 0; i < inner; ++i)
          sums[size_t(i)] += double(x[i]);
      }
      for (int64_t i = 0; i < inner; ++i)
        out[a * inner + i] = float(sums[size_t(i)] * scale);
    }
    return;
  }
  std::vector<int64_t> offsets = offsetsOf(lane, laneStrides);
  if (kind == Reduce::Sum) {
    // Sums in double, in memory order: when the lane is the inner run, each output sums its own
    // contiguous run (four accumulators); otherwise (a bias gradient: the lane is the outer
    // dims) every lane point adds its row of outputs, walking the operand once.
    std::vector<int64_t> bases = offsetsOf(outSizes, inOuter);
    bool innerLane =
        !laneStrides.empty() && laneStrides.back() == 1 && (inOuter.empty() || inOuter.back() != 1);
    if (innerLane) {
      for (size_t o = 0; o < bases.size(); ++o) {
        const float* x = in + bases[o];
        double partial[4] = {0, 0, 0, 0};
        size_t i = 0;
        for (; i + 4 <= offsets.size(); i += 4)
          for (size_t j = 0; j < 4; ++j)
            partial[j] += x[offsets[i + j]];
        for (; i < offsets.size(); ++i)
          partial[0] += x[offsets[i]];
        out[o] = float((partial[0] + partial[1] + partial[2] + partial[3]) * scale);
      }
      return;
    }
    std::vector<double> sums(bases.size(), 0.0);
    for (int64_t offset : offsets) {
      const float* x = in + offset;
      for (size_t o = 0; o < bases.size(); ++o)
        sums[o] += x[bases[o]];
    }
    for (size_t o = 0; o < bases.size(); ++o)
      out[o] = float(sums[o] * scale);
    return;
  }
  if (kind == Reduce::Max && !lane.empty() && laneStrides.back() == 1) {
    // A max over lanes whose last dim is one contiguous run: maxRun's lanes per run (one
    // compare after another through the offsets table took 0.5-0.7 ns an element, performer's
    // max over features and over (seq, features)).
    std::vector<int64_t> runs = offsetsOf(Shape(lane.begin(), lane.end() - 1),
                                          Shape(laneStrides.begin(), laneStrides.end() - 1));
    forEach<2>(outSizes, {rowMajorStrides(outSizes), inOuter}, {0, 0},
               [&](const std::array<int64_t, 2>& at) {
                 out[at[0]] = detail::maxOfRuns(in + at[1], runs, lane.back());
               });
    return;
  }
  forEach<2>(outSizes, {rowMajorStrides(outSizes), inOuter}, {0, 0},
             [&](const std::array<int64_t, 2>& at) {
               const float* x = in + at[1];
               bool isMin = kind == Reduce::Min;
               double result = isMin ? INFINITY : -INFINITY;
               for (int64_t offset : offsets) {
                 double v = x[offset];
                 if (std::isnan(v) || (isMin ? v < result : v > result)) result = v;
                 if (std::isnan(v)) break;
               }
               if (kind == Reduce::LogSumExp && std::isfinite(result)) {
                 double sum = 0;
                 for (int64_t offset : offsets)
                   sum += meshrt::kernels::f32::exp(float(double(x[offset]) - result));
                 result += std::log(sum);
               }
               out[at[0]] = float(result);
             });
}

/// logsumexp over dims split over `group`: combines the ranks' local logsumexps in place.
inline void combineLogSumExp(View local, meshrt::Communicator& group) {
  Buffer maxima(local.begin(), local.end());
  group.allReduce(maxima.data(), maxima.size(), meshrt::ReduceOp::Max);
  std::vector<double> sums(local.size());
  for (size_t i = 0; i < local.size(); ++i) {
    double shift = std::isfinite(maxima[i]) ? maxima[i] : 0.0;
    sums[i] = std::exp(double(local[i]) - shift);
  }
  group.allReduce(sums.data(), sums.size());
  for (size_t i = 0; i < local.size(); ++i) {
    double shift = std::isfinite(maxima[i]) ? maxima[i] : 0.0;
    local[i] = std::isfinite(maxima[i]) ? float(shift + std::log(sums[i])) : maxima[i];
  }
}

//===------------------------------------------------------------------------------------------===//
// Ops along dims (softmax, log_softmax, layer_norm, cumsum, shift); `group` non-null when the
// lane is split (its ranks hold the other blocks of every lane, in block order)
//===------------------------------------------------------------------------------------------===//

enum class Along { Softmax, LogSoftmax, LayerNorm, Cumsum, CumsumExclusive };

/// The element offset of row r of a set of lanes: r * stride for rows one dense run apart (no
/// table), else from the table of offsets.
struct RowBase {
  int64_t stride = 0;
  const std::vector<int64_t>* table = nullptr;
  int64_t operator()(int64_t r) const { return table ? (*table)[size_t(r)] : r * stride; }
};

/// Softmax of one contiguous row (y may be x): the max, e^(x - max) into y, their sum in f32
/// lanes (sumLanes' error bound; each term is at most 1), then one f32 scale.
inline void softmaxRow(float* y, const float* x, int64_t size) {
  float max = detail::maxRun(x, size);
  if (!std::isfinite(max)) max = 0.0f;
  for (int64_t i = 0; i < size; ++i)
    y[i] = meshrt::kernels::f32::exp(x[i] - max);
  double sum = detail::sumLanes(y, size, [](float v) { return v; });
  float inverse = float(1 / sum);
  for (int64_t i = 0; i < size; ++i)
    y[i] = y[i] * inverse;
}

namespace detail {

/// 1 / sqrt(variance + eps) of a row whose mean is meanHigh + meanLow: the centered second
/// moment in f32 lanes (sumLanes: its terms are the deviations themselves), then one f32 scale.
inline float inverseDeviation(const float* x, int64_t size, float meanHigh, float meanLow,
                              double count, double eps) {
  double variance = sumLanes(x, size,
                             [meanHigh, meanLow](float v) {
                               float centered = (v - meanHigh) - meanLow;
                               return centered * centered;
                             }) /
                    count;
  return float(1 / std::sqrt(variance + eps));
}

} // namespace detail

/// Layer norm (without gain and bias) of one contiguous row over `count` global elements: the
/// mean summed in double (a row far from zero would lose its deviations to an f32 sum), kept as
/// two floats so that x - mean loses nothing to its rounding; then the inverse deviation.
inline void layerNormRow(float* y, const float* x, int64_t size, double count, double eps) {
  double mean = detail::sumRun(x, size) / count;
  float meanHigh = float(mean), meanLow = float(mean - double(meanHigh));
  float scale = detail::inverseDeviation(x, size, meanHigh, meanLow, count, eps);
  for (int64_t i = 0; i < size; ++i)
    y[i] = ((x[i] - meanHigh) - meanLow) * scale;
}

namespace detail {

/// layerNormRow of a row whose mean is given, times `gain` plus `bias` in the same pass as the
/// normalization (the same f32 operations as layerNormRow and then the affine loop).
inline void layerNormAffineRow(float* y, const float* x, int64_t size, double mean, double count,
                               double eps, const float* gain, const float* bias) {
  float meanHigh = float(mean), meanLow = float(mean - double(meanHigh));
  float scale = inverseDeviation(x, size, meanHigh, meanLow, count, eps);
  for (int64_t i = 0; i < size; ++i) {
    float normalized = ((x[i] - meanHigh) - meanLow) * scale;
    float scaled = normalized * gain[i];
    y[i] = scaled + bias[i];
  }
}

} // namespace detail

/// along() over whole rows of `size` contiguous elements starting at each base, one row kernel
/// per kind (softmaxRow, layerNormRow; log_softmax's sums of exponentials in double).
inline void alongContiguous(float* out, const float* in, int64_t rows, const RowBase& inBase,
                            const RowBase& outBase, int64_t size, Along kind, double eps,
                            int64_t globalLaneCount) {
  // Rows are independent: many are split over OpenMP's threads (one unless asked for more).
  [[maybe_unused]] bool parallel = rows > 1 && rows * size >= detail::kParallelPoints;
  switch (kind) {
  case Along::LayerNorm:
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
    for (int64_t r = 0; r < rows; ++r)
      layerNormRow(out + outBase(r), in + inBase(r), size, double(globalLaneCount), eps);
    return;
  case Along::Softmax:
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
    for (int64_t r = 0; r < rows; ++r)
      softmaxRow(out + outBase(r), in + inBase(r), size);
    return;
  case Along::LogSoftmax:
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = in + inBase(r);
      float* y = out + outBase(r);
      float max = detail::maxRun(x, size);
      if (!std::isfinite(max)) max = 0.0f;
      double logSum = std::log(detail::sumExpRun(x, size, max));
      for (int64_t i = 0; i < size; ++i)
        y[i] = float(double(x[i]) - max - logSum);
    }
    return;
  case Along::Cumsum:
  case Along::CumsumExclusive:
    break;
  }
  throw std::logic_error("alongContiguous: not a row kernel");
}

/// layer_norm of `rows` rows of `size` contiguous elements, one row apart, times `gain` plus
/// `bias` along the row: along(LayerNorm) and the `y * gain + bias` loop after it
/// (fuse-row-kernels), each row finished while it is in L1 instead of a second pass over memory.
/// Not inlined (nor maskedSoftmax): with the generated call's literal sizes propagated into the
/// row kernels' tail loops GCC 12 warns of impossible iterations (-Waggressive-loop-optimizations).
[[gnu::noinline]] inline void layerNormAffine(float* out, const float* in, int64_t rows,
                                              int64_t size, const float* gain, const float* bias,
                                              double eps, int64_t globalLaneCount) {
  [[maybe_unused]] bool parallel = rows > 1 && rows * size >= detail::kParallelPoints;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * size;
    double count = double(globalLaneCount);
    detail::layerNormAffineRow(out + r * size, x, size, detail::sumRun(x, size) / count, count, eps,
                               gain, bias);
  }
}

namespace detail {
/// The offset of row r of the row kernels: r's index over `outer` (row-major) times `strides`.
inline int64_t rowBase(const Shape& outer, const Shape& strides, int64_t r) {
  int64_t base = 0;
  for (size_t d = outer.size(), rest = size_t(r); d-- > 0;) {
    base += int64_t(rest % size_t(outer[d])) * strides[d];
    rest /= size_t(outer[d]);
  }
  return base;
}
/// Row r's index along outer dim `dim`.
inline int64_t outerIndex(const Shape& outer, int64_t r, size_t dim) {
  size_t rest = size_t(r);
  for (size_t d = outer.size() - 1; d > dim; --d)
    rest /= size_t(outer[d]);
  return int64_t(rest % size_t(outer[dim]));
}
} // namespace detail

/// sum = t0 + t1, or t0 + (t1 + t2) when t2 is not null, over rows of `size` contiguous elements
/// (`sum` and `out` dense, one row apart; term k's row r starts at r's index over `outer` times
/// `tkOuter`: dense, or broadcast where a stride is 0), stored; then layerNormAffine of each
/// row of the sum into `out` while the row is in L1 (fuse-row-kernels: the residual add before
/// a pre-norm layer's norm was a loop, a second pass over memory, of its own). The terms are
/// added in the loop's order, so `sum` is what the loop stored.
[[gnu::noinline]] inline void addLayerNormAffine(float* out, float* sum, const Shape& outer,
                                                 int64_t size, const float* gain, const float* bias,
                                                 double eps, int64_t globalLaneCount,
                                                 const float* t0, const Shape& t0Outer,
                                                 const float* t1, const Shape& t1Outer,
                                                 const float* t2, const Shape& t2Outer) {
  int64_t rows = product(outer);
  [[maybe_unused]] bool parallel = rows > 1 && rows * size >= detail::kParallelPoints;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    int64_t base0 = detail::rowBase(outer, t0Outer, r), base1 = detail::rowBase(outer, t1Outer, r);
    int64_t base2 = t2 ? detail::rowBase(outer, t2Outer, r) : 0;
    float* __restrict x = sum + r * size;
    const float* __restrict a = t0 + base0;
    const float* __restrict b = t1 + base1;
    // The sum, stored and summed for the mean in the same pass: sumRun's eight double
    // accumulators in its order, so the mean is layerNormRow's to the bit.
    double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    auto addRow = [&](auto term) {
      int64_t i = 0;
      for (; i + 8 <= size; i += 8)
        for (int j = 0; j < 8; ++j) {
          float v = term(i + j);
          x[i + j] = v;
          partial[j] += double(v);
        }
      for (; i < size; ++i) {
        float v = term(i);
        x[i] = v;
        partial[i % 8] += double(v);
      }
    };
    if (t2) {
      const float* __restrict c = t2 + base2;
      addRow([&](int64_t i) { return a[i] + (b[i] + c[i]); });
    } else {
      addRow([&](int64_t i) { return a[i] + b[i]; });
    }
    double mean = (((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                   ((partial[4] + partial[5]) + (partial[6] + partial[7]))) /
                  double(globalLaneCount);
    detail::layerNormAffineRow(out + r * size, x, size, mean, double(globalLaneCount), eps, gain,
                               bias);
  }
}

/// softmax of where(mask != 0, in, fill) over rows of `size` contiguous elements, one row apart
/// (`in` and `out`), the rows indexed by `outer`: the mask loop and along(Softmax) after it
/// (fuse-row-kernels). Mask row r starts at r's index over `outer` times `maskOuter`, its
/// elements `maskLane` apart (0: one value for the row).
[[gnu::noinline]] inline void maskedSoftmax(float* out, const float* in, const float* mask,
                                            const Shape& outer, const Shape& maskOuter,
                                            int64_t size, int64_t maskLane, float fill) {
  int64_t rows = product(outer);
  [[maybe_unused]] bool parallel = rows > 1 && rows * size >= detail::kParallelPoints;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    int64_t maskBase = detail::rowBase(outer, maskOuter, r);
    const float* x = in + r * size;
    const float* m = mask + maskBase;
    float* y = out + r * size;
    for (int64_t i = 0; i < size; ++i)
      y[i] = m[i * maskLane] != 0 ? x[i] : fill;
    softmaxRow(y, y, size);
  }
}

/// maskedSoftmax of causal attention's scores, over the keys a row can see: the mask is known
/// zero (causal-attention-blocks proved it) wherever the key position, the lane, exceeds the
/// query position, the index of outer dim `queryDim`. Row q reads its scores and mask over the
/// keys [0, q] rounded up to 16 (the prefix; where(mask, x, fill) is fill past it whatever x
/// is, so the scores there are never read and need not be written) and writes zeros past it
/// when e^(fill - max) is 0 in f32 (fill - max < -104: with fill -1e9, any row with a finite
/// unmasked score): then every term past the prefix was an exact 0 in the whole row's max,
/// exponentials, sum (adding 0 to sumLanes' lanes changes no bit) and scaling, so the values are
/// maskedSoftmax's to the bit. Otherwise (a wholly masked row, a fill near the scores) the row
/// is maskedSoftmax's, its tail the fill. Causal attention's rows see half their keys on average.
[[gnu::noinline]] inline void causalMaskedSoftmax(float* out, const float* in, const float* mask,
                                                  const Shape& outer, const Shape& maskOuter,
                                                  int64_t size, int64_t maskLane, float fill,
                                                  int64_t queryDim) {
  int64_t rows = product(outer);
  [[maybe_unused]] bool parallel = rows > 1 && rows * size >= detail::kParallelPoints;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    int64_t maskBase = detail::rowBase(outer, maskOuter, r);
    int64_t query = detail::outerIndex(outer, r, size_t(queryDim));
    const float* x = in + r * size;
    const float* m = mask + maskBase;
    float* y = out + r * size;
    // A multiple of sumLanes' 16 lanes, so that the prefix's terms take the lanes they take in
    // the whole row.
    int64_t prefix = std::min(size, (query + 16) / 16 * 16);
    for (int64_t i = 0; i < prefix; ++i)
      y[i] = m[i * maskLane] != 0 ? x[i] : fill;
    float max = detail::maxRun(y, prefix);
    if (prefix < size) max = fill > max ? fill : max;
    if (!std::isfinite(max)) max = 0.0f;
    if (prefix < size && meshrt::kernels::f32::exp(fill - max) != 0.0f) {
      for (int64_t i = prefix; i < size; ++i)
        y[i] = fill;
      softmaxRow(y, y, size);
      continue;
    }
    for (int64_t i = 0; i < prefix; ++i)
      y[i] = meshrt::kernels::f32::exp(y[i] - max);
    double sum = detail::sumLanes(y, prefix, [](float v) { return v; });
    float inverse = float(1 / sum);
    for (int64_t i = 0; i < prefix; ++i)
      y[i] = y[i] * inverse;
    for (int64_t i = prefix; i < size; ++i)
      y[i] = 0.0f * inverse; // e^(fill - max) = 0, scaled: 0, or NaN where the sum is
  }
}

namespace detail {
/// Cumsum of the lanes of a dense [above, length, inner] box, in double as the generic path
/// (each lane summed in the same order, so the same values): a lane position at a time over
/// `inner` neighbouring lanes, a contiguous run the compiler vectorizes. The generic path
/// walked one lane at a time, `inner` floats apart: with performer's lanes 8 KiB apart every
/// element touched another page (12.8 ns per element, 13 of its 15 ms per step).
inline void cumsumBox(float* out, const float* in, int64_t above, int64_t length, int64_t inner,
                      bool exclusive, meshrt::Communicator* group) {
  size_t lanes = size_t(above * inner);
  thread_local std::vector<double> carry;
  carry.assign(lanes, 0.0);
  if (group) {
    // The lanes' totals, then the sum of the lower blocks' (the ranks before this one).
    thread_local std::vector<double> totals, all;
    totals.assign(lanes, 0.0);
    for (int64_t a = 0; a < above; ++a)
      for (int64_t j = 0; j < length; ++j) {
        const float* x = in + (a * length + j) * inner;
        double* total = totals.data() + a * inner;
        for (int64_t i = 0; i < inner; ++i)
          total[i] += x[i];
      }
    all.resize(lanes * size_t(group->size()));
    group->allGather(totals.data(), all.data(), lanes);
    for (int peer = 0; peer < group->rank(); ++peer)
      for (size_t r = 0; r < lanes; ++r)
        carry[r] += all[size_t(peer) * lanes + r];
  }
  for (int64_t a = 0; a < above; ++a) {
    double* sum = carry.data() + a * inner;
    for (int64_t j = 0; j < length; ++j) {
      const float* x = in + (a * length + j) * inner;
      float* y = out + (a * length + j) * inner;
      if (exclusive) {
        for (int64_t i = 0; i < inner; ++i) {
          double value = x[i];
          y[i] = float(sum[i]);
          sum[i] += value;
        }
      } else {
        for (int64_t i = 0; i < inner; ++i) {
          sum[i] += x[i];
          y[i] = float(sum[i]);
        }
      }
    }
  }
}
} // namespace detail

/// Lanes: `outer` sizes with strides `inOuter`/`outOuter`; lane points `lane` with strides
/// `inLane`/`outLane`. `globalLaneCount`: the lane's global element count (layer_norm).
inline void along(float* out, const float* in, const Shape& outer, const Shape& inOuter,
                  const Shape& outOuter, const Shape& lane, const Shape& inLane,
                  const Shape& outLane, Along kind, double eps, int64_t globalLaneCount,
                  meshrt::Communicator* group) {
  // A group of one rank (the lane's axes of size 1, e.g. `vocab: model` on [1]) splits nothing:
  // the lane is whole, and the contiguous rows below apply (a log_softmax over vocab = 64 took
  // the strided per-element walk at 8 ns an element on [1], 2x the row kernel).
  if (group && group->size() <= 1) group = nullptr;
  // A whole unit-stride lane (the usual softmax and layer_norm over the innermost dim): rows
  // of contiguous elements, walked directly so that the compiler vectorizes them; rows one
  // lane apart (the usual layout) need no table of their offsets.
  if (!group && lane.size() == 1 && inLane[0] == 1 && outLane[0] == 1 &&
      (kind == Along::Softmax || kind == Along::LogSoftmax || kind == Along::LayerNorm)) {
    int64_t rows = product(outer);
    if (detail::denseRun(outer, inOuter, lane[0]) && detail::denseRun(outer, outOuter, lane[0])) {
      alongContiguous(out, in, rows, RowBase{lane[0]}, RowBase{lane[0]}, lane[0], kind, eps,
                      globalLaneCount);
      return;
    }
    std::vector<int64_t> inBase = offsetsOf(outer, inOuter), outBase = offsetsOf(outer, outOuter);
    alongContiguous(out, in, rows, RowBase{0, &inBase}, RowBase{0, &outBase}, lane[0], kind, eps,
                    globalLaneCount);
    return;
  }
  int64_t above = 0, inner = 0;
  if ((kind == Along::Cumsum || kind == Along::CumsumExclusive) && lane.size() == 1 &&
      inOuter == outOuter && inLane == outLane &&
      detail::cumsumBox(outer, inOuter, lane[0], inLane[0], above, inner)) {
    detail::cumsumBox(out, in, above, lane[0], inner, kind == Along::CumsumExclusive, group);
    return;
  }
  std::vector<int64_t> inBase = offsetsOf(outer, inOuter), outBase = offsetsOf(outer, outOuter);
  std::vector<int64_t> inOffsets = offsetsOf(lane, inLane), outOffsets = offsetsOf(lane, outLane);
  size_t rows = inBase.size(), size = inOffsets.size();
  if (kind == Along::Softmax || kind == Along::LogSoftmax) {
    // Per row: the max and the sum of exp(x - max) in f32 exp (meshrt::kernels::f32, <= 1 ulp),
    // summed in double; softmax keeps the exponentials in `out`. A split lane combines its
    // ranks' (max, sum) pairs after one all-gather (meshrt/kernels/SoftmaxStats.h).
    std::vector<double> stats(2 * rows); // (max, sum) per row
    bool softmax = kind == Along::Softmax;
    for (size_t r = 0; r < rows; ++r) {
      float rowMax = -INFINITY;
      for (size_t i = 0; i < size; ++i)
        rowMax = std::max(rowMax, in[inBase[r] + inOffsets[i]]);
      float max = std::isfinite(rowMax) ? rowMax : 0.0f;
      double sum = 0;
      for (size_t i = 0; i < size; ++i) {
        float e = meshrt::kernels::f32::exp(in[inBase[r] + inOffsets[i]] - max);
        if (softmax) out[outBase[r] + outOffsets[i]] = e;
        sum += e;
      }
      stats[2 * r] = rowMax;
      stats[2 * r + 1] = sum;
    }
    // The factor that brings a rank's exponentials to the global max (1 without a group).
    std::vector<double> rescale(rows, 1.0);
    if (group) {
      std::vector<double> all(stats.size() * size_t(group->size()));
      group->allGather(stats.data(), all.data(), stats.size());
      int64_t stride = int64_t(stats.size());
      for (size_t r = 0; r < rows; ++r) {
        float laneMax = 0;
        meshrt::kernels::combineSoftmaxStatistics(all.data() + 2 * r, stride, group->size(),
                                                  group->rank(), &laneMax, &stats[2 * r + 1],
                                                  &rescale[r]);
        stats[2 * r] = laneMax;
      }
    }
    for (size_t r = 0; r < rows; ++r) {
      float max = std::isfinite(float(stats[2 * r])) ? float(stats[2 * r]) : 0.0f;
      double sum = stats[2 * r + 1];
      if (softmax) {
        double scale = rescale[r] / sum; // as meshrt/cuda/RowMath.h's softmaxLane
        for (size_t i = 0; i < size; ++i)
          out[outBase[r] + outOffsets[i]] = float(out[outBase[r] + outOffsets[i]] * scale);
        continue;
      }
      double logSum = std::log(sum);
      for (size_t i = 0; i < size; ++i)
        out[outBase[r] + outOffsets[i]] =
            float(double(in[inBase[r] + inOffsets[i]]) - max - logSum);
    }
  } else if (kind == Along::LayerNorm) {
    double count = double(globalLaneCount);
    if (!group) {
      // Two passes, as the interpreter.
      for (size_t r = 0; r < rows; ++r) {
        double mean = 0, variance = 0;
        for (size_t i = 0; i < size; ++i)
          mean += in[inBase[r] + inOffsets[i]];
        mean /= count;
        for (size_t i = 0; i < size; ++i) {
          double centered = in[inBase[r] + inOffsets[i]] - mean;
          variance += centered * centered;
        }
        variance /= count;
        double scale = 1 / std::sqrt(variance + eps);
        for (size_t i = 0; i < size; ++i)
          out[outBase[r] + outOffsets[i]] = float((in[inBase[r] + inOffsets[i]] - mean) * scale);
      }
      return;
    }
    // Split lane: one all-reduce of (sum x, sum x^2) per row, in double.
    std::vector<double> sums(2 * rows, 0.0);
    for (size_t r = 0; r < rows; ++r)
      for (size_t i = 0; i < size; ++i) {
        double x = in[inBase[r] + inOffsets[i]];
        sums[2 * r] += x;
        sums[2 * r + 1] += x * x;
      }
    group->allReduce(sums.data(), sums.size());
    for (size_t r = 0; r < rows; ++r) {
      double mean = sums[2 * r] / count;
      double variance = std::max(0.0, sums[2 * r + 1] / count - mean * mean);
      double scale = 1 / std::sqrt(variance + eps);
      for (size_t i = 0; i < size; ++i)
        out[outBase[r] + outOffsets[i]] = float((in[inBase[r] + inOffsets[i]] - mean) * scale);
    }
  } else {
    // Cumsum: local prefix sums, then (split) the exclusive scan of the lower blocks' totals.
    bool exclusive = kind == Along::CumsumExclusive;
    std::vector<double> totals(rows, 0.0), carry(rows, 0.0);
    for (size_t r = 0; r < rows; ++r)
      for (size_t i = 0; i < size; ++i)
        totals[r] += in[inBase[r] + inOffsets[i]];
    if (group) {
      std::vector<double> all(rows * size_t(group->size()));
      group->allGather(totals.data(), all.data(), rows);
      for (int peer = 0; peer < group->rank(); ++peer)
        for (size_t r = 0; r < rows; ++r)
          carry[r] += all[size_t(peer) * rows + r];
    }
    for (size_t r = 0; r < rows; ++r) {
      double sum = carry[r];
      for (size_t i = 0; i < size; ++i) {
        double x = in[inBase[r] + inOffsets[i]];
        if (exclusive) {
          out[outBase[r] + outOffsets[i]] = float(sum);
          sum += x;
        } else {
          sum += x;
          out[outBase[r] + outOffsets[i]] = float(sum);
        }
      }
    }
  }
}

/// shift along a dim (position `dimIndex` of the local shape) by `offset`, filling zeros. When
/// the dim is split over `group` (block order = group rank), the rows come from the blocks
/// `offset` positions away, exchanged by collective permutes of whole shards (at most two).
inline void shift(View out, ConstView in, const Shape& sizes, size_t dimIndex, int64_t offset,
                  meshrt::Communicator* group) {
  int64_t local = sizes[dimIndex];
  int64_t outerCount = 1, innerCount = 1;
  for (size_t i = 0; i < dimIndex; ++i)
    outerCount *= sizes[i];
  for (size_t i = dimIndex + 1; i < sizes.size(); ++i)
    innerCount *= sizes[i];
  std::fill(out.begin(), out.end(), 0.0f);
  auto copyRows = [&](ConstView source, int64_t sourceStartGlobal, int64_t outStartGlobal) {
    // out global row g takes source global row g - offset, when it lies in `source`.
    for (int64_t j = 0; j < local; ++j) {
      int64_t from = outStartGlobal + j - offset - sourceStartGlobal;
      if (from < 0 || from >= local) continue;
      for (int64_t o = 0; o < outerCount; ++o)
        std::copy_n(source.data() + (o * local + from) * innerCount, innerCount,
                    out.data() + (o * local + j) * innerCount);
    }
  };
  if (!group) {
    copyRows(in, 0, 0);
    return;
  }
  int64_t rank = group->rank(), ranks = group->size();
  int64_t myStart = rank * local;
  // Source rows lie in blocks rank - q for q in {floor(offset/local), ceil(offset/local)}.
  int64_t low = offset >= 0 ? offset / local : -((-offset + local - 1) / local);
  int64_t high = offset % local == 0 ? low : low + 1;
  Buffer received(in.size());
  for (int64_t q = low; q <= high; ++q) {
    if (q == 0) {
      copyRows(in, myStart, myStart);
      continue;
    }
    int64_t sendTo = rank + q, recvFrom = rank - q;
    int send = sendTo >= 0 && sendTo < ranks ? int(sendTo) : meshrt::Communicator::kNoPeer;
    int recv = recvFrom >= 0 && recvFrom < ranks ? int(recvFrom) : meshrt::Communicator::kNoPeer;
    group->permute(in.data(), received.data(), in.size(), send, recv);
    if (recv != meshrt::Communicator::kNoPeer) copyRows(received, recvFrom * local, myStart);
  }
}

//===------------------------------------------------------------------------------------------===//
// Data movement
//===------------------------------------------------------------------------------------------===//

/// Regroups `from` dims (sizes `fromSizes`, strides `fromStrides` in `in`) into the result's
/// dims: out point -> in[other + fromOffsets[linear]], where linear (from `linearBase`) is the
/// position in the regrouped block.
inline void reshape(float* out, const Shape& outSizes, const float* in, const Shape& otherStrides,
                    const Shape& linearStrides, const Shape& fromSizes, const Shape& fromStrides,
                    int64_t linearBase = 0) {
  std::vector<int64_t> fromOffsets = offsetsOf(fromSizes, fromStrides);
  forEach<3>(outSizes, {rowMajorStrides(outSizes), otherStrides, linearStrides}, {0, 0, linearBase},
             [&](const std::array<int64_t, 3>& at) {
               out[at[0]] = in[at[1] + fromOffsets[size_t(at[2])]];
             });
}

/// out[.., j, ..] = in[.., j - offset, ..] along the window dim (out dim `outDim` / in stride
/// `inStride`, sizes inSize / outSize), other dims through `outer` strides. Positions outside
/// `in` are left as they are (zero-initialized by the caller).
inline void copyWindow(float* out, const float* in, const Shape& outer, const Shape& outOuter,
                       const Shape& inOuter, int64_t outStride, int64_t inStride, int64_t outSize,
                       int64_t inSize, int64_t offset) {
  int64_t begin = std::max<int64_t>(0, offset), end = std::min(outSize, inSize + offset);
  forEach<2>(outer, {outOuter, inOuter}, {0, 0}, [&](const std::array<int64_t, 2>& at) {
    for (int64_t j = begin; j < end; ++j)
      out[at[0] + j * outStride] = in[at[1] + (j - offset) * inStride];
  });
}

/// one_hot: out = (ids == global position along the dim), position = start + local index.
inline void oneHot(float* out, const Shape& outSizes, const float* ids, const Shape& idStrides,
                   const Shape& positionStrides, int64_t start) {
  // The usual call: one dim (the one-hot dim) walks the positions, the ids do not move along
  // it, and every position is a float exactly. Then the output is zeros but for at most one
  // element per id: filled, then each id's element set (a compare per element cost 2 ns here,
  // moe's dispatch masks 40 us a call).
  size_t rank = outSizes.size(), dim = rank;
  for (size_t d = 0; d < rank; ++d)
    if (positionStrides[d] != 0) dim = dim == rank ? d : rank + 1;
  int64_t total = product(outSizes);
  if (dim < rank && idStrides[dim] == 0 && total > 0) {
    int64_t stride = positionStrides[dim], size = outSizes[dim];
    int64_t first = start, last = start + stride * (size - 1);
    if (std::max(std::abs(first), std::abs(last)) <= (int64_t(1) << 24)) {
      std::fill_n(out, total, 0.0f);
      Shape outStrides = rowMajorStrides(outSizes), points = outSizes;
      points[dim] = 1;
      int64_t outStride = outStrides[dim];
      forEach<2>(points, {outStrides, idStrides}, {0, 0}, [&](const std::array<int64_t, 2>& at) {
        double offset = (double(ids[at[1]]) - double(start)) / double(stride);
        if (offset >= 0 && offset < double(size) && offset == std::floor(offset))
          out[at[0] + int64_t(offset) * outStride] = 1.0f;
      });
      return;
    }
  }
  forEach<3>(outSizes, {rowMajorStrides(outSizes), idStrides, positionStrides}, {0, 0, start},
             [&](const std::array<int64_t, 3>& at) {
               out[at[0]] = ids[at[1]] == float(at[2]) ? 1.0f : 0.0f;
             });
}

/// gather: rows of the table's local block [start, start + rows) selected by ids; 0 elsewhere
/// (a partial sum over the table dim's axes when that dim is split).
inline void gather(float* out, const Shape& outSizes, const float* table, const Shape& tableStrides,
                   const float* ids, const Shape& idStrides, int64_t rows, int64_t rowStride,
                   int64_t start) {
  // The usual layout (an embedding lookup): the last dim walks one table row (stride 1, one id),
  // the others only the ids. One id per row, then a row copy (or zeros outside the block).
  size_t last = outSizes.size() - 1;
  if (!outSizes.empty() && tableStrides[last] == 1 && idStrides[last] == 0 &&
      std::all_of(tableStrides.begin(), tableStrides.end() - 1,
                  [](int64_t stride) { return stride == 0; })) {
    int64_t run = outSizes[last];
    Shape points(outSizes.begin(), outSizes.end() - 1),
        idPoint(idStrides.begin(), idStrides.end() - 1);
    Shape outPoint = rowMajorStrides(points);
    for (int64_t& stride : outPoint)
      stride *= run;
    forEach<2>(points, {outPoint, idPoint}, {0, 0}, [&](const std::array<int64_t, 2>& at) {
      double id = double(ids[at[1]]) - double(start);
      float* row = out + at[0];
      if (id >= 0 && id < double(rows))
        std::copy_n(table + int64_t(id) * rowStride, run, row);
      else
        std::fill_n(row, run, 0.0f);
    });
    return;
  }
  forEach<3>(outSizes, {rowMajorStrides(outSizes), tableStrides, idStrides}, {0, 0, 0},
             [&](const std::array<int64_t, 3>& at) {
               double id = double(ids[at[2]]) - double(start);
               out[at[0]] =
                   id >= 0 && id < double(rows) ? table[at[1] + int64_t(id) * rowStride] : 0.0f;
             });
}

/// scatterAdd: out (row-major over outSizes, written whole) = for every point p of `points`, in
/// order, the operand at p (`inStrides` over out's dims, `inPointStrides` over the points) added
/// into out's row along dim `at` that the id selects (id - start; ids outside the local block
/// add nothing): the einsum of a one-hot tensor that keeps its one-hot dim (an embedding's
/// gradient).
inline void scatterAdd(float* out, const Shape& outSizes, const float* in, const Shape& inStrides,
                       const float* ids, const Shape& idStrides, const Shape& points,
                       const Shape& inPointStrides, const Shape& idPointStrides, int64_t at,
                       int64_t start) {
  std::fill(out, out + product(outSizes), 0.0f);
  Shape outStrides = rowMajorStrides(outSizes), rowSizes = outSizes, rowStrides = outStrides;
  int64_t rows = outSizes[size_t(at)], rowStride = outStrides[size_t(at)];
  rowSizes[size_t(at)] = 1;
  rowStrides[size_t(at)] = 0;
  auto select = [&](int64_t idOffset) {
    double id = double(ids[idOffset]) - double(start);
    return id >= 0 && id < double(rows) ? int64_t(id) : int64_t(-1);
  };
  // The usual layout (ids per point, rows dense in both): one id and one vector add per point.
  bool dense = std::all_of(idStrides.begin(), idStrides.end(), [](int64_t v) { return v == 0; }) &&
               detail::denseRun(rowSizes, rowStrides, 1) &&
               detail::denseRun(rowSizes, inStrides, 1);
  int64_t run = product(rowSizes);
  forEach<2>(points, {inPointStrides, idPointStrides}, {0, 0},
             [&](const std::array<int64_t, 2>& point) {
               if (dense) {
                 int64_t id = select(point[1]);
                 if (id < 0) return;
                 float* __restrict row = out + id * rowStride;
                 const float* __restrict x = in + point[0];
                 for (int64_t i = 0; i < run; ++i)
                   row[i] += x[i];
                 return;
               }
               forEach<3>(rowSizes, {rowStrides, inStrides, idStrides}, {0, point[0], point[1]},
                          [&](const std::array<int64_t, 3>& o) {
                            int64_t id = select(o[2]);
                            if (id >= 0) out[o[0] + id * rowStride] += in[o[1]];
                          });
             });
}

/// top_k: along out's dim kAt, the positions of each row's first size(kAt) elements in
/// topKBefore's order (the row of n elements whole on this rank; inStrides 0 along kAt). A
/// partial sort per row.
inline void topK(float* out, const Shape& outSizes, const float* in, const Shape& inStrides,
                 int64_t kAt, int64_t n, int64_t stride) {
  Shape rows = outSizes;
  int64_t k = rows[size_t(kAt)];
  rows[size_t(kAt)] = 1;
  Shape outStrides = rowMajorStrides(outSizes);
  int64_t outStride = outStrides[size_t(kAt)];
  std::vector<int64_t> order(size_t(n), 0);
  forEach<2>(rows, {outStrides, inStrides}, {0, 0}, [&](const std::array<int64_t, 2>& at) {
    const float* row = in + at[1];
    for (int64_t i = 0; i < n; ++i)
      order[size_t(i)] = i;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int64_t a, int64_t b) { return topKBefore(row, stride, a, b); });
    for (int64_t j = 0; j < k; ++j)
      out[at[0] + j * outStride] = float(order[size_t(j)]);
  });
}

/// iota: the global position along the dim (position strides: 1 at the dim, else 0).
inline void iota(float* out, const Shape& outSizes, const Shape& positionStrides, int64_t start) {
  forEach<2>(outSizes, {rowMajorStrides(outSizes), positionStrides}, {0, start},
             [&](const std::array<int64_t, 2>& at) { out[at[0]] = float(at[1]); });
}

/// dropout when training: keep iff meshrt::dropoutKeep(key, global index, rate), scaled by
/// 1/(1-rate).
inline void dropout(float* out, const Shape& outSizes, const float* in, const Shape& inStrides,
                    const Shape& globalStrides, int64_t base, uint64_t key, double rate) {
  double scale = rate < 1 ? 1 / (1 - rate) : 0.0;
  size_t rank = outSizes.size();
  if (rank == 0 || globalStrides[rank - 1] != 1) {
    forEach<3>(outSizes, {rowMajorStrides(outSizes), inStrides, globalStrides}, {0, 0, base},
               [&](const std::array<int64_t, 3>& at) {
                 bool keep = meshrt::dropoutKeep(key, uint64_t(at[2]), rate);
                 out[at[0]] = keep ? float(double(in[at[1]]) * scale) : 0.0f;
               });
    return;
  }
  // The innermost dim is a run of consecutive global indices: one Philox call per 4 elements.
  Shape rows = outSizes;
  int64_t run = rows[rank - 1], inStep = inStrides[rank - 1];
  rows[rank - 1] = 1;
  forEach<3>(rows, {rowMajorStrides(outSizes), inStrides, globalStrides}, {0, 0, base},
             [&](const std::array<int64_t, 3>& at) {
               meshrt::forEachDropoutKeep(
                   key, uint64_t(at[2]), uint64_t(run), rate, [&](uint64_t k, bool keep) {
                     float x = in[at[1] + int64_t(k) * inStep];
                     out[at[0] + int64_t(k)] = keep ? float(double(x) * scale) : 0.0f;
                   });
             });
}

//===------------------------------------------------------------------------------------------===//
// Collectives over a dim: chunk packing around meshrt's chunked collectives. A local shape is
// seen as [outer, dim, inner] (row-major).
//===------------------------------------------------------------------------------------------===//

struct DimView {
  int64_t outer, size, inner;
};

inline DimView dimView(const Shape& sizes, size_t dimIndex) {
  DimView view{1, sizes[dimIndex], 1};
  for (size_t i = 0; i < dimIndex; ++i)
    view.outer *= sizes[i];
  for (size_t i = dimIndex + 1; i < sizes.size(); ++i)
    view.inner *= sizes[i];
  return view;
}

/// Copies block `block` (of `blockSize` rows) along the dim of `from` (rows `fromSize`) into
/// `to` (rows `toSize`) at row `toRow`... the two directions of packing.
inline void copyRowsBlock(float* to, int64_t toSize, int64_t toRow, const float* from,
                          int64_t fromSize, int64_t fromRow, int64_t rows, int64_t outer,
                          int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    std::copy_n(from + (o * fromSize + fromRow) * inner, rows * inner,
                to + (o * toSize + toRow) * inner);
}

/// all-gather of a dim over `group`: out's dim = group size x in's dim, block i from rank i.
inline void allGatherDim(View out, ConstView in, const Shape& inSizes, size_t dimIndex,
                         meshrt::Communicator& group) {
  DimView view = dimView(inSizes, dimIndex);
  int64_t ranks = group.size();
  // A major-most dim (sequence parallelism's rows): the blocks are already in rank order.
  if (view.outer == 1) {
    group.allGather(in.data(), out.data(), in.size());
    return;
  }
  Buffer chunks(in.size() * size_t(ranks));
  group.allGather(in.data(), chunks.data(), in.size());
  for (int64_t i = 0; i < ranks; ++i)
    copyRowsBlock(out.data(), view.size * ranks, i * view.size, chunks.data() + i * in.size(),
                  view.size, 0, view.size, view.outer, view.inner);
}

/// reduce-scatter into a dim over `group`: sums the ranks' `in` and keeps block rank() of the
/// dim (out's dim = in's dim / group size).
inline void reduceScatterDim(View out, ConstView in, const Shape& inSizes, size_t dimIndex,
                             meshrt::Communicator& group) {
  DimView view = dimView(inSizes, dimIndex);
  int64_t ranks = group.size(), block = view.size / ranks;
  if (view.outer == 1) {
    group.reduceScatter(in.data(), out.data(), out.size());
    return;
  }
  Buffer chunks(in.size());
  for (int64_t i = 0; i < ranks; ++i)
    copyRowsBlock(chunks.data() + i * int64_t(out.size()), block, 0, in.data(), view.size,
                  i * block, block, view.outer, view.inner);
  group.reduceScatter(chunks.data(), out.data(), out.size());
}

/// all-to-all: `fromDim` (position `fromIndex`) grows by the group size, `toDim` (position
/// `toIndex`) shrinks by it; block i of both belongs to group rank i.
inline void allToAllDims(View out, ConstView in, const Shape& inSizes, size_t fromIndex,
                         size_t toIndex, meshrt::Communicator& group) {
  int64_t ranks = group.size();
  Shape chunkSizes = inSizes;
  chunkSizes[toIndex] /= ranks;
  int64_t chunk = product(chunkSizes);
  Buffer send(in.size()), received(in.size());
  DimView toView = dimView(inSizes, toIndex);
  for (int64_t i = 0; i < ranks; ++i)
    copyRowsBlock(send.data() + i * chunk, chunkSizes[toIndex], 0, in.data(), toView.size,
                  i * chunkSizes[toIndex], chunkSizes[toIndex], toView.outer, toView.inner);
  group.allToAll(send.data(), received.data(), size_t(chunk));
  Shape outSizes = chunkSizes;
  outSizes[fromIndex] *= ranks;
  DimView fromView = dimView(chunkSizes, fromIndex);
  for (int64_t i = 0; i < ranks; ++i)
    copyRowsBlock(out.data(), outSizes[fromIndex], i * fromView.size, received.data() + i * chunk,
                  fromView.size, 0, fromView.size, fromView.outer, fromView.inner);
}

/// Local slice: this rank's block `block` of a dim (out's dim = in's dim / blocks).
inline void sliceDim(View out, ConstView in, const Shape& inSizes, size_t dimIndex, int64_t block,
                     int64_t blocks) {
  DimView view = dimView(inSizes, dimIndex);
  int64_t rows = view.size / blocks;
  copyRowsBlock(out.data(), rows, 0, in.data(), view.size, block * rows, rows, view.outer,
                view.inner);
}

/// OpenMP waits by sleeping unless the user chose otherwise: with OMP_WAIT_POLICY unset, the
/// threads of a parallel region (the GEMMs', the large loops') spin after it, taking the core
/// from the rank threads, the other processes or the other team members they wait for (a step
/// ran 4-18x slower on a loaded 2-core machine, bench/README.md). libgomp reads the variable
/// once, when it is loaded, so the runner sets it and starts itself again (same pid, same
/// arguments); if that fails it carries on with OpenMP's default. Call it first in main().
inline void usePassiveOpenMPWaits(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY")) return;
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  ::execv("/proc/self/exe", argv);
}

/// Ranks that are threads of one process each call BLAS: one BLAS thread per rank avoids
/// oversubscribing the cores (OpenBLAS otherwise starts its own pool in every call).
inline void useSingleThreadedBlas() {
#ifdef OPENBLAS_VERSION
  openblas_set_num_threads(1);
#endif
}

//===------------------------------------------------------------------------------------------===//
// Output files (the runner's and `meshc --emit=run --dump-outputs`'s common format)
//===------------------------------------------------------------------------------------------===//

/// Format: per tensor a text line "tensor <name> <dtype> <rank> <sizes...>\n" followed by
/// product(sizes) little-endian float64 values.
inline void writeTensor(std::FILE* file, const std::string& name, const char* dtype,
                        const Shape& sizes, const Buffer& data) {
  std::string header = "tensor " + name + " " + dtype + " " + std::to_string(sizes.size());
  for (int64_t s : sizes)
    header += " " + std::to_string(s);
  header += "\n";
  std::fwrite(header.data(), 1, header.size(), file);
  std::vector<double> values(data.begin(), data.end());
  std::fwrite(values.data(), sizeof(double), values.size(), file);
}

/// The inputs file readTensors read last ("" if none), so that errors about its tensors name it.
inline std::string& inputsFilePath() {
  static std::string path;
  return path;
}

/// The global input of step `step` from a tensor read from a file: `data` holds k >= 1 batches
/// of `shape` stacked along the first dim, and step s reads batch s mod k. Any other shape
/// (a transposed one with the right count included) is an error naming the file, the tensor and
/// both shapes.
inline Tensor batchOfStep(const std::string& name, const Tensor& data, const Shape& shape,
                          int64_t step) {
  bool fits = data.shape.size() == shape.size();
  for (size_t d = 1; fits && d < shape.size(); ++d)
    fits = data.shape[d] == shape[d];
  if (fits && !shape.empty())
    fits = shape[0] > 0 && data.shape[0] > 0 && data.shape[0] % shape[0] == 0;
  if (!fits)
    throw std::invalid_argument("inputs file '" + inputsFilePath() + "': tensor '" + name +
                                "' has shape " + shapeString(data.shape) +
                                ", but the program's input is " + shapeString(shape) +
                                (shape.empty() ? "" : " (or k of it stacked along the first dim)"));
  size_t batch = 1;
  for (int64_t size : shape)
    batch *= size_t(size);
  size_t first = size_t(step) % (data.data.size() / batch) * batch;
  return Tensor{shape, Buffer(data.data.begin() + ptrdiff_t(first),
                              data.data.begin() + ptrdiff_t(first + batch))};
}

/// Reads every tensor of a file in that format (e.g. the inputs given to `meshc run --data`),
/// by name. Throws std::runtime_error when the file cannot be read or is malformed; a header
/// that declares more values than the rest of the file holds (a huge or corrupt header) is
/// caught before anything is allocated for it, naming the file and the tensor (TensorFile.h).
inline std::map<std::string, Tensor> readTensors(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) throw std::runtime_error("cannot open '" + path + "'");
  inputsFilePath() = path;
  std::string bytes;
  char chunk[1 << 16];
  for (size_t got; (got = std::fread(chunk, 1, sizeof chunk, file)) > 0;)
    bytes.append(chunk, got);
  bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed) throw std::runtime_error("cannot read '" + path + "'");
  std::map<std::string, Tensor> tensors;
  for (const TensorFileEntry& entry : parseTensorFile(bytes, path)) {
    Tensor& tensor = tensors[entry.name];
    tensor.shape = entry.shape;
    tensor.data.resize(entry.count());
    for (size_t i = 0; i < entry.count(); ++i)
      tensor.data[i] = float(entry.value(i));
  }
  return tensors;
}

/// Pipeline stages (codegen/SplitStages.h): the value `data` that stage `from` computed goes to
/// every stage of the mask `to` on the stage axis's communicator (group rank = stage), point to
/// point; other stages do nothing. Every rank calls it at the same place, so the sends and recvs
/// of a step match in program order. (A template: CUDA's views are device spans.)
template <class Span>
void stageTransfer(meshrt::Communicator& stages, Span data, int64_t from, uint64_t to) {
  int self = stages.rank();
  if (self == int(from)) {
    for (int stage = 0; stage < stages.size(); ++stage)
      if ((to >> stage) & 1) stages.send(data.data(), data.size(), stage);
  } else if ((to >> self) & 1) {
    stages.recv(data.data(), data.size(), int(from));
  }
}

/// A started stage send and the copy of the data it sends (the sender's buffer moves on).
template <class Owned> struct StageSendOf {
  Owned data;
  meshrt::Request request;
};
using StageSend = StageSendOf<Buffer>;

/// The same with the sends started (1F1B: a stage goes on with its next microbatch while its
/// neighbour still computes) from a copy of `data`, kept in `started` until waitStageSends.
template <class Owned, class Span>
void stageTransferStarted(meshrt::Communicator& stages, Span data, int64_t from, uint64_t to,
                          std::deque<StageSendOf<Owned>>& started) {
  int self = stages.rank();
  if (self == int(from)) {
    for (int stage = 0; stage < stages.size(); ++stage)
      if ((to >> stage) & 1) {
        StageSendOf<Owned>& send = started.emplace_back();
        send.data = Owned(data.begin(), data.end());
        send.request = stages.startSend(send.data.data(), send.data.size(), stage);
      }
  } else if ((to >> self) & 1) {
    stages.recv(data.data(), data.size(), int(from));
  }
}
template <class Owned>
void waitStageSends(meshrt::Communicator& stages, std::deque<StageSendOf<Owned>>& started) {
  for (StageSendOf<Owned>& send : started)
    stages.wait(send.request);
  started.clear();
}

} // namespace meshc::gen
