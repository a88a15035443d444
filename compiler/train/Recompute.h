// Activation recomputation (docs/training.md, "Recomputation"): in a train block after autodiff,
// the forward values of a `recompute def`'s call that its backward reads are computed again,
// from the call's inputs and params, just before the call's first backward op, and the backward
// reads the copies. The originals then die in the forward pass; only the call's inputs (and
// whatever the rest of the step reads) stay live across it, and the buffer planner reuses their
// memory. The copies are ops like the originals (same attributes: a dropout draws the same mask
// from the same stream and step) plus the attribute ir::kRecomputeAttr (the call's path), which
// keeps later passes from merging them back into the originals.
#pragma once

#include "ir/IR.h"

#include <cstddef>
#include <string>
#include <vector>

namespace meshc::train {

/// Recomputes the activations of every call in `fn.calls` marked `recompute` (the outermost
/// such call when they nest). `forwardOps` is the number of forward ops (those before autodiff
/// appended the backward). Values are renumbered in op order. Returns the number of calls whose
/// activations are now recomputed (a call whose values no backward op reads has none).
size_t recomputeActivations(ir::Function& fn, size_t forwardOps);

/// The same on a function the training phase has already lowered: its forward ops are those up
/// to the last one that an output or a step state's update depends on.
size_t recomputeActivations(ir::Function& fn);

/// The repeated layer of a train block: the outermost def called from a `repeat` (the most
/// calls among those at the same depth), or "" when no def is.
std::string repeatedLayerDef(const ir::Function& fn);

/// Marks every call of `def` in `fn.calls` recomputed; returns how many there are.
size_t markRecompute(ir::Function& fn, const std::string& def);

/// `module`, trained without recomputation (`forwardOps`: per function, the op count before
/// autodiff, SIZE_MAX for one the training phase left as it was: driver lowerTraining's), made
/// what sema and the training phase make of the same sources with --recompute naming `defs`:
/// sema only marks the defs' calls (in every function), autodiff and the optimizer do not read
/// the marks, and the training phase recomputes last, from the same forward op count. So a
/// plan that recomputes derives its module from the plain plan's instead of loading it again.
/// False, `module` unchanged, when a def has no call in a train block (sema's error) or the
/// counts do not match the functions: load it then.
bool applyRecompute(ir::Module& module, const std::vector<std::string>& defs,
                    const std::vector<size_t>& forwardOps);

} // namespace meshc::train
