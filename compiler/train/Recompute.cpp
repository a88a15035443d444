// Activation recomputation (Recompute.h). Autodiff tags every backward op with the call of the
// forward op it differentiates (Location::call), so a call's backward is the run of ops with its
// tag, and its first op is where the copies go.
#include "train/Recompute.h"

#include "ir/OpTraits.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>

namespace meshc::train {

using ir::Op;
using ir::OpKind;
using ir::ValueId;

namespace {

constexpr uint32_t kNone = ~uint32_t(0);

/// Ops a copy keeps reading instead of copying: they hold no activation (params, inputs, scalar
/// constants, the step counter) or must not run twice (side effects).
bool keepsOriginal(const Op& op) {
  return op.kind == OpKind::Param || op.kind == OpKind::Input || op.kind == OpKind::Literal ||
         op.kind == OpKind::TrainStep || ir::opTraits(op.kind).hasSideEffect();
}

/// Per call (index + 1 into fn.calls, 0 for the body): the outermost recomputed call that
/// contains it (index + 1), or 0. Calls come outermost first, so a parent precedes its children.
std::vector<uint32_t> recomputedScopes(const ir::Function& fn) {
  std::vector<uint32_t> scope(fn.calls.size() + 1, 0);
  for (size_t c = 1; c <= fn.calls.size(); ++c) {
    const ir::DefCall& call = fn.calls[c - 1];
    uint32_t parent = call.parent < c ? scope[call.parent] : 0;
    scope[c] = parent ? parent : call.recompute ? uint32_t(c) : 0;
  }
  return scope;
}

/// Rebuilds `fn` with its ops in `order` (indices into fn.ops, or into `extra` from
/// fn.ops.size() on), each op's result renumbered to its position.
void rebuild(ir::Function& fn, const std::vector<Op>& extra,
             const std::vector<ir::Value>& extraValues, const std::vector<size_t>& order) {
  size_t oldOps = fn.ops.size();
  std::vector<ValueId> renamed(fn.values.size() + extraValues.size(), 0);
  std::vector<Op> ops;
  std::vector<ir::Value> values;
  ops.reserve(order.size());
  values.reserve(order.size());
  for (size_t k : order) {
    Op op = k < oldOps ? fn.ops[k] : extra[k - oldOps];
    ir::Value value = op.result < fn.values.size() ? fn.values[op.result]
                                                   : extraValues[op.result - fn.values.size()];
    renamed[op.result] = ValueId(ops.size());
    for (ValueId& operand : op.operands)
      operand = renamed[operand];
    op.result = ValueId(ops.size());
    value.definingOp = uint32_t(ops.size());
    ops.push_back(std::move(op));
    values.push_back(std::move(value));
  }
  fn.ops = std::move(ops);
  fn.values = std::move(values);
  for (ir::ParamInfo& param : fn.params)
    param.value = renamed[param.value];
  for (ir::InputInfo& input : fn.inputs)
    input.value = renamed[input.value];
  for (ir::OutputInfo& output : fn.outputs)
    output.value = renamed[output.value];
  for (ir::ParamUpdate& update : fn.updates)
    update.value = renamed[update.value];
  if (fn.train) fn.train->loss = renamed[fn.train->loss];
}

} // namespace

size_t recomputeActivations(ir::Function& fn, size_t forwardOps) {
  if (fn.kind != ir::Function::Kind::Train || forwardOps > fn.ops.size()) return 0;
  std::vector<uint32_t> scopeOfCall = recomputedScopes(fn);
  auto scopeOf = [&](const Op& op) {
    return op.loc.call < scopeOfCall.size() ? scopeOfCall[op.loc.call] : 0;
  };
  // Where each recomputed call's backward starts: its first tagged op after the forward pass.
  std::map<uint32_t, size_t> backwardStart;
  for (size_t j = forwardOps; j < fn.ops.size(); ++j)
    if (uint32_t scope = scopeOf(fn.ops[j])) backwardStart.try_emplace(scope, j);
  if (backwardStart.empty()) return 0;

  // Forward values of each call that a backward op reads from the call's start on: copied, with
  // what they are computed from inside the call.
  std::vector<uint32_t> scopeOfValue(fn.values.size(), 0);
  for (size_t i = 0; i < forwardOps; ++i)
    if (!keepsOriginal(fn.ops[i])) scopeOfValue[fn.ops[i].result] = scopeOf(fn.ops[i]);
  std::map<uint32_t, std::set<ValueId>> copied; // by call: original values to copy
  for (size_t j = forwardOps; j < fn.ops.size(); ++j)
    for (ValueId operand : fn.ops[j].operands)
      if (uint32_t scope = scopeOfValue[operand];
          scope && backwardStart.count(scope) && j >= backwardStart[scope])
        copied[scope].insert(operand);
  for (auto& [scope, values] : copied) {
    std::vector<ValueId> work(values.begin(), values.end());
    while (!work.empty()) {
      const Op& op = fn.definingOp(work.back());
      work.pop_back();
      for (ValueId operand : op.operands)
        if (scopeOfValue[operand] == scope && values.insert(operand).second)
          work.push_back(operand);
    }
  }

  // The copies, in forward order (their values' ids follow fn.values).
  std::vector<Op> extra;
  std::vector<ir::Value> extraValues;
  std::map<uint32_t, std::vector<size_t>> copiesOf; // by call: indices into extra
  std::vector<ValueId> copyOf(fn.values.size(), kNone);
  for (auto& [scope, values] : copied) {
    const std::string& path = fn.calls[scope - 1].path;
    for (ValueId original : values) { // ascending ids: forward order
      Op op = fn.definingOp(original);
      for (ValueId& operand : op.operands)
        if (scopeOfValue[operand] == scope && copyOf[operand] != kNone) operand = copyOf[operand];
      op.setAttr(ir::kRecomputeAttr, path);
      ir::Value value = fn.value(original);
      op.result = ValueId(fn.values.size() + extraValues.size());
      value.name = value.name.empty() ? "" : value.name + "@recomputed";
      copyOf[original] = op.result;
      copiesOf[scope].push_back(extra.size());
      extra.push_back(std::move(op));
      extraValues.push_back(std::move(value));
    }
  }
  // The backward reads the copies from the call's start on.
  for (size_t j = forwardOps; j < fn.ops.size(); ++j)
    for (ValueId& operand : fn.ops[j].operands)
      if (uint32_t scope = scopeOfValue[operand];
          scope && copyOf[operand] != kNone && j >= backwardStart[scope])
        operand = copyOf[operand];

  std::map<size_t, std::vector<uint32_t>> startsAt; // op index -> the calls whose copies go there
  for (const auto& [scope, indices] : copiesOf)
    startsAt[backwardStart[scope]].push_back(scope);
  std::vector<size_t> order;
  order.reserve(fn.ops.size() + extra.size());
  for (size_t j = 0; j < fn.ops.size(); ++j) {
    if (auto it = startsAt.find(j); it != startsAt.end())
      for (uint32_t scope : it->second)
        for (size_t k : copiesOf[scope])
          order.push_back(fn.ops.size() + k);
    order.push_back(j);
  }
  rebuild(fn, extra, extraValues, order);
  return copiesOf.size();
}

size_t recomputeActivations(ir::Function& fn) {
  if (fn.kind != ir::Function::Kind::Train) return 0;
  std::vector<bool> forward(fn.ops.size(), false);
  std::vector<ValueId> work;
  for (const ir::OutputInfo& output : fn.outputs)
    work.push_back(output.value);
  for (const ir::ParamUpdate& update : fn.updates)
    if (fn.params[update.param].role == ir::ParamRole::StepState) work.push_back(update.value);
  size_t forwardOps = 0;
  while (!work.empty()) {
    uint32_t index = fn.values[work.back()].definingOp;
    work.pop_back();
    if (forward[index]) continue;
    forward[index] = true;
    forwardOps = std::max<size_t>(forwardOps, index + 1);
    for (ValueId operand : fn.ops[index].operands)
      work.push_back(operand);
  }
  return recomputeActivations(fn, forwardOps);
}

std::string repeatedLayerDef(const ir::Function& fn) {
  std::map<std::string, std::pair<size_t, size_t>> byDef; // def -> (least depth, calls)
  for (const ir::DefCall& call : fn.calls) {
    const std::string segment = call.path.substr(call.path.rfind('/') + 1);
    if (segment.find('[') == std::string::npos) continue; // not an iteration of a repeat
    size_t depth = 0;
    for (uint32_t parent = call.parent; parent && parent <= fn.calls.size();
         parent = fn.calls[parent - 1].parent)
      ++depth;
    auto [it, added] = byDef.try_emplace(call.def, depth, 0);
    it->second.first = std::min(it->second.first, depth);
    ++it->second.second;
  }
  std::string best;
  for (const auto& [def, entry] : byDef)
    if (best.empty() || entry.first < byDef[best].first ||
        (entry.first == byDef[best].first && entry.second > byDef[best].second))
      best = def;
  return best;
}

size_t markRecompute(ir::Function& fn, const std::string& def) {
  size_t marked = 0;
  for (ir::DefCall& call : fn.calls)
    if (call.def == def) {
      call.recompute = true;
      ++marked;
    }
  return marked;
}

bool applyRecompute(ir::Module& module, const std::vector<std::string>& defs,
                    const std::vector<size_t>& forwardOps) {
  if (forwardOps.size() != module.functions.size()) return false;
  for (const std::string& def : defs) {
    bool trained = false;
    for (const ir::Function& fn : module.functions)
      if (fn.kind == ir::Function::Kind::Train)
        trained = trained || std::any_of(fn.calls.begin(), fn.calls.end(),
                                         [&](const ir::DefCall& call) { return call.def == def; });
    if (!trained) return false;
  }
  for (size_t f = 0; f < module.functions.size(); ++f) {
    ir::Function& fn = module.functions[f];
    for (const std::string& def : defs)
      markRecompute(fn, def);
    // As train::lowerTraining ends, on the functions it trained (a count past the ops: none).
    if (forwardOps[f] != SIZE_MAX) recomputeActivations(fn, forwardOps[f]);
  }
  return true;
}

} // namespace meshc::train
