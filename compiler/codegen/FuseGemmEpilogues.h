// Pass fuse-gemm-epilogues: a GEMM and the loop right after it that adds a bias along the
// result's last dim and applies GELU (or nothing more) become one GEMM with an epilogue, which
// the C++ target runs as oneDNN's bias and eltwise post-ops (no second pass over the result;
// the feed-forward's `gelu(x . w_in + b_in)`). Only for f32 GEMMs of two operands with alpha 1
// and beta 0, whose result the loop alone reads, walked densely in the GEMM's own dim order.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void fuseGemmEpilogues(KernelFunction& function);

} // namespace meshc::kir
