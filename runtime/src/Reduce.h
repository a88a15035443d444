// The local kernels of meshrt's shared-memory collectives: reduction and copy (internal).
#pragma once

#include "meshrt/Comm.h"

namespace meshrt::detail {

/// out[0, count) = op over inputs[0..numInputs) (in that order) of inputs[q][0, count), for
/// numInputs >= 2. `out` may alias any one input exactly. With `streaming`, `out` is written
/// with non-temporal stores (large outputs that nobody reads soon from this core's cache); the
/// stores are fenced before returning.
void reduce(DType dtype, ReduceOp op, void* out, const void* const* inputs, int numInputs,
            size_t count, bool streaming);

/// memcpy, through non-temporal stores with `streaming` (fenced before returning). Null
/// pointers are fine when `bytes` is 0.
void copy(void* to, const void* from, size_t bytes, bool streaming);

} // namespace meshrt::detail
