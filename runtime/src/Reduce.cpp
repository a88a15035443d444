// The local reduction kernel. Built with -O3 in every configuration (see CMakeLists.txt): it is
// the inner loop of allreduce and reduce-scatter, and GCC vectorizes it only at -O3.
#include "Reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace meshrt::detail {
namespace {

template <class T, ReduceOp Op> inline T combine(T a, T b) {
  if constexpr (Op == ReduceOp::Sum)
    return a + b;
  else if constexpr (Op == ReduceOp::Max)
    return a < b ? b : a;
  else
    return b < a ? b : a;
}

/// Copies an L1-resident block to `to`, bypassing the cache where the target is 16-byte aligned.
void streamOut(char* to, const char* from, size_t bytes) {
#if defined(__SSE2__)
  while (bytes && reinterpret_cast<uintptr_t>(to) % 16) {
    *to++ = *from++;
    --bytes;
  }
  for (; bytes >= 16; bytes -= 16, to += 16, from += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(to),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(from)));
#endif
  std::memcpy(to, from, bytes);
}

/// Reduces in blocks that stay in L1: the block is a local array, so the loops carry no alias
/// checks, and `out` may alias an input because each block is read fully before it is written.
template <class T, ReduceOp Op>
void reduceInto(T* out, const T* const* inputs, int numInputs, size_t count, bool streaming) {
  constexpr size_t kBlock = 8192 / sizeof(T);
  alignas(64) T block[kBlock];
  for (size_t start = 0; start < count; start += kBlock) {
    size_t length = std::min(kBlock, count - start);
    const T* first = inputs[0] + start;
    const T* second = inputs[1] + start;
    for (size_t i = 0; i < length; ++i)
      block[i] = combine<T, Op>(first[i], second[i]);
    for (int q = 2; q < numInputs; ++q) {
      const T* next = inputs[q] + start;
      for (size_t i = 0; i < length; ++i)
        block[i] = combine<T, Op>(block[i], next[i]);
    }
    if (streaming)
      streamOut(reinterpret_cast<char*>(out + start), reinterpret_cast<const char*>(block),
                length * sizeof(T));
    else
      std::memcpy(out + start, block, length * sizeof(T));
  }
#if defined(__SSE2__)
  if (streaming) _mm_sfence();
#endif
}

template <class T>
void reduceTyped(ReduceOp op, void* out, const void* const* inputs, int numInputs, size_t count,
                 bool streaming) {
  T* typedOut = static_cast<T*>(out);
  const T* const* typedInputs = reinterpret_cast<const T* const*>(inputs);
  switch (op) {
  case ReduceOp::Sum:
    return reduceInto<T, ReduceOp::Sum>(typedOut, typedInputs, numInputs, count, streaming);
  case ReduceOp::Max:
    return reduceInto<T, ReduceOp::Max>(typedOut, typedInputs, numInputs, count, streaming);
  case ReduceOp::Min:
    return reduceInto<T, ReduceOp::Min>(typedOut, typedInputs, numInputs, count, streaming);
  }
}

} // namespace

void copy(void* to, const void* from, size_t bytes, bool streaming) {
  if (!bytes) return;
  if (!streaming) {
    std::memcpy(to, from, bytes);
    return;
  }
  streamOut(static_cast<char*>(to), static_cast<const char*>(from), bytes);
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

void reduce(DType dtype, ReduceOp op, void* out, const void* const* inputs, int numInputs,
            size_t count, bool streaming) {
  switch (dtype) {
  case DType::F32:
    return reduceTyped<float>(op, out, inputs, numInputs, count, streaming);
  case DType::F64:
    return reduceTyped<double>(op, out, inputs, numInputs, count, streaming);
  case DType::I32:
    return reduceTyped<int32_t>(op, out, inputs, numInputs, count, streaming);
  case DType::Bytes:
    return;
  }
}

} // namespace meshrt::detail
