// MathF32.h against double-precision libm: a sweep over f32 bit patterns (every sign, exponent
// and a spread of mantissas) plus the special values, with a stated max ulp error per function.
// Bounds asserted (measured max): exp 1 (0.96), log 1 (0.77), sin and cos 2 for |x| <= 8192
// (1.50, 1.46), tanh 2 (1.31), sigmoid 3 (2.61), gelu 4 for x >= -1 (2.24) and 4 + 2.5 |2u|
// below (4 + 2.43 |2u|: its argument 2u rounded in f32), pow 1 (0.75).
#include "meshrt/kernels/MathF32.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

namespace f32 = meshrt::kernels::f32;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float fromBits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

/// |got - exact| in units of the last place of f32 at `exact` (subnormal ulp below 2^-126);
/// non-finite results must match in kind (inf with sign, nan) and count 0 or 1e9.
double ulpError(float got, double exact) {
  if (std::isnan(exact)) return std::isnan(got) ? 0 : 1e9;
  float rounded = float(exact);
  if (std::isinf(rounded) || std::isinf(got)) return rounded == got ? 0 : 1e9;
  if (std::isnan(got)) return 1e9;
  int exponent = std::max(std::ilogb(std::fabs(exact == 0 ? 1e-45 : exact)), -126);
  return std::fabs(double(got) - exact) / std::ldexp(1.0, exponent - 23);
}

/// Every 251st f32 bit pattern (both signs, every exponent) plus `extra`.
std::vector<float> sweep(std::vector<float> extra = {}) {
  std::vector<float> xs = std::move(extra);
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 251)
    xs.push_back(fromBits(uint32_t(b)));
  for (float x : {0.0f,
                  -0.0f,
                  kInf,
                  -kInf,
                  kNaN,
                  std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(),
                  1.0f,
                  -1.0f,
                  0.5f,
                  88.7228f,
                  88.72284f,
                  -87.33655f,
                  -103.97f,
                  -104.0f,
                  0.625f,
                  -0.625f,
                  9.01f,
                  1e-30f,
                  -1e-30f})
    xs.push_back(x);
  return xs;
}

struct Worst {
  double ulps = 0;
  float at = 0;
};

/// The max ulp error of `fn` against `exact` over the xs that `inDomain` accepts.
Worst worstError(
    const std::vector<float>& xs, float (*fn)(float), const std::function<double(double)>& exact,
    const std::function<bool(float)>& inDomain = [](float) { return true; }) {
  // A vectorizable loop first (the form generated code has), then the comparison.
  std::vector<float> got(xs.size());
  for (size_t i = 0; i < xs.size(); ++i)
    got[i] = fn(xs[i]);
  Worst worst;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!inDomain(xs[i])) continue;
    double error = ulpError(got[i], exact(double(xs[i])));
    if (error > worst.ulps || std::isnan(error)) worst = {error, xs[i]};
  }
  return worst;
}

double sigmoidExact(double x) {
  return 1 / (1 + std::exp(-x));
}
double geluExact(double x) {
  // meshc's definition 0.5 x (1 + tanh(u)), u = 0.7978845608 (x + 0.044715 x^3), written as
  // x / (1 + e^{-2u}) in long double: 1 + tanh(u) itself cancels to 0 in double below x ~ -7.
  long double u = 0.79788456080286535588L * (x + 0.044715L * x * x * x);
  return double(x / (1 + std::exp(-2 * u)));
}

} // namespace

TEST_CASE("f32 exp and log: within 1 ulp everywhere, libm's special values", "[mathf32]") {
  std::vector<float> xs = sweep();
  Worst exp = worstError(xs, f32::exp, [](double x) { return std::exp(x); });
  INFO("exp: " << exp.ulps << " ulp at " << exp.at);
  CHECK(exp.ulps <= 1.0);
  Worst log = worstError(xs, f32::log, [](double x) { return std::log(x); });
  INFO("log: " << log.ulps << " ulp at " << log.at);
  CHECK(log.ulps <= 1.0);
  CHECK(f32::exp(-kInf) == 0.0f);
  CHECK(f32::exp(kInf) == kInf);
  CHECK(f32::exp(89.0f) == kInf);
  CHECK(f32::exp(-200.0f) == 0.0f);
  CHECK(f32::exp(0.0f) == 1.0f);
  CHECK(std::isnan(f32::exp(kNaN)));
  CHECK(f32::exp(-100.0f) > 0.0f); // a subnormal result, not flushed
  CHECK(f32::log(0.0f) == -kInf);
  CHECK(f32::log(-0.0f) == -kInf);
  CHECK(std::isnan(f32::log(-1.0f)));
  CHECK(std::isnan(f32::log(-kInf)));
  CHECK(f32::log(kInf) == kInf);
  CHECK(f32::log(1.0f) == 0.0f);
  CHECK(std::isnan(f32::log(kNaN)));
}

TEST_CASE("f32 sin and cos: within 2 ulp for |x| <= 8192 (the Cody-Waite range)", "[mathf32]") {
  std::vector<float> xs = sweep();
  auto reduced = [](float x) { return std::fabs(x) <= 8192.0f; };
  Worst sin = worstError(
      xs, f32::sin, [](double x) { return std::sin(x); }, reduced);
  INFO("sin: " << sin.ulps << " ulp at " << sin.at);
  CHECK(sin.ulps <= 2.0);
  Worst cos = worstError(
      xs, f32::cos, [](double x) { return std::cos(x); }, reduced);
  INFO("cos: " << cos.ulps << " ulp at " << cos.at);
  CHECK(cos.ulps <= 2.0);
  CHECK(std::isnan(f32::sin(kInf)));
  CHECK(std::isnan(f32::cos(-kInf)));
  CHECK(std::isnan(f32::sin(kNaN)));
  CHECK(std::signbit(f32::sin(-0.0f)));
  CHECK(f32::cos(0.0f) == 1.0f);
}

TEST_CASE("f32 tanh, sigmoid and gelu: within 2, 3 and 4 ulp (gelu: for x >= -1)", "[mathf32]") {
  std::vector<float> xs = sweep();
  Worst tanh = worstError(xs, f32::tanh, [](double x) { return std::tanh(x); });
  INFO("tanh: " << tanh.ulps << " ulp at " << tanh.at);
  CHECK(tanh.ulps <= 2.0);
  Worst sigmoid = worstError(xs, f32::sigmoid, sigmoidExact);
  INFO("sigmoid: " << sigmoid.ulps << " ulp at " << sigmoid.at);
  CHECK(sigmoid.ulps <= 3.0);
  // gelu's negative tail is x e^{2u} / (1 + e^{2u}) with 2u ~ -0.14 x^3 rounded in f32: its
  // relative error is 2u's absolute one, about 2 |2u| ulps (measured 4 + 2.43 |2u|), so the
  // bound is 4 ulp for x >= -1 and 4 + 2.5 |2u| ulp below, down to underflow.
  Worst gelu = worstError(xs, f32::gelu, geluExact, [](float x) { return x >= -1.0f; });
  INFO("gelu, x >= -1: " << gelu.ulps << " ulp at " << gelu.at);
  CHECK(gelu.ulps <= 4.0);
  std::vector<float> tail;
  for (float x : xs)
    if (x < -1.0f) tail.push_back(x);
  std::vector<float> got(tail.size());
  for (size_t i = 0; i < tail.size(); ++i)
    got[i] = f32::gelu(tail[i]);
  double worstExcess = 0;
  float worstAt = 0;
  for (size_t i = 0; i < tail.size(); ++i) {
    double x = tail[i], twoU = 2 * 0.79788456080286535588 * (x + 0.044715 * x * x * x);
    double excess = ulpError(got[i], geluExact(x)) / (4 + 2.5 * std::fabs(twoU));
    if (excess > worstExcess || std::isnan(excess)) worstExcess = excess, worstAt = tail[i];
  }
  INFO("gelu, x < -1: worst error / (4 + 2.5 |2u|) ulp = " << worstExcess << " at " << worstAt);
  CHECK(worstExcess <= 1.0);
  CHECK(f32::tanh(kInf) == 1.0f);
  CHECK(f32::tanh(-kInf) == -1.0f);
  CHECK(std::isnan(f32::tanh(kNaN)));
  CHECK(f32::sigmoid(kInf) == 1.0f);
  CHECK(f32::sigmoid(-kInf) == 0.0f);
  CHECK(std::isnan(f32::sigmoid(kNaN)));
  CHECK(f32::gelu(kInf) == kInf);
  CHECK(f32::gelu(-kInf) == 0.0f); // the limit; -20 and below underflow to -0 alike
  CHECK(f32::gelu(-20.0f) == 0.0f);
  CHECK(f32::tanh(10.0f) == 1.0f);
  CHECK(f32::tanh(9.0f) < 1.0f); // 1 - 2 / (e^18 + 1) is still below 1 in f32
  CHECK(std::isnan(f32::gelu(kNaN)));
}

TEST_CASE("f32 pow: within 1 ulp, std::pow's sign and special-value rules", "[mathf32]") {
  std::mt19937 engine(7);
  std::uniform_int_distribution<uint32_t> anyBits;
  std::uniform_real_distribution<float> exponent(-40, 40);
  std::vector<float> xs, ys;
  for (int i = 0; i < 1 << 20; ++i) {
    xs.push_back(std::fabs(fromBits(anyBits(engine))));
    ys.push_back(i % 2 ? exponent(engine) : std::round(exponent(engine))); // integers too
  }
  for (int i = 0; i < 1 << 16; ++i) { // negative bases with integer exponents
    xs.push_back(-std::uniform_real_distribution<float>(0, 10)(engine));
    ys.push_back(std::round(exponent(engine)));
  }
  std::vector<float> got(xs.size());
  for (size_t i = 0; i < xs.size(); ++i)
    got[i] = f32::pow(xs[i], ys[i]);
  double worst = 0;
  float worstX = 0, worstY = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    double error = ulpError(got[i], std::pow(double(xs[i]), double(ys[i])));
    if (error > worst) {
      worst = error;
      worstX = xs[i];
      worstY = ys[i];
    }
  }
  INFO("pow: " << worst << " ulp at " << worstX << "^" << worstY);
  CHECK(worst <= 1.0);
  // Special values: every pair against std::pow on floats.
  std::vector<float> special = {0.0f, -0.0f, 1.0f, -1.0f,  0.5f,  -0.5f,
                                2.0f, -2.0f, 3.0f, -3.0f,  2.5f,  -2.5f,
                                kInf, -kInf, kNaN, 1e-40f, 3e38f, 16777216.0f};
  for (float x : special)
    for (float y : special) {
      float expected = std::pow(x, y);
      float value = f32::pow(x, y);
      INFO("pow(" << x << ", " << y << ") = " << value << ", std::pow: " << expected);
      if (std::isnan(expected))
        CHECK(std::isnan(value));
      else if (expected == 0 || std::isinf(expected))
        CHECK((value == expected && std::signbit(value) == std::signbit(expected)));
      else
        CHECK(ulpError(value, std::pow(double(x), double(y))) <= 1.0);
    }
}
