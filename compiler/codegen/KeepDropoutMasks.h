// Pass keep-dropout-masks: a dropout that draws the mask an earlier loop of run() drew (the
// same stream key, global indices and rate: backward's dropout of the gradient) reads it from a
// keep mask, a byte per point, that the earlier loop stores, instead of drawing it again.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void keepDropoutMasks(KernelFunction& function);

} // namespace meshc::kir
