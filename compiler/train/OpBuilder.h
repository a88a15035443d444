// Appends ops to a Function with their result types worked out by dim name, so that gradient
// rules and optimizer updates read like the math they implement. Shared by Autodiff and
// Optimizer; every op it adds carries the location it was given (the forward op or the
// `minimize` statement), so plans and errors point at the source.
#pragma once

#include "ir/IR.h"

#include <map>
#include <string>
#include <vector>

namespace meshc::train {

class OpBuilder {
public:
  OpBuilder(ir::Function& fn, ir::Location loc) : fn_(fn), loc_(std::move(loc)) {}

  ir::Function& function() { return fn_; }
  const ir::TensorType& type(ir::ValueId v) const { return fn_.typeOf(v); }
  void setLocation(ir::Location loc) { loc_ = std::move(loc); }

  /// Any op with an explicit result type.
  ir::ValueId op(ir::OpKind kind, std::vector<ir::ValueId> operands, ir::TensorType result,
                 std::vector<std::pair<std::string, ir::AttrValue>> attrs = {},
                 std::string name = {});

  /// A scalar constant of `dtype` (one op per distinct constant: later uses share it).
  ir::ValueId literal(double value, ir::DType dtype = ir::DType::F32);
  /// The `step` op (f32 scalar).
  ir::ValueId step();
  ir::ValueId unary(ir::OpKind kind, ir::ValueId x);
  /// Elementwise a (op) b broadcasting by name: the result has a's dims then b's new ones and
  /// a's dtype (i32 for comparisons).
  ir::ValueId binary(ir::OpKind kind, ir::ValueId a, ir::ValueId b);
  ir::ValueId add(ir::ValueId a, ir::ValueId b) { return binary(ir::OpKind::Add, a, b); }
  ir::ValueId sub(ir::ValueId a, ir::ValueId b) { return binary(ir::OpKind::Sub, a, b); }
  ir::ValueId mul(ir::ValueId a, ir::ValueId b) { return binary(ir::OpKind::Mul, a, b); }
  ir::ValueId div(ir::ValueId a, ir::ValueId b) { return binary(ir::OpKind::Div, a, b); }
  ir::ValueId mul(ir::ValueId a, double b) { return mul(a, literal(b, type(a).dtype)); }
  ir::ValueId add(ir::ValueId a, double b) { return add(a, literal(b, type(a).dtype)); }
  ir::ValueId neg(ir::ValueId x) { return unary(ir::OpKind::Neg, x); }
  /// where(cond, a, b) with the result type `result`.
  ir::ValueId where(ir::ValueId cond, ir::ValueId a, ir::ValueId b, ir::TensorType result);
  /// Sum (or mean) of x over `dims` (all of x's dims when empty and `all` is set).
  ir::ValueId reduce(ir::OpKind kind, ir::ValueId x, const std::vector<std::string>& dims);
  ir::ValueId sumAll(ir::ValueId x);
  ir::ValueId meanAll(ir::ValueId x);
  /// x repeated along the dims of `target` it lacks, in `target`'s order and dtype.
  ir::ValueId broadcastTo(ir::ValueId x, ir::TensorType target);
  /// x made to have exactly `target`'s type: summed over dims `target` lacks, broadcast along
  /// dims it has and x lacks, transposed to its order, cast to its dtype.
  ir::ValueId fitTo(ir::ValueId x, ir::TensorType target);
  ir::ValueId cast(ir::ValueId x, ir::DType dtype);

private:
  ir::Function& fn_;
  ir::Location loc_;
  std::map<std::pair<double, ir::DType>, ir::ValueId> literals_;
};

} // namespace meshc::train
