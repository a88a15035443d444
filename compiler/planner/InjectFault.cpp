#include "planner/InjectFault.h"

#include <fmt/format.h>

#include <functional>

namespace meshc::plan {
namespace {

bool isGradient(const SpmdFunction& fn, SpmdValueId value) {
  return fn.values[value].name.rfind("grad/", 0) == 0;
}

/// Which values are computed from a param's gradient (the gradient included): where the planner
/// resolves a gradient's partial sum after an op that is linear in it (SGD's lr * grad), the
/// all-reduce resolves that op's result instead.
std::vector<bool> fromGradients(const SpmdFunction& fn) {
  std::vector<bool> from(fn.values.size(), false);
  for (SpmdValueId v = 0; v < fn.values.size(); ++v)
    from[v] = isGradient(fn, v);
  for (const SpmdOp& op : fn.ops) {
    if (op.collective.kind == CollectiveKind::BucketedAllReduceSum &&
        op.kind == SpmdOp::Kind::Collective) {
      for (size_t k = 0; k < op.operands.size(); ++k)
        from[op.results[k]] = from[op.results[k]] || from[op.operands[k]];
      continue;
    }
    for (SpmdValueId operand : op.operands)
      from[op.result] = from[op.result] || from[operand];
  }
  return from;
}

/// drop-grad-allreduce: the first all-reduce (or bucket member) whose operand is `resolves`. An
/// all-reduce over no axes is a copy (the code generator emits no communication for it), so the
/// plan stays well formed: every value keeps its producer.
std::string dropFirstAllReduce(SpmdFunction& fn, const std::function<bool(SpmdValueId)>& resolves) {
  for (size_t i = 0; i < fn.ops.size(); ++i) {
    SpmdOp& op = fn.ops[i];
    if (op.kind != SpmdOp::Kind::Collective) continue;
    if (op.collective.kind == CollectiveKind::AllReduceSum && resolves(op.operands[0])) {
      std::string what =
          fmt::format("all_reduce_sum of {} over [{}]", fn.values[op.operands[0]].name,
                      fmt::join(op.collective.axes, ", "));
      op.collective.axes.clear();
      op.note = "fault injected: " + what + " dropped";
      return what;
    }
    if (op.collective.kind != CollectiveKind::BucketedAllReduceSum) continue;
    for (size_t k = 0; k < op.operands.size(); ++k) {
      if (!resolves(op.operands[k])) continue;
      // That member leaves the bucket and becomes an all-reduce over no axes right after it.
      SpmdOp dropped = op;
      dropped.collective.kind = CollectiveKind::AllReduceSum;
      dropped.collective.axes.clear();
      dropped.operands = {op.operands[k]};
      dropped.result = op.results[k];
      dropped.results.clear();
      std::string what =
          fmt::format("{}'s member of a bucketed_all_reduce_sum over [{}]",
                      fn.values[op.operands[k]].name.empty() ? fmt::format("%{}", op.operands[k])
                                                             : fn.values[op.operands[k]].name,
                      fmt::join(op.collective.axes, ", "));
      dropped.note = "fault injected: " + what + " dropped";
      op.operands.erase(op.operands.begin() + std::ptrdiff_t(k));
      op.results.erase(op.results.begin() + std::ptrdiff_t(k));
      op.result = op.results.front(); // a bucket has at least two members
      fn.ops.insert(fn.ops.begin() + std::ptrdiff_t(i) + 1, std::move(dropped));
      return what;
    }
  }
  return "";
}

std::string dropGradientAllReduce(SpmdFunction& fn) {
  std::string what =
      dropFirstAllReduce(fn, [&](SpmdValueId value) { return isGradient(fn, value); });
  if (!what.empty()) return what;
  std::vector<bool> from = fromGradients(fn);
  return dropFirstAllReduce(fn, [&](SpmdValueId value) { return bool(from[value]); });
}

} // namespace

const char* injectableFaults() {
  return "drop-grad-allreduce: the first all-reduce of a param's gradient communicates nothing";
}

llvm::Expected<std::string> injectFault(SpmdFunction& fn, const std::string& fault) {
  if (fault != "drop-grad-allreduce")
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "--inject-fault: no fault named '%s'; known:\n  %s",
                                   fault.c_str(), injectableFaults());
  return fn.kind == ir::Function::Kind::Train ? dropGradientAllReduce(fn) : std::string();
}

} // namespace meshc::plan
