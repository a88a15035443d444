// CUDA code generation (`meshc --emit=cuda`): the C++ emitter with the CUDA target. The class
// per program / train block has the C++ API (host Inputs/Outputs, the same constructor) but
// holds its parameters and arena in device memory, runs fused elementwise groups as generated
// `__device__` lambdas over the same scalar expressions as the CPU path, einsum through cuBLAS,
// reductions / softmax / layer_norm / cumsum through meshrt_cuda, and its collectives through
// the rank's NCCL communicator, all on that rank's stream. docs/cuda.md has the details.
#pragma once

#include "codegen/CppEmitter.h"

namespace meshc::codegen {

struct CudaOptions {
  /// Header include, namespace and runner as for C++ (the runner uses meshrt::nccl::runNccl).
  CppOptions cpp;
  /// einsum precision: "fp32" (strict, default), "tf32" (TF32 tensor cores) or "bf16" (bf16
  /// operands on tensor cores, fp32 accumulation; parameters stay fp32 master weights).
  std::string math = "fp32";
};

/// The CUDA source (CppOutput::source, a .cu), its header and optional runner (.main.cu).
/// Fails with a located message on an op the generator does not support.
llvm::Expected<CppOutput> emitCuda(const ir::Module& module,
                                   const std::vector<plan::PlannedFunction>& plans,
                                   const CudaOptions& options);

/// Whether `math` names a precision mode ("fp32", "tf32", "bf16").
bool isCudaMathMode(const std::string& math);

} // namespace meshc::codegen
