// The IR verifier's checks that carry over to the SPMD IR (the planner's output, a different
// type from ir::Function): SSA order, compute ops' operand counts and required attributes by the
// op table, and the inputs/params/outputs/updates tables. Result types are local shards there,
// so the named-dim type rules are not rechecked; ir::verifyFunction covers them before planning.
#pragma once

#include "ir/Verifier.h"
#include "planner/SpmdIR.h"

#include <vector>

namespace meshc::plan {

std::vector<ir::VerifierError> verifySpmdFunction(const SpmdFunction& fn);

} // namespace meshc::plan
