#include "interp/Tolerance.h"

#include <algorithm>
#include <cmath>

namespace meshc::interp {
namespace {

/// rtol in units of the dtype's unit roundoff (docs/architecture.md "Numerical tolerances").
std::optional<double> rtolUlps(std::string_view dtype) {
  if (dtype == "f32") return 1024.0;
  if (dtype == "f16") return 8.0;
  if (dtype == "bf16") return 8.0;
  return std::nullopt;
}

} // namespace

std::optional<double> unitRoundoff(std::string_view dtype) {
  if (dtype == "f32") return std::ldexp(1.0, -24);
  if (dtype == "f16") return std::ldexp(1.0, -11);
  if (dtype == "bf16") return std::ldexp(1.0, -8);
  return std::nullopt;
}

std::string_view toleranceDtype(std::string_view dtype, std::string_view computeDtype) {
  std::optional<double> own = unitRoundoff(dtype), compute = unitRoundoff(computeDtype);
  return own && compute && *compute > *own ? computeDtype : dtype;
}

double relativeTolerance(std::string_view dtype, int64_t steps, std::optional<double> f32Rtol) {
  std::optional<double> ulps = rtolUlps(dtype);
  if (!ulps) return 0;
  double base = dtype == "f32" && f32Rtol ? *f32Rtol : *ulps * *unitRoundoff(dtype);
  return base * double(1 + steps);
}

double rootMeanSquare(const std::vector<double>& values) {
  double sumSquares = 0;
  size_t finite = 0;
  for (double v : values)
    if (std::isfinite(v)) {
      sumSquares += v * v;
      ++finite;
    }
  return finite ? std::sqrt(sumSquares / double(finite)) : 0.0;
}

Comparison compareWithTolerance(const std::vector<double>& actual,
                                const std::vector<double>& expected, std::string_view dtype,
                                int64_t steps, std::string_view computeDtype, double fallbackScale,
                                std::optional<double> f32Rtol,
                                const std::vector<double>* unrounded) {
  Comparison result;
  std::string_view ruleDtype = toleranceDtype(dtype, computeDtype);
  result.rtol = relativeTolerance(ruleDtype, steps, f32Rtol);
  // The default bound and R decide which elements are ill-conditioned (not --tol's: an element
  // the oracle determines to the default bound stays held to a tighter --tol).
  double defaultRtol = relativeTolerance(ruleDtype, steps),
         roundings = rtolUlps(ruleDtype).value_or(0);
  double rms = rootMeanSquare(expected);
  if (rms == 0) rms = fallbackScale;
  result.atol = result.rtol * rms;
  if (actual.size() != expected.size() || (unrounded && unrounded->size() != expected.size())) {
    result.pass = false;
    result.ratio = result.neededRtol = INFINITY;
    return result;
  }
  // error / bound, with 0/0 = 0 (exact where nothing is allowed) and x/0 = inf.
  auto quotient = [](double error, double bound) {
    return bound > 0 ? error / bound : error == 0 ? 0.0 : INFINITY;
  };
  double unexplained = 0; // the worst ratio of the elements not excused as ill-conditioned
  for (size_t i = 0; i < expected.size(); ++i) {
    double a = actual[i], e = expected[i], ratio = 0, needed = 0;
    if (!std::isfinite(a) || !std::isfinite(e)) {
      bool same = a == e || (std::isnan(a) && std::isnan(e));
      ratio = needed = same ? 0.0 : INFINITY;
      unexplained = std::max(unexplained, ratio);
    } else {
      double error = std::fabs(a - e);
      ratio = quotient(error, result.atol + result.rtol * std::fabs(e));
      needed = quotient(error, rms + std::fabs(e));
      double moved = unrounded && std::isfinite((*unrounded)[i])
                         ? roundings * std::fabs((*unrounded)[i] - e)
                         : 0.0;
      if (ratio > 1 && moved > defaultRtol * (rms + std::fabs(e)) && error <= moved) {
        ++result.illConditioned;
        result.illConditionedRatio = std::max(result.illConditionedRatio, error / moved);
      } else {
        unexplained = std::max(unexplained, ratio);
      }
    }
    result.neededRtol = std::max(result.neededRtol, needed);
    if (ratio > result.ratio || i == 0) {
      result.ratio = std::max(result.ratio, ratio);
      result.worstIndex = i;
      result.worstActual = a;
      result.worstExpected = e;
    }
  }
  result.pass = unexplained <= 1.0;
  return result;
}

} // namespace meshc::interp
