// Pass schedule-microbatches: the pipeline schedule of a staged step with microbatches
// (SplitStages.h; docs/runtime.md "Pipeline stages in generated code"). GPipe: the microbatch
// loop becomes two, every microbatch's forward (microbatchLoop 0), then every microbatch's
// backward (microbatchLoop 1). A value the forward loop writes and the backward loop reads (a
// kept activation, its stage's input received from the previous stage) gets one copy per
// microbatch (Buffer::copies); under 1F1B one per microbatch its stage holds at once (at most
// p - s on stage s), reused in turn. Under either schedule the loops' sends are started from a
// copy (StageTransferStarted) and waited for after the loops, so the forward loop runs ahead on
// the first stages: stage s sends microbatch m's activation to stage s + 1 and goes on with
// microbatch m + 1 without waiting for stage s + 1 to take it.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

/// The pass (nothing without stages or microbatches).
void scheduleMicrobatches(KernelFunction& fn);

} // namespace meshc::kir
