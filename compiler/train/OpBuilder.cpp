#include "train/OpBuilder.h"
#include "ir/OpTraits.h"

#include <algorithm>

namespace meshc::train {

using ir::OpKind;
using ir::TensorType;
using ir::ValueId;

ValueId OpBuilder::op(OpKind kind, std::vector<ValueId> operands, TensorType result,
                      std::vector<std::pair<std::string, ir::AttrValue>> attrs, std::string name) {
  ir::Op op{kind, std::move(operands), 0, std::move(attrs), loc_};
  return fn_.addOp(std::move(op), std::move(result), std::move(name));
}

ValueId OpBuilder::literal(double value, ir::DType dtype) {
  auto [it, added] = literals_.try_emplace({value, dtype}, 0);
  if (added) it->second = op(OpKind::Literal, {}, TensorType{dtype, {}}, {{"value", value}});
  return it->second;
}

ValueId OpBuilder::step() {
  return op(OpKind::TrainStep, {}, TensorType{ir::DType::F32, {}});
}

ValueId OpBuilder::unary(OpKind kind, ValueId x) {
  return op(kind, {x}, type(x));
}

ValueId OpBuilder::binary(OpKind kind, ValueId a, ValueId b) {
  TensorType result = type(a);
  for (const ir::Dim& dim : type(b).dims)
    if (!result.hasDim(dim.name)) result.dims.push_back(dim);
  if (ir::opTraits(kind).result == ir::ResultRule::Compare) result.dtype = ir::DType::I32;
  return op(kind, {a, b}, result);
}

ValueId OpBuilder::where(ValueId cond, ValueId a, ValueId b, TensorType result) {
  return op(OpKind::Where, {cond, a, b}, result);
}

ValueId OpBuilder::reduce(OpKind kind, ValueId x, const std::vector<std::string>& dims) {
  TensorType result = type(x);
  std::erase_if(result.dims, [&](const ir::Dim& d) {
    return std::find(dims.begin(), dims.end(), d.name) != dims.end();
  });
  return op(kind, {x}, result, {{"dims", dims}});
}

ValueId OpBuilder::sumAll(ValueId x) {
  std::vector<std::string> dims;
  for (const ir::Dim& dim : type(x).dims)
    dims.push_back(dim.name);
  return reduce(OpKind::ReduceSum, x, dims);
}

ValueId OpBuilder::meanAll(ValueId x) {
  std::vector<std::string> dims;
  for (const ir::Dim& dim : type(x).dims)
    dims.push_back(dim.name);
  return reduce(OpKind::ReduceMean, x, dims);
}

ValueId OpBuilder::cast(ValueId x, ir::DType dtype) {
  if (type(x).dtype == dtype) return x;
  TensorType result = type(x);
  result.dtype = dtype;
  return op(OpKind::Cast, {x}, result);
}

ValueId OpBuilder::broadcastTo(ValueId x, TensorType target) {
  x = cast(x, target.dtype);
  if (type(x) == target) return x;
  bool grows = std::any_of(target.dims.begin(), target.dims.end(),
                           [&](const ir::Dim& d) { return !type(x).hasDim(d.name); });
  return op(grows ? OpKind::Broadcast : OpKind::Transpose, {x}, target);
}

ValueId OpBuilder::fitTo(ValueId x, TensorType target) {
  std::vector<std::string> extra;
  for (const ir::Dim& dim : type(x).dims)
    if (!target.hasDim(dim.name)) extra.push_back(dim.name);
  if (!extra.empty()) x = reduce(OpKind::ReduceSum, x, extra);
  return broadcastTo(x, target);
}

} // namespace meshc::train
