// Reductions and the along-dims ops (softmax, log_softmax, logsumexp, layer_norm, cumsum) on
// local buffers, plus their split-dim PHASES for a dim split across ranks: each phase is a
// local kernel and the caller runs the collective between phases.
//
// Layout: `in` (and `out` for same-shape ops) is dense row-major over `shape`; the reduced /
// normalized dims are a mask (axes({...})); per-lane statistics (max, sum, ...) and reduction
// results are dense row-major over dropAxes(shape, mask), i.e. the kept dims in order.
// Sums accumulate in double (i32: int64, wrapped), as the interpreter does.
//
// Split-dim recipes (group = the subgroup over the mesh axes splitting the dim; counts global):
//   softmax/log_softmax: localMax -> allreduce(max, F32) -> sumExp -> allreduce(sum, F64)
//                        -> softmaxNormalize(max, sum, log)
//   logsumexp:           localMax -> allreduce(max) -> sumExp -> allreduce(sum, F64)
//                        -> logSumExpFinish(max, sum)
//   sum / max / min:     reduce -> allreduce(sum / max / min)
//   mean:                reduce(Mean, ..., meanCount = global count) -> allreduce(sum)
//   layer_norm:          localSum -> allreduce(sum, F64) -> sumSquaredDeviation(sum, count)
//                        -> allreduce(sum, F64) -> layerNormNormalize(sum, sqdev, count, eps)
//   cumsum:              reduce(Sum) over the dim -> allgather(totals)
//                        -> shardPrefix(totals, shard index) -> cumsum(..., offset)
#pragma once

#include "meshrt/kernels/Index.h"

#include <cstdint>

namespace meshrt::kernels {

enum class ReduceKind { Sum, Mean, Max, Min, LogSumExp };

/// out = the reduction of `in` over the dims in `mask`. Mean divides by `meanCount` (0: the
/// local element count of the reduced dims; pass the global count for a split dim). Max/Min
/// propagate nan; an empty reduction gives 0 (Sum/Mean) or -inf/+inf (Max/Min).
void reduce(ReduceKind kind, const float* in, const Dims& shape, AxisMask mask, float* out,
            int64_t meanCount = 0);
/// i32: Sum/Max/Min (wrapping sums); Mean truncates toward zero; LogSumExp is not defined.
void reduce(ReduceKind kind, const int32_t* in, const Dims& shape, AxisMask mask, int32_t* out,
            int64_t meanCount = 0);
/// The general form: `outStrides` over `shape` (0 on exactly the reduced dims) place the result
/// anywhere (e.g. kept dims in another order).
void reduceStrided(ReduceKind kind, const float* in, const Dims& shape, const Dims& outStrides,
                   float* out, int64_t meanCount = 0);

/// The lane max (the first phase of softmax/logsumexp): reduce(Max, ...).
void localMax(const float* in, const Dims& shape, AxisMask mask, float* max);
/// sum over `mask` of exp(x - softmaxShift(max)); `max` is the (allreduced) lane max. Sums
/// are double (allreduce them as F64) so the split result matches the unsplit one closely.
void sumExp(const float* in, const Dims& shape, AxisMask mask, const float* max, double* sum);
/// out[i] = max[i] + log(sum[i]) where max[i] is finite, else max[i] (the interpreter's lse).
void logSumExpFinish(const float* max, const double* sum, float* out, int64_t count);

/// Stable softmax / log_softmax along dim `axis` (in and out dense, same shape; may alias).
void softmax(const float* in, float* out, const Dims& shape, int axis);
void logSoftmax(const float* in, float* out, const Dims& shape, int axis);
/// The last phase: exp(x - shift) / sum, or x - shift - log(sum) when `log` (may alias).
void softmaxNormalize(const float* in, float* out, const Dims& shape, AxisMask mask,
                      const float* max, const double* sum, bool log);

/// (x - mean) / sqrt(var + eps) over the dims in `mask` (biased variance, two passes; may alias).
void layerNorm(const float* in, float* out, const Dims& shape, AxisMask mask, double eps);
/// The lane sums in double (the first phase of a split layer_norm).
void localSum(const float* in, const Dims& shape, AxisMask mask, double* sum);
/// sum over `mask` of (x - sum/count)^2, given the (allreduced) lane sums and global count.
void sumSquaredDeviation(const float* in, const Dims& shape, AxisMask mask, const double* sum,
                         int64_t count, double* sqdev);
/// (x - sum/count) / sqrt(sqdev/count + eps) (may alias).
void layerNormNormalize(const float* in, float* out, const Dims& shape, AxisMask mask,
                        const double* sum, const double* sqdev, int64_t count, double eps);

/// Prefix sums along `axis` (inclusive, or exclusive: the element itself not counted), each
/// lane starting from offset[lane] (dense over the other dims; nullptr: 0).
void cumsum(const float* in, float* out, const Dims& shape, int axis, bool exclusive,
            const float* offset = nullptr);
void cumsum(const int32_t* in, int32_t* out, const Dims& shape, int axis, bool exclusive,
            const int32_t* offset = nullptr);
/// The offset of shard `shardIndex`: the sum of the lane totals of shards 0..shardIndex-1, from
/// `gatheredTotals` (allgather of each shard's `count` lane totals, shard-major).
void shardPrefix(const float* gatheredTotals, int shardIndex, int64_t count, float* offset);
void shardPrefix(const int32_t* gatheredTotals, int shardIndex, int64_t count, int32_t* offset);

} // namespace meshrt::kernels
