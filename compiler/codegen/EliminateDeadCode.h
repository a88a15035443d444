// Pass eliminate-dead-code: pure statements and loop stores whose results nobody reads go away.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void eliminateDeadCode(KernelFunction& function);

} // namespace meshc::kir
