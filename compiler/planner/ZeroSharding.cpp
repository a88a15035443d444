// ZeRO sharding by a rewrite of the train step (ZeroSharding.h).
#include "planner/ZeroSharding.h"

#include "planner/PlanReport.h"
#include "planner/Reshard.h"
#include "planner/TrainPhases.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>

namespace meshc::plan {

namespace {

using ir::OpKind;
using ir::ValueId;

/// A dim and its second name.
struct ShardName {
  std::string dim, zero;
  bool operator==(const ShardName&) const = default;
};

ir::TensorType renamedType(ir::TensorType type, const std::string& from, const std::string& to) {
  for (ir::Dim& dim : type.dims)
    if (dim.name == from) dim.name = to;
  return type;
}

void renameAttrs(std::vector<std::pair<std::string, ir::AttrValue>>& attrs, const std::string& from,
                 const std::string& to) {
  for (auto& [key, value] : attrs) {
    if (auto* text = std::get_if<std::string>(&value); text && *text == from) *text = to;
    if (auto* names = std::get_if<std::vector<std::string>>(&value))
      std::replace(names->begin(), names->end(), from, to);
  }
}

/// The mesh axes (of size > 1, in mesh order) that split some dim of an op reading `weight` (its
/// `readers`, op indices) but none of the weight's dims: its gradient is a partial sum over them.
AxisList dataParallelAxes(const ir::Function& fn, ValueId weight,
                          const std::vector<uint32_t>& readers, const Mesh& mesh,
                          const Layout& layout) {
  std::set<std::string> own, used;
  for (const ir::Dim& dim : fn.typeOf(weight).dims)
    own.insert(layout.of(dim.name).begin(), layout.of(dim.name).end());
  auto addDims = [&](const ir::TensorType& type) {
    for (const ir::Dim& dim : type.dims)
      used.insert(layout.of(dim.name).begin(), layout.of(dim.name).end());
  };
  for (uint32_t reader : readers) {
    const ir::Op& op = fn.ops[reader];
    for (ValueId operand : op.operands)
      addDims(fn.typeOf(operand));
    addDims(fn.typeOf(op.result));
  }
  AxisList axes;
  for (const ir::MeshAxis& axis : mesh.axes)
    if (axis.size > 1 && used.count(axis.name) && !own.count(axis.name)) axes.push_back(axis.name);
  return axes;
}

class Rewriter {
public:
  Rewriter(const ir::Function& fn, const Mesh& mesh, const Layout& layout, int stage)
      : fn_(fn), mesh_(mesh), layout_(layout), stage_(stage) {}

  std::optional<ZeroRewrite> run();

private:
  void chooseShards(ZeroRewrite& out);
  void markUpdateOps();
  ValueId rename(ValueId value, const std::string& from, const std::string& to,
                 const ir::Location& loc);
  /// `value` (a new id) with `name`'s dim under its second name, or with its own dims when
  /// `name` is null; `value` itself when there is nothing to rename.
  ValueId convert(ValueId value, const ShardName* name, const ir::Location& loc);
  ValueId copy(ValueId value, const ir::Location& loc);
  ValueId gradientShard(ValueId oldGradient, const ir::Location& loc);
  void emit(uint32_t index);
  /// The name `value` (a new id) carries, or null.
  const ShardName* shardOf(ValueId value) const {
    return value < shardOf_.size() ? shardOf_[value] : nullptr;
  }
  void setShard(ValueId value, const ShardName* name) {
    if (value >= shardOf_.size()) shardOf_.resize(value + 1, nullptr);
    shardOf_[value] = name;
  }

  const ir::Function& fn_;
  const Mesh& mesh_;
  const Layout& layout_;
  int stage_;
  ir::Function out_;
  std::vector<ValueId> newOf_; // old value -> new value
  // Per value, arrays rather than maps: every op of a 96-layer block (a hundred thousand) looks
  // its operands up. The names point into paramShard_ (a map: its entries stay put).
  std::vector<const ShardName*> shardOf_;     // new value -> the name its dim carries, or null
  std::map<size_t, ShardName> paramShard_;    // sharded weights and their states
  std::vector<const ShardName*> gradientOf_;  // old value -> its weight's name (gradients)
  std::map<ValueId, ValueId> gradientShards_; // old gradient -> new sharded copy
  std::map<ValueId, ValueId> weightSlices_;   // new weight (stage 1, 2) -> its shard
  std::vector<bool> updateOps_;               // the optimizer's ops of sharded weights
  std::vector<int64_t> paramOfValue_;         // old value -> param index (-1: no param)
  std::vector<uint32_t> renameOps_;           // indices in out_ of the crossing renames
  std::vector<uint32_t> identityOps_;         // and of the copies before them
};

void Rewriter::chooseShards(ZeroRewrite& out) {
  paramOfValue_.assign(fn_.values.size(), -1);
  gradientOf_.assign(fn_.values.size(), nullptr);
  for (size_t p = 0; p < fn_.params.size(); ++p)
    paramOfValue_[fn_.params[p].value] = static_cast<int64_t>(p);
  std::set<size_t> updated;
  for (const ir::ParamUpdate& update : fn_.updates)
    updated.insert(update.param);
  // The values named `grad/<path>`, in order, and the optimizer states of each path (theirs
  // start with `<path>@`), found in one pass each rather than once per weight (a 96-layer block
  // has over a thousand weights and a hundred thousand values).
  std::unordered_map<std::string_view, std::vector<ValueId>> gradientsNamed;
  for (ValueId v = 0; v < fn_.values.size(); ++v)
    if (std::string_view name = fn_.values[v].name; name.rfind("grad/", 0) == 0)
      gradientsNamed[name.substr(5)].push_back(v);
  std::unordered_map<std::string_view, std::vector<size_t>> statesOf;
  for (size_t s = 0; s < fn_.params.size(); ++s) {
    if (fn_.params[s].role != ir::ParamRole::OptimizerState) continue;
    std::string_view path = fn_.params[s].path;
    for (size_t at = path.find('@'); at != std::string_view::npos; at = path.find('@', at + 1))
      statesOf[path.substr(0, at)].push_back(s);
  }
  // The ops reading each weight, found in one pass (not one pass over the ops per weight).
  std::unordered_map<ValueId, std::vector<uint32_t>> readersOf;
  for (const ir::ParamInfo& param : fn_.params)
    readersOf[param.value];
  for (uint32_t i = 0; i < fn_.ops.size(); ++i)
    for (ValueId operand : fn_.ops[i].operands)
      if (auto it = readersOf.find(operand);
          it != readersOf.end() && (it->second.empty() || it->second.back() != i))
        it->second.push_back(i);
  for (size_t p = 0; p < fn_.params.size(); ++p) {
    const ir::ParamInfo& param = fn_.params[p];
    if (param.role != ir::ParamRole::Weight || !param.trainable || !updated.count(p)) continue;
    ZeroWeight weight{param.path, "", {}, ""};
    std::optional<ValueId> gradient; // the last value of the name and the param's type
    if (auto named = gradientsNamed.find(param.path); named != gradientsNamed.end())
      for (ValueId v : named->second)
        if (fn_.typeOf(v) == param.type) gradient = v;
    weight.axes = dataParallelAxes(fn_, param.value, readersOf[param.value], mesh_, layout_);
    int64_t shards = splitFactor(mesh_, weight.axes);
    if (!gradient) {
      weight.reason = "no gradient value found";
    } else if (weight.axes.empty()) {
      weight.reason = "no data-parallel axis (every axis splitting its ops splits it too)";
    } else {
      // The largest dim no axis splits that the ZeRO axes divide; the first such on ties.
      const ir::Dim* best = nullptr;
      for (const ir::Dim& dim : param.type.dims)
        if (layout_.of(dim.name).empty() && dim.size % shards == 0 &&
            (!best || dim.size > best->size))
          best = &dim;
      if (!best)
        weight.reason = fmt::format("no unsplit dim divisible by {}", shards);
      else
        weight.dim = best->name;
    }
    if (!weight.dim.empty()) {
      ShardName name{weight.dim,
                     fmt::format("{}@zero.{}", weight.dim, fmt::join(weight.axes, "."))};
      AxisList axes = layout_.of(weight.dim);
      axes.insert(axes.end(), weight.axes.begin(), weight.axes.end());
      out.layout.axes[name.zero] = axes;
      paramShard_[p] = name;
      gradientOf_[*gradient] = &paramShard_.at(p);
      if (auto states = statesOf.find(param.path); states != statesOf.end())
        for (size_t s : states->second)
          if (fn_.params[s].type.hasDim(weight.dim)) paramShard_[s] = name;
    }
    out.report.weights.push_back(std::move(weight));
  }
}

/// The optimizer's ops: what the updates of sharded weights and their states read, back to the
/// gradients, the params and the forward pass (none of which it includes).
void Rewriter::markUpdateOps() {
  std::vector<Phase> phases = trainStepPhases(fn_);
  std::vector<char> stops(fn_.values.size(), 0);
  for (ValueId v = 0; v < fn_.values.size(); ++v)
    stops[v] = fn_.values[v].name.rfind("grad/", 0) == 0;
  updateOps_.assign(fn_.ops.size(), false);
  std::vector<ValueId> work;
  for (const ir::ParamUpdate& update : fn_.updates)
    if (paramShard_.count(update.param)) work.push_back(update.value);
  while (!work.empty()) {
    ValueId value = work.back();
    work.pop_back();
    uint32_t index = fn_.values[value].definingOp;
    if (stops[value] || phases[index] == Phase::Forward || updateOps_[index] ||
        fn_.ops[index].kind == OpKind::Param)
      continue;
    updateOps_[index] = true;
    for (ValueId operand : fn_.ops[index].operands)
      work.push_back(operand);
  }
}

ValueId Rewriter::rename(ValueId value, const std::string& from, const std::string& to,
                         const ir::Location& loc) {
  ir::Op op;
  op.kind = OpKind::Rename;
  op.operands = {value};
  op.attrs = {{"from", std::vector<std::string>{from}}, {"to", std::vector<std::string>{to}}};
  op.loc = loc;
  renameOps_.push_back(static_cast<uint32_t>(out_.ops.size()));
  return out_.addOp(std::move(op), renamedType(out_.typeOf(value), from, to),
                    out_.values[value].name);
}

ValueId Rewriter::copy(ValueId value, const ir::Location& loc) {
  ir::Op op;
  op.kind = OpKind::Einsum; // of one operand into its own dims: the identity
  op.operands = {value};
  op.loc = loc;
  identityOps_.push_back(static_cast<uint32_t>(out_.ops.size()));
  ValueId result = out_.addOp(std::move(op), out_.typeOf(value), out_.values[value].name);
  setShard(result, shardOf(value));
  return result;
}

ValueId Rewriter::convert(ValueId value, const ShardName* name, const ir::Location& loc) {
  if (const ShardName* current = shardOf(value)) {
    if (name && *current == *name) return value;
    value = rename(value, current->zero, current->dim, loc); // back to the weight's dim
  }
  if (!name || !out_.typeOf(value).hasDim(name->dim)) return value;
  ValueId renamed = rename(value, name->dim, name->zero, loc);
  setShard(renamed, name);
  return renamed;
}

ValueId Rewriter::gradientShard(ValueId oldGradient, const ir::Location& loc) {
  auto done = gradientShards_.find(oldGradient);
  if (done != gradientShards_.end()) return done->second;
  ValueId shard = convert(newOf_[oldGradient], gradientOf_[oldGradient], loc);
  gradientShards_[oldGradient] = shard;
  return shard;
}

void Rewriter::emit(uint32_t index) {
  ir::Op op = fn_.ops[index];
  const ValueId oldResult = op.result;
  const ir::TensorType& oldType = fn_.typeOf(op.result);
  const std::string& valueName = fn_.values[op.result].name;
  if (op.kind == OpKind::Param) {
    size_t p = static_cast<size_t>(paramOfValue_[op.result]);
    auto shard = paramShard_.find(p);
    bool sharded = shard != paramShard_.end() &&
                   (fn_.params[p].role == ir::ParamRole::OptimizerState || stage_ == 3);
    ir::TensorType type =
        sharded ? renamedType(oldType, shard->second.dim, shard->second.zero) : oldType;
    newOf_[op.result] = out_.addOp(std::move(op), type, valueName);
    if (sharded) {
      setShard(newOf_[oldResult], &shard->second);
      out_.params[p].type = type;
    }
    return;
  }
  std::vector<ValueId> operands;
  const ShardName* target = nullptr;
  for (ValueId old : op.operands) {
    ValueId value = newOf_[old];
    if (updateOps_[index]) {
      if (gradientOf_[old]) value = gradientShard(old, op.loc);
      int64_t param = paramOfValue_[old];
      auto shard = param >= 0 ? paramShard_.find(static_cast<size_t>(param)) : paramShard_.end();
      if (stage_ < 3 && shard != paramShard_.end() &&
          fn_.params[static_cast<size_t>(param)].role == ir::ParamRole::Weight) {
        auto slice = weightSlices_.find(value);
        if (slice == weightSlices_.end())
          slice = weightSlices_.emplace(value, convert(value, &shard->second, op.loc)).first;
        value = slice->second;
      }
      if (!target) target = shardOf(value);
    }
    operands.push_back(value);
  }
  // Outside the optimizer, every operand in its own dims: a stage-3 weight is gathered for
  // each op reading it (the gathered copy lives only for that op).
  std::map<ValueId, ValueId> converted;
  for (ValueId& value : operands) {
    if (!target && !shardOf(value)) continue;
    auto done = converted.find(value);
    if (done == converted.end()) {
      ValueId from = value;
      // The lowering reuses a value resharded once; a copy of the stage-3 weight per reader
      // makes each reader gather its own (folded away by restoreZeroDims).
      if (!target && out_.ops[out_.values[value].definingOp].kind == OpKind::Param)
        from = copy(value, op.loc);
      done = converted.emplace(value, convert(from, target, op.loc)).first;
    }
    value = done->second;
  }
  op.operands = std::move(operands);
  ir::TensorType type = oldType;
  if (target && type.hasDim(target->dim)) {
    type = renamedType(type, target->dim, target->zero);
    renameAttrs(op.attrs, target->dim, target->zero);
  } else if (target) {
    renameAttrs(op.attrs, target->dim, target->zero); // a reduction over the sharded dim
  }
  ValueId result = out_.addOp(std::move(op), type, valueName);
  newOf_[oldResult] = result;
  if (target && type.hasDim(target->zero)) setShard(result, target);
  // Stage 2 and 3 reduce-scatter a gradient as soon as it is complete: no full copy is kept.
  if (stage_ >= 2 && gradientOf_[oldResult]) gradientShard(oldResult, fn_.ops[index].loc);
}

std::optional<ZeroRewrite> Rewriter::run() {
  if (fn_.kind != ir::Function::Kind::Train || !ir::hasOptimizerUpdates(fn_)) return std::nullopt;
  ZeroRewrite result;
  result.report.stage = stage_;
  result.layout = layout_;
  chooseShards(result);
  markUpdateOps();

  out_.kind = fn_.kind;
  out_.name = fn_.name;
  out_.loc = fn_.loc;
  out_.params = fn_.params;
  out_.train = fn_.train;
  newOf_.assign(fn_.values.size(), 0);
  // The renames and copies add a few ops per weight: room for them up front (no regrowth of
  // a hundred thousand ops).
  out_.ops.reserve(fn_.ops.size() + 4 * fn_.params.size());
  out_.values.reserve(fn_.values.size() + 4 * fn_.params.size());
  shardOf_.reserve(fn_.values.size() + 4 * fn_.params.size());
  for (uint32_t i = 0; i < fn_.ops.size(); ++i)
    emit(i);
  out_.inputs = fn_.inputs;
  for (ir::InputInfo& input : out_.inputs)
    input.value = newOf_[input.value];
  for (ir::ParamInfo& param : out_.params)
    param.value = newOf_[param.value];
  if (out_.train) out_.train->loss = newOf_[out_.train->loss];
  for (const ir::OutputInfo& output : fn_.outputs)
    out_.outputs.push_back(
        {output.name, convert(newOf_[output.value], nullptr, output.loc), output.loc});
  for (const ir::ParamUpdate& update : fn_.updates) {
    ValueId param = out_.params[update.param].value;
    out_.updates.push_back({update.param, convert(newOf_[update.value], shardOf(param),
                                                  out_.params[update.param].loc)});
  }
  result.fn = std::move(out_);
  result.renameOps = std::move(renameOps_);
  result.identityOps = std::move(identityOps_);

  // Memory of the weights, their gradients and their state, before and after.
  for (size_t p = 0; p < fn_.params.size(); ++p) {
    const ir::ParamInfo& param = fn_.params[p];
    if (param.role == ir::ParamRole::StepState) continue;
    TensorLayout before = tensorLayoutOf(param.type, layout_, mesh_);
    TensorLayout after = tensorLayoutOf(result.fn.params[p].type, result.layout, mesh_);
    double full = static_cast<double>(localBytes(param.type, before, mesh_));
    double now = static_cast<double>(localBytes(result.fn.params[p].type, after, mesh_));
    if (param.role == ir::ParamRole::OptimizerState) {
      result.report.before.optimizer += full;
      result.report.after.optimizer += now;
      continue;
    }
    result.report.before.params += full;
    result.report.after.params += now;
    if (!param.trainable) continue;
    auto shard = paramShard_.find(p);
    double gradient = full;
    if (shard != paramShard_.end() && stage_ >= 2)
      gradient =
          full / static_cast<double>(splitFactor(mesh_, result.layout.of(shard->second.zero)));
    result.report.before.gradients += full;
    result.report.after.gradients += gradient;
  }
  return result;
}

} // namespace

std::optional<ZeroRewrite> rewriteForZero(const ir::Function& fn, const Mesh& mesh,
                                          const Layout& layout, int stage) {
  return Rewriter(fn, mesh, layout, stage).run();
}

void restoreZeroDims(SpmdFunction& spmd, ZeroRewrite& rewrite, const Layout& original) {
  std::map<std::string, std::string> dimOf; // second name -> the weight's dim
  for (const auto& [name, axes] : rewrite.layout.axes)
    if (!original.axes.count(name)) dimOf[name] = name.substr(0, name.find("@zero."));
  // A name without '@' is no second name (or maps to itself): not looked up (every dim of
  // every value is restored, tens of thousands of values at 96 layers).
  auto restore = [&](std::string& dim) {
    if (dim.find('@') == std::string::npos) return;
    auto it = dimOf.find(dim);
    if (it != dimOf.end()) dim = it->second;
  };
  for (SpmdValue& value : spmd.values) {
    for (ir::Dim& dim : value.globalType.dims)
      restore(dim.name);
    for (ir::Dim& dim : value.localType.dims)
      restore(dim.name);
  }
  // Per op of rewrite.fn: a crossing rename, a copy before one, or neither.
  constexpr char kOther = 0, kRename = 1, kIdentity = 2;
  std::vector<char> role(rewrite.fn.ops.size(), kOther);
  for (uint32_t op : rewrite.renameOps)
    role[op] = kRename;
  for (uint32_t op : rewrite.identityOps)
    role[op] = kIdentity;
  auto roleOf = [&](uint32_t sourceOp) { return sourceOp < role.size() ? role[sourceOp] : kOther; };
  // The crossing renames are identities now: their readers read their operands. The
  // collectives made for them are ZeRO's. The ops kept are compacted in place.
  constexpr SpmdValueId kNotReplaced = std::numeric_limits<SpmdValueId>::max();
  std::vector<SpmdValueId> replacedBy(spmd.values.size(), kNotReplaced);
  auto replace = [&](SpmdValueId id, SpmdValueId by) {
    if (id >= replacedBy.size()) replacedBy.resize(id + 1, kNotReplaced);
    replacedBy[id] = by;
  };
  ZeroReport& report = rewrite.report;
  size_t kept = 0;
  for (size_t i = 0; i < spmd.ops.size(); ++i) {
    SpmdOp& op = spmd.ops[i];
    char source = roleOf(op.sourceOp);
    bool crossing = source == kRename;
    if (op.kind == SpmdOp::Kind::Compute && (source == kIdentity || crossing)) {
      replace(op.result, op.operands[0]);
      continue;
    }
    if (crossing && op.collective.kind == CollectiveKind::ReduceScatter) {
      ++report.reduceScatters;
      report.reduceScatterBytes += static_cast<double>(op.collective.bytes);
      report.reduceScatterSeconds += op.seconds;
    } else if (crossing && op.collective.kind == CollectiveKind::AllGather) {
      ++report.allGathers;
      report.allGatherBytes += static_cast<double>(op.collective.bytes);
      report.allGatherSeconds += op.seconds;
    }
    if (crossing && op.note.empty())
      op.note = fmt::format("ZeRO-{}", report.stage);
    else if (crossing)
      op.note = fmt::format("ZeRO-{}: {}", report.stage, op.note);
    restore(op.collective.dim);
    restore(op.collective.toDim);
    for (auto& [key, value] : op.attrs) {
      if (auto* text = std::get_if<std::string>(&value)) restore(*text);
      if (auto* names = std::get_if<std::vector<std::string>>(&value))
        for (std::string& name : *names)
          restore(name);
    }
    if (kept != i) spmd.ops[kept] = std::move(op);
    ++kept;
  }
  spmd.ops.erase(spmd.ops.begin() + static_cast<std::ptrdiff_t>(kept), spmd.ops.end());
  auto resolve = [&](SpmdValueId id) {
    while (id < replacedBy.size() && replacedBy[id] != kNotReplaced)
      id = replacedBy[id];
    return id;
  };
  for (SpmdOp& op : spmd.ops) {
    for (SpmdValueId& operand : op.operands)
      operand = resolve(operand);
    for (SpmdValueId& result : op.results)
      result = resolve(result);
  }
  for (auto& [name, id] : spmd.outputs)
    id = resolve(id);
  for (auto& [param, id] : spmd.updates)
    id = resolve(id);
  for (Replication& replication : spmd.replications)
    restore(replication.dim);
  for (const auto& [name, dim] : dimOf)
    spmd.layout.axes.erase(name);
}

} // namespace meshc::plan
