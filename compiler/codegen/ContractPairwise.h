// Pass contract-pairwise: an einsum the GEMM library cannot run as one GEMM (three or more
// operands, or an output dim no operand has) becomes a chain of pairwise GEMMs in the order of
// fewest FLOPs (planner/Contraction.h, which the cost model prices too), each intermediate an
// arena buffer, then a broadcast copy over the output dims no operand has.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void contractPairwise(KernelFunction& function);

} // namespace meshc::kir
