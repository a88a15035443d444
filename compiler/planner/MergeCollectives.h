// Merging of independent all-reduce-sums over the same mesh axes into bucketed all-reduces, run
// on the finished SPMD function (see docs/planner.md, "Merged collectives").
#pragma once

#include "planner/Machine.h"
#include "planner/SpmdIR.h"

namespace meshc::plan {

/// Merges resolving all-reduce-sums (and buckets) over the same axes, of which neither reads
/// the other's result, into one BucketedAllReduceSum of at most kBucketBytes, placed where all
/// its operands exist and before the first use of any result; moves the independent compute a
/// later member needs up when that makes the merge possible. Returns the predicted seconds saved.
double mergeAllReduces(SpmdFunction& fn, const Machine& machine);

/// mergeAllReduces' summary (and saving) without rewriting the ops: what a layout search needs
/// of a candidate's merge.
double mergedSummary(SpmdFunction& fn, const Machine& machine);

} // namespace meshc::plan
