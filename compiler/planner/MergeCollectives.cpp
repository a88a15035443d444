// Merging all-reduces: a list schedule of the SPMD ops in their order, in which a resolving
// all-reduce-sum does not run where it stands but joins the open group of its axes (and dtype);
// the group runs as one bucketed all-reduce placed where its last member joined, and is closed
// when an op reads one of its results (after trying to grow: a later all-reduce of the same kind
// joins if the ops its operand needs read no result still pending; those ops move up), or when
// the next member would pass kBucketBytes.
#include "planner/MergeCollectives.h"

#include "planner/CostModel.h"
#include "planner/PlanReport.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <span>

namespace meshc::plan {

namespace {

/// An op with the in-place collectives that follow it (the op's own communication, which code
/// generation absorbs into it: they never move apart).
struct Unit {
  size_t first = 0, end = 0;           // its ops: [first, end)
  size_t readsBegin = 0, readsEnd = 0; // the values it reads: Merger::reads_[begin, end)
  int key = -1; // a mergeable all-reduce: its axes and dtype, interned; -1 otherwise
  int64_t bytes = 0;
};

struct Group {
  int key = -1;
  std::vector<size_t> members; // units
  int64_t bytes = 0;
  size_t position = 0; // ops scheduled before it: its members' operands all exist there
};

/// A resolving all-reduce-sum (not one in place, which belongs to its op) or a bucket of them,
/// over values of one dtype.
bool isMergeable(const SpmdFunction& fn, const SpmdOp& op) {
  if (op.kind != SpmdOp::Kind::Collective || op.collective.axes.empty() || op.operands.empty())
    return false;
  bool single = op.collective.kind == CollectiveKind::AllReduceSum && op.operands.size() == 1 &&
                op.operands[0] != op.result;
  bool bucket = op.collective.kind == CollectiveKind::BucketedAllReduceSum &&
                op.results.size() == op.operands.size();
  if (!single && !bucket) return false;
  for (SpmdValueId operand : op.operands)
    if (fn.values[operand].globalType.dtype != fn.values[op.operands[0]].globalType.dtype)
      return false;
  return true;
}

class Merger {
public:
  Merger(SpmdFunction& fn, const Machine& machine) : fn_(fn), machine_(machine) {}

  /// Schedules the merges; with `rewriteOps`, rewrites the function's ops as scheduled, else
  /// leaves them (the saving is the same: the caller wants only the summary).
  double run(bool rewriteOps) {
    buildUnits();
    for (size_t u = 0; u < units_.size(); ++u) {
      if (state_[u] != State::Unplaced) continue;
      for (SpmdValueId value : readsOf(u))
        if (int group = pendingGroupOf(value); group >= 0) flush(static_cast<size_t>(group), u);
      if (units_[u].key < 0) {
        place(u);
        continue;
      }
      int& open = openGroup_[units_[u].key];
      if (open >= 0 && groups_[open].bytes + units_[u].bytes > kBucketBytes) close(open);
      if (open < 0) {
        open = static_cast<int>(groups_.size());
        groups_.push_back({units_[u].key, {}, 0, 0});
      }
      join(static_cast<size_t>(open), u);
    }
    for (int& open : openGroup_)
      if (open >= 0) close(open);
    return rewriteOps ? rewrite() : savings();
  }

private:
  enum class State { Unplaced, Placed, Pending, Done };

  void buildUnits() {
    std::map<std::pair<AxisList, ir::DType>, int> keys;
    units_.reserve(fn_.ops.size());
    for (size_t i = 0; i < fn_.ops.size(); ++i) {
      const SpmdOp& op = fn_.ops[i];
      bool follower = !units_.empty() && op.kind == SpmdOp::Kind::Collective &&
                      op.operands.size() == 1 && op.operands[0] == op.result &&
                      fn_.ops[units_.back().first].result == op.result;
      if (follower) {
        units_.back().end = i + 1;
        continue;
      }
      Unit unit;
      unit.first = i;
      unit.end = i + 1;
      if (isMergeable(fn_, op)) {
        AxisList axes = op.collective.axes;
        std::sort(axes.begin(), axes.end());
        auto [it, inserted] = keys.try_emplace({axes, fn_.values[op.operands[0]].globalType.dtype},
                                               static_cast<int>(keys.size()));
        unit.key = it->second;
        unit.bytes = op.collective.bytes;
      }
      units_.push_back(std::move(unit));
    }
    producer_.assign(fn_.values.size(), -1);
    std::vector<SpmdValueId> writes; // per unit, reused (an exact costing has 40,000 units)
    // Per value: the last unit that wrote it, and that read it (a bucket of hundreds of
    // members was a search of its writes and reads per operand).
    constexpr size_t kNone = std::numeric_limits<size_t>::max();
    std::vector<size_t> writtenBy(fn_.values.size(), kNone), readBy(fn_.values.size(), kNone);
    for (size_t u = 0; u < units_.size(); ++u) {
      Unit& unit = units_[u];
      writes.clear();
      for (size_t i = unit.first; i < unit.end; ++i) {
        const SpmdOp& op = fn_.ops[i];
        writes.push_back(op.result);
        writes.insert(writes.end(), op.results.begin(), op.results.end());
      }
      for (SpmdValueId value : writes)
        writtenBy[value] = u;
      unit.readsBegin = reads_.size();
      for (size_t i = unit.first; i < unit.end; ++i)
        for (SpmdValueId operand : fn_.ops[i].operands)
          if (writtenBy[operand] != u && readBy[operand] != u) {
            readBy[operand] = u;
            reads_.push_back(operand);
          }
      unit.readsEnd = reads_.size();
      for (SpmdValueId value : writes)
        producer_[value] = static_cast<int>(u);
    }
    // Units lowered from a recomputed copy: the IR ops whose SPMD compute op carries the
    // attribute, and every op lowered from them (the collectives resolving their results).
    std::vector<size_t> copySources;
    for (const SpmdOp& op : fn_.ops)
      for (const auto& attr : op.attrs)
        if (attr.first == ir::kRecomputeAttr) copySources.push_back(op.sourceOp);
    std::sort(copySources.begin(), copySources.end());
    recomputed_.assign(units_.size(), 0);
    for (size_t u = 0; u < units_.size(); ++u)
      for (size_t i = units_[u].first; i < units_[u].end; ++i)
        if (std::binary_search(copySources.begin(), copySources.end(), fn_.ops[i].sourceOp))
          recomputed_[u] = 1;
    state_.assign(units_.size(), State::Unplaced);
    groupOf_.assign(units_.size(), -1);
    visited_.assign(units_.size(), 0);
    openGroup_.assign(keys.size(), -1);
    byKey_.resize(keys.size());
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].key >= 0) byKey_[units_[u].key].push_back(u);
    smallestFrom_.resize(keys.size());
    for (size_t key = 0; key < keys.size(); ++key) {
      const std::vector<size_t>& sameKey = byKey_[key];
      std::vector<int64_t>& smallest = smallestFrom_[key];
      smallest.assign(sameKey.size() + 1, std::numeric_limits<int64_t>::max());
      for (size_t k = sameKey.size(); k-- > 0;)
        smallest[k] = std::min(smallest[k + 1], units_[sameKey[k]].bytes);
    }
  }

  std::span<const SpmdValueId> readsOf(size_t u) const {
    return {reads_.data() + units_[u].readsBegin, units_[u].readsEnd - units_[u].readsBegin};
  }

  int pendingGroupOf(SpmdValueId value) const {
    int unit = producer_[value];
    return unit >= 0 && state_[unit] == State::Pending ? groupOf_[unit] : -1;
  }

  void place(size_t u) {
    state_[u] = State::Placed;
    order_.push_back(u);
  }

  void join(size_t group, size_t u) {
    state_[u] = State::Pending;
    groupOf_[u] = static_cast<int>(group);
    groups_[group].members.push_back(u);
    groups_[group].bytes += units_[u].bytes;
    groups_[group].position = order_.size();
  }

  void close(int& open) {
    for (size_t member : groups_[open].members)
      state_[member] = State::Done;
    closed_.push_back(static_cast<size_t>(open));
    open = -1;
  }

  /// Whether unit `u` is an op of the forward pass. An all-reduce lowered from a recomputed
  /// layer's copies (train/Recompute.h), or needing them, never joins a forward group: the
  /// copies would move into the forward pass and live until backward, as kept activations.
  bool inForward(size_t u) const { return fn_.ops[units_[u].first].phase == Phase::Forward; }

  /// Before unit `reader` reads the group's results: later all-reduces of its kind join when
  /// the ops they need can run now, then the group closes.
  void flush(size_t group, size_t reader) {
    const std::vector<size_t>& sameKey = byKey_[groups_[group].key];
    const std::vector<int64_t>& smallest = smallestFrom_[groups_[group].key];
    for (auto it = std::upper_bound(sameKey.begin(), sameKey.end(), reader); it != sameKey.end();
         ++it) {
      // No later one fits: the scan would only pass them by.
      if (groups_[group].bytes + smallest[static_cast<size_t>(it - sameKey.begin())] > kBucketBytes)
        break;
      size_t candidate = *it;
      if (state_[candidate] != State::Unplaced ||
          groups_[group].bytes + units_[candidate].bytes > kBucketBytes)
        continue;
      std::vector<size_t>& cone = cone_;
      cone.clear();
      if (!coneOf(candidate, cone)) continue;
      bool forwardGroup = inForward(groups_[group].members.front());
      if (forwardGroup &&
          (recomputed_[candidate] ||
           std::any_of(cone.begin(), cone.end(), [&](size_t u) { return recomputed_[u] != 0; })))
        continue;
      std::sort(cone.begin(), cone.end());
      for (size_t u : cone)
        place(u);
      join(group, candidate);
    }
    close(openGroup_[groups_[group].key]);
  }

  /// The unscheduled units that `target`'s operands depend on; false when one of them reads a
  /// pending result or is itself a mergeable all-reduce (it would run alone).
  bool coneOf(size_t target, std::vector<size_t>& cone) {
    ++stamp_;
    std::vector<size_t>& work = work_;
    work.assign(1, target);
    while (!work.empty()) {
      size_t u = work.back();
      work.pop_back();
      for (SpmdValueId value : readsOf(u)) {
        int p = producer_[value];
        if (p < 0 || visited_[p] == stamp_) continue;
        visited_[p] = stamp_;
        if (state_[p] == State::Placed || state_[p] == State::Done) continue;
        if (state_[p] == State::Pending || units_[p].key >= 0) return false;
        cone.push_back(static_cast<size_t>(p));
        work.push_back(static_cast<size_t>(p));
      }
    }
    return true;
  }

  /// A group's members, the largest first: the merged op keeps its source, phase and operand
  /// order, then the others' operands in order.
  std::vector<size_t> membersLargestFirst(const Group& group) const {
    size_t largest = group.members.front();
    for (size_t member : group.members)
      if (units_[member].bytes > units_[largest].bytes) largest = member;
    std::vector<size_t> members{largest};
    for (size_t member : group.members)
      if (member != largest) members.push_back(member);
    return members;
  }

  /// What rewrite() saves, summed in the same order (the same bits), without the ops.
  double savings() const {
    double saved = 0;
    for (size_t index : closed_) {
      const Group& group = groups_[index];
      if (group.members.size() == 1) continue;
      std::vector<size_t> members = membersLargestFirst(group);
      for (size_t member : members)
        saved += fn_.ops[units_[member].first].seconds;
      Collective merged = fn_.ops[units_[members.front()].first].collective;
      merged.kind = CollectiveKind::BucketedAllReduceSum;
      merged.bytes = group.bytes;
      saved -= collectiveSeconds(machine_, fn_.mesh, merged);
    }
    return saved;
  }

  /// The bucketed all-reduce of a group of two or more.
  SpmdOp mergedOp(const Group& group, double& saved) const {
    std::vector<size_t> members = membersLargestFirst(group);
    size_t largest = members.front();
    SpmdOp op = fn_.ops[units_[largest].first];
    op.collective.kind = CollectiveKind::BucketedAllReduceSum;
    op.collective.bytes = group.bytes;
    op.operands.clear();
    op.results.clear();
    std::vector<std::string> others; // the merged-in values, named
    for (size_t member : members) {
      const SpmdOp& single = fn_.ops[units_[member].first];
      saved += single.seconds;
      op.operands.insert(op.operands.end(), single.operands.begin(), single.operands.end());
      size_t first = op.results.size();
      if (single.collective.kind == CollectiveKind::BucketedAllReduceSum)
        op.results.insert(op.results.end(), single.results.begin(), single.results.end());
      else
        op.results.push_back(single.result);
      for (size_t k = first; member != largest && k < op.results.size(); ++k) {
        const std::string& name = fn_.values[op.results[k]].name;
        others.push_back(name.empty() ? fmt::format("%{}", op.results[k]) : name);
      }
    }
    size_t merged = others.size();
    if (others.size() > 3) others.resize(3), others.push_back("...");
    op.result = op.results.front();
    op.seconds = collectiveSeconds(machine_, fn_.mesh, op.collective);
    saved -= op.seconds;
    op.note = fmt::format("{}{}merged with {} more partial sum{} over {} ({}): {} in one buffer",
                          op.note, op.note.empty() ? "" : "; ", merged, merged == 1 ? "" : "s",
                          fmt::join(op.collective.axes, ", "), fmt::join(others, ", "),
                          bytesString(static_cast<double>(group.bytes)));
    return op;
  }

  double rewrite() {
    double saved = 0;
    std::vector<std::pair<size_t, SpmdOp>> inserted; // (units scheduled before it, op)
    inserted.reserve(closed_.size());
    for (size_t group : closed_) {
      const Group& closed = groups_[group];
      // A group of one is its op, moved (no other group reads it, nor is it placed itself).
      if (closed.members.size() == 1)
        inserted.emplace_back(closed.position, std::move(fn_.ops[units_[closed.members[0]].first]));
      else
        inserted.emplace_back(closed.position, mergedOp(closed, saved));
    }
    std::stable_sort(inserted.begin(), inserted.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<SpmdOp> ops;
    ops.reserve(fn_.ops.size());
    size_t next = 0;
    for (size_t p = 0; p <= order_.size(); ++p) {
      for (; next < inserted.size() && inserted[next].first == p; ++next)
        ops.push_back(std::move(inserted[next].second));
      if (p == order_.size()) break;
      const Unit& unit = units_[order_[p]];
      for (size_t i = unit.first; i < unit.end; ++i)
        ops.push_back(std::move(fn_.ops[i]));
    }
    fn_.ops = std::move(ops);
    return saved;
  }

  SpmdFunction& fn_;
  const Machine& machine_;
  std::vector<Unit> units_;
  std::vector<SpmdValueId> reads_; // the units' reads, one after the other (Unit::readsBegin)
  std::vector<int> producer_;      // per value: its unit
  std::vector<char> recomputed_;   // per unit: lowered from a recomputed copy
  std::vector<State> state_;
  std::vector<int> groupOf_;
  std::vector<uint32_t> visited_;
  uint32_t stamp_ = 0;
  std::vector<Group> groups_;
  std::vector<int> openGroup_;             // per key
  std::vector<std::vector<size_t>> byKey_; // per key: its units, in order
  std::vector<size_t> cone_, work_;        // flush's and coneOf's scratch (flushes ask thousands)
  /// Per key, per position in byKey_: the fewest bytes of a unit from there on.
  std::vector<std::vector<int64_t>> smallestFrom_;
  std::vector<size_t> order_;  // the units placed, in their new order
  std::vector<size_t> closed_; // groups, in the order they closed
};

} // namespace

namespace {

/// The summary less what merging saves.
double applySaving(SpmdFunction& fn, double saved) {
  PlanSummary& summary = fn.summary;
  if (saved != 0 && summary.stepSeconds > saved) {
    double before = summary.stepSeconds;
    summary.communicationSeconds -= saved;
    summary.stepSeconds -= saved;
    summary.utilization *= before / summary.stepSeconds;
  }
  return saved;
}

} // namespace

double mergeAllReduces(SpmdFunction& fn, const Machine& machine) {
  return applySaving(fn, Merger(fn, machine).run(/*rewriteOps=*/true));
}

double mergedSummary(SpmdFunction& fn, const Machine& machine) {
  return applySaving(fn, Merger(fn, machine).run(/*rewriteOps=*/false));
}

} // namespace meshc::plan
