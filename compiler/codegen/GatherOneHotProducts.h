// Pass gather-one-hot-products: an einsum of a one-hot tensor with another operand becomes a
// gather of the operand's rows (the one-hot dim summed: an embedding lookup) or a scatter-add of
// its rows (the one-hot dim kept: the embedding's gradient), instead of a GEMM over zeros.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void gatherOneHotProducts(KernelFunction& function);

} // namespace meshc::kir
