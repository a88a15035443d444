// meshrt's local compute kernels, all of them: what generated code includes.
//   Scalar.h    per-element math of every op and dtype rounding (MESHRT_HD, shared with CUDA)
//   Index.h     Dims, strides, forEachIndex (the N-d broadcast loop fused chains are written in)
//   Einsum.h    einsum through OpenBLAS sgemm, generic fallback
//   Reduce.h    reductions, softmax, logsumexp, layer_norm, cumsum and their split-dim phases
//   Movement.h  transpose, slice/pad/concat/shift, one_hot, gather, iota, cast
//   Fill.h      RNG fills of shards (inputs, params, random ops, dropout)
#pragma once

#include "meshrt/kernels/Einsum.h"
#include "meshrt/kernels/Fill.h"
#include "meshrt/kernels/Index.h"
#include "meshrt/kernels/Movement.h"
#include "meshrt/kernels/Reduce.h"
#include "meshrt/kernels/Scalar.h"

namespace meshrt::kernels {

/// Elementwise maps over a dense `shape` with broadcasting operands (strides over `shape`):
/// out[o] = fn(a[..]) / fn(a[..], b[..]) / fn(c[..], a[..], b[..]). Generated code that fuses
/// a chain writes the lambda itself, e.g. [](float x, float b) { return gelu(add(x, b)); }.
template <typename Out, typename A, typename Fn>
void map(Out* out, const Dims& shape, const A* a, const Dims& aStrides, Fn&& fn) {
  forEachIndex<2>(shape, {rowMajorStrides(shape), aStrides},
                  [&](int64_t o, int64_t i) { out[o] = fn(a[i]); });
}
template <typename Out, typename A, typename B, typename Fn>
void map(Out* out, const Dims& shape, const A* a, const Dims& aStrides, const B* b,
         const Dims& bStrides, Fn&& fn) {
  forEachIndex<3>(shape, {rowMajorStrides(shape), aStrides, bStrides},
                  [&](int64_t o, int64_t i, int64_t j) { out[o] = fn(a[i], b[j]); });
}
template <typename Out, typename A, typename B, typename C, typename Fn>
void map(Out* out, const Dims& shape, const A* a, const Dims& aStrides, const B* b,
         const Dims& bStrides, const C* c, const Dims& cStrides, Fn&& fn) {
  forEachIndex<4>(
      shape, {rowMajorStrides(shape), aStrides, bStrides, cStrides},
      [&](int64_t o, int64_t i, int64_t j, int64_t k) { out[o] = fn(a[i], b[j], c[k]); });
}

} // namespace meshrt::kernels
