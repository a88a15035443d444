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

/// The train blocks `trainBlocks` of `module` loaded again with `dim` at 1/`count` of its size,
/// through sema (with `options`' overrides and --recompute) and the training phase: what one
/// microbatch runs. Nullopt after reporting an error. `forwardOps` (when given): lowerTraining's.
std::optional<ir::Module> loadMicrobatchModule(const ir::Module& module,
                                               const PipelineOptions& options,
                                               const std::vector<std::string>& trainBlocks,
                                               const std::string& dim, int64_t count,
                                               DiagEngine& diag, const char* argv0,
                                               std::vector<size_t>* forwardOps = nullptr);

/// The module code is generated from: `module` with each train block of `replacements` (by
/// name) replaced by that module's version (a microbatch's, or one with recomputation).
ir::Module codeModuleWith(const ir::Module& module,
                          const std::vector<const ir::Function*>& replacements);

} // namespace meshc
