// Code generation for pipeline stages (StagedCode.h).
#include "driver/StagedCode.h"

#include "driver/PlanPipeline.h"

#include <fmt/format.h>
#include <llvm/ADT/StringExtras.h>

namespace meshc {

std::optional<PlannedModule> planStaged(const ir::Module& module, const ir::DimLayout& stage,
                                        const PipelineOptions& given, DiagEngine& diag,
                                        const char* argv0) {
  const std::string& axis = stage.axes.front();
  if (given.pipelineSchedule != "gpipe" && given.pipelineSchedule != "1f1b") {
    optionError("--pipeline-schedule must be gpipe or 1f1b, not '" + given.pipelineSchedule + "'");
    return std::nullopt;
  }
  // One stage's mesh and layout, every layer: the plan each stage's part comes from.
  PipelineOptions inner = given;
  std::vector<std::string> mesh, layout = {stage.dim + ": []"};
  int64_t stages = 1;
  for (const ir::MeshAxis& meshAxis : module.mesh) {
    if (meshAxis.name == axis)
      stages = meshAxis.size;
    else
      mesh.push_back(fmt::format("{}={}", meshAxis.name, meshAxis.size));
  }
  for (const ir::DimLayout& entry : module.layout)
    if (entry.dim != stage.dim)
      layout.push_back(entry.isAuto
                           ? entry.dim + ": auto"
                           : fmt::format("{}: [{}]", entry.dim, llvm::join(entry.axes, ", ")));
  if (module.autoLayout) layout.push_back("auto");
  inner.mesh = mesh.empty() ? axis + "=1" : llvm::join(mesh, ",");
  inner.stageCopies = stages; // all stages share the machine (PlanPipeline.cpp's innerOptions)
  inner.layout = llvm::join(layout, ", ");
  std::vector<std::string> files;
  std::optional<ir::Module> innerModule = loadModule(inner, diag, argv0, files);
  if (!innerModule || !lowerTraining(*innerModule, diag, inner.verifyEach)) return std::nullopt;
  std::optional<PlannedModule> planned = planModule(*innerModule, inner, diag, argv0);
  if (!planned) return std::nullopt;
  // The layers of each stage: the pipeline plan's balanced split (--emit=plan's "stages").
  std::optional<std::map<std::string, std::vector<int64_t>>> split =
      plannedStageSplit(module, stage, given, diag, argv0);
  if (!split) return std::nullopt;
  if (!planned->codeModule) planned->codeModule = std::move(*innerModule);
  // The stage axis back in every plan's mesh (no value is laid out over it), in its place.
  for (plan::PlannedFunction& fn : planned->plans) {
    fn.spmd.mesh.axes = module.mesh;
    fn.spmd.stages = {axis, stage.dim, stages, given.pipelineSchedule == "1f1b",
                      (*split)[fn.spmd.name]};
  }
  planned->codeModule->mesh = module.mesh;
  return planned;
}

} // namespace meshc
