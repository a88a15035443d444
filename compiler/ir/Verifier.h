// The IR verifier: checks that a Function is well formed by the rules of the op table
// (OpKinds.def): SSA order, operand counts, result types, required attributes, and that the
// inputs/params/outputs/updates tables agree with the ops. A failure is a compiler bug (the
// phase that produced the IR broke an invariant), reported as an internal error naming the op,
// its source location and what is wrong.
#pragma once

#include "ir/IR.h"

#include <string>
#include <vector>

namespace meshc::ir {

struct VerifierError {
  std::string function;
  /// The op at fault ("%3 = add"), or "" for a table entry or a value no op defines.
  std::string op;
  Location loc;
  std::string message;

  /// "file:line:col: in 'fn', op %3 = add: <message>" (the location when known).
  std::string format() const;
};

std::vector<VerifierError> verifyFunction(const Function& fn);
std::vector<VerifierError> verifyModule(const Module& module);

/// The type as the IR prints it: f32[batch, d_model] with sizes (batch=4).
std::string describeType(const TensorType& type);

} // namespace meshc::ir
