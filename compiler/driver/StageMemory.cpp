// The generated code's memory per pipeline stage (StageMemory.h).
#include "driver/StageMemory.h"

#include "codegen/Lower.h"
#include "driver/StagedCode.h"

#include <llvm/Support/Error.h>
#include <llvm/Support/raw_ostream.h>

namespace meshc {

std::optional<std::vector<StageCodeMemory>>
generatedStageMemory(const ir::Module& module, const ir::DimLayout& stage,
                     const PipelineOptions& given, const std::string& function, DiagEngine& diag,
                     const char* argv0) {
  PipelineOptions options = given;
  options.functions = {function};
  // The pipeline's fit is the question asked, not a condition of the plan (as planModule does
  // after a joint search chose stages).
  options.memoryBudget.clear();
  options.jointSearch = false;
  // Quiet: a step the code generator refuses has no such figure, which the report says.
  DiagEngine quiet(diag.sources(), llvm::nulls());
  std::optional<PlannedModule> planned = planStaged(module, stage, options, quiet, argv0);
  if (!planned || planned->plans.size() != 1) return std::nullopt;
  llvm::Expected<kir::KernelModule> kernels =
      kir::lowerModule(planned->codeModuleOr(module), planned->plans);
  if (!kernels) {
    llvm::consumeError(kernels.takeError());
    return std::nullopt;
  }
  const kir::KernelFunction& fn = kernels->functions.front();
  int64_t stages = fn.stages.count;
  std::vector<StageCodeMemory> result(size_t(std::max<int64_t>(stages, 1)));
  for (size_t s = 0; s < result.size(); ++s) {
    StageCodeMemory& memory = result[s];
    memory.arenaBytes =
        double(s < fn.stageArenaBytes.size() ? fn.stageArenaBytes[s] : fn.arenaBytes);
    memory.persistentBytes = double(fn.persistentBytes);
    // Every param and optimizer slot is held as float (the runner's own count, CppEmitter.cpp).
    for (size_t k = 0; k < fn.params.size(); ++k) {
      uint64_t mask = k < fn.paramStages.size() ? fn.paramStages[k] : 0;
      if (mask == 0 || ((mask >> s) & 1))
        memory.paramBytes += double(fn.buffers[size_t(fn.params[k])].elements) * sizeof(float);
    }
  }
  return result;
}

} // namespace meshc
