#include "planner/AllReduceChains.h"

#include <algorithm>

namespace meshc::plan {

AllReduceChains::AllReduceChains(const Machine& machine, const Mesh& mesh, size_t numValues)
    : machine_(machine), mesh_(mesh), depthOf_(numValues, Depths{}) {}

void AllReduceChains::reset() {
  groups_.clear();
  latency_.clear();
  uncounted_.clear();
  reading_ = Depths{};
  longest_ = Depths{};
}

uint32_t AllReduceChains::groupsOf(const ReshardPath& path) {
  uint32_t mask = 0;
  for (const ReshardStep& step : path.steps) {
    double latency = mergeableLatencySeconds(machine_, mesh_, step.collective);
    if (latency == 0) continue;
    AxisList axes = step.collective.axes;
    std::sort(axes.begin(), axes.end());
    auto known = std::find(groups_.begin(), groups_.end(), axes);
    if (known == groups_.end() && groups_.size() == kMaxGroups) {
      uncounted_[axes] = latency;
      continue;
    }
    if (known == groups_.end()) {
      groups_.push_back(axes);
      latency_.push_back(latency);
      known = groups_.end() - 1;
    }
    mask |= 1u << (known - groups_.begin());
  }
  return mask;
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

double AllReduceChains::latencySeconds() const {
  double seconds = 0;
  for (size_t g = 0; g < groups_.size(); ++g)
    seconds += latency_[g] * longest_[g];
  for (const auto& [axes, latency] : uncounted_)
    seconds += latency;
  return seconds;
}

} // namespace meshc::plan
