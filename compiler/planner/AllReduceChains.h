// All-reduce chains: a lower bound on the latency a layout's all-reduce-sums pay once merged.
// MergeCollectives (and the gradient bucketing before it) close a bucket when an op reads one of
// its results, so two all-reduces over the same axes of which one depends on the other's result,
// through any ops, never share a bucket: each group of axes pays its latency at least once per
// link of its longest chain of dependent all-reduces. A 48-layer decoder on a split model axis
// pays it twice per layer, not once per step, which is what lets the layout search prune such
// layouts instead of lowering and merging each of them.
#pragma once

#include "planner/Reshard.h"

#include <array>
#include <map>
#include <unordered_map>

namespace meshc::plan {

class AllReduceChains {
public:
  /// Every group of a mesh of up to four axes; more are counted once, as if all merged.
  static constexpr size_t kMaxGroups = 16;
  /// Per group: a chain length.
  using Depths = std::array<uint16_t, kMaxGroups>;

  AllReduceChains(const Machine& machine, const Mesh& mesh, size_t numValues);
  /// Starts a new walk (the values' depths are written before they are read: not cleared).
  void reset();

  /// The groups of `path`'s mergeable all-reduces, as a mask for read() (0: none). `path` must
  /// outlive this object (the planner's reshard paths are memoized).
  uint32_t groupsOf(const ReshardPath& path);
  /// The op being walked reads `value`, resharded by all-reduces over `groups` (groupsOf).
  void read(ir::ValueId value, uint32_t groups);
  /// The op being walked writes `result`: it depends on everything it read since the last call.
  void write(ir::ValueId result);
  /// The latency every completion pays at least: per group, its latency per link of its
  /// longest chain.
  double latencySeconds() const { return latencySeconds(longest_); }
  /// latencySeconds() had the longest chains been `longest`.
  double latencySeconds(const Depths& longest) const;

  // For a walk that replays a memoized stretch of ops (PlanEvaluator's repeated segments)
  // instead of reading and writing through read() and write().
  /// The groups numbered so far (read() and write() touch only these).
  size_t groupCount() const { return groups_.size(); }
  /// Whether some path had a group past kMaxGroups (counted per walk, not per chain).
  bool hasUncountedGroups() const { return !uncountedLatency_.empty(); }
  const Depths& depthsOf(ir::ValueId value) const { return depthOf_[value]; }
  void setDepths(ir::ValueId value, const Depths& depths) { depthOf_[value] = depths; }
  const Depths& longest() const { return longest_; }
  void setLongest(const Depths& longest) { longest_ = longest; }

private:
  struct PathGroups {
    uint32_t mask = 0;
    std::vector<size_t> uncounted; // into uncountedLatency_
  };

  const Machine& machine_;
  const Mesh& mesh_;
  std::vector<Depths> depthOf_; // per value: the longest chain per group it depends on
  Depths reading_{};            // the op being walked: the maximum over what it read
  Depths longest_{};            // per group: the longest chain seen in this walk
  // Groups are numbered once per evaluator, so that each path's groups are found once.
  std::vector<AxisList> groups_;
  std::vector<size_t> byAxes_; // the groups' numbers in the order of their axes
  std::vector<double> latency_;
  std::unordered_map<const ReshardPath*, PathGroups> groupsOfPath_;
  std::map<AxisList, size_t> uncountedIndex_;
  std::vector<double> uncountedLatency_;
  std::vector<bool> uncountedSeen_; // in this walk
};

} // namespace meshc::plan
