// Reverse-mode autodiff on the named-dim IR (docs/training.md). It appends the backward ops of a
// train Function after its forward ops and returns the gradient of every trainable weight that
// reaches the loss through differentiable ops.
//
// Only values on a path weight -> loss are differentiated; i32 values carry no gradient, nor does
// stop_gradient's result. Cotangents accumulate with `add`; dims are matched by name (a broadcast
// binary op's cotangent is summed back over the dims its operand lacks). A weight whose every
// path to the loss is non-differentiable (through comparisons, integer ids, stop_gradient) gets
// no gradient: the optimizer leaves it unchanged, as PyTorch skips a param whose grad is None.
#pragma once

#include "diag/Diagnostics.h"
#include "ir/IR.h"

#include <map>
#include <optional>

namespace meshc::train {

/// Param index (into fn.params) -> the ValueId of d loss / d param, same type as the param.
using Gradients = std::map<size_t, ir::ValueId>;

/// Differentiates `fn.train->loss` with respect to every trainable weight of `fn`. Reports a
/// located error (and returns nullopt) when an op without a gradient (a user `call`) lies on a
/// path from a weight to the loss, or when no weight reaches the loss.
std::optional<Gradients> differentiate(ir::Function& fn, DiagEngine& diag);

} // namespace meshc::train
