// The cost model: roofline for compute, alpha-beta per mesh axis for collectives (the formulas
// of the brief), bytes per device for memory. All times in seconds.
#pragma once

#include "planner/Machine.h"
#include "planner/SpmdIR.h"

namespace meshc::plan {

/// Roofline: max(flops / peak(dtype), bytes / memoryBandwidth).
double computeSeconds(const Machine& machine, double flops, double bytes, ir::DType dtype);

/// Alpha-beta time of one collective over its axes on `machine`:
///   allgather, reduce-scatter: a + b (p-1)/p n;  allreduce: 2a + 2b (p-1)/p n;
///   all-to-all: (p-1) a + b (p-1)/p n;  permute: a + b n;  local slice: 0.
/// with p the group size, n = collective.bytes, a/b of the link the group spans.
double collectiveSeconds(const Machine& machine, const Mesh& mesh, const Collective& collective);

/// The latency part (2a) of an all-reduce-sum, which merged all-reduces pay once
/// (MergeCollectives.h): a merged collective costs 2a + 2b (p-1)/p (n1 + n2 + ...). 0 for the
/// kinds that are never merged.
double mergeableLatencySeconds(const Machine& machine, const Mesh& mesh,
                               const Collective& collective);

} // namespace meshc::plan
