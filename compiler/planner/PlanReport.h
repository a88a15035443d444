// The planner's reports: --emit=plan (text), --emit=plan-json (llvm::json), --emit=spmd (the
// SPMD IR) and --emit=dot (Graphviz, collectives highlighted).
#pragma once

#include "planner/JointSearchReport.h"
#include "planner/LayoutSearch.h"
#include "planner/SpmdIR.h"
#include "planner/ZeroSharding.h"

#include <llvm/Support/raw_ostream.h>

#include <optional>
#include <set>
#include <string>

namespace meshc::plan {

/// What a plan report shows about one function.
struct PlannedFunction {
  SpmdFunction spmd;
  std::optional<SearchResult> search; // when some dims were searched
  double memoryBudgetBytes = 0;       // the per-device budget the plan was made for
  std::set<std::string> pinnedDims;   // dims whose layout the program or command line fixed
  /// With --devices: every mesh tried and its predicted step time (+inf: no layout fits), in
  /// the order tried; the plan is for the fastest.
  std::vector<std::pair<Mesh, double>> meshCandidates;
  std::optional<ZeroReport> zero; // train blocks planned with --zero
  /// Train blocks whose layout alone did not fit: what the joint search considered and chose.
  std::optional<JointSearchReport> joint;
};

void printPlan(const PlannedFunction& plan, const Machine& machine, llvm::raw_ostream& os);
void printPlanJson(const PlannedFunction& plan, const Machine& machine, llvm::raw_ostream& os);

/// plan-json's `jointSearch` object on its own, as text (the pipeline report writes its JSON by
/// hand).
std::string jointSearchJson(const JointSearchReport& report);
void printSpmd(const SpmdFunction& fn, llvm::raw_ostream& os);
void printDot(const SpmdFunction& fn, llvm::raw_ostream& os);

/// "3.2 GiB", "512.0 KiB", "12 B": sizes as the reports and diagnostics print them.
std::string bytesString(double bytes);
/// "1.234 ms", "56.7 us", "2.5 s": predicted times as the reports print them.
std::string secondsString(double seconds);

} // namespace meshc::plan
