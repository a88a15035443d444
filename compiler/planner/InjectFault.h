// Deliberate bugs, for testing the tests (the hidden `meshc --inject-fault=<fault>`; see
// docs/architecture.md "Numerical tolerances"): a training-equivalence test that still passes
// with a fault injected could not catch that fault.
#pragma once

#include "planner/SpmdIR.h"

#include <llvm/Support/Error.h>

#include <string>

namespace meshc::plan {

/// The faults `meshc --inject-fault` knows, one line each (for its help and its errors).
const char* injectableFaults();

/// Injects `fault` into a train block's plan; returns what was changed, "" when the function has
/// nothing to change (a program), or an error for an unknown fault.
///   drop-grad-allreduce: the first collective that resolves a param's gradient (`grad/<path>`;
///   an all-reduce or one member of a bucketed all-reduce), or, where the planner resolves the
///   partial sums later (after SGD's lr * grad), the first that resolves a value computed from
///   one, communicates nothing: its readers get this rank's unresolved partial sum, as if the
///   all-reduce were missing from the plan.
llvm::Expected<std::string> injectFault(SpmdFunction& fn, const std::string& fault);

} // namespace meshc::plan
