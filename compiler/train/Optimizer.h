// Optimizer lowering: turns `minimize loss with <optimizer>(...)` plus the weights' gradients
// into IR ops, optimizer-state params (`<weight>@<slot>`, zeros-initialized, dims a subset of the
// weight's) and `Function::updates`. The formulas are in docs/training.md.
#pragma once

#include "diag/Diagnostics.h"
#include "ir/IR.h"
#include "train/Autodiff.h"

#include <set>
#include <string>

namespace meshc::train {

/// Appends the update of every weight in `gradients` (sgd, adamw or adafactor as
/// `fn.train->optimizer` says, with its learning-rate schedule and global-norm clipping) and
/// the update of every state slot it adds. Weights without a gradient are left unchanged.
/// `splitDims`: the dims the module's layout pins to mesh axes; they only choose the order of
/// a sum whose value does not depend on it (Adafactor's clipping, OrderFactoredSums.h), so that
/// its partial sums resolve together with the statistics. The planner orders it again for the
/// layout it chooses.
void lowerOptimizer(ir::Function& fn, const Gradients& gradients,
                    const std::set<std::string>& splitDims = {});

/// The training phase the driver runs on a train block: autodiff, optimizer lowering, then the
/// recomputation of the activations of `recompute` def calls (Recompute.h).
/// A Function that already has updates (IR read back after this phase) is left as it is.
/// `forwardOps` (when given) becomes the op count before autodiff, or SIZE_MAX when the function
/// is left as it is (what train::applyRecompute needs). Returns false after reporting an error.
bool lowerTraining(ir::Function& fn, DiagEngine& diag, const std::set<std::string>& splitDims = {},
                   size_t* forwardOps = nullptr);

/// The dims `module`'s layout (its own, or --layout's) pins to mesh axes: the `splitDims` of its
/// train blocks. Dims laid out `auto` are not among them (the search comes later).
std::set<std::string> pinnedDims(const ir::Module& module);

} // namespace meshc::train
