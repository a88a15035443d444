// The interpreter's scalar arithmetic (ScalarMath.h).
#include "interp/ScalarMath.h"

#include "ir/OpTraits.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace meshc::interp {

using ir::DType;
using ir::OpKind;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// Rounds `x` to nearest-even in a binary format with `mantissaBits` stored bits, smallest
/// normal exponent `minExponent` (subnormals below it) and largest finite `maxFinite`; values
/// past the overflow threshold become infinities, as IEEE rounding does.
double roundToFormat(double x, int mantissaBits, int minExponent, double maxFinite) {
  if (x == 0 || !std::isfinite(x)) return x;
  int exponent = std::ilogb(x);
  exponent = std::max(exponent, minExponent);
  double quantum = std::ldexp(1.0, exponent - mantissaBits);
  double rounded = std::nearbyint(x / quantum) * quantum; // default mode: ties to even
  if (std::fabs(rounded) > maxFinite) return std::copysign(kInf, x);
  return rounded;
}

/// Wraps an integral double to int32 two's complement, as the generated code's arithmetic does.
double wrapToI32(double x) {
  if (std::isnan(x)) return 0;
  x = std::trunc(x);
  if (std::fabs(x) >= 0x1p63)
    return x > 0 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int32_t>::min();
  return double(int32_t(uint32_t(uint64_t(int64_t(x)))));
}

/// The language's cast to int32 (docs/language.md; meshrt::kernels::castToI32 in generated
/// code): truncation toward zero, saturating to [-2^31, 2^31 - 128]; NaN gives 0. The upper end
/// is the largest integer below 2^31 that an f32 holds, since generated code holds i32 tensors
/// as floats: so the result is the same in every target.
double saturateToI32(double x) {
  if (std::isnan(x)) return 0;
  return std::clamp(std::trunc(x), double(std::numeric_limits<int32_t>::min()), 2147483520.0);
}

} // namespace

double roundTo(DType dtype, double x) {
  switch (dtype) {
  case DType::F32:
    return double(float(x));
  case DType::BF16:
    return roundToFormat(x, 7, -126, 0x1.FEp127);
  case DType::F16:
    return roundToFormat(x, 10, -14, 65504.0);
  case DType::I32:
    return wrapToI32(x);
  }
  return x;
}

namespace {

double sigmoid(double x) {
  if (x >= 0) return 1 / (1 + std::exp(-x));
  double e = std::exp(x);
  return e / (1 + e);
}

double gelu(double x) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  return 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}

double applyUnary(OpKind kind, double x) {
  switch (kind) {
  case OpKind::Neg:
    return -x;
  case OpKind::Abs:
    return std::fabs(x);
  case OpKind::Exp:
    return std::exp(x);
  case OpKind::Log:
    return std::log(x);
  case OpKind::Sqrt:
    return std::sqrt(x);
  case OpKind::Rsqrt:
    return 1 / std::sqrt(x);
  case OpKind::Square:
    return x * x;
  case OpKind::Tanh:
    return std::tanh(x);
  case OpKind::Sigmoid:
    return sigmoid(x);
  case OpKind::Relu:
    return x > 0 ? x : 0.0;
  case OpKind::Gelu:
    return gelu(x);
  case OpKind::Sin:
    return std::sin(x);
  case OpKind::Cos:
    return std::cos(x);
  case OpKind::Floor:
    return std::floor(x);
  case OpKind::Ceil:
    return std::ceil(x);
  case OpKind::Round: // the default rounding mode: to nearest, halves to even
    return std::nearbyint(x);
  case OpKind::StopGradient:
  case OpKind::Cast:
  case OpKind::Transpose:
  case OpKind::Broadcast:
    return x; // the value itself
  case OpKind::Input:
  case OpKind::Param:
  case OpKind::Literal:
  case OpKind::Iota:
  case OpKind::RandomNormal:
  case OpKind::TrainStep:
  case OpKind::RandomUniform:
  case OpKind::RandomInt:
  case OpKind::Add:
  case OpKind::Sub:
  case OpKind::Mul:
  case OpKind::Div:
  case OpKind::FloorDiv:
  case OpKind::Mod:
  case OpKind::Pow:
  case OpKind::Maximum:
  case OpKind::Minimum:
  case OpKind::Lt:
  case OpKind::Le:
  case OpKind::Gt:
  case OpKind::Ge:
  case OpKind::Eq:
  case OpKind::Ne:
  case OpKind::Where:
  case OpKind::Call:
  case OpKind::Einsum:
  case OpKind::ReduceSum:
  case OpKind::ReduceMean:
  case OpKind::ReduceMax:
  case OpKind::ReduceMin:
  case OpKind::LogSumExp:
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::LayerNorm:
  case OpKind::LayerNormGrad:
  case OpKind::Cumsum:
  case OpKind::Rename:
  case OpKind::Reshape:
  case OpKind::Slice:
  case OpKind::Concat:
  case OpKind::Pad:
  case OpKind::Shift:
  case OpKind::OneHot:
  case OpKind::Gather:
  case OpKind::Dropout:
  case OpKind::TopK:
    return kNaN; // not unary: unary() and evaluateElementwise never ask
  }
  return kNaN; // an OpKind out of range
}

/// Division rounding toward -inf (Python's //); 0 on division by zero. Operands are i32 values,
/// so the quotient fits in int64 (INT32_MIN // -1 wraps when the result is stored).
int64_t floorDivI32(int64_t x, int64_t y) {
  if (y == 0) return 0;
  int64_t q = x / y;
  return (x % y != 0 && (x < 0) != (y < 0)) ? q - 1 : q;
}

/// Integer power with int32 wrap-around; negative exponents follow integer division.
double integerPow(int64_t base, int64_t exponent) {
  if (exponent < 0) return base == 1 ? 1 : base == -1 ? (exponent % 2 ? -1 : 1) : 0;
  uint32_t result = 1, factor = uint32_t(base);
  for (; exponent > 0; exponent >>= 1) {
    if (exponent & 1) result *= factor;
    factor *= factor;
  }
  return double(int32_t(result));
}

} // namespace

double binaryScalar(OpKind kind, double a, double b, bool integer) {
  if (integer) {
    int64_t x = int64_t(a), y = int64_t(b);
    switch (kind) {
    case OpKind::Add:
      return double(x + y);
    case OpKind::Sub:
      return double(x - y);
    case OpKind::Mul: // wrapped in integers: the product may not fit a double's 53 bits
      return double(int32_t(uint32_t(uint64_t(x) * uint64_t(y))));
    case OpKind::Div:
      return y == 0 ? 0.0 : double(x / y);
    case OpKind::FloorDiv:
      return double(floorDivI32(x, y));
    case OpKind::Mod:
      return double(x - y * floorDivI32(x, y));
    case OpKind::Pow:
      return integerPow(x, y);
    default: // the rest compute as doubles below
      break;
    }
  }
  switch (kind) {
  case OpKind::Add:
    return a + b;
  case OpKind::Sub:
    return a - b;
  case OpKind::Mul:
    return a * b;
  case OpKind::Div:
    return a / b;
  case OpKind::FloorDiv: // defined on i32; the float reading keeps IR from text total
    return std::floor(a / b);
  case OpKind::Mod:
    return a - b * std::floor(a / b);
  case OpKind::Pow:
    return std::pow(a, b);
  case OpKind::Maximum:
    return std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b);
  case OpKind::Minimum:
    return std::isnan(a) || std::isnan(b) ? kNaN : std::min(a, b);
  case OpKind::Lt:
    return a < b;
  case OpKind::Le:
    return a <= b;
  case OpKind::Gt:
    return a > b;
  case OpKind::Ge:
    return a >= b;
  case OpKind::Eq:
    return a == b;
  case OpKind::Ne:
    return a != b;
  case OpKind::Input:
  case OpKind::Param:
  case OpKind::Literal:
  case OpKind::Iota:
  case OpKind::RandomNormal:
  case OpKind::TrainStep:
  case OpKind::RandomUniform:
  case OpKind::RandomInt:
  case OpKind::Neg:
  case OpKind::Abs:
  case OpKind::Exp:
  case OpKind::Log:
  case OpKind::Sqrt:
  case OpKind::Rsqrt:
  case OpKind::Square:
  case OpKind::Tanh:
  case OpKind::Sigmoid:
  case OpKind::Relu:
  case OpKind::Gelu:
  case OpKind::Sin:
  case OpKind::Cos:
  case OpKind::Floor:
  case OpKind::Ceil:
  case OpKind::Round:
  case OpKind::StopGradient:
  case OpKind::Cast:
  case OpKind::Transpose:
  case OpKind::Broadcast:
  case OpKind::Where:
  case OpKind::Call:
  case OpKind::Einsum:
  case OpKind::ReduceSum:
  case OpKind::ReduceMean:
  case OpKind::ReduceMax:
  case OpKind::ReduceMin:
  case OpKind::LogSumExp:
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::LayerNorm:
  case OpKind::LayerNormGrad:
  case OpKind::Cumsum:
  case OpKind::Rename:
  case OpKind::Reshape:
  case OpKind::Slice:
  case OpKind::Concat:
  case OpKind::Pad:
  case OpKind::Shift:
  case OpKind::OneHot:
  case OpKind::Gather:
  case OpKind::TopK:
  case OpKind::Dropout:
    return kNaN; // not binary: never asked
  }
  return kNaN; // an OpKind out of range
}

double unaryScalar(OpKind kind, double x, DType result) {
  if (kind == OpKind::Cast && result == DType::I32) return saturateToI32(x);
  if (kind == OpKind::Square && result == DType::I32) return binaryScalar(OpKind::Mul, x, x, true);
  return applyUnary(kind, x);
}

std::optional<double> evaluateElementwise(OpKind kind, const std::vector<double>& args,
                                          const std::vector<DType>& argTypes, DType result) {
  const ir::OpTraits& traits = ir::opTraits(kind);
  // A `call` (variadic) is the user's function, which is not loaded at compile time.
  if (!traits.isElementwise() || traits.isVariadic() || !traits.acceptsOperandCount(args.size()) ||
      argTypes.size() != args.size())
    return std::nullopt;
  double value = 0;
  if (args.size() == 1)
    value = unaryScalar(kind, args[0], result);
  else if (args.size() == 2)
    value = binaryScalar(kind, args[0], args[1],
                         argTypes[0] == DType::I32 && argTypes[1] == DType::I32);
  else if (kind == OpKind::Where)
    value = args[0] != 0 ? args[1] : args[2];
  else
    return std::nullopt;
  return roundTo(result, value);
}

} // namespace meshc::interp
