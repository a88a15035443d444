// The order of Adafactor's clipping sums (docs/training.md, "adafactor"). For a factored weight
// with factored dims R and C, the update clipping needs mean(u^2), which the optimizer lowering
// (Optimizer.cpp) writes as a sum over one factored dim first, divided by the statistic that keeps
// that dim, then a mean of the rest: the same value in either order. Summed first over a dim the
// layout splits, that inner sum depends on the gradient alone, so a sharded step resolves it in
// the same all-reduce as the statistics instead of in a second round after them. The layout is
// known only once the planner has chosen it: the lowering marks those sums (kFactoredSumAttr)
// and this pass rewrites them in place for any set of split dims; the training phase applies it
// with the module's pinned dims, the planner again with the dims of the layout it found
// (planner/Planner.cpp).
#pragma once

#include "ir/IR.h"

#include <functional>
#include <string>
#include <vector>

namespace meshc::train {

/// The attribute of the inner sum of a factored weight's mean(u^2): its weight's factored dims
/// [R, C]. The op's `dims` names the one summed first.
inline constexpr const char* kFactoredSumAttr = "factored_sum";

/// Whether a layout splits dim `dim` of a weight of type `weight` (over more than one device).
using SplitsDim = std::function<bool(const ir::TensorType& weight, const std::string& dim)>;

/// Rewrites every marked sum of `fn` to run first over the factored dim that `splits` calls for:
/// R when R is split (alone or with C), else C. With both split, R first takes one all-reduce
/// round fewer than C first (docs/planner.md, "Merged all-reduces", says what either costs).
/// Only the ops of that mean's chain change (operands, `dims` and result types), in place; op and
/// value numbers stay. Returns factoredSumOrder(fn) afterwards.
std::vector<std::string> orderFactoredSums(ir::Function& fn, const SplitsDim& splits);

/// For each marked sum of `fn`, in op order, the dim it sums first (so that two orders can be told
/// apart; empty: `fn` has none).
std::vector<std::string> factoredSumOrder(const ir::Function& fn);

} // namespace meshc::train
