// Repeated layers walked once and replayed (docs/planner.md): a function's ops are grouped into
// copies of alike segments; a copy whose dims' axes and externals' states were seen before
// replays its recorded walk instead of costing its ops again.
#include "planner/PlanEvaluatorImpl.h"

namespace meshc::plan {

namespace {

using ir::OpKind;

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
      code.push_back(stepInvariant_[i]);
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
                                        double& rooflinesLeft, double slack,
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
  double left = rooflinesLeft; // the rooflines of the ops not walked yet, as run() counts them
  for (uint32_t t = 0; t < kind.numOps; ++t) {
    for (; c < walk.communicationEnd[t]; ++c)
      communication += walk.communication[c];
    for (; m < walk.mergeableEnd[t]; ++m)
      mergeable += walk.mergeable[m];
    compute += walk.opSums[3 * t];
    flops += walk.opSums[3 * t + 1];
    ideal += walk.opSums[3 * t + 2];
    if (!checks) continue;
    if (int term = walkTermOf_[copy.begin + t]; term >= 0) left -= walkRoofline_[size_t(term)];
    if ((copy.begin + t) % 16 == 0) {
      double soFar = (modelBackward_ ? 3 : 1) * compute + (modelBackward_ ? 2 : 1) * communication -
                     mergeable + chainsAtEnd;
      // A program's row split may save the row-wise compute (all of this copy's, at most) and
      // half the communication.
      if (rowSplitBound_) soFar -= sums.rowWiseCompute + walk.rowWiseCompute + 0.5 * communication;
      if (soFar + left - slack > stopAbove) return false;
    }
  }
  rooflinesLeft = left;
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

} // namespace meshc::plan
