// Shapes, strides and the N-d broadcast loop every kernel (and every fused loop that generated
// code writes) iterates with. Convention throughout meshrt's kernels, as in the reference
// interpreter: an op iterates a SPACE (usually the result's local shape, row-major); each
// operand is addressed through its strides OVER THAT SPACE, 0 for a dim the operand lacks
// (broadcast). Buffers are local shards; sizes are local sizes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <utility>
#include <vector>

namespace meshrt::kernels {

constexpr int kMaxRank = 12;

/// A small fixed-capacity list of sizes or strides (no allocation; rank <= kMaxRank).
struct Dims {
  int rank = 0;
  int64_t v[kMaxRank] = {};

  Dims() = default;
  Dims(std::initializer_list<int64_t> values) : Dims(values.begin(), int(values.size())) {}
  Dims(const int64_t* values, int count) {
    if (count < 0 || count > kMaxRank) throw std::length_error("meshrt::kernels: rank > 12");
    rank = count;
    for (int i = 0; i < count; ++i)
      v[i] = values[i];
  }
  explicit Dims(const std::vector<int64_t>& values) : Dims(values.data(), int(values.size())) {}
  /// `count` copies of `value`.
  static Dims filled(int count, int64_t value) {
    Dims dims;
    if (count < 0 || count > kMaxRank) throw std::length_error("meshrt::kernels: rank > 12");
    dims.rank = count;
    for (int i = 0; i < count; ++i)
      dims.v[i] = value;
    return dims;
  }

  int size() const { return rank; }
  int64_t operator[](int i) const { return v[i]; }
  int64_t& operator[](int i) { return v[i]; }
  const int64_t* begin() const { return v; }
  const int64_t* end() const { return v + rank; }
  void push_back(int64_t value) {
    if (rank == kMaxRank) throw std::length_error("meshrt::kernels: rank > 12");
    v[rank++] = value;
  }
  /// The product of the entries (the element count of a shape; 1 for rank 0).
  int64_t product() const {
    int64_t result = 1;
    for (int i = 0; i < rank; ++i)
      result *= v[i];
    return result;
  }
  bool operator==(const Dims& other) const {
    if (rank != other.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (v[i] != other.v[i]) return false;
    return true;
  }
};

/// Dense row-major strides of `shape`.
inline Dims rowMajorStrides(const Dims& shape) {
  Dims strides = Dims::filled(shape.rank, 0);
  int64_t stride = 1;
  for (int i = shape.rank; i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

/// A set of dims of a shape, as a bit mask (bit d: dim d). axes({1, 3}) == 0b1010.
using AxisMask = uint32_t;
constexpr AxisMask axes(std::initializer_list<int> list) {
  AxisMask mask = 0;
  for (int axis : list)
    mask |= AxisMask(1) << axis;
  return mask;
}
constexpr AxisMask axis(int d) {
  return AxisMask(1) << d;
}

/// `shape` without the dims in `mask` (the shape of a reduction's result).
inline Dims dropAxes(const Dims& shape, AxisMask mask) {
  Dims kept;
  for (int d = 0; d < shape.rank; ++d)
    if (!(mask >> d & 1)) kept.push_back(shape[d]);
  return kept;
}

/// Strides over `shape` of a dense row-major buffer holding `shape` without the dims in `mask`
/// (kept dims in order), 0 on the dims in `mask`: where a reduction over `mask` writes.
inline Dims keptStrides(const Dims& shape, AxisMask mask) {
  Dims strides = Dims::filled(shape.rank, 0);
  int64_t stride = 1;
  for (int d = shape.rank; d-- > 0;) {
    if (mask >> d & 1) continue;
    strides[d] = stride;
    stride *= shape[d];
  }
  return strides;
}

namespace detail {

template <size_t N, uint32_t UnitMask, typename Fn, size_t... I>
inline void unitStrideLoop(int64_t count, const int64_t* base, Fn& fn, std::index_sequence<I...>) {
  // Strides are 1 (bit set) or 0: compile-time, so the compiler can vectorize through fn.
  for (int64_t i = 0; i < count; ++i)
    fn((base[I] + (((UnitMask >> I) & 1u) ? i : 0))...);
}

template <size_t N, typename Fn, size_t... I>
inline void stridedLoop(int64_t count, const int64_t* base, const int64_t* step, Fn& fn,
                        std::index_sequence<I...>) {
  for (int64_t i = 0; i < count; ++i)
    fn((base[I] + i * step[I])...);
}

template <size_t N, typename Fn, uint32_t... Masks>
inline void dispatchUnitLoop(uint32_t mask, int64_t count, const int64_t* base, Fn& fn,
                             std::integer_sequence<uint32_t, Masks...>) {
  (void)((mask == Masks
              ? (unitStrideLoop<N, Masks>(count, base, fn, std::make_index_sequence<N>{}), true)
              : false) ||
         ...);
}

} // namespace detail

/// Calls fn(offset_0, ..., offset_{N-1}) for every point of `shape` in row-major order, where
/// offset_k is the dot product of the point with strides[k] (an int64_t per operand). Adjacent
/// dims that every operand walks contiguously are merged, and when every operand's innermost
/// stride is 0 or 1 the inner loop is specialized so that it vectorizes (N <= 4).
template <size_t N, typename Fn>
void forEachIndex(const Dims& shape, const std::array<Dims, N>& strides, Fn&& fn) {
  static_assert(N >= 1, "forEachIndex needs at least one operand");
  // Merge dims and drop size-1 dims.
  int64_t sizes[kMaxRank];
  int64_t merged[N][kMaxRank];
  int rank = 0;
  for (int d = 0; d < shape.rank; ++d) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;
    bool mergeable = rank > 0;
    for (size_t k = 0; k < N && mergeable; ++k)
      mergeable = merged[k][rank - 1] == strides[k][d] * shape[d];
    if (mergeable) {
      sizes[rank - 1] *= shape[d];
      for (size_t k = 0; k < N; ++k)
        merged[k][rank - 1] = strides[k][d];
    } else {
      sizes[rank] = shape[d];
      for (size_t k = 0; k < N; ++k)
        merged[k][rank] = strides[k][d];
      ++rank;
    }
  }
  int64_t base[N] = {};
  if (rank == 0) {
    detail::stridedLoop<N>(1, base, base, fn, std::make_index_sequence<N>{});
    return;
  }
  int64_t inner = sizes[rank - 1];
  int64_t step[N];
  uint32_t unitMask = 0;
  bool unit = true;
  for (size_t k = 0; k < N; ++k) {
    step[k] = merged[k][rank - 1];
    if (step[k] == 1)
      unitMask |= 1u << k;
    else if (step[k] != 0)
      unit = false;
  }
  int64_t counter[kMaxRank] = {};
  while (true) {
    if constexpr (N <= 4) {
      if (unit)
        detail::dispatchUnitLoop<N>(unitMask, inner, base, fn,
                                    std::make_integer_sequence<uint32_t, (1u << N)>{});
      else
        detail::stridedLoop<N>(inner, base, step, fn, std::make_index_sequence<N>{});
    } else {
      detail::stridedLoop<N>(inner, base, step, fn, std::make_index_sequence<N>{});
    }
    int d = rank - 2;
    for (; d >= 0; --d) {
      for (size_t k = 0; k < N; ++k)
        base[k] += merged[k][d];
      if (++counter[d] < sizes[d]) break;
      for (size_t k = 0; k < N; ++k)
        base[k] -= merged[k][d] * sizes[d];
      counter[d] = 0;
    }
    if (d < 0) return;
  }
}

} // namespace meshrt::kernels
