// Pass hoist-invariants: pure statements that read only step-invariant values (masks built
// from iotas, constants) move from run() into the constructor; their buffers become members.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void hoistInvariants(KernelFunction& function);

} // namespace meshc::kir
