// The interpreter's scalar arithmetic: one element of an elementwise op, computed in double,
// and the rounding of a value to its dtype. run() applies these element by element; the code
// generator folds constants with evaluateElementwise, so a folded literal is the oracle's value.
#pragma once
#include "ir/IR.h"

#include <optional>
#include <vector>

namespace meshc::interp {

/// `x` rounded to `dtype`: f32, bf16 and f16 to nearest even (overflow to infinity), i32
/// wrapped as two's complement, as the generated code's arithmetic does.
double roundTo(ir::DType dtype, double x);

/// One element of the unary op `kind` whose result is of dtype `result` (a cast to i32
/// saturates; an i32 square wraps), before rounding. NaN for an op that is not unary.
double unaryScalar(ir::OpKind kind, double x, ir::DType result);

/// One element of the binary op `kind`; `integer` when both operands are i32 (integer
/// division, modulo and power, wrapping). Before rounding. NaN for an op that is not binary.
double binaryScalar(ir::OpKind kind, double a, double b, bool integer);

/// One point of the elementwise op `kind`: `args` (each already of its dtype `argTypes`), the
/// result rounded to `result`, exactly as run() computes it. The code generator folds constants
/// with it. nullopt for an op that is not elementwise or is the user's function.
std::optional<double> evaluateElementwise(ir::OpKind kind, const std::vector<double>& args,
                                          const std::vector<ir::DType>& argTypes, ir::DType result);

} // namespace meshc::interp
