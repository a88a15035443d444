// The microbatch loop (meshc --microbatches DIM=K, docs/training.md). lowerToKernels lowers a
// train step planned for one microbatch; this turns its kernel IR into the whole step: the
// statements that compute the loss, the metrics and the gradients (planner/Microbatching.h's
// schedule) are marked perMicrobatch and run K times, microbatch m reading the m-th of K slices
// of each input along DIM (copied into the buffer the statements read); each gradient, the loss
// and each metric is averaged over the microbatches into an accumulator (zeroed before the
// loop, `acc += value / K` in it, right after the value's last write) that the update and the
// caller read instead; the all-reduces of the loop that only feed the update run once, after the
// loop, on the accumulators; the update runs once, after the loop.
#pragma once

#include "codegen/KernelIR.h"

#include <llvm/Support/Error.h>

namespace meshc::kir {

/// `fn` was lowered from `spmd` (spmd.microbatching.count > 1): statement k of its body from op
/// opOf[k], each SPMD value held in bufferOf[value]. Fails when the step cannot be split into
/// microbatches (planner/Microbatching.h says why).
llvm::Error formMicrobatchLoop(KernelFunction& fn, const plan::SpmdFunction& spmd,
                               const std::vector<size_t>& opOf,
                               const std::vector<BufferId>& bufferOf);

/// The inputs of a microbatched function (`irFn` and its plan `spmd`) as its generated step
/// takes them: the microbatched dim at the whole step's size (global and local).
void widenInputsToStep(ir::Function& irFn, plan::SpmdFunction& spmd);

} // namespace meshc::kir
