// Generated loops' relu, comparisons and where (compiler/codegen/support/meshc/SupportCore.h:
// bit operations, so that a loop with them vectorizes) against the ternaries they replace, bit
// for bit over special and ordinary values; and the loop they were written for (a relu, then
// dropout's double-precision scale) compiled at -O3 as generated code is, element for element.
#include "meshc/GeneratedSupport.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace gen = meshc::gen;

namespace {

uint32_t bitsOf(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

/// Special values (signed zeros, infinities, nan, the smallest subnormal and normal, the largest
/// finite) and ordinary ones of both signs.
std::vector<float> samples() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> values = {0.0f,
                               -0.0f,
                               inf,
                               -inf,
                               std::numeric_limits<float>::quiet_NaN(),
                               -std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::denorm_min(),
                               -std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::max(),
                               -std::numeric_limits<float>::max()};
  for (int k = -40; k <= 40; ++k)
    values.push_back(std::ldexp(1.375f, k) * (k % 2 ? -1.0f : 1.0f));
  return values;
}

} // namespace

TEST_CASE("relu, flag and where: the ternaries' bits for every sample", "[support]") {
  std::vector<float> values = samples();
  for (float x : values) {
    CAPTURE(x);
    CHECK(bitsOf(gen::relu(x)) == bitsOf(x > 0 ? x : 0.0f));
    for (float y : values) {
      CAPTURE(y);
      CHECK(bitsOf(gen::flag(x < y)) == bitsOf(x < y ? 1.0f : 0.0f));
      CHECK(bitsOf(gen::flag(x == y)) == bitsOf(x == y ? 1.0f : 0.0f));
      CHECK(bitsOf(gen::where(x, y, -1.5f)) == bitsOf(x != 0 ? y : -1.5f));
    }
  }
}

TEST_CASE("relu then dropout's double scale: the loop's values are the scalar formula's",
          "[support]") {
  // The generated loop's shape: relu, the keep mask, x * (1 / (1 - 0.1)) in double rounded once.
  std::vector<float> in = samples(), out(in.size());
  std::vector<uint32_t> keep(in.size());
  for (size_t i = 0; i < keep.size(); ++i)
    keep[i] = i % 3 ? ~0u : 0u;
  for (size_t i = 0; i < in.size(); ++i)
    out[i] = gen::keepOrZero(keep[i], float(double(gen::relu(in[i])) * 1.1111111111111112));
  for (size_t i = 0; i < in.size(); ++i) {
    CAPTURE(in[i]);
    float relu = in[i] > 0 ? in[i] : 0.0f;
    float expected = keep[i] ? float(double(relu) * 1.1111111111111112) : 0.0f;
    CHECK(bitsOf(out[i]) == bitsOf(expected));
  }
}

namespace {

/// The branching form wrapI32 replaced (the interpreter's i32 rounding).
float wrapI32Reference(double x) {
  if (std::isnan(x)) return 0;
  x = std::trunc(x);
  if (std::fabs(x) >= 0x1p63) return x > 0 ? 2147483647.0f : -2147483648.0f;
  return float(int32_t(uint32_t(uint64_t(int64_t(x)))));
}

} // namespace

TEST_CASE("wrapI32: the branching form's bits for every sample, alone and in a loop", "[support]") {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> values = {0.0,
                                -0.0,
                                inf,
                                -inf,
                                std::nan(""),
                                -std::nan(""),
                                0.5,
                                -0.5,
                                2147483647.0,
                                2147483648.0,
                                -2147483648.0,
                                -2147483649.0,
                                4294967296.0 + 5,
                                0x1p63,
                                -0x1p63,
                                0x1p63 - 1024,
                                -0x1p63 + 1024,
                                0x1p64,
                                1e300,
                                -1e300};
  for (int k = -3; k <= 70; ++k)
    for (double sign : {1.0, -1.0})
      values.push_back(sign * std::ldexp(1.3125, k) + (k % 3));
  std::vector<float> looped(values.size());
  for (size_t i = 0; i < values.size(); ++i) // the generated loops' form: vectorized at -O3
    looped[i] = gen::wrapI32(values[i]);
  for (size_t i = 0; i < values.size(); ++i) {
    CAPTURE(values[i]);
    CHECK(bitsOf(gen::wrapI32(values[i])) == bitsOf(wrapI32Reference(values[i])));
    CHECK(bitsOf(looped[i]) == bitsOf(wrapI32Reference(values[i])));
  }
  CHECK(gen::wrapI32(2147483648.0) == -2147483648.0f); // wraps, as i32 arithmetic does
  CHECK(gen::wrapI32(-7.9) == -7.0f);
}
