// Pass eliminate-common-subexpressions: a pure statement identical to an earlier one (same kernel
// or loop over the same buffers, none of them rewritten in between) reuses the earlier result.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void eliminateCommonSubexpressions(KernelFunction& function);

} // namespace meshc::kir
