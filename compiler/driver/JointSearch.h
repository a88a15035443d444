// The joint search of a train block under a memory budget (docs/planner.md, "Joint search"): when
// no layout of the block fits the budget (--memory-budget, else the machine's memory) on its own,
// meshc plans it with activation recomputation of its repeated layer, microbatches of its batch
// dim and ZeRO stages 1-3, each combination with its own layout search, and with pipeline stages
// over a mesh axis (or a part split off one) when the block is planned alone, and keeps the
// fastest predicted step that fits; the plan reports what was considered and chosen
// (planner/JointSearchReport.h). Used when none of --recompute, --microbatches and --zero is
// given (those pin the choice) and without --devices.
#pragma once

#include "driver/Pipeline.h"
#include "planner/JointSearchReport.h"

#include <memory>

namespace meshc {

struct UnzeroedPlans;

/// Whether planModule hands `module` to planJointly: a train block is selected and nothing pins
/// the combination.
bool jointSearchApplies(const ir::Module& module, const PipelineOptions& options);

/// The joint search's choice of pipeline stages: the module as a stage layout states them (the
/// mesh with the stage axis, the layout with the repeat's dim over it), the options that plan
/// it (its microbatches, recomputation), the stage layout entry and the search's report.
struct JointStages {
  ir::Module module;
  PipelineOptions options;
  ir::DimLayout stage;
  plan::JointSearchReport report;
  /// The stage splits' plans without ZeRO: the report's search of the split chosen finds its
  /// plans there rather than planning them again.
  std::shared_ptr<UnzeroedPlans> plans;
};

/// planModule's work then: the selected functions planned as usual, and each train block that
/// does not fit planned by the joint search. Errors as planModule's (when no combination fits,
/// the plain plan's error and a note with the smallest combination's need). With `staged`, a
/// train block selected alone may be given pipeline stages (with recomputation too); when they
/// are chosen, `*staged` says how and the plans returned are empty.
std::optional<PlannedModule> planJointly(const ir::Module& module, const PipelineOptions& options,
                                         DiagEngine& diag, const char* argv0,
                                         std::optional<JointStages>* staged = nullptr);

} // namespace meshc
