#include "planner/AllReduceChains.h"

#include <algorithm>

namespace meshc::plan {

AllReduceChains::AllReduceChains(const Machine& machine, const Mesh& mesh, size_t numValues)
    : machine_(machine), mesh_(mesh), depthOf_(numValues, Depths{}) {}

void AllReduceChains::reset() {
  reading_ = Depths{};
  longest_ = Depths{};
  std::fill(uncountedSeen_.begin(), uncountedSeen_.end(), false);
}

uint32_t AllReduceChains::groupsOf(const ReshardPath& path) {
  auto [cached, inserted] = groupsOfPath_.try_emplace(&path);
  PathGroups& groups = cached->second;
  if (inserted) {
    for (const ReshardStep& step : path.steps) {
      double latency = mergeableLatencySeconds(machine_, mesh_, step.collective);
      if (latency == 0) continue;
      AxisList axes = step.collective.axes;
      std::sort(axes.begin(), axes.end());
      auto known = std::find(groups_.begin(), groups_.end(), axes);
      if (known != groups_.end()) {
        groups.mask |= 1u << (known - groups_.begin());
      } else if (groups_.size() < kMaxGroups) {
        groups.mask |= 1u << groups_.size();
        auto place = std::upper_bound(
            byAxes_.begin(), byAxes_.end(), axes,
            [&](const AxisList& key, size_t group) { return key < groups_[group]; });
        byAxes_.insert(place, groups_.size());
        groups_.push_back(axes);
        latency_.push_back(latency);
      } else {
        auto [index, added] = uncountedIndex_.try_emplace(axes, uncountedLatency_.size());
        if (added) uncountedLatency_.push_back(latency), uncountedSeen_.push_back(false);
        groups.uncounted.push_back(index->second);
      }
    }
  }
  for (size_t index : groups.uncounted)
    uncountedSeen_[index] = true;
  return groups.mask;
}

void AllReduceChains::read(ir::ValueId value, uint32_t groups) {
  const Depths& depths = depthOf_[value];
  for (size_t g = 0; g < groups_.size(); ++g) {
    uint16_t depth = depths[g] + ((groups >> g) & 1);
    reading_[g] = std::max(reading_[g], depth);
    longest_[g] = std::max(longest_[g], depth);
  }
}

void AllReduceChains::write(ir::ValueId result) {
  depthOf_[result] = reading_;
  std::fill_n(reading_.begin(), groups_.size(), 0);
}

double AllReduceChains::latencySeconds(const Depths& longest) const {
  // Summed in the order of the groups' axes, not of their numbers (which follow the paths this
  // evaluator met first): any evaluator gives the same bits for a walk, whatever it walked
  // before (on a machine of several nodes the groups' latencies differ).
  double seconds = 0;
  for (size_t g : byAxes_)
    seconds += latency_[g] * longest[g];
  for (const auto& [axes, index] : uncountedIndex_)
    if (uncountedSeen_[index]) seconds += uncountedLatency_[index];
  return seconds;
}

} // namespace meshc::plan
