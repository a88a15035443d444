// Softmax along a lane split over ranks in one collective: each rank computes its block's max
// and its sum of exp(x - shift(max)), the ranks all-gather these (max, sum) pairs, and every
// rank combines them the same way (same order, so every rank gets the same bits). Two
// all-reduces (the max, then the sum of exp(x - global max)) need the first's result before the
// second can start; one all-gather of the pairs does not.
//
// Shared by the CPU kernel (meshc/GeneratedSupport.h's along) and the CUDA one (MESHRT_HD).
#pragma once

#include "meshrt/HostDevice.h"

#include <cmath>
#include <cstdint>

namespace meshrt::kernels {

/// The shift softmax subtracts for a lane (or block) max: the max when finite, else 0.
MESHRT_HD inline double softmaxShiftOf(float max) {
  return std::isfinite(max) ? double(max) : 0.0;
}

/// Combines one lane's gathered statistics: rank k's max at `gathered[k * stride]` and its sum
/// of exp(x - softmaxShiftOf(its max)) at `gathered[k * stride + 1]`, k < ranks. Writes the
/// lane's max, its sum of exp(x - softmaxShiftOf(lane max)), and `rescale`: what rank `self`'s
/// exponentials are multiplied by to be relative to the lane's shift (1 for the rank holding the
/// max). A block without a finite exponential (sum 0) adds nothing.
MESHRT_HD inline void combineSoftmaxStatistics(const double* gathered, int64_t stride,
                                               int64_t ranks, int64_t self, float* laneMax,
                                               double* laneSum, double* rescale) {
  float max = -INFINITY;
  for (int64_t k = 0; k < ranks; ++k) {
    float blockMax = float(gathered[k * stride]);
    max = blockMax > max ? blockMax : max; // as the lane max: a nan never replaces it
  }
  double shift = softmaxShiftOf(max), sum = 0;
  for (int64_t k = 0; k < ranks; ++k) {
    double blockSum = gathered[k * stride + 1];
    if (blockSum != 0)
      sum += blockSum * std::exp(softmaxShiftOf(float(gathered[k * stride])) - shift);
  }
  *laneMax = max;
  *laneSum = sum;
  *rescale = std::exp(softmaxShiftOf(float(gathered[self * stride])) - shift);
}

} // namespace meshrt::kernels
