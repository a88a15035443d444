// Where the rest of a pipelined train step (the ops outside the repeat's layers: embedding, head,
// loss) lives per stage, as code generation places it (codegen/SplitStages.h, docs/runtime.md
// "Pipeline stages in generated code"): its params, gradient accumulators and optimizer state,
// and its activations. The pipeline model (planner/PipelineModel.h) composes the stages from
// plans at one and two layers; this says which stage each of the rest's bytes goes to, read from
// the one-layer plan (driver/PlanPipeline.cpp).
#pragma once

#include "planner/PipelineModel.h"

namespace meshc {

/// Fills `shape`'s restParams, restOptimizer, restForward, restBackward, restOnce and stagePeaks
/// from `fn` (the step at one layer) and its plan `spmd`:
/// - a param on the stages whose forward statements read it (the embedding on the first, the
///   head on the last, a tied embedding on both), its gradient accumulator and optimizer state
///   where its update runs, the first of them;
/// - time: the plan's seconds of the rest's ops on the stages that run them (restForward,
///   restBackward, restOnce), as the activations below place the ops;
/// - activations: the plan's liveness (each value from its op to its last reader, in op order, as
///   the planner counts it) restricted to the values a first, middle and last stage hold. A
///   forward op of the rest runs where its stage-bound operands are (after the layers: on the
///   last stage), a backward op on the earliest of them (the embedding's gradient, which reads
///   the first layer's, on the first), an op reading none on the stages that read its result;
///   a value read on another stage is held there too (it is sent).
/// Per op of `spmd`: whether it runs once per step, after the microbatch loop, when the step
/// accumulates over microbatches (plan::scheduleMicrobatches: the update, the global norm's sums
/// and the all-reduces of accumulated values, as codegen/FormMicrobatchLoop.h places them);
/// without accumulation (or a step that cannot be microbatched) the update's ops.
std::vector<bool> oncePerStep(const plan::SpmdFunction& spmd, bool accumulates);

void placeRest(const ir::Function& fn, const plan::SpmdFunction& spmd, bool accumulates,
               plan::PipelineShape& shape);

} // namespace meshc
