// The joint search of stages, recompute, microbatches and ZeRO under a memory budget
// (JointSearch.h).
#include "driver/JointSearch.h"

#include "driver/InnerModules.h"
#include "driver/Microbatches.h"
#include "driver/PlanPipeline.h"
#include "planner/Microbatching.h"
#include "planner/Planner.h"
#include "train/Recompute.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>
#include <llvm/ADT/StringExtras.h>
#include <llvm/Support/Threading.h>
#include <llvm/Support/WithColor.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <tuple>

namespace meshc {
namespace {

bool selected(const PipelineOptions& options, const ir::Function& fn) {
  return options.functions.empty() || llvm::is_contained(options.functions, fn.name);
}

/// The dim microbatches split: the first dim of the first input that every input has and no
/// param has (the batch); "" when there is none.
std::string microbatchDimOf(const ir::Function& fn) {
  if (fn.inputs.empty()) return "";
  for (const ir::Dim& dim : fn.inputs.front().type.dims) {
    auto has = [&](const ir::TensorType& type) { return type.hasDim(dim.name); };
    if (llvm::all_of(fn.inputs, [&](const ir::InputInfo& in) { return has(in.type); }) &&
        llvm::none_of(fn.params, [&](const ir::ParamInfo& p) { return has(p.type); }))
      return dim.name;
  }
  return "";
}

/// The microbatch counts worth planning, ascending: the divisors of the dim's extent per device
/// (its size over its pinned axes; when the search lays it out, over the largest mesh axis that
/// divides it, so that a microbatch can still be split as the whole batch would be).
std::vector<int64_t> microbatchCounts(const ir::Module& module, const std::string& dim) {
  if (dim.empty()) return {1};
  int64_t size = module.dims.at(dim), split = 1;
  bool pinned = false;
  for (const ir::DimLayout& entry : module.layout)
    if (entry.dim == dim && !entry.isAuto) {
      pinned = true;
      split = plan::splitFactor(plan::Mesh{module.mesh}, entry.axes);
    }
  if (!pinned)
    for (const ir::MeshAxis& axis : module.mesh)
      if (size % axis.size == 0) split = std::max(split, axis.size);
  int64_t extent = split > 0 ? size / split : size;
  std::vector<int64_t> counts;
  for (int64_t k = 1; k <= extent; ++k)
    if (extent % k == 0) counts.push_back(k);
  return counts;
}

/// Whether `a` is preferred to `b`: the faster predicted step; on a tie (relative 1e-9), the
/// simpler combination: no stages, then fewer, then the lower ZeRO stage, then fewer
/// microbatches, then no recomputation.
bool faster(const plan::JointCandidate& a, const plan::JointCandidate& b) {
  double tolerance = 1e-9 * std::max(a.stepSeconds, b.stepSeconds);
  if (std::abs(a.stepSeconds - b.stepSeconds) > tolerance) return a.stepSeconds < b.stepSeconds;
  return std::make_tuple(a.stages, a.zeroStage, a.microbatches, !a.recompute.empty()) <
         std::make_tuple(b.stages, b.zeroStage, b.microbatches, !b.recompute.empty());
}

/// One planned combination with what code generation needs for it: without stages its plan,
/// with stages how to plan them (PlanPipeline.h and StagedCode.h plan the stage layout).
struct Planned {
  plan::JointCandidate candidate;
  plan::PlannedFunction plan;
  std::shared_ptr<const ir::Module> module; // holds the function the plan was made from
  std::optional<JointStages> stages;
};

/// The ways `fn` can be split into pipeline stages on `module`'s mesh: for every mesh axis that
/// no pinned dim uses, every stage count p > 1 dividing both its size and the count of the
/// block's one repeat; the stages are the axis itself (p its size) or a new axis `stage` split
/// off it, major (the axis keeps the rest). Empty, with the reason in `why`, when none can be.
std::vector<plan::JointCandidate> stageSplits(const ir::Module& module, const ir::Function& fn,
                                              std::string& dim, std::string& why) {
  std::vector<plan::JointCandidate> splits;
  if (fn.repeats.size() != 1) {
    why = fmt::format("stages: the block has {} repeats, not one", fn.repeats.size());
    return splits;
  }
  dim = fn.repeats.front().dim;
  int64_t layers = module.dims.at(dim);
  std::set<std::string> pinnedAxes;
  for (const ir::DimLayout& entry : module.layout) {
    if (entry.isAuto) continue;
    if (entry.dim == dim) {
      why = fmt::format("stages: the layout pins '{}'", dim);
      return splits;
    }
    pinnedAxes.insert(entry.axes.begin(), entry.axes.end());
  }
  bool stageNameFree =
      llvm::none_of(module.mesh, [](const ir::MeshAxis& axis) { return axis.name == "stage"; });
  for (const ir::MeshAxis& axis : module.mesh) {
    if (pinnedAxes.count(axis.name)) continue;
    for (int64_t p = 2; p <= axis.size; ++p) {
      if (axis.size % p != 0 || layers % p != 0) continue;
      if (p < axis.size && !stageNameFree) continue;
      plan::JointCandidate split;
      split.stages = p;
      split.splitAxis = axis.name;
      split.stageAxis = p == axis.size ? axis.name : "stage";
      splits.push_back(split);
    }
  }
  if (splits.empty())
    why = fmt::format("stages: no mesh axis free of pinned dims has a size sharing a factor with "
                      "'{}' ({})",
                      dim, layers);
  return splits;
}

/// `module` with `split`'s stages: its mesh with the stage axis, its layout with `dim` over it;
/// no functions yet (the stage plans load their own; the split chosen gets `fn`).
ir::Module stagedModule(const ir::Module& module, const ir::Function& fn,
                        const plan::JointCandidate& split, const std::string& dim,
                        ir::DimLayout& stage) {
  ir::Module staged;
  staged.meshName = module.meshName;
  staged.dims = module.dims;
  staged.autoLayout = module.autoLayout;
  for (const ir::MeshAxis& axis : module.mesh) {
    if (axis.name != split.splitAxis) {
      staged.mesh.push_back(axis);
    } else if (split.stageAxis == axis.name) {
      staged.mesh.push_back(axis);
    } else {
      staged.mesh.push_back({split.stageAxis, split.stages});
      staged.mesh.push_back({axis.name, axis.size / split.stages});
    }
  }
  for (const ir::DimLayout& entry : module.layout)
    if (entry.dim != dim) staged.layout.push_back(entry);
  // No pinned split of the layers: the planner balances them.
  stage = ir::DimLayout{dim, {split.stageAxis}, false, fn.loc, {}};
  staged.layout.push_back(stage);
  return staged;
}

/// One row of a stage split (JointSearch::splitRows): its candidate and the stage layout that
/// plans it, or only a note for the report's notTried.
struct SplitRow {
  std::string note; // not empty: the row is this note
  plan::JointCandidate candidate;
  JointStages staged; // what plans the candidate, should it be chosen (rows that fit only)
};

/// The stage splits of a joint search and their rows, planned by whichever thread takes a split
/// first (the workers from the start of the search, the search's own thread after the
/// combinations); the report takes the rows in the splits' order.
struct StageWork {
  std::string dim, why; // the repeat's dim; why no split can be tried
  std::vector<plan::JointCandidate> splits;
  std::vector<std::vector<SplitRow>> rows; // by split, each written by the thread that took it
  std::atomic<size_t> next{0};             // the first split no thread has taken
  std::vector<std::thread> workers;

  void join() {
    for (std::thread& worker : workers)
      worker.join();
    workers.clear();
  }
  /// An early exit (an exception through the search) still waits for the workers, which
  /// read the search; they take no more splits.
  ~StageWork() {
    next = splits.size();
    join();
  }
};

class JointSearch {
public:
  /// `stages`: pipeline stages (with or without recomputation) may be tried.
  JointSearch(const ir::Module& module, const PipelineOptions& options,
              const plan::Machine& machine, double budget, DiagEngine& diag, const char* argv0,
              bool stages)
      : module_(module), options_(options), machine_(machine), budget_(budget), diag_(diag),
        argv0_(argv0), quiet_(diag.sources(), llvm::nulls()), stages_(stages) {}

  /// Plans the combinations of `fn` (which does not fit alone) and returns the fastest that
  /// fits, with the report; nullopt when none does (`smallest` then has the least need).
  /// `plain`: the block's plans without recomputation or microbatches, stage 0 (no ZeRO) first;
  /// with `plainHasZero`, the ZeRO stages after it as planCombination plans them (3, 2, 1 down
  /// to the first over the budget), else they are planned here.
  std::optional<Planned> run(const ir::Function& fn, std::vector<plan::PlannedFunction> plain,
                             bool plainHasZero, double& smallest) {
    plan::JointSearchReport report;
    report.budgetBytes = budget_;
    report.microbatchDim = microbatchDimOf(fn);
    // The stage splits are planned from now on by other threads, if any.
    std::unique_ptr<StageWork> stageWork = startStages(fn, report.microbatchDim);
    std::vector<int64_t> counts = microbatchCounts(module_, report.microbatchDim);
    std::vector<std::string> recomputes = {""};
    if (std::string layer = train::repeatedLayerDef(fn); !layer.empty()) {
      recomputes.push_back(layer);
      report.notTried.push_back(fmt::format(
          "recomputing only some defs inside '{}' (only its calls as a whole are considered)",
          layer));
    } else {
      report.notTried.push_back("recompute: the block repeats no def");
    }
    if (report.microbatchDim.empty())
      report.notTried.push_back("microbatches: no dim is in every input and in no param");
    // The combinations are one block at other microbatch sizes, recomputed or not: each one's
    // search starts where the one before ended (the plain plan's fastest layout first).
    searchStart_.reset();
    plainModules_.clear();
    if (!plain.empty() && plain.front().search) searchStart_ = plain.front().search->layout;
    std::optional<Planned> best;
    int64_t plainFitsAt = std::numeric_limits<int64_t>::max();
    for (const std::string& recompute : recomputes) {
      for (int64_t count : counts) {
        // More microbatches at the same recompute only add time (the loop's collectives and
        // weight reads repeat, GEMMs shrink), and recomputing adds a forward: neither is tried
        // past the first count that fits without recomputation / with it.
        if (!recompute.empty() && count > plainFitsAt) {
          report.notTried.push_back(
              fmt::format("recompute {} with more than {} microbatches: that many fit without it",
                          recompute, plainFitsAt));
          break;
        }
        bool fits = false;
        bool first = recompute.empty() && count == 1; // planned already: `plain`
        std::vector<Planned> combination;
        if (!first || !plainHasZero)
          combination =
              planCombination(fn, recompute, count, report.microbatchDim,
                              first ? std::vector<int>{3, 2, 1} : std::vector<int>{3, 2, 1, 0});
        if (first) {
          std::vector<Planned> planned;
          for (plan::PlannedFunction& plan : plain)
            planned.push_back(plannedOf(std::move(plan), "", 1));
          combination.insert(combination.begin(), std::make_move_iterator(planned.begin()),
                             std::make_move_iterator(planned.end()));
        }
        if (!combination.empty() && combination.back().candidate.zeroStage > 0 &&
            !combination.back().candidate.fits)
          report.notTried.push_back(
              fmt::format("{}{} microbatch{}: ZeRO stages below {}, as stage {} is over the budget",
                          recompute.empty() ? "" : fmt::format("recompute {}, ", recompute), count,
                          count == 1 ? "" : "es", combination.back().candidate.zeroStage,
                          combination.back().candidate.zeroStage));
        for (Planned& planned : combination) {
          size_t index = report.considered.size();
          report.considered.push_back(planned.candidate);
          smallest = std::min(smallest, planned.candidate.memoryBytes);
          if (!planned.candidate.fits) continue;
          fits = true;
          if (!best || faster(planned.candidate, best->candidate)) {
            best = std::move(planned);
            report.chosen = int(index);
          }
        }
        if (!fits) continue;
        if (recompute.empty()) plainFitsAt = count;
        if (count != counts.back())
          report.notTried.push_back(
              fmt::format("{}more than {} microbatches: {} already fit{}",
                          recompute.empty() ? "" : fmt::format("recompute {} with ", recompute),
                          count, count, count == 1 ? "s" : ""));
        break;
      }
    }
    plainModules_.clear(); // whole blocks' modules: not kept through the stage splits
    if (!report.considered.empty()) report.plainMemoryBytes = report.considered.front().memoryBytes;
    considerStages(fn, report, best, smallest, *stageWork);
    if (!best) return std::nullopt;
    if (best->stages) {
      // The only function planned: a copy of the whole block, made for the split chosen only
      // (a split better than those before it is seen up to six times).
      best->stages->module.functions = {fn};
      best->stages->report = std::move(report);
    } else {
      best->plan.joint = std::move(report);
    }
    return best;
  }

private:
  /// Pipeline stages (stageSplits), each split with the microbatch count and recomputation
  /// planPipelines would choose for it (PlanPipeline.h: the repeat's layers balanced over the
  /// stages, the bubble (p - 1) / (m + p - 1), 1F1B keeping at most p microbatches in flight);
  /// `best` becomes the fastest split that fits when it is faster. A split that cannot be
  /// planned is left out, noted. The splits not planned yet by `work`'s workers (startStages) are
  /// planned here; the rows are then taken in the splits' order, whoever planned them.
  void considerStages(const ir::Function& fn, plan::JointSearchReport& report,
                      std::optional<Planned>& best, double& smallest, StageWork& work) {
    if (!stages_) {
      report.notTried.push_back(
          "stages: other functions are planned too (--function selects the block alone)");
      return;
    }
    if (!work.why.empty()) report.notTried.push_back(work.why);
    planSplits(work, fn, report.microbatchDim, quiet_, unzeroed_);
    work.join();
    for (std::vector<SplitRow>& rows : work.rows)
      for (SplitRow& row : rows) {
        if (!row.note.empty()) {
          report.notTried.push_back(std::move(row.note));
          continue;
        }
        size_t index = report.considered.size();
        report.considered.push_back(row.candidate);
        smallest = std::min(smallest, row.candidate.memoryBytes);
        if (!row.candidate.fits || (best && !faster(row.candidate, best->candidate))) continue;
        Planned planned;
        planned.candidate = row.candidate;
        planned.stages = std::move(row.staged);
        best = std::move(planned);
        report.chosen = int(index);
      }
  }

  /// The stage splits of `fn` (none when stages are not tried), and with more than one job
  /// (PipelineOptions::planJobs) workers that start planning them now, while the combinations
  /// are planned: a split's rows depend on nothing the combinations or the other splits change
  /// (each worker keeps its own UnzeroedPlans, whose plans are those a load would make).
  std::unique_ptr<StageWork> startStages(const ir::Function& fn, const std::string& microbatchDim) {
    auto work = std::make_unique<StageWork>();
    if (!stages_) return work;
    work->splits = stageSplits(module_, fn, work->dim, work->why);
    work->rows.resize(work->splits.size());
    // One per core this process may run on (its affinity: a meshc pinned to one core plans
    // on one thread).
    int64_t jobs = options_.planJobs > 0
                       ? options_.planJobs
                       : std::max<int64_t>(1, llvm::hardware_concurrency().compute_thread_count());
    size_t workers = size_t(std::min<int64_t>(jobs - 1, int64_t(work->splits.size())));
    for (size_t i = 0; i < workers; ++i)
      work->workers.emplace_back([this, &work = *work, &fn, microbatchDim] {
        // Its own diagnostics (their count); the SourceMgr is shared, under its lock.
        DiagEngine quiet(diag_.sources(), llvm::nulls());
        planSplits(work, fn, microbatchDim, quiet, std::make_shared<UnzeroedPlans>());
      });
    return work;
  }

  /// Plans the splits of `work` that no thread has taken yet, one at a time.
  void planSplits(StageWork& work, const ir::Function& fn, const std::string& microbatchDim,
                  DiagEngine& quiet, const std::shared_ptr<UnzeroedPlans>& unzeroed) const {
    for (size_t i = work.next++; i < work.splits.size(); i = work.next++)
      work.rows[i] = splitRows(fn, work.splits[i], work.dim, microbatchDim, quiet, unzeroed);
  }

  /// One stage split's rows: without ZeRO first; when that does not fit, ZeRO stages 1-3 of
  /// each stage's plan over its data-parallel axes (ascending: the lower stage shards less and
  /// costs less), up to the first that fits. A row that cannot be planned, or a ZeRO stage that
  /// changes nothing (no data-parallel weight to shard), is a note and the last row.
  std::vector<SplitRow> splitRows(const ir::Function& fn, const plan::JointCandidate& split,
                                  const std::string& dim, const std::string& microbatchDim,
                                  DiagEngine& quiet,
                                  const std::shared_ptr<UnzeroedPlans>& unzeroed) const {
    std::vector<SplitRow> rows;
    for (int zero = 0; zero <= 3; ++zero) {
      SplitRow row;
      JointStages& staged = row.staged;
      staged.module = stagedModule(module_, fn, split, dim, staged.stage);
      staged.options = options_;
      staged.options.jointSearch = false;
      staged.options.functions = {fn.name};
      staged.options.memoryBudget = fmt::format("{}", budget_);
      staged.options.zero = zero > 0 ? std::to_string(zero) : "";
      if (!microbatchDim.empty()) staged.options.microbatches = microbatchDim + "=auto";
      std::optional<PipelineChoice> choice;
      std::string what = fmt::format("{} stages over '{}'{}", split.stages, split.stageAxis,
                                     zero > 0 ? fmt::format(" with ZeRO stage {}", zero) : "");
      if (!searchPipeline(staged.module, staged.stage, staged.options, fn, /*tryRecompute=*/true,
                          quiet, argv0_, choice, unzeroed.get()) ||
          !choice) {
        rows.push_back(SplitRow{what + ": cannot be planned", {}, {}});
        break;
      }
      // ZeRO stage 1 needs no more memory than the split without ZeRO (the first row): nothing
      // to shard.
      if (zero == 1 && rows.front().candidate.memoryBytes <= choice->memoryBytes) {
        rows.push_back(SplitRow{what + ": it saves no memory (no data-parallel weight)", {}, {}});
        break;
      }
      row.candidate = split;
      row.candidate.microbatches = choice->microbatches;
      row.candidate.recompute = llvm::join(choice->recompute, ", ");
      row.candidate.zeroStage = zero;
      row.candidate.stepSeconds = choice->stepSeconds;
      row.candidate.memoryBytes = choice->memoryBytes;
      row.candidate.fits = choice->fits;
      bool fits = choice->fits;
      if (fits) {
        // The stage layout's plan runs these microbatches with this recomputation and ZeRO
        // stage.
        staged.options.microbatches =
            microbatchDim.empty() ? "" : fmt::format("{}={}", microbatchDim, choice->microbatches);
        staged.options.recompute = choice->recompute;
        staged.plans = unzeroed;
      } else {
        row.staged = JointStages{}; // only a row that fits can be chosen (considerStages)
      }
      rows.push_back(std::move(row));
      if (fits) break;
    }
    return rows;
  }

  /// `fn` with `recompute`'s calls recomputed and `count` microbatches of `dim`, planned with
  /// ZeRO stages 0-3; errors (a combination that cannot be built) leave it out, noted.
  /// A candidate of the report for `plan`.
  Planned plannedOf(plan::PlannedFunction plan, const std::string& recompute, int64_t count,
                    std::shared_ptr<const ir::Module> module = nullptr) {
    Planned planned;
    planned.candidate.recompute = recompute;
    planned.candidate.microbatches = count;
    planned.candidate.zeroStage = plan.zero ? plan.zero->stage : 0;
    planned.candidate.stepSeconds = plan.spmd.summary.stepSeconds;
    planned.candidate.memoryBytes = plan.spmd.memory.total();
    planned.candidate.fits = planned.candidate.memoryBytes <= budget_;
    planned.plan = std::move(plan);
    planned.module = module ? module : std::shared_ptr<const ir::Module>(&module_, [](auto*) {});
    return planned;
  }

  std::vector<Planned> planCombination(const ir::Function& fn, const std::string& recompute,
                                       int64_t count, const std::string& dim,
                                       const std::vector<int>& zeroStages) {
    PipelineOptions inner = options_;
    inner.jointSearch = false;
    auto trained = std::make_shared<ir::Module>();
    if (count > 1) {
      if (!recompute.empty()) inner.recompute = {recompute};
      // Recomputing, the module at this count without it (planned before) with the calls
      // recomputed: what loading it again (sema, autodiff) makes (train::applyRecompute).
      std::optional<ir::Module> micro;
      std::vector<size_t> forwardOps;
      auto plain = plainModules_.find(count);
      if (!recompute.empty() && plain != plainModules_.end() && modulesDerivable(options_)) {
        micro = *plain->second.first;
        if (!train::applyRecompute(*micro, inner.recompute, plain->second.second)) micro.reset();
      }
      if (!micro)
        micro = loadMicrobatchModule(module_, inner, {fn.name}, dim, count, quiet_, argv0_,
                                     &forwardOps);
      if (!micro) return {};
      *trained = std::move(*micro);
      if (recompute.empty() && !train::repeatedLayerDef(fn).empty())
        plainModules_[count] = {trained, std::move(forwardOps)};
    } else {
      *trained = module_;
      if (!recompute.empty()) {
        for (ir::Function& copy : trained->functions)
          if (copy.name == fn.name) {
            train::markRecompute(copy, recompute);
            train::recomputeActivations(copy);
          }
      }
    }
    plan::PlannerOptions plannerOptions;
    plannerOptions.machine = options_.machine;
    plannerOptions.memoryBudgetBytes = budget_;
    plannerOptions.searchStart = searchStart_;
    // Each plan microbatched as it comes, so that the ZeRO stages (in decreasing order) stop
    // at the first whose step, accumulators included, is over the budget.
    // A plan that cannot be microbatched keeps microbatching.count 1 and is left out.
    auto microbatch = [&](plan::PlannedFunction& plan) {
      if (count > 1)
        if (llvm::Error error = plan::applyMicrobatching(plan.spmd, dim, count, machine_)) {
          llvm::consumeError(std::move(error));
          return false;
        }
      return plan.spmd.memory.total() <= budget_;
    };
    std::optional<std::vector<plan::PlannedFunction>> plans = plan::planZeroCandidates(
        *trained, machine_, plannerOptions, fn.name, zeroStages, microbatch, quiet_);
    std::vector<Planned> result;
    if (!plans) return result;
    if (!plans->empty() && plans->front().search) searchStart_ = plans->front().search->layout;
    for (plan::PlannedFunction& plan : *plans)
      if (count == 1 || plan.spmd.microbatching.count == count)
        result.push_back(plannedOf(std::move(plan), recompute, count, trained));
    return result;
  }

  const ir::Module& module_;
  const PipelineOptions& options_;
  const plan::Machine& machine_;
  double budget_;
  DiagEngine& diag_;
  const char* argv0_;
  DiagEngine quiet_;
  bool stages_;
  /// The stage splits' plans without ZeRO, which their retries with ZeRO stages and the chosen
  /// split's report (JointStages::plans) reuse.
  std::shared_ptr<UnzeroedPlans> unzeroed_ = std::make_shared<UnzeroedPlans>();
  /// The layout the last combination's search found, where the next one's starts.
  std::optional<plan::Layout> searchStart_;
  /// The combinations' modules without recomputation by microbatch count, with their op counts
  /// before training (lowerTraining's), from which those with it are derived.
  std::map<int64_t, std::pair<std::shared_ptr<const ir::Module>, std::vector<size_t>>>
      plainModules_;
};

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// The note on stderr that says what the search chose.
void noteChoice(const ir::Function& fn, double budget, const plan::JointSearchReport& report,
                double seconds) {
  llvm::WithColor::note(llvm::errs(), "meshc") << fmt::format(
      "no layout of train block '{}' fits the memory budget of {} alone: planned with {} "
      "(joint search: {} combinations in {:.1f} s)\n",
      fn.name, plan::bytesString(budget),
      plan::jointChoiceText(report.considered[size_t(report.chosen)], report.microbatchDim),
      report.considered.size(), seconds);
}

} // namespace

bool jointSearchApplies(const ir::Module& module, const PipelineOptions& options) {
  if (!options.jointSearch || !options.microbatches.empty() || !options.zero.empty() ||
      !options.recompute.empty() || options.devices != 0)
    return false;
  return llvm::any_of(module.functions, [&](const ir::Function& fn) {
    return fn.kind == ir::Function::Kind::Train && selected(options, fn);
  });
}

std::optional<PlannedModule> planJointly(const ir::Module& module, const PipelineOptions& options,
                                         DiagEngine& diag, const char* argv0,
                                         std::optional<JointStages>* staged) {
  PipelineOptions plain = options;
  plain.jointSearch = false;
  llvm::Expected<plan::Machine> machine = plan::loadMachine(options.machine);
  if (!machine) {
    optionError(llvm::toString(machine.takeError()));
    return std::nullopt;
  }
  double budget = machine->memoryBytes;
  if (!options.memoryBudget.empty() && !parseByteSize(options.memoryBudget, budget))
    return std::nullopt;
  plan::PlannerOptions plannerOptions;
  plannerOptions.machine = options.machine;
  plannerOptions.memoryBudgetBytes = budget;
  // A block's plan without ZeRO that does not fit is only the joint search's first row (its
  // step and memory): not lowered (a whole block, 96 layers for the GPT-3-shaped one).
  plannerOptions.unloweredOverBudget = true;

  auto start = std::chrono::steady_clock::now();
  // Stages are planned for the selected functions together (PlanPipeline.h), so they are tried
  // only for a train block selected alone.
  bool stagesAllowed = staged && llvm::count_if(module.functions, [&](const ir::Function& fn) {
                                   return selected(options, fn);
                                 }) == 1;
  JointSearch search(module, options, *machine, budget, diag, argv0, stagesAllowed);
  std::map<std::string, Planned> chosen;
  // Blocks that fit alone keep the plan that showed it (the usual planning would search the
  // same layout again: the same budget, mesh and options).
  std::map<std::string, plan::PlannedFunction> fitted;
  std::vector<std::string> plainBlocks; // planned as usual: nothing fits
  for (const ir::Function& fn : module.functions) {
    if (fn.kind != ir::Function::Kind::Train || !selected(options, fn)) continue;
    // The fastest layout that fits alone, else the fastest (what the search starts from); when
    // that does not fit, with the same evaluator and the same search of the fastest layout,
    // the ZeRO stages the joint search's first combination (no recomputation, one microbatch)
    // plans (JointSearch::planCombination: 3, 2, 1, down to the first over the budget).
    DiagEngine quiet(diag.sources(), llvm::nulls());
    bool stageZero = true; // the first plan is stage 0's
    auto plainKeepGoing = [&](const plan::PlannedFunction& plan) {
      bool fits = plan.spmd.memory.total() <= budget, zero = !stageZero;
      stageZero = false;
      return zero ? fits : !fits;
    };
    bool plainHasZero = true;
    std::optional<std::vector<plan::PlannedFunction>> alone = plan::planZeroCandidates(
        module, *machine, plannerOptions, fn.name, {0, 3, 2, 1}, plainKeepGoing, quiet);
    if (!alone) { // a ZeRO stage could not be planned: the plain plan alone, as the search did
      plainHasZero = false;
      alone =
          plan::planZeroCandidates(module, *machine, plannerOptions, fn.name, {0}, nullptr, quiet);
    }
    if (!alone || alone->empty()) {
      plainBlocks.push_back(fn.name); // errors not about memory are reported as usual
      continue;
    }
    if (alone->front().spmd.memory.total() <= budget) {
      fitted.emplace(fn.name, std::move(alone->front()));
      continue;
    }
    double smallest = std::numeric_limits<double>::infinity();
    std::optional<Planned> best = search.run(fn, std::move(*alone), plainHasZero, smallest);
    if (best && best->stages) {
      noteChoice(fn, budget, best->stages->report, secondsSince(start));
      *staged = std::move(best->stages);
      return PlannedModule{*machine, {}, std::nullopt};
    }
    if (best) {
      chosen.emplace(fn.name, std::move(*best));
      continue;
    }
    llvm::WithColor::note(llvm::errs(), "meshc")
        << fmt::format("with stages, recomputation, microbatches and ZeRO, train block '{}' "
                       "needs at least {} per device\n",
                       fn.name, plan::bytesString(smallest));
    // The plain plan's error; without --memory-budget the plain plan, over the machine's memory
    // as it has always been reported.
    plainBlocks.push_back(fn.name);
  }
  double seconds = secondsSince(start);

  // The other functions as usual.
  // Every plan is finished once, together, at the end (a fault is injected into whichever plan
  // has its target).
  PipelineOptions rest = plain;
  rest.functions.clear();
  rest.injectFault.clear();
  rest.verifyEach = false;
  for (const ir::Function& fn : module.functions)
    if (selected(options, fn) && !chosen.count(fn.name) && !fitted.count(fn.name))
      rest.functions.push_back(fn.name);
  PlannedModule result{*machine, {}, std::nullopt};
  std::vector<plan::PlannedFunction> others;
  if (!rest.functions.empty()) {
    std::optional<PlannedModule> planned = planModule(module, rest, diag, argv0);
    if (!planned) return std::nullopt;
    others = std::move(planned->plans);
  }
  for (auto& [name, plan] : fitted)
    others.push_back(std::move(plan));
  std::vector<const ir::Function*> replacements;
  for (const ir::Function& fn : module.functions) {
    if (auto it = chosen.find(fn.name); it != chosen.end()) {
      noteChoice(fn, budget, *it->second.plan.joint, seconds);
      replacements.push_back(it->second.module->findFunction(fn.name));
      result.plans.push_back(std::move(it->second.plan));
      continue;
    }
    for (plan::PlannedFunction& other : others)
      if (other.spmd.name == fn.name) result.plans.push_back(std::move(other));
  }
  if (!finishPlans(result.plans, options)) return std::nullopt;
  if (!chosen.empty()) result.codeModule = codeModuleWith(module, replacements);
  return result;
}

} // namespace meshc
