// Support for generated code, part 4 of 5 (meshc/GeneratedSupport.h includes them in order):
// reductions and the ops along a dim (softmax, log_softmax, layer_norm and their fused row
// kernels, cumsum, shift), with their in-op collectives when the dim is split.
#pragma once

#include "meshc/SupportEinsum.h"

namespace meshc::gen {

//===------------------------------------------------------------------------------------------===//
// Reductions
//===------------------------------------------------------------------------------------------===//

enum class Reduce { Sum, Max, Min, LogSumExp };

/// out[o] = reduce over the lane (sizes `lane`, strides `laneStrides` in `in`) at the operand
/// offset `inOuter` of o; Sum is multiplied by `scale` (mean: 1 / global count).
namespace detail {

/// Whether `strides` walk `sizes` as one dense row-major run (dims of size 1 aside) whose
/// elements are `unit` apart.
inline bool denseRun(const Shape& sizes, const Shape& strides, int64_t unit) {
  int64_t expected = unit;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

/// The sum of termAt(i) for i in [0, count), in double: eight independent accumulators, so that
/// the compiler vectorizes the loop without reassociating one sum.
template <class TermAt> inline double sumRunOf(int64_t count, TermAt termAt) {
  double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= count; i += 8)
    for (int j = 0; j < 8; ++j)
      partial[j] += termAt(i + j);
  for (; i < count; ++i)
    partial[i % 8] += termAt(i);
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7]));
}

/// The sum of term(x[i]) over a run of `count` floats, in sumRunOf's order.
template <class Term> inline double sumRun(const float* x, int64_t count, Term term) {
  return sumRunOf(count, [&](int64_t i) { return term(x[i]); });
}

inline double sumRun(const float* x, int64_t count) {
  return sumRun(x, count, [](float v) { return double(v); });
}

/// The sum of e^(x - max) over a run: f32 exponentials summed in double.
inline double sumExpRun(const float* x, int64_t count, float max) {
  return sumRun(x, count, [max](float v) { return double(meshrt::kernels::f32::exp(v - max)); });
}

/// The sum of termAt(i) over [0, count) at f32 speed: sixteen f32 lanes (one vector) summed over
/// blocks of 256 elements, each block's lanes then added in double. A lane adds at most 16 terms
/// before its sum goes to double, so the error is at most ~16 u of the terms' magnitudes (u =
/// 2^-24), inside the f32 rtol of docs/architecture.md (1024 u) however long the run.
template <class TermAt> inline double sumLanesOf(int64_t count, TermAt termAt) {
  constexpr int64_t kBlock = 256;
  double total = 0;
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    int64_t end = std::min(count, begin + kBlock), i = begin;
    float partial[16] = {};
    for (; i + 16 <= end; i += 16)
      for (int j = 0; j < 16; ++j)
        partial[j] += termAt(i + j);
    for (; i < end; ++i)
      partial[0] += termAt(i);
    double block = 0;
    for (int j = 0; j < 16; ++j)
      block += double(partial[j]);
    total += block;
  }
  return total;
}

/// sumLanesOf over term(x[i]).
template <class Term> inline double sumLanes(const float* x, int64_t count, Term term) {
  return sumLanesOf(count, [&](int64_t i) { return term(x[i]); });
}

/// The largest of a run, sixteen lanes at a time; NaNs are passed over, as std::max(max, x)
/// passes them.
inline float maxRun(const float* x, int64_t count) {
  float partial[16];
  std::fill(partial, partial + 16, -INFINITY);
  int64_t i = 0;
#if defined(__AVX512F__) && !defined(__CUDACC__)
  // One 16-lane vector (GCC's vector extension; lane j takes the elements i + j as below, so
  // the result is the same): GCC does not vectorize the loop below (a conditional on floats is
  // no MAX_EXPR without -ffinite-math-only), which ran scalar at 0.27 ns per element, a fifth
  // of a 128-key softmax row's time. Only with AVX-512: for SSE2 or AVX2 GCC lowers a 64-byte
  // vector's conditional to ~7x slower code than the scalar loop.
  using Float16 = float __attribute__((vector_size(64)));
  Float16 lanes;
  std::memcpy(&lanes, partial, sizeof lanes);
  for (; i + 16 <= count; i += 16) {
    Float16 v;
    std::memcpy(&v, x + i, sizeof v);
    lanes = v > lanes ? v : lanes;
  }
  std::memcpy(partial, &lanes, sizeof partial);
#elif defined(__AVX2__) && !defined(__CUDACC__)
  // The same with two 8-lane vectors (lanes j and j + 8), AVX2's own width: 0.27 ns an element
  // scalar, a seventh of a causal attention row's softmax on an AVX2 core.
  using Float8 = float __attribute__((vector_size(32)));
  Float8 low, high;
  std::memcpy(&low, partial, sizeof low);
  std::memcpy(&high, partial + 8, sizeof high);
  for (; i + 16 <= count; i += 16) {
    Float8 v, w;
    std::memcpy(&v, x + i, sizeof v);
    std::memcpy(&w, x + i + 8, sizeof w);
    low = v > low ? v : low;
    high = w > high ? w : high;
  }
  std::memcpy(partial, &low, sizeof low);
  std::memcpy(partial + 8, &high, sizeof high);
#endif
  for (; i + 16 <= count; i += 16)
    for (int j = 0; j < 16; ++j)
      partial[j] = x[i + j] > partial[j] ? x[i + j] : partial[j];
  for (; i < count; ++i)
    partial[0] = x[i] > partial[0] ? x[i] : partial[0];
  float max = partial[0];
  for (int j = 1; j < 16; ++j)
    max = partial[j] > max ? partial[j] : max;
  return max;
}

/// where(mask != 0, x, fill) into y (y may be x), mask element i at m[i * maskLane], and the
/// largest of y as maxRun finds it (maxRun(y, count)'s value: a max takes any order), in one
/// pass where the mask is contiguous (causal attention's rows: a quarter of their softmax's
/// time went to reading the row back for the max).
inline float maskedMaxRun(float* y, const float* x, const float* m, int64_t count,
                          int64_t maskLane, float fill) {
  int64_t i = 0;
  float max = -INFINITY;
#if defined(__AVX512F__) && !defined(__CUDACC__)
  if (maskLane == 1) {
    using Float16 = float __attribute__((vector_size(64)));
    Float16 lanes, fills;
    for (int j = 0; j < 16; ++j)
      lanes[j] = -INFINITY, fills[j] = fill;
    for (; i + 16 <= count; i += 16) {
      Float16 v, k;
      std::memcpy(&v, x + i, sizeof v);
      std::memcpy(&k, m + i, sizeof k);
      v = k != 0 ? v : fills;
      std::memcpy(y + i, &v, sizeof v);
      lanes = v > lanes ? v : lanes;
    }
    for (int j = 0; j < 16; ++j)
      max = lanes[j] > max ? lanes[j] : max;
  }
#endif
  if (i == count) return max;
  for (int64_t tail = i; tail < count; ++tail)
    y[tail] = m[tail * maskLane] != 0 ? x[tail] : fill;
  float rest = maxRun(y + i, count - i);
  return rest > max ? rest : max;
}

/// y[i] = e^(x[i] - max) (f32 exp; y may be x) and their sum in sumLanes' order, in one pass:
/// the sum sumLanes(y, count) would give.
inline double expSumRun(float* y, const float* x, int64_t count, float max) {
  return sumLanesOf(count,
                    [&](int64_t i) { return y[i] = meshrt::kernels::f32::exp(x[i] - max); });
}

/// The largest element of runs of `count` elements at `starts` from `x`, or a NaN if any is
/// one (the reduction's max propagates NaNs, which maxRun passes over).
inline float maxOfRuns(const float* x, const std::vector<int64_t>& starts, int64_t count) {
  float max = -INFINITY;
  bool nan = false;
  for (int64_t start : starts) {
    const float* run = x + start;
    float runMax = maxRun(run, count);
    max = runMax > max ? runMax : max;
    for (int64_t i = 0; i < count; ++i)
      nan |= run[i] != run[i];
  }
  return nan ? NAN : max;
}

/// Points from which a reduction or a row op is split over OpenMP's threads.
constexpr int64_t kParallelPoints = 1 << 15;

/// Whether the lanes of a cumsum (`outer` sizes at `outerStrides`, one lane dim of `length` at
/// `laneStride`) tile one dense row-major box: then the dims above the lane form `above` blocks
/// and those below it one dense run of `inner` (= laneStride) elements.
inline bool cumsumBox(const Shape& outer, const Shape& outerStrides, int64_t length,
                      int64_t laneStride, int64_t& above, int64_t& inner) {
  std::vector<std::pair<int64_t, int64_t>> dims; // (stride, size), sizes > 1
  for (size_t d = 0; d < outer.size(); ++d)
    if (outer[d] != 1) dims.emplace_back(outerStrides[d], outer[d]);
  if (length != 1) dims.emplace_back(laneStride, length);
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (auto [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  inner = length == 1 ? expected : laneStride;
  above = expected / (inner * length);
  return true;
}
} // namespace detail

inline void reduce(float* out, const Shape& outSizes, const float* in, const Shape& inOuter,
                   const Shape& lane, const Shape& laneStrides, Reduce kind, double scale) {
  // The common sums without index tables: a mean over the last dims (each output a dense run of
  // the operand), and a bias gradient (the lane is the outer dims, the outputs one dense row).
  int64_t laneCount = product(lane), outCount = product(outSizes);
  // Outputs are independent: large sums are split over OpenMP's threads (one unless the
  // caller asks for more), each output summed in the same order either way.
  [[maybe_unused]] bool parallel = outCount > 1 && laneCount * outCount >= detail::kParallelPoints;
  if (kind == Reduce::Sum && detail::denseRun(lane, laneStrides, 1) &&
      detail::denseRun(outSizes, inOuter, laneCount)) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
    for (int64_t o = 0; o < outCount; ++o)
      out[o] = float(detail::sumRun(in + o * laneCount, laneCount) * scale);
    return;
  }
  if (kind == Reduce::Sum && detail::denseRun(outSizes, inOuter, 1) &&
      detail::denseRun(lane, laneStrides, outCount)) {
    // A block of columns per thread (one pass over the rows each), its sums on the stack.
    constexpr int64_t kMaxBlock = 2048;
    int64_t threads = 1;
#ifdef _OPENMP
    if (parallel) threads = omp_get_max_threads();
#endif
    int64_t block = std::min(kMaxBlock, (outCount + threads - 1) / threads);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
    for (int64_t first = 0; first < outCount; first += block) {
      int64_t count = std::min(block, outCount - first);
      double sums[kMaxBlock];
      std::fill(sums, sums + count, 0.0);
      for (int64_t row = 0; row < laneCount; ++row) {
        const float* x = in + row * outCount + first;
        for (int64_t o = 0; o < count; ++o)
          sums[o] += double(x[o]);
      }
      for (int64_t o = 0; o < count; ++o)
        out[first + o] = float(sums[o] * scale);
    }
    return;
  }
  // A sum over one middle dim of a dense box whose outputs keep the box's order (a cumsum's
  // gradient, performer.mesh:87: out[a, i] = sum_j in[a, j, i]): a lane position at a time over
  // the contiguous run of outputs below it, each output summed in the same order as below.
  int64_t above = 0, inner = 0;
  if (kind == Reduce::Sum && lane.size() == 1 && std::is_sorted(inOuter.rbegin(), inOuter.rend()) &&
      detail::cumsumBox(outSizes, inOuter, lane[0], laneStrides[0], above, inner)) {
    thread_local std::vector<double> sums;
    for (int64_t a = 0; a < above; ++a) {
      sums.assign(size_t(inner), 0.0);
      for (int64_t j = 0; j < lane[0]; ++j) {
        const float* x = in + (a * lane[0] + j) * inner;
        for (int64_t i = 0; i < inner; ++i)
          sums[size_t(i)] += double(x[i]);
      }
      for (int64_t i = 0; i < inner; ++i)
        out[a * inner + i] = float(sums[size_t(i)] * scale);
    }
    return;
  }
  std::vector<int64_t> offsets = offsetsOf(lane, laneStrides);
  if (kind == Reduce::Sum) {
    // Sums in double, in memory order: when the lane is the inner run, each output sums its own
    // contiguous run (four accumulators); otherwise (a bias gradient: the lane is the outer
    // dims) every lane point adds its row of outputs, walking the operand once.
    std::vector<int64_t> bases = offsetsOf(outSizes, inOuter);
    bool innerLane =
        !laneStrides.empty() && laneStrides.back() == 1 && (inOuter.empty() || inOuter.back() != 1);
    if (innerLane) {
      for (size_t o = 0; o < bases.size(); ++o) {
        const float* x = in + bases[o];
        double partial[4] = {0, 0, 0, 0};
        size_t i = 0;
        for (; i + 4 <= offsets.size(); i += 4)
          for (size_t j = 0; j < 4; ++j)
            partial[j] += x[offsets[i + j]];
        for (; i < offsets.size(); ++i)
          partial[0] += x[offsets[i]];
        out[o] = float((partial[0] + partial[1] + partial[2] + partial[3]) * scale);
      }
      return;
    }
    std::vector<double> sums(bases.size(), 0.0);
    for (int64_t offset : offsets) {
      const float* x = in + offset;
      for (size_t o = 0; o < bases.size(); ++o)
        sums[o] += x[bases[o]];
    }
    for (size_t o = 0; o < bases.size(); ++o)
      out[o] = float(sums[o] * scale);
    return;
  }
  if (kind == Reduce::Max && !lane.empty() && laneStrides.back() == 1) {
    // A max over lanes whose last dim is one contiguous run: maxRun's lanes per run (one
    // compare after another through the offsets table took 0.5-0.7 ns an element, performer's
    // max over features and over (seq, features)).
    std::vector<int64_t> runs = offsetsOf(Shape(lane.begin(), lane.end() - 1),
                                          Shape(laneStrides.begin(), laneStrides.end() - 1));
    forEach<2>(outSizes, {rowMajorStrides(outSizes), inOuter}, {0, 0},
               [&](const std::array<int64_t, 2>& at) {
                 out[at[0]] = detail::maxOfRuns(in + at[1], runs, lane.back());
               });
    return;
  }
  forEach<2>(outSizes, {rowMajorStrides(outSizes), inOuter}, {0, 0},
             [&](const std::array<int64_t, 2>& at) {
               const float* x = in + at[1];
               bool isMin = kind == Reduce::Min;
               double result = isMin ? INFINITY : -INFINITY;
               for (int64_t offset : offsets) {
                 double v = x[offset];
                 if (std::isnan(v) || (isMin ? v < result : v > result)) result = v;
                 if (std::isnan(v)) break;
               }
               if (kind == Reduce::LogSumExp && std::isfinite(result)) {
                 double sum = 0;
                 for (int64_t offset : offsets)
                   sum += meshrt::kernels::f32::exp(float(double(x[offset]) - result));
                 result += std::log(sum);
               }
               out[at[0]] = float(result);
             });
}

/// logsumexp over dims split over `group`: combines the ranks' local logsumexps in place.
inline void combineLogSumExp(View local, meshrt::Communicator& group) {
  Buffer maxima(local.begin(), local.end());
  group.allReduce(maxima.data(), maxima.size(), meshrt::ReduceOp::Max);
  std::vector<double> sums(local.size());
  for (size_t i = 0; i < local.size(); ++i) {
    double shift = std::isfinite(maxima[i]) ? maxima[i] : 0.0;
    sums[i] = std::exp(double(local[i]) - shift);
  }
  group.allReduce(sums.data(), sums.size());
  for (size_t i = 0; i < local.size(); ++i) {
    double shift = std::isfinite(maxima[i]) ? maxima[i] : 0.0;
    local[i] = std::isfinite(maxima[i]) ? float(shift + std::log(sums[i])) : maxima[i];
  }
}

//===------------------------------------------------------------------------------------------===//
// Ops along dims (softmax, log_softmax, layer_norm, cumsum, shift); `group` non-null when the
// lane is split (its ranks hold the other blocks of every lane, in block order)
//===------------------------------------------------------------------------------------------===//

enum class Along { Softmax, LogSoftmax, LayerNorm, Cumsum, CumsumExclusive };

/// The element offset of row r of a set of lanes: r * stride for rows one dense run apart (no
/// table), else from the table of offsets.
struct RowBase {
  int64_t stride = 0;
  const std::vector<int64_t>* table = nullptr;
  int64_t operator()(int64_t r) const { return table ? (*table)[size_t(r)] : r * stride; }
};

/// softmaxRow once the row's largest element is known (as maxRun finds it): e^(x - max) into y
/// with their sum in f32 lanes (sumLanes' error bound; each term is at most 1), in one pass,
/// then one f32 scale.
inline void softmaxRowWithMax(float* y, const float* x, int64_t size, float max) {
  if (!std::isfinite(max)) max = 0.0f;
  double sum = detail::expSumRun(y, x, size, max);
  float inverse = float(1 / sum);
  for (int64_t i = 0; i < size; ++i)
    y[i] = y[i] * inverse;
}

/// Softmax of one contiguous row (y may be x).
inline void softmaxRow(float* y, const float* x, int64_t size) {
  softmaxRowWithMax(y, x, size, detail::maxRun(x, size));
}

namespace detail {

/// 1 / sqrt(variance + eps) of a row whose mean is meanHigh + meanLow: the centered second
/// moment in f32 lanes (sumLanes: its terms are the deviations themselves), then one f32 scale.
inline float inverseDeviation(const float* x, int64_t size, float meanHigh, float meanLow,
                              double count, double eps) {
  double variance = sumLanes(x, size,
                             [meanHigh, meanLow](float v) {
                               float centered = (v - meanHigh) - meanLow;
                               return centered * centered;
                             }) /
                    count;
  return float(1 / std::sqrt(variance + eps));
}

} // namespace detail

/// Layer norm (without gain and bias) of one contiguous row over `count` global elements: the
/// mean summed in double (a row far from zero would lose its deviations to an f32 sum), kept as
/// two floats so that x - mean loses nothing to its rounding; then the inverse deviation.
inline void layerNormRow(float* y, const float* x, int64_t size, double count, double eps) {
  double mean = detail::sumRun(x, size) / count;
  float meanHigh = float(mean), meanLow = float(mean - double(meanHigh));
  float scale = detail::inverseDeviation(x, size, meanHigh, meanLow, count, eps);
  for (int64_t i = 0; i < size; ++i)
    y[i] = ((x[i] - meanHigh) - meanLow) * scale;
}

namespace detail {

/// layerNormRow of a row whose mean is given, times `gain` plus `bias` in the same pass as the
/// normalization (the same f32 operations as layerNormRow and then the affine loop).
inline void layerNormAffineRow(float* y, const float* x, int64_t size, double mean, double count,
                               double eps, const float* gain, const float* bias) {
  float meanHigh = float(mean), meanLow = float(mean - double(meanHigh));
  float scale = inverseDeviation(x, size, meanHigh, meanLow, count, eps);
  for (int64_t i = 0; i < size; ++i) {
    float normalized = ((x[i] - meanHigh) - meanLow) * scale;
    float scaled = normalized * gain[i];
    y[i] = scaled + bias[i];
  }
}

} // namespace detail

/// along() over whole rows of `size` contiguous elements starting at each base, one row kernel
/// per kind (softmaxRow, layerNormRow; log_softmax's sums of exponentials in double).
inline void alongContiguous(float* out, const float* in, int64_t rows, const RowBase& inBase,
                            const RowBase& outBase, int64_t size, Along kind, double eps,
                            int64_t globalLaneCount) {
  // Rows are independent: many are split over OpenMP's threads (one unless asked for more).
  [[maybe_unused]] bool parallel = rows > 1 && rows * size >= detail::kParallelPoints;
  switch (kind) {
  case Along::LayerNorm:
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
    for (int64_t r = 0; r < rows; ++r)
      layerNormRow(out + outBase(r), in + inBase(r), size, double(globalLaneCount), eps);
    return;
  case Along::Softmax:
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
    for (int64_t r = 0; r < rows; ++r)
      softmaxRow(out + outBase(r), in + inBase(r), size);
    return;
  case Along::LogSoftmax:
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = in + inBase(r);
      float* y = out + outBase(r);
      float max = detail::maxRun(x, size);
      if (!std::isfinite(max)) max = 0.0f;
      double logSum = std::log(detail::sumExpRun(x, size, max));
      for (int64_t i = 0; i < size; ++i)
        y[i] = float(double(x[i]) - max - logSum);
    }
    return;
  case Along::Cumsum:
  case Along::CumsumExclusive:
    break;
  }
  throw std::logic_error("alongContiguous: not a row kernel");
}

/// layer_norm of `rows` rows of `size` contiguous elements, one row apart, times `gain` plus
/// `bias` along the row: along(LayerNorm) and the `y * gain + bias` loop after it
/// (fuse-row-kernels), each row finished while it is in L1 instead of a second pass over memory.
/// Not inlined (nor maskedSoftmax): with the generated call's literal sizes propagated into the
/// row kernels' tail loops GCC 12 warns of impossible iterations (-Waggressive-loop-optimizations).
[[gnu::noinline]] inline void layerNormAffine(float* out, const float* in, int64_t rows,
                                              int64_t size, const float* gain, const float* bias,
                                              double eps, int64_t globalLaneCount) {
  [[maybe_unused]] bool parallel = rows > 1 && rows * size >= detail::kParallelPoints;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * size;
    double count = double(globalLaneCount);
    detail::layerNormAffineRow(out + r * size, x, size, detail::sumRun(x, size) / count, count, eps,
                               gain, bias);
  }
}

namespace detail {
/// The offset of row r of the row kernels: r's index over `outer` (row-major) times `strides`.
inline int64_t rowBase(const Shape& outer, const Shape& strides, int64_t r) {
  int64_t base = 0;
  for (size_t d = outer.size(), rest = size_t(r); d-- > 0;) {
    base += int64_t(rest % size_t(outer[d])) * strides[d];
    rest /= size_t(outer[d]);
  }
  return base;
}
/// Row r's index along outer dim `dim`.
inline int64_t outerIndex(const Shape& outer, int64_t r, size_t dim) {
  size_t rest = size_t(r);
  for (size_t d = outer.size() - 1; d > dim; --d)
    rest /= size_t(outer[d]);
  return int64_t(rest % size_t(outer[dim]));
}
} // namespace detail

/// sum = t0 + t1, or t0 + (t1 + t2) when t2 is not null, over rows of `size` contiguous elements
/// (`sum` and `out` dense, one row apart; term k's row r starts at r's index over `outer` times
/// `tkOuter`: dense, or broadcast where a stride is 0), stored; then layerNormAffine of each
/// row of the sum into `out` while the row is in L1 (fuse-row-kernels: the residual add before
/// a pre-norm layer's norm was a loop, a second pass over memory, of its own). The terms are
/// added in the loop's order, so `sum` is what the loop stored.
[[gnu::noinline]] inline void addLayerNormAffine(float* out, float* sum, const Shape& outer,
                                                 int64_t size, const float* gain, const float* bias,
                                                 double eps, int64_t globalLaneCount,
                                                 const float* t0, const Shape& t0Outer,
                                                 const float* t1, const Shape& t1Outer,
                                                 const float* t2, const Shape& t2Outer) {
  int64_t rows = product(outer);
  [[maybe_unused]] bool parallel = rows > 1 && rows * size >= detail::kParallelPoints;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    int64_t base0 = detail::rowBase(outer, t0Outer, r), base1 = detail::rowBase(outer, t1Outer, r);
    int64_t base2 = t2 ? detail::rowBase(outer, t2Outer, r) : 0;
    float* __restrict x = sum + r * size;
    const float* __restrict a = t0 + base0;
    const float* __restrict b = t1 + base1;
    // The sum, stored and summed for the mean in the same pass: sumRun's eight double
    // accumulators in its order, so the mean is layerNormRow's to the bit.
    double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    auto addRow = [&](auto term) {
      int64_t i = 0;
      for (; i + 8 <= size; i += 8)
        for (int j = 0; j < 8; ++j) {
          float v = term(i + j);
          x[i + j] = v;
          partial[j] += double(v);
        }
      for (; i < size; ++i) {
        float v = term(i);
        x[i] = v;
        partial[i % 8] += double(v);
      }
    };
    if (t2) {
      const float* __restrict c = t2 + base2;
      addRow([&](int64_t i) { return a[i] + (b[i] + c[i]); });
    } else {
      addRow([&](int64_t i) { return a[i] + b[i]; });
    }
    double mean = (((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                   ((partial[4] + partial[5]) + (partial[6] + partial[7]))) /
                  double(globalLaneCount);
    detail::layerNormAffineRow(out + r * size, x, size, mean, double(globalLaneCount), eps, gain,
                               bias);
  }
}

/// out[r] = scale * the sum over row r of float(a[i] * b[i]), rows of `size` contiguous elements
/// (row r of a and b at r's index over `outer` times `aOuter`, `bOuter`; out dense): a loop
/// storing the products and reduce's dense-run sum of them, fused (fuse-row-kernels: softmax's
/// gradient sums dy * y along the row, the loss logp * one_hot). Each product is rounded to f32,
/// as the loop stored it, and summed in sumRun's order: the two statements' values to the bit,
/// without the products' buffer (written once and read once, as large as the operands).
[[gnu::noinline]] inline void reduceProduct(float* out, const Shape& outer, int64_t size,
                                            const float* a, const Shape& aOuter, const float* b,
                                            const Shape& bOuter, double scale) {
  int64_t rows = product(outer);
  [[maybe_unused]] bool parallel = rows > 1 && rows * size >= detail::kParallelPoints;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict x = a + detail::rowBase(outer, aOuter, r);
    const float* __restrict y = b + detail::rowBase(outer, bOuter, r);
    out[r] = float(detail::sumRunOf(size, [&](int64_t i) { return double(x[i] * y[i]); }) * scale);
  }
}

/// softmax of where(mask != 0, in, fill) over rows of `size` contiguous elements, one row apart
/// (`in` and `out`), the rows indexed by `outer`: the mask loop and along(Softmax) after it
/// (fuse-row-kernels). Mask row r starts at r's index over `outer` times `maskOuter`, its
/// elements `maskLane` apart (0: one value for the row).
[[gnu::noinline]] inline void maskedSoftmax(float* out, const float* in, const float* mask,
                                            const Shape& outer, const Shape& maskOuter,
                                            int64_t size, int64_t maskLane, float fill) {
  int64_t rows = product(outer);
  [[maybe_unused]] bool parallel = rows > 1 && rows * size >= detail::kParallelPoints;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    int64_t maskBase = detail::rowBase(outer, maskOuter, r);
    const float* x = in + r * size;
    const float* m = mask + maskBase;
    float* y = out + r * size;
    softmaxRowWithMax(y, y, size, detail::maskedMaxRun(y, x, m, size, maskLane, fill));
  }
}

/// maskedSoftmax of causal attention's scores, over the keys a row can see: the mask is known
/// zero (causal-attention-blocks proved it) wherever the key position, the lane, exceeds the
/// query position, the index of outer dim `queryDim`. Row q reads its scores and mask over the
/// keys [0, q] rounded up to 16 (the prefix; where(mask, x, fill) is fill past it whatever x
/// is, so the scores there are never read and need not be written) and writes zeros past it
/// when e^(fill - max) is 0 in f32 (fill - max < -104: with fill -1e9, any row with a finite
/// unmasked score): then every term past the prefix was an exact 0 in the whole row's max,
/// exponentials, sum (adding 0 to sumLanes' lanes changes no bit) and scaling, so the values are
/// maskedSoftmax's to the bit. Otherwise (a wholly masked row, a fill near the scores) the row
/// is maskedSoftmax's, its tail the fill. Causal attention's rows see half their keys on average.
[[gnu::noinline]] inline void causalMaskedSoftmax(float* out, const float* in, const float* mask,
                                                  const Shape& outer, const Shape& maskOuter,
                                                  int64_t size, int64_t maskLane, float fill,
                                                  int64_t queryDim) {
  int64_t rows = product(outer);
  [[maybe_unused]] bool parallel = rows > 1 && rows * size >= detail::kParallelPoints;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    int64_t maskBase = detail::rowBase(outer, maskOuter, r);
    int64_t query = detail::outerIndex(outer, r, size_t(queryDim));
    const float* x = in + r * size;
    const float* m = mask + maskBase;
    float* y = out + r * size;
    // A multiple of sumLanes' 16 lanes, so that the prefix's terms take the lanes they take in
    // the whole row.
    int64_t prefix = std::min(size, (query + 16) / 16 * 16);
    float max = detail::maskedMaxRun(y, x, m, prefix, maskLane, fill);
    if (prefix < size) max = fill > max ? fill : max;
    if (!std::isfinite(max)) max = 0.0f;
    if (prefix < size && meshrt::kernels::f32::exp(fill - max) != 0.0f) {
      for (int64_t i = prefix; i < size; ++i)
        y[i] = fill;
      softmaxRow(y, y, size);
      continue;
    }
    double sum = detail::expSumRun(y, y, prefix, max);
    float inverse = float(1 / sum);
    for (int64_t i = 0; i < prefix; ++i)
      y[i] = y[i] * inverse;
    for (int64_t i = prefix; i < size; ++i)
      y[i] = 0.0f * inverse; // e^(fill - max) = 0, scaled: 0, or NaN where the sum is
  }
}

namespace detail {
/// Cumsum of the lanes of a dense [above, length, inner] box, in double as the generic path
/// (each lane summed in the same order, so the same values): a lane position at a time over
/// `inner` neighbouring lanes, a contiguous run the compiler vectorizes. The generic path
/// walked one lane at a time, `inner` floats apart: with performer's lanes 8 KiB apart every
/// element touched another page (12.8 ns per element, 13 of its 15 ms per step).
inline void cumsumBox(float* out, const float* in, int64_t above, int64_t length, int64_t inner,
                      bool exclusive, meshrt::Communicator* group) {
  size_t lanes = size_t(above * inner);
  thread_local std::vector<double> carry;
  carry.assign(lanes, 0.0);
  if (group) {
    // The lanes' totals, then the sum of the lower blocks' (the ranks before this one).
    thread_local std::vector<double> totals, all;
    totals.assign(lanes, 0.0);
    for (int64_t a = 0; a < above; ++a)
      for (int64_t j = 0; j < length; ++j) {
        const float* x = in + (a * length + j) * inner;
        double* total = totals.data() + a * inner;
        for (int64_t i = 0; i < inner; ++i)
          total[i] += x[i];
      }
    all.resize(lanes * size_t(group->size()));
    group->allGather(totals.data(), all.data(), lanes);
    for (int peer = 0; peer < group->rank(); ++peer)
      for (size_t r = 0; r < lanes; ++r)
        carry[r] += all[size_t(peer) * lanes + r];
  }
  for (int64_t a = 0; a < above; ++a) {
    double* sum = carry.data() + a * inner;
    for (int64_t j = 0; j < length; ++j) {
      const float* x = in + (a * length + j) * inner;
      float* y = out + (a * length + j) * inner;
      if (exclusive) {
        for (int64_t i = 0; i < inner; ++i) {
          double value = x[i];
          y[i] = float(sum[i]);
          sum[i] += value;
        }
      } else {
        for (int64_t i = 0; i < inner; ++i) {
          sum[i] += x[i];
          y[i] = float(sum[i]);
        }
      }
    }
  }
}
} // namespace detail

/// Lanes: `outer` sizes with strides `inOuter`/`outOuter`; lane points `lane` with strides
/// `inLane`/`outLane`. `globalLaneCount`: the lane's global element count (layer_norm).
inline void along(float* out, const float* in, const Shape& outer, const Shape& inOuter,
                  const Shape& outOuter, const Shape& lane, const Shape& inLane,
                  const Shape& outLane, Along kind, double eps, int64_t globalLaneCount,
                  meshrt::Communicator* group) {
  // A group of one rank (the lane's axes of size 1, e.g. `vocab: model` on [1]) splits nothing:
  // the lane is whole, and the contiguous rows below apply (a log_softmax over vocab = 64 took
  // the strided per-element walk at 8 ns an element on [1], 2x the row kernel).
  if (group && group->size() <= 1) group = nullptr;
  // A whole unit-stride lane (the usual softmax and layer_norm over the innermost dim): rows
  // of contiguous elements, walked directly so that the compiler vectorizes them; rows one
  // lane apart (the usual layout) need no table of their offsets.
  if (!group && lane.size() == 1 && inLane[0] == 1 && outLane[0] == 1 &&
      (kind == Along::Softmax || kind == Along::LogSoftmax || kind == Along::LayerNorm)) {
    int64_t rows = product(outer);
    if (detail::denseRun(outer, inOuter, lane[0]) && detail::denseRun(outer, outOuter, lane[0])) {
      alongContiguous(out, in, rows, RowBase{lane[0]}, RowBase{lane[0]}, lane[0], kind, eps,
                      globalLaneCount);
      return;
    }
    std::vector<int64_t> inBase = offsetsOf(outer, inOuter), outBase = offsetsOf(outer, outOuter);
    alongContiguous(out, in, rows, RowBase{0, &inBase}, RowBase{0, &outBase}, lane[0], kind, eps,
                    globalLaneCount);
    return;
  }
  int64_t above = 0, inner = 0;
  if ((kind == Along::Cumsum || kind == Along::CumsumExclusive) && lane.size() == 1 &&
      inOuter == outOuter && inLane == outLane &&
      detail::cumsumBox(outer, inOuter, lane[0], inLane[0], above, inner)) {
    detail::cumsumBox(out, in, above, lane[0], inner, kind == Along::CumsumExclusive, group);
    return;
  }
  std::vector<int64_t> inBase = offsetsOf(outer, inOuter), outBase = offsetsOf(outer, outOuter);
  std::vector<int64_t> inOffsets = offsetsOf(lane, inLane), outOffsets = offsetsOf(lane, outLane);
  size_t rows = inBase.size(), size = inOffsets.size();
  if (kind == Along::Softmax || kind == Along::LogSoftmax) {
    // Per row: the max and the sum of exp(x - max) in f32 exp (meshrt::kernels::f32, <= 1 ulp),
    // summed in double; softmax keeps the exponentials in `out`. A split lane combines its
    // ranks' (max, sum) pairs after one all-gather (meshrt/kernels/SoftmaxStats.h).
    std::vector<double> stats(2 * rows); // (max, sum) per row
    bool softmax = kind == Along::Softmax;
    for (size_t r = 0; r < rows; ++r) {
      float rowMax = -INFINITY;
      for (size_t i = 0; i < size; ++i)
        rowMax = std::max(rowMax, in[inBase[r] + inOffsets[i]]);
      float max = std::isfinite(rowMax) ? rowMax : 0.0f;
      double sum = 0;
      for (size_t i = 0; i < size; ++i) {
        float e = meshrt::kernels::f32::exp(in[inBase[r] + inOffsets[i]] - max);
        if (softmax) out[outBase[r] + outOffsets[i]] = e;
        sum += e;
      }
      stats[2 * r] = rowMax;
      stats[2 * r + 1] = sum;
    }
    // The factor that brings a rank's exponentials to the global max (1 without a group).
    std::vector<double> rescale(rows, 1.0);
    if (group) {
      std::vector<double> all(stats.size() * size_t(group->size()));
      group->allGather(stats.data(), all.data(), stats.size());
      int64_t stride = int64_t(stats.size());
      for (size_t r = 0; r < rows; ++r) {
        float laneMax = 0;
        meshrt::kernels::combineSoftmaxStatistics(all.data() + 2 * r, stride, group->size(),
                                                  group->rank(), &laneMax, &stats[2 * r + 1],
                                                  &rescale[r]);
        stats[2 * r] = laneMax;
      }
    }
    for (size_t r = 0; r < rows; ++r) {
      float max = std::isfinite(float(stats[2 * r])) ? float(stats[2 * r]) : 0.0f;
      double sum = stats[2 * r + 1];
      if (softmax) {
        double scale = rescale[r] / sum; // as meshrt/cuda/RowMath.h's softmaxLane
        for (size_t i = 0; i < size; ++i)
          out[outBase[r] + outOffsets[i]] = float(out[outBase[r] + outOffsets[i]] * scale);
        continue;
      }
      double logSum = std::log(sum);
      for (size_t i = 0; i < size; ++i)
        out[outBase[r] + outOffsets[i]] =
            float(double(in[inBase[r] + inOffsets[i]]) - max - logSum);
    }
  } else if (kind == Along::LayerNorm) {
    double count = double(globalLaneCount);
    if (!group) {
      // Two passes, as the interpreter.
      for (size_t r = 0; r < rows; ++r) {
        double mean = 0, variance = 0;
        for (size_t i = 0; i < size; ++i)
          mean += in[inBase[r] + inOffsets[i]];
        mean /= count;
        for (size_t i = 0; i < size; ++i) {
          double centered = in[inBase[r] + inOffsets[i]] - mean;
          variance += centered * centered;
        }
        variance /= count;
        double scale = 1 / std::sqrt(variance + eps);
        for (size_t i = 0; i < size; ++i)
          out[outBase[r] + outOffsets[i]] = float((in[inBase[r] + inOffsets[i]] - mean) * scale);
      }
      return;
    }
    // Split lane: one all-reduce of (sum x, sum x^2) per row, in double.
    std::vector<double> sums(2 * rows, 0.0);
    for (size_t r = 0; r < rows; ++r)
      for (size_t i = 0; i < size; ++i) {
        double x = in[inBase[r] + inOffsets[i]];
        sums[2 * r] += x;
        sums[2 * r + 1] += x * x;
      }
    group->allReduce(sums.data(), sums.size());
    for (size_t r = 0; r < rows; ++r) {
      double mean = sums[2 * r] / count;
      double variance = std::max(0.0, sums[2 * r + 1] / count - mean * mean);
      double scale = 1 / std::sqrt(variance + eps);
      for (size_t i = 0; i < size; ++i)
        out[outBase[r] + outOffsets[i]] = float((in[inBase[r] + inOffsets[i]] - mean) * scale);
    }
  } else {
    // Cumsum: local prefix sums, then (split) the exclusive scan of the lower blocks' totals.
    bool exclusive = kind == Along::CumsumExclusive;
    std::vector<double> totals(rows, 0.0), carry(rows, 0.0);
    for (size_t r = 0; r < rows; ++r)
      for (size_t i = 0; i < size; ++i)
        totals[r] += in[inBase[r] + inOffsets[i]];
    if (group) {
      std::vector<double> all(rows * size_t(group->size()));
      group->allGather(totals.data(), all.data(), rows);
      for (int peer = 0; peer < group->rank(); ++peer)
        for (size_t r = 0; r < rows; ++r)
          carry[r] += all[size_t(peer) * rows + r];
    }
    for (size_t r = 0; r < rows; ++r) {
      double sum = carry[r];
      for (size_t i = 0; i < size; ++i) {
        double x = in[inBase[r] + inOffsets[i]];
        if (exclusive) {
          out[outBase[r] + outOffsets[i]] = float(sum);
          sum += x;
        } else {
          sum += x;
          out[outBase[r] + outOffsets[i]] = float(sum);
        }
      }
    }
  }
}

/// shift along a dim (position `dimIndex` of the local shape) by `offset`, filling zeros. When
/// the dim is split over `group` (block order = group rank), the rows come from the blocks
/// `offset` positions away, exchanged by collective permutes of whole shards (at most two).
inline void shift(View out, ConstView in, const Shape& sizes, size_t dimIndex, int64_t offset,
                  meshrt::Communicator* group) {
  int64_t local = sizes[dimIndex];
  int64_t outerCount = 1, innerCount = 1;
  for (size_t i = 0; i < dimIndex; ++i)
    outerCount *= sizes[i];
  for (size_t i = dimIndex + 1; i < sizes.size(); ++i)
    innerCount *= sizes[i];
  std::fill(out.begin(), out.end(), 0.0f);
  auto copyRows = [&](ConstView source, int64_t sourceStartGlobal, int64_t outStartGlobal) {
    // out global row g takes source global row g - offset, when it lies in `source`.
    for (int64_t j = 0; j < local; ++j) {
      int64_t from = outStartGlobal + j - offset - sourceStartGlobal;
      if (from < 0 || from >= local) continue;
      for (int64_t o = 0; o < outerCount; ++o)
        std::copy_n(source.data() + (o * local + from) * innerCount, innerCount,
                    out.data() + (o * local + j) * innerCount);
    }
  };
  if (!group) {
    copyRows(in, 0, 0);
    return;
  }
  int64_t rank = group->rank(), ranks = group->size();
  int64_t myStart = rank * local;
  // Source rows lie in blocks rank - q for q in {floor(offset/local), ceil(offset/local)}.
  int64_t low = offset >= 0 ? offset / local : -((-offset + local - 1) / local);
  int64_t high = offset % local == 0 ? low : low + 1;
  Buffer received(in.size());
  for (int64_t q = low; q <= high; ++q) {
    if (q == 0) {
      copyRows(in, myStart, myStart);
      continue;
    }
    int64_t sendTo = rank + q, recvFrom = rank - q;
    int send = sendTo >= 0 && sendTo < ranks ? int(sendTo) : meshrt::Communicator::kNoPeer;
    int recv = recvFrom >= 0 && recvFrom < ranks ? int(recvFrom) : meshrt::Communicator::kNoPeer;
    group->permute(in.data(), received.data(), in.size(), send, recv);
    if (recv != meshrt::Communicator::kNoPeer) copyRows(received, recvFrom * local, myStart);
  }
}

} // namespace meshc::gen
