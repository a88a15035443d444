// Microbatching and gradient accumulation (meshc --microbatches DIM=K, docs/training.md). A train
// block is planned for one microbatch (DIM at 1/K of its size); this says which of its ops run
// once per microbatch (the forward and backward cone of the loss, the metrics and the raw
// gradients), which values leave that loop averaged over the microbatches (the gradients, the
// loss and the metrics), and which all-reduces, being linear, run once after the loop on the
// accumulated values instead of K times. Code generation (codegen/FormMicrobatchLoop.h) builds
// the loop from this schedule and the plan report counts collectives from it, so both agree.
#pragma once

#include "planner/Machine.h"
#include "planner/SpmdIR.h"

#include <llvm/Support/Error.h>

#include <vector>

namespace meshc::plan {

struct MicrobatchSchedule {
  /// Per op: runs once per microbatch, in the loop (the rest, the update, runs once after it).
  std::vector<bool> perMicrobatch;
  /// Per op: an all-reduce (sum) of the loop whose results only the update and the caller read:
  /// it runs once after the loop, on the accumulated values (a sum of sums).
  std::vector<bool> afterLoop;
  /// Values of the loop that the update or the caller reads and that depend on the batch: each
  /// is accumulated (averaged over the microbatches) into a buffer that outlives the loop.
  std::vector<SpmdValueId> accumulated;
};

/// The schedule of `fn`, planned for one microbatch. An error says what cannot be
/// microbatched: a value computed from the batch that the update reads and that is neither a
/// gradient (or linear in gradients), the loss nor a metric, or a step state's next value
/// computed in the loop.
llvm::Expected<MicrobatchSchedule> scheduleMicrobatches(const SpmdFunction& fn);

/// The planner merges independent all-reduces over the same axes across phases
/// (MergeCollectives.h): a backward norm's partial sums with the global-norm clipping's sums of
/// squared gradients. In a microbatched step the first run once per microbatch and the second once
/// after the loop, on the accumulated gradients, so such a bucket is split in two: the members the
/// loop needs stay where the bucket was, the others become a collective of the update right after
/// it (priced on `machine`; the summary pays the latency the merge had saved). Returns how many
/// were split.
size_t splitBucketsAtLoop(SpmdFunction& fn, const Machine& machine);

/// Records that `fn` (planned for one microbatch of `dim`) runs `count` times per step: splits the
/// buckets that straddle the loop (splitBucketsAtLoop), and adds its accumulators to the memory
/// estimate (as gradients). Fails as scheduleMicrobatches does.
llvm::Error applyMicrobatching(SpmdFunction& fn, const std::string& dim, int64_t count,
                               const Machine& machine);

/// The collectives one step issues: those in the loop (each issued once per microbatch) and those
/// issued once (after the loop, or in the update).
struct MicrobatchCollectives {
  size_t perMicrobatch = 0, once = 0;
};
MicrobatchCollectives countCollectives(const SpmdFunction& fn, const MicrobatchSchedule& schedule);

/// The plan report's line about microbatching ("" when the function is not microbatched).
std::string microbatchingSummary(const SpmdFunction& fn);

} // namespace meshc::plan
