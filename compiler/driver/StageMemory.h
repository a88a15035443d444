// The memory of each pipeline stage in the generated code (docs/runtime.md "Pipeline stages in
// generated code", "Arena per stage"): a stage layout's train step lowered to kernel IR exactly
// as --emit=cpp lowers it (StagedCode.h, codegen/Lower.h), and each stage's bytes per device read
// from it: its arena (plan-buffers' liveness, KernelFunction::stageArenaBytes), the members
// computed once, and the params and optimizer state its ranks hold (KernelFunction::paramStages).
// The pipeline plan reports these beside its model's estimate (PlanPipeline.h): one liveness
// model, the code generator's, gives the figure the generated runner really allocates.
#pragma once

#include "driver/Pipeline.h"

#include <string>
#include <vector>

namespace meshc {

/// One stage's bytes per device in the generated code.
struct StageCodeMemory {
  double arenaBytes = 0;      // run()'s arena on the stage's ranks (kStageArenaBytes[stage])
  double persistentBytes = 0; // values computed once, in the constructor (every rank)
  double paramBytes = 0;      // params and optimizer state the stage's ranks hold
  double total() const { return arenaBytes + persistentBytes + paramBytes; }
};

/// The generated code's memory per stage of `function` (selected alone) under the stage layout
/// `stage` of `module`, for the options code generation would get (the microbatch count, the
/// recomputed defs, the schedule and the ZeRO stage as chosen). Nullopt when the step cannot be
/// planned or the code generator refuses it (a plan it cannot generate has no such figure); the
/// reasons are not printed (`diag` lends its sources only).
std::optional<std::vector<StageCodeMemory>>
generatedStageMemory(const ir::Module& module, const ir::DimLayout& stage,
                     const PipelineOptions& options, const std::string& function, DiagEngine& diag,
                     const char* argv0);

} // namespace meshc
