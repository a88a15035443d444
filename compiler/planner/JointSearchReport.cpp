// The joint search's report (JointSearchReport.h).
#include "planner/JointSearchReport.h"

#include "planner/PlanReport.h"

#include <fmt/format.h>

namespace meshc::plan {

std::string jointChoiceText(const JointCandidate& c, const std::string& microbatchDim) {
  std::vector<std::string> parts;
  if (c.stages > 1)
    parts.push_back(c.stageAxis == c.splitAxis
                        ? fmt::format("{} pipeline stages over '{}'", c.stages, c.stageAxis)
                        : fmt::format("{} pipeline stages over '{}' (split off '{}')", c.stages,
                                      c.stageAxis, c.splitAxis));
  if (!c.recompute.empty()) parts.push_back("recompute " + c.recompute);
  if (c.microbatches > 1)
    parts.push_back(fmt::format("{} microbatches of {}", c.microbatches, microbatchDim));
  if (c.zeroStage > 0) parts.push_back(fmt::format("ZeRO stage {}", c.zeroStage));
  if (parts.empty()) return "nothing";
  return fmt::format("{}", fmt::join(parts, ", "));
}

void printJointSearch(const JointSearchReport& report, llvm::raw_ostream& os) {
  os << fmt::format("\njoint search (no layout fits the budget of {} alone{}): pipeline "
                    "stages, recompute, microbatches and ZeRO together\n",
                    bytesString(report.budgetBytes),
                    report.plainMemoryBytes > 0 ? fmt::format("; the fastest layout needs {}",
                                                              bytesString(report.plainMemoryBytes))
                                                : "");
  os << fmt::format("  {:<14} {:<18} {:>12} {:>4} {:>13} {:>11}\n", "stages", "recompute",
                    "microbatches", "zero", "step", "memory");
  for (size_t i = 0; i < report.considered.size(); ++i) {
    const JointCandidate& c = report.considered[i];
    os << fmt::format("  {:<14} {:<18} {:>12} {:>4} {:>13} {:>11}  {}\n",
                      c.stages == 1 ? "-"
                      : c.stageAxis == c.splitAxis
                          ? fmt::format("{} over {}", c.stages, c.stageAxis)
                          : fmt::format("{} off {}", c.stages, c.splitAxis),
                      c.recompute.empty() ? "-" : c.recompute, c.microbatches, c.zeroStage,
                      secondsString(c.stepSeconds), bytesString(c.memoryBytes),
                      int(i) == report.chosen ? "chosen"
                      : c.fits                ? "fits"
                                              : "over");
  }
  for (const std::string& line : report.notTried)
    os << "  not tried: " << line << "\n";
  if (report.chosen >= 0) {
    const JointCandidate& c = report.considered[size_t(report.chosen)];
    size_t fitting = 0;
    for (const JointCandidate& each : report.considered)
      fitting += each.fits;
    os << fmt::format("  chosen: {}: the fastest predicted step of the {} combination{} that "
                      "fit (ties: the simpler)\n",
                      jointChoiceText(c, report.microbatchDim), fitting, fitting == 1 ? "" : "s");
  }
}

} // namespace meshc::plan
