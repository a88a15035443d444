// Pipeline stages in the driver: a layout that lays a repeat's count dim over a mesh axis
// (`layout layers: stage` with `repeat layers { ... }`) splits the repeat's layers into that
// axis's stages. The step is planned at one and at two layers, at the microbatch's batch, on the
// mesh without the stage axis; their difference is one layer, the rest is the embedding, head
// and loss, and planner/PipelineModel.h composes the stages' timeline. Only --emit=plan and
// plan-json take such a layout today: code generation for stages does not exist yet and says so.
#pragma once

#include "driver/InnerModules.h"
#include "driver/Pipeline.h"
#include "planner/JointSearchReport.h"

#include <map>
#include <memory>

namespace meshc {

/// The layout entry that asks for stages, if any (nullptr: none). Checks it: one axis that no
/// other dim uses, every selected function repeating over the dim once; `ok` is false after such
/// an error (reported through `diag`).
const ir::DimLayout* stageLayoutOf(const ir::Module& module, const PipelineOptions& options,
                                   DiagEngine& diag, bool& ok);

/// Code generation's split of the stage dim's layers (driver/StagedCode.h): per selected function,
/// each stage's layer count as the pipeline plan chooses it (balanced on the predicted time of one
/// layer and of the rest, as --emit=plan reports it), for the microbatch count asked for.
std::optional<std::map<std::string, std::vector<int64_t>>>
plannedStageSplit(const ir::Module& module, const ir::DimLayout& stageLayout,
                  const PipelineOptions& options, DiagEngine& diag, const char* argv0);

/// The plans of one and two layers that searchPipeline made without ZeRO, by their options
/// (mesh, layout, dims, recompute): a later search of the same stage layout with a ZeRO stage
/// (the joint search's retry of a split that does not fit) applies the stage to them rather than
/// planning them again, and the report of the split the joint search chose takes them as they
/// are. The inner plans' budget is unbounded, so planModule with --zero searches and lowers the
/// same layout as without and then applies the stage: the same plans. They are shared with the
/// search that made them, not copied (most are never retried).
struct UnzeroedPlans {
  struct Entry {
    std::shared_ptr<const ir::Module> module; // loaded and trained
    std::shared_ptr<const PlannedModule> planned;
  };
  std::map<std::string, Entry> byOptions;
  /// The modules loaded for them, from which those of other meshes and with recomputation are
  /// derived (InnerModules.h).
  InnerModules modules;
};

/// --emit=plan (or plan-json with `json`) of every selected function of a module whose layout
/// asks for stages; `joint` (when given) is the joint search that chose the stages, reported
/// with the plan, and `plans` the inner plans that search made (planned again otherwise).
/// Returns the exit status.
int planPipelines(const ir::Module& module, const ir::DimLayout& stageLayout,
                  const PipelineOptions& options, DiagEngine& diag, const char* argv0, bool json,
                  llvm::raw_ostream& os, const plan::JointSearchReport* joint = nullptr,
                  UnzeroedPlans* plans = nullptr);

/// A pipeline planPipelines considers for a function: its microbatch count, recomputed defs,
/// predicted step, memory at the fullest stage, and whether that fits the budget.
struct PipelineChoice {
  int64_t microbatches = 1;
  std::vector<std::string> recompute;
  double stepSeconds = 0, memoryBytes = 0;
  bool fits = false;
};

/// planPipelines' search for `fn` without the report (for the joint search, JointSearch.h):
/// `choice` is the fastest pipeline that fits the budget, else the one that needs the least
/// memory (nullopt: none was planned); the repeated layer is recomputed only with
/// `tryRecompute`. `unzeroed` (when given) keeps the plans without ZeRO and serves those with.
/// False after an error reported through `diag`.
bool searchPipeline(const ir::Module& module, const ir::DimLayout& stageLayout,
                    const PipelineOptions& options, const ir::Function& fn, bool tryRecompute,
                    DiagEngine& diag, const char* argv0, std::optional<PipelineChoice>& choice,
                    UnzeroedPlans* unzeroed = nullptr);

} // namespace meshc
