// Adafactor's clipping sums in the order the split dims call for (OrderFactoredSums.h). The chain
// the optimizer lowering writes for a factored weight (Optimizer.cpp, factoredMeanSquare), with F
// the dim summed first, `local` the statistic that keeps F (vc for C, vr for R) and `other` the
// one that keeps the other factored dim:
//   d = g^2 / local;  inner = mean_F(d) [marked];  q = rowMean / other;  p = inner * q;
//   mean(u^2) = mean over all of p's dims.
// Swapping `local` and `other` and summing over the other dim gives the same value.
#include "train/OrderFactoredSums.h"

#include <algorithm>
#include <optional>

namespace meshc::train {
namespace {

using ir::OpKind;
using ir::TensorType;
using ir::ValueId;

/// a (op) b's type as train::OpBuilder gives it: a's dims, then b's that a lacks; a's dtype.
TensorType broadcastType(const TensorType& a, const TensorType& b) {
  TensorType result = a;
  for (const ir::Dim& dim : b.dims)
    if (!result.hasDim(dim.name)) result.dims.push_back(dim);
  return result;
}

class SumOrder {
public:
  explicit SumOrder(ir::Function& fn) : fn(fn), uses(fn.values.size(), 0), user(fn.values.size()) {
    for (size_t i = 0; i < fn.ops.size(); ++i)
      for (ValueId operand : fn.ops[i].operands) {
        ++uses[operand];
        user[operand] = i;
      }
    for (const ir::ParamUpdate& update : fn.updates)
      uses[update.value] += 2; // never the chain's private value
    for (const ir::OutputInfo& output : fn.outputs)
      uses[output.value] += 2;
  }

  /// Rewrites the chain of marked sum `innerOp` to sum first over the dim `splits` calls for.
  void order(size_t innerOp, const SplitsDim& splits);

private:
  /// The one op reading `value`, when only one op reads it.
  std::optional<size_t> onlyUser(ValueId value) const {
    if (uses[value] != 1) return std::nullopt;
    return user[value];
  }

  ir::Function& fn;
  std::vector<int> uses;
  std::vector<size_t> user;
};

void SumOrder::order(size_t innerOp, const SplitsDim& splits) {
  ir::Op& inner = fn.ops[innerOp];
  std::vector<std::string> pair = inner.dims(kFactoredSumAttr);
  std::vector<std::string> summed = inner.dims("dims");
  if (pair.size() != 2 || summed.size() != 1) return;
  const TensorType& weight = fn.typeOf(inner.operands[0]); // g^2 / local: the weight's dims
  const std::string& row = pair[0];
  const std::string& col = pair[1];
  // R whenever it is split: the inner sum then needs vr' resolved, as the mean of vr' over R
  // does, and resolves with it (with C split too, the rest is one all-reduce over C's axes).
  const std::string& first = splits(weight, row) ? row : col;
  if (summed[0] == first || (summed[0] != row && summed[0] != col)) return;
  ir::Op& d = fn.ops[fn.values[inner.operands[0]].definingOp];
  std::optional<size_t> pOp = onlyUser(inner.result);
  if (d.kind != OpKind::Div || !onlyUser(d.result) || !pOp) return;
  ir::Op& p = fn.ops[*pOp];
  if (p.kind != OpKind::Mul || p.operands.size() != 2 || p.operands[0] != inner.result) return;
  ir::Op& q = fn.ops[fn.values[p.operands[1]].definingOp];
  std::optional<size_t> allOp = onlyUser(p.result);
  if (q.kind != OpKind::Div || !onlyUser(q.result) || !allOp) return;
  ir::Op& all = fn.ops[*allOp];
  if (all.kind != OpKind::ReduceMean || !fn.typeOf(all.result).dims.empty()) return;
  // The statistic d divides by keeps `first` after the swap; the one q divides by lacks it.
  if (!fn.typeOf(q.operands[1]).hasDim(first) || fn.typeOf(d.operands[1]).hasDim(first)) return;

  std::swap(d.operands[1], q.operands[1]);
  TensorType innerType = fn.typeOf(d.result);
  std::erase_if(innerType.dims, [&](const ir::Dim& dim) { return dim.name == first; });
  inner.setAttr("dims", std::vector<std::string>{first});
  fn.values[inner.result].type = innerType;
  fn.values[q.result].type = broadcastType(fn.typeOf(q.operands[0]), fn.typeOf(q.operands[1]));
  TensorType pType = broadcastType(innerType, fn.typeOf(q.result));
  fn.values[p.result].type = pType;
  std::vector<std::string> allDims;
  for (const ir::Dim& dim : pType.dims)
    allDims.push_back(dim.name);
  all.setAttr("dims", allDims);
}

} // namespace

std::vector<std::string> orderFactoredSums(ir::Function& fn, const SplitsDim& splits) {
  std::optional<SumOrder> rewriter;
  for (size_t i = 0; i < fn.ops.size(); ++i)
    if (fn.ops[i].attr(kFactoredSumAttr)) {
      if (!rewriter) rewriter.emplace(fn);
      rewriter->order(i, splits);
    }
  return factoredSumOrder(fn);
}

std::vector<std::string> factoredSumOrder(const ir::Function& fn) {
  std::vector<std::string> order;
  for (const ir::Op& op : fn.ops)
    if (op.attr(kFactoredSumAttr)) {
      std::vector<std::string> summed = op.dims("dims");
      order.push_back(summed.empty() ? std::string() : summed.front());
    }
  return order;
}

} // namespace meshc::train
