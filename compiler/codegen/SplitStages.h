// Pass split-stages: pipeline stages (a layout `layers: stage` over a `repeat layers`,
// docs/runtime.md "Pipeline stages in generated code"). The step was planned for one stage's
// mesh; every rank runs the same statement list, and this pass says which stages run each
// statement and moves the values that cross a stage boundary:
// - a statement lowered from an op of repeat iteration i runs on the stage whose consecutive
//   layers include i (the plan's split, SpmdFunction::Stages::layers; forward and backward
//   alike: autodiff's ops keep their forward op's call);
// - another forward or backward statement runs where the first stage-bound value it reads lives
//   (forward: the latest stage among them, backward: the earliest), or, reading none, on every
//   stage that reads its result (the embedding on the first stage, masks computed from the batch
//   on every stage that uses them);
// - a param lives on the stages whose forward and backward statements read it (a layer's on its
//   stage, a param several stages read on each of them), optimizer state where its new value is
//   computed (KernelFunction::paramStages): only those ranks allocate, update and checkpoint it;
// - the update and what follows the microbatch loop run on every stage that holds all they read
//   (a layer's gradient all-reduce over `data` and its update on its stage; a bucket of several
//   stages' gradients becomes one all-reduce per stage), else on one stage that the others send
//   their values to (the global norm's sum of every param's squares), and what reads no stage's
//   value on the stages that read its result. A gradient accumulated on one stage stays there;
//   one accumulated on several (a shared param's), the loss and the metrics are all-reduced over
//   the stage axis once after the loop;
// - a value read on a stage that did not compute it is sent there point to point right after it
//   is written (StageTransfer, on the stage axis's communicator). Every rank runs the statements
//   in one order, so the sends and receives match and cannot deadlock; blocking sends let the
//   first stage run ahead by one microbatch, which pipelines the forward loop.
#pragma once

#include "codegen/KernelIR.h"

#include <vector>

namespace meshc::kir {

/// Per op of `spmd` (planned with stages, spmd.stages.count > 1): the stage of the repeat
/// iteration over spmd.stages.dim that its source op comes from, -1 for ops outside the repeat
/// and for the update.
std::vector<int> stagesOfOps(const ir::Function& irFn, const plan::SpmdFunction& spmd);

/// The pass (nothing without stages).
void splitStages(KernelFunction& fn);

} // namespace meshc::kir
