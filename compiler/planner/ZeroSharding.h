// ZeRO-style sharding over the data-parallel axes (stages 1-3, FSDP): a train step's optimizer
// state, gradients and (stage 3) params split over the mesh axes its weights are replicated on
// while their gradients are partial sums there. Done by rewriting the train step before the SPMD
// lowering: the sharded dim of a weight gets a second name (`d_model@zero.data`) whose layout adds
// the ZeRO axes, and `rename` ops cross between the two names. The lowering's own rules then place
// the collectives: a partial gradient renamed into the sharded name is one reduce-scatter, a
// replicated weight renamed into it a free local slice, the sharded new weight renamed back an
// all-gather (a stage-3 weight is gathered for each use). Afterwards the second names are folded
// back (restoreZeroDims), so that reports, code generation and checkpoints see the weights' own
// dims with wider layouts. See docs/planner.md, "ZeRO".
#pragma once

#include "planner/Layout.h"
#include "planner/SpmdIR.h"

#include <llvm/Support/raw_ostream.h>

#include <optional>
#include <string>
#include <vector>

namespace meshc::plan {

/// Per-device bytes of the params, gradients and optimizer state of a train step's weights.
struct ZeroMemory {
  double params = 0;
  double gradients = 0;
  double optimizer = 0;
};

/// What ZeRO did to one weight.
struct ZeroWeight {
  std::string path;
  std::string dim;    // the dim sharded ("" when the weight stays whole)
  AxisList axes;      // the ZeRO axes (the weight's data-parallel axes)
  std::string reason; // why it stays whole
};

/// The plan report's ZeRO section.
struct ZeroReport {
  int stage = 0;
  bool chosen = false; // by the planner: no layout fits the memory budget without ZeRO
  std::vector<ZeroWeight> weights;
  ZeroMemory before, after;
  double totalBefore = 0, totalAfter = 0; // the plans' whole memory estimates per device
  double stepBefore = 0, stepAfter = 0;   // predicted step seconds
  int reduceScatters = 0, allGathers = 0; // the collectives ZeRO placed
  double reduceScatterBytes = 0, allGatherBytes = 0;
  double reduceScatterSeconds = 0, allGatherSeconds = 0;
};

/// A train step rewritten for ZeRO, and the layout of its second dim names.
struct ZeroRewrite {
  ir::Function fn;
  Layout layout;
  ZeroReport report; // weights and memory filled; the rest by restoreZeroDims and the planner
  std::vector<uint32_t> renameOps;   // indices in fn of the renames between the two names
  std::vector<uint32_t> identityOps; // and of the copies of stage-3 weights before them
};

/// Rewrites `fn` (a train block after the training phase) for ZeRO `stage` (1-3) under `layout`
/// on `mesh`; nullopt when `fn` has no optimizer updates (nothing to shard).
std::optional<ZeroRewrite> rewriteForZero(const ir::Function& fn, const Mesh& mesh,
                                          const Layout& layout, int stage);

/// Folds the second dim names of `rewrite` back into the weights' dims in `spmd` (lowered from
/// rewrite.fn): the crossing renames become identities and are removed, and the collectives
/// in front of them are counted into rewrite.report.
void restoreZeroDims(SpmdFunction& spmd, ZeroRewrite& rewrite, const Layout& original);

} // namespace meshc::plan
