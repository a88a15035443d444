// Data movement on local buffers: strided copies (transpose, rename, broadcast), windows along
// one dim (slice, pad, concat, shift), reshape, one_hot and gather with a local index offset
// (the shard of a split vocabulary holds ids [lo, lo + rows)), iota with an offset, literal
// fills and dtype casts. Header-only templates: T is float or int32_t (any trivially copyable
// type works).
#pragma once

#include "meshrt/kernels/Index.h"
#include "meshrt/kernels/Scalar.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace meshrt::kernels {

/// out (dense over `outShape`) = in read through `inStrides` over `outShape`: transpose,
/// rename, broadcast (stride 0), stop_gradient, any permutation.
template <typename T>
void copyStrided(const T* in, const Dims& inStrides, T* out, const Dims& outShape) {
  forEachIndex<2>(outShape, {rowMajorStrides(outShape), inStrides},
                  [&](int64_t o, int64_t i) { out[o] = in[i]; });
}

/// out dim i is in dim perm[i] (both dense).
template <typename T> void transpose(const T* in, const Dims& inShape, const Dims& perm, T* out) {
  Dims inStrides = rowMajorStrides(inShape), outShape, strides;
  for (int i = 0; i < perm.rank; ++i) {
    outShape.push_back(inShape[int(perm[i])]);
    strides.push_back(inStrides[int(perm[i])]);
  }
  copyStrided(in, strides, out, outShape);
}

/// out[.., j, ..] = in[.., j - offset, ..] along `axis` where that is inside `in`; other
/// positions are zeroed when `zeroFill`, else left alone. Both dense with the same rank; dims
/// other than `axis` have the same sizes. slice: offset = -start; pad: offset = before.
template <typename T>
void copyWindow(const T* in, const Dims& inShape, T* out, int64_t outAxisSize, int axis,
                int64_t offset, bool zeroFill) {
  Dims outShape = inShape;
  outShape[axis] = outAxisSize;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d)
    outer *= inShape[d];
  for (int d = axis + 1; d < inShape.rank; ++d)
    inner *= inShape[d];
  int64_t inSize = inShape[axis];
  int64_t begin = std::max<int64_t>(0, offset), end = std::min(outAxisSize, inSize + offset);
  for (int64_t o = 0; o < outer; ++o) {
    T* row = out + o * outAxisSize * inner;
    const T* source = in + o * inSize * inner;
    if (begin >= end) {
      if (zeroFill) std::fill(row, row + outAxisSize * inner, T(0));
      continue;
    }
    if (zeroFill) {
      std::fill(row, row + begin * inner, T(0));
      std::fill(row + end * inner, row + outAxisSize * inner, T(0));
    }
    std::memmove(row + begin * inner, source + (begin - offset) * inner,
                 size_t((end - begin) * inner) * sizeof(T));
  }
}

/// The `slice` op: the window [start, start + outAxisSize) of `axis`.
template <typename T>
void slice(const T* in, const Dims& inShape, int axis, int64_t start, int64_t outAxisSize, T* out) {
  copyWindow(in, inShape, out, outAxisSize, axis, -start, true);
}

/// The `pad` op: `before` zeros, the input, zeros up to outAxisSize.
template <typename T>
void pad(const T* in, const Dims& inShape, int axis, int64_t before, int64_t outAxisSize, T* out) {
  copyWindow(in, inShape, out, outAxisSize, axis, before, true);
}

/// The `concat` op: operand k (shape `outShape` with axisSizes[k] along `axis`) at its offset.
template <typename T>
void concat(std::initializer_list<const T*> ins, std::initializer_list<int64_t> axisSizes,
            const Dims& outShape, int axis, T* out) {
  int64_t offset = 0;
  const int64_t* size = axisSizes.begin();
  for (const T* in : ins) {
    Dims inShape = outShape;
    inShape[axis] = *size;
    copyWindow(in, inShape, out, outShape[axis], axis, offset, false);
    offset += *size++;
  }
}

/// The `shift` op: out[j] = in[j - offset] along `axis`, zeros where that is outside.
template <typename T> void shift(const T* in, T* out, const Dims& shape, int axis, int64_t offset) {
  copyWindow(in, shape, out, shape[axis], axis, offset, true);
}

/// The `one_hot` op on a shard of the one-hot dim holding global positions [lo, lo + size):
/// out (dense over outShape) = 1 where ids == lo + position along `axis`, else 0. `idStrides`
/// address ids over outShape (0 on `axis`).
template <typename Id, typename T>
void oneHot(const Id* ids, const Dims& idStrides, T* out, const Dims& outShape, int axis,
            int64_t lo = 0) {
  Dims position = Dims::filled(outShape.rank, 0);
  position[axis] = 1;
  Dims strides = idStrides;
  strides[axis] = 0;
  forEachIndex<3>(outShape, {rowMajorStrides(outShape), strides, position},
                  [&](int64_t o, int64_t i, int64_t p) {
                    out[o] = double(ids[i]) == double(lo + p) ? T(1) : T(0);
                  });
}

/// The `gather` op on a shard of the table holding rows [lo, lo + rows) of the gathered dim:
/// out (dense over outShape) = table[.., id - lo, ..] for ids in range, else 0 (a partial
/// result: the caller's allreduce over the table's split completes it). `tableStrides` address
/// the table over outShape (0 on ids' dims), `rowStride` is the gathered dim's stride,
/// `idStrides` address ids over outShape.
template <typename Id, typename T>
void gather(const T* table, const Dims& tableStrides, int64_t rowStride, int64_t rows,
            const Id* ids, const Dims& idStrides, T* out, const Dims& outShape, int64_t lo = 0) {
  forEachIndex<3>(outShape, {rowMajorStrides(outShape), tableStrides, idStrides},
                  [&](int64_t o, int64_t t, int64_t i) {
                    double row = double(ids[i]) - double(lo);
                    out[o] =
                        row >= 0 && row < double(rows) ? table[t + int64_t(row) * rowStride] : T(0);
                  });
}

/// The `reshape` op (the interpreter's regrouping): out (dense over outShape) reads `in` at
/// keptStrides (over outShape, 0 on the `to` dims) plus the offset of the regrouped position:
/// the `to` dims (positions `toAxes` in outShape, in listed order) give a row-major linear index,
/// which walks the `from` dims (sizes `fromSizes`, strides `fromStrides` in `in`, listed order)
/// row-major. Where `from` and `to` are adjacent in the same place of dense buffers this is a
/// plain copy; generated code may skip the call and alias the buffer.
template <typename T>
void reshape(const T* in, const Dims& keptStrides, const Dims& fromSizes, const Dims& fromStrides,
             T* out, const Dims& outShape, const Dims& toAxes) {
  Dims linear = Dims::filled(outShape.rank, 0);
  int64_t stride = 1;
  for (int i = toAxes.rank; i-- > 0;) {
    linear[int(toAxes[i])] = stride;
    stride *= outShape[int(toAxes[i])];
  }
  std::vector<int64_t> fromOffsets;
  fromOffsets.reserve(size_t(fromSizes.product()));
  forEachIndex<1>(fromSizes, {fromStrides}, [&](int64_t o) { fromOffsets.push_back(o); });
  const int64_t* offsets = fromOffsets.data();
  forEachIndex<3>(outShape, {rowMajorStrides(outShape), keptStrides, linear},
                  [&](int64_t o, int64_t k, int64_t l) { out[o] = in[k + offsets[l]]; });
}

/// The `literal` op: every element `value`.
template <typename T> void fill(T* out, int64_t count, T value) {
  std::fill(out, out + count, value);
}

/// The `iota` op on a shard: offset + position along `axis` (dense over `shape`).
template <typename T> void iota(T* out, const Dims& shape, int axis, int64_t offset = 0) {
  Dims position = Dims::filled(shape.rank, 0);
  position[axis] = 1;
  forEachIndex<2>(shape, {rowMajorStrides(shape), position},
                  [&](int64_t o, int64_t p) { out[o] = T(offset + p); });
}

/// The `cast` op over `count` elements to `to` (float buffers for float dtypes, int32_t for
/// i32): bf16/f16 round to nearest even, i32 truncates toward zero and saturates.
inline void cast(const float* in, float* out, int64_t count, ValueType to) {
  for (int64_t i = 0; i < count; ++i)
    out[i] = roundTo(to, in[i]);
}
inline void cast(const int32_t* in, float* out, int64_t count, ValueType to) {
  for (int64_t i = 0; i < count; ++i)
    out[i] = castToFloat(to, in[i]);
}
inline void cast(const float* in, int32_t* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    out[i] = castToI32(in[i]);
}

} // namespace meshrt::kernels
