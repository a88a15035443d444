// meshc --microbatches DIM=K (docs/training.md): the selected train blocks are loaded again with
// DIM at 1/K of its size, trained and planned for one microbatch, and marked to run K times per
// step (planner/Microbatching.h); the generated step still takes the whole batch. The other
// functions are planned as loaded.
#pragma once

#include "driver/Pipeline.h"

namespace meshc {

/// planModule's work under `options.microbatches`; errors (a malformed option, an unknown dim,
/// no train block, K not dividing the dim's extent per device, a train block without an input
/// of the dim or that cannot be split) are `meshc: error:` lines.
std::optional<PlannedModule> planMicrobatched(const ir::Module& module,
                                              const PipelineOptions& options, DiagEngine& diag,
                                              const char* argv0);

} // namespace meshc
