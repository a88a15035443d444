// Pass plan-buffers: arena offsets by liveness (values whose live ranges do not overlap share
// bytes), member offsets for hoisted values; the same liveness gives the arena's size. Under
// pipeline stages, buffers of different stages may share bytes and each stage's arena is sized
// for its own buffers (KernelFunction::stageArenaBytes).
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void planBuffers(KernelFunction& function);

} // namespace meshc::kir
