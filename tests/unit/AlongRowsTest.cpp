// Generated code's row kernels (compiler/codegen/support/meshc/GeneratedSupport.h) against double
// references: softmax and layer_norm rows in f32 (sums in f32 lanes, layer_norm's mean in double
// kept as two floats) within their stated error, also on rows far from zero and rows whose
// length is not a multiple of the 16 lanes; gather's row-copy path element for element.
#include "meshc/GeneratedSupport.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

namespace gen = meshc::gen;

namespace {

constexpr double kU = 0x1p-24; // f32's unit roundoff

struct Rows {
  int64_t count, size;
  std::vector<float> x;
};

/// `count` rows of `size` normal samples with the given offset and spread.
Rows rows(int64_t count, int64_t size, float offset, float spread, unsigned seed) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal(0, 1);
  Rows r{count, size, std::vector<float>(size_t(count * size))};
  for (float& v : r.x)
    v = offset + spread * normal(engine);
  return r;
}

std::vector<float> runAlong(const Rows& r, gen::Along kind) {
  std::vector<float> out(r.x.size());
  gen::along(out.data(), r.x.data(), {r.count}, {r.size}, {r.size}, {r.size}, {1}, {1}, kind, 1e-5,
             r.size, nullptr);
  return out;
}

} // namespace

TEST_CASE("along: f32 softmax rows within 24 u of the double softmax", "[along]") {
  // The exponentials' 1 ulp, the f32 lane sums (at most 16 terms of at most 1 each before each
  // block goes to double) and the final scale: measured at most 18.4 u.
  for (int64_t size : {1, 7, 16, 128, 300, 5000})
    for (float offset : {0.0f, 100.0f, -3000.0f}) {
      Rows r = rows(3, size, offset, 3.0f, unsigned(size));
      std::vector<float> y = runAlong(r, gen::Along::Softmax);
      double worst = 0;
      for (int64_t row = 0; row < r.count; ++row) {
        const float* x = r.x.data() + row * size;
        double max = x[0], sum = 0;
        for (int64_t i = 0; i < size; ++i)
          max = std::max(max, double(x[i]));
        for (int64_t i = 0; i < size; ++i)
          sum += std::exp(double(x[i]) - max);
        for (int64_t i = 0; i < size; ++i) {
          double exact = std::exp(double(x[i]) - max) / sum;
          if (exact < 1e-30) continue; // underflowed terms: compared by the sum above
          worst = std::max(worst, std::fabs(y[size_t(row * size + i)] - exact) / (exact * kU));
        }
      }
      INFO("size " << size << ", offset " << offset << ": worst " << worst << " u");
      CHECK(worst <= 24.0);
    }
}

TEST_CASE("along: f32 layer_norm rows within 4 u of |e| + 1, also far from zero", "[along]") {
  // A row at -3000 +- 3 loses its deviations to an f32 sum of the row (1343 u measured with the
  // mean in f32 lanes): the mean is summed in double and kept as two floats. Measured: 1.4 u.
  for (int64_t size : {2, 7, 16, 256, 1000, 5000})
    for (float offset : {0.0f, 100.0f, -3000.0f}) {
      Rows r = rows(3, size, offset, 3.0f, unsigned(size) + 1);
      std::vector<float> y = runAlong(r, gen::Along::LayerNorm);
      double worst = 0;
      for (int64_t row = 0; row < r.count; ++row) {
        const float* x = r.x.data() + row * size;
        double mean = 0, variance = 0;
        for (int64_t i = 0; i < size; ++i)
          mean += x[i];
        mean /= double(size);
        for (int64_t i = 0; i < size; ++i)
          variance += (x[i] - mean) * (x[i] - mean);
        variance /= double(size);
        for (int64_t i = 0; i < size; ++i) {
          double exact = (x[i] - mean) / std::sqrt(variance + 1e-5);
          double error =
              std::fabs(y[size_t(row * size + i)] - exact) / ((std::fabs(exact) + 1) * kU);
          worst = std::max(worst, error);
        }
      }
      INFO("size " << size << ", offset " << offset << ": worst " << worst << " u");
      CHECK(worst <= 4.0);
    }
}

TEST_CASE("gather: an embedding lookup's row copies, zeros for ids outside the block", "[gather]") {
  // A [2, 3] id tensor, rows of 5 from a block of 4 table rows starting at global row 2.
  const int64_t rowsInBlock = 4, width = 5, start = 2;
  std::vector<float> table(size_t(rowsInBlock * width));
  for (size_t i = 0; i < table.size(); ++i)
    table[i] = float(i) + 0.5f;
  std::vector<float> ids = {3, -1, 6, 5, 2, 1}; // 6 and 1 (and -1) fall outside [2, 6)
  std::vector<float> out(ids.size() * size_t(width), -7.0f);
  gen::gather(out.data(), {2, 3, width}, table.data(), {0, 0, 1}, ids.data(), {3, 1, 0},
              rowsInBlock, width, start);
  for (size_t p = 0; p < ids.size(); ++p)
    for (int64_t j = 0; j < width; ++j) {
      int64_t local = int64_t(ids[p]) - start;
      float expected = local >= 0 && local < rowsInBlock ? table[size_t(local * width + j)] : 0.0f;
      INFO("point " << p << ", column " << j);
      CHECK(out[p * size_t(width) + size_t(j)] == expected);
    }
  // The same lookup with the table walked column-major (not the row-copy layout) agrees.
  std::vector<float> transposed(table.size());
  for (int64_t r = 0; r < rowsInBlock; ++r)
    for (int64_t j = 0; j < width; ++j)
      transposed[size_t(j * rowsInBlock + r)] = table[size_t(r * width + j)];
  std::vector<float> general(out.size(), -7.0f);
  gen::gather(general.data(), {2, 3, width}, transposed.data(), {0, 0, rowsInBlock}, ids.data(),
              {3, 1, 0}, rowsInBlock, 1, start);
  CHECK(general == out);
}
