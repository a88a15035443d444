// The comparison rule of generated code against the interpreter (interp/Tolerance.h): the
// values of docs/architecture.md "Numerical tolerances", the elementwise mixed bound, and the
// cases the old rule (error over the tensor's largest value) got wrong. tests/e2e/
// test_tolerance.py checks tolerance.py, the Python copy, on the same cases.
#include "interp/Tolerance.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

using namespace meshc::interp;

TEST_CASE("tolerances per dtype are R times the unit roundoff", "[tolerance]") {
  CHECK(unitRoundoff("f32") == std::ldexp(1.0, -24));
  CHECK(unitRoundoff("bf16") == std::ldexp(1.0, -8));
  CHECK(unitRoundoff("f16") == std::ldexp(1.0, -11));
  CHECK_FALSE(unitRoundoff("i32").has_value());
  CHECK(relativeTolerance("f32") == 1024 * std::ldexp(1.0, -24));
  CHECK(relativeTolerance("bf16") == 8 * std::ldexp(1.0, -8));
  CHECK(relativeTolerance("f16") == 8 * std::ldexp(1.0, -11));
  CHECK(relativeTolerance("i32") == 0);
  // Linear in the optimizer updates; --tol replaces the f32 value only.
  CHECK(relativeTolerance("f32", 20) == 21 * relativeTolerance("f32"));
  CHECK(relativeTolerance("f32", 3, 1e-3) == 4e-3);
  CHECK(relativeTolerance("bf16", 0, 1e-3) == relativeTolerance("bf16"));
  // An f32 output of a bf16 computation carries bf16 rounding; never the reverse.
  CHECK(toleranceDtype("f32", "bf16") == "bf16");
  CHECK(toleranceDtype("f32", "f16") == "f16");
  CHECK(toleranceDtype("bf16", "f16") == "bf16");
  CHECK(toleranceDtype("f32", "") == "f32");
  CHECK(toleranceDtype("i32", "bf16") == "i32");
}

TEST_CASE("each element gets atol + rtol |e| with atol from the tensor's RMS", "[tolerance]") {
  double rtol = relativeTolerance("f32");
  std::vector<double> expected = {4, -3, 0}; // rms = sqrt(25 / 3)
  double atol = rtol * std::sqrt(25.0 / 3);
  std::vector<double> actual = expected;
  actual[0] += 0.99 * (atol + rtol * 4);
  actual[2] -= 0.99 * atol; // a value that is 0 in the oracle: the absolute floor applies
  Comparison c = compareWithTolerance(actual, expected, "f32");
  CHECK(c.pass);
  CHECK(c.atol == Approx(atol));
  CHECK(c.ratio == Approx(0.99));
  actual[2] = -1.01 * atol;
  c = compareWithTolerance(actual, expected, "f32");
  CHECK_FALSE(c.pass);
  CHECK(c.worstIndex == 2);
  CHECK(c.ratio == Approx(1.01));
  // neededRtol is the threshold: it passes there and fails just below.
  CHECK(compareWithTolerance(actual, expected, "f32", 0, "", 0, c.neededRtol * 1.000001).pass);
  CHECK_FALSE(compareWithTolerance(actual, expected, "f32", 0, "", 0, c.neededRtol * 0.999).pass);
}

TEST_CASE("an error in a small entry is not hidden by a large one", "[tolerance]") {
  // 999 entries near 1 and one of 100: scaled by the largest value (the old rule), an error of
  // 1e-3 in a unit entry was 1e-5 "relative" and passed at 1e-4; here it is ~4 times its bound.
  std::vector<double> expected(1000, 1.0);
  expected[7] = 100;
  std::vector<double> actual = expected;
  actual[3] += 1e-3;
  Comparison c = compareWithTolerance(actual, expected, "f32");
  CHECK_FALSE(c.pass);
  CHECK(c.worstIndex == 3);
  // The same relative error in the large entry passes.
  actual = expected;
  actual[7] *= 1 + 5e-5;
  CHECK(compareWithTolerance(actual, expected, "f32").pass);
}

TEST_CASE("all-zero expected tensors take the program's typical scale", "[tolerance]") {
  std::vector<double> zeros(16, 0.0), residue(16, 0.0);
  residue[5] = 1e-9; // rounding residue where the oracle's terms cancel exactly
  CHECK(compareWithTolerance(zeros, zeros, "f32").pass);
  CHECK_FALSE(compareWithTolerance(residue, zeros, "f32").pass); // no scale at all: exact
  CHECK(compareWithTolerance(residue, zeros, "f32", 0, "", 0.5).pass);
  residue[5] = 1e-3; // a real value where zero is expected still fails
  CHECK_FALSE(compareWithTolerance(residue, zeros, "f32", 0, "", 0.5).pass);
  CHECK(rootMeanSquare({3, 4, NAN}) == Approx(std::sqrt(12.5)));
}

TEST_CASE("integers, NaN, infinities and sizes must match exactly", "[tolerance]") {
  CHECK(compareWithTolerance({1, 2, 3}, {1, 2, 3}, "i32").pass);
  CHECK_FALSE(compareWithTolerance({1, 2, 4}, {1, 2, 3}, "i32").pass);
  CHECK(compareWithTolerance({NAN, INFINITY, 1}, {NAN, INFINITY, 1}, "f32").pass);
  CHECK_FALSE(compareWithTolerance({NAN, 1}, {1, 1}, "f32").pass);
  CHECK_FALSE(compareWithTolerance({-INFINITY, 1}, {INFINITY, 1}, "f32").pass);
  CHECK_FALSE(compareWithTolerance({1e30, 1}, {INFINITY, 1}, "f32").pass);
  CHECK_FALSE(compareWithTolerance({1, 2}, {1, 2, 3}, "f32").pass);
}

TEST_CASE("bf16 programs and training steps widen the bound as stated", "[tolerance]") {
  std::vector<double> expected = {1, -1, 1, -1}, actual = {1.02, -1, 1, -1};
  CHECK_FALSE(compareWithTolerance(actual, expected, "f32").pass);
  CHECK(compareWithTolerance(actual, expected, "f32", 0, "bf16").pass);
  // 2e-2 is ~ 164 f32 bounds (rtol + atol = 2 rtol here): it passes after 163 updates, not 162.
  double bound = 2 * relativeTolerance("f32");
  int64_t steps = int64_t(std::ceil(0.02 / bound)) - 1;
  CHECK(compareWithTolerance(actual, expected, "f32", steps).pass);
  CHECK_FALSE(compareWithTolerance(actual, expected, "f32", steps - 1).pass);
}

TEST_CASE("ill-conditioned elements are held to R times the oracle's own rounding movement",
          "[tolerance]") {
  // Element 0 is near adamw's eps regime: the interpreter in double differs from the rounded one
  // by d = 1e-6 there, so R d = 1024e-6 is its allowance; element 1 is well conditioned (the
  // double run agrees with the rounded one to 1e-12).
  std::vector<double> expected = {1e-3, 1.0}, unrounded = {1e-3 + 1e-6, 1.0 + 1e-12};
  std::vector<double> actual = {1e-3 + 5e-4, 1.0};
  Comparison plain = compareWithTolerance(actual, expected, "f32");
  CHECK_FALSE(plain.pass);
  Comparison probed =
      compareWithTolerance(actual, expected, "f32", 0, "", 0, std::nullopt, &unrounded);
  CHECK(probed.pass);
  CHECK(probed.illConditioned == 1);
  CHECK(probed.illConditionedRatio == Approx(5e-4 / 1024e-6));
  CHECK(probed.ratio == Approx(plain.ratio)); // the rule's own ratio is still reported
  // Beyond R d it fails: the oracle's movement excuses that much and no more.
  actual[0] = 1e-3 + 2e-3;
  CHECK_FALSE(
      compareWithTolerance(actual, expected, "f32", 0, "", 0, std::nullopt, &unrounded).pass);
  // A well-conditioned element gets nothing from the probe: an error over its bound fails.
  actual = {1e-3, 1.0 + 1e-3};
  CHECK_FALSE(
      compareWithTolerance(actual, expected, "f32", 0, "", 0, std::nullopt, &unrounded).pass);
  // Under a tighter --tol the same ill-conditioned element still passes within R d (R and the
  // gate are the default rule's), while the well-conditioned one is held to --tol.
  actual = {1e-3 + 5e-4, 1.0 + 1e-9};
  CHECK(compareWithTolerance(actual, expected, "f32", 0, "", 0, 1e-4, &unrounded).pass);
  CHECK_FALSE(compareWithTolerance(actual, expected, "f32", 0, "", 0, 1e-12, &unrounded).pass);
}
