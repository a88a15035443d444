// The math of meshrt_cuda's lane kernels, on the CPU: the MESHRT_HD bodies of RowMath.h that
// the device kernels call (one thread per lane) against the CPU kernels of the C++ target
// (meshc::gen::reduce / along in GeneratedSupport.h) on strided lanes, including the split-lane
// forms (partial results of two blocks combined as the kernels combine them after their
// collectives) against the whole lane.
#include <catch2/catch.hpp>

#include "meshc/GeneratedSupport.h"
#include "meshrt/cuda/RowMath.h"

#include <cmath>
#include <random>

namespace row = meshrt::cuda::row;
using meshc::gen::Buffer;
using meshc::gen::Shape;

namespace {

Buffer randomBuffer(size_t count, unsigned seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  Buffer data(count);
  for (float& x : data)
    x = normal(rng);
  return data;
}

// A [rows=6, lane=10] tensor stored transposed ([lane, rows]) so that lanes are strided.
constexpr int64_t kRows = 6, kLane = 10;
const Shape kOuter = {kRows}, kInOuter = {1}, kOutOuter = {kLane}, kLaneSizes = {kLane},
            kInLane = {kRows}, kOutLane = {1};

std::vector<int64_t> laneOffsets(int64_t first, int64_t count) {
  std::vector<int64_t> offsets;
  for (int64_t i = first; i < first + count; ++i)
    offsets.push_back(i * kRows);
  return offsets;
}

std::vector<int64_t> denseOffsets(int64_t count) {
  std::vector<int64_t> offsets;
  for (int64_t i = 0; i < count; ++i)
    offsets.push_back(i);
  return offsets;
}

void requireClose(float actual, float expected, float tolerance) {
  if (std::isnan(expected)) {
    REQUIRE(std::isnan(actual));
    return;
  }
  if (std::isinf(expected)) {
    REQUIRE(actual == expected);
    return;
  }
  REQUIRE(std::fabs(actual - expected) <= tolerance * std::max(1.0f, std::fabs(expected)));
}

} // namespace

TEST_CASE("top_k: each element's rank (the CUDA kernel's) places it where the CPU's sort does",
          "[cuda][rowmath]") {
  // [rows=6, lane=10] stored transposed, with ties (rounded values) and a NaN in row 2.
  Buffer x = randomBuffer(size_t(kRows * kLane), 7);
  for (float& v : x)
    v = std::round(v);
  x[size_t(4 * kRows + 2)] = NAN;
  for (int64_t k : {int64_t(1), int64_t(4), kLane}) {
    INFO("k = " << k);
    Buffer cpu(size_t(kRows * k), -1.0f);
    meshc::gen::topK(cpu.data(), {kRows, k}, x.data(), {1, 0}, 1, kLane, kRows);
    for (int64_t r = 0; r < kRows; ++r) {
      std::vector<float> placed(size_t(k), -1.0f);
      for (int64_t i = 0; i < kLane; ++i) {
        int64_t rank = meshc::gen::topKRank(x.data() + r, kRows, kLane, i);
        if (rank < k) placed[size_t(rank)] = float(i);
      }
      for (int64_t j = 0; j < k; ++j)
        CHECK(placed[size_t(j)] == cpu[size_t(r * k + j)]);
    }
  }
  CHECK(meshc::gen::topKRank(x.data() + 2, kRows, kLane, 4) == 0); // the NaN comes first
}

TEST_CASE("reduceLane computes what the CPU reduce computes", "[cuda][rowmath]") {
  Buffer in = randomBuffer(size_t(kRows * kLane), 1);
  in[7] = -INFINITY;                // row 1: a -inf does not disturb max or logsumexp
  in[2 + 3 * kRows] = NAN;          // row 2: nan propagates through max, min and sum
  in[4] = in[4 + kRows] = INFINITY; // row 4: +inf max; logsumexp stays inf
  std::vector<int64_t> offsets = laneOffsets(0, kLane);
  const std::pair<meshc::gen::Reduce, row::ReduceKind> kinds[] = {
      {meshc::gen::Reduce::Sum, row::ReduceKind::Sum},
      {meshc::gen::Reduce::Max, row::ReduceKind::Max},
      {meshc::gen::Reduce::Min, row::ReduceKind::Min},
      {meshc::gen::Reduce::LogSumExp, row::ReduceKind::LogSumExp}};
  for (auto [cpuKind, laneKind] : kinds) {
    double scale = cpuKind == meshc::gen::Reduce::Sum ? 0.25 : 1.0;
    Buffer expected(kRows);
    meshc::gen::reduce(expected.data(), kOuter, in.data(), kInOuter, kLaneSizes, kInLane, cpuKind,
                       scale);
    for (int64_t r = 0; r < kRows; ++r) {
      float actual = row::reduceLane(in.data() + r, offsets.data(), kLane, laneKind, scale);
      // Same operations in the same order: bit-identical.
      if (std::isnan(expected[size_t(r)]))
        REQUIRE(std::isnan(actual));
      else
        REQUIRE(actual == expected[size_t(r)]);
    }
  }
}

TEST_CASE("softmax and log_softmax lanes match the CPU along", "[cuda][rowmath]") {
  Buffer in = randomBuffer(size_t(kRows * kLane), 2, 10.0f);
  for (bool logSoftmax : {false, true}) {
    Buffer expected(in.size()), actual(in.size());
    meshc::gen::along(expected.data(), in.data(), kOuter, kInOuter, kOutOuter, kLaneSizes, kInLane,
                      kOutLane,
                      logSoftmax ? meshc::gen::Along::LogSoftmax : meshc::gen::Along::Softmax, 1e-5,
                      kLane, nullptr);
    std::vector<int64_t> in_ = laneOffsets(0, kLane), out_ = denseOffsets(kLane);
    for (int64_t r = 0; r < kRows; ++r) {
      float max = row::laneMax(in.data() + r, in_.data(), kLane);
      double sum = row::laneSumExp(in.data() + r, in_.data(), kLane, row::softmaxShift(max));
      row::softmaxLane(actual.data() + r * kLane, out_.data(), in.data() + r, in_.data(), kLane,
                       max, sum, logSoftmax);
    }
    for (size_t i = 0; i < in.size(); ++i)
      REQUIRE(actual[i] == expected[i]);

    // Split lane: two blocks' maxima and sums combined (the kernels' all-reduces).
    std::vector<int64_t> low = laneOffsets(0, 4), high = laneOffsets(4, kLane - 4),
                         outLow = denseOffsets(4);
    for (int64_t r = 0; r < kRows; ++r) {
      float max = std::max(row::laneMax(in.data() + r, low.data(), 4),
                           row::laneMax(in.data() + r, high.data(), kLane - 4));
      double shift = row::softmaxShift(max);
      double sum = row::laneSumExp(in.data() + r, low.data(), 4, shift) +
                   row::laneSumExp(in.data() + r, high.data(), kLane - 4, shift);
      Buffer block(4);
      row::softmaxLane(block.data(), outLow.data(), in.data() + r, low.data(), 4, max, sum,
                       logSoftmax);
      for (int64_t i = 0; i < 4; ++i)
        requireClose(block[size_t(i)], expected[size_t(r * kLane + i)], 1e-6f);
    }
  }
}

TEST_CASE("softmax of a lane without a finite max is nan, as on the CPU", "[cuda][rowmath]") {
  Buffer in = {-INFINITY, -INFINITY, -INFINITY};
  std::vector<int64_t> offsets = denseOffsets(3);
  float max = row::laneMax(in.data(), offsets.data(), 3);
  REQUIRE(max == -INFINITY);
  double sum = row::laneSumExp(in.data(), offsets.data(), 3, row::softmaxShift(max));
  Buffer out(3), expected(3);
  row::softmaxLane(out.data(), offsets.data(), in.data(), offsets.data(), 3, max, sum, false);
  meshc::gen::along(expected.data(), in.data(), {1}, {0}, {0}, {3}, {1}, {1},
                    meshc::gen::Along::Softmax, 1e-5, 3, nullptr);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(std::isnan(expected[i]));
    REQUIRE(std::isnan(out[i]));
  }
}

TEST_CASE("layer_norm lanes match the CPU along, whole and split", "[cuda][rowmath]") {
  Buffer in = randomBuffer(size_t(kRows * kLane), 3);
  for (float& x : in)
    x += 5.0f; // an offset mean: the centered two-pass variance matters
  Buffer expected(in.size()), actual(in.size());
  meshc::gen::along(expected.data(), in.data(), kOuter, kInOuter, kOutOuter, kLaneSizes, kInLane,
                    kOutLane, meshc::gen::Along::LayerNorm, 1e-5, kLane, nullptr);
  std::vector<int64_t> in_ = laneOffsets(0, kLane), out_ = denseOffsets(kLane);
  for (int64_t r = 0; r < kRows; ++r)
    row::layerNormLane(actual.data() + r * kLane, out_.data(), in.data() + r, in_.data(), kLane,
                       double(kLane), 1e-5);
  for (size_t i = 0; i < in.size(); ++i)
    REQUIRE(actual[i] == expected[i]);

  // Split: per-block moments summed (the kernel's all-reduce), then the block normalized.
  std::vector<int64_t> low = laneOffsets(0, 3), high = laneOffsets(3, kLane - 3);
  for (int64_t r = 0; r < kRows; ++r) {
    double s1, q1, s2, q2;
    row::laneMoments(in.data() + r, low.data(), 3, &s1, &q1);
    row::laneMoments(in.data() + r, high.data(), kLane - 3, &s2, &q2);
    Buffer block(size_t(kLane - 3));
    std::vector<int64_t> outHigh = denseOffsets(kLane - 3);
    row::layerNormLaneFromMoments(block.data(), outHigh.data(), in.data() + r, high.data(),
                                  kLane - 3, s1 + s2, q1 + q2, double(kLane), 1e-5);
    for (int64_t i = 0; i < kLane - 3; ++i)
      requireClose(block[size_t(i)], expected[size_t(r * kLane + 3 + i)], 1e-4f);
  }
}

TEST_CASE("cumsum lanes match the CPU along; a split lane continues from the carry",
          "[cuda][rowmath]") {
  Buffer in = randomBuffer(size_t(kRows * kLane), 4);
  for (bool exclusive : {false, true}) {
    Buffer expected(in.size()), actual(in.size());
    meshc::gen::along(expected.data(), in.data(), kOuter, kInOuter, kOutOuter, kLaneSizes, kInLane,
                      kOutLane,
                      exclusive ? meshc::gen::Along::CumsumExclusive : meshc::gen::Along::Cumsum,
                      1e-5, kLane, nullptr);
    std::vector<int64_t> low = laneOffsets(0, 5), high = laneOffsets(5, kLane - 5),
                         out_ = denseOffsets(kLane);
    for (int64_t r = 0; r < kRows; ++r) {
      double carry = row::laneTotal(in.data() + r, low.data(), 5);
      row::cumsumLane(actual.data() + r * kLane, out_.data(), in.data() + r, low.data(), 5, 0.0,
                      exclusive);
      row::cumsumLane(actual.data() + r * kLane + 5, out_.data(), in.data() + r, high.data(),
                      kLane - 5, carry, exclusive);
    }
    // The same additions in the same order as the whole-lane scan: bit-identical.
    for (size_t i = 0; i < in.size(); ++i)
      REQUIRE(actual[i] == expected[i]);
  }
}

TEST_CASE("logsumexp over a split lane combines to the whole lane's", "[cuda][rowmath]") {
  Buffer in = randomBuffer(size_t(kRows * kLane), 5, 20.0f);
  std::vector<int64_t> low = laneOffsets(0, 6), high = laneOffsets(6, kLane - 6);
  Buffer expected(kRows);
  meshc::gen::reduce(expected.data(), kOuter, in.data(), kInOuter, kLaneSizes, kInLane,
                     meshc::gen::Reduce::LogSumExp, 1.0);
  for (int64_t r = 0; r < kRows; ++r) {
    float a = row::reduceLane(in.data() + r, low.data(), 6, row::ReduceKind::LogSumExp, 1.0);
    float b =
        row::reduceLane(in.data() + r, high.data(), kLane - 6, row::ReduceKind::LogSumExp, 1.0);
    float groupMax = std::max(a, b);
    double shift = row::softmaxShift(groupMax);
    double sum = std::exp(double(a) - shift) + std::exp(double(b) - shift);
    requireClose(row::combineLogSumExp(groupMax, sum), expected[size_t(r)], 1e-6f);
  }
  REQUIRE(row::combineLogSumExp(-INFINITY, 0.0) == -INFINITY);
}
