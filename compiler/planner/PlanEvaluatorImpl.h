// The layout evaluator's state (PlanEvaluator::Impl), shared by the files of its engine:
// SpmdLowering.cpp (the walk over the ops, its lowering and the partial sums read several times),
// LowerBound.cpp (the layout search's lower bounds) and Segments.cpp (repeated layers walked once
// and replayed). Internal to the planner: PlanEvaluator (SpmdLowering.h) is the interface.
#pragma once

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

inline constexpr double kInfinity = std::numeric_limits<double>::infinity();

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

/// Bytes of optimizer state per byte of trainable parameter, and the update's memory traffic
/// (reads + writes, in parameter sizes).
struct OptimizerModel {
  double stateFactor = 0;
  double trafficFactor = 3;
  bool factored = false;
};
OptimizerModel optimizerModel(const ir::Function& fn);

/// The engine behind lowerToSpmd and PlanEvaluator.
struct PlanEvaluator::Impl {
  Impl(const ir::Module& module, const ir::Function& fn, const Mesh& mesh, const Machine& machine);

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
  size_t boundCopiesReplayed_ = 0;    // lowerBound's replays (BoundCopyKind), counted for the tests
  bool segmentsFound_ = false;        // findSegments() ran (on the first walk that may replay)
  std::vector<SegmentCopy> segments_; // in op order; only kinds with several copies
  std::vector<SegmentKind> segmentKinds_;
  size_t segmentMemoBytes_ = 0;
  std::vector<int> segmentKey_; // scratch
  void findSegments();
  /// The memoized walk of `copy` that this walk would repeat, or null.
  const SegmentWalk* memoizedWalk(const SegmentCopy& copy, const std::vector<int>& dimAxesIds);
  /// Replays `walk` of `copy`; false (nothing done) when the walk might stop inside it (a sum so
  /// far, with `rooflinesLeft` less `slack`, above `stopAbove` at one of its checks), which only
  /// walking its ops can tell. `rooflinesLeft` loses the copy's ops' rooflines (run()).
  bool replaySegment(const SegmentCopy& copy, const SegmentWalk& walk, WalkSums& sums,
                     double& mergeableLatency, double stopAbove, double& rooflinesLeft,
                     double slack, std::vector<BucketCandidate>& candidates);
  /// Files what `recorder` saw in its copy's kind's memo (segmentKey_ is its key).
  void finishRecording(SegmentRecorder& recorder, const WalkSums& sums,
                       const std::vector<BucketCandidate>& candidates);

private:
  /// The bound's per-op terms (boundTermOf_ ...), made on the first call; later calls return.
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

  /// What makes an einsum a gather or a scatter-add (Contraction.h's oneHotProduct), not a GEMM:
  /// 0 for every other op, else the kind and which operand is the one-hot tensor. Part of the
  /// static key: such an einsum costs apart from einsums of the same types.
  int oneHotCode(const ir::Op& op) const {
    size_t x = 0;
    OneHotProduct kind = oneHotProduct(fn_, op, &x);
    return kind == OneHotProduct::None ? 0 : 2 * static_cast<int>(kind) + static_cast<int>(x);
  }

  /// A hash of what internStatic's key says of `op`.
  uint64_t staticHash(const ir::Op& op, const LoopRole& role) const {
    uint64_t hash = mixHash(mixHash(static_cast<uint64_t>(op.kind), role.code()),
                            static_cast<uint64_t>(oneHotCode(op)));
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
        a.operands.size() != b.operands.size() || typeIds_[a.result] != typeIds_[b.result] ||
        oneHotCode(a) != oneHotCode(b))
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
    if (int code = oneHotCode(op)) {
      key += "|onehot";
      appendNumber(key, code);
    }
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
  std::vector<char> trainable_;     // per value: a trainable param (bytes: as readsShared_)
  std::vector<char> stepInvariant_; // per op: ir::stepInvariantOps (hoisted when not resharded)
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
  /// A term's roofline with the dims split by `split` (per dim: its split, or at most).
  double boundTermSeconds(const BoundTerm& term, const std::vector<double>& split) const;
  // A walk stopped at a cutoff (run()) counts the rooflines of the ops it has not walked yet.
  std::vector<int> walkTermOf_; // per op: its term when its compute counts there, else -1
  std::vector<std::pair<int, double>> walkTermCounts_; // those terms, with their counts
  std::vector<double> walkRoofline_;                   // per term: at the walk's layout
  /// Fills walkRoofline_ for `layout`; returns the rooflines of all ops (prepares the bound's
  /// terms the first time).
  double walkRooflines(const Layout& layout);
  bool boundPrepared_ = false; // prepareBound() ran (on the first partial layout's bound)
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
    /// The known ops of copies of repeated segments, as runs of knownOps: [begin, end), the
    /// copy (segments_) and its BoundCopyKind. In op order; none in a program (its row split's
    /// saving is summed per op).
    struct Span {
      uint32_t begin = 0, end = 0, copy = 0;
      int kind = 0;
    };
    std::vector<Span> spans;
  };
  std::vector<double> boundRoofline_; // lowerBound's scratch, per term
  std::map<std::vector<bool>, BoundLevel> boundLevels_;
  const BoundLevel& boundLevel(const std::vector<bool>& assigned);
  // The bound's repeated copies (docs/planner.md, session 23): at a level, the known ops of the
  // copies of a repeated segment (a layer's params and their updates, at 96 layers nearly all
  // the ops a bound walks) are walked once per state of what they read and replayed in the
  // copies alike, adding the same terms in the same order as the walk does (the same bits).
  // Only copies whose all-reduce chains stay empty are replayed (none of their reads is
  // resharded by a mergeable all-reduce, none of their externals is on a chain): what they leave
  // for the chains is then nothing.
  /// One walk of a BoundCopyKind's ops.
  struct BoundCopyWalk {
    /// The reshards of externals it asked for first, each with whether it was done before.
    std::vector<std::tuple<uint32_t, int, bool>> externalReshards;
    std::vector<double> compute;                          // per op: its compute seconds
    std::vector<double> communication;                    // the nonzero terms it added, in order
    std::vector<uint32_t> communicationEnd;               // per op
    std::vector<int> exportStates;                        // per export (BoundCopyKind::exports)
    std::vector<std::pair<uint32_t, int>> exportReshards; // (export, state)
  };
  /// The known ops of a segment kind's copies at some level: alike copies, alike walks.
  struct BoundCopyKind {
    int kind = 0;                  // into segmentKinds_
    std::vector<uint32_t> ops;     // from the copy's begin
    std::vector<uint32_t> reads;   // the externals they read (operands and partners)
    std::vector<uint32_t> exports; // indices into ops: results read after the copy
    /// By the segment kind's dims' axes, then the states of `reads`.
    std::unordered_map<std::vector<int>, std::vector<BoundCopyWalk>, VectorHash> walks;
  };
  std::vector<BoundCopyKind> boundCopyKinds_;
  std::map<std::pair<int, std::vector<uint32_t>>, int> boundCopyKindOf_;
  size_t boundCopyBytes_ = 0;
  /// The BoundCopyKind of `copy`'s known ops `ops`, made when new.
  int boundCopyKind(const SegmentCopy& copy, std::vector<uint32_t> ops);
  /// Whether `copy`'s externals that `kind` reads are on no all-reduce chain.
  bool offChains(const SegmentCopy& copy, const BoundCopyKind& kind) const;
  /// Files a walk of `span`'s copy (`done`: the reshards it made) when it stayed off the chains.
  void finishBoundCopy(const BoundLevel::Span& span, std::vector<int> key, BoundCopyWalk walk,
                       const std::vector<std::pair<ir::ValueId, int>>& done, bool readsOffChains);
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

} // namespace meshc::plan
