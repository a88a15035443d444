// The lowering rules of one op (OpRules.h).
#include "planner/OpRules.h"

#include "planner/AllReduceChains.h"
#include "planner/Reshard.h"
#include "planner/SequenceParallel.h"

#include "ir/OpTraits.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

namespace meshc::plan {

using ir::OpKind;

namespace {

/// The peak FLOP rate of `machine` for `dtype` (bf16/f16 at their own where the machine has one).
double peakFor(const Machine& machine, ir::DType dtype) {
  if ((dtype == ir::DType::BF16 || dtype == ir::DType::F16) && machine.peakFlopsBf16 > 0)
    return machine.peakFlopsBf16;
  return machine.peakFlops;
}

} // namespace

std::string axesText(const AxisList& axes) {
  return fmt::format("{}", fmt::join(axes, ", "));
}

bool isLinearUnary(const ir::Function& fn, const ir::Op& op) {
  if (op.operands.size() != 1 || !ir::opTraits(op.kind).isLinearIn(0)) return false;
  if (op.kind == OpKind::Cast)
    return ir::isFloat(fn.typeOf(op.operands[0]).dtype) && ir::isFloat(fn.typeOf(op.result).dtype);
  return true;
}

void OpRules::setPartner(std::set<std::string> axes, bool isDiv) {
  partnerAxes_ = std::move(axes);
  partnerIsDiv_ = isDiv;
}

std::set<std::string> OpRules::reducedAxesOf(const ir::Op& sum) const {
  const ir::TensorType& operandType = fn_.typeOf(sum.operands[0]);
  const ir::TensorType& resultType = fn_.typeOf(sum.result);
  TensorLayout required = desired(operandType, nullptr, "");
  std::set<std::string> axes;
  for (size_t i = 0; i < operandType.dims.size(); ++i)
    if (!resultType.hasDim(operandType.dims[i].name))
      axes.insert(required.dimAxes[i].begin(), required.dimAxes[i].end());
  return axes;
}

OpPlan OpRules::plan(const ir::Op& op, const std::vector<const TensorLayout*>& operands) {
  OpPlan out;
  const ir::TensorType& resultType = fn_.typeOf(op.result);
  checkDivisible(resultType, out);
  switch (op.kind) {
  case OpKind::Input:
  case OpKind::Param:
  case OpKind::Literal:
  case OpKind::Iota:
  case OpKind::RandomNormal:
  case OpKind::RandomUniform:
  case OpKind::RandomInt:
  case OpKind::TrainStep:
    out.result = desired(resultType, &out, "");
    break;
  case OpKind::Einsum:
    planEinsum(op, operands, out);
    break;
  case OpKind::ReduceSum:
  case OpKind::ReduceMean:
  case OpKind::ReduceMax:
  case OpKind::ReduceMin:
  case OpKind::LogSumExp:
    planReduction(op, operands, out);
    break;
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::LayerNorm:
  case OpKind::LayerNormGrad:
  case OpKind::Cumsum:
  case OpKind::Shift:
    planAlongDims(op, operands, out);
    break;
  case OpKind::Rename:
    planRename(op, operands, out);
    break;
  case OpKind::Reshape:
    planReshape(op, operands, out);
    break;
  case OpKind::Slice:
  case OpKind::Pad:
  case OpKind::Concat:
    planWindow(op, operands, out);
    break;
  case OpKind::Gather:
    planGather(op, operands, out);
    break;
  case OpKind::TopK:
    planTopK(op, out);
    break;
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
  case OpKind::OneHot:  // the ids' dims plus [dim]: aligned as elementwise
  case OpKind::Dropout: // elementwise with a mask keyed by the global element index
    planElementwise(op, operands, out);
    break;
  }
  cost(op, operands, out);
  return out;
}

void OpRules::checkDivisible(const ir::TensorType& type, OpPlan& out) const {
  for (const ir::Dim& dim : type.dims) {
    const AxisList& axes = layout_.of(dim.name);
    int64_t factor = splitFactor(mesh_, axes);
    if (out.divisible && factor > 1 && dim.size % factor != 0) {
      out.divisible = false;
      out.badDim = dim.name;
      out.badAxes = axes;
    }
  }
}

TensorLayout OpRules::desired(const ir::TensorType& type, OpPlan* out,
                              const std::string& what) const {
  TensorLayout result = tensorLayoutOf(type, layout_, mesh_);
  for (size_t i = 0; i < type.dims.size(); ++i) {
    const AxisList& wanted = layout_.of(type.dims[i].name);
    if (wanted.size() == result.dimAxes[i].size() || !out) continue;
    AxisList dropped;
    for (const std::string& axis : wanted)
      if (std::find(result.dimAxes[i].begin(), result.dimAxes[i].end(), axis) ==
          result.dimAxes[i].end())
        dropped.push_back(axis);
    out->drops.push_back(
        {type.dims[i].name, dropped,
         fmt::format("mesh axis {} already splits another dim of {}", axesText(dropped),
                     what.empty() ? std::string("this value") : what)});
  }
  return result;
}

TensorLayout OpRules::alignTo(const ir::TensorType& type, const ir::TensorType& sourceType,
                              const TensorLayout& source) {
  TensorLayout out;
  for (const ir::Dim& dim : type.dims) {
    int index = sourceType.findDim(dim.name);
    out.dimAxes.push_back(index >= 0 ? source.dimAxes[index] : AxisList{});
  }
  return out;
}

std::set<std::string> OpRules::usedAxes(const TensorLayout& layout) {
  std::set<std::string> used;
  for (const AxisList& axes : layout.dimAxes)
    used.insert(axes.begin(), axes.end());
  return used;
}

bool OpRules::disjoint(const std::set<std::string>& a, const std::set<std::string>& b) {
  for (const std::string& axis : a)
    if (b.count(axis)) return false;
  return true;
}

bool OpRules::isPartialSum(const TensorLayout& layout) {
  return !layout.partialAxes.empty() && !layout.partialIsMax;
}

bool OpRules::passPartial(const TensorLayout& operand, TensorLayout& required,
                          TensorLayout& result) const {
  if (!lazyPartials_ || eager_.count(&operand) || !isPartialSum(operand) ||
      !disjoint(operand.partialAxes, usedAxes(required)) ||
      !disjoint(operand.partialAxes, usedAxes(result)) ||
      !disjoint(operand.partialAxes, result.partialAxes))
    return false;
  required.partialAxes = operand.partialAxes;
  result.partialAxes.insert(operand.partialAxes.begin(), operand.partialAxes.end());
  return true;
}

void OpRules::planElementwise(const ir::Op& op, const std::vector<const TensorLayout*>& operands,
                              OpPlan& out) {
  const ir::TensorType& resultType = fn_.typeOf(op.result);
  out.result = desired(resultType, &out, "");
  for (ir::ValueId operand : op.operands)
    out.required.push_back(alignTo(fn_.typeOf(operand), resultType, out.result));
  if (operands.empty()) return;
  // Linear cases keep a partial sum lazy.
  if (operands.size() == 1 && isLinearUnary(fn_, op)) {
    passPartial(*operands[0], out.required[0], out.result);
    return;
  }
  if (operands.size() != 2) return;
  const TensorLayout& a = *operands[0];
  const TensorLayout& b = *operands[1];
  if ((op.kind == OpKind::Add || op.kind == OpKind::Sub) && isPartialSum(a) && isPartialSum(b) &&
      a.partialAxes == b.partialAxes) {
    TensorLayout result = out.result;
    if (passPartial(a, out.required[0], result)) {
      out.required[1].partialAxes = b.partialAxes;
      out.result = result;
    }
    return;
  }
  if (op.kind == OpKind::Mul && isPartialSum(a) != isPartialSum(b)) {
    size_t partial = isPartialSum(a) ? 0 : 1;
    passPartial(*operands[partial], out.required[partial], out.result);
    return;
  }
  if (op.kind == OpKind::Div && isPartialSum(a) && b.partialAxes.empty())
    passPartial(a, out.required[0], out.result);
}

void OpRules::planEinsum(const ir::Op& op, const std::vector<const TensorLayout*>& operands,
                         OpPlan& out) {
  const ir::TensorType& resultType = fn_.typeOf(op.result);
  // Each dim of the einsum gets one split, output dims first; an axis already taken is dropped.
  std::vector<std::string> order;
  for (const ir::Dim& dim : resultType.dims)
    order.push_back(dim.name);
  std::vector<std::string> contracted;
  for (ir::ValueId operand : op.operands)
    for (const ir::Dim& dim : fn_.typeOf(operand).dims)
      if (!resultType.hasDim(dim.name) &&
          std::find(contracted.begin(), contracted.end(), dim.name) == contracted.end())
        contracted.push_back(dim.name);
  order.insert(order.end(), contracted.begin(), contracted.end());
  std::map<std::string, AxisList> assigned;
  std::set<std::string> taken;
  std::map<std::string, std::string> takenBy;
  for (const std::string& dim : order) {
    AxisList kept, dropped;
    std::string clash;
    for (const std::string& axis : axesOf(dim)) {
      if (taken.insert(axis).second) {
        kept.push_back(axis);
        takenBy[axis] = dim;
      } else {
        dropped.push_back(axis);
        clash = takenBy[axis];
      }
    }
    if (!dropped.empty())
      out.drops.push_back({dim, dropped,
                           fmt::format("mesh axis {} already splits dim '{}' of this einsum",
                                       axesText(dropped), clash)});
    assigned[dim] = kept;
  }
  auto layoutOf = [&](const ir::TensorType& type) {
    TensorLayout layout;
    for (const ir::Dim& dim : type.dims)
      layout.dimAxes.push_back(assigned[dim.name]);
    return layout;
  };
  for (ir::ValueId operand : op.operands)
    out.required.push_back(layoutOf(fn_.typeOf(operand)));
  out.result = layoutOf(resultType);
  for (const std::string& dim : contracted)
    out.result.partialAxes.insert(assigned[dim].begin(), assigned[dim].end());
  // One partial operand stays lazy (the einsum is linear in each operand).
  int partialOperand = -1, partialCount = 0;
  for (size_t i = 0; i < operands.size(); ++i)
    if (!operands[i]->partialAxes.empty()) {
      ++partialCount;
      partialOperand = static_cast<int>(i);
    }
  if (partialCount == 1 && disjoint(operands[partialOperand]->partialAxes, taken))
    passPartial(*operands[partialOperand], out.required[partialOperand], out.result);
}

void OpRules::planReduction(const ir::Op& op, const std::vector<const TensorLayout*>& operands,
                            OpPlan& out) {
  const ir::TensorType& operandType = fn_.typeOf(op.operands[0]);
  const ir::TensorType& resultType = fn_.typeOf(op.result);
  TensorLayout required = desired(operandType, &out, "the reduced operand");
  out.result = alignTo(resultType, operandType, required);
  std::set<std::string> reducedAxes;
  for (size_t i = 0; i < operandType.dims.size(); ++i)
    if (!resultType.hasDim(operandType.dims[i].name))
      reducedAxes.insert(required.dimAxes[i].begin(), required.dimAxes[i].end());
  out.required.push_back(required);
  AxisList reduced;
  for (const ir::MeshAxis& axis : mesh_.axes)
    if (reducedAxes.count(axis.name)) reduced.push_back(axis.name);
  if (op.kind == OpKind::ReduceSum || op.kind == OpKind::ReduceMean) {
    passPartial(*operands[0], out.required[0], out.result);
    out.result.partialAxes.insert(reducedAxes.begin(), reducedAxes.end());
    widenToPartner(operandType, resultType, out);
    return;
  }
  if (reduced.empty()) return;
  int64_t bytes = localBytes(resultType, out.result, mesh_);
  if (op.kind == OpKind::LogSumExp) {
    addPost(out, CollectiveKind::AllReduceMax, reduced, "", bytes,
            "logsumexp over split dims: all-reduce of the local maxima");
    addPost(out, CollectiveKind::AllReduceSum, reduced, "", bytes,
            "logsumexp over split dims: all-reduce of the local sums of exp");
  } else {
    bool isMax = op.kind == OpKind::ReduceMax;
    addPost(out, isMax ? CollectiveKind::AllReduceMax : CollectiveKind::AllReduceMin, reduced, "",
            bytes,
            fmt::format("{} over split dims: all-reduce of the local {}", isMax ? "max" : "min",
                        isMax ? "maxima" : "minima"));
  }
}

void OpRules::widenToPartner(const ir::TensorType& operandType, const ir::TensorType& resultType,
                             OpPlan& out) const {
  TensorLayout& required = out.required[0];
  if (partnerAxes_.empty() || !required.partialAxes.empty() || out.result.partialIsMax) return;
  // A div keeps a partial numerator lazy over a replicated denominator: leave that so.
  if (partnerIsDiv_ && out.result.partialAxes.empty()) return;
  AxisList extra;
  for (const ir::MeshAxis& axis : mesh_.axes)
    if (partnerAxes_.count(axis.name) && !out.result.partialAxes.count(axis.name))
      extra.push_back(axis.name);
  if (extra.empty() || !std::includes(partnerAxes_.begin(), partnerAxes_.end(),
                                      out.result.partialAxes.begin(), out.result.partialAxes.end()))
    return;
  std::set<std::string> used = usedAxes(required);
  for (const std::string& axis : extra)
    if (used.count(axis)) return;
  int64_t factor = splitFactor(mesh_, extra);
  for (size_t i = 0; i < operandType.dims.size(); ++i) {
    const ir::Dim& dim = operandType.dims[i];
    if (resultType.hasDim(dim.name) || !required.dimAxes[i].empty() || dim.size % factor != 0)
      continue;
    required.dimAxes[i] = extra;
    out.result.partialAxes.insert(extra.begin(), extra.end());
    out.note =
        fmt::format("'{}' sliced over {}: partial over {} as its partner", dim.name,
                    axesText(extra), axesText(AxisList(partnerAxes_.begin(), partnerAxes_.end())));
    return;
  }
}

void OpRules::planAlongDims(const ir::Op& op, const std::vector<const TensorLayout*>& operands,
                            OpPlan& out) {
  const ir::TensorType& type = fn_.typeOf(op.result);
  out.result = desired(type, &out, "");
  // Every operand as the result (layer_norm_grad's x and ct: the row kernel walks them alike).
  for (ir::ValueId operand : op.operands)
    out.required.push_back(alignTo(fn_.typeOf(operand), type, out.result));
  std::vector<std::string> dims = op.kind == OpKind::LayerNorm || op.kind == OpKind::LayerNormGrad
                                      ? op.dims("dims")
                                      : std::vector<std::string>{op.string("dim")};
  AxisList split;
  int64_t along = 1; // local elements along the dims
  for (const std::string& dim : dims) {
    int index = type.findDim(dim);
    if (index < 0) continue;
    const AxisList& axes = out.result.dimAxes[index];
    split.insert(split.end(), axes.begin(), axes.end());
    along *= type.dims[index].size / splitFactor(mesh_, axes);
  }
  if (ir::opTraits(op.kind).isLinearIn(0)) passPartial(*operands[0], out.required[0], out.result);
  if (split.empty()) return;
  int64_t bytes = localBytes(type, out.result, mesh_);
  int64_t rowBytes = bytes / std::max<int64_t>(along, 1);
  switch (op.kind) {
  case OpKind::Softmax:
  case OpKind::LogSoftmax: {
    // One all-gather of every rank's per-row (max, sum of exp) pair, two doubles, combined
    // locally (meshrt/kernels/SoftmaxStats.h): not an all-reduce of the maxima followed by
    // one of the sums, which must wait for it.
    int64_t rows = rowBytes / dtypeBytes(type.dtype);
    addPost(out, CollectiveKind::AllGather, split, dims[0],
            rows * 2 * int64_t(sizeof(double)) * splitFactor(mesh_, split),
            fmt::format("{} along split '{}': one all-gather of the blocks' row maxima and "
                        "sums of exp",
                        opSpelling(op.kind), dims[0]));
    break;
  }
  case OpKind::LayerNorm:
    addPost(out, CollectiveKind::AllReduceSum, split, dims[0], 2 * rowBytes,
            "layer_norm over a split dim: one all-reduce of the row sums of x and x^2");
    break;
  case OpKind::LayerNormGrad: // the row sums of x, x^2, ct and ct x, in double
    addPost(out, CollectiveKind::AllReduceSum, split, dims[0],
            rowBytes / dtypeBytes(type.dtype) * 4 * int64_t(sizeof(double)),
            "layer_norm_grad over a split dim: one all-reduce of the row sums of x, x^2, ct and "
            "ct x");
    break;
  case OpKind::Cumsum:
    addPost(out, CollectiveKind::AllGather, split, dims[0], rowBytes * splitFactor(mesh_, split),
            fmt::format("cumsum along split '{}': local prefix sums plus an exclusive scan of "
                        "the shard totals (modelled as an all-gather of the totals)",
                        dims[0]));
    break;
  case OpKind::Shift: {
    int64_t offset = op.integer("offset");
    int64_t magnitude = offset < 0 ? -offset : offset;
    bool halo = magnitude < along;
    addPost(out, CollectiveKind::Permute, split, dims[0], halo ? rowBytes * magnitude : bytes,
            halo ? fmt::format("shift along split '{}': halo of {} rows from the neighbour",
                               dims[0], magnitude)
                 : fmt::format("shift along split '{}' by at least a shard: whole-shard permute",
                               dims[0]));
    out.post.back().collective.offset = offset;
    break;
  }
  default:
    break;
  }
}

void OpRules::planRename(const ir::Op& op, const std::vector<const TensorLayout*>& operands,
                         OpPlan& out) {
  const ir::TensorType& operandType = fn_.typeOf(op.operands[0]);
  const ir::TensorType& resultType = fn_.typeOf(op.result);
  out.result = desired(resultType, &out, "");
  std::vector<std::string> from = op.dims("from"), to = op.dims("to");
  TensorLayout required;
  for (const ir::Dim& dim : operandType.dims) {
    std::string name = dim.name;
    for (size_t k = 0; k < from.size() && k < to.size(); ++k)
      if (from[k] == dim.name) name = to[k];
    int index = resultType.findDim(name);
    required.dimAxes.push_back(index >= 0 ? out.result.dimAxes[index] : AxisList{});
  }
  out.required.push_back(required);
  passPartial(*operands[0], out.required[0], out.result);
}

void OpRules::planReshape(const ir::Op& op, const std::vector<const TensorLayout*>& operands,
                          OpPlan& out) {
  const ir::TensorType& operandType = fn_.typeOf(op.operands[0]);
  const ir::TensorType& resultType = fn_.typeOf(op.result);
  std::vector<std::string> from = op.dims("from"), to = op.dims("to");
  TensorLayout wanted = desired(resultType, &out, "");
  TensorLayout natural = tensorLayoutOf(operandType, layout_, mesh_);
  auto isFrom = [&](const std::string& d) {
    return std::find(from.begin(), from.end(), d) != from.end();
  };
  // The split of the major-most merged dim carries over to the major-most new dim when only
  // that dim is split and the new dim's size allows it: rank r's block stays contiguous.
  AxisList carried;
  bool carry = !from.empty() && !to.empty();
  for (size_t i = 0; carry && i < operandType.dims.size(); ++i) {
    const ir::Dim& dim = operandType.dims[i];
    if (!isFrom(dim.name)) continue;
    if (dim.name == from[0])
      carried = natural.dimAxes[i];
    else if (!natural.dimAxes[i].empty())
      carry = false;
  }
  int64_t factor = splitFactor(mesh_, carried);
  int toIndex = to.empty() ? -1 : resultType.findDim(to[0]);
  carry = carry && !carried.empty() && toIndex >= 0 && resultType.dims[toIndex].size % factor == 0;
  TensorLayout result = wanted;
  if (carry) {
    for (size_t i = 0; i < resultType.dims.size(); ++i)
      if (std::find(to.begin(), to.end(), resultType.dims[i].name) != to.end())
        result.dimAxes[i] = static_cast<int>(i) == toIndex ? carried : AxisList{};
    carry = isLegalLayout(resultType, result, mesh_);
  }
  if (!carry) result = wanted;
  out.result = result;
  TensorLayout required;
  for (size_t i = 0; i < operandType.dims.size(); ++i) {
    const ir::Dim& dim = operandType.dims[i];
    if (isFrom(dim.name)) {
      required.dimAxes.push_back(carry && dim.name == from[0] ? carried : AxisList{});
      if (!carry && !natural.dimAxes[i].empty())
        out.drops.push_back({dim.name, natural.dimAxes[i],
                             "reshape regroups a split dim whose split cannot carry over: it is "
                             "gathered whole first"});
    } else {
      int index = resultType.findDim(dim.name);
      required.dimAxes.push_back(index >= 0 ? result.dimAxes[index] : AxisList{});
    }
  }
  out.required.push_back(required);
  passPartial(*operands[0], out.required[0], out.result);
}

void OpRules::planWindow(const ir::Op& op, const std::vector<const TensorLayout*>& operands,
                         OpPlan& out) {
  const ir::TensorType& resultType = fn_.typeOf(op.result);
  out.result = desired(resultType, &out, "");
  std::vector<std::string> from = op.dims("from");
  for (size_t k = 0; k < op.operands.size(); ++k) {
    const ir::TensorType& type = fn_.typeOf(op.operands[k]);
    std::string windowed = k < from.size() ? from[k] : (from.empty() ? "" : from[0]);
    TensorLayout required = alignTo(type, resultType, out.result);
    int index = type.findDim(windowed);
    if (index >= 0) {
      const AxisList& natural = layout_.of(windowed);
      if (!natural.empty() && splitFactor(mesh_, natural) > 1) {
        out.drops.push_back(
            {windowed, natural,
             fmt::format("{} over a split dim gathers it whole first (windows aligned with "
                         "shards are not analyzed)",
                         opSpelling(op.kind))});
        out.note = fmt::format("'{}' gathered whole; each rank computes its slice of '{}'",
                               windowed, op.string("to"));
      }
      required.dimAxes[index].clear();
    }
    out.required.push_back(required);
  }
  if (op.kind != OpKind::Concat) passPartial(*operands[0], out.required[0], out.result);
}

void OpRules::planGather(const ir::Op& op, const std::vector<const TensorLayout*>& operands,
                         OpPlan& out) {
  const ir::TensorType& tableType = fn_.typeOf(op.operands[0]);
  const ir::TensorType& idsType = fn_.typeOf(op.operands[1]);
  const ir::TensorType& resultType = fn_.typeOf(op.result);
  std::string dim = op.string("dim");
  out.result = desired(resultType, &out, "");
  std::set<std::string> used = usedAxes(out.result);
  TensorLayout table = alignTo(tableType, resultType, out.result);
  int index = tableType.findDim(dim);
  AxisList kept, dropped;
  for (const std::string& axis : axesOf(dim))
    (used.count(axis) ? dropped : kept).push_back(axis);
  if (!dropped.empty())
    out.drops.push_back({dim, dropped,
                         fmt::format("mesh axis {} already splits a dim of the gather's result",
                                     axesText(dropped))});
  if (index >= 0) table.dimAxes[index] = kept;
  out.required.push_back(table);
  out.required.push_back(alignTo(idsType, resultType, out.result));
  // Each rank looks up the ids that fall in its slice of the table (zero elsewhere): a partial
  // sum over the table's split axes, resolved lazily.
  out.result.partialAxes.insert(kept.begin(), kept.end());
  if (!kept.empty())
    out.note = fmt::format("masked local gather: partial sum over {}", axesText(kept));
}

void OpRules::planTopK(const ir::Op& op, OpPlan& out) {
  const ir::TensorType& resultType = fn_.typeOf(op.result);
  std::string dim = op.string("from"), to = op.string("to");
  out.result = desired(resultType, &out, "");
  if (int at = resultType.findDim(to); at >= 0 && !out.result.dimAxes[size_t(at)].empty()) {
    out.drops.push_back(
        {to, out.result.dimAxes[size_t(at)], "top_k selects along the whole row on every rank"});
    out.result.dimAxes[size_t(at)].clear();
  }
  // The operand's dims as the result's; `dim`, absent from the result, is replicated.
  out.required.push_back(alignTo(fn_.typeOf(op.operands[0]), resultType, out.result));
  if (!axesOf(dim).empty())
    out.note = fmt::format("top_k along split '{}': the rows are all-gathered first", dim);
}

void OpRules::addPost(OpPlan& out, CollectiveKind kind, const AxisList& axes,
                      const std::string& dim, int64_t bytes, std::string note) {
  PostCollective post;
  post.collective.kind = kind;
  post.collective.axes = axes;
  post.collective.dim = dim;
  post.collective.bytes = bytes;
  post.collective.groupSize = splitFactor(mesh_, axes);
  post.note = std::move(note);
  out.post.push_back(std::move(post));
}

double OpRules::flopsPerElement(OpKind kind) {
  switch (kind) {
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::LogSumExp:
    return 5;
  case OpKind::LayerNorm:
    return 8;
  case OpKind::LayerNormGrad: // per element of x: the forward's 8, two row sums, dx's 4
    return 16;
  case OpKind::RandomNormal:
  case OpKind::RandomUniform:
  case OpKind::RandomInt:
  case OpKind::Dropout:
    return 10; // counter-based RNG
  case OpKind::Gelu:
  case OpKind::Tanh:
  case OpKind::Sigmoid:
  case OpKind::Exp:
  case OpKind::Log:
  case OpKind::Sin:
  case OpKind::Cos:
  case OpKind::Pow:
    return 4;
  default:
    return 1;
  }
}

OpRules::GemmShape
OpRules::gemmShape(const ir::Op& op,
                   const std::map<std::string, std::pair<int64_t, int64_t>>& sizes) const {
  const ir::TensorType& a = fn_.typeOf(op.operands[0]);
  const ir::TensorType& b = fn_.typeOf(op.operands[1]);
  const ir::TensorType& result = fn_.typeOf(op.result);
  double m = 1, n = 1, k = 1, batches = 1;
  for (const auto& [name, size] : sizes) {
    bool inA = a.hasDim(name), inB = b.hasDim(name), inResult = result.hasDim(name);
    double local = static_cast<double>(size.second);
    if (inA && inB && !inResult)
      k *= local;
    else if (inA && !inB && inResult)
      m *= local;
    else if (inB && !inA && inResult)
      n *= local;
    else if (inA && inB && inResult)
      batches *= local;
  }
  return {std::min({m, n, k}), batches};
}

double OpRules::softmaxRows(const ir::Op& op, const OpPlan& out, double elements) const {
  if (op.kind == OpKind::LogSumExp) return elements;
  const ir::TensorType& type = fn_.typeOf(op.result);
  int index = type.findDim(op.string("dim"));
  if (index < 0) return elements;
  int64_t lane = type.dims[index].size / splitFactor(mesh_, out.result.dimAxes[index]);
  return elements / static_cast<double>(std::max<int64_t>(lane, 1));
}

double OpRules::kernelSeconds(const ir::Op& op, const OpPlan& out) const {
  double elements = static_cast<double>(localBytes(fn_.typeOf(op.result), out.result, mesh_) /
                                        dtypeBytes(fn_.typeOf(op.result).dtype));
  bool random = op.kind == OpKind::Dropout || op.kind == OpKind::RandomNormal ||
                op.kind == OpKind::RandomUniform || op.kind == OpKind::RandomInt;
  double perRandom = op.kind == OpKind::RandomNormal && machine_.normalFlops > 0
                         ? machine_.normalFlops
                         : machine_.randomFlops;
  double flops = random && perRandom > 0 ? elements * perRandom : out.flops;
  if (loopRole_.loop) {
    bool transcendental = isTranscendental(op.kind);
    double rounding = elements * roundingFlops(fn_.typeOf(op.result).dtype);
    return loopShareSeconds(machine_, (transcendental ? elements : flops) + rounding,
                            transcendental ? elements : 0, out.bytes, loopRole_.closesNest());
  }
  auto operandElements = [&] {
    const ir::TensorType& type = fn_.typeOf(op.operands[0]);
    return static_cast<double>(localBytes(type, out.required[0], mesh_) / dtypeBytes(type.dtype));
  };
  switch (op.kind) {
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::LogSumExp:
    return rowKernelSeconds(machine_, RowKernel::Softmax, operandElements(), out.bytes,
                            softmaxRows(op, out, elements));
  case OpKind::LayerNorm:
    return rowKernelSeconds(machine_, RowKernel::LayerNorm, operandElements(), out.bytes);
  case OpKind::LayerNormGrad:
    // Not calibrated on its own: the forward's row (two passes over x) and as much again for
    // the passes over x and ct that sum ct and ct y and write dx (SupportNormGrad.h).
    return rowKernelSeconds(machine_, RowKernel::LayerNorm, 2 * operandElements(), out.bytes);
  case OpKind::ReduceSum:
  case OpKind::ReduceMean:
  case OpKind::ReduceMax:
  case OpKind::ReduceMin:
  case OpKind::Cumsum:
    return rowKernelSeconds(machine_, RowKernel::Reduce, operandElements(), out.bytes);
  default:
    return kernelCallSeconds(machine_, flops, out.bytes);
  }
}

void OpRules::cost(const ir::Op& op, const std::vector<const TensorLayout*>& operands,
                   OpPlan& out) {
  const ir::TensorType& resultType = fn_.typeOf(op.result);
  for (const TensorLayout& required : out.required)
    for (const AxisList& axes : required.dimAxes)
      for (const std::string& axis : axes)
        out.usedAxes |= uint64_t{1} << std::min(mesh_.axisIndex(axis), 63);
  for (const AxisList& axes : out.result.dimAxes)
    for (const std::string& axis : axes)
      out.usedAxes |= uint64_t{1} << std::min(mesh_.axisIndex(axis), 63);
  for (const PostCollective& post : out.post)
    out.postSeconds += collectiveSeconds(machine_, mesh_, post.collective);
  if (!out.divisible) return;

  ir::DType dtype = resultType.dtype;
  double localElements = 1, globalElements = 1;
  GemmShape gemmDims;                     // a two-operand einsum's GEMM shape
  std::optional<Contraction> contraction; // an einsum that codegen contracts pairwise
  switch (op.kind) {
  case OpKind::Input:
  case OpKind::Param:
  case OpKind::Literal:
  case OpKind::TrainStep:
  case OpKind::Rename:
  case OpKind::StopGradient:
    return; // no work: sources are materialized by the runtime; the others relabel
  case OpKind::Einsum: {
    dtype = fn_.typeOf(op.operands[0]).dtype;
    std::map<std::string, std::pair<int64_t, int64_t>> sizes; // global, local
    for (size_t k = 0; k < op.operands.size(); ++k) {
      const ir::TensorType& type = fn_.typeOf(op.operands[k]);
      for (size_t i = 0; i < type.dims.size(); ++i)
        sizes[type.dims[i].name] = {
            type.dims[i].size, type.dims[i].size / splitFactor(mesh_, out.required[k].dimAxes[i])};
    }
    for (const auto& [name, size] : sizes) {
      globalElements *= static_cast<double>(size.first);
      localElements *= static_cast<double>(size.second);
    }
    out.globalFlops = op.operands.size() > 1 ? 2.0 * globalElements : globalElements;
    out.flops = op.operands.size() > 1 ? 2.0 * localElements : localElements;
    if (op.operands.size() == 2) gemmDims = gemmShape(op, sizes);
    if (op.operands.size() >= 2) {
      // What codegen's contract-pairwise pass runs: a chain of GEMMs (Contraction.h). An
      // output dim no operand has takes its size from the result.
      std::map<std::string, std::pair<int64_t, int64_t>> resultSizes;
      for (size_t i = 0; i < resultType.dims.size(); ++i)
        resultSizes[resultType.dims[i].name] = {resultType.dims[i].size,
                                                resultType.dims[i].size /
                                                    splitFactor(mesh_, out.result.dimAxes[i])};
      auto sizeOf = [&](bool local) {
        return [&sizes, &resultSizes, local](const std::string& name) -> int64_t {
          if (auto it = sizes.find(name); it != sizes.end())
            return local ? it->second.second : it->second.first;
          return local ? resultSizes.at(name).second : resultSizes.at(name).first;
        };
      };
      Contraction local = planContraction(fn_, op, sizeOf(true));
      if (local.rewritten()) {
        contraction = std::move(local);
        out.flops = contraction->flops;
        out.globalFlops = planContraction(fn_, op, sizeOf(false)).flops;
      }
    }
    // gather-one-hot-products reads the one-hot tensor's ids where the one_hot op made it
    // (not resharded): then a gather or a scatter-add, not a GEMM.
    size_t x = 0;
    OneHotProduct kind = contraction ? OneHotProduct::None : oneHotProduct(fn_, op, &x);
    if (kind != OneHotProduct::None && operands[x] && *operands[x] == out.required[x]) {
      out.computeSeconds = oneHotProductSeconds(op, x, kind, out) * oversubscription_;
      out.idealSeconds = 0;
      return;
    }
    break;
  }
  case OpKind::ReduceSum:
  case OpKind::ReduceMean:
  case OpKind::ReduceMax:
  case OpKind::ReduceMin:
  case OpKind::LogSumExp: {
    const ir::TensorType& type = fn_.typeOf(op.operands[0]);
    dtype = type.dtype;
    out.globalFlops = flopsPerElement(op.kind) * static_cast<double>(type.numElements());
    out.flops =
        flopsPerElement(op.kind) *
        static_cast<double>(localBytes(type, out.required[0], mesh_) / dtypeBytes(type.dtype));
    break;
  }
  case OpKind::Transpose:
  case OpKind::Reshape:
  case OpKind::Slice:
  case OpKind::Pad:
  case OpKind::Concat:
  case OpKind::Shift:
    break;             // data movement only
  case OpKind::TopK: { // a partial sort of each row: 1 + log2(size(to)) per operand element
    const ir::TensorType& type = fn_.typeOf(op.operands[0]);
    int at = resultType.findDim(op.string("to"));
    double perElement =
        1 + (at >= 0 ? std::log2(static_cast<double>(resultType.dims[size_t(at)].size)) : 0);
    out.globalFlops = perElement * static_cast<double>(type.numElements());
    out.flops = perElement * static_cast<double>(localBytes(type, out.required[0], mesh_) /
                                                 dtypeBytes(type.dtype));
    break;
  }
  case OpKind::Dropout:
    if (fn_.kind == ir::Function::Kind::Program) return; // the identity outside training
    [[fallthrough]];
  default:
    out.globalFlops = flopsPerElement(op.kind) * static_cast<double>(resultType.numElements());
    out.flops =
        flopsPerElement(op.kind) * static_cast<double>(localBytes(resultType, out.result, mesh_) /
                                                       dtypeBytes(resultType.dtype));
    break;
  }
  // An einsum of two or more operands is a call into the GEMM library (codegen's Gemm), or a
  // chain of them (contract-pairwise).
  bool gemm = op.kind == OpKind::Einsum && op.operands.size() >= 2;
  bool loops = modelsLoops(machine_) && !gemm;
  for (size_t k = 0; k < op.operands.size(); ++k)
    if (!loops || !(loopRole_.inRegister & (1u << std::min<size_t>(k, 31))))
      out.bytes +=
          static_cast<double>(localBytes(fn_.typeOf(op.operands[k]), out.required[k], mesh_));
  if (!loops || loopRole_.stored)
    out.bytes += static_cast<double>(localBytes(resultType, out.result, mesh_));
  out.computeSeconds =
      (contraction
           ? contractionSeconds(machine_, *contraction,
                                static_cast<double>(localBytes(resultType, out.result, mesh_) /
                                                    dtypeBytes(resultType.dtype)),
                                dtype)
       : gemm
           ? gemmSeconds(machine_, out.flops, out.bytes, dtype, gemmDims.smallest, gemmDims.batches)
       : loops ? kernelSeconds(op, out)
               : computeSeconds(machine_, out.flops, out.bytes, dtype)) *
      oversubscription_;
  double peak = peakFor(machine_, dtype);
  out.idealSeconds = peak > 0 ? out.globalFlops / peak : 0;
}

double OpRules::oneHotProductSeconds(const ir::Op& op, size_t x, OneHotProduct kind,
                                     OpPlan& out) const {
  const ir::TensorType& oneHot = fn_.typeOf(op.operands[x]);
  const ir::TensorType& rows = fn_.typeOf(op.operands[1 - x]);
  double result = static_cast<double>(localBytes(fn_.typeOf(op.result), out.result, mesh_));
  double other = static_cast<double>(localBytes(rows, out.required[1 - x], mesh_));
  // The ids: the one-hot tensor's local elements over its one-hot dim's local size.
  int at = oneHot.findDim(fn_.definingOp(op.operands[x]).string("dim"));
  double oneHotDim = static_cast<double>(
      oneHot.dims[size_t(at)].size /
      std::max<int64_t>(splitFactor(mesh_, out.required[x].dimAxes[size_t(at)]), 1));
  double ids = static_cast<double>(localBytes(oneHot, out.required[x], mesh_)) / oneHotDim;
  // A gather reads a row of T per output row and writes it; a scatter-add zeroes the result,
  // then adds each element of T into it (read, read, write).
  bool gather = kind == OneHotProduct::Gather;
  out.bytes = ids + (gather ? 2 * result : result + 3 * other);
  out.flops = gather ? 0 : other / dtypeBytes(rows.dtype);
  out.globalFlops = gather ? 0 : static_cast<double>(rows.numElements());
  return modelsLoops(machine_) ? kernelCallSeconds(machine_, out.flops, out.bytes)
                               : computeSeconds(machine_, out.flops, out.bytes, ir::DType::F32);
}

} // namespace meshc::plan
