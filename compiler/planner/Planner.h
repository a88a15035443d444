// The planner's entry point: for every program and train block of a module, the layout (pinned
// dims as written, `auto` dims searched), then the SPMD lowering under it. The driver calls this
// for --emit=plan, plan-json, spmd and dot.
#pragma once

#include "diag/Diagnostics.h"
#include "planner/PlanReport.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshc::plan {

struct PlannerOptions {
  std::string machine = "cpu";  // a built-in machine name or a JSON file (Machine.h)
  double memoryBudgetBytes = 0; // per device; 0: the machine's memory
  size_t exactLimit = SearchOptions().exactLimit;
  std::vector<std::string> functions; // plan only these (empty: every function)
  /// > 0: also choose the mesh: every way of giving the mesh's axes (or, without a mesh, two axes
  /// `x` and `y`) sizes whose product is `devices` is planned, and the fastest is kept.
  int64_t devices = 0;
  /// 1-3: ZeRO stage of train blocks (docs/planner.md, "ZeRO"); 0: none.
  int zeroStage = 0;
  /// Where the layout searches' descent starts (SearchOptions::start): a similar function's
  /// layout, which the caller passes to make the search cheaper; the plan is the same.
  std::optional<Layout> searchStart;
  /// SearchOptions::skipIdleBounds for the layout searches: the same plans, other counts of
  /// layouts costed (for callers that do not print them).
  bool skipIdleBounds = false;
  /// SearchOptions::boundTally for the layout searches (with skipIdleBounds).
  std::shared_ptr<BoundTally> boundTally;
  /// planZeroCandidates: stage 0's plan, when no layout fits the budget, is not lowered: its
  /// SPMD function holds only the mesh, the layout, the step and the memory, the search's exact
  /// figures (the lowering's, bit for bit: SearchResult), for a caller that only lists it and
  /// does not microbatch it (the joint search's first row, one microbatch, which never fits).
  bool unloweredOverBudget = false;
};

/// Plans every selected function of `module` on `machine`. Errors (an impossible memory budget,
/// a layout the lowering rejects) are reported through `diag`; returns nullopt then.
std::optional<std::vector<PlannedFunction>> planModule(const ir::Module& module,
                                                       const Machine& machine,
                                                       const PlannerOptions& options,
                                                       DiagEngine& diag);

/// For the joint search (driver/JointSearch.h): train block `function` of `module` (on its own
/// mesh, no --devices) planned once per stage of `zeroStages`, in that order: stage 0 (no ZeRO)
/// with the fastest layout that fits the budget, or the fastest layout whatever its memory when
/// none fits; stages 1-3 applied to the fastest layout whatever its memory (their `zero` says
/// the stage). `keepGoing` (when given) sees each plan first and may change it (the caller's
/// microbatching); it returns false to stop the list after that plan (a caller giving the ZeRO
/// stages in decreasing order stops at the first over its budget: a lower stage shards less;
/// one giving stage 0 first stops when it fits). One evaluator serves them all, and one search
/// of the fastest layout serves every ZeRO stage. Nullopt after reporting an error through
/// `diag`.
std::optional<std::vector<PlannedFunction>>
planZeroCandidates(const ir::Module& module, const Machine& machine, const PlannerOptions& options,
                   const std::string& function, const std::vector<int>& zeroStages,
                   const std::function<bool(PlannedFunction&)>& keepGoing, DiagEngine& diag);

/// `plan`, train block `fn` of `module` planned on the module's mesh without ZeRO, made what
/// planModule makes of it with ZeRO stage `stage` (1-3; PlannerOptions::zeroStage) when its
/// layout fits the budget: the ZeRO rewrite of its layout, lowered and reported. For a caller that
/// keeps plans without ZeRO to derive the stages from (driver/PlanPipeline.cpp). False after an
/// error reported through `diag`.
bool applyZeroStage(const ir::Module& module, const ir::Function& fn, const Machine& machine,
                    int stage, PlannedFunction& plan, DiagEngine& diag);

/// The same, loading options.machine first (an unknown machine is reported as an error).
std::optional<std::vector<PlannedFunction>>
planModule(const ir::Module& module, const PlannerOptions& options, DiagEngine& diag);

} // namespace meshc::plan
