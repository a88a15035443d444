// Code generation's pipeline, in order (Lower.cpp): each planned function is lowered to kernel
// IR, then rewritten by the kernel passes, the verifier running after each; the printers
// (CppEmitter.h, CudaEmitter.h) turn the result into C++ or CUDA.
#pragma once

#include "codegen/KernelIR.h"
#include "planner/PlanReport.h"

#include <llvm/Support/Error.h>

#include <string>
#include <vector>

namespace meshc::kir {

/// A kernel pass: its name, what it does (the pass list of docs/codegen.md and
/// `meshc --list-passes`), and its entry function.
struct KernelPass {
  const char* name;
  const char* description;
  void (*run)(KernelFunction&);
};

/// Every pass, in the order the pipeline runs them.
const std::vector<KernelPass>& kernelPasses();

struct LowerOptions {
  /// Passes to skip by name (to measure what each one gives; the output stays correct).
  std::vector<std::string> disabledPasses;
};

/// The kernel IR of every planned function. Fails with a located message on an op the code
/// generator does not support, or (an internal error) when the verifier rejects a pass's output.
llvm::Expected<KernelModule> lowerModule(const ir::Module& module,
                                         const std::vector<plan::PlannedFunction>& plans,
                                         const LowerOptions& options = {});

} // namespace meshc::kir
