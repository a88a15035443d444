// Reshard paths shared by every evaluator of the process on one machine and mesh: a joint
// search builds hundreds of evaluators (a block per microbatch count, recomputation and ZeRO
// stage, and per stage split its one- and two-layer blocks) whose values have the same types and
// ask for the same reshards, and planReshard's shortest path was a tenth of the search.
#pragma once

#include "planner/Machine.h"
#include "planner/Reshard.h"

#include <optional>
#include <string>
#include <vector>

namespace meshc::plan {

/// A reshard path with what every walk that takes it reads of its steps, computed once: each
/// step's mergeable latency (mergeableLatencySeconds: on a machine of several nodes it scans
/// every rank) and the local bytes of its result.
struct ReshardEntry {
  std::optional<ReshardPath> path;
  std::vector<double> mergeableSeconds, stepBytes; // per step
};

/// The process's reshard entries for one machine and mesh (planReshard, mergeableLatencySeconds
/// and localBytes read nothing else): every memo made for an equal machine and mesh shares them.
/// Thread-safe; entries live as long as the process.
class ReshardMemo {
public:
  ReshardMemo(const Machine& machine, const Mesh& mesh);
  /// The entry for a value of `type` from `from` to `to`; `typeKey` names the type (its dtype
  /// and dims, all planReshard reads of it).
  const ReshardEntry& entry(const std::string& typeKey, const ir::TensorType& type,
                            const TensorLayout& from, const TensorLayout& to) const;

  struct Context;

private:
  Context* context_;
};

} // namespace meshc::plan
