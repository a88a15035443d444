#include "ir/OpTraits.h"

namespace meshc::ir {

const char* resultRuleName(ResultRule rule) {
  switch (rule) {
  case ResultRule::Source:
    return "source";
  case ResultRule::Same:
    return "same as operand";
  case ResultRule::Convert:
    return "convert";
  case ResultRule::Permute:
    return "permute";
  case ResultRule::Expand:
    return "expand";
  case ResultRule::Broadcast:
    return "broadcast";
  case ResultRule::Compare:
    return "compare";
  case ResultRule::Select:
    return "select";
  case ResultRule::External:
    return "external";
  case ResultRule::Contract:
    return "contract";
  case ResultRule::Reduce:
    return "reduce";
  case ResultRule::Remap:
    return "remap";
  case ResultRule::Positions:
    return "positions";
  case ResultRule::OneHot:
    return "one_hot";
  case ResultRule::Gather:
    return "gather";
  }
  return "?";
}

std::vector<char> stepInvariantOps(const Function& fn) {
  std::vector<char> invariantValue(fn.values.size(), 0), invariantOp(fn.ops.size(), 0);
  for (size_t i = 0; i < fn.ops.size(); ++i) {
    const Op& op = fn.ops[i];
    const OpTraits& traits = opTraits(op.kind);
    bool invariant = !traits.variesPerRun() && !traits.readsRng() && !traits.hasSideEffect();
    for (ValueId operand : op.operands)
      invariant = invariant && invariantValue[operand];
    invariantOp[i] = invariantValue[op.result] = invariant;
  }
  return invariantOp;
}

} // namespace meshc::ir
