// Support for generated code, beside part 4 (SupportRows.h): layer_norm's gradient as one row
// kernel, `layerNormGrad` (the op layer_norm_grad that autodiff emits), with its in-op
// all-reduce when the row is split.
#pragma once

#include "meshc/SupportRows.h"

namespace meshc::gen {

/// layer_norm's gradient of one contiguous row over `count` global elements: with
/// y = (x - mean) r, r = (var + eps)^-1/2, dx = r (ct - mean(ct) - y mean(ct y)). The mean and
/// r as layerNormRow computes them (mean in double kept as two floats, the variance in f32
/// lanes), then the sums of ct and ct y in f32 lanes and one pass writing dx, all in f32: x and
/// ct are read from memory once, the later passes find the row in L1.
inline void layerNormGradRow(float* dx, const float* x, const float* ct, int64_t size, double count,
                             double eps) {
  double mean = detail::sumRun(x, size) / count;
  float meanHigh = float(mean), meanLow = float(mean - double(meanHigh));
  float scale = detail::inverseDeviation(x, size, meanHigh, meanLow, count, eps);
  // The sums of ct and ct y in f32 lanes (sumLanesOf, as the variance; each row is in L1 by now).
  double sumCt = detail::sumLanesOf(size, [ct](int64_t i) { return ct[i]; });
  double sumCtY = detail::sumLanesOf(size, [=](int64_t i) {
    float y = ((x[i] - meanHigh) - meanLow) * scale;
    return ct[i] * y;
  });
  float meanCt = float(sumCt / count), meanCtY = float(sumCtY / count);
  for (int64_t i = 0; i < size; ++i) {
    float y = ((x[i] - meanHigh) - meanLow) * scale;
    dx[i] = ((ct[i] - meanCt) - y * meanCtY) * scale;
  }
}

/// layer_norm_grad of every lane: dx = r (ct - mean(ct) - y mean(ct y)) with y and r of x's lane
/// (layerNormGradRow). Lanes: `outer` sizes at strides `xOuter`/`ctOuter`/`dxOuter`, lane points
/// `lane` at strides `xLane`/`ctLane`/`dxLane`; `globalLaneCount` the lane's global element
/// count. Contiguous lanes (the usual layout: the norm's dims innermost, whole on the rank) run
/// layerNormGradRow, many rows over OpenMP's threads. A lane split over `group` (its ranks hold
/// the other blocks of every lane) sums x, x^2, ct and ct x per row in double and all-reduces
/// the four sums at once (one collective, as the forward's two moments):
/// sum(ct y) = r (sum(ct x) - mean sum(ct)), and the variance from the moments (clamped at 0).
[[gnu::noinline]] inline void layerNormGrad(float* dx, const float* x, const float* ct,
                                            const Shape& outer, const Shape& xOuter,
                                            const Shape& ctOuter, const Shape& dxOuter,
                                            const Shape& lane, const Shape& xLane,
                                            const Shape& ctLane, const Shape& dxLane, double eps,
                                            int64_t globalLaneCount, meshrt::Communicator* group) {
  if (group && group->size() <= 1) group = nullptr; // a group of one splits nothing
  double count = double(globalLaneCount);
  int64_t rows = product(outer), size = product(lane);
  if (!group && detail::denseRun(lane, xLane, 1) && detail::denseRun(lane, ctLane, 1) &&
      detail::denseRun(lane, dxLane, 1)) {
    bool dense = detail::denseRun(outer, xOuter, size) && detail::denseRun(outer, ctOuter, size) &&
                 detail::denseRun(outer, dxOuter, size);
    [[maybe_unused]] bool parallel = rows > 1 && rows * size >= detail::kParallelPoints;
    if (dense) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
      for (int64_t r = 0; r < rows; ++r)
        layerNormGradRow(dx + r * size, x + r * size, ct + r * size, size, count, eps);
      return;
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
    for (int64_t r = 0; r < rows; ++r)
      layerNormGradRow(dx + detail::rowBase(outer, dxOuter, r),
                       x + detail::rowBase(outer, xOuter, r),
                       ct + detail::rowBase(outer, ctOuter, r), size, count, eps);
    return;
  }
  // Strided or split lanes: per row the four sums in double, then dx in double.
  std::vector<int64_t> xBase = offsetsOf(outer, xOuter), ctBase = offsetsOf(outer, ctOuter),
                       dxBase = offsetsOf(outer, dxOuter);
  std::vector<int64_t> xAt = offsetsOf(lane, xLane), ctAt = offsetsOf(lane, ctLane),
                       dxAt = offsetsOf(lane, dxLane);
  std::vector<double> sums(4 * size_t(rows), 0.0); // per row: x, x^2, ct, ct x
  for (size_t r = 0; r < size_t(rows); ++r)
    for (size_t i = 0; i < size_t(size); ++i) {
      double v = x[xBase[r] + xAt[i]], g = ct[ctBase[r] + ctAt[i]];
      sums[4 * r] += v;
      sums[4 * r + 1] += v * v;
      sums[4 * r + 2] += g;
      sums[4 * r + 3] += g * v;
    }
  if (group) group->allReduce(sums.data(), sums.size());
  for (size_t r = 0; r < size_t(rows); ++r) {
    double mean = sums[4 * r] / count;
    double variance = std::max(0.0, sums[4 * r + 1] / count - mean * mean);
    double meanCt = sums[4 * r + 2] / count,
           meanCtCentered = sums[4 * r + 3] / count - mean * meanCt;
    if (!group) { // the lane is here: centered sums, as the interpreter (no cancellation)
      variance = meanCtCentered = 0;
      for (size_t i = 0; i < size_t(size); ++i) {
        double centered = x[xBase[r] + xAt[i]] - mean;
        variance += centered * centered;
        meanCtCentered += ct[ctBase[r] + ctAt[i]] * centered;
      }
      variance /= count;
      meanCtCentered /= count;
    }
    double scale = 1 / std::sqrt(variance + eps), meanCtY = scale * meanCtCentered;
    for (size_t i = 0; i < size_t(size); ++i) {
      double y = (x[xBase[r] + xAt[i]] - mean) * scale;
      dx[dxBase[r] + dxAt[i]] = float(scale * (ct[ctBase[r] + ctAt[i]] - meanCt - y * meanCtY));
    }
  }
}

} // namespace meshc::gen
