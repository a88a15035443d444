// Sequence parallelism (Megatron-LM's): a partial sum whose readers are row-wise ops (adds,
// layer norms, a residual stream) is resolved by a reduce-scatter into a row dim instead of an
// all-reduce, the row-wise ops run on each rank's share of the rows, and an all-gather brings
// whole rows back only where a reader needs them (the next einsum, an output). Run on the
// finished SPMD function of a program, before mergeAllReduces; see docs/planner.md, "Sequence
// parallelism".
#pragma once

#include "planner/Machine.h"
#include "planner/SpmdIR.h"

namespace meshc::plan {

/// Whether ops of this kind compute each row of their result from the same rows of their
/// operands (the kinds a region may hold), read from the op traits table: the elementwise ops
/// but transposes, and the ops that act along their [dims] (the reductions, `layer_norm`) when
/// those do not include the row dim. The evaluator's bounds count these ops' time as what the
/// rewrite may save.
bool isRowWiseKind(ir::OpKind kind);

/// Rewrites every region of row-wise ops fed by resolving all-reduce-sums into the
/// reduce-scatter / row-split / all-gather form when the cost model prices that form lower
/// (the reduce-scatter and the all-gathers against the all-reduces, plus the row-wise ops' time
/// divided by the group size). Updates the summary; returns the predicted seconds saved. Train
/// steps (whose backward would need the mirrored form) are left as they are.
double splitRowsOfPartialSums(SpmdFunction& fn, const Machine& machine);

} // namespace meshc::plan
