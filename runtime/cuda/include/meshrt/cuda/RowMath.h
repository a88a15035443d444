// The per-lane math of meshrt_cuda's reduction, softmax, layer_norm and cumsum kernels, as
// MESHRT_HD functions: the CUDA kernels call them on the device (one thread per lane), and the
// CPU unit tests (tests/cuda/RowMathTest.cpp) call the same bodies on the host against the CPU
// kernels (meshc/GeneratedSupport.h), so the math of every device kernel is tested without a
// GPU. A lane is `count` elements of a row at element offsets `offsets[i]` from `x`.
//
// The numerics follow the CPU kernels: maxima in float, sums and moments in double, rounded
// once to float when written.
#pragma once

#include "meshrt/Random.h" // MESHRT_HD
#include "meshrt/kernels/MathF32.h"
#include "meshrt/kernels/SoftmaxStats.h"

#include <cmath>
#include <cstdint>

namespace meshrt::cuda::row {

enum class ReduceKind : int { Sum = 0, Max = 1, Min = 2, LogSumExp = 3 };

/// The reduce op of one lane (Sum: times `scale`; Max/Min propagate nan; LogSumExp shifted by
/// the lane max, or the max itself when that is not finite).
MESHRT_HD inline float reduceLane(const float* x, const int64_t* offsets, int64_t count,
                                  ReduceKind kind, double scale) {
  double result = 0;
  if (kind == ReduceKind::Sum) {
    for (int64_t i = 0; i < count; ++i)
      result += x[offsets[i]];
    return float(result * scale);
  }
  bool isMin = kind == ReduceKind::Min;
  result = isMin ? INFINITY : -INFINITY;
  for (int64_t i = 0; i < count; ++i) {
    double v = x[offsets[i]];
    if (v != v) {
      result = v;
      break;
    }
    if (isMin ? v < result : v > result) result = v;
  }
  if (kind == ReduceKind::LogSumExp && std::isfinite(result)) {
    double sum = 0;
    for (int64_t i = 0; i < count; ++i)
      sum += std::exp(double(x[offsets[i]]) - result);
    result += std::log(sum);
  }
  return float(result);
}

/// The lane max (float; -inf for an empty lane), as softmax's first pass.
MESHRT_HD inline float laneMax(const float* x, const int64_t* offsets, int64_t count) {
  float max = -INFINITY;
  for (int64_t i = 0; i < count; ++i) {
    float v = x[offsets[i]];
    max = v > max ? v : max; // std::max(max, v): a nan never replaces the running max
  }
  return max;
}

/// The shift softmax subtracts: the max when finite, else 0.
MESHRT_HD inline double softmaxShift(float max) {
  return meshrt::kernels::softmaxShiftOf(max);
}

/// sum of exp(x - shift) over the lane: each exponential in f32 (meshrt::kernels::f32, as the
/// CPU kernel), summed in double.
MESHRT_HD inline double laneSumExp(const float* x, const int64_t* offsets, int64_t count,
                                   double shift) {
  double sum = 0;
  float s = float(shift);
  for (int64_t i = 0; i < count; ++i)
    sum += meshrt::kernels::f32::exp(x[offsets[i]] - s);
  return sum;
}

/// softmax (or log_softmax) of one lane given its max and sum of exponentials.
MESHRT_HD inline void softmaxLane(float* out, const int64_t* outOffsets, const float* x,
                                  const int64_t* offsets, int64_t count, float max, double sum,
                                  bool logSoftmax) {
  float shift = float(softmaxShift(max));
  double logSum = std::log(sum), inverse = 1 / sum;
  for (int64_t i = 0; i < count; ++i) {
    float v = x[offsets[i]];
    out[outOffsets[i]] = logSoftmax ? float(double(v) - double(shift) - logSum)
                                    : float(double(meshrt::kernels::f32::exp(v - shift)) * inverse);
  }
}

/// sum x and sum x^2 of one lane, in double (the split layer_norm's partial moments).
MESHRT_HD inline void laneMoments(const float* x, const int64_t* offsets, int64_t count,
                                  double* sum, double* sumSquares) {
  double s = 0, q = 0;
  for (int64_t i = 0; i < count; ++i) {
    double v = x[offsets[i]];
    s += v;
    q += v * v;
  }
  *sum = s;
  *sumSquares = q;
}

/// layer_norm of a whole lane, two passes (mean, then the centered variance), as the CPU kernel.
MESHRT_HD inline void layerNormLane(float* out, const int64_t* outOffsets, const float* x,
                                    const int64_t* offsets, int64_t count, double globalCount,
                                    double eps) {
  double mean = 0, variance = 0;
  for (int64_t i = 0; i < count; ++i)
    mean += x[offsets[i]];
  mean /= globalCount;
  for (int64_t i = 0; i < count; ++i) {
    double centered = x[offsets[i]] - mean;
    variance += centered * centered;
  }
  variance /= globalCount;
  double scale = 1 / std::sqrt(variance + eps);
  for (int64_t i = 0; i < count; ++i)
    out[outOffsets[i]] = float((x[offsets[i]] - mean) * scale);
}

/// layer_norm of a split lane from the group's summed moments (one pass, clamped variance).
MESHRT_HD inline void layerNormLaneFromMoments(float* out, const int64_t* outOffsets,
                                               const float* x, const int64_t* offsets,
                                               int64_t count, double sum, double sumSquares,
                                               double globalCount, double eps) {
  double mean = sum / globalCount;
  double variance = sumSquares / globalCount - mean * mean;
  if (variance < 0) variance = 0;
  double scale = 1 / std::sqrt(variance + eps);
  for (int64_t i = 0; i < count; ++i)
    out[outOffsets[i]] = float((x[offsets[i]] - mean) * scale);
}

/// The lane total in double (cumsum's carry between split blocks).
MESHRT_HD inline double laneTotal(const float* x, const int64_t* offsets, int64_t count) {
  double total = 0;
  for (int64_t i = 0; i < count; ++i)
    total += x[offsets[i]];
  return total;
}

/// Inclusive or exclusive prefix sums of one lane from `carry` (the lower blocks' total).
MESHRT_HD inline void cumsumLane(float* out, const int64_t* outOffsets, const float* x,
                                 const int64_t* offsets, int64_t count, double carry,
                                 bool exclusive) {
  double sum = carry;
  for (int64_t i = 0; i < count; ++i) {
    double v = x[offsets[i]];
    if (exclusive) {
      out[outOffsets[i]] = float(sum);
      sum += v;
    } else {
      sum += v;
      out[outOffsets[i]] = float(sum);
    }
  }
}

/// Combines a local logsumexp with the group's max and summed exp(local - shift).
MESHRT_HD inline float combineLogSumExp(float groupMax, double sumExp) {
  if (!std::isfinite(groupMax)) return groupMax;
  return float(double(groupMax) + std::log(sumExp));
}

} // namespace meshrt::cuda::row
