#include "planner/Planner.h"
#include "train/OrderFactoredSums.h"

#include <llvm/ADT/STLExtras.h>
#include <llvm/Support/WithColor.h>

#include <cmath>
#include <functional>
#include <limits>
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

/// Every assignment of sizes >= 1 to the axes of `axes` whose product is `devices`, in
/// lexicographic order of the sizes (major axis first).
std::vector<Mesh> meshFactorizations(const std::vector<ir::MeshAxis>& axes, int64_t devices) {
  std::vector<Mesh> meshes;
  Mesh current;
  current.axes = axes;
  std::function<void(size_t, int64_t)> assign = [&](size_t axis, int64_t remaining) {
    if (axis + 1 == axes.size()) {
      current.axes[axis].size = remaining;
      meshes.push_back(current);
      return;
    }
    for (int64_t size = 1; size <= remaining; ++size)
      if (remaining % size == 0) {
        current.axes[axis].size = size;
        assign(axis + 1, remaining / size);
      }
  };
  if (!axes.empty()) assign(0, devices);
  return meshes;
}

/// Whether every pinned dim divides by its axes on `mesh` (a factorization may not fit the
/// layout the program wrote for another mesh).
bool pinnedFits(const ir::Module& module, const Mesh& mesh, const Layout& pinned) {
  for (const auto& [dim, axes] : pinned.axes) {
    auto size = module.dims.find(dim);
    int64_t factor = splitFactor(mesh, axes);
    if (size != module.dims.end() && (factor == 0 || size->second % factor != 0)) return false;
  }
  return true;
}

/// What a ZeRO form's report compares it with: the plan without ZeRO, as its SPMD function or,
/// for a train block with updates (whose rewrite always applies), as the step and memory its
/// search costed exactly (the same figures: the exact costing lowers and merges as the
/// lowering does), so that a combination whose ZeRO stages stop before stage 0 (the joint
/// search's) need not lower the whole block without ZeRO for two numbers.
struct Unzeroed {
  const SpmdFunction* spmd = nullptr;
  double stepSeconds = 0, totalBytes = 0; // without `spmd`
};

/// Replaces `plan`'s SPMD function (lowered from `fn` under `layout`) by its ZeRO form and
/// reports both; a function with nothing to shard (a program) keeps its plan. With `unzeroed`,
/// that is the plan without ZeRO and `plan`'s own SPMD function is empty (a plan copied without
/// the ops the ZeRO form replaces; given `unzeroed.spmd` when it is kept, which a function with
/// nothing to shard then takes).
bool applyZero(const ir::Module& module, const ir::Function& fn, const Mesh& mesh,
               const Machine& machine, const Layout& layout, int stage, PlannedFunction& plan,
               DiagEngine& diag, const Unzeroed* unzeroed = nullptr) {
  std::optional<ZeroRewrite> rewrite = rewriteForZero(fn, mesh, layout, stage);
  if (!rewrite) {
    if (unzeroed) {
      if (!unzeroed->spmd) return false; // callers give figures only where the rewrite applies
      plan.spmd = *unzeroed->spmd;
    }
    return true;
  }
  const SpmdFunction* before = unzeroed ? unzeroed->spmd : &plan.spmd;
  double totalBefore = before ? before->memory.total() : unzeroed->totalBytes;
  double stepBefore = before ? before->summary.stepSeconds : unzeroed->stepSeconds;
  std::optional<SpmdFunction> spmd =
      lowerToSpmd(module, rewrite->fn, mesh, rewrite->layout, machine, diag);
  if (!spmd) return false;
  restoreZeroDims(*spmd, *rewrite, layout);
  ZeroReport& report = rewrite->report;
  report.totalBefore = totalBefore;
  report.stepBefore = stepBefore;
  report.totalAfter = spmd->memory.total();
  report.stepAfter = spmd->summary.stepSeconds;
  plan.spmd = std::move(*spmd);
  plan.zero = std::move(report);
  return true;
}

/// The searched layout of `fn` on `mesh` and its SPMD form; nullopt after reporting an error.
/// A plan to fill in: the memory budget it is held to and the dims the layout pins.
PlannedFunction emptyPlan(const Layout& pinned, double memoryBudgetBytes) {
  PlannedFunction plan;
  plan.memoryBudgetBytes = memoryBudgetBytes;
  for (const auto& [dim, axes] : pinned.axes)
    plan.pinnedDims.insert(dim);
  return plan;
}

std::optional<PlannedFunction> planLayout(const ir::Module& module, const ir::Function& fn,
                                          const Mesh& mesh, const Machine& machine,
                                          const PlannerOptions& options, const Layout& pinned,
                                          const std::vector<std::string>& toSearch,
                                          DiagEngine& diag) {
  SearchOptions searchOptions;
  searchOptions.memoryBudgetBytes = options.memoryBudgetBytes;
  searchOptions.exactLimit = options.exactLimit;
  searchOptions.start = options.searchStart;
  searchOptions.skipIdleBounds = options.skipIdleBounds;
  searchOptions.boundTally = options.boundTally;
  PlannedFunction plan = emptyPlan(pinned, options.memoryBudgetBytes > 0 ? options.memoryBudgetBytes
                                                                         : machine.memoryBytes);
  Layout layout = pinned;
  // With ZeRO (given, or to be chosen under an explicit budget) a layout over the budget without
  // it may fit with it: such a failure is quiet and retried below.
  bool zeroTrain = fn.kind == ir::Function::Kind::Train && ir::hasOptimizerUpdates(fn);
  bool zeroMayFit = zeroTrain && (options.zeroStage > 0 || options.memoryBudgetBytes > 0);
  DiagEngine quiet(diag.sources(), llvm::nulls());
  bool overBudget = false;
  // An explicit budget is checked even when nothing is searched (one candidate: the layout).
  // The search's evaluator lowers the layout it found (its memo tables are built already).
  std::optional<PlanEvaluator> evaluator;
  if (!toSearch.empty() || options.memoryBudgetBytes > 0) {
    evaluator.emplace(module, fn, mesh, machine);
    // With ZeRO to fall back on, a failure is quiet (an error is reported by a search of its
    // own below): whether a layout fits is all this search is asked.
    SearchOptions firstOptions = searchOptions;
    firstOptions.exactNeed = !zeroMayFit;
    std::optional<SearchResult> search =
        searchLayout(*evaluator, module, fn, mesh, machine, pinned, toSearch, firstOptions,
                     zeroMayFit ? quiet : diag);
    if (!search && zeroMayFit) { // the fastest layout whatever its memory, then ZeRO
      overBudget = true;
      SearchOptions unbounded = searchOptions;
      unbounded.memoryBudgetBytes = std::numeric_limits<double>::max();
      search =
          searchLayout(*evaluator, module, fn, mesh, machine, pinned, toSearch, unbounded, quiet);
    }
    if (!search) // report why
      return searchLayout(*evaluator, module, fn, mesh, machine, pinned, toSearch, searchOptions,
                          diag),
             std::nullopt;
    layout = search->layout;
    if (!toSearch.empty()) plan.search = std::move(*search);
  }
  std::optional<SpmdFunction> spmd = evaluator
                                         ? evaluator->lower(layout, diag)
                                         : lowerToSpmd(module, fn, mesh, layout, machine, diag);
  if (!spmd) return std::nullopt;
  plan.spmd = std::move(*spmd);
  if (options.zeroStage > 0 &&
      !applyZero(module, fn, mesh, machine, layout, options.zeroStage, plan, diag))
    return std::nullopt;
  if (!overBudget) return plan;
  // No layout fits without ZeRO: the smallest stage that fits, when none was given.
  double need = plan.spmd.memory.total();
  int needStage = options.zeroStage;
  for (int stage = 1; stage <= 3 && options.zeroStage == 0; ++stage) {
    PlannedFunction candidate = plan;
    if (!applyZero(module, fn, mesh, machine, layout, stage, candidate, diag)) return std::nullopt;
    need = candidate.spmd.memory.total();
    needStage = stage;
    if (need > plan.memoryBudgetBytes) continue;
    candidate.zero->chosen = true;
    return candidate;
  }
  if (need <= plan.memoryBudgetBytes) return plan;
  searchLayout(module, fn, mesh, machine, pinned, toSearch, searchOptions, diag);
  llvm::WithColor::note(llvm::errs(), "meshc")
      << fmt::format("with ZeRO stage {}, train block '{}' needs {} per device\n", needStage,
                     fn.name, bytesString(need));
  return std::nullopt;
}

/// A plan and the function it was made from: `fn` itself, or a copy of it with Adafactor's
/// clipping sums in another order (`reordered`).
struct OrderedPlan {
  std::optional<PlannedFunction> plan;
  std::optional<ir::Function> reordered;
};

/// Adafactor's clipping sums run over a factored dim the layout splits first
/// (train/OrderFactoredSums.h). The training phase ordered them for the module's pinned dims; a
/// searched layout may split the other factored dim of a weight, and the sum then costs a second
/// all-reduce round. So `fn` is planned by `planOf`, then again with its sums ordered for the
/// layout found, and so on while a layout calls for an order not planned yet; the fastest plan is
/// kept (ties: the later one, whose order follows the layout before it). Every order computes
/// the same values, and each plan is priced as it is lowered.
OrderedPlan planInFactoredOrder(
    const ir::Function& fn,
    const std::function<std::optional<PlannedFunction>(const ir::Function&)>& planOf) {
  OrderedPlan best{planOf(fn), std::nullopt};
  std::vector<std::vector<std::string>> planned = {train::factoredSumOrder(fn)};
  if (!best.plan || planned.front().empty()) return best;
  ir::Function ordered = fn;
  for (std::optional<PlannedFunction> last = best.plan; last;) {
    const SpmdFunction& spmd = last->spmd;
    std::vector<std::string> order = train::orderFactoredSums(
        ordered, [&](const ir::TensorType& weight, const std::string& dim) {
          int index = weight.findDim(dim);
          TensorLayout layout = tensorLayoutOf(weight, spmd.layout, spmd.mesh);
          return index >= 0 && splitFactor(spmd.mesh, layout.dimAxes[size_t(index)]) > 1;
        });
    if (llvm::is_contained(planned, order)) break;
    planned.push_back(order);
    last = planOf(ordered);
    if (last && last->spmd.summary.stepSeconds <= best.plan->spmd.summary.stepSeconds)
      best = {last, ordered};
  }
  return best;
}

/// planLayout in the order of Adafactor's clipping sums that its layout calls for.
std::optional<PlannedFunction> planFunction(const ir::Module& module, const ir::Function& fn,
                                            const Mesh& mesh, const Machine& machine,
                                            const PlannerOptions& options, const Layout& pinned,
                                            const std::vector<std::string>& toSearch,
                                            DiagEngine& diag) {
  DiagEngine quiet(diag.sources(), llvm::nulls());
  return planInFactoredOrder(fn,
                             [&](const ir::Function& ordered) {
                               return planLayout(module, ordered, mesh, machine, options, pinned,
                                                 toSearch, &ordered == &fn ? diag : quiet);
                             })
      .plan;
}

/// --devices: plans `fn` on every factorization (errors silenced) and keeps the fastest; ties go
/// to the earlier mesh. Reports ErrNoMeshFits when none can be planned.
std::optional<PlannedFunction> planOnBestMesh(const ir::Module& module, const ir::Function& fn,
                                              const Machine& machine, const PlannerOptions& options,
                                              const Layout& pinned,
                                              const std::vector<std::string>& toSearch,
                                              DiagEngine& diag) {
  std::vector<ir::MeshAxis> axes = module.mesh;
  if (axes.empty()) axes = {{"x", 1}, {"y", 1}};
  std::vector<std::pair<Mesh, double>> candidates;
  std::optional<PlannedFunction> best;
  DiagEngine quiet(diag.sources(), llvm::nulls());
  for (const Mesh& mesh : meshFactorizations(axes, options.devices)) {
    std::optional<PlannedFunction> plan;
    if (pinnedFits(module, mesh, pinned))
      plan = planFunction(module, fn, mesh, machine, options, pinned, toSearch, quiet);
    double seconds = plan ? plan->spmd.summary.stepSeconds : INFINITY;
    candidates.emplace_back(mesh, seconds);
    if (plan && (!best || seconds < best->spmd.summary.stepSeconds)) best = std::move(plan);
  }
  if (!best) {
    std::vector<std::string> names;
    for (const ir::MeshAxis& axis : axes)
      names.push_back(axis.name);
    diag.report(fn.loc.loc, Diag::ErrNoMeshFits, options.devices,
                fmt::format("[{}]", fmt::join(names, ", ")),
                fn.kind == ir::Function::Kind::Train ? "train" : "program", fn.name);
    return std::nullopt;
  }
  best->meshCandidates = std::move(candidates);
  return best;
}

} // namespace

std::optional<std::vector<PlannedFunction>> planModule(const ir::Module& module,
                                                       const Machine& machine,
                                                       const PlannerOptions& options,
                                                       DiagEngine& diag) {
  Layout pinned;
  std::vector<std::string> toSearch;
  splitLayout(module, pinned, toSearch);

  std::vector<PlannedFunction> plans;
  bool failed = false;
  for (const ir::Function& fn : module.functions) {
    if (!options.functions.empty() && std::find(options.functions.begin(), options.functions.end(),
                                                fn.name) == options.functions.end())
      continue;
    std::optional<PlannedFunction> plan =
        options.devices > 0
            ? planOnBestMesh(module, fn, machine, options, pinned, toSearch, diag)
            : planFunction(module, fn, meshOf(module), machine, options, pinned, toSearch, diag);
    if (plan)
      plans.push_back(std::move(*plan));
    else
      failed = true;
  }
  if (failed) return std::nullopt;
  return plans;
}

namespace {

/// planZeroCandidates of `fn`, its sums in the order they are.
std::optional<std::vector<PlannedFunction>>
zeroCandidatesOf(const ir::Module& module, const ir::Function* fn, const Machine& machine,
                 const PlannerOptions& options, const std::vector<int>& zeroStages,
                 const std::function<bool(PlannedFunction&)>& keepGoing, DiagEngine& diag) {
  Layout pinned;
  std::vector<std::string> toSearch;
  splitLayout(module, pinned, toSearch);
  Mesh mesh = meshOf(module);
  SearchOptions searchOptions;
  searchOptions.memoryBudgetBytes =
      options.memoryBudgetBytes > 0 ? options.memoryBudgetBytes : machine.memoryBytes;
  searchOptions.exactLimit = options.exactLimit;
  searchOptions.start = options.searchStart;
  searchOptions.skipIdleBounds = options.skipIdleBounds;
  searchOptions.boundTally = options.boundTally;
  DiagEngine quiet(diag.sources(), llvm::nulls());
  PlanEvaluator evaluator(module, *fn, mesh, machine);
  // The plan of `search`: its SPMD function lowered, or (PlannerOptions::unloweredOverBudget)
  // only the figures a lowering would give.
  auto planOf = [&](const SearchResult& search, bool lower) -> std::optional<PlannedFunction> {
    PlannedFunction plan = emptyPlan(pinned, searchOptions.memoryBudgetBytes);
    if (lower) {
      std::optional<SpmdFunction> spmd = evaluator.lower(search.layout, diag);
      if (!spmd) return std::nullopt;
      plan.spmd = std::move(*spmd);
    } else {
      plan.spmd.name = fn->name;
      plan.spmd.kind = fn->kind;
      plan.spmd.mesh = mesh;
      plan.spmd.layout = search.layout;
      plan.spmd.machineName = machine.name;
      plan.spmd.summary.stepSeconds = search.stepSeconds;
      plan.spmd.memory = search.memory;
    }
    if (!toSearch.empty()) plan.search = search;
    return plan;
  };
  auto lowered = [&](const SearchResult& search) { return planOf(search, true); };
  // Stage 0: the fastest layout that fits without ZeRO, else the fastest (searched lazily).
  std::optional<SearchResult> fastest;
  std::optional<PlannedFunction> fastestPlan;
  auto fastestSearch = [&]() -> bool {
    if (fastest) return true;
    SearchOptions unbounded = searchOptions;
    unbounded.memoryBudgetBytes = std::numeric_limits<double>::max();
    fastest =
        searchLayout(evaluator, module, *fn, mesh, machine, pinned, toSearch, unbounded, diag);
    return fastest.has_value();
  };
  // Lowered only when a plan without ZeRO is asked for (stage 0; the ZeRO forms of a train block
  // need only its figures, Unzeroed).
  auto fastestLayout = [&]() -> bool {
    if (fastestPlan) return true;
    if (fastestSearch()) fastestPlan = lowered(*fastest);
    return fastestPlan.has_value();
  };
  std::vector<PlannedFunction> candidates;
  for (int stage : zeroStages) {
    if (stage <= 0) {
      // Whether a layout fits is all this asks (a failure is quiet): proven none, it stops.
      SearchOptions fittingOptions = searchOptions;
      fittingOptions.exactNeed = false;
      // The fastest layout, when searched already, is the nearest start (it fits, or the
      // descent walks from it into the budget).
      if (fastest) fittingOptions.start = fastest->layout;
      std::optional<SearchResult> fitting = searchLayout(evaluator, module, *fn, mesh, machine,
                                                         pinned, toSearch, fittingOptions, quiet);
      std::optional<PlannedFunction> plan;
      if (fitting)
        plan = lowered(*fitting);
      else if (options.unloweredOverBudget)
        plan = fastestSearch() ? planOf(*fastest, false) : std::nullopt;
      else if (fastestLayout())
        plan = fastestPlan;
      if (!plan) return std::nullopt;
      bool goOn = !keepGoing || keepGoing(*plan);
      candidates.push_back(std::move(*plan));
      if (!goOn) break;
      continue;
    }
    if (!ir::hasOptimizerUpdates(*fn)) continue;
    // The plan but its SPMD function (tens of thousands of ops at 96 layers), which the ZeRO
    // form replaces: the fields lowered() fills. A train block's fastest layout is not lowered
    // for it (Unzeroed) unless stage 0 lowered it already.
    PlannedFunction candidate;
    Unzeroed unzeroed;
    if (fn->kind == ir::Function::Kind::Train && !fastestPlan) {
      if (!fastestSearch()) return std::nullopt;
      candidate = emptyPlan(pinned, searchOptions.memoryBudgetBytes);
      if (!toSearch.empty()) candidate.search = *fastest;
      unzeroed.stepSeconds = fastest->stepSeconds;
      unzeroed.totalBytes = fastest->memory.total();
    } else {
      if (!fastestLayout()) return std::nullopt;
      SpmdFunction kept = std::move(fastestPlan->spmd);
      candidate = *fastestPlan;
      fastestPlan->spmd = std::move(kept);
      unzeroed.spmd = &fastestPlan->spmd;
    }
    if (!applyZero(module, *fn, mesh, machine, fastest->layout, stage, candidate, diag, &unzeroed))
      return std::nullopt;
    if (candidate.zero) candidate.zero->chosen = true;
    bool goOn = !keepGoing || keepGoing(candidate);
    candidates.push_back(std::move(candidate));
    if (!goOn) break;
  }
  return candidates;
}

} // namespace

std::optional<std::vector<PlannedFunction>>
planZeroCandidates(const ir::Module& module, const Machine& machine, const PlannerOptions& options,
                   const std::string& function, const std::vector<int>& zeroStages,
                   const std::function<bool(PlannedFunction&)>& keepGoing, DiagEngine& diag) {
  const ir::Function* fn = module.findFunction(function);
  if (!fn) return std::nullopt;
  if (train::factoredSumOrder(*fn).empty())
    return zeroCandidatesOf(module, fn, machine, options, zeroStages, keepGoing, diag);
  // The order of Adafactor's sums follows stage 0's layout (planInFactoredOrder); the stages
  // asked for are then planned in it.
  DiagEngine quiet(diag.sources(), llvm::nulls());
  OrderedPlan stage0 =
      planInFactoredOrder(*fn, [&](const ir::Function& ordered) -> std::optional<PlannedFunction> {
        std::optional<std::vector<PlannedFunction>> plans =
            zeroCandidatesOf(module, &ordered, machine, options, {0}, nullptr, quiet);
        if (!plans || plans->empty()) return std::nullopt;
        return std::move(plans->front());
      });
  const ir::Function* ordered = stage0.reordered ? &*stage0.reordered : fn;
  if (!stage0.plan || zeroStages.empty() || zeroStages.front() > 0)
    return zeroCandidatesOf(module, ordered, machine, options, zeroStages, keepGoing, diag);
  // Stage 0 is the plan just made (not planned again); the stages after it in its order.
  std::vector<PlannedFunction> plans{std::move(*stage0.plan)};
  if ((keepGoing && !keepGoing(plans.front())) || zeroStages.size() == 1) return plans;
  std::optional<std::vector<PlannedFunction>> more =
      zeroCandidatesOf(module, ordered, machine, options,
                       std::vector<int>(zeroStages.begin() + 1, zeroStages.end()), keepGoing, diag);
  if (!more) return std::nullopt;
  plans.insert(plans.end(), std::make_move_iterator(more->begin()),
               std::make_move_iterator(more->end()));
  return plans;
}

bool applyZeroStage(const ir::Module& module, const ir::Function& fn, const Machine& machine,
                    int stage, PlannedFunction& plan, DiagEngine& diag) {
  // The layout planLayout passes applyZero is the one the plan was lowered under.
  Layout layout = plan.spmd.layout;
  return applyZero(module, fn, meshOf(module), machine, layout, stage, plan, diag);
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
