// Pass plan-buffers: arena offsets by liveness (values whose live ranges do not overlap share
// bytes), member offsets for hoisted values; the same liveness gives the arena's size.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void planBuffers(KernelFunction& function);

} // namespace meshc::kir
