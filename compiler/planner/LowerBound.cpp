// The layout search's lower bounds (PlanEvaluator::lowerBound and memoryLowerBound): what a
// partial layout costs at least, whatever the dims not yet assigned get, from per-op terms
// prepared once (the ops of repeated layers share one) and the ops whose layouts are known.
#include "planner/PlanEvaluatorImpl.h"

#include <optional>
#include <set>

namespace meshc::plan {

namespace {
using ir::OpKind;
/// Copies with fewer known ops than this are walked op by op (a replay looks up its key).
constexpr size_t kMinBoundCopyOps = 4;
/// The bound's memoized copies' size past which they are dropped, and walks kept per key (they
/// differ in which of the externals' reshards were done before).
constexpr size_t kMaxBoundCopyBytes = size_t{64} << 20;
constexpr size_t kMaxBoundWalksPerKey = 8;
} // namespace

double PlanEvaluator::Impl::lowerBound(const Layout& partial,
                                       const std::vector<std::string>& assignedDims,
                                       double cutoff) {
  // An op whose dims are all assigned and whose operands' layouts are known costs exactly what
  // the engine says (its plan depends on nothing else); so do the reshards between known
  // layouts (each distinct one counted once, as the engine does). Any other op costs at least
  // the roofline of its global work divided by the largest split it could get (assigned dims:
  // their split; the others: the largest divisor of their size among products of mesh axes;
  // never more than the number of devices), and its collectives at least 0. All-reduce-sums
  // pay their latency once per group of axes, as if all merged (MergeCollectives.h); a sum whose
  // partner is not known is not known either (widenToPartner). With every dim that matters
  // assigned, the bound is the cost itself.
  // The relevant dims are those of size > 1 (relevantDims_), found by index, not by comparing
  // every relevant name with every assigned one (a search asks tens of thousands of bounds).
  std::vector<char>& named = boundNamed_;
  named.assign(dimNames_.size(), 0);
  for (const std::string& dim : assignedDims)
    if (auto it = dimIndex_.find(dim); it != dimIndex_.end())
      named[static_cast<size_t>(it->second)] = 1;
  bool allRelevant = true;
  for (size_t d = 0; d < dimNames_.size() && allRelevant; ++d)
    allRelevant = dimSizes_[d] <= 1 || named[d];
  if (allRelevant) {
    const EvalResult& result = resultFor(partial, cutoff);
    return result.ok ? result.summary.stepSeconds : kInfinity;
  }
  std::vector<bool> assigned(dimNames_.size(), false);
  std::vector<int> dimAxesIds(dimNames_.size(), -1);
  std::vector<double> split(dimNames_.size());
  for (size_t d = 0; d < dimNames_.size(); ++d)
    split[d] = static_cast<double>(maxSplit_[d]);
  // Dims of size 1 (not relevant: no search assigns them) are replicated in every completion,
  // so they count as assigned; else no op touching one would ever be known (ViT's class token).
  for (size_t d = 0; d < dimNames_.size(); ++d)
    if (dimSizes_[d] <= 1) {
      assigned[d] = true;
      dimAxesIds[d] = internAxes(partial.of(dimNames_[d]));
      split[d] = 1;
    }
  for (const std::string& dim : assignedDims) {
    auto it = dimIndex_.find(dim);
    if (it == dimIndex_.end()) continue;
    const AxisList& axes = partial.of(dim);
    for (auto axis = axes.begin(); axis != axes.end(); ++axis)
      if (mesh_.axisIndex(*axis) < 0 || std::find(axes.begin(), axis, *axis) != axis)
        return kInfinity;
    assigned[it->second] = true;
    dimAxesIds[it->second] = internAxes(axes);
    split[it->second] = static_cast<double>(std::max<int64_t>(splitFactor(mesh_, axes), 1));
  }
  double devices = static_cast<double>(mesh_.numDevices());
  auto splitOf = [&](const std::vector<int>& dims) {
    double product = 1;
    for (int d : dims)
      product *= split[d];
    return std::min(product, devices);
  };
  OpRules rules(fn_, mesh_, partial, machine_, oversubscription_);
  std::vector<int>& stateOf = boundStateOf_; // known values only: written before read
  walk_.startWalk();                         // its reshards, each counted once
  double compute = 0, communication = 0;
  // The all-reduce-sums' latencies: what the longest chains of dependent ones pay at least.
  AllReduceChains& chains = chains_;
  chains.reset();
  // A copy of a repeated segment walked op by op to be replayed (BoundCopyKind): what it adds,
  // and whether it stays off the all-reduce chains.
  struct Recorder {
    const BoundLevel::Span* span = nullptr;
    std::vector<int> key;
    BoundCopyWalk walk;
    std::vector<std::pair<ir::ValueId, int>> asked, done;
    bool offChains = true;
  };
  std::optional<Recorder> recording;
  auto reshardCost = [&](ir::ValueId value, int want) {
    if (stateOf[value] == want) {
      chains.read(value, 0);
      return 0.0;
    }
    const ReshardEntry& entry = reshardEntry(value, stateOf[value], want);
    if (!entry.path) return kInfinity;
    uint32_t groups = chains.groupsOf(*entry.path);
    chains.read(value, groups);
    bool done = walk_.reshardedTo(value, want) != nullptr;
    if (recording) {
      if (groups != 0) recording->offChains = false;
      const SegmentCopy& copy = segments_[recording->span->copy];
      std::pair<ir::ValueId, int> asked{value, want};
      if (fn_.values[value].definingOp < copy.begin &&
          std::find(recording->asked.begin(), recording->asked.end(), asked) ==
              recording->asked.end()) {
        recording->asked.push_back(asked);
        auto external = std::find(copy.externals.begin(), copy.externals.end(), value);
        recording->walk.externalReshards.emplace_back(
            static_cast<uint32_t>(external - copy.externals.begin()), want, done);
      }
      if (!done) recording->done.push_back(asked);
    }
    if (done) return 0.0;
    walk_.addReshard(value, want, 0);
    double seconds = entry.path->seconds;
    for (double latency : entry.mergeableSeconds)
      seconds -= latency;
    return seconds;
  };
  double passes = modelBackward_ ? 3 : 1, communicationPasses = modelBackward_ ? 2 : 1;
  prepareBound();
  const BoundLevel& level = boundLevel(assigned);
  auto termSeconds = [&](const BoundTerm& term) { return boundTermSeconds(term, split); };
  for (const auto& [termIndex, count] : level.unknownTerms)
    compute += count * termSeconds(boundTerms_[termIndex]) * oversubscription_;
  // The known ops not walked yet cost at least their rooflines too (their dims are assigned:
  // the rooflines at their splits), so the walk stops as soon as what it has summed plus those
  // passes the cutoff, not only what it has summed (a bound that will cut stops sooner; one that
  // will not is walked to the end as before).
  // The rooflines left are a sum less what was walked, which rounds: `slack` (far above that
  // rounding, far below any cost the cutoff tells apart) keeps the stop from firing where the
  // whole walk would not have passed the cutoff, so the search cuts the same subtrees.
  std::vector<double>& rooflineOf = boundRoofline_; // per term of a known op, this layout's
  rooflineOf.resize(boundTerms_.size());
  double rooflinesLeft = 0;
  for (const auto& [termIndex, count] : level.knownTerms) {
    rooflineOf[termIndex] = passes * termSeconds(boundTerms_[termIndex]) * oversubscription_;
    rooflinesLeft += count * rooflineOf[termIndex];
  }
  double slack = 1e-6 * rooflinesLeft;
  // A program's row split (SequenceParallel.h) may save up to its known row-wise ops' compute
  // and half the communication: a bound that holds with it leaves that out.
  double rowWise = 0;
  auto rowSplitSaving = [&] { return rowSplitBound_ ? rowWise + 0.5 * communication : 0.0; };
  // Every term only grows: past the cutoff, the sum so far with the rooflines left is bound
  // enough (a replayed copy makes the same checks: no row split saving there, none replays).
  auto sumSoFar = [&] {
    double soFar = passes * compute + communicationPasses * communication +
                   chains.latencySeconds() - rowSplitSaving();
    return soFar + rooflinesLeft - slack;
  };
  // Copies of repeated segments are replayed when a walk of a copy alike is known (the same
  // dims' axes, the same states of what they read, the same reshards of those done before),
  // else walked op by op and kept.
  bool replay = replaySegments_ && !level.spans.empty() && !chains.hasUncountedGroups();
  size_t nextSpan = 0;
  for (size_t n = 0; n < level.knownOps.size(); ++n) {
    if (replay && nextSpan < level.spans.size() && level.spans[nextSpan].begin == n) {
      const BoundLevel::Span& span = level.spans[nextSpan++];
      const SegmentCopy& copy = segments_[span.copy];
      BoundCopyKind& kind = boundCopyKinds_[size_t(span.kind)];
      if (offChains(copy, kind)) {
        std::vector<int> key;
        key.reserve(segmentKinds_[size_t(kind.kind)].dims.size() + kind.reads.size());
        for (int dim : segmentKinds_[size_t(kind.kind)].dims)
          key.push_back(dimAxesIds[size_t(dim)]);
        for (uint32_t read : kind.reads)
          key.push_back(stateOf[copy.externals[read]]);
        const BoundCopyWalk* known = nullptr;
        if (auto found = kind.walks.find(key); found != kind.walks.end())
          for (const BoundCopyWalk& walk : found->second)
            if (std::all_of(walk.externalReshards.begin(), walk.externalReshards.end(),
                            [&](const auto& asked) {
                              const auto& [external, state, done] = asked;
                              return (walk_.reshardedTo(copy.externals[external], state) !=
                                      nullptr) == done;
                            })) {
              known = &walk;
              break;
            }
        if (known) {
          // The walk's sums and checks, term for term.
          size_t c = 0;
          for (size_t j = 0; j < kind.ops.size(); ++j, ++n) {
            if (n % 16 == 0)
              if (double atLeast = sumSoFar(); atLeast > cutoff) return atLeast;
            if (int term = level.countedTerm[n]; term >= 0) rooflinesLeft -= rooflineOf[term];
            for (; c < known->communicationEnd[j]; ++c)
              communication += known->communication[c];
            compute += known->compute[j];
          }
          --n; // the loop's increment
          for (size_t x = 0; x < kind.exports.size(); ++x) {
            ir::ValueId value = opKeys_.result(copy.begin + kind.ops[kind.exports[x]]);
            stateOf[value] = known->exportStates[x];
            chains.setDepths(value, AllReduceChains::Depths{});
          }
          for (const auto& [external, state, done] : known->externalReshards)
            if (!done) walk_.addReshard(copy.externals[external], state, 0);
          for (const auto& [x, state] : known->exportReshards)
            walk_.addReshard(opKeys_.result(copy.begin + kind.ops[kind.exports[x]]), state, 0);
          ++boundCopiesReplayed_;
          continue;
        }
        recording.emplace();
        recording->span = &span;
        recording->key = std::move(key);
      }
    }
    if (n % 16 == 0)
      if (double atLeast = sumSoFar(); atLeast > cutoff) return atLeast;
    uint32_t i = level.knownOps[n];
    if (int term = level.countedTerm[n]; term >= 0) rooflinesLeft -= rooflineOf[term];
    planOf(i, dimAxesIds, stateOf, rules);
    const OpCost& cost = opKeys_.cost(i);  // the plan's copy, in op order
    if (!cost.divisible) return kInfinity; // every completion has this split
    std::span<const ir::ValueId> operands = opKeys_.operands(i);
    std::span<const int> required = opKeys_.required(i);
    for (size_t k = 0; k < operands.size(); ++k) {
      double seconds = reshardCost(operands[k], required[k]);
      communication += seconds;
      if (recording && seconds != 0) recording->walk.communication.push_back(seconds);
    }
    // A step-invariant op costs nothing where the walk hoists it: at most that here.
    double computeSeconds = stepInvariant_[i] ? 0 : cost.computeSeconds;
    compute += computeSeconds;
    if (rowSplitBound_ && isRowWiseKind(fn_.ops[i].kind)) rowWise += computeSeconds;
    communication += cost.postSeconds;
    ir::ValueId result = opKeys_.result(i);
    stateOf[result] = cost.resultId;
    chains.write(result);
    if (!recording) continue;
    BoundCopyWalk& walk = recording->walk;
    if (cost.postSeconds != 0) walk.communication.push_back(cost.postSeconds);
    walk.communicationEnd.push_back(static_cast<uint32_t>(walk.communication.size()));
    walk.compute.push_back(computeSeconds);
    if (n + 1 == recording->span->end) {
      finishBoundCopy(*recording->span, std::move(recording->key), std::move(walk), recording->done,
                      recording->offChains);
      recording.reset();
    }
  }
  for (const ir::OutputInfo& output : fn_.outputs) {
    const ir::TensorType& type = fn_.typeOf(output.value);
    if (!level.knownValues[output.value] ||
        !std::all_of(type.dims.begin(), type.dims.end(),
                     [&](const ir::Dim& dim) { return assigned[dimIndex_.at(dim.name)]; }))
      continue;
    communication += reshardCost(output.value, internState(tensorLayoutOf(type, partial, mesh_)));
  }
  double bound = passes * compute + communicationPasses * communication + chains.latencySeconds() -
                 rowSplitSaving();
  for (const auto& [globalBytes, dims] : optimizerTerms_)
    bound += globalBytes / splitOf(dims) / machine_.memoryBandwidth * oversubscription_;
  return bound;
}

double PlanEvaluator::Impl::boundTermSeconds(const BoundTerm& term,
                                             const std::vector<double>& split) const {
  // What an op of the term costs at least, with the dims' splits known or at most.
  double devices = static_cast<double>(mesh_.numDevices());
  auto splitOf = [&](const std::vector<int>& dims) {
    double product = 1;
    for (int d : dims)
      product *= split[size_t(d)];
    return std::min(product, devices);
  };
  double bytes = 0;
  for (const auto& [globalBytes, dims] : term.tensors)
    bytes += globalBytes / (term.anySplit ? devices : splitOf(dims));
  double flops = term.einsumFlops / splitOf(term.involved);
  double seconds = computeSeconds(machine_, flops, bytes, term.dtype);
  if (term.elementSeconds > 0)
    seconds = std::max(seconds, term.elementSeconds / splitOf(term.elementDims));
  return seconds + term.fixedSeconds;
}

double PlanEvaluator::Impl::walkRooflines(const Layout& layout) {
  prepareBound();
  std::vector<double> split(dimNames_.size(), 1);
  for (size_t d = 0; d < dimNames_.size(); ++d)
    split[d] =
        static_cast<double>(std::max<int64_t>(splitFactor(mesh_, layout.of(dimNames_[d])), 1));
  double passes = modelBackward_ ? 3 : 1, total = 0;
  walkRoofline_.resize(boundTerms_.size());
  for (const auto& [term, count] : walkTermCounts_) {
    walkRoofline_[size_t(term)] =
        passes * boundTermSeconds(boundTerms_[size_t(term)], split) * oversubscription_;
    total += count * walkRoofline_[size_t(term)];
  }
  return total;
}

const PlanEvaluator::Impl::BoundLevel&
PlanEvaluator::Impl::boundLevel(const std::vector<bool>& assigned) {
  auto [it, inserted] = boundLevels_.try_emplace(assigned);
  BoundLevel& level = it->second;
  if (!inserted) return level;
  // An op is known when its dims are assigned and its operands (and a sum's partner) are; the
  // whole cone of a known op is then known too.
  level.knownValues.assign(fn_.values.size(), false);
  std::map<int, double> counts;
  for (uint32_t i = 0; i < fn_.ops.size(); ++i) {
    const ir::Op& op = fn_.ops[i];
    bool known =
        std::all_of(involved_[i].begin(), involved_[i].end(), [&](int d) { return assigned[d]; }) &&
        std::all_of(op.operands.begin(), op.operands.end(),
                    [&](ir::ValueId v) { return level.knownValues[v]; }) &&
        (partner_[i] < 0 || level.knownValues[partner_[i]]); // a later sum's dims: involved_
    if (known) {
      level.knownOps.push_back(i);
      level.knownValues[op.result] = true;
    } else if (boundTermOf_[i] >= 0) {
      ++counts[boundTermOf_[i]];
    }
  }
  level.unknownTerms.assign(counts.begin(), counts.end());
  // A known source (a param, an input, a literal: free, no operands) that no known op reads
  // and no output is costs nothing and informs nothing: most params of a deep model's bound.
  std::vector<bool> read(fn_.values.size(), false);
  for (uint32_t i : level.knownOps)
    for (ir::ValueId operand : fn_.ops[i].operands)
      read[operand] = true;
  for (uint32_t i : level.knownOps)
    if (partner_[i] >= 0) read[partner_[i]] = true; // its state is part of the op's plan
  for (const ir::OutputInfo& output : fn_.outputs)
    read[output.value] = true;
  std::erase_if(level.knownOps, [&](uint32_t i) {
    const ir::Op& op = fn_.ops[i];
    return op.operands.empty() && boundTermOf_[i] < 0 && !read[op.result];
  });
  std::map<int, double> knownCounts;
  for (uint32_t i : level.knownOps) {
    int term = rowSplitBound_ && isRowWiseKind(fn_.ops[i].kind) ? -1 : boundTermOf_[i];
    level.countedTerm.push_back(term);
    if (term >= 0) ++knownCounts[term];
  }
  level.knownTerms.assign(knownCounts.begin(), knownCounts.end());
  // The known ops of each copy of a repeated segment: a run of knownOps (the copy's ops are
  // consecutive). A program's bound sums its row-wise compute per op: none there.
  if (!replaySegments_ || rowSplitBound_) return level;
  if (!segmentsFound_) {
    findSegments();
    segmentsFound_ = true;
  }
  size_t n = 0;
  for (uint32_t c = 0; c < segments_.size(); ++c) {
    const SegmentCopy& copy = segments_[c];
    while (n < level.knownOps.size() && level.knownOps[n] < copy.begin)
      ++n;
    size_t begin = n;
    std::vector<uint32_t> ops;
    for (; n < level.knownOps.size() && level.knownOps[n] < copy.end; ++n)
      ops.push_back(level.knownOps[n] - copy.begin);
    if (ops.size() < kMinBoundCopyOps) continue;
    level.spans.push_back({static_cast<uint32_t>(begin), static_cast<uint32_t>(n), c,
                           boundCopyKind(copy, std::move(ops))});
  }
  return level;
}

int PlanEvaluator::Impl::boundCopyKind(const SegmentCopy& copy, std::vector<uint32_t> ops) {
  auto [it, inserted] = boundCopyKindOf_.try_emplace({copy.kind, ops}, 0);
  if (!inserted) return it->second;
  it->second = static_cast<int>(boundCopyKinds_.size());
  BoundCopyKind kind;
  kind.kind = copy.kind;
  // Alike copies name their externals alike (findSegments): the first copy's indices serve all.
  std::set<uint32_t> reads;
  auto read = [&](int64_t value) {
    if (value < 0 || fn_.values[size_t(value)].definingOp >= copy.begin) return;
    auto external = std::find(copy.externals.begin(), copy.externals.end(), value);
    reads.insert(static_cast<uint32_t>(external - copy.externals.begin()));
  };
  const std::vector<uint32_t>& exported = segmentKinds_[size_t(copy.kind)].exports;
  for (size_t j = 0; j < ops.size(); ++j) {
    uint32_t i = copy.begin + ops[j];
    for (ir::ValueId operand : opKeys_.operands(i))
      read(operand);
    read(partner_[i]);
    if (std::binary_search(exported.begin(), exported.end(), ops[j]))
      kind.exports.push_back(static_cast<uint32_t>(j));
  }
  kind.reads.assign(reads.begin(), reads.end());
  kind.ops = std::move(ops);
  boundCopyKinds_.push_back(std::move(kind));
  return it->second;
}

bool PlanEvaluator::Impl::offChains(const SegmentCopy& copy, const BoundCopyKind& kind) const {
  size_t groups = chains_.groupCount();
  for (uint32_t read : kind.reads) {
    const AllReduceChains::Depths& depths = chains_.depthsOf(copy.externals[read]);
    if (std::any_of(depths.begin(), depths.begin() + static_cast<long>(groups),
                    [](uint16_t depth) { return depth != 0; }))
      return false;
  }
  return true;
}

void PlanEvaluator::Impl::finishBoundCopy(const BoundLevel::Span& span, std::vector<int> key,
                                          BoundCopyWalk walk,
                                          const std::vector<std::pair<ir::ValueId, int>>& done,
                                          bool readsOffChains) {
  const SegmentCopy& copy = segments_[span.copy];
  BoundCopyKind& kind = boundCopyKinds_[size_t(span.kind)];
  // Its exports' chains are empty only if nothing it read was on one.
  if (!readsOffChains || !offChains(copy, kind) || chains_.hasUncountedGroups()) return;
  for (size_t x = 0; x < kind.exports.size(); ++x)
    walk.exportStates.push_back(
        boundStateOf_[opKeys_.result(copy.begin + kind.ops[kind.exports[x]])]);
  for (const auto& [value, state] : done)
    for (size_t x = 0; x < kind.exports.size(); ++x)
      if (opKeys_.result(copy.begin + kind.ops[kind.exports[x]]) == value)
        walk.exportReshards.emplace_back(static_cast<uint32_t>(x), state);
  size_t bytes = sizeof(BoundCopyWalk) + sizeof(int) * key.size() +
                 sizeof(double) * (walk.compute.size() + walk.communication.size()) +
                 sizeof(uint32_t) * walk.communicationEnd.size();
  if (boundCopyBytes_ + bytes > kMaxBoundCopyBytes) {
    for (BoundCopyKind& other : boundCopyKinds_)
      other.walks.clear();
    boundCopyBytes_ = 0;
  }
  std::vector<BoundCopyWalk>& walks = kind.walks[std::move(key)];
  if (walks.size() >= kMaxBoundWalksPerKey) return;
  walks.push_back(std::move(walk));
  boundCopyBytes_ += bytes;
}

void PlanEvaluator::Impl::prepareBound() {
  if (boundPrepared_) return;
  boundPrepared_ = true;
  auto dimsOf = [&](const ir::TensorType& type) {
    std::vector<int> dims;
    for (const ir::Dim& dim : type.dims)
      dims.push_back(dimIndex_.at(dim.name));
    return dims;
  };
  auto bytesOf = [](const ir::TensorType& type) {
    return static_cast<double>(type.numElements() * dtypeBytes(type.dtype));
  };
  boundTermOf_.assign(fn_.ops.size(), -1);
  std::map<BoundTerm, int> termIndex;
  // An op's term follows from its static key (kind, attributes, types, and the loop role where
  // loops are modelled) and its involved dims: the ops of repeated layers look theirs up rather
  // than build it again (at 96 layers this loop built 40,000 terms per evaluator).
  std::unordered_map<std::vector<int>, int, VectorHash> termOfKey;
  std::vector<int> key;
  for (uint32_t i = 0; i < fn_.ops.size(); ++i) {
    const ir::Op& op = fn_.ops[i];
    if (op.kind == OpKind::Input || op.kind == OpKind::Param || op.kind == OpKind::Literal ||
        op.kind == OpKind::TrainStep || op.kind == OpKind::Rename ||
        op.kind == OpKind::StopGradient ||
        (op.kind == OpKind::Dropout && fn_.kind == ir::Function::Kind::Program) ||
        stepInvariant_[i])
      continue; // free in the engine too (a step-invariant op where it is hoisted)
    // A one-hot product's term is not a GEMM's: keyed apart from einsums of the same types.
    size_t oneHotOperand = 0;
    bool oneHot = oneHotProduct(fn_, op, &oneHotOperand) != OneHotProduct::None;
    key.assign(1, staticIds_[i]);
    key.insert(key.end(), involved_[i].begin(), involved_[i].end());
    if (oneHot) key.push_back(-1);
    auto [known, added] = termOfKey.try_emplace(key, -1);
    if (!added) {
      boundTermOf_[i] = known->second;
      continue;
    }
    BoundTerm term;
    term.involved = involved_[i];
    // A reshape may carry a split from one dim to another: bound its tensors by the devices.
    term.anySplit = op.kind == OpKind::Reshape;
    const ir::TensorType& resultType = fn_.typeOf(op.result);
    term.dtype = resultType.dtype;
    // What the engine charges: with loops modelled, a fused nest's inner values move no bytes.
    bool loops = modelsLoops(machine_) && op.kind != OpKind::Einsum;
    const LoopRole& role = loopRoles_[i];
    if (oneHot) {
      // A gather or a scatter-add where the one-hot tensor is not resharded, else a GEMM: at
      // least the result written, whichever (OpRules::oneHotProductSeconds).
      term.tensors.emplace_back(bytesOf(resultType), dimsOf(resultType));
    } else {
      if (!loops || role.stored) term.tensors.emplace_back(bytesOf(resultType), dimsOf(resultType));
      for (size_t k = 0; k < op.operands.size(); ++k)
        if (!loops || !(role.inRegister & (1u << std::min<size_t>(k, 31))))
          term.tensors.emplace_back(bytesOf(fn_.typeOf(op.operands[k])),
                                    dimsOf(fn_.typeOf(op.operands[k])));
      if (op.kind == OpKind::Einsum) {
        term.dtype = fn_.typeOf(op.operands[0]).dtype;
        double points = 1;
        for (int d : involved_[i])
          points *= static_cast<double>(dimSizes_[d]);
        term.einsumFlops = points;
        if (op.operands.size() >= 2) {
          // The fewest FLOPs of any order over the global sizes: no rank's local order (the
          // fewest over its local sizes) does less than that over the split of every dim.
          term.einsumFlops = planContraction(fn_, op, [&](const std::string& name) {
                               return dimSizes_[size_t(dimIndex_.at(name))];
                             }).flops;
        }
      }
      // Other ops: bytes alone bound their roofline (their FLOPs per byte are small).
      if (loops || (op.kind == OpKind::Einsum && op.operands.size() >= 2))
        boundLoopTerms(op, role, term);
    }
    auto [it, inserted] = termIndex.try_emplace(term, static_cast<int>(boundTerms_.size()));
    if (inserted) boundTerms_.push_back(std::move(term));
    boundTermOf_[i] = known->second = it->second;
  }
  // A layout's walk counts the rooflines of the ops it has not walked yet as the bound does
  // its known ops' (run(); not a program's row-wise ops: the row split may save them).
  walkTermOf_.assign(fn_.ops.size(), -1);
  std::map<int, double> counts;
  for (uint32_t i = 0; i < fn_.ops.size(); ++i)
    if (boundTermOf_[i] >= 0 && !(rowSplitBound_ && isRowWiseKind(fn_.ops[i].kind))) {
      walkTermOf_[i] = boundTermOf_[i];
      ++counts[boundTermOf_[i]];
    }
  walkTermCounts_.assign(counts.begin(), counts.end());
  if (modelBackward_) {
    OptimizerModel optimizer = optimizerModel(fn_);
    for (const ir::ParamInfo& param : fn_.params)
      if (param.trainable)
        optimizerTerms_.emplace_back(optimizer.trafficFactor * bytesOf(param.type),
                                     dimsOf(param.type));
  }
}

void PlanEvaluator::Impl::boundLoopTerms(const ir::Op& op, const LoopRole& role,
                                         BoundTerm& term) const {
  auto dimsOf = [&](const ir::TensorType& type) {
    std::vector<int> dims;
    for (const ir::Dim& dim : type.dims)
      dims.push_back(dimIndex_.at(dim.name));
    return dims;
  };
  if (op.kind == OpKind::Einsum && op.operands.size() >= 2) {
    // One GEMM per pairwise step (contract-pairwise), whatever the order.
    term.fixedSeconds = machine_.gemmLatencySeconds * static_cast<double>(op.operands.size() - 1);
    return;
  }
  const ir::TensorType& result = fn_.typeOf(op.result);
  double resultElements = static_cast<double>(result.numElements());
  if (role.loop) { // loopShareSeconds at the result's elements (transcendental, random: dearer)
    double perElement =
        (isTranscendental(op.kind)                                ? 1 + machine_.transcendentalFlops
         : op.kind == OpKind::Dropout && machine_.randomFlops > 0 ? machine_.randomFlops
                                                                  : 0) +
        roundingFlops(result.dtype);
    term.fixedSeconds = role.closesNest() ? machine_.loopLatencySeconds : 0;
    term.elementSeconds = perElement * resultElements / machine_.vectorFlops;
    term.elementDims = dimsOf(result);
    return;
  }
  term.fixedSeconds = machine_.loopLatencySeconds; // every kernel call pays it
  double rate = 0;
  switch (op.kind) {
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::LogSumExp:
    rate = machine_.softmaxElementSeconds;
    break;
  case OpKind::LayerNorm:
    rate = machine_.layerNormElementSeconds;
    break;
  case OpKind::LayerNormGrad: // OpRules::kernelSeconds: two forward rows' work per element
    rate = 2 * machine_.layerNormElementSeconds;
    break;
  case OpKind::ReduceSum:
  case OpKind::ReduceMean:
  case OpKind::ReduceMax:
  case OpKind::ReduceMin:
  case OpKind::Cumsum:
    rate = machine_.reduceElementSeconds;
    break;
  default:
    return;
  }
  const ir::TensorType& operand = fn_.typeOf(op.operands[0]);
  term.elementSeconds = rate * static_cast<double>(operand.numElements());
  term.elementDims = dimsOf(operand);
}

double PlanEvaluator::Impl::memoryLowerBound() const {
  const Impl& impl = *this;
  const ir::Function& fn = impl.fn_;
  // The fewest bytes of a tensor on one device: its dims' splits each divide their sizes
  // (maxSplit_) and use distinct axes, so together at most the mesh's devices.
  double devices = static_cast<double>(std::max<int64_t>(impl.mesh_.numDevices(), 1));
  auto least = [&](const ir::TensorType& type) {
    double split = 1;
    for (const ir::Dim& dim : type.dims)
      split *= static_cast<double>(impl.maxSplit_[size_t(impl.dimIndex_.at(dim.name))]);
    return static_cast<double>(type.numElements() * dtypeBytes(type.dtype)) /
           std::min(split, devices);
  };
  // The terms run() sums (its memory estimate), each at its least.
  OptimizerModel optimizer = optimizerModel(fn);
  double params = 0;
  for (const ir::ParamInfo& param : fn.params) {
    uint32_t op = fn.values[param.value].definingOp;
    if (op >= fn.ops.size() || fn.ops[op].kind != OpKind::Param) continue; // never materialized
    double bytes = least(param.type);
    params += bytes;
    if (impl.modelBackward_ && param.trainable && param.role != ir::ParamRole::OptimizerState)
      params += (1 + optimizer.stateFactor) * bytes; // its gradient and optimizer state
  }
  double live = 0, peak = 0, sum = 0;
  for (uint32_t i = 0; i < fn.ops.size(); ++i) {
    const ir::Op& op = fn.ops[i];
    double bytes = least(fn.typeOf(op.result));
    if (op.kind != OpKind::Param) {
      live += bytes;
      sum += bytes;
    }
    peak = std::max(peak, live);
    for (ir::ValueId dead : impl.freesAt_[i])
      live -= least(fn.typeOf(dead));
  }
  return params + (impl.modelBackward_ ? sum : peak);
}

} // namespace meshc::plan
