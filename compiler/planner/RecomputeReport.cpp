// The recompute section of the plan report (RecomputeReport.h).
#include "planner/RecomputeReport.h"

#include "planner/PlanReport.h"
#include "planner/Reshard.h"

#include <fmt/format.h>

#include <map>
#include <set>

namespace meshc::plan {

std::vector<RecomputeSummary> summarizeRecompute(const SpmdFunction& fn) {
  // The IR ops that are copies, with their call paths; every SPMD op lowered from one (its
  // compute, and the collectives that resolve or reshard its result) belongs to the copy.
  std::map<uint32_t, std::string> pathOfSource;
  for (const SpmdOp& op : fn.ops)
    if (const ir::AttrValue* value = op.attr(ir::kRecomputeAttr))
      if (const auto* path = std::get_if<std::string>(value)) pathOfSource[op.sourceOp] = *path;
  if (pathOfSource.empty()) return {};
  std::vector<const std::string*> producerPath(fn.values.size(), nullptr);
  std::map<std::string, RecomputeSummary> byDef;
  std::map<std::string, std::set<std::string>> callsOf;
  for (const SpmdOp& op : fn.ops) {
    auto it = pathOfSource.find(op.sourceOp);
    if (it == pathOfSource.end()) continue;
    RecomputeSummary& entry = byDef[ir::defOfCallPath(it->second)];
    callsOf[ir::defOfCallPath(it->second)].insert(it->second);
    entry.flops += op.flops;
    entry.seconds += op.seconds;
    if (op.result < producerPath.size()) producerPath[op.result] = &it->second;
  }
  // A copy's value that an op outside the copies reads is an activation the forward kept before.
  std::set<SpmdValueId> dropped;
  for (const SpmdOp& op : fn.ops) {
    if (pathOfSource.count(op.sourceOp)) continue;
    for (SpmdValueId operand : op.operands)
      if (operand < producerPath.size() && producerPath[operand] &&
          dropped.insert(operand).second) {
        const SpmdValue& value = fn.values[operand];
        byDef[ir::defOfCallPath(*producerPath[operand])].droppedBytes +=
            double(value.localType.numElements() * dtypeBytes(value.localType.dtype));
      }
  }
  std::vector<RecomputeSummary> out;
  for (auto& [def, entry] : byDef) {
    entry.def = def;
    entry.calls = callsOf[def].size();
    out.push_back(entry);
  }
  return out;
}

void printRecompute(const SpmdFunction& fn, llvm::raw_ostream& os) {
  std::vector<RecomputeSummary> entries = summarizeRecompute(fn);
  if (entries.empty()) return;
  os << "\nrecompute (activations recomputed in backward instead of kept, per device)\n";
  for (const RecomputeSummary& entry : entries)
    os << fmt::format("  {}: {} call{}, activations dropped {} ({} B), compute added {:.4g} "
                      "flops, {} predicted\n",
                      entry.def, entry.calls, entry.calls == 1 ? "" : "s",
                      bytesString(entry.droppedBytes), int64_t(entry.droppedBytes), entry.flops,
                      secondsString(entry.seconds));
}

} // namespace meshc::plan
