// Reductions and along-dims ops. Each is a few passes of one scatter loop: every input element
// updates the statistic of its lane, addressed by strides over the input's shape that are 0 on
// the reduced dims. The unsplit kernels are the split phases run back to back, so a split
// run recombined by collectives computes the same arithmetic.
#include "meshrt/kernels/Reduce.h"

#include "meshrt/kernels/Scalar.h"

#include <cmath>
#include <limits>
#include <vector>

namespace meshrt::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

/// The number of elements of a lane (the product of the reduced dims).
int64_t laneCount(const Dims& shape, const Dims& outStrides) {
  int64_t count = 1;
  for (int d = 0; d < shape.rank; ++d)
    if (outStrides[d] == 0) count *= shape[d];
  return count;
}

/// Elements of the statistics buffer addressed by `outStrides` (its largest offset + 1).
int64_t statCount(const Dims& shape, const Dims& outStrides) {
  int64_t last = 0;
  for (int d = 0; d < shape.rank; ++d) {
    if (shape[d] == 0) return 0;
    last += (shape[d] - 1) * outStrides[d];
  }
  return last + 1;
}

/// fn(x, statIndex) for every element of `in` (dense over `shape`).
template <typename T, typename Fn>
void scatter(const T* in, const Dims& shape, const Dims& outStrides, Fn&& fn) {
  forEachIndex<2>(shape, {rowMajorStrides(shape), outStrides},
                  [&](int64_t i, int64_t o) { fn(in[i], o); });
}

/// out[i] = fn(x, statIndex) for every element (in and out dense over `shape`; may alias).
template <typename Fn>
void transform(const float* in, float* out, const Dims& shape, const Dims& statStrides, Fn&& fn) {
  Dims dense = rowMajorStrides(shape);
  forEachIndex<2>(shape, {dense, statStrides},
                  [&](int64_t i, int64_t o) { out[i] = fn(in[i], o); });
}

/// Visits `in` lane by lane when the reduced dims are trailing (so each lane is contiguous):
/// lane(start, length, statIndex); otherwise element by element: element(x, statIndex).
template <typename T, typename Lane, typename Element>
void visit(const T* in, const Dims& shape, const Dims& outStrides, Lane&& lane, Element&& element) {
  int rank = shape.rank;
  while (rank > 0 && shape[rank - 1] == 1)
    --rank;
  int first = rank;
  int64_t length = 1;
  while (first > 0 && (outStrides[first - 1] == 0 || shape[first - 1] == 1))
    length *= shape[--first];
  if (length <= 1) {
    scatter(in, shape, outStrides, element);
    return;
  }
  Dims dense = rowMajorStrides(shape);
  forEachIndex<2>(Dims(shape.v, first), {Dims(dense.v, first), Dims(outStrides.v, first)},
                  [&](int64_t i, int64_t o) { lane(in + i, length, o); });
}

/// Lane sums with four double accumulators (independent chains, not one long dependency).
template <typename Fn> double laneSum(const float* x, int64_t n, Fn&& term) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += term(x[i]);
    s1 += term(x[i + 1]);
    s2 += term(x[i + 2]);
    s3 += term(x[i + 3]);
  }
  for (; i < n; ++i)
    s0 += term(x[i]);
  return (s0 + s1) + (s2 + s3);
}

void sumInto(const float* in, const Dims& shape, const Dims& outStrides, double* sum) {
  std::fill(sum, sum + statCount(shape, outStrides), 0.0);
  visit(
      in, shape, outStrides,
      [&](const float* x, int64_t n, int64_t o) {
        sum[o] += laneSum(x, n, [](float v) { return double(v); });
      },
      [&](float x, int64_t o) { sum[o] += double(x); });
}

template <bool IsMax> float pick(float a, float b) {
  return IsMax ? maximum(a, b) : minimum(a, b);
}

template <bool IsMax>
void extremeInto(const float* in, const Dims& shape, const Dims& outStrides, float* out) {
  std::fill(out, out + statCount(shape, outStrides), IsMax ? -kInf : kInf);
  visit(
      in, shape, outStrides,
      [&](const float* x, int64_t n, int64_t o) {
        float m0 = out[o], m1 = m0, m2 = m0, m3 = m0;
        int64_t i = 0;
        for (; i + 4 <= n; i += 4) {
          m0 = pick<IsMax>(m0, x[i]);
          m1 = pick<IsMax>(m1, x[i + 1]);
          m2 = pick<IsMax>(m2, x[i + 2]);
          m3 = pick<IsMax>(m3, x[i + 3]);
        }
        for (; i < n; ++i)
          m0 = pick<IsMax>(m0, x[i]);
        out[o] = pick<IsMax>(pick<IsMax>(m0, m1), pick<IsMax>(m2, m3));
      },
      [&](float x, int64_t o) { out[o] = pick<IsMax>(out[o], x); });
}

void extremeInto(const float* in, const Dims& shape, const Dims& outStrides, float* out,
                 bool isMax) {
  if (isMax)
    extremeInto<true>(in, shape, outStrides, out);
  else
    extremeInto<false>(in, shape, outStrides, out);
}

void sumExpInto(const float* in, const Dims& shape, const Dims& outStrides, const float* max,
                double* sum) {
  std::fill(sum, sum + statCount(shape, outStrides), 0.0);
  visit(
      in, shape, outStrides,
      [&](const float* x, int64_t n, int64_t o) {
        float shift = softmaxShift(max[o]);
        sum[o] += laneSum(x, n, [&](float v) { return double(std::exp(v - shift)); });
      },
      [&](float x, int64_t o) { sum[o] += double(std::exp(x - softmaxShift(max[o]))); });
}

/// Per-thread scratch for the statistics of the unsplit kernels.
template <typename T> T* scratch(int64_t count, int slot) {
  thread_local std::vector<T> buffers[2];
  buffers[slot].resize(size_t(count));
  return buffers[slot].data();
}

} // namespace

void reduceStrided(ReduceKind kind, const float* in, const Dims& shape, const Dims& outStrides,
                   float* out, int64_t meanCount) {
  int64_t count = statCount(shape, outStrides);
  switch (kind) {
  case ReduceKind::Sum:
  case ReduceKind::Mean: {
    double* sum = scratch<double>(count, 0);
    sumInto(in, shape, outStrides, sum);
    double divisor = kind == ReduceKind::Mean
                         ? double(meanCount > 0 ? meanCount : laneCount(shape, outStrides))
                         : 1.0;
    for (int64_t i = 0; i < count; ++i)
      out[i] = float(kind == ReduceKind::Mean ? sum[i] / divisor : sum[i]);
    return;
  }
  case ReduceKind::Max:
  case ReduceKind::Min:
    extremeInto(in, shape, outStrides, out, kind == ReduceKind::Max);
    return;
  case ReduceKind::LogSumExp: {
    float* max = scratch<float>(count, 0);
    double* sum = scratch<double>(count, 1);
    extremeInto(in, shape, outStrides, max, true);
    sumExpInto(in, shape, outStrides, max, sum);
    logSumExpFinish(max, sum, out, count);
    return;
  }
  }
}

void reduce(ReduceKind kind, const float* in, const Dims& shape, AxisMask mask, float* out,
            int64_t meanCount) {
  reduceStrided(kind, in, shape, keptStrides(shape, mask), out, meanCount);
}

void reduce(ReduceKind kind, const int32_t* in, const Dims& shape, AxisMask mask, int32_t* out,
            int64_t meanCount) {
  Dims outStrides = keptStrides(shape, mask);
  int64_t count = statCount(shape, outStrides);
  if (kind == ReduceKind::Max || kind == ReduceKind::Min) {
    bool isMax = kind == ReduceKind::Max;
    std::fill(out, out + count,
              isMax ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int32_t>::max());
    if (isMax)
      scatter(in, shape, outStrides, [&](int32_t x, int64_t o) { out[o] = maximum(out[o], x); });
    else
      scatter(in, shape, outStrides, [&](int32_t x, int64_t o) { out[o] = minimum(out[o], x); });
    return;
  }
  std::vector<int64_t> sum(size_t(count), 0);
  scatter(in, shape, outStrides, [&](int32_t x, int64_t o) { sum[size_t(o)] += x; });
  int64_t divisor = meanCount > 0 ? meanCount : laneCount(shape, outStrides);
  for (int64_t i = 0; i < count; ++i)
    out[i] = kind == ReduceKind::Mean ? castToI32(std::trunc(double(sum[i]) / double(divisor)))
                                      : wrapI32(sum[i]);
}

void localMax(const float* in, const Dims& shape, AxisMask mask, float* max) {
  extremeInto(in, shape, keptStrides(shape, mask), max, true);
}

void sumExp(const float* in, const Dims& shape, AxisMask mask, const float* max, double* sum) {
  sumExpInto(in, shape, keptStrides(shape, mask), max, sum);
}

void logSumExpFinish(const float* max, const double* sum, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    out[i] = std::isfinite(max[i]) ? float(double(max[i]) + std::log(sum[i])) : max[i];
}

void softmaxNormalize(const float* in, float* out, const Dims& shape, AxisMask mask,
                      const float* max, const double* sum, bool log) {
  Dims statStrides = keptStrides(shape, mask);
  int64_t count = statCount(shape, statStrides);
  // Per lane: the shift, and 1/sum (softmax) or shift + log(sum) (log_softmax).
  float* shift = scratch<float>(count, 0);
  float* factor = scratch<float>(count, 1);
  for (int64_t i = 0; i < count; ++i) {
    shift[i] = softmaxShift(max[i]);
    factor[i] = log ? float(double(shift[i]) + std::log(sum[i])) : float(1 / sum[i]);
  }
  if (log)
    transform(in, out, shape, statStrides, [&](float x, int64_t o) { return x - factor[o]; });
  else
    transform(in, out, shape, statStrides,
              [&](float x, int64_t o) { return std::exp(x - shift[o]) * factor[o]; });
}

namespace {
void softmaxAlong(const float* in, float* out, const Dims& shape, int axis, bool log) {
  AxisMask mask = kernels::axis(axis);
  int64_t count = dropAxes(shape, mask).product();
  thread_local std::vector<float> max;
  thread_local std::vector<double> sum;
  max.resize(size_t(count));
  sum.resize(size_t(count));
  localMax(in, shape, mask, max.data());
  if (log) {
    sumExp(in, shape, mask, max.data(), sum.data());
    softmaxNormalize(in, out, shape, mask, max.data(), sum.data(), true);
    return;
  }
  // Softmax evaluates exp once: out = exp(x - shift) while summing, then out *= 1 / sum.
  Dims statStrides = keptStrides(shape, mask), dense = rowMajorStrides(shape);
  std::fill(sum.begin(), sum.end(), 0.0);
  for (int64_t i = 0; i < count; ++i)
    max[size_t(i)] = softmaxShift(max[size_t(i)]);
  const float* shift = max.data();
  double* sums = sum.data();
  forEachIndex<2>(shape, {dense, statStrides}, [&](int64_t i, int64_t o) {
    float e = std::exp(in[i] - shift[o]);
    out[i] = e;
    sums[o] += double(e);
  });
  for (int64_t i = 0; i < count; ++i)
    max[size_t(i)] = float(1 / sum[size_t(i)]); // now the lane's scale
  const float* scale = max.data();
  forEachIndex<2>(shape, {dense, statStrides}, [&](int64_t i, int64_t o) { out[i] *= scale[o]; });
}
} // namespace

void softmax(const float* in, float* out, const Dims& shape, int axis) {
  softmaxAlong(in, out, shape, axis, false);
}

void logSoftmax(const float* in, float* out, const Dims& shape, int axis) {
  softmaxAlong(in, out, shape, axis, true);
}

void localSum(const float* in, const Dims& shape, AxisMask mask, double* sum) {
  sumInto(in, shape, keptStrides(shape, mask), sum);
}

void sumSquaredDeviation(const float* in, const Dims& shape, AxisMask mask, const double* sum,
                         int64_t count, double* sqdev) {
  Dims statStrides = keptStrides(shape, mask);
  int64_t stats = statCount(shape, statStrides);
  double* mean = scratch<double>(stats, 0);
  for (int64_t i = 0; i < stats; ++i)
    mean[i] = sum[i] / double(count);
  std::fill(sqdev, sqdev + stats, 0.0);
  visit(
      in, shape, statStrides,
      [&](const float* x, int64_t n, int64_t o) {
        double m = mean[o];
        sqdev[o] += laneSum(x, n, [m](float v) { return (double(v) - m) * (double(v) - m); });
      },
      [&](float x, int64_t o) {
        double deviation = double(x) - mean[o];
        sqdev[o] += deviation * deviation;
      });
}

void layerNormNormalize(const float* in, float* out, const Dims& shape, AxisMask mask,
                        const double* sum, const double* sqdev, int64_t count, double eps) {
  Dims statStrides = keptStrides(shape, mask);
  int64_t stats = statCount(shape, statStrides);
  double* mean = scratch<double>(stats, 0);
  double* scale = scratch<double>(stats, 1);
  for (int64_t i = 0; i < stats; ++i) {
    mean[i] = sum[i] / double(count);
    scale[i] = 1 / std::sqrt(sqdev[i] / double(count) + eps);
  }
  transform(in, out, shape, statStrides,
            [&](float x, int64_t o) { return float((double(x) - mean[o]) * scale[o]); });
}

void layerNorm(const float* in, float* out, const Dims& shape, AxisMask mask, double eps) {
  int64_t stats = dropAxes(shape, mask).product();
  int64_t count = shape.product() / (stats > 0 ? stats : 1);
  thread_local std::vector<double> sum, sqdev;
  sum.resize(size_t(stats));
  sqdev.resize(size_t(stats));
  localSum(in, shape, mask, sum.data());
  sumSquaredDeviation(in, shape, mask, sum.data(), count, sqdev.data());
  layerNormNormalize(in, out, shape, mask, sum.data(), sqdev.data(), count, eps);
}

namespace {
template <typename T, typename Acc, typename Finish>
void cumsumAlong(const T* in, T* out, const Dims& shape, int axis, bool exclusive, const T* offset,
                 Finish finish) {
  int64_t outer = 1, inner = 1, length = shape[axis];
  for (int d = 0; d < axis; ++d)
    outer *= shape[d];
  for (int d = axis + 1; d < shape.rank; ++d)
    inner *= shape[d];
  std::vector<Acc> running(static_cast<size_t>(inner));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i)
      running[size_t(i)] = offset ? Acc(offset[o * inner + i]) : Acc(0);
    for (int64_t j = 0; j < length; ++j) {
      int64_t base = (o * length + j) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        Acc x = Acc(in[base + i]);
        if (exclusive) {
          out[base + i] = finish(running[size_t(i)]);
          running[size_t(i)] += x;
        } else {
          running[size_t(i)] += x;
          out[base + i] = finish(running[size_t(i)]);
        }
      }
    }
  }
}
} // namespace

void cumsum(const float* in, float* out, const Dims& shape, int axis, bool exclusive,
            const float* offset) {
  cumsumAlong<float, double>(in, out, shape, axis, exclusive, offset,
                             [](double x) { return float(x); });
}

void cumsum(const int32_t* in, int32_t* out, const Dims& shape, int axis, bool exclusive,
            const int32_t* offset) {
  cumsumAlong<int32_t, int64_t>(in, out, shape, axis, exclusive, offset,
                                [](int64_t x) { return wrapI32(x); });
}

void shardPrefix(const float* gatheredTotals, int shardIndex, int64_t count, float* offset) {
  for (int64_t i = 0; i < count; ++i) {
    double sum = 0;
    for (int shard = 0; shard < shardIndex; ++shard)
      sum += double(gatheredTotals[shard * count + i]);
    offset[i] = float(sum);
  }
}

void shardPrefix(const int32_t* gatheredTotals, int shardIndex, int64_t count, int32_t* offset) {
  for (int64_t i = 0; i < count; ++i) {
    int64_t sum = 0;
    for (int shard = 0; shard < shardIndex; ++shard)
      sum += gatheredTotals[shard * count + i];
    offset[i] = wrapI32(sum);
  }
}

} // namespace meshrt::kernels
