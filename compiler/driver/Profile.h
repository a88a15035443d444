// `meshc run --profile`: the planner's predictions set against a trace of the run
// (meshrt/Trace.h), per source line and per collective, and totals by phase.
#pragma once

#include "planner/Machine.h"
#include "planner/PlanReport.h"

#include <llvm/Support/raw_ostream.h>

#include <string>
#include <vector>

namespace meshc {

/// Merges the per-process traces of an MPI run (`path.rank<R>`, R in [0, ranks)) into `path`
/// and removes them. False (with `error`) when one is missing or malformed.
bool mergeRankTraces(const std::string& path, int64_t ranks, std::string& error);

/// Prints, for every planned function the trace ran, the predicted and measured time per source
/// line (op groups) and per collective, sorted by absolute error, then the totals by phase.
/// False (with `error`) when the trace cannot be read.
bool printProfile(const std::vector<plan::PlannedFunction>& plans, const std::string& tracePath,
                  llvm::raw_ostream& os, std::string& error);

} // namespace meshc
