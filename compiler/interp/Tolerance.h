// The comparison rule of generated code against the reference interpreter (`meshc run --check`);
// tests/e2e/tolerance.py is the same rule for the test scripts, and docs/architecture.md
// "Numerical tolerances" derives the values.
//
// An element passes iff |a - e| <= atol + rtol * |e|, with
//   rtol = rtolUlps(dtype) * unitRoundoff(dtype) * (1 + steps)
//   atol = rtol * rms(e)   (the expected tensor's root-mean-square: its typical scale; an
//                           all-zero tensor has none and takes `fallbackScale`, the RMS of all
//                           the float values compared: the program's typical value)
// dtype: the coarser of the tensor's dtype and the narrowest float dtype the program computes in;
// steps: the optimizer updates the values went through. Integer tensors, NaN and infinities must
// match exactly.
//
// Ill-conditioned elements: given the interpreter's outputs computed in double (`unrounded`, no
// rounding to the dtype), an element that the oracle's own roundings move by d = |e' - e| with
// R d above its bound (R = rtolUlps(dtype): the rule's allowance in roundings) is held to R d
// instead. Its value is that sensitive to rounding (a gradient zero in exact arithmetic, or one
// near adamw's eps, whose normalization amplifies the gradient's rounding into its update), and
// R d is what the rule allows a well-conditioned element, scaled by the oracle's own movement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace meshc::interp {

/// Half the distance from 1 to the next representable number: 2^-24 (f32), 2^-11 (f16), 2^-8
/// (bf16); nullopt for non-float dtypes.
std::optional<double> unitRoundoff(std::string_view dtype);

/// The dtype whose rounding dominates a tensor of `dtype` computed by a program whose narrowest
/// float dtype is `computeDtype` (empty: f32 throughout).
std::string_view toleranceDtype(std::string_view dtype, std::string_view computeDtype);

/// rtol of `dtype` after `steps` optimizer updates (0 for integers). f32Rtol, when given,
/// replaces the f32 value (meshc run --tol).
double relativeTolerance(std::string_view dtype, int64_t steps = 0,
                         std::optional<double> f32Rtol = std::nullopt);

struct Comparison {
  bool pass = true;
  double rtol = 0, atol = 0;
  /// max |a - e| / (atol + rtol |e|): passes iff <= 1 (or the elements over it are all
  /// ill-conditioned, below).
  double ratio = 0;
  /// The smallest rtol under which it would pass (atol = rtol * rms).
  double neededRtol = 0;
  /// Elements over the rule's bound that pass within R times the oracle's own rounding movement
  /// (ill-conditioned; only with `unrounded`), and their worst error over that allowance.
  size_t illConditioned = 0;
  double illConditionedRatio = 0;
  size_t worstIndex = 0;
  double worstActual = 0, worstExpected = 0;
};

/// Root-mean-square of the finite values (0 when there are none).
double rootMeanSquare(const std::vector<double>& values);

/// Compares equally long `actual` and `expected` (of tensor dtype `dtype`) under the rule above;
/// `unrounded`, when given, is the interpreter's double-precision run of `expected` (as long),
/// which lets ill-conditioned elements pass: `pass` counts them in, `ratio` and `neededRtol` stay
/// the rule's own over all elements.
Comparison compareWithTolerance(const std::vector<double>& actual,
                                const std::vector<double>& expected, std::string_view dtype,
                                int64_t steps = 0, std::string_view computeDtype = {},
                                double fallbackScale = 0,
                                std::optional<double> f32Rtol = std::nullopt,
                                const std::vector<double>* unrounded = nullptr);

} // namespace meshc::interp
