#include "planner/Planner.h"

#include <llvm/Support/WithColor.h>

#include <set>

namespace meshc::plan {

namespace {

/// The mesh of the module; without one, a single device.
Mesh meshOf(const ir::Module& module) {
  Mesh mesh;
  mesh.axes = module.mesh;
  return mesh;
}

/// Pinned entries give a dim its axes (possibly none); `d: auto` entries, and with a bare `auto`
/// every dim not pinned, are searched. Dims neither pinned nor searched stay replicated.
void splitLayout(const ir::Module& module, Layout& pinned, std::vector<std::string>& toSearch) {
  std::set<std::string> searched;
  for (const ir::DimLayout& entry : module.layout) {
    if (entry.isAuto)
      searched.insert(entry.dim);
    else
      pinned.axes[entry.dim] = entry.axes;
  }
  if (module.autoLayout)
    for (const auto& [dim, size] : module.dims)
      if (!pinned.axes.count(dim)) searched.insert(dim);
  toSearch.assign(searched.begin(), searched.end());
}

} // namespace

std::optional<std::vector<PlannedFunction>> planModule(const ir::Module& module,
                                                       const Machine& machine,
                                                       const PlannerOptions& options,
                                                       DiagEngine& diag) {
  Mesh mesh = meshOf(module);
  Layout pinned;
  std::vector<std::string> toSearch;
  splitLayout(module, pinned, toSearch);
  SearchOptions searchOptions;
  searchOptions.memoryBudgetBytes = options.memoryBudgetBytes;
  searchOptions.exactLimit = options.exactLimit;

  std::vector<PlannedFunction> plans;
  bool failed = false;
  for (const ir::Function& fn : module.functions) {
    if (!options.functions.empty() && std::find(options.functions.begin(), options.functions.end(),
                                                fn.name) == options.functions.end())
      continue;
    PlannedFunction plan;
    plan.memoryBudgetBytes =
        options.memoryBudgetBytes > 0 ? options.memoryBudgetBytes : machine.memoryBytes;
    for (const auto& [dim, axes] : pinned.axes)
      plan.pinnedDims.insert(dim);
    Layout layout = pinned;
    // An explicit budget is checked even when nothing is searched (one candidate: the layout).
    if (!toSearch.empty() || options.memoryBudgetBytes > 0) {
      std::optional<SearchResult> search =
          searchLayout(module, fn, mesh, machine, pinned, toSearch, searchOptions, diag);
      if (!search) {
        failed = true;
        continue;
      }
      layout = search->layout;
      if (!toSearch.empty()) plan.search = std::move(*search);
    }
    std::optional<SpmdFunction> spmd = lowerToSpmd(module, fn, mesh, layout, machine, diag);
    if (!spmd) {
      failed = true;
      continue;
    }
    plan.spmd = std::move(*spmd);
    plans.push_back(std::move(plan));
  }
  if (failed) return std::nullopt;
  return plans;
}

std::optional<std::vector<PlannedFunction>>
planModule(const ir::Module& module, const PlannerOptions& options, DiagEngine& diag) {
  llvm::Expected<Machine> machine = loadMachine(options.machine);
  if (!machine) {
    llvm::WithColor::error(llvm::errs(), "meshc") << llvm::toString(machine.takeError()) << "\n";
    return std::nullopt;
  }
  return planModule(module, *machine, options, diag);
}

} // namespace meshc::plan
