#include "driver/PlanPipeline.h"

#include "driver/Driver.h"
#include "driver/PlaceRest.h"
#include "driver/StageMemory.h"
#include "planner/PipelineModel.h"
#include "planner/PlanReport.h"
#include "planner/Planner.h"
#include "planner/Reshard.h"
#include "train/OrderFactoredSums.h"
#include "train/Recompute.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <llvm/ADT/STLExtras.h>
#include <llvm/ADT/StringExtras.h>
#include <llvm/Support/WithColor.h>

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <utility>

namespace meshc {
namespace {

/// The selected functions that the stages apply to.
std::vector<const ir::Function*> selected(const ir::Module& module,
                                          const PipelineOptions& options) {
  std::vector<const ir::Function*> result;
  for (const ir::Function& fn : module.functions)
    if (options.functions.empty() || llvm::is_contained(options.functions, fn.name))
      result.push_back(&fn);
  return result;
}

bool isRepeatDim(const ir::Module& module, const PipelineOptions& options, const std::string& dim) {
  for (const ir::Function* fn : selected(module, options))
    for (const ir::RepeatInfo& repeat : fn->repeats)
      if (repeat.dim == dim) return true;
  return false;
}

/// --microbatches DIM=K, K a positive count or `auto` (0 here).
struct Microbatching {
  std::string dim;
  int64_t count = 1; // 0: search
};

bool parseMicrobatches(const std::string& text, const ir::Module& module, Microbatching& result) {
  if (text.empty()) return true;
  auto [dim, count] = llvm::StringRef(text).split('=');
  if (dim.empty() || count.empty())
    return optionError("--microbatches " + text + ": expected DIM=K or DIM=auto");
  if (!module.dims.count(dim.str()))
    return optionError("--microbatches " + text + ": '" + dim.str() + "' is not a declared dim");
  result.dim = dim.str();
  if (count == "auto") {
    result.count = 0;
    return true;
  }
  if (count.getAsInteger(10, result.count) || result.count < 1)
    return optionError("--microbatches " + text + ": the count must be a positive number");
  if (module.dims.at(result.dim) % result.count != 0)
    return optionError(fmt::format("--microbatches {}: {} does not divide '{}' ({})", text,
                                   result.count, result.dim, module.dims.at(result.dim)));
  return true;
}

std::string axesText(const std::vector<std::string>& axes) {
  return fmt::format("[{}]", fmt::join(axes, ", "));
}

/// The inner plan's options: the mesh without the stage axis, the layout without the stage
/// entry, and the dims of one microbatch with `layers` layers.
PipelineOptions innerOptions(const ir::Module& module, const ir::DimLayout& stage,
                             const PipelineOptions& given, const ir::Function& fn,
                             const Microbatching& micro, int64_t count, int64_t layers) {
  PipelineOptions options = given;
  std::vector<std::string> mesh;
  for (const ir::MeshAxis& axis : module.mesh)
    if (axis.name != stage.axes.front()) mesh.push_back(fmt::format("{}={}", axis.name, axis.size));
  // The stage dim itself stays in the layout, replicated: it is in no tensor, and an override
  // needs at least one entry.
  std::vector<std::string> layout = {stage.dim + ": []"};
  for (const ir::DimLayout& entry : module.layout)
    if (entry.dim != stage.dim)
      layout.push_back(entry.isAuto ? entry.dim + ": auto"
                                    : fmt::format("{}: {}", entry.dim, axesText(entry.axes)));
  if (module.autoLayout) layout.push_back("auto");
  // One device along every other axis still makes a mesh (the stage axis was all there was).
  options.mesh = mesh.empty() ? stage.axes.front() + "=1" : llvm::join(mesh, ",");
  options.layout = llvm::join(layout, ", ");
  options.dims.push_back(fmt::format("{}={}", stage.dim, layers));
  if (!micro.dim.empty())
    options.dims.push_back(fmt::format("{}={}", micro.dim, module.dims.at(micro.dim) / count));
  options.functions = {fn.name};
  // Every stage's ranks run on the machine at once (threads sharing cores are oversubscribed
  // by all of them, not by one stage's mesh).
  options.stageCopies = plan::Mesh{module.mesh}.axisSize(stage.axes.front());
  // The dims above are already one microbatch's: the inner plan is an ordinary one (planModule
  // would otherwise microbatch it again, Microbatches.h).
  options.microbatches.clear();
  // The budget holds for a stage (layers, in-flight microbatches), which predictPipeline checks;
  // a plan of one or two layers has none of its own.
  options.memoryBudget = "1e30";
  options.jointSearch = false;
  return options;
}

/// A plan's work per phase: the reductions of the weights' gradients (backward collectives of
/// values autodiff names `grad/<path>`) run once per step on the accumulated gradients, the rest
/// of forward and backward once per microbatch. Accumulating, what the generated code runs after
/// the microbatch loop (oncePerStep, PlaceRest.h: the global norm's sums of squares, the
/// clipping, the all-reduces of accumulated values) is once per step too, with the update.
plan::StageWork workOf(const plan::SpmdFunction& spmd, bool accumulates) {
  auto isGradient = [&](plan::SpmdValueId id) {
    return llvm::StringRef(spmd.values[id].name).startswith("grad/");
  };
  std::vector<bool> once = oncePerStep(spmd, accumulates);
  plan::StageWork work;
  for (size_t i = 0; i < spmd.ops.size(); ++i) {
    const plan::SpmdOp& op = spmd.ops[i];
    bool collective = op.kind == plan::SpmdOp::Kind::Collective;
    plan::Phase phase = op.phase;
    if (once[i] && phase != plan::Phase::Update &&
        !(collective && llvm::any_of(op.operands, isGradient)))
      phase = plan::Phase::Update;
    switch (phase) {
    case plan::Phase::Forward:
      work.forwardSeconds += op.seconds;
      work.collectives += collective && op.seconds > 0;
      break;
    case plan::Phase::Backward: {
      if (collective && llvm::any_of(op.operands, isGradient)) {
        work.gradientSyncSeconds += op.seconds;
      } else {
        work.backwardSeconds += op.seconds;
        work.collectives += collective && op.seconds > 0;
      }
      break;
    }
    case plan::Phase::Update:
      work.updateSeconds += op.seconds;
      break;
    }
  }
  work.flops = spmd.summary.totalFlops;
  work.memory = spmd.memory;
  // Accumulating over microbatches keeps a gradient per weight for the whole step.
  if (accumulates)
    work.memory.gradientBytes = std::max(work.memory.gradientBytes, work.memory.paramBytes);
  return work;
}

/// Bytes per device of the values one layer hands to the next, laid out as the inner plan lays
/// them out.
double boundaryBytes(const ir::Function& fn, const std::string& dim,
                     const plan::SpmdFunction& spmd) {
  double bytes = 0;
  for (const ir::RepeatInfo& repeat : fn.repeats)
    if (repeat.dim == dim)
      for (const ir::TensorType& type : repeat.carried)
        bytes += double(
            plan::localBytes(type, plan::tensorLayoutOf(type, spmd.layout, spmd.mesh), spmd.mesh));
  return bytes;
}

struct Candidate {
  int64_t microbatches = 1;
  plan::StageWork layer, rest;
  plan::PipelinePrediction prediction;
  /// The plan at one layer (its layout and mesh are the stage's).
  std::shared_ptr<const plan::PlannedFunction> onePlan;
  double boundaryBytes = 0;
  double recomputeWorkingBytes = 0;   // with --recompute: one layer's whole activations
  double layerKeptBytes = 0;          // what a layer keeps per microbatch in flight (the model's)
  std::vector<std::string> recompute; // the defs recomputed (given, or chosen to fit)
  bool recomputeChosen = false;       // by the planner, not --recompute
  /// The generated code's bytes per stage (StageMemory.h), for the candidate reported; empty
  /// when not computed or the code generator refuses the step.
  std::vector<StageCodeMemory> code;
};

/// A plan of planInner's, held with the PlannedModule it is in (shared by the searches and the
/// stores below rather than copied).
using SharedPlan = std::shared_ptr<const plan::PlannedFunction>;

/// The plans without recomputation already made, by (microbatches, layers): a search that
/// tries recomputation after the plain counts needs them again (the same options, the same
/// plans).
using PlainPlans = std::map<std::pair<int64_t, int>, SharedPlan>;

/// The key of an inner plan's options in UnzeroedPlans: every option innerOptions sets or
/// passes on that the plan depends on, but the ZeRO stage.
std::string unzeroedKey(const PipelineOptions& options) {
  return fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}", options.input, options.mesh,
                     options.layout, fmt::join(options.dims, ","),
                     fmt::join(options.recompute, ","), fmt::join(options.functions, ","),
                     options.machine, options.stageCopies, options.memoryBudget,
                     options.injectFault);
}

/// The inner plan of `options` (one function): loaded, trained and planned, or taken from
/// `unzeroed` (UnzeroedPlans): as it is without ZeRO, else with the stage applied, as
/// planModule would plan it; a plan without ZeRO is kept there. With a ZeRO stage, Adafactor's
/// blocks, whose sums' order follows the plan (planner/Planner.cpp, planInFactoredOrder), are
/// planned again.
bool planInner(const PipelineOptions& options, UnzeroedPlans* unzeroed, DiagEngine& diag,
               const char* argv0, std::shared_ptr<const ir::Module>& loaded,
               std::shared_ptr<const PlannedModule>& planned) {
  int zero = 0;
  if (!options.zero.empty() && llvm::StringRef(options.zero).trim().getAsInteger(10, zero))
    zero = -1; // planModule reports it
  std::string key = unzeroed ? unzeroedKey(options) : "";
  if (unzeroed && zero >= 0 && zero <= 3)
    if (auto known = unzeroed->byOptions.find(key); known != unzeroed->byOptions.end()) {
      if (zero == 0) { // the same options planned already
        loaded = known->second.module;
        planned = known->second.planned;
        return true;
      }
      const ir::Module& module = *known->second.module;
      const PlannedModule& plain = *known->second.planned;
      const ir::Function* fn =
          plain.plans.size() == 1 ? module.findFunction(plain.plans.front().spmd.name) : nullptr;
      if (fn && train::factoredSumOrder(*fn).empty()) {
        PlannedModule derived{plain.machine, plain.plans, std::nullopt};
        if (!plan::applyZeroStage(module, *fn, derived.machine, zero, derived.plans.front(),
                                  diag) ||
            !finishPlans(derived.plans, options))
          return false;
        loaded = known->second.module;
        planned = std::make_shared<const PlannedModule>(std::move(derived));
        return true;
      }
    }
  std::optional<InnerModule> module =
      innerModule(options, unzeroed ? &unzeroed->modules : nullptr, diag, argv0);
  if (!module) return false;
  std::optional<PlannedModule> plans = planModule(*module->module, options, diag);
  if (!plans) return false;
  loaded = std::move(module->module);
  planned = std::make_shared<const PlannedModule>(std::move(*plans));
  if (unzeroed && zero == 0)
    unzeroed->byOptions.try_emplace(key, UnzeroedPlans::Entry{loaded, planned});
  return true;
}

/// Plans `fn` at one and two layers for `count` microbatches and composes the stages; the plans
/// without recomputation come from `plainPlans` when it has them, and are kept there. Each plan's
/// layout search starts from `searchStart` (when given), which then becomes its layout: the
/// plans of one stage mesh are alike, and the plans do not depend on where a search starts.
std::optional<Candidate>
evaluate(const ir::Module& module, const ir::DimLayout& stage, const PipelineOptions& given,
         const ir::Function& fn, const Microbatching& micro, int64_t count,
         plan::PipelineSchedule schedule, const plan::Machine& machine, DiagEngine& diag,
         const char* argv0, PlainPlans* plainPlanMemo = nullptr, UnzeroedPlans* unzeroed = nullptr,
         std::optional<plan::Layout>* searchStart = nullptr,
         const std::shared_ptr<plan::BoundTally>& boundTally = nullptr) {
  // Plans of the step at one and two layers, with the recomputation asked for (`given`) or
  // without any (`plain`).
  bool recomputes = !given.recompute.empty();
  SharedPlan plans[2], plainPlans[2];
  std::shared_ptr<const ir::Module> inner[2];
  for (bool withRecompute : recomputes ? std::vector<bool>{true, false} : std::vector<bool>{false})
    for (int layers : {1, 2}) {
      // Only the plain plans of a recomputing candidate are taken from the memo: the others
      // keep their module too.
      if (!withRecompute && recomputes && plainPlanMemo)
        if (auto known = plainPlanMemo->find({count, layers}); known != plainPlanMemo->end()) {
          plainPlans[layers - 1] = known->second;
          continue;
        }
      PipelineOptions options = innerOptions(module, stage, given, fn, micro, count, layers);
      if (!withRecompute) options.recompute.clear();
      if (searchStart) options.searchStart = *searchStart;
      // The same plans with the bounds that seldom cut left out (their counts are not printed).
      options.skipIdleBounds = searchStart != nullptr;
      if (searchStart) options.boundTally = boundTally;
      std::shared_ptr<const ir::Module> loaded;
      std::shared_ptr<const PlannedModule> planned;
      if (!planInner(options, unzeroed, diag, argv0, loaded, planned) || planned->plans.size() != 1)
        return std::nullopt;
      SharedPlan plan(planned, &planned->plans.front());
      // The next plan (one layer more, another microbatch count) starts its search here.
      if (searchStart && plan->search) *searchStart = plan->search->layout;
      if (!withRecompute && plainPlanMemo) plainPlanMemo->try_emplace({count, layers}, plan);
      (withRecompute || !recomputes ? plans : plainPlans)[layers - 1] = plan;
      if (withRecompute || !recomputes) inner[layers - 1] = std::move(loaded);
    }
  const ir::Function* innerFn = inner[0]->findFunction(fn.name);
  bool accumulates = count > 1 && fn.kind == ir::Function::Kind::Train;
  plan::StageWork one = workOf(plans[0]->spmd, accumulates);
  plan::StageWork two = workOf(plans[1]->spmd, accumulates);
  Candidate candidate;
  candidate.microbatches = count;
  candidate.layer = two.minus(one);
  candidate.rest = one.minus(candidate.layer);
  plan::PipelineShape shape;
  if (recomputes) {
    // Recomputation's time adds up per layer (a layer's backward runs its forward again), its
    // memory does not: a recomputed layer keeps its inputs (the difference of the two plans),
    // and one layer at a time holds its whole activations while it is recomputed (a layer's
    // figure without recomputation), once per stage, not per microbatch in flight. The rest's
    // activations are the plain plans' (nothing of it is recomputed).
    plan::StageWork plainOne = workOf(plainPlans[0]->spmd, accumulates);
    plan::StageWork plainLayer = workOf(plainPlans[1]->spmd, accumulates).minus(plainOne);
    candidate.rest.memory.peakActivationBytes =
        plainOne.minus(plainLayer).memory.peakActivationBytes;
    candidate.recomputeWorkingBytes = plainLayer.memory.peakActivationBytes;
    shape.recomputeWorkingBytes = candidate.recomputeWorkingBytes;
  }
  shape.layers = module.dims.at(stage.dim);
  shape.stages = plan::Mesh{module.mesh}.axisSize(stage.axes.front());
  shape.pinnedSplit = stage.split;
  shape.microbatches = count;
  shape.schedule = schedule;
  candidate.boundaryBytes = innerFn ? boundaryBytes(*innerFn, stage.dim, plans[0]->spmd) : 0;
  if (innerFn) placeRest(*innerFn, plans[0]->spmd, accumulates, shape);
  shape.boundaryBytes = candidate.boundaryBytes;
  shape.link = plan::linkFor(machine, plan::Mesh{module.mesh}, {stage.axes.front()});
  candidate.prediction = plan::predictPipeline(candidate.layer, candidate.rest, shape);
  candidate.layerKeptBytes = shape.stagePeaks.first >= 0 && shape.stages > 1
                                 ? shape.stagePeaks.layerKept
                                 : candidate.layer.memory.peakActivationBytes;
  candidate.onePlan = std::move(plans[0]);
  return candidate;
}

std::string layersText(const plan::StagePrediction& stage) {
  std::string text = stage.layerCount == 1 ? fmt::format("layer {}", stage.firstLayer)
                                           : fmt::format("layers {}-{}", stage.firstLayer,
                                                         stage.firstLayer + stage.layerCount - 1);
  return stage.holdsRest ? text + " + rest" : text;
}

void printText(const ir::Function& fn, const ir::Module& module, const ir::DimLayout& stage,
               const Microbatching& micro, const Candidate& c, plan::PipelineSchedule schedule,
               const plan::Machine& machine, double budget, llvm::raw_ostream& os) {
  using plan::bytesString;
  using plan::secondsString;
  const plan::PipelinePrediction& p = c.prediction;
  const plan::SpmdFunction& inner = c.onePlan->spmd;
  int64_t stages = int64_t(p.stages.size()), devices = stages * inner.mesh.numDevices();
  os << fmt::format("plan of {} {} (pipeline stages)\n",
                    fn.kind == ir::Function::Kind::Train ? "train" : "program", fn.name);
  os << fmt::format("  machine  {}: {}\n", machine.name, machine.description);
  std::vector<std::string> axes;
  for (const ir::MeshAxis& axis : module.mesh)
    axes.push_back(fmt::format("{}={}", axis.name, axis.size));
  os << fmt::format("  mesh     [{}], {} devices: {} stages over '{}', each a [{}] mesh\n",
                    fmt::join(axes, ", "), devices, stages, stage.axes.front(),
                    fmt::join(llvm::map_range(inner.mesh.axes,
                                              [](const ir::MeshAxis& a) {
                                                return fmt::format("{}={}", a.name, a.size);
                                              }),
                              ", "));
  os << fmt::format("  layers   {} = {}, consecutive layers per stage{}, the rest (the ops "
                    "outside the repeat: embedding, head, loss) where the code runs it (the "
                    "embedding on the first stage, the head and the loss on the last), its "
                    "params where the code holds them\n",
                    stage.dim, module.dims.at(stage.dim),
                    stage.split.empty() ? ""
                                        : fmt::format(" as the layout pins them ({})",
                                                      fmt::join(stage.split, ", ")));
  std::string microText =
      micro.dim.empty() ? "1 microbatch (--microbatches DIM=K splits the batch)"
                        : fmt::format("{} microbatch{} of {} = {}{}", c.microbatches,
                                      c.microbatches == 1 ? "" : "es", micro.dim,
                                      module.dims.at(micro.dim) / c.microbatches,
                                      micro.count == 0 ? " (searched: the fastest that fits)" : "");
  os << fmt::format("  schedule {}, {}\n", plan::scheduleName(schedule), microText);
  os << "\nlayout of a stage (planned at one layer, one microbatch)\n";
  for (const auto& [dim, list] : inner.layout.axes)
    os << fmt::format("  {:<10} {}\n", dim, axesText(list));
  os << fmt::format("\nstages (per device; forward and backward per microbatch)\n");
  // `of rest`: the part of forward + backward that is the rest's ops run on the stage.
  os << fmt::format("  {:<22} {:>11} {:>11} {:>11} {:>11} {:>9} {:>11}\n", "stage", "forward",
                    "backward", "of rest", "once/step", "in flight", "memory");
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const plan::StagePrediction& st = p.stages[s];
    os << fmt::format("  {:<22} {:>11} {:>11} {:>11} {:>11} {:>9} {:>11}\n",
                      fmt::format("{} ({})", s, layersText(st)), secondsString(st.forwardSeconds),
                      secondsString(st.backwardSeconds),
                      secondsString(st.restForwardSeconds + st.restBackwardSeconds),
                      secondsString(st.onceSeconds), st.inFlight, bytesString(st.memory.total()));
  }
  if (!c.code.empty()) {
    // What the generated code holds: its own liveness (plan-buffers), its own placement.
    os << "  generated code per device (arena + values computed once + params and optimizer "
          "state held):\n";
    for (size_t s = 0; s < c.code.size(); ++s)
      os << fmt::format("    stage {}: {:.0f} = {:.0f} + {:.0f} + {:.0f} bytes (the model: {})\n",
                        s, c.code[s].total(), c.code[s].arenaBytes, c.code[s].persistentBytes,
                        c.code[s].paramBytes,
                        s < p.stages.size() ? bytesString(p.stages[s].memory.total()) : "-");
  }
  os << fmt::format("  one layer: forward {}, backward {}, {} collective{} per microbatch; "
                    "params {}, activations {} kept per microbatch\n",
                    secondsString(c.layer.forwardSeconds), secondsString(c.layer.backwardSeconds),
                    c.layer.collectives, c.layer.collectives == 1 ? "" : "s",
                    bytesString(c.layer.memory.paramBytes), bytesString(c.layerKeptBytes));
  if (c.recomputeWorkingBytes > 0)
    os << fmt::format("  recompute {}{}: a layer keeps {} per microbatch in flight; the layer "
                      "being recomputed holds {} more, once per stage\n",
                      llvm::join(c.recompute, ", "),
                      c.recomputeChosen ? " (chosen: faster than the counts that fit without it)"
                                        : "",
                      bytesString(c.layerKeptBytes), bytesString(c.recomputeWorkingBytes));
  if (stages > 1)
    os << fmt::format("  boundary: {} per device per microbatch each way, {} per transfer\n",
                      bytesString(c.boundaryBytes), secondsString(p.p2pSeconds));
  int64_t m = c.microbatches;
  os << "\npredicted step\n";
  os << fmt::format("  time     {} = (m + p - 1) x slot + once = ({} + {} - 1) x {} + {}\n",
                    secondsString(p.stepSeconds), m, stages, secondsString(p.slotSeconds),
                    secondsString(p.stepSeconds - double(m + stages - 1) * p.slotSeconds));
  os << fmt::format("  bubble   {:.1f}% of the pipelined slots ((p - 1) / (m + p - 1))\n",
                    100 * p.bubbleFraction);
  double perDevice = p.stepSeconds > 0 ? p.flopsPerStep / p.stepSeconds / double(devices) : 0;
  os << fmt::format("  flops    {:.4g} per step, {:.4g} TFLOP/s per device ({:.1f}% of the f32 "
                    "peak{})\n",
                    p.flopsPerStep, perDevice / 1e12,
                    machine.peakFlops > 0 ? 100 * perDevice / machine.peakFlops : 0.0,
                    machine.peakFlopsBf16 > 0 ? fmt::format(", {:.1f}% of the bf16 peak",
                                                            100 * perDevice / machine.peakFlopsBf16)
                                              : std::string());
  os << fmt::format("  memory   {} per device at the fullest stage (budget {})\n",
                    bytesString(p.peakMemoryBytes), bytesString(budget));
}

void printJson(const ir::Function& fn, const ir::DimLayout& stage, const Candidate& c,
               plan::PipelineSchedule schedule, const plan::JointSearchReport* joint,
               llvm::raw_ostream& os) {
  const plan::PipelinePrediction& p = c.prediction;
  std::vector<std::string> stages;
  for (size_t k = 0; k < p.stages.size(); ++k) {
    const plan::StagePrediction& s = p.stages[k];
    // The generated code's bytes (StageMemory.h), when computed.
    std::string code =
        k < c.code.size()
            ? fmt::format(", \"code_memory_bytes\": {:.0f}, \"code_arena_bytes\": {:.0f}, "
                          "\"code_persistent_bytes\": {:.0f}, \"code_param_bytes\": {:.0f}",
                          c.code[k].total(), c.code[k].arenaBytes, c.code[k].persistentBytes,
                          c.code[k].paramBytes)
            : "";
    stages.push_back(fmt::format(
        "{{\"first_layer\": {}, \"layers\": {}, \"holds_rest\": {}, \"forward_seconds\": {:.9g}, "
        "\"backward_seconds\": {:.9g}, \"rest_forward_seconds\": {:.9g}, "
        "\"rest_backward_seconds\": {:.9g}, \"once_seconds\": {:.9g}, "
        "\"in_flight\": {}, "
        "\"memory_bytes\": {:.9g}, \"param_bytes\": {:.9g}, \"optimizer_bytes\": {:.9g}, "
        "\"gradient_bytes\": {:.9g}, \"activation_bytes\": {:.9g}{}}}",
        s.firstLayer, s.layerCount, s.holdsRest, s.forwardSeconds, s.backwardSeconds,
        s.restForwardSeconds, s.restBackwardSeconds, s.onceSeconds, s.inFlight, s.memory.total(),
        s.memory.paramBytes, s.memory.optimizerBytes, s.memory.gradientBytes,
        s.memory.peakActivationBytes, code));
  }
  os << fmt::format(
      "{{\"function\": \"{}\", \"pipeline\": {{\"dim\": \"{}\", \"axis\": \"{}\", \"schedule\": "
      "\"{}\", \"microbatches\": {}, \"slot_seconds\": {:.9g}, \"p2p_seconds\": {:.9g}, "
      "\"bubble_fraction\": {:.9g}, \"step_seconds\": {:.9g}, \"flops_per_step\": {:.9g}, "
      "\"peak_memory_bytes\": {:.9g}, \"recompute\": [{}], \"recompute_chosen\": {}, "
      "\"recompute_working_bytes\": {:.9g}, \"devices\": {}, "
      "\"stages\": [{}]}}{}}}",
      fn.name, stage.dim, stage.axes.front(), plan::scheduleName(schedule), c.microbatches,
      p.slotSeconds, p.p2pSeconds, p.bubbleFraction, p.stepSeconds, p.flopsPerStep,
      p.peakMemoryBytes,
      llvm::join(
          llvm::map_range(c.recompute, [](const std::string& def) { return "\"" + def + "\""; }),
          ", "),
      c.recomputeChosen, c.recomputeWorkingBytes,
      int64_t(p.stages.size()) * c.onePlan->spmd.mesh.numDevices(), llvm::join(stages, ", "),
      joint ? ", \"jointSearch\": " + plan::jointSearchJson(*joint) : std::string());
}

} // namespace

const ir::DimLayout* stageLayoutOf(const ir::Module& module, const PipelineOptions& options,
                                   DiagEngine& diag, bool& ok) {
  ok = true;
  const ir::DimLayout* found = nullptr;
  for (const ir::DimLayout& entry : module.layout)
    if (!entry.isAuto && !entry.axes.empty() && isRepeatDim(module, options, entry.dim))
      found = &entry;
  if (!found) return nullptr;
  if (found->axes.size() != 1) {
    diag.report(found->loc.loc, Diag::ErrStageAxes, found->dim, axesText(found->axes));
    ok = false;
    return nullptr;
  }
  const std::string& axis = found->axes.front();
  for (const ir::DimLayout& entry : module.layout)
    if (&entry != found && llvm::is_contained(entry.axes, axis)) {
      diag.report(entry.loc.loc, Diag::ErrStageAxisShared, axis, found->dim, entry.dim);
      ok = false;
    }
  // Sema checked a pinned split (its count, sum and stages) and allows a layer count the stages
  // do not divide for a repeat's count only (balanceLayers splits it unevenly).
  for (const ir::Function* fn : selected(module, options)) {
    int64_t repeats = llvm::count_if(
        fn->repeats, [&](const ir::RepeatInfo& repeat) { return repeat.dim == found->dim; });
    if (repeats != 1) {
      diag.report(fn->loc.loc, Diag::ErrStageRepeatCount,
                  fn->kind == ir::Function::Kind::Train ? "train block" : "program", fn->name,
                  found->dim, repeats);
      ok = false;
    }
  }
  return ok ? found : nullptr;
}

namespace {

/// The microbatch count and schedule options of a stage layout's plan, checked.
bool pipelineSettings(const ir::Module& module, const PipelineOptions& options,
                      Microbatching& micro, plan::PipelineSchedule& schedule, double& budget,
                      std::optional<plan::Machine>& machine) {
  if (!parseMicrobatches(options.microbatches, module, micro)) return false;
  schedule = plan::PipelineSchedule::OneFOneB;
  if (options.pipelineSchedule == "gpipe")
    schedule = plan::PipelineSchedule::GPipe;
  else if (options.pipelineSchedule != "1f1b")
    return optionError("--pipeline-schedule must be gpipe or 1f1b, not '" +
                       options.pipelineSchedule + "'");
  llvm::Expected<plan::Machine> loaded = plan::loadMachine(options.machine);
  if (!loaded) return optionError(llvm::toString(loaded.takeError()));
  machine = std::move(*loaded);
  budget = machine->memoryBytes;
  return options.memoryBudget.empty() || parseByteSize(options.memoryBudget, budget);
}

PipelineChoice choiceOf(const Candidate& candidate, const std::vector<std::string>& recompute,
                        double budget) {
  const plan::PipelinePrediction& p = candidate.prediction;
  return {candidate.microbatches, recompute, p.stepSeconds, p.peakMemoryBytes,
          p.peakMemoryBytes <= budget};
}

/// The fastest candidate of `fn` that fits `budget`: every microbatch count asked for (`auto`:
/// every divisor the stage's layout can split) and, for a train block without --recompute (and
/// with `tryRecompute`), again with its repeated layer recomputed when the budget excluded the
/// fastest count (recomputing adds a forward per layer, but may let fewer microbatches fit than
/// without it, or any). `ok` is false after an error; nullopt with `ok` when none fits.
/// `smallest`: the candidate with the least memory.
std::optional<Candidate> searchCandidates(const ir::Module& module, const ir::DimLayout& stage,
                                          const PipelineOptions& options, const ir::Function& fn,
                                          const Microbatching& micro,
                                          plan::PipelineSchedule schedule,
                                          const plan::Machine& machine, double budget,
                                          bool tryRecompute, DiagEngine& diag, const char* argv0,
                                          std::optional<PipelineChoice>& smallest, bool& ok,
                                          UnzeroedPlans* unzeroed = nullptr) {
  ok = true;
  // The microbatch counts to try: the one asked for, or (auto) every divisor of the dim.
  std::vector<int64_t> counts = {micro.dim.empty() ? 1 : micro.count};
  if (micro.count == 0) {
    counts.clear();
    for (int64_t k = 1; k <= module.dims.at(micro.dim); ++k)
      if (module.dims.at(micro.dim) % k == 0) counts.push_back(k);
  }
  std::optional<Candidate> best;
  smallest.reset();
  PlainPlans plainPlans;
  std::optional<plan::Layout> searchStart; // the last plan's layout (evaluate)
  // The inner plans' searches bound the levels that cut (SearchOptions::boundTally). One tally
  // per split: on another stage mesh the levels cut otherwise (one tally for every split cost the
  // GPT-3-shaped train block 0.2% more instructions).
  auto boundTally = std::make_shared<plan::BoundTally>();
  PipelineOptions given = options;
  double fastest = std::numeric_limits<double>::infinity();
  std::string layerDef =
      fn.kind == ir::Function::Kind::Train && options.recompute.empty() && tryRecompute
          ? train::repeatedLayerDef(fn)
          : "";
  for (bool retry : {false, true}) {
    if (retry) {
      if ((best && best->prediction.stepSeconds <= fastest) || layerDef.empty()) break;
      given.recompute = {layerDef};
    }
    for (int64_t count : counts) {
      // A searched count whose microbatch the stage's layout cannot split is skipped.
      if (micro.count == 0) {
        int64_t size = module.dims.at(micro.dim) / count, split = 1;
        for (const ir::DimLayout& entry : module.layout)
          if (entry.dim == micro.dim)
            split = plan::splitFactor(plan::Mesh{module.mesh}, entry.axes);
        if (size % split != 0) continue;
      }
      std::optional<Candidate> candidate =
          evaluate(module, stage, given, fn, micro, count, schedule, machine, diag, argv0,
                   &plainPlans, unzeroed, &searchStart, boundTally);
      if (!candidate) {
        ok = false;
        return std::nullopt;
      }
      double memory = candidate->prediction.peakMemoryBytes;
      if (!smallest || memory < smallest->memoryBytes)
        smallest = choiceOf(*candidate, given.recompute, budget);
      fastest = std::min(fastest, candidate->prediction.stepSeconds);
      if (memory > budget) continue;
      candidate->recompute = given.recompute;
      candidate->recomputeChosen = retry;
      if (!best || candidate->prediction.stepSeconds < best->prediction.stepSeconds)
        best = std::move(candidate);
    }
  }
  return best;
}

} // namespace

std::optional<std::map<std::string, std::vector<int64_t>>>
plannedStageSplit(const ir::Module& module, const ir::DimLayout& stage,
                  const PipelineOptions& options, DiagEngine& diag, const char* argv0) {
  Microbatching micro;
  plan::PipelineSchedule schedule;
  double budget = 0;
  std::optional<plan::Machine> machine;
  if (!pipelineSettings(module, options, micro, schedule, budget, machine)) return std::nullopt;
  std::map<std::string, std::vector<int64_t>> split;
  for (const ir::Function* fn : selected(module, options)) {
    std::optional<Candidate> candidate =
        evaluate(module, stage, options, *fn, micro, std::max<int64_t>(micro.count, 1), schedule,
                 *machine, diag, argv0);
    if (!candidate) return std::nullopt;
    for (const plan::StagePrediction& s : candidate->prediction.stages)
      split[fn->name].push_back(s.layerCount);
  }
  return split;
}

bool searchPipeline(const ir::Module& module, const ir::DimLayout& stage,
                    const PipelineOptions& options, const ir::Function& fn, bool tryRecompute,
                    DiagEngine& diag, const char* argv0, std::optional<PipelineChoice>& choice,
                    UnzeroedPlans* unzeroed) {
  Microbatching micro;
  plan::PipelineSchedule schedule;
  double budget = 0;
  std::optional<plan::Machine> machine;
  if (!pipelineSettings(module, options, micro, schedule, budget, machine)) return false;
  bool ok = true;
  std::optional<Candidate> best =
      searchCandidates(module, stage, options, fn, micro, schedule, *machine, budget, tryRecompute,
                       diag, argv0, choice, ok, unzeroed);
  if (best) choice = choiceOf(*best, best->recompute, budget);
  return ok;
}

/// The largest step (IR ops) whose generated code's memory the plan report computes.
constexpr size_t kMaxOpsToLower = 4000;

int planPipelines(const ir::Module& module, const ir::DimLayout& stage,
                  const PipelineOptions& options, DiagEngine& diag, const char* argv0, bool json,
                  llvm::raw_ostream& os, const plan::JointSearchReport* joint,
                  UnzeroedPlans* plans) {
  Microbatching micro;
  plan::PipelineSchedule schedule;
  double budget = 0;
  std::optional<plan::Machine> machine;
  if (!pipelineSettings(module, options, micro, schedule, budget, machine)) return kExitInputError;
  if (json) os << "[\n";
  bool first = true;
  for (const ir::Function* fn : selected(module, options)) {
    std::optional<PipelineChoice> smallest;
    bool ok = true;
    std::optional<Candidate> best =
        searchCandidates(module, stage, options, *fn, micro, schedule, *machine, budget,
                         /*tryRecompute=*/true, diag, argv0, smallest, ok, plans);
    if (!ok) return kExitInputError;
    if (!best) {
      diag.report(fn->loc.loc, Diag::ErrPipelineOverBudget,
                  fn->kind == ir::Function::Kind::Train ? "train block" : "program", fn->name,
                  plan::bytesString(budget),
                  plan::bytesString(smallest ? smallest->memoryBytes
                                             : std::numeric_limits<double>::infinity()));
      return kExitInputError;
    }
    // The generated code's memory per stage, for the options code generation gets; not for a
    // step too large to lower quickly (the kernel passes grow faster than the step: 0.8 s at 8
    // transformer layers, about 3,400 ops, 7 s at 32, 13,400).
    PipelineOptions generated = options;
    generated.microbatches =
        micro.dim.empty() ? "" : fmt::format("{}={}", micro.dim, best->microbatches);
    generated.recompute = best->recompute;
    bool lowered = fn->ops.size() <= kMaxOpsToLower;
    if (lowered)
      if (auto code = generatedStageMemory(module, stage, generated, fn->name, diag, argv0))
        best->code = std::move(*code);
    if (!first) os << (json ? ",\n" : "\n");
    first = false;
    if (json) {
      printJson(*fn, stage, *best, schedule, joint, os);
    } else {
      printText(*fn, module, stage, micro, *best, schedule, *machine, budget, os);
      if (!lowered)
        os << fmt::format("  generated code per stage: not lowered ({} ops, over {}; "
                          "--emit=kernels prints its arenas)\n",
                          fn->ops.size(), kMaxOpsToLower);
      if (joint) plan::printJointSearch(*joint, os);
    }
  }
  if (json) os << "\n]\n";
  return kExitOk;
}

} // namespace meshc
