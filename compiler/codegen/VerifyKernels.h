// The kernel IR's verifier: runs after lowering and after every pass (Lower.cpp). Checks
// buffer references, loop accesses against buffer bounds, loop bodies' SSA order, GEMM shapes,
// that every buffer is written before it is read, start/wait pairing of collectives, and (once
// planned) that arena slots of values alive at once do not overlap.
#pragma once

#include "codegen/KernelIR.h"

#include <string>

namespace meshc::kir {

/// An empty string when `function` is well formed, else the first problem found.
std::string verifyKernels(const KernelFunction& function);

} // namespace meshc::kir
