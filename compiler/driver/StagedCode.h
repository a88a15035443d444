// Code generation for pipeline stages (`layout layers: stage` over `repeat layers`,
// docs/runtime.md "Pipeline stages in generated code"): the step is planned for one stage's mesh
// (the mesh without the stage axis, the layout's stage entry `layers: []`), microbatched as
// --microbatches says, and its plan gets the stage axis back with the stages' description, from
// which the kernel passes split-stages and schedule-microbatches make each rank run its stage's
// part of every microbatch under the GPipe schedule.
#pragma once

#include "driver/Pipeline.h"

namespace meshc {

/// planModule's work for a module whose layout asks for stages (`stage`, from stageLayoutOf).
/// Errors (an unsupported option or schedule) are reported and give nullopt.
std::optional<PlannedModule> planStaged(const ir::Module& module, const ir::DimLayout& stage,
                                        const PipelineOptions& options, DiagEngine& diag,
                                        const char* argv0);

} // namespace meshc
