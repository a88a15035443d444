// The code generation pipeline (Lower.h): the one place that lists the kernel passes in order.
#include "codegen/Lower.h"

#include "codegen/CausalAttentionBlocks.h"
#include "codegen/ContractPairwise.h"
#include "codegen/EliminateCommonSubexpressions.h"
#include "codegen/EliminateDeadCode.h"
#include "codegen/FoldConstants.h"
#include "codegen/FuseGemmEpilogues.h"
#include "codegen/FuseLoops.h"
#include "codegen/FuseRowKernels.h"
#include "codegen/GatherOneHotProducts.h"
#include "codegen/HoistInvariants.h"
#include "codegen/KeepDropoutMasks.h"
#include "codegen/LowerToKernels.h"
#include "codegen/OutlineRepeatedCode.h"
#include "codegen/PlanBuffers.h"
#include "codegen/ScheduleCollectives.h"
#include "codegen/ScheduleMicrobatches.h"
#include "codegen/SplitStages.h"
#include "codegen/VerifyKernels.h"
#include "codegen/WriteUpdatesInPlace.h"

#include <llvm/ADT/STLExtras.h>

namespace meshc::kir {

const std::vector<KernelPass>& kernelPasses() {
  static const std::vector<KernelPass> passes = {
      {"contract-pairwise",
       "einsums of three or more operands (or a broadcast output dim) become pairwise GEMMs in "
       "the order of fewest FLOPs, then a broadcast copy",
       contractPairwise},
      {"fold-constants",
       "literals into the loops that read them, constant arithmetic evaluated, scales into GEMM "
       "alpha",
       foldConstants},
      {"eliminate-common-subexpressions",
       "a pure statement identical to an earlier one reuses its result",
       eliminateCommonSubexpressions},
      {"hoist-invariants", "statements built only from constants run once, in the constructor",
       hoistInvariants},
      {"gather-one-hot-products",
       "an einsum of a one-hot tensor becomes a gather or a scatter-add of the other's rows",
       gatherOneHotProducts},
      {"fuse-loops",
       "loop nests fused into their readers: same points, or a cheap producer across a broadcast",
       fuseLoops},
      {"fuse-row-kernels",
       "layer_norm with its gain and bias, a mask loop with the softmax after it, a product "
       "with the row sum after it: one row kernel",
       fuseRowKernels},
      {"fuse-gemm-epilogues",
       "a bias add along the last dim and GELU after a GEMM: the GEMM's post-ops",
       fuseGemmEpilogues},
      {"causal-attention-blocks",
       "causal attention's GEMMs (scores, probs . v and their gradients) over the lower "
       "triangle of blocks, its softmax over the keys each row sees",
       causalAttentionBlocks},
      {"write-updates-in-place",
       "optimizer updates stored straight into their params when nothing reads the old value after",
       writeUpdatesInPlace},
      {"eliminate-dead-code", "pure statements and stores whose results nobody reads go away",
       eliminateDeadCode},
      {"keep-dropout-masks",
       "a dropout redrawing an earlier loop's mask (backward's) reads it as bytes that loop stores",
       keepDropoutMasks},
      {"split-stages",
       "pipeline stages: each statement on the stages of its layers, values crossing a stage "
       "boundary sent point to point, accumulated gradients all-reduced over the stage axis",
       splitStages},
      {"schedule-microbatches",
       "pipeline schedules: every microbatch's forward, then every backward (1F1B: interleaved "
       "per stage, sends started), activations kept per microbatch",
       scheduleMicrobatches},
      {"schedule-collectives",
       "all-reduces start when ready and are waited for just before their first reader",
       scheduleCollectives},
      {"plan-buffers", "arena offsets by liveness; hoisted values as members", planBuffers},
      {"outline-repeated-code",
       "code that repeats over other buffers (the layers of a repeat) becomes one subroutine",
       outlineRepeatedCode},
  };
  return passes;
}

llvm::Expected<KernelModule> lowerModule(const ir::Module& module,
                                         const std::vector<plan::PlannedFunction>& plans,
                                         const LowerOptions& options) {
  KernelModule result;
  for (const plan::PlannedFunction& planned : plans) {
    const ir::Function* irFn = module.findFunction(planned.spmd.name);
    if (!irFn)
      return llvm::createStringError(llvm::inconvertibleErrorCode(), "no function named '%s'",
                                     planned.spmd.name.c_str());
    llvm::Expected<KernelFunction> fn = lowerToKernels(*irFn, planned.spmd);
    if (!fn) return fn.takeError();
    auto verify = [&](const char* after) -> llvm::Error {
      std::string problem = verifyKernels(*fn);
      if (problem.empty()) return llvm::Error::success();
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "internal error: kernel IR of '%s' after %s: %s",
                                     fn->name.c_str(), after, problem.c_str());
    };
    if (auto error = verify("lowering")) return error;
    for (const KernelPass& pass : kernelPasses()) {
      if (llvm::is_contained(options.disabledPasses, pass.name) &&
          std::string(pass.name) != "plan-buffers") // the printers need placed buffers
        continue;
      pass.run(*fn);
      if (auto error = verify(pass.name)) return error;
    }
    result.functions.push_back(std::move(*fn));
  }
  return result;
}

} // namespace meshc::kir
