// Pass outline-repeated-code: stretches of run() that repeat over other buffers (the layers of a
// `repeat`, one optimizer update per equally shaped param) become one subroutine, called once per
// repetition with that repetition's buffers, so the generated source grows with the model's
// distinct code rather than with its depth.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void outlineRepeatedCode(KernelFunction& function);

} // namespace meshc::kir
