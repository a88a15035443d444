// SPMD lowering and its fast evaluator share one engine: a per-op rule (planOp, Mesh-TensorFlow's
// lowering rules) gives each op's required operand layouts, its result layout, the collectives it
// needs internally and its roofline cost; the engine walks the ops in order, reshards operands
// (Reshard.h) where their current layout differs from the required one, and sums the costs. The
// rule is a pure function of the op's shape, its operands' layouts and the layouts of the dims it
// touches, so the evaluator memoizes it: identical layers cost one rule evaluation.
#include "planner/PlanEvaluatorImpl.h"

#include "ir/OpTraits.h"

#include <fmt/format.h>

namespace meshc::plan {

namespace {

using ir::OpKind;

/// The phase of every op of a train step (docs/planner.md): forward is what the outputs (the
/// loss) depend on; of the rest, update is the optimizer: the step counter and what it feeds, and
/// the elementwise ops that read a param (or an update op) directly and have the param's type (a
/// new weight, a new moment); everything else computes gradients (backward). A recomputed
/// forward op (ir::kRecomputeAttr, train/Recompute.h) is backward: it runs in the backward pass,
/// once per microbatch, and the loss does not read it. It is never update, though a copy of a
/// cast of a weight reads the param and has its type; counted as update, it and every backward
/// op it feeds would be charged once per step instead of once per microbatch.
std::vector<Phase> opPhases(const ir::Function& fn) {
  std::vector<Phase> phases(fn.ops.size(), Phase::Forward);
  if (fn.kind != ir::Function::Kind::Train || !ir::hasOptimizerUpdates(fn)) return phases;
  std::vector<bool> forward(fn.ops.size(), false);
  std::vector<ir::ValueId> work;
  for (const ir::OutputInfo& output : fn.outputs)
    work.push_back(output.value);
  // A step state's next value is computed by the forward pass too.
  for (const ir::ParamUpdate& update : fn.updates)
    if (fn.params[update.param].role == ir::ParamRole::StepState) work.push_back(update.value);
  while (!work.empty()) {
    uint32_t index = fn.values[work.back()].definingOp;
    work.pop_back();
    if (forward[index]) continue;
    forward[index] = true;
    for (ir::ValueId operand : fn.ops[index].operands)
      work.push_back(operand);
  }
  // Per value, not a set: every operand of every backward and update op asks (each evaluator
  // and each lowering finds the phases).
  std::vector<char> paramValues(fn.values.size(), 0);
  for (const ir::ParamInfo& param : fn.params)
    paramValues[param.value] = 1;
  for (size_t i = 0; i < fn.ops.size(); ++i) {
    const ir::Op& op = fn.ops[i];
    if (forward[i]) continue;
    if (op.attr(ir::kRecomputeAttr)) {
      phases[i] = Phase::Backward;
      continue;
    }
    bool update = op.kind == OpKind::TrainStep;
    for (ir::ValueId operand : op.operands) {
      uint32_t producer = fn.values[operand].definingOp;
      if (!forward[producer] && phases[producer] == Phase::Update) update = true;
      if (paramValues[operand] && op.kind != OpKind::Einsum &&
          fn.typeOf(op.result).dims == fn.typeOf(operand).dims)
        update = true;
    }
    phases[i] = update ? Phase::Update : Phase::Backward;
  }
  // Constants outside the forward cone belong to their first consumer's phase.
  for (size_t i = fn.ops.size(); i-- > 0;) {
    if (forward[i] || !fn.ops[i].operands.empty() || fn.ops[i].kind == OpKind::TrainStep) continue;
    for (size_t j = i + 1; j < fn.ops.size(); ++j)
      if (std::find(fn.ops[j].operands.begin(), fn.ops[j].operands.end(), fn.ops[i].result) !=
          fn.ops[j].operands.end()) {
        phases[i] = phases[j];
        break;
      }
  }
  return phases;
}

std::string valueName(const ir::Function& fn, ir::ValueId id) {
  const std::string& name = fn.values[id].name;
  return name.empty() ? fmt::format("%{}", id) : name;
}

} // namespace

OptimizerModel optimizerModel(const ir::Function& fn) {
  OptimizerModel model;
  if (!fn.train) return model;
  auto option = [&](const std::string& name, double fallback) {
    for (const auto& [key, value] : fn.train->options)
      if (key == name) {
        if (const double* d = std::get_if<double>(&value)) return *d;
        if (const int64_t* i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
      }
    return fallback;
  };
  const std::string& optimizer = fn.train->optimizer;
  if (optimizer == "adamw") {
    model.stateFactor = 2;   // m and v
    model.trafficFactor = 7; // read p, g, m, v; write p, m, v
  } else if (optimizer == "adafactor") {
    model.factored = true;
    bool momentum = option("beta1", 0) > 0;
    model.stateFactor = momentum ? 1 : 0; // plus the factored rows and columns
    model.trafficFactor = momentum ? 6 : 4;
  } else { // sgd
    bool momentum = option("momentum", 0) > 0;
    model.stateFactor = momentum ? 1 : 0;
    model.trafficFactor = momentum ? 5 : 3;
  }
  return model;
}

PlanEvaluator::Impl::Impl(const ir::Module& module, const ir::Function& fn, const Mesh& mesh,
                          const Machine& machine)
    : module_(module), fn_(fn), mesh_(mesh), machine_(machine),
      chains_(machine_, mesh_, fn.values.size()), boundStateOf_(fn.values.size(), -1),
      walk_(fn.values.size()) {
  oversubscription_ = oversubscription(machine, mesh);
  rowSplitBound_ = fn.kind != ir::Function::Kind::Train;
  // Per type: its dims' indices (an op's involved dims, below, without hashing their names).
  std::vector<std::vector<int>> dimsOfType;
  // internType's ids, without building the key of a type seen before (InternCache.h).
  InternCache<const ir::TensorType*> typesSeen;
  for (const ir::Value& value : fn.values) {
    uint64_t hash = typeHash(value.type);
    int typeId =
        typesSeen.find(hash, [&](const ir::TensorType* seen) { return *seen == value.type; });
    if (typeId < 0) typesSeen.add(hash, &value.type, typeId = internType(value.type));
    typeIds_.push_back(typeId);
    if (static_cast<size_t>(typeId) < dimsOfType.size()) continue; // its dims are known
    std::vector<int>& dims = dimsOfType.emplace_back();
    for (const ir::Dim& dim : value.type.dims) {
      auto [it, added] = dimIndex_.try_emplace(dim.name, static_cast<int>(dimNames_.size()));
      if (added) {
        dimNames_.push_back(dim.name);
        dimSizes_.push_back(dim.size);
        if (dim.size > 1) relevantDims_.push_back(dim.name);
      }
      dims.push_back(it->second);
    }
  }
  lastUse_.assign(fn.values.size(), -1);
  freesAt_.resize(fn.ops.size() + 1);
  readersOf_ = valueReaders(fn);
  loopRoles_ = loopRoles(fn, readersOf_);
  InternCache<uint32_t> opsSeen; // internStatic's ids, likewise
  for (size_t i = 0; i < fn.ops.size(); ++i) {
    const ir::Op& op = fn.ops[i];
    for (ir::ValueId operand : op.operands)
      lastUse_[operand] = static_cast<int>(i);
    uint64_t hash = staticHash(op, loopRoles_[i]);
    int staticId = opsSeen.find(hash, [&](uint32_t seen) {
      return sameStatic(fn.ops[seen], loopRoles_[seen], op, loopRoles_[i]);
    });
    if (staticId < 0)
      opsSeen.add(hash, static_cast<uint32_t>(i), staticId = internStatic(op, loopRoles_[i]));
    staticIds_.push_back(staticId);
    std::vector<int> involved;
    auto addDims = [&](ir::ValueId value) {
      for (int index : dimsOfType[static_cast<size_t>(typeIds_[value])])
        if (std::find(involved.begin(), involved.end(), index) == involved.end())
          involved.push_back(index);
    };
    for (ir::ValueId operand : op.operands)
      addDims(operand);
    addDims(op.result);
    involved_.push_back(std::move(involved));
  }
  for (const ir::OutputInfo& output : fn.outputs)
    lastUse_[output.value] = static_cast<int>(fn.ops.size());
  for (const ir::ParamUpdate& update : fn.updates)
    lastUse_[update.value] = static_cast<int>(fn.ops.size());
  modelBackward_ = fn.kind == ir::Function::Kind::Train && !ir::hasOptimizerUpdates(fn);
  readers_.assign(fn.values.size(), 0);
  for (const ir::Op& op : fn.ops)
    for (size_t k = 0; k < op.operands.size(); ++k) // each distinct operand once
      if (std::find(op.operands.begin(), op.operands.begin() + static_cast<std::ptrdiff_t>(k),
                    op.operands[k]) == op.operands.begin() + static_cast<std::ptrdiff_t>(k))
        ++readers_[op.operands[k]];
  phases_ = opPhases(fn);
  findPartners();
  prepareSharedPartials();
  for (size_t v = 0; v < fn.values.size(); ++v)
    if (lastUse_[v] >= 0 && fn.ops[fn.values[v].definingOp].kind != OpKind::Param)
      freesAt_[lastUse_[v]].push_back(static_cast<ir::ValueId>(v));
  stepInvariant_ = ir::stepInvariantOps(fn);
  trainable_.assign(fn.values.size(), 0);
  for (const ir::ParamInfo& param : fn.params)
    if (param.trainable && modelBackward_) trainable_[param.value] = 1;
  for (int64_t size : dimSizes_)
    maxSplit_.push_back(maxDivisorSplit(size));
  size_t longestKey = 0, inputs = 0;
  for (uint32_t i = 0; i < fn.ops.size(); ++i)
    inputs += fn.ops[i].operands.size() + involved_[i].size();
  opKeys_.reserve(fn.ops.size(), inputs);
  for (uint32_t i = 0; i < fn.ops.size(); ++i) { // after findPartners: its dims are final
    opKeys_.add(fn.ops[i].operands, involved_[i], fn.ops[i].result);
    longestKey = std::max(longestKey, opKeys_.keySize(i));
  }
  keyScratch_.assign(longestKey, 0);
  // The lower bound's terms and the repeated segments are made when a search first needs
  // them: an engine that only lowers (lowerToSpmd: the ZeRO forms, the final plans of
  // tests) never reads them, and at 96 layers they were a third of its construction.
}

const OpPlan& PlanEvaluator::Impl::planOf(uint32_t i, const std::vector<int>& dimAxesIds,
                                          const std::vector<int>& stateOf, OpRules& rules) {
  const ir::Op& op = fn_.ops[i];
  std::span<const ir::ValueId> operands = opKeys_.operands(i);
  size_t keySize = opKeys_.keySize(i);
  int* key = keyScratch_.data();
  key[0] = staticIds_[i];
  key[1] = static_cast<int>(phases_[i]);
  // A partial sum that several ops read is resolved where it is first read, and every reader
  // reads the resolved value, when that is cheaper than keeping it lazy in each (resolveOnce):
  // an RMS norm's input, read by the mean square and by the scaling, is resolved once, not once
  // for each; a norm's input gradient read only by its gain's and bias's gradients stays lazy
  // (they are summed before they are resolved). A partial read once stays lazy.
  int eagerMask = 0;
  if (readsShared_[i])
    for (size_t k = 0; k < operands.size() && k < 30; ++k)
      if (resolveOnce(operands[k], stateOf[operands[k]])) eagerMask |= 1 << k;
  key[2] = eagerMask;
  int partnerState = partner_[i] >= 0 ? stateOf[partner_[i]] : -1;
  key[3] = partnerState; // a later sum's axes come from dims in involved_
  int* next = key + OpKeyTable<OpPlan, OpCost>::kFixedEntries;
  for (ir::ValueId operand : operands)
    *next++ = stateOf[operand];
  for (ir::ValueId dim : opKeys_.dims(i))
    *next++ = dimAxesIds[dim];
  // Neighbouring layouts of a search mostly give an op the same key as last time: compared
  // first, before hashing.
  if (const OpPlan* last = opKeys_.lastPlan(i, key)) return *last;
  key_.assign(key, key + keySize);
  auto memo = opMemo_.find(key_);
  if (memo != opMemo_.end()) {
    // The map's nodes stay put.
    opKeys_.setLast(i, key, &memo->second, OpCost(memo->second), memo->second.requiredIds);
    return memo->second;
  }
  std::vector<const TensorLayout*> operandStates;
  std::vector<TensorLayout> eagerCopies;
  eagerCopies.reserve(op.operands.size());
  std::set<const TensorLayout*> eager;
  for (size_t k = 0; k < op.operands.size(); ++k) {
    const TensorLayout& state = states_[stateOf[op.operands[k]]];
    if (eagerMask & (1 << k)) {
      eagerCopies.push_back(state); // its own address: the same state may be lazy elsewhere
      eager.insert(&eagerCopies.back());
      operandStates.push_back(&eagerCopies.back());
    } else {
      operandStates.push_back(&state);
    }
  }
  rules.setLazyPartials(phases_[i] != Phase::Update);
  rules.setEagerOperands(std::move(eager));
  std::set<std::string> partnerAxes;
  if (partnerState >= 0 && !states_[partnerState].partialIsMax)
    partnerAxes = states_[partnerState].partialAxes;
  else if (laterSum_[i] >= 0)
    partnerAxes = rules.reducedAxesOf(fn_.ops[laterSum_[i]]);
  rules.setPartner(std::move(partnerAxes),
                   soleConsumer_[i] >= 0 && fn_.ops[soleConsumer_[i]].kind == OpKind::Div);
  rules.setLoopRole(loopRoles_[i]);
  OpPlan plan = rules.plan(op, operandStates);
  for (const TensorLayout& required : plan.required)
    plan.requiredIds.push_back(internState(required));
  plan.resultId = internState(plan.result);
  plan.resultBytes = localBytes(fn_.typeOf(op.result), plan.result, mesh_);
  const OpPlan* planned = &opMemo_.emplace(key_, std::move(plan)).first->second;
  opKeys_.setLast(i, key_.data(), planned, OpCost(*planned), planned->requiredIds);
  return *planned;
}

EvalResult PlanEvaluator::Impl::run(const Layout& layout, SpmdFunction* out, double stopAbove) {
  EvalResult result;
  // The layout itself: known axes, each at most once per dim.
  for (const std::string& dim : dimNames_) {
    const AxisList& axes = layout.of(dim);
    for (auto axis = axes.begin(); axis != axes.end(); ++axis) {
      if (mesh_.axisIndex(*axis) < 0)
        result.problems.push_back({LayoutProblem::Kind::UnknownAxis, dim, {*axis}});
      else if (std::find(axes.begin(), axis, *axis) != axis) // listed before (a few axes at most)
        result.problems.push_back({LayoutProblem::Kind::AxisTwice, dim, {*axis}});
    }
  }
  if (!result.problems.empty()) {
    result.ok = false;
    return result;
  }

  std::vector<int> dimAxesIds;
  for (const std::string& dim : dimNames_)
    dimAxesIds.push_back(internAxes(layout.of(dim)));
  OpRules rules(fn_, mesh_, layout, machine_, oversubscription_);

  size_t numValues = fn_.values.size();
  if (out) { // about one SPMD op per IR op, and a reshard for some
    out->ops.reserve(out->ops.size() + 2 * fn_.ops.size());
    out->values.reserve(out->values.size() + 2 * numValues);
  }
  // Per value, written by its op before any read (a search walks thousands of layouts: no
  // clearing of whole arrays per walk): its state and local bytes; the reshards already done
  // (a value resharded once to a layout serves every later consumer), cleared where used; the
  // axes whose gradient sums it needs (params only).
  std::vector<int>& stateOf = walk_.stateOf;
  std::vector<int64_t>& bytesOf = walk_.bytesOf;
  walk_.startWalk();
  std::vector<uint64_t>& gradientAxes = walk_.gradientAxes;
  for (const ir::ParamInfo& param : fn_.params)
    gradientAxes[param.value] = 0;
  AllReduceChains& chains = chains_;
  chains.reset();
  std::vector<SpmdValueId> spmdOf(out ? numValues : 0, 0);
  std::set<std::string> notDivisibleReported;
  std::map<ir::ValueId, SpmdValueId> spmdSources;           // inputs and params
  std::vector<size_t> irOpEnd(out ? fn_.ops.size() : 0, 0); // per IR op: its SPMD ops' end

  WalkSums sums;
  double &forwardCompute = sums.forwardCompute, &forwardCommunication = sums.forwardCommunication;
  double &globalFlops = sums.globalFlops, &idealSeconds = sums.idealSeconds;
  double &live = sums.live, &peakLive = sums.peakLive, &activationSum = sums.activationSum;
  // The copy of a repeated segment this walk walks op by op to memoize it (findSegments).
  SegmentRecorder* recorder = nullptr;
  // A walk that may stop at a cutoff adds the rooflines of the ops it has not walked yet (each
  // at most the op's compute, as in the lower bound) to what it has summed: it stops as soon as
  // both pass the cutoff, not only what it has summed. The rooflines left are a sum less what
  // was walked, which rounds: `slack` (far above that rounding, far below any cost the cutoff
  // tells apart) keeps it from stopping where the whole walk would not pass the cutoff.
  bool rooflines = !out && stopAbove < kInfinity;
  double rooflinesLeft = rooflines ? walkRooflines(layout) : 0;
  double slack = 1e-6 * rooflinesLeft;

  auto newValue = [&](const ir::TensorType& type, const TensorLayout& state,
                      const std::string& name) {
    SpmdValue value;
    // The merge behind evaluate() reads only the values' dtypes (MergeCollectives.cpp): an
    // exact costing makes a value per op and reshard, and copying each one's dims and layout
    // was most of its allocations. Types, layouts, shapes and names are for lowering, and for
    // the row split of a program's partial sums (SequenceParallel.h), which the exact costing
    // runs too.
    if (describe_ || rowSplitBound_) {
      value.globalType = type;
      value.localType = localType(type, state, mesh_);
      value.name = name;
      value.layout = state;
    } else {
      value.globalType.dtype = type.dtype;
    }
    out->values.push_back(std::move(value));
    return static_cast<SpmdValueId>(out->values.size() - 1);
  };

  // Small all-reduces of train steps (autodiff ran) that may move up to their operand's producer
  // and merge with others on the same axes (bucketGradientReductions).
  bool bucketing = fn_.kind == ir::Function::Kind::Train && ir::hasOptimizerUpdates(fn_);
  std::vector<BucketCandidate> candidates;
  // Brings `value` into layout `want` (an interned state) for the op `neededAt` (fn_.ops.size()
  // for outputs and updates); returns the temporary bytes made, or -1 when no path exists (an
  // illegal layout).
  auto bringTo = [&](ir::ValueId value, int want, const std::string& why, const ir::Location& loc,
                     uint32_t opIndex, uint32_t neededAt, SpmdValueId* spmdId) -> double {
    if (stateOf[value] == want) {
      if (spmdId && out) *spmdId = spmdOf[value];
      chains.read(value, 0);
      if (recorder) recorder->reads.emplace_back(value, 0);
      return 0;
    }
    const ReshardEntry& entry = reshardEntry(value, stateOf[value], want);
    const std::optional<ReshardPath>& path = entry.path;
    if (!path) return -1;
    uint32_t groups = chains.groupsOf(*path);
    chains.read(value, groups);
    const SpmdValueId* done = walk_.reshardedTo(value, want);
    if (recorder) {
      recorder->reads.emplace_back(value, groups);
      std::pair<ir::ValueId, int> asked{value, want};
      if (std::find(recorder->reshardsAsked.begin(), recorder->reshardsAsked.end(), asked) ==
          recorder->reshardsAsked.end()) {
        recorder->reshardsAsked.push_back(asked);
        if (fn_.values[value].definingOp < recorder->copy->begin) {
          auto external =
              std::find(recorder->copy->externals.begin(), recorder->copy->externals.end(), value);
          recorder->walk.externalReshards.emplace_back(
              static_cast<uint32_t>(external - recorder->copy->externals.begin()), want,
              done != nullptr);
        }
      }
    }
    if (done) {
      if (spmdId && out) *spmdId = *done;
      return 0;
    }
    forwardCommunication += path->seconds;
    for (double latency : entry.mergeableSeconds)
      result.mergeableLatency += latency;
    if (recorder) {
      recorder->walk.communication.push_back(path->seconds);
      recorder->walk.mergeable.insert(recorder->walk.mergeable.end(),
                                      entry.mergeableSeconds.begin(), entry.mergeableSeconds.end());
      recorder->reshardsDone.push_back({value, want});
    }
    double temporary = 0;
    SpmdValueId current = out ? spmdOf[value] : 0;
    uint32_t producer = fn_.values[value].definingOp;
    if (bucketing && path->steps.size() == 1 &&
        path->steps[0].collective.kind == CollectiveKind::AllReduceSum &&
        path->steps[0].collective.bytes <= kBucketBytes)
      candidates.push_back({value, producer, neededAt, path->steps[0].collective,
                            path->steps[0].seconds, out ? out->ops.size() : 0});
    for (size_t s = 0; s < path->steps.size(); ++s) {
      const ReshardStep& step = path->steps[s];
      temporary += entry.stepBytes[s];
      if (!out) continue;
      // Made in place (the array is reserved): moving a whole SpmdOp per op was 2% of a run.
      SpmdOp& op = out->ops.emplace_back();
      op.kind = SpmdOp::Kind::Collective;
      op.collective = step.collective;
      op.operands = operandBuffer(1);
      op.operands[0] = current;
      op.result = newValue(fn_.typeOf(value), step.after, fn_.values[value].name);
      if (describe_) op.loc = loc;
      op.sourceOp = opIndex;
      op.memoryBytes = 0;
      op.seconds = step.seconds;
      op.note = why;
      op.phase = phases_[producer];
      current = op.result;
    }
    walk_.addReshard(value, want, current);
    if (spmdId && out) *spmdId = current;
    return temporary;
  };

  // One op; false when the walk ends there (an illegal layout, or past `stopAbove`).
  auto walkOp = [&](uint32_t i) -> bool {
    const ir::Op& op = fn_.ops[i];
    const OpPlan& plan = planOf(i, dimAxesIds, stateOf, rules);
    // The walk reads the plan's copy in opKeys_ (in op order), the rest only when lowering.
    const OpCost& cost = opKeys_.cost(i);
    std::span<const int> required = opKeys_.required(i);
    if (!cost.divisible) {
      result.ok = false;
      if (!out) return false;
      if (notDivisibleReported.insert(plan.badDim).second)
        result.problems.push_back(
            {LayoutProblem::Kind::NotDivisible, plan.badDim, plan.badAxes, i, true});
      stateOf[op.result] = internState(
          TensorLayout{std::vector<AxisList>(fn_.typeOf(op.result).dims.size()), {}, false});
      return true;
    }

    double temporary = 0;
    std::span<const ir::ValueId> operands = opKeys_.operands(i);
    // A step-invariant op runs once, in the generated constructor, when its operands are there
    // as it needs them (a collective in between is not hoisted, nor what reads its result).
    bool hoisted = stepInvariant_[i] != 0;
    std::vector<SpmdValueId> operandIds =
        out ? operandBuffer(operands.size()) : std::vector<SpmdValueId>{};
    for (size_t k = 0; k < operands.size(); ++k) {
      ir::ValueId operand = operands[k];
      const TensorLayout& from = states_[stateOf[operand]];
      std::string reason; // only the SPMD function shows it
      if (out && describe_ && stateOf[operand] != required[k]) {
        std::string why =
            fmt::format("for {} at {}:{}", opSpelling(op.kind), op.loc.line, op.loc.col);
        reason =
            !from.partialAxes.empty() && states_[required[k]].partialAxes.empty()
                ? fmt::format("resolve the partial {} of {} over {} {}",
                              from.partialIsMax ? "max" : "sum", valueName(fn_, operand),
                              axesText(AxisList(from.partialAxes.begin(), from.partialAxes.end())),
                              why)
                : fmt::format("reshard {} {}", valueName(fn_, operand), why);
      }
      hoisted = hoisted && stateOf[operand] == required[k];
      double made =
          bringTo(operand, required[k], reason, op.loc, i, i, out ? &operandIds[k] : nullptr);
      if (made < 0) {
        result.ok = false;
        if (!out) return false;
        made = 0;
      }
      temporary += made;
      if (trainable_[operand]) {
        gradientAxes[operand] |= cost.usedAxes;
        if (recorder) recorder->gradientAxes.emplace_back(operand, cost.usedAxes);
      }
    }
    // What the op costs per step: nothing when hoisted (its post-collectives are not).
    double perStep = hoisted ? 0 : 1;
    double computeSeconds = perStep * cost.computeSeconds;
    forwardCompute += computeSeconds;
    if (rowSplitBound_ && isRowWiseKind(op.kind)) {
      sums.rowWiseCompute += computeSeconds;
      if (recorder) recorder->walk.rowWiseCompute += computeSeconds;
    }
    forwardCommunication += cost.postSeconds;
    globalFlops += perStep * cost.globalFlops;
    idealSeconds += perStep * cost.idealSeconds;
    stateOf[op.result] = cost.resultId;
    chains.write(op.result);
    bytesOf[op.result] = cost.resultBytes;
    if (op.kind != OpKind::Param) {
      live += static_cast<double>(cost.resultBytes);
      activationSum += static_cast<double>(cost.resultBytes);
    }
    peakLive = std::max(peakLive, live + temporary);
    if (recorder) {
      SegmentWalk& walk = recorder->walk;
      walk.opSums.insert(walk.opSums.end(),
                         {computeSeconds, perStep * cost.globalFlops, perStep * cost.idealSeconds});
      walk.communication.push_back(cost.postSeconds);
      walk.communicationEnd.push_back(static_cast<uint32_t>(walk.communication.size()));
      walk.mergeableEnd.push_back(static_cast<uint32_t>(walk.mergeable.size()));
      recorder->readsEnd.push_back(static_cast<uint32_t>(recorder->reads.size()));
      recorder->peak = std::max(recorder->peak, live + temporary);
    }
    // Every term summed so far only grows (a path costs at least the latencies merging may
    // save), and the ops not walked yet cost at least their rooflines, so this is a lower
    // bound of the step time; most candidates of a search pass their cutoff within the first
    // layers.
    if (rooflines) {
      if (int term = walkTermOf_[i]; term >= 0) rooflinesLeft -= walkRoofline_[size_t(term)];
    }
    if (!out && i % 16 == 0) {
      double soFar = (modelBackward_ ? 3 : 1) * forwardCompute +
                     (modelBackward_ ? 2 : 1) * forwardCommunication - result.mergeableLatency +
                     chains.latencySeconds();
      if (rowSplitBound_) soFar -= sums.rowWiseCompute + 0.5 * forwardCommunication;
      if (soFar + rooflinesLeft - slack > stopAbove) {
        result.summary.stepSeconds = soFar + rooflinesLeft - slack;
        result.exact = result.complete = false;
        return false;
      }
    }
    for (ir::ValueId dead : freesAt_[i])
      live -= static_cast<double>(bytesOf[dead]);

    if (!out) return true;
    SpmdOp& spmdOp = out->ops.emplace_back(); // in place, as a reshard's
    spmdOp.kind = SpmdOp::Kind::Compute;
    spmdOp.computeKind = op.kind;
    spmdOp.operands = std::move(operandIds);
    spmdOp.result = newValue(fn_.typeOf(op.result), plan.result, fn_.values[op.result].name);
    if (describe_ || rowSplitBound_)
      spmdOp.attrs = op.attrs;
    else if (const ir::AttrValue* copy = op.attr(ir::kRecomputeAttr))
      spmdOp.attrs.emplace_back(ir::kRecomputeAttr, *copy); // the merge reads it (exact costing)
    if (describe_) spmdOp.loc = op.loc;
    spmdOp.sourceOp = i;
    spmdOp.flops = plan.flops;
    spmdOp.memoryBytes = plan.bytes;
    spmdOp.seconds = perStep * plan.computeSeconds;
    if (describe_) spmdOp.note = plan.note;
    spmdOp.phase = phases_[i];
    spmdOf[op.result] = spmdOp.result;
    // Collectives inside the op work in place on its result (or on its row statistics).
    for (const PostCollective& post : plan.post) {
      SpmdOp& collective = out->ops.emplace_back();
      collective.kind = SpmdOp::Kind::Collective;
      collective.collective = post.collective;
      collective.operands = operandBuffer(1);
      collective.operands[0] = spmdOf[op.result];
      collective.result = spmdOf[op.result];
      if (describe_) collective.loc = op.loc;
      collective.sourceOp = i;
      collective.seconds = collectiveSeconds(machine_, mesh_, post.collective);
      if (describe_) collective.note = post.note;
      collective.phase = phases_[i];
    }
    irOpEnd[i] = out->ops.size();
    for (const DroppedAxes& drop : plan.drops)
      out->replications.push_back({op.loc, drop.dim, drop.axes, drop.reason});
    if (op.kind == OpKind::Input || op.kind == OpKind::Param)
      spmdSources[op.result] = spmdOp.result;
    return true;
  };
  // Copies of repeated segments are replayed from a memoized walk of a copy alike (findSegments)
  // when they can be, else walked op by op and memoized; a walk that writes an SPMD function
  // walks every op.
  if (!out && replaySegments_ && !segmentsFound_) {
    findSegments();
    segmentsFound_ = true;
  }
  bool memoize = !out && replaySegments_ && !segments_.empty() && !chains.hasUncountedGroups();
  std::optional<SegmentRecorder> recording;
  size_t nextCopy = 0;
  for (uint32_t i = 0; i < fn_.ops.size();) {
    if (memoize && nextCopy < segments_.size() && segments_[nextCopy].begin == i) {
      const SegmentCopy& copy = segments_[nextCopy++];
      const SegmentWalk* walk = memoizedWalk(copy, dimAxesIds);
      if (walk && replaySegment(copy, *walk, sums, result.mergeableLatency, stopAbove,
                                rooflinesLeft, slack, candidates)) {
        i = copy.end;
        continue;
      }
      if (!walk) {
        recording.emplace();
        recorder = &*recording;
        recorder->copy = &copy;
        recorder->candidatesBegin = candidates.size();
        recorder->liveBefore = live;
        recorder->activationBefore = activationSum;
      }
    }
    if (!walkOp(i)) return result;
    ++i;
    if (recorder && i == recorder->copy->end) {
      finishRecording(*recorder, sums, candidates);
      recorder = nullptr;
    }
  }
  if (!result.ok) return result;
  if (out) {
    for (const ir::InputInfo& input : fn_.inputs)
      out->inputs.push_back(spmdSources[input.value]);
    for (const ir::ParamInfo& param : fn_.params)
      out->params.push_back(spmdSources[param.value]);
  }

  // Outputs leave resolved, in their own layout.
  double outputTemporary = 0;
  for (const ir::OutputInfo& output : fn_.outputs) {
    const ir::TensorType& type = fn_.typeOf(output.value);
    int want = internState(tensorLayoutOf(type, layout, mesh_));
    SpmdValueId id = 0;
    double made =
        bringTo(output.value, want,
                out && describe_ ? fmt::format("resolve output '{}'", output.name) : "", output.loc,
                fn_.values[output.value].definingOp, static_cast<uint32_t>(fn_.ops.size()), &id);
    if (made < 0) {
      result.ok = false;
      return result;
    }
    outputTemporary += made;
    result.summary.outputSeconds +=
        outputSeconds(machine_, double(localBytes(type, states_[want], mesh_))) * oversubscription_;
    if (out) out->outputs.emplace_back(output.name, id);
  }
  // Updates: each new value resolved into its param's layout (the param's storage).
  for (const ir::ParamUpdate& update : fn_.updates) {
    const ir::ParamInfo& param = fn_.params[update.param];
    int want = stateOf[param.value];
    if (want < 0) continue; // a param the plan never materialized
    SpmdValueId id = 0;
    // The reason is for the SPMD function's notes only (a walk passes every update).
    std::string why = out && describe_
                          ? fmt::format("reshard the update of '{}' into its layout", param.path)
                          : "";
    double made = bringTo(update.value, want, why, param.loc, fn_.values[update.value].definingOp,
                          static_cast<uint32_t>(fn_.ops.size()), &id);
    if (made < 0) {
      result.ok = false;
      return result;
    }
    outputTemporary += made;
    if (out) out->updates.emplace_back(update.param, id);
  }
  peakLive = std::max(peakLive, live + outputTemporary);
  result.chainLatency = chains.latencySeconds();
  if (bucketing) {
    result.bucketingSaved = bucketGradientReductions(candidates, irOpEnd, out);
    forwardCommunication -= result.bucketingSaved;
  }

  // Parameters, and for train blocks the backward pass, gradients and optimizer.
  MemoryEstimate& memory = result.memory;
  OptimizerModel optimizer = optimizerModel(fn_);
  bool train = fn_.kind == ir::Function::Kind::Train;
  double optimizerSeconds = 0, gradientSeconds = 0;
  std::map<uint64_t, std::pair<double, std::vector<const ir::ParamInfo*>>> gradientBuckets;
  for (const ir::ParamInfo& param : fn_.params) {
    int state = stateOf[param.value];
    if (state < 0) continue;
    const TensorLayout& layoutOfParam = states_[state];
    double bytes = static_cast<double>(localBytes(param.type, layoutOfParam, mesh_));
    if (param.role == ir::ParamRole::OptimizerState) {
      memory.optimizerBytes += bytes; // a real slot: autodiff's optimizer lowering made it
      continue;
    }
    memory.paramBytes += bytes;
    if (!modelBackward_ || !param.trainable) continue;
    memory.gradientBytes += bytes;
    memory.optimizerBytes += optimizer.stateFactor * bytes;
    if (optimizer.factored) {
      ir::TensorType local = localType(param.type, layoutOfParam, mesh_);
      double elements = static_cast<double>(local.numElements());
      size_t rank = local.dims.size();
      if (rank >= 2)
        memory.optimizerBytes += 4 * (elements / static_cast<double>(local.dims[rank - 1].size) +
                                      elements / static_cast<double>(local.dims[rank - 2].size));
      else
        memory.optimizerBytes += bytes;
    }
    optimizerSeconds +=
        optimizer.trafficFactor * bytes / machine_.memoryBandwidth * oversubscription_;
    // The gradient is a partial sum over every axis that splits the consuming ops but not the
    // param. Gradients with the same axes are all-reduced together (one fused buffer, as
    // data-parallel runtimes bucket them).
    uint64_t paramAxes = 0;
    for (const AxisList& axes : layoutOfParam.dimAxes)
      for (const std::string& axis : axes)
        paramAxes |= uint64_t{1} << std::min(mesh_.axisIndex(axis), 63);
    uint64_t reduceAxes = gradientAxes[param.value] & ~paramAxes;
    if (reduceAxes == 0) continue;
    auto& bucket = gradientBuckets[reduceAxes];
    bucket.first += bytes;
    bucket.second.push_back(&param);
  }
  for (const auto& [mask, bucket] : gradientBuckets) {
    Collective allReduce;
    allReduce.kind = CollectiveKind::AllReduceSum;
    for (size_t a = 0; a < mesh_.axes.size(); ++a)
      if (mask & (uint64_t{1} << a)) allReduce.axes.push_back(mesh_.axes[a].name);
    allReduce.bytes = static_cast<int64_t>(bucket.first);
    allReduce.groupSize = splitFactor(mesh_, allReduce.axes);
    double seconds = collectiveSeconds(machine_, mesh_, allReduce);
    gradientSeconds += seconds;
    if (!out) continue;
    const ir::ParamInfo& first = *bucket.second.front();
    std::vector<std::string> paths;
    for (size_t k = 0; k < bucket.second.size() && k < 3; ++k)
      paths.push_back(bucket.second[k]->path);
    if (bucket.second.size() > 3) paths.push_back("...");
    SpmdOp op;
    op.kind = SpmdOp::Kind::Collective;
    op.collective = allReduce;
    op.operands = {spmdOf[first.value]};
    op.result = spmdOf[first.value];
    op.loc = first.loc;
    op.sourceOp = fn_.values[first.value].definingOp;
    op.seconds = seconds;
    op.note = fmt::format("gradients of {} params ({}): partial sums over {}, one fused all-reduce",
                          bucket.second.size(), fmt::join(paths, ", "), axesText(allReduce.axes));
    out->gradientOps.push_back(std::move(op));
  }
  // Modelled backward: every activation is kept for it. Planned backward: the real liveness
  // (gradients are among the activations).
  memory.peakActivationBytes = modelBackward_ ? activationSum : peakLive;

  PlanSummary& summary = result.summary;
  summary.includesBackward = train;
  summary.backwardIsReal = train && !modelBackward_;
  double passes = modelBackward_ ? 3 : 1; // modelled backward ~ 2x forward
  summary.computeSeconds = passes * forwardCompute + optimizerSeconds + summary.outputSeconds;
  summary.communicationSeconds = (modelBackward_ ? 2 : 1) * forwardCommunication +
                                 gradientSeconds; // modelled: forward collectives mirrored
  summary.stepSeconds = summary.computeSeconds + summary.communicationSeconds;
  summary.totalFlops = passes * globalFlops;
  double devices = static_cast<double>(
      std::min<int64_t>(mesh_.numDevices(), std::max<int64_t>(machine_.numDevices, 1)));
  summary.utilization =
      summary.stepSeconds > 0 ? passes * idealSeconds / (devices * summary.stepSeconds) : 0;
  if (rowSplitBound_)
    result.rowSplitPotential = sums.rowWiseCompute + 0.5 * summary.communicationSeconds;
  if (out) {
    out->memory = memory;
    out->summary = summary;
  }
  return result;
}

EvalResult PlanEvaluator::Impl::evaluate(const Layout& layout, double cutoff, bool complete) {
  EvalResult result = run(layout, nullptr, complete ? kInfinity : cutoff);
  if (!result.ok || !result.complete) return result;
  // Lowering and merging cost far more than run() alone; a layout that loses even if the merge
  // saved every latency it can is not worth them (most candidates of a search).
  double bound = result.summary.stepSeconds + result.bucketingSaved - result.mergeableLatency +
                 result.chainLatency - result.rowSplitPotential;
  if (bound > cutoff) {
    result.summary.stepSeconds = bound;
    result.exact = false;
    return result;
  }
  // One scratch function per evaluator: its op and value arrays (tens of megabytes at 96
  // layers) keep their memory from one exact costing to the next.
  std::vector<SpmdOp> ops = std::move(scratch_.ops);
  std::vector<SpmdValue> values = std::move(scratch_.values);
  // So do its ops' operand lists (one per op: tens of thousands allocated and freed per exact
  // costing otherwise).
  for (SpmdOp& op : ops)
    if (op.operands.capacity() > 0) spareOperands_.push_back(std::move(op.operands));
  ops.clear();
  values.clear();
  scratch_ = SpmdFunction{};
  scratch_.ops = std::move(ops);
  scratch_.values = std::move(values);
  SpmdFunction& scratch = scratch_;
  scratch.mesh = mesh_;
  describe_ = false;
  result = run(layout, &scratch);
  describe_ = true;
  scratch.summary = result.summary;
  // As lowerWith: the row-split regions first (they change which all-reduces remain to merge).
  splitRowsOfPartialSums(scratch, machine_);
  mergedSummary(scratch, machine_);
  result.summary = scratch.summary;
  return result;
}

const EvalResult& PlanEvaluator::Impl::resultFor(const Layout& layout, double cutoff,
                                                 bool complete) {
  bool reuse = lastLayout_ && *lastLayout_ == layout &&
               (lastResult_.exact || !lastResult_.ok || lastResult_.summary.stepSeconds > cutoff) &&
               (lastResult_.complete || !complete);
  if (!reuse) {
    lastResult_ = evaluate(layout, cutoff, complete);
    lastLayout_ = layout;
  }
  return lastResult_;
}

double PlanEvaluator::Impl::bucketGradientReductions(std::vector<BucketCandidate> candidates,
                                                     const std::vector<size_t>& irOpEnd,
                                                     SpmdFunction* out) {
  std::stable_sort(
      candidates.begin(), candidates.end(),
      [](const BucketCandidate& a, const BucketCandidate& b) { return a.ready < b.ready; });
  struct Bucket {
    std::vector<size_t> members;
    int64_t bytes = 0;
    uint32_t ready = 0, needed = 0;
  };
  std::vector<Bucket> buckets;
  std::map<AxisList, size_t> open; // per axes: the bucket still taking members
  for (size_t c = 0; c < candidates.size(); ++c) {
    const BucketCandidate& candidate = candidates[c];
    auto it = open.find(candidate.collective.axes);
    if (it != open.end()) {
      Bucket& bucket = buckets[it->second];
      // Ready times only grow: once a bucket is needed before a candidate is ready, it is closed.
      if (bucket.needed > candidate.ready &&
          bucket.bytes + candidate.collective.bytes <= kBucketBytes) {
        bucket.members.push_back(c);
        bucket.bytes += candidate.collective.bytes;
        bucket.ready = std::max(bucket.ready, candidate.ready);
        bucket.needed = std::min(bucket.needed, candidate.needed);
        continue;
      }
    }
    open[candidate.collective.axes] = buckets.size();
    buckets.push_back({{c}, candidate.collective.bytes, candidate.ready, candidate.needed});
  }
  double saved = 0;
  std::vector<std::pair<size_t, SpmdOp>> inserted; // (position in the old list, op)
  if (out) inserted.reserve(buckets.size());
  std::vector<bool> removed(out ? out->ops.size() : 0, false);
  for (const Bucket& bucket : buckets) {
    const BucketCandidate& first = candidates[bucket.members.front()];
    // The bucket goes where its last member is ready; it takes that member's source and phase.
    const BucketCandidate& placing = candidates[bucket.members.back()];
    size_t position = irOpEnd.empty() ? 0 : irOpEnd[bucket.ready];
    if (bucket.members.size() == 1) {
      if (!out) continue;
      // Moved up, unchanged (no other bucket reads a member of this one).
      removed[first.spmdIndex] = true;
      inserted.emplace_back(position, std::move(out->ops[first.spmdIndex]));
      continue;
    }
    Collective merged = first.collective;
    merged.kind = CollectiveKind::BucketedAllReduceSum;
    merged.bytes = bucket.bytes;
    double seconds = collectiveSeconds(machine_, mesh_, merged);
    for (size_t member : bucket.members)
      saved += candidates[member].seconds;
    saved -= seconds;
    if (!out) continue;
    SpmdOp op = out->ops[placing.spmdIndex];
    op.collective = merged;
    op.seconds = seconds;
    op.operands.clear();
    std::vector<std::string> names;
    for (size_t member : bucket.members) {
      const SpmdOp& single = out->ops[candidates[member].spmdIndex];
      removed[candidates[member].spmdIndex] = true;
      op.operands.push_back(single.operands[0]);
      op.results.push_back(single.result);
      if (names.size() < 3) names.push_back(valueName(fn_, candidates[member].value));
    }
    if (bucket.members.size() > 3) names.push_back("...");
    op.result = op.results.front();
    op.note = fmt::format("{} partial sums ({}) over {} resolved together, {} in one buffer",
                          bucket.members.size(), fmt::join(names, ", "), axesText(merged.axes),
                          bytesString(static_cast<double>(bucket.bytes)));
    inserted.emplace_back(position, std::move(op));
  }
  if (!out) return saved;
  std::stable_sort(inserted.begin(), inserted.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<SpmdOp> ops;
  ops.reserve(out->ops.size());
  size_t next = 0;
  for (size_t p = 0; p <= out->ops.size(); ++p) {
    for (; next < inserted.size() && inserted[next].first == p; ++next)
      ops.push_back(std::move(inserted[next].second));
    if (p < out->ops.size() && !removed[p]) ops.push_back(std::move(out->ops[p]));
  }
  out->ops = std::move(ops);
  return saved;
}

namespace {

/// Whether `op` can keep a partial sum in operand `k` lazy (OpRules: linear unary ops and
/// reductions, add and sub, mul, the numerator of a div, an einsum), layouts permitting.
bool keepsPartialLazy(const ir::Function& fn, const ir::Op& op, size_t k) {
  if (op.operands.size() == 1) return isLinearUnary(fn, op);
  switch (op.kind) {
  case OpKind::Add:
  case OpKind::Sub:
  case OpKind::Mul:
  case OpKind::Einsum:
    return true;
  case OpKind::Div:
    return k == 0;
  default:
    return false;
  }
}

} // namespace

void PlanEvaluator::Impl::prepareSharedPartials() {
  const std::vector<std::vector<uint32_t>>& readersOf = readersOf_;
  std::vector<bool> leaves(fn_.values.size(), false); // outputs and updates: resolved at the end
  for (const ir::OutputInfo& output : fn_.outputs)
    leaves[output.value] = true;
  for (const ir::ParamUpdate& update : fn_.updates)
    leaves[update.value] = true;
  auto operandIndex = [&](const ir::Op& op, ir::ValueId value) {
    return static_cast<size_t>(std::find(op.operands.begin(), op.operands.end(), value) -
                               op.operands.begin());
  };
  // A reader that can keep the sum lazy: linear in it, not in the update (which resolves), and
  // reading it once (square as x * x is not linear).
  auto keepsLazy = [&](uint32_t reader, ir::ValueId value) {
    const ir::Op& op = fn_.ops[reader];
    return phases_[reader] != Phase::Update &&
           std::count(op.operands.begin(), op.operands.end(), value) == 1 &&
           keepsPartialLazy(fn_, op, operandIndex(op, value));
  };
  std::map<std::string, int> signatures;
  sharedOf_.assign(fn_.values.size(), -1);
  for (ir::ValueId v = 0; v < fn_.values.size(); ++v) {
    if (readersOf[v].size() < 2) continue;
    SharedPartial shared;
    shared.resolvedAnyway = leaves[v];
    double elements = static_cast<double>(fn_.typeOf(v).numElements());
    for (uint32_t reader : readersOf[v]) {
      if (shared.resolvedAnyway) break;
      if (!keepsLazy(reader, v)) {
        shared.resolvedAnyway = true;
      } else if (fn_.ops[reader].kind == OpKind::Einsum) {
        ++shared.einsumReaders;
      } else {
        ir::ValueId end = fn_.ops[reader].result;
        while (!leaves[end] && readersOf[end].size() == 1 &&
               fn_.ops[readersOf[end][0]].kind != OpKind::Einsum &&
               keepsLazy(readersOf[end][0], end))
          end = fn_.ops[readersOf[end][0]].result;
        shared.chainEnds.push_back(static_cast<double>(fn_.typeOf(end).numElements()) /
                                   std::max(elements, 1.0));
      }
    }
    std::string signature = shared.resolvedAnyway
                                ? std::string("resolved")
                                : fmt::format("{}|{}|{}", typeIds_[v], shared.einsumReaders,
                                              fmt::join(shared.chainEnds, ","));
    shared.signature =
        signatures.try_emplace(signature, static_cast<int>(signatures.size())).first->second;
    sharedOf_[v] = static_cast<int>(shared_.size());
    shared_.push_back(std::move(shared));
  }
  readsShared_.assign(fn_.ops.size(), 0);
  for (uint32_t i = 0; i < fn_.ops.size(); ++i)
    for (ir::ValueId operand : fn_.ops[i].operands)
      if (sharedOf_[operand] >= 0) readsShared_[i] = 1;
}

bool PlanEvaluator::Impl::resolveOnce(ir::ValueId value, int stateId) {
  if (sharedOf_[value] < 0 || stateId < 0 || !partialSumState_[stateId]) return false;
  const SharedPartial& shared = shared_[sharedOf_[value]];
  if (shared.resolvedAnyway) return true;
  if (resolveOnceMemo_.size() <= size_t(shared.signature))
    resolveOnceMemo_.resize(size_t(shared.signature) + 1);
  std::vector<int8_t>& known = resolveOnceMemo_[size_t(shared.signature)];
  if (known.size() <= size_t(stateId)) known.resize(states_.size(), -1);
  if (known[size_t(stateId)] >= 0) return known[size_t(stateId)] == 1;
  // A copy: interning the resolved state below may grow states_.
  const TensorLayout state = states_[stateId];
  TensorLayout resolved = state;
  resolved.partialAxes.clear();
  const std::optional<ReshardPath>& path = reshard(value, stateId, internState(resolved));
  double once = path ? path->seconds : kInfinity;
  Collective lazy;
  lazy.kind = CollectiveKind::AllReduceSum;
  for (const ir::MeshAxis& axis : mesh_.axes)
    if (state.partialAxes.count(axis.name)) lazy.axes.push_back(axis.name);
  lazy.groupSize = splitFactor(mesh_, lazy.axes);
  double bytes = static_cast<double>(localBytes(fn_.typeOf(value), state, mesh_));
  double lazySeconds = shared.einsumReaders * once;
  for (double end : shared.chainEnds) {
    lazy.bytes = static_cast<int64_t>(std::ceil(bytes * end));
    lazySeconds += collectiveSeconds(machine_, mesh_, lazy);
  }
  bool eager = once <= lazySeconds;
  known[size_t(stateId)] = eager ? 1 : 0;
  return eager;
}

void PlanEvaluator::Impl::findPartners() {
  // A sum's result, through single-reader float casts and negations, goes into an add or sub
  // that keeps partial sums lazy (its only reader, not in the update) or into a div, which
  // resolves both operands (other readers then reuse the resolved value); its partner is that
  // op's other operand when it is planned first.
  const std::vector<std::vector<uint32_t>>& readersOf = readersOf_;
  partner_.assign(fn_.ops.size(), -1);
  soleConsumer_.assign(fn_.ops.size(), -1);
  laterSum_.assign(fn_.ops.size(), -1);
  // The sum a value comes from through single-reader float casts and negations (-1: none).
  auto sumBehind = [&](ir::ValueId value) -> int64_t {
    for (;;) {
      const ir::Op& producer = fn_.ops[fn_.values[value].definingOp];
      if (producer.kind == OpKind::ReduceSum || producer.kind == OpKind::ReduceMean)
        return fn_.values[value].definingOp;
      if ((producer.kind != OpKind::Cast && producer.kind != OpKind::Neg) ||
          !isLinearUnary(fn_, producer) || readersOf[producer.operands[0]].size() != 1)
        return -1;
      value = producer.operands[0];
    }
  };
  for (uint32_t i = 0; i < fn_.ops.size(); ++i) {
    const ir::Op& op = fn_.ops[i];
    if (op.kind != OpKind::ReduceSum && op.kind != OpKind::ReduceMean) continue;
    ir::ValueId value = op.result;
    while (readersOf[value].size() == 1) {
      const ir::Op& reader = fn_.ops[readersOf[value][0]];
      if ((reader.kind != OpKind::Cast && reader.kind != OpKind::Neg) ||
          !isLinearUnary(fn_, reader))
        break;
      value = reader.result;
    }
    for (uint32_t j : readersOf[value]) {
      const ir::Op& reader = fn_.ops[j];
      bool lazyAdd = (reader.kind == OpKind::Add || reader.kind == OpKind::Sub) &&
                     phases_[j] != Phase::Update && readersOf[value].size() == 1;
      if ((!lazyAdd && reader.kind != OpKind::Div) || reader.operands.size() != 2 ||
          reader.operands[0] == reader.operands[1])
        continue;
      ir::ValueId other = reader.operands[reader.operands[0] == value ? 1 : 0];
      // An operand read twice in backward is resolved where it is read (planOf): no partner.
      if (phases_[j] == Phase::Backward && readers_[other] > 1) continue;
      soleConsumer_[i] = j;
      if (fn_.values[other].definingOp < i) {
        partner_[i] = other;
      } else if (lazyAdd && sumBehind(other) >= 0) {
        // The first term of a chain of sums (a global norm's squares): the next term's axes.
        laterSum_[i] = sumBehind(other);
        for (const ir::Dim& dim : fn_.typeOf(fn_.ops[laterSum_[i]].operands[0]).dims)
          if (int index = dimIndex_.at(dim.name);
              std::find(involved_[i].begin(), involved_[i].end(), index) == involved_[i].end())
            involved_[i].push_back(index);
      } else {
        soleConsumer_[i] = -1;
        continue;
      }
      break;
    }
  }
}

namespace {

/// lowerToSpmd on an engine (a search's, whose memo tables then serve).
std::optional<SpmdFunction> lowerWith(PlanEvaluator::Impl& engine, const ir::Module& module,
                                      const ir::Function& fn, const Mesh& mesh,
                                      const Layout& layout, const Machine& machine,
                                      DiagEngine& diag) {
  SpmdFunction out;
  out.name = fn.name;
  out.kind = fn.kind;
  out.mesh = mesh;
  out.layout = layout;
  out.machineName = machine.name;
  EvalResult result = engine.run(layout, &out);
  if (result.ok) {
    splitRowsOfPartialSums(out, machine);
    mergeAllReduces(out, machine);
    return out;
  }
  // Report at the layout entry that maps the dim (if the program pinned it), else at the op.
  auto entryFor = [&](const std::string& dim) -> const ir::DimLayout* {
    for (const ir::DimLayout& entry : module.layout)
      if (entry.dim == dim && entry.loc.loc.isValid()) return &entry;
    return nullptr;
  };
  for (const LayoutProblem& problem : result.problems) {
    const ir::DimLayout* entry = entryFor(problem.dim);
    llvm::SMLoc loc;
    if (entry && entry->axes == layout.of(problem.dim))
      loc = entry->loc.loc;
    else if (problem.hasOp)
      loc = fn.ops[problem.opIndex].loc.loc;
    switch (problem.kind) {
    case LayoutProblem::Kind::UnknownAxis:
      diag.report(loc, Diag::ErrUnknownAxis, problem.axes[0]);
      break;
    case LayoutProblem::Kind::AxisTwice:
      diag.report(loc, Diag::ErrAxisTwiceForDim, problem.axes[0], problem.dim);
      break;
    case LayoutProblem::Kind::NotDivisible: {
      int64_t factor = splitFactor(mesh, problem.axes);
      std::string axes = fmt::format("{}", fmt::join(problem.axes, " x "));
      if (problem.axes.size() > 1) axes += fmt::format(" = {}", factor);
      int64_t size = 0;
      for (const ir::Value& value : fn.values)
        if (int index = value.type.findDim(problem.dim); index >= 0)
          size = value.type.dims[index].size;
      diag.report(loc, Diag::ErrNotDivisible, problem.dim, size, factor, axes);
      break;
    }
    }
  }
  // Every other failure (a reshard between two layouts with no path) is unreachable: the rules
  // only require legal layouts that keep an operand's partial axes (the randomized unit test
  // checks every value of thousands of plans).
  return std::nullopt;
}

} // namespace

std::optional<SpmdFunction> lowerToSpmd(const ir::Module& module, const ir::Function& fn,
                                        const Mesh& mesh, const Layout& layout,
                                        const Machine& machine, DiagEngine& diag) {
  PlanEvaluator::Impl engine(module, fn, mesh, machine);
  return lowerWith(engine, module, fn, mesh, layout, machine, diag);
}

std::optional<SpmdFunction> PlanEvaluator::lower(const Layout& layout, DiagEngine& diag) {
  return lowerWith(*impl_, impl_->module_, impl_->fn_, impl_->mesh_, layout, impl_->machine_, diag);
}

std::vector<Phase> trainStepPhases(const ir::Function& fn) {
  return opPhases(fn);
}

PlanEvaluator::PlanEvaluator(const ir::Module& module, const ir::Function& fn, const Mesh& mesh,
                             const Machine& machine)
    : impl_(std::make_unique<Impl>(module, fn, mesh, machine)) {}

PlanEvaluator::~PlanEvaluator() = default;

double PlanEvaluator::stepSeconds(const Layout& layout, double cutoff, bool complete) {
  const EvalResult& result = impl_->resultFor(layout, cutoff, complete);
  return result.ok ? result.summary.stepSeconds : kInfinity;
}

MemoryEstimate PlanEvaluator::memory(const Layout& layout) {
  // The merge changes no memory: the cheapest evaluation of the layout serves.
  const EvalResult& result = impl_->resultFor(layout, -kInfinity, /*complete=*/true);
  if (!result.ok) {
    MemoryEstimate infinite;
    infinite.paramBytes = kInfinity;
    return infinite;
  }
  return result.memory;
}

double PlanEvaluator::memoryLowerBound() {
  return impl_->memoryLowerBound();
}

void PlanEvaluator::setReplaySegments(bool replay) {
  impl_->replaySegments_ = replay;
}

size_t PlanEvaluator::boundCopiesReplayed() const {
  return impl_->boundCopiesReplayed_;
}

const std::vector<std::string>& PlanEvaluator::relevantDims() const {
  return impl_->relevantDims_;
}

double PlanEvaluator::lowerBound(const Layout& partial,
                                 const std::vector<std::string>& assignedDims, double cutoff) {
  return impl_->lowerBound(partial, assignedDims, cutoff);
}

} // namespace meshc::plan
