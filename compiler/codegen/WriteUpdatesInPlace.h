// Pass write-updates-in-place: an optimizer update computed by a loop that reads the param's
// old value last, point for point, stores the new value straight into the param's storage.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

void writeUpdatesInPlace(KernelFunction& function);

} // namespace meshc::kir
