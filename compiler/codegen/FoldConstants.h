// Pass fold-constants: literals become constants of the loops that read them (no one-element
// buffers filled every step), loop arithmetic on constants is evaluated at compile time, and a
// GEMM whose only reader scales it by a constant takes the constant as its alpha.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void foldConstants(KernelFunction& function);

} // namespace meshc::kir
