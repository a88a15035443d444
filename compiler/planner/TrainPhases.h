// Which part of a train step each op belongs to (defined with the SPMD lowering, which plans by
// phase; ZeroSharding reads it too).
#pragma once

#include "ir/IR.h"
#include "planner/SpmdIR.h"

#include <vector>

namespace meshc::plan {

/// The phase of every op of `fn` (forward, backward, update: docs/planner.md); all forward for a
/// program or a train block without optimizer updates.
std::vector<Phase> trainStepPhases(const ir::Function& fn);

} // namespace meshc::plan
