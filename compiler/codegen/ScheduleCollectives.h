// Pass schedule-collectives: all-reduces start where their operands are ready and are waited
// for just before the first statement that touches their buffers, overlapping what runs between.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void scheduleCollectives(KernelFunction& function);

} // namespace meshc::kir
