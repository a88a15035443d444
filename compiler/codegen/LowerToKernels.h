// The first stage of code generation: the SPMD IR of one planned function as kernel IR. Every
// elementwise op becomes its own loop nest and every other op its library call, kernel call or
// collective, in the SPMD IR's order; values get buffers (inputs and params their own storage,
// the rest arena slots, a dying operand's slot reused by an op that only renames it). The
// passes of Lower.cpp then fold, merge, hoist, fuse and place them.
#pragma once

#include "codegen/KernelIR.h"

#include <llvm/Support/Error.h>

namespace meshc::kir {

/// Fails with a located message ("file:line:col: code generation does not support ...") on an
/// op the code generator does not support.
llvm::Expected<KernelFunction> lowerToKernels(const ir::Function& irFunction,
                                              const plan::SpmdFunction& spmd);

} // namespace meshc::kir
