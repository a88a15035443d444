// What activation recomputation (train/Recompute.h) costs and saves in a plan, per recomputed
// def, read from the SPMD ops that come from recomputed copies (those carrying
// ir::kRecomputeAttr, and the collectives lowered with them). `--emit=plan` prints it.
#pragma once

#include "planner/SpmdIR.h"

#include <llvm/Support/raw_ostream.h>

#include <string>
#include <vector>

namespace meshc::plan {

struct RecomputeSummary {
  std::string def;
  size_t calls = 0; // the def's calls whose activations are recomputed
  /// Per device: the activations the backward reads from copies, which the forward no longer
  /// keeps for it (the sum of their local sizes).
  double droppedBytes = 0;
  double flops = 0;   // per device: the copies' compute
  double seconds = 0; // predicted: the copies' ops and their collectives
};

/// One entry per recomputed def, by name; empty when nothing is recomputed.
std::vector<RecomputeSummary> summarizeRecompute(const SpmdFunction& fn);

/// The `recompute` section of `--emit=plan` (nothing when nothing is recomputed).
void printRecompute(const SpmdFunction& fn, llvm::raw_ostream& os);

} // namespace meshc::plan
