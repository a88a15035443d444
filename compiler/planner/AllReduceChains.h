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

namespace meshc::plan {

class AllReduceChains {
public:
  AllReduceChains(const Machine& machine, const Mesh& mesh, size_t numValues);
  /// Starts a new walk (the values' depths are written before they are read: not cleared).
  void reset();

  /// The groups of `path`'s mergeable all-reduces, as a mask for read() (0: none).
  uint32_t groupsOf(const ReshardPath& path);
  /// The op being walked reads `value`, resharded by all-reduces over `groups` (groupsOf).
  void read(ir::ValueId value, uint32_t groups);
  /// The op being walked writes `result`: it depends on everything it read since the last call.
  void write(ir::ValueId result);
  /// The latency every completion pays at least: per group, its latency per link of its
  /// longest chain.
  double latencySeconds() const;

private:
  static constexpr size_t kMaxGroups = 8;
  using Depths = std::array<uint16_t, kMaxGroups>;

  const Machine& machine_;
  const Mesh& mesh_;
  std::vector<Depths> depthOf_; // per value: the longest chain per group it depends on
  Depths reading_{};            // the op being walked: the maximum over what it read
  Depths longest_{};            // per group: the longest chain seen
  std::vector<AxisList> groups_;
  std::vector<double> latency_;
  /// Groups beyond kMaxGroups (meshes of four and more axes): counted once, as if all merged.
  std::map<AxisList, double> uncounted_;
};

} // namespace meshc::plan
