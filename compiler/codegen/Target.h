// The code generation target: the few points where the generated C++ (CPU) and CUDA differ,
// consulted by the one emitter (CppEmitter.cpp). Everything else (op lowering, fusion, arena
// placement, collectives) is shared: the CUDA support header (meshc/CudaSupport.h) provides
// meshc::gen's names with device implementations, and finish() retargets the text.
#pragma once

#include "codegen/CppEmitter.h"

#include <memory>
#include <string>
#include <vector>

namespace meshc::codegen {

class Target {
public:
  virtual ~Target() = default;
  /// The loop of a fused elementwise group over `count` contiguous elements (index `i`);
  /// `views`: the buffers the body reads and writes (by variable name).
  virtual std::string contiguousLoop(const std::string& resultVar,
                                     const std::vector<std::string>& views,
                                     const std::string& body) const = 0;
  /// The same over a strided box: meshc::gen::forEach<n>(sizes, {{strides}}, ..., at).
  virtual std::string stridedLoop(size_t n, const std::string& sizes,
                                  const std::vector<std::string>& strideLists,
                                  const std::vector<std::string>& views,
                                  const std::string& body) const = 0;
  /// Whether f32 einsums go through meshrt::kernels::EinsumPlan (else meshc::gen::einsum2).
  virtual bool einsumPlans() const = 0;
  /// The first statement of every generated constructor body and run() ("" for none).
  virtual std::string prologue() const = 0;
  /// Retargets the formatted-to-be text (support names, includes, the runner's backend).
  virtual void finish(CppOutput& output) const = 0;
};

std::unique_ptr<Target> makeCpuTarget();

/// The emitter with an explicit target (emitCpp uses the CPU target).
llvm::Expected<CppOutput> emitWithTarget(const ir::Module& module,
                                         const std::vector<plan::PlannedFunction>& plans,
                                         const CppOptions& options, const Target& target);

} // namespace meshc::codegen
