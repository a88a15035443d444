// Pass fuse-loops: a loop nest is fused into the loop nest that reads its result, over the same
// points (the producer's result is still stored when others read it) or across a broadcast (a
// cheap producer recomputed per point of its only reader); chains become one pass over memory.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void fuseLoops(KernelFunction& function);

} // namespace meshc::kir
