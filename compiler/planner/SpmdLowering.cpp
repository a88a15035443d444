// SPMD lowering and its fast evaluator share one engine: a per-op rule (planOp, Mesh-TensorFlow's
// lowering rules) gives each op's required operand layouts, its result layout, the collectives it
// needs internally and its roofline cost; the engine walks the ops in order, reshards operands
// (Reshard.h) where their current layout differs from the required one, and sums the costs. The
// rule is a pure function of the op's shape, its operands' layouts and the layouts of the dims it
// touches, so the evaluator memoizes it: identical layers cost one rule evaluation.
#include "planner/SpmdLowering.h"

#include "planner/AllReduceChains.h"

#include "planner/CostModel.h"
#include "planner/InternCache.h"
#include "planner/LoopNests.h"
#include "planner/MergeCollectives.h"
#include "planner/OpKeyTable.h"
#include "planner/OpRules.h"
#include "planner/PlanReport.h"
#include "planner/RepeatedSegments.h"
#include "planner/Reshard.h"
#include "planner/ReshardMemo.h"
#include "planner/SequenceParallel.h"
#include "planner/TrainPhases.h"

#include "ir/OpTraits.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <compare>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

namespace meshc::plan {

namespace {

using ir::OpKind;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

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

struct VectorHash {
  size_t operator()(const std::vector<int>& key) const {
    size_t hash = 1469598103934665603ull;
    for (int v : key)
      hash = (hash ^ static_cast<size_t>(v)) * 1099511628211ull;
    return hash;
  }
};

/// A layout problem found while lowering: an unknown axis, an axis listed twice for one dim,
/// or a split that does not divide a dim.
struct LayoutProblem {
  enum class Kind { UnknownAxis, AxisTwice, NotDivisible } kind;
  std::string dim;
  AxisList axes; // the dim's axes (NotDivisible) or the offending axis
  uint32_t opIndex = 0;
  bool hasOp = false;
};

/// A small all-reduce of a train step that may move up to right after its operand's producer
/// (`ready`, an IR op index) as long as it stays before its first consumer (`needed`).
struct BucketCandidate {
  ir::ValueId value = 0;
  uint32_t ready = 0, needed = 0;
  Collective collective;
  double seconds = 0;
  size_t spmdIndex = 0; // its op in SpmdFunction::ops (lowering only)
};

struct EvalResult {
  bool ok = true;
  std::vector<LayoutProblem> problems;
  PlanSummary summary;
  MemoryEstimate memory;
  /// The latencies of the all-reduce-sums the reshards issue, and what the longest chains of
  /// dependent ones among them pay at least (AllReduceChains.h): the bucketing and the merge
  /// together save at most the difference.
  double mergeableLatency = 0, chainLatency = 0;
  /// What the gradient bucketing saved (already off the summary's step time).
  double bucketingSaved = 0;
  /// Programs: at most what the row split of SequenceParallel.h can save (the row-wise ops'
  /// compute and half the communication: a reduce-scatter costs at least half its all-reduce).
  double rowSplitPotential = 0;
  /// False when summary.stepSeconds is only a lower bound (the merge was not run).
  bool exact = true;
  /// False when the walk stopped early: the bound is partial and the memory unknown.
  bool complete = true;
};

} // namespace

/// The engine behind lowerToSpmd and PlanEvaluator.
struct PlanEvaluator::Impl {
  Impl(const ir::Module& module, const ir::Function& fn, const Mesh& mesh, const Machine& machine)
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

  /// The walk over the ops. Without `out`, it stops as soon as what it has summed is a lower
  /// bound of the step time above `stopAbove` (the result is then that bound, not complete).
  EvalResult run(const Layout& layout, SpmdFunction* out, double stopAbove = kInfinity);
  /// run() without an SPMD function to keep: the summary after merging all-reduces, which needs
  /// the ops (legal layouts only are lowered). A layout whose step time, less every latency the
  /// merge could save, is still above `cutoff` is not lowered: its result is that lower bound.
  EvalResult evaluate(const Layout& layout, double cutoff, bool complete);
  /// evaluate() of the last layout asked for, again only when the cutoff now needs more.
  /// `complete`: the memory estimate is needed too (a walk stopped early has none).
  const EvalResult& resultFor(const Layout& layout, double cutoff, bool complete = false);
  /// Groups the candidates into buckets (same axes, all ready before any is needed, at most
  /// kBucketBytes); returns the seconds saved. With `out`: moves each all-reduce up to right
  /// after its operand's producer and replaces each bucket's members by one bucketed collective.
  double bucketGradientReductions(std::vector<BucketCandidate> candidates,
                                  const std::vector<size_t>& irOpEnd, SpmdFunction* out);
  double lowerBound(const Layout& partial, const std::vector<std::string>& assignedDims,
                    double cutoff);
  double memoryLowerBound() const;

  const ir::Module& module_;
  const ir::Function& fn_;
  Mesh mesh_;
  Machine machine_; // copies: the evaluator may outlive its arguments
  double oversubscription_ = 1;
  std::vector<std::string> relevantDims_;
  /// A train block without updates (autodiff has not run): backward is modelled, not planned.
  bool modelBackward_ = false;
  std::vector<Phase> phases_; // per IR op
  std::vector<int> readers_;  // per value: how many ops read it
  /// Per value: the ops that read it, each once, in order.
  std::vector<std::vector<uint32_t>> readersOf_;
  /// Per IR op: for a sum, the value whose partial-sum axes it may take (widenToPartner);
  /// -1 otherwise.
  std::vector<int64_t> partner_;
  std::vector<int64_t> soleConsumer_; // per IR op with a partner: that add, sub or div
  /// Per IR op: a partner planned later, itself a sum (its own reduction says its axes).
  std::vector<int64_t> laterSum_;

  /// The walks' scratch (run() and lowerBound() never nest): the all-reduce chains, and the
  /// bound's operand states.
  AllReduceChains chains_;
  std::vector<int> boundStateOf_;
  std::vector<char> boundNamed_; // per dim: named among a bound's assigned dims
  class WalkScratch {
  public:
    explicit WalkScratch(size_t numValues)
        : stateOf(numValues, -1), bytesOf(numValues, 0), gradientAxes(numValues, 0),
          resharded(numValues) {}
    void startWalk() {
      for (ir::ValueId value : reshardedUsed)
        resharded[value].clear();
      reshardedUsed.clear();
    }
    const SpmdValueId* reshardedTo(ir::ValueId value, int state) const {
      for (const auto& [done, id] : resharded[value])
        if (done == state) return &id;
      return nullptr;
    }
    void addReshard(ir::ValueId value, int state, SpmdValueId id) {
      if (resharded[value].empty()) reshardedUsed.push_back(value);
      resharded[value].emplace_back(state, id);
    }

    std::vector<int> stateOf;
    std::vector<int64_t> bytesOf;
    std::vector<uint64_t> gradientAxes;

  private:
    std::vector<std::vector<std::pair<int, SpmdValueId>>> resharded;
    std::vector<ir::ValueId> reshardedUsed;
  } walk_;
  /// Whether run() writes its notes (evaluate() lowers without them: no one reads them).
  bool describe_ = true;
  /// A program: splitRowsOfPartialSums (SequenceParallel.h) may rewrite its plan, so the
  /// values keep what it reads even in an exact costing, and the bounds leave room for what it
  /// may save (WalkSums::rowWiseCompute, EvalResult::rowSplitPotential).
  bool rowSplitBound_ = false;
  // Last evaluation, so that stepSeconds() and memory() of one layout evaluate once.
  std::optional<Layout> lastLayout_;
  EvalResult lastResult_;
  SpmdFunction scratch_; // evaluate()'s lowering, to merge
  /// The operand lists of scratch_'s last ops, which the next exact costing's ops take over.
  std::vector<std::vector<SpmdValueId>> spareOperands_;
  /// An operand list of `size` zeros, reusing a spare one's memory when there is one.
  std::vector<SpmdValueId> operandBuffer(size_t size) {
    if (spareOperands_.empty()) return std::vector<SpmdValueId>(size, 0);
    std::vector<SpmdValueId> buffer = std::move(spareOperands_.back());
    spareOperands_.pop_back();
    buffer.assign(size, 0);
    return buffer;
  }

  // Repeated segments (RepeatedSegments.h): a walk without an SPMD function to write replays a
  // copy of a repeated op sequence (a layer, its backward, its updates) from a memoized walk of
  // a copy alike, when what the copy reads from before it is in the same states: a search of N
  // identical layers then costs one layer's walk per distinct state and O(N) bookkeeping.
  /// A reference from a copy to a value: >= 0, the op (from the copy's begin) that makes it;
  /// < 0, the copy's external -(ref + 1).
  using SegmentRef = int64_t;
  /// max(constant, depth of external e + w, ...): a chain depth after a copy as a function of its
  /// externals' depths (a dependent all-reduce adds one per link; AllReduceChains).
  struct MaxPlus {
    int constant = -1; // -1: none
    std::vector<std::pair<uint32_t, uint16_t>> terms;
  };
  /// One walk of a copy: what it added to the walk's sums, in order (the bits of the sums, which
  /// decide what the search lowers, depend on it), and what it left for the ops after it.
  struct SegmentWalk {
    size_t groups = 0; // the chains' groups when it was walked
    /// The reshards of externals it asked for first, each with whether it was done before.
    std::vector<std::tuple<uint32_t, int, bool>> externalReshards;
    std::vector<double> opSums; // per op: compute seconds, global FLOPs, ideal seconds
    double rowWiseCompute = 0;  // the copy's row-wise ops' compute (WalkSums::rowWiseCompute)
    std::vector<double> communication, mergeable;         // in the order added
    std::vector<uint32_t> communicationEnd, mergeableEnd; // per op
    std::vector<int> exportStates;                        // per export (SegmentKind::exports)
    std::vector<int64_t> exportBytes;
    std::vector<std::pair<uint32_t, int>> exportReshards; // (export, state)
    std::vector<MaxPlus> exportDepths;                    // per export, per group
    std::vector<MaxPlus> longest;                         // per group
    std::vector<std::pair<SegmentRef, uint64_t>> gradientAxes;
    struct Candidate {
      SegmentRef value = 0;
      uint32_t neededAt = 0; // from the copy's begin
      Collective collective;
      double seconds = 0;
    };
    std::vector<Candidate> candidates;
    double liveDelta = 0, activationDelta = 0;
    double peakOffset = -kInfinity; // the largest live + temporary, less live before it
  };
  struct SegmentKind {
    uint32_t numOps = 0;
    std::vector<int> dims;         // the dims whose axes its ops' plans read
    std::vector<uint32_t> exports; // ops (from the copy's begin) whose results are read after it
    /// By the dims' axes, then the externals' states.
    std::unordered_map<std::vector<int>, std::vector<SegmentWalk>, VectorHash> walks;
  };
  struct SegmentCopy {
    uint32_t begin = 0, end = 0;
    int kind = 0;
    std::vector<ir::ValueId> externals; // values from before it that it reads, first read first
  };
  /// What a walk of a copy records while it walks it op by op.
  struct SegmentRecorder {
    const SegmentCopy* copy = nullptr;
    SegmentWalk walk;
    std::vector<std::pair<ir::ValueId, uint32_t>> reads; // (value, all-reduce groups), in order
    std::vector<uint32_t> readsEnd;                      // per op
    std::vector<std::pair<ir::ValueId, int>> reshardsAsked;
    std::vector<std::pair<ir::ValueId, int>> reshardsDone;
    std::vector<std::pair<ir::ValueId, uint64_t>> gradientAxes;
    size_t candidatesBegin = 0;
    double liveBefore = 0, activationBefore = 0, peak = -kInfinity;
  };
  /// The sums a walk keeps, which a replayed copy adds to.
  struct WalkSums {
    double forwardCompute = 0, forwardCommunication = 0, globalFlops = 0, idealSeconds = 0;
    double live = 0, peakLive = 0, activationSum = 0;
    double rowWiseCompute = 0; // programs: the compute of row-wise ops (isRowWiseKind)
  };
  bool replaySegments_ = true;
  bool segmentsFound_ = false;        // findSegments() ran (on the first walk that may replay)
  std::vector<SegmentCopy> segments_; // in op order; only kinds with several copies
  std::vector<SegmentKind> segmentKinds_;
  size_t segmentMemoBytes_ = 0;
  std::vector<int> segmentKey_; // scratch
  void findSegments();
  /// The memoized walk of `copy` that this walk would repeat, or null.
  const SegmentWalk* memoizedWalk(const SegmentCopy& copy, const std::vector<int>& dimAxesIds);
  /// Replays `walk` of `copy`; false (nothing done) when the walk might stop inside it (a sum so
  /// far above `stopAbove` at one of its checks), which only walking its ops can tell.
  bool replaySegment(const SegmentCopy& copy, const SegmentWalk& walk, WalkSums& sums,
                     double& mergeableLatency, double stopAbove,
                     std::vector<BucketCandidate>& candidates);
  /// Files what `recorder` saw in its copy's kind's memo (segmentKey_ is its key).
  void finishRecording(SegmentRecorder& recorder, const WalkSums& sums,
                       const std::vector<BucketCandidate>& candidates);

private:
  void prepareBound();
  void findPartners();
  /// The rule's plan of op i given its operands' states and the dims' axes (memoized).
  const OpPlan& planOf(uint32_t i, const std::vector<int>& dimAxesIds,
                       const std::vector<int>& stateOf, OpRules& rules);
  void prepareSharedPartials();
  /// Whether a value in state `stateId`, a partial sum read by several ops, is resolved once
  /// where it is first read, every reader then reading the resolved value, rather than kept
  /// lazy in its linear readers (see SharedPartial). Depends on the state only, so the lower
  /// bound knows it as soon as it knows the state.
  bool resolveOnce(ir::ValueId value, int stateId);

  // The keys are written into one scratch string (no allocation per value or op: an evaluator
  // interns every value's type and every op's static key, 40,000 of each at 96 layers) and
  // copied only when new.
  int internType(const ir::TensorType& type) {
    std::string& key = internKey_;
    key = ir::dtypeName(type.dtype);
    for (const ir::Dim& dim : type.dims) {
      key += ',';
      key += dim.name;
      key += '=';
      appendNumber(key, dim.size);
    }
    if (auto it = typeIdOf_.find(key); it != typeIdOf_.end()) return it->second;
    int id = static_cast<int>(typeIdOf_.size());
    typeIdOf_.emplace(key, id);
    typeKeys_.push_back(key);
    return id;
  }

  /// Attributes that cannot change an op's cost (a recomputing copy costs as its original).
  /// By length first: every attribute of every op of every engine built asks, twice.
  static bool costless(const std::string& name) {
    static_assert(std::char_traits<char>::length(ir::kRecomputeAttr) > 6, "the default case");
    switch (name.size()) {
    case 3:
      return name == "eps" || name == "min" || name == "max";
    case 4:
      return name == "path" || name == "name" || name == "rate" || name == "mean";
    case 5:
      return name == "index" || name == "value";
    case 6:
      return name == "stream" || name == "stddev";
    default:
      return name == ir::kRecomputeAttr;
    }
  }

  /// A hash of what internStatic's key says of `op`.
  uint64_t staticHash(const ir::Op& op, const LoopRole& role) const {
    uint64_t hash = mixHash(static_cast<uint64_t>(op.kind), role.code());
    for (const auto& [name, value] : op.attrs)
      if (!costless(name))
        hash = mixHash(mixHash(hash, std::hash<std::string>{}(name)), attrValueHash(value));
    for (ir::ValueId operand : op.operands)
      hash = mixHash(hash, static_cast<uint64_t>(typeIds_[operand]));
    return mixHash(hash, static_cast<uint64_t>(typeIds_[op.result]));
  }

  /// Whether internStatic's keys of `a` and `b` are equal because all they say is (stricter:
  /// the loop role counts even where the machine models no loops).
  bool sameStatic(const ir::Op& a, const LoopRole& roleA, const ir::Op& b,
                  const LoopRole& roleB) const {
    if (a.kind != b.kind || roleA.code() != roleB.code() ||
        a.operands.size() != b.operands.size() || typeIds_[a.result] != typeIds_[b.result])
      return false;
    for (size_t k = 0; k < a.operands.size(); ++k)
      if (typeIds_[a.operands[k]] != typeIds_[b.operands[k]]) return false;
    auto x = a.attrs.begin(), y = b.attrs.begin();
    while (true) {
      while (x != a.attrs.end() && costless(x->first))
        ++x;
      while (y != b.attrs.end() && costless(y->first))
        ++y;
      if (x == a.attrs.end() || y == b.attrs.end()) return x == a.attrs.end() && y == b.attrs.end();
      if (x->first != y->first || !sameAttrValue(x->second, y->second)) return false;
      ++x, ++y;
    }
  }

  int internStatic(const ir::Op& op, const LoopRole& role) {
    std::string& key = internKey_;
    key = opSpelling(op.kind);
    if (modelsLoops(machine_)) {
      key += "|loop";
      appendNumber(key, role.code());
    }
    for (const auto& [name, value] : op.attrs) {
      if (costless(name)) continue;
      key += '|';
      key += name;
      key += '=';
      if (const auto* list = std::get_if<std::vector<std::string>>(&value))
        fmt::format_to(std::back_inserter(key), "{}", fmt::join(*list, ","));
      else if (const auto* text = std::get_if<std::string>(&value))
        key += *text;
      else if (const auto* integer = std::get_if<int64_t>(&value))
        appendNumber(key, *integer);
      else if (const auto* number = std::get_if<double>(&value))
        fmt::format_to(std::back_inserter(key), "{}", *number);
    }
    for (ir::ValueId operand : op.operands) {
      key += "|t";
      appendNumber(key, typeIds_[operand]);
    }
    key += "|r";
    appendNumber(key, typeIds_[op.result]);
    if (auto it = staticIdOf_.find(key); it != staticIdOf_.end()) return it->second;
    int id = static_cast<int>(staticIdOf_.size());
    staticIdOf_.emplace(key, id);
    return id;
  }
  /// std::to_string's digits, appended.
  static void appendNumber(std::string& key, int64_t number) {
    char digits[24];
    auto [end, error] = std::to_chars(digits, digits + sizeof digits, number);
    key.append(digits, end);
  }
  std::string internKey_; // internType's and internStatic's scratch

  int internState(const TensorLayout& layout) {
    auto [it, inserted] = stateIdOf_.try_emplace(layout, static_cast<int>(states_.size()));
    if (inserted) {
      states_.push_back(layout);
      partialSumState_.push_back(!layout.partialAxes.empty() && !layout.partialIsMax);
    }
    return it->second;
  }

  int internAxes(const AxisList& axes) {
    auto [it, inserted] = axesIdOf_.try_emplace(axes, static_cast<int>(axesIdOf_.size()));
    return it->second;
  }

  /// A partial sum read by several ops (docs/planner.md, "Partial sums read several times"):
  /// resolving it once costs one collective of its size, after which every reader reads the
  /// resolved value; keeping it lazy costs, per reader, a collective at the end of the chain of
  /// single-reader linear elementwise ops and reductions the reader starts (a sum shrinks it: a
  /// norm's bias gradient), its size scaled from the value's by their global sizes; an einsum
  /// reader counts as resolving it (whether it can keep it lazy depends on the layouts of its
  /// other dims), and a reader that cannot keep it lazy (a nonlinear op, the update) or an
  /// output makes resolving once the choice.
  struct SharedPartial {
    bool resolvedAnyway = false;
    int einsumReaders = 0;
    std::vector<double> chainEnds; // per other reader: its chain's end, in elements of the value
    int signature = -1;            // the value's type and readers' shapes, interned
  };
  std::vector<int> sharedOf_; // per value: its SharedPartial, -1 when read by one op at most
  std::vector<SharedPartial> shared_;
  // Bytes, not std::vector<bool>: planOf and the walks read these per op and operand, and the
  // bit vector's indexing was not inlined (1.6% of the instructions at 8 layers).
  std::vector<char> readsShared_; // per IR op: some operand has a SharedPartial
  /// By signature, then state: 1 eager, 0 lazy, -1 not known yet (asked for every operand of an
  /// op reading a shared partial, on every walk: an array, not a hash table).
  std::vector<std::vector<int8_t>> resolveOnceMemo_;

  /// The largest product of distinct mesh axes that divides `size` (for the lower bound).
  int64_t maxDivisorSplit(int64_t size) const {
    int64_t best = 1;
    size_t n = std::min<size_t>(mesh_.axes.size(), 20);
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
      int64_t product = 1;
      for (size_t i = 0; i < n; ++i)
        if (mask & (1u << i)) product *= mesh_.axes[i].size;
      if (product > 0 && size % product == 0) best = std::max(best, product);
    }
    return best;
  }

  /// The reshard entries (ReshardMemo.h): this evaluator's by its interned ids, the process's
  /// (shared with every evaluator on the same machine and mesh) on a miss.
  const ReshardEntry& reshardEntry(ir::ValueId value, int from, int to) {
    auto key = std::make_tuple(typeIds_[value], from, to);
    auto it = reshardMemo_.find(key);
    if (it == reshardMemo_.end()) {
      const ReshardEntry& entry = sharedReshards_.entry(
          typeKeys_[size_t(typeIds_[value])], fn_.typeOf(value), states_[from], states_[to]);
      it = reshardMemo_.emplace(key, &entry).first;
    }
    return *it->second;
  }
  const std::optional<ReshardPath>& reshard(ir::ValueId value, int from, int to) {
    return reshardEntry(value, from, to).path;
  }

  std::vector<int> typeIds_;
  std::unordered_map<std::string, int> typeIdOf_;
  std::vector<std::string> typeKeys_; // per type id: its key in typeIdOf_
  std::unordered_map<std::string, int> staticIdOf_;
  std::vector<int> staticIds_;
  std::vector<LoopRole> loopRoles_; // per op (LoopNests.h)
  std::unordered_map<std::string, int> dimIndex_;
  std::vector<std::string> dimNames_;
  std::vector<int64_t> dimSizes_;
  std::vector<int64_t> maxSplit_;
  std::vector<std::vector<int>> involved_;
  std::vector<int> lastUse_;
  std::vector<std::vector<ir::ValueId>> freesAt_;
  std::vector<char> trainable_; // per value: a trainable param (bytes: as readsShared_)
  // Precomputed terms of the lower bound: an op's tensors (global bytes, dims), FLOPs and dims;
  // the ops of repeated layers share one.
  struct BoundTerm {
    bool anySplit = false;
    ir::DType dtype = ir::DType::F32;
    double einsumFlops = 0;
    std::vector<std::pair<double, std::vector<int>>> tensors;
    std::vector<int> involved;
    // Machines that model loops and kernels: what the op pays whatever the layout (a nest's or
    // a call's fixed cost, a GEMM's), and its time per element of a tensor over `elementDims`
    // (vector-rate FLOPs, a row-wise kernel's rate), both part of the engine's cost.
    double fixedSeconds = 0;
    double elementSeconds = 0; // times the tensor's global elements
    std::vector<int> elementDims;
    auto operator<=>(const BoundTerm&) const = default;
  };
  std::vector<BoundTerm> boundTerms_;
  /// The layout-independent parts of an op's cost on a machine that models loops (BoundTerm).
  void boundLoopTerms(const ir::Op& op, const LoopRole& role, BoundTerm& term) const;
  std::vector<int> boundTermOf_; // per op: its term, -1 when free
  bool boundPrepared_ = false;   // prepareBound() ran (on the first partial layout's bound)
  /// What the bound knows with a set of dims assigned (one set per level of the search): the
  /// ops it costs exactly (their dims assigned, their operands known), in order, and the
  /// others' terms with how many ops have each.
  struct BoundLevel {
    std::vector<uint32_t> knownOps;
    std::vector<bool> knownValues;
    std::vector<std::pair<int, double>> unknownTerms;
    /// Per known op: its term when its compute counts in the bound (not free, and in a program
    /// not row-wise: the row split may save it), else -1; and those terms with their counts.
    std::vector<int> countedTerm;
    std::vector<std::pair<int, double>> knownTerms;
  };
  std::vector<double> boundRoofline_; // lowerBound's scratch, per term
  std::map<std::vector<bool>, BoundLevel> boundLevels_;
  const BoundLevel& boundLevel(const std::vector<bool>& assigned);
  std::vector<std::pair<double, std::vector<int>>> optimizerTerms_;

  std::vector<TensorLayout> states_;
  /// Per state: whether it is a partial sum (not a max), which resolveOnce asks of every operand
  /// of an op that reads a shared partial, on every walk.
  std::vector<char> partialSumState_;
  /// The ids are given in the order first seen, so hashed tables give the same ids an ordered
  /// map did (and every memo keyed by them the same keys), without its comparisons.
  std::unordered_map<TensorLayout, int, TensorLayoutHash> stateIdOf_;
  std::unordered_map<AxisList, int, AxisListHash> axesIdOf_;
  std::unordered_map<std::vector<int>, OpPlan, VectorHash> opMemo_;
  OpKeyTable<OpPlan, OpCost> opKeys_; // per op: what its key reads, and its last key
  /// planOf's key: written in keyScratch_ (sized for the longest key once: no resizing per op),
  /// copied into key_ only to look up or file a plan when it is not the op's last.
  std::vector<int> keyScratch_, key_;
  std::map<std::tuple<int, int, int>, const ReshardEntry*> reshardMemo_; // by (type, from, to)
  ReshardMemo sharedReshards_{machine_, mesh_};
};

namespace {

std::string valueName(const ir::Function& fn, ir::ValueId id) {
  const std::string& name = fn.values[id].name;
  return name.empty() ? fmt::format("%{}", id) : name;
}

/// Bytes of optimizer state per byte of trainable parameter, and the update's memory traffic
/// (reads + writes, in parameter sizes).
struct OptimizerModel {
  double stateFactor = 0;
  double trafficFactor = 3;
  bool factored = false;
};

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

} // namespace

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

namespace {

/// Repeated segments shorter than this are walked op by op: replaying a copy costs a lookup of
/// its key (its dims' axes and its externals' states).
constexpr size_t kMinSegmentOps = 16;
/// The memoized walks' size past which they are dropped (a search meets thousands of layouts).
constexpr size_t kMaxSegmentMemoBytes = size_t{256} << 20;
/// Walks kept per key (they differ in which of the externals' reshards were done before).
constexpr size_t kMaxWalksPerKey = 8;

} // namespace

void PlanEvaluator::Impl::findSegments() {
  // Ops alike: the same static key (kind, attributes that matter, types) in the same phase.
  size_t numOps = fn_.ops.size();
  std::map<std::pair<int, int>, int> signatureIds;
  std::vector<int> signature(numOps);
  for (size_t i = 0; i < numOps; ++i)
    signature[i] = signatureIds
                       .try_emplace({staticIds_[i], static_cast<int>(phases_[i])},
                                    static_cast<int>(signatureIds.size()))
                       .first->second;
  std::vector<OpSegment> found = findRepeatedSegments(signature, kMinSegmentOps);
  if (found.empty()) return;
  // The last op that reads each value's state: as an operand, or as a sum's partner (planOf).
  std::vector<int64_t> lastRead(lastUse_.begin(), lastUse_.end());
  for (size_t i = 0; i < numOps; ++i)
    if (partner_[i] >= 0)
      lastRead[partner_[i]] = std::max(lastRead[partner_[i]], static_cast<int64_t>(i));
  auto exported = [&](uint32_t i, uint32_t end) {
    return lastRead[opKeys_.result(i)] >= end || fn_.ops[i].kind == OpKind::Param;
  };
  // Copies are of one kind when everything a walk reads of their ops is the same, their values
  // named relative to the copy: the ops' static keys, which operands they read (of the copy, or
  // which of its externals), how those are shared, the dims their plans read, what dies where,
  // and which results are read after the copy.
  std::vector<int> externalIndex(fn_.values.size(), -1);
  std::map<std::vector<int64_t>, int> kindOf;
  std::vector<SegmentCopy> copies;
  std::vector<int> copiesOfKind;
  std::vector<int64_t> code;
  for (const OpSegment& segment : found) {
    SegmentCopy copy{segment.begin, segment.end, -1, {}};
    auto ref = [&](ir::ValueId value) -> SegmentRef {
      uint32_t def = fn_.values[value].definingOp;
      if (def >= copy.begin) return def - copy.begin;
      int& index = externalIndex[value];
      if (index < 0) {
        index = static_cast<int>(copy.externals.size());
        copy.externals.push_back(value);
      }
      return -(SegmentRef{index} + 1);
    };
    code.clear();
    for (uint32_t i = copy.begin; i < copy.end; ++i) {
      code.push_back(signature[i]);
      code.push_back(readsShared_[i]);
      std::span<const ir::ValueId> operands = opKeys_.operands(i);
      code.push_back(static_cast<int64_t>(operands.size()));
      for (ir::ValueId operand : operands) {
        code.push_back(ref(operand));
        code.push_back(sharedOf_[operand] >= 0 ? shared_[sharedOf_[operand]].signature : -1);
        code.push_back(trainable_[operand]);
      }
      code.push_back(partner_[i] >= 0 ? ref(static_cast<ir::ValueId>(partner_[i]))
                                      : std::numeric_limits<int64_t>::min());
      std::span<const ir::ValueId> dims = opKeys_.dims(i);
      code.push_back(static_cast<int64_t>(dims.size()));
      code.insert(code.end(), dims.begin(), dims.end());
      code.push_back(static_cast<int64_t>(freesAt_[i].size()));
      for (ir::ValueId dead : freesAt_[i])
        code.push_back(ref(dead));
      code.push_back(exported(i, copy.end));
    }
    for (ir::ValueId external : copy.externals)
      externalIndex[external] = -1;
    auto [it, added] = kindOf.try_emplace(code, static_cast<int>(copiesOfKind.size()));
    if (added) copiesOfKind.push_back(0);
    ++copiesOfKind[it->second];
    copy.kind = it->second;
    copies.push_back(std::move(copy));
  }
  // A kind with one copy is walked op by op.
  std::vector<int> kindIndex(copiesOfKind.size(), -1);
  for (SegmentCopy& copy : copies) {
    if (copiesOfKind[copy.kind] < 2) continue;
    int& index = kindIndex[copy.kind];
    if (index < 0) {
      index = static_cast<int>(segmentKinds_.size());
      SegmentKind kind;
      kind.numOps = copy.end - copy.begin;
      std::set<int> dims;
      for (uint32_t i = copy.begin; i < copy.end; ++i) {
        for (ir::ValueId dim : opKeys_.dims(i))
          dims.insert(static_cast<int>(dim));
        if (exported(i, copy.end)) kind.exports.push_back(i - copy.begin);
      }
      kind.dims.assign(dims.begin(), dims.end());
      segmentKinds_.push_back(std::move(kind));
    }
    copy.kind = index;
    segments_.push_back(std::move(copy));
  }
}

const PlanEvaluator::Impl::SegmentWalk*
PlanEvaluator::Impl::memoizedWalk(const SegmentCopy& copy, const std::vector<int>& dimAxesIds) {
  SegmentKind& kind = segmentKinds_[copy.kind];
  std::vector<int>& key = segmentKey_;
  key.clear();
  for (int dim : kind.dims)
    key.push_back(dimAxesIds[dim]);
  for (ir::ValueId external : copy.externals)
    key.push_back(walk_.stateOf[external]);
  auto found = kind.walks.find(key);
  if (found == kind.walks.end()) return nullptr;
  for (const SegmentWalk& walk : found->second) {
    if (walk.groups != chains_.groupCount()) continue;
    bool same = std::all_of(
        walk.externalReshards.begin(), walk.externalReshards.end(), [&](const auto& asked) {
          const auto& [external, state, done] = asked;
          return (walk_.reshardedTo(copy.externals[external], state) != nullptr) == done;
        });
    if (same) return &walk;
  }
  return nullptr;
}

bool PlanEvaluator::Impl::replaySegment(const SegmentCopy& copy, const SegmentWalk& walk,
                                        WalkSums& sums, double& mergeableLatency, double stopAbove,
                                        std::vector<BucketCandidate>& candidates) {
  const SegmentKind& kind = segmentKinds_[copy.kind];
  AllReduceChains& chains = chains_;
  size_t groups = walk.groups;
  auto depthOf = [&](const MaxPlus& depth, size_t group) {
    int result = depth.constant;
    for (const auto& [external, weight] : depth.terms)
      result = std::max(result, chains.depthsOf(copy.externals[external])[group] + int{weight});
    return result;
  };
  AllReduceChains::Depths longest = chains.longest();
  for (size_t g = 0; g < groups; ++g)
    longest[g] = static_cast<uint16_t>(std::max<int>(longest[g], depthOf(walk.longest[g], g)));
  // The sums, added in the order the walk added them. At each of the walk's checks (run()), the
  // sum so far with the chains' latency at the copy's end, which is at least the latency there:
  // when none is above `stopAbove`, the walk does not stop inside the copy.
  double compute = sums.forwardCompute, communication = sums.forwardCommunication;
  double flops = sums.globalFlops, ideal = sums.idealSeconds, mergeable = mergeableLatency;
  bool checks = stopAbove < kInfinity;
  double chainsAtEnd = checks ? chains.latencySeconds(longest) : 0;
  uint32_t c = 0, m = 0;
  for (uint32_t t = 0; t < kind.numOps; ++t) {
    for (; c < walk.communicationEnd[t]; ++c)
      communication += walk.communication[c];
    for (; m < walk.mergeableEnd[t]; ++m)
      mergeable += walk.mergeable[m];
    compute += walk.opSums[3 * t];
    flops += walk.opSums[3 * t + 1];
    ideal += walk.opSums[3 * t + 2];
    if (checks && (copy.begin + t) % 16 == 0) {
      double soFar = (modelBackward_ ? 3 : 1) * compute + (modelBackward_ ? 2 : 1) * communication -
                     mergeable + chainsAtEnd;
      // A program's row split may save the row-wise compute (all of this copy's, at most) and
      // half the communication.
      if (rowSplitBound_) soFar -= sums.rowWiseCompute + walk.rowWiseCompute + 0.5 * communication;
      if (soFar > stopAbove) return false;
    }
  }
  sums.rowWiseCompute += walk.rowWiseCompute;
  sums.forwardCompute = compute;
  sums.forwardCommunication = communication;
  sums.globalFlops = flops;
  sums.idealSeconds = ideal;
  mergeableLatency = mergeable;
  for (size_t x = 0; x < kind.exports.size(); ++x) {
    ir::ValueId value = opKeys_.result(copy.begin + kind.exports[x]);
    walk_.stateOf[value] = walk.exportStates[x];
    walk_.bytesOf[value] = walk.exportBytes[x];
    AllReduceChains::Depths depths{};
    for (size_t g = 0; g < groups; ++g)
      depths[g] = static_cast<uint16_t>(depthOf(walk.exportDepths[x * groups + g], g));
    chains.setDepths(value, depths);
  }
  chains.setLongest(longest);
  for (const auto& [external, state, done] : walk.externalReshards)
    if (!done) walk_.addReshard(copy.externals[external], state, 0);
  for (const auto& [x, state] : walk.exportReshards)
    walk_.addReshard(opKeys_.result(copy.begin + kind.exports[x]), state, 0);
  auto valueOf = [&](SegmentRef ref) {
    return ref >= 0 ? opKeys_.result(copy.begin + static_cast<uint32_t>(ref))
                    : copy.externals[static_cast<size_t>(-ref - 1)];
  };
  for (const auto& [ref, axes] : walk.gradientAxes)
    walk_.gradientAxes[valueOf(ref)] |= axes;
  for (const SegmentWalk::Candidate& candidate : walk.candidates) {
    ir::ValueId value = valueOf(candidate.value);
    candidates.push_back({value, fn_.values[value].definingOp, copy.begin + candidate.neededAt,
                          candidate.collective, candidate.seconds, 0});
  }
  // Bytes are whole numbers, exact in doubles: live and the peak add up in any order.
  sums.peakLive = std::max(sums.peakLive, sums.live + walk.peakOffset);
  sums.live += walk.liveDelta;
  sums.activationSum += walk.activationDelta;
  return true;
}

void PlanEvaluator::Impl::finishRecording(SegmentRecorder& recorder, const WalkSums& sums,
                                          const std::vector<BucketCandidate>& candidates) {
  const SegmentCopy& copy = *recorder.copy;
  SegmentKind& kind = segmentKinds_[copy.kind];
  SegmentWalk& walk = recorder.walk;
  if (chains_.hasUncountedGroups()) return;
  size_t groups = walk.groups = chains_.groupCount();
  size_t numExternals = copy.externals.size();
  auto refOf = [&](ir::ValueId value) -> SegmentRef {
    uint32_t def = fn_.values[value].definingOp;
    if (def >= copy.begin) return def - copy.begin;
    auto external = std::find(copy.externals.begin(), copy.externals.end(), value);
    return -(external - copy.externals.begin()) - 1;
  };
  // The chains (AllReduceChains): each op's result depth per group as a function of the
  // externals' depths, from the reads of the walk (an op's reading starts at 0 per group).
  size_t width = numExternals + 1; // the externals' weights, then the constant
  std::vector<int> depth(size_t{kind.numOps} * groups * width, -1);
  std::vector<int> longest(groups * width, -1), reading(groups * width);
  size_t r = 0;
  for (uint32_t t = 0; t < kind.numOps; ++t) {
    std::fill(reading.begin(), reading.end(), -1);
    for (size_t g = 0; g < groups; ++g)
      reading[g * width + numExternals] = 0;
    for (; r < recorder.readsEnd[t]; ++r) {
      auto [value, mask] = recorder.reads[r];
      SegmentRef ref = refOf(value);
      for (size_t g = 0; g < groups; ++g) {
        int bit = static_cast<int>((mask >> g) & 1);
        int* into = &reading[g * width];
        int* most = &longest[g * width];
        if (ref < 0) {
          size_t e = static_cast<size_t>(-ref - 1);
          into[e] = std::max(into[e], bit);
          most[e] = std::max(most[e], bit);
          continue;
        }
        const int* from = &depth[(static_cast<size_t>(ref) * groups + g) * width];
        for (size_t e = 0; e < width; ++e)
          if (from[e] >= 0) {
            into[e] = std::max(into[e], from[e] + bit);
            most[e] = std::max(most[e], from[e] + bit);
          }
      }
    }
    std::copy(reading.begin(), reading.end(), depth.begin() + size_t{t} * groups * width);
  }
  auto maxPlusOf = [&](const int* row) {
    MaxPlus result;
    result.constant = row[numExternals];
    for (size_t e = 0; e < numExternals; ++e)
      if (row[e] >= 0)
        result.terms.emplace_back(static_cast<uint32_t>(e), static_cast<uint16_t>(row[e]));
    return result;
  };
  std::vector<int> exportOf(kind.numOps, -1);
  for (size_t x = 0; x < kind.exports.size(); ++x) {
    uint32_t t = kind.exports[x];
    exportOf[t] = static_cast<int>(x);
    ir::ValueId value = opKeys_.result(copy.begin + t);
    walk.exportStates.push_back(walk_.stateOf[value]);
    walk.exportBytes.push_back(walk_.bytesOf[value]);
    for (size_t g = 0; g < groups; ++g)
      walk.exportDepths.push_back(maxPlusOf(&depth[(size_t{t} * groups + g) * width]));
  }
  for (size_t g = 0; g < groups; ++g)
    walk.longest.push_back(maxPlusOf(&longest[g * width]));
  for (const auto& [value, state] : recorder.reshardsDone) {
    SegmentRef ref = refOf(value);
    if (ref >= 0 && exportOf[ref] >= 0)
      walk.exportReshards.emplace_back(static_cast<uint32_t>(exportOf[ref]), state);
  }
  for (const auto& [value, axes] : recorder.gradientAxes)
    walk.gradientAxes.emplace_back(refOf(value), axes);
  for (size_t c = recorder.candidatesBegin; c < candidates.size(); ++c)
    walk.candidates.push_back({refOf(candidates[c].value), candidates[c].needed - copy.begin,
                               candidates[c].collective, candidates[c].seconds});
  walk.liveDelta = sums.live - recorder.liveBefore;
  walk.activationDelta = sums.activationSum - recorder.activationBefore;
  walk.peakOffset = recorder.peak - recorder.liveBefore;

  size_t bytes =
      sizeof(SegmentWalk) + segmentKey_.size() * sizeof(int) +
      sizeof(double) * (walk.opSums.size() + walk.communication.size() + walk.mergeable.size()) +
      sizeof(uint32_t) * 2 * kind.numOps +
      (sizeof(MaxPlus) + 2 * numExternals) * (walk.exportDepths.size() + groups) +
      sizeof(SegmentWalk::Candidate) * walk.candidates.size();
  if (segmentMemoBytes_ + bytes > kMaxSegmentMemoBytes) {
    for (SegmentKind& other : segmentKinds_)
      other.walks.clear();
    segmentMemoBytes_ = 0;
  }
  std::vector<SegmentWalk>& walks = kind.walks[segmentKey_];
  std::erase_if(walks, [&](const SegmentWalk& other) { return other.groups != groups; });
  if (walks.size() >= kMaxWalksPerKey) return;
  walks.push_back(std::move(walk));
  segmentMemoBytes_ += bytes;
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
      SpmdOp op;
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
      out->ops.push_back(std::move(op));
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
    forwardCompute += cost.computeSeconds;
    if (rowSplitBound_ && isRowWiseKind(op.kind)) {
      sums.rowWiseCompute += cost.computeSeconds;
      if (recorder) recorder->walk.rowWiseCompute += cost.computeSeconds;
    }
    forwardCommunication += cost.postSeconds;
    globalFlops += cost.globalFlops;
    idealSeconds += cost.idealSeconds;
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
                         {cost.computeSeconds, cost.globalFlops, cost.idealSeconds});
      walk.communication.push_back(cost.postSeconds);
      walk.communicationEnd.push_back(static_cast<uint32_t>(walk.communication.size()));
      walk.mergeableEnd.push_back(static_cast<uint32_t>(walk.mergeable.size()));
      recorder->readsEnd.push_back(static_cast<uint32_t>(recorder->reads.size()));
      recorder->peak = std::max(recorder->peak, live + temporary);
    }
    // Every term summed so far only grows (a path costs at least the latencies merging may
    // save), so this is a lower bound of the step time; most candidates of a search pass
    // their cutoff within the first layers.
    if (!out && i % 16 == 0) {
      double soFar = (modelBackward_ ? 3 : 1) * forwardCompute +
                     (modelBackward_ ? 2 : 1) * forwardCommunication - result.mergeableLatency +
                     chains.latencySeconds();
      if (rowSplitBound_) soFar -= sums.rowWiseCompute + 0.5 * forwardCommunication;
      if (soFar > stopAbove) {
        result.summary.stepSeconds = soFar;
        result.exact = result.complete = false;
        return false;
      }
    }
    for (ir::ValueId dead : freesAt_[i])
      live -= static_cast<double>(bytesOf[dead]);

    if (!out) return true;
    SpmdOp spmdOp;
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
    spmdOp.seconds = plan.computeSeconds;
    if (describe_) spmdOp.note = plan.note;
    spmdOp.phase = phases_[i];
    spmdOf[op.result] = spmdOp.result;
    out->ops.push_back(std::move(spmdOp));
    // Collectives inside the op work in place on its result (or on its row statistics).
    for (const PostCollective& post : plan.post) {
      SpmdOp collective;
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
      out->ops.push_back(std::move(collective));
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
      if (walk &&
          replaySegment(copy, *walk, sums, result.mergeableLatency, stopAbove, candidates)) {
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
  summary.computeSeconds = passes * forwardCompute + optimizerSeconds;
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
  auto reshardCost = [&](ir::ValueId value, int want) {
    if (stateOf[value] == want) {
      chains.read(value, 0);
      return 0.0;
    }
    const ReshardEntry& entry = reshardEntry(value, stateOf[value], want);
    if (!entry.path) return kInfinity;
    chains.read(value, chains.groupsOf(*entry.path));
    if (walk_.reshardedTo(value, want)) return 0.0;
    walk_.addReshard(value, want, 0);
    double seconds = entry.path->seconds;
    for (double latency : entry.mergeableSeconds)
      seconds -= latency;
    return seconds;
  };
  double passes = modelBackward_ ? 3 : 1, communicationPasses = modelBackward_ ? 2 : 1;
  if (!boundPrepared_) {
    prepareBound();
    boundPrepared_ = true;
  }
  const BoundLevel& level = boundLevel(assigned);
  // A term's roofline: what an op of it costs at least, with the dims' splits known or at most.
  auto termSeconds = [&](const BoundTerm& term) {
    double bytes = 0;
    for (const auto& [globalBytes, dims] : term.tensors)
      bytes += globalBytes / (term.anySplit ? devices : splitOf(dims));
    double flops = term.einsumFlops / splitOf(term.involved);
    double seconds = computeSeconds(machine_, flops, bytes, term.dtype);
    if (term.elementSeconds > 0)
      seconds = std::max(seconds, term.elementSeconds / splitOf(term.elementDims));
    return seconds + term.fixedSeconds;
  };
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
  for (size_t n = 0; n < level.knownOps.size(); ++n) {
    // Every term only grows: past the cutoff, the sum so far is bound enough.
    if (n % 16 == 0) {
      double soFar = passes * compute + communicationPasses * communication +
                     chains.latencySeconds() - rowSplitSaving();
      if (soFar + rooflinesLeft - slack > cutoff) return soFar + rooflinesLeft - slack;
    }
    uint32_t i = level.knownOps[n];
    if (int term = level.countedTerm[n]; term >= 0) rooflinesLeft -= rooflineOf[term];
    planOf(i, dimAxesIds, stateOf, rules);
    const OpCost& cost = opKeys_.cost(i);  // the plan's copy, in op order
    if (!cost.divisible) return kInfinity; // every completion has this split
    std::span<const ir::ValueId> operands = opKeys_.operands(i);
    std::span<const int> required = opKeys_.required(i);
    for (size_t k = 0; k < operands.size(); ++k)
      communication += reshardCost(operands[k], required[k]);
    compute += cost.computeSeconds;
    if (rowSplitBound_ && isRowWiseKind(fn_.ops[i].kind)) rowWise += cost.computeSeconds;
    communication += cost.postSeconds;
    ir::ValueId result = opKeys_.result(i);
    stateOf[result] = cost.resultId;
    chains.write(result);
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
  return level;
}

void PlanEvaluator::Impl::prepareBound() {
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
        (op.kind == OpKind::Dropout && fn_.kind == ir::Function::Kind::Program))
      continue; // free in the engine too
    key.assign(1, staticIds_[i]);
    key.insert(key.end(), involved_[i].begin(), involved_[i].end());
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
    auto [it, inserted] = termIndex.try_emplace(term, static_cast<int>(boundTerms_.size()));
    if (inserted) boundTerms_.push_back(std::move(term));
    boundTermOf_[i] = known->second = it->second;
  }
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

void PlanEvaluator::setReplaySegments(bool replay) {
  impl_->replaySegments_ = replay;
}

const std::vector<std::string>& PlanEvaluator::relevantDims() const {
  return impl_->relevantDims_;
}

double PlanEvaluator::lowerBound(const Layout& partial,
                                 const std::vector<std::string>& assignedDims, double cutoff) {
  return impl_->lowerBound(partial, assignedDims, cutoff);
}

} // namespace meshc::plan
