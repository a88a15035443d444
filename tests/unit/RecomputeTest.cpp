// Activation recomputation (train/Recompute.h) on the IR, in the interpreter, in the plan and in
// the kernel IR: the copies exist and carry the attribute, the originals are no longer read by
// the backward pass once the call's own backward starts, the train steps are bit for bit those
// without recomputation, the planner's memory estimate drops by the activations it reports
// dropped, and the kernel passes keep the copies apart from the originals.
#include "train/Recompute.h"
#include "CompiledSource.h"
#include "train/Optimizer.h"

#include "codegen/EliminateCommonSubexpressions.h"
#include "codegen/Lower.h"
#include "interp/Interpreter.h"
#include "ir/IRPrinter.h"
#include "planner/Machine.h"
#include "planner/Planner.h"
#include "planner/RecomputeReport.h"
#include "planner/Reshard.h"
#include "planner/SpmdLowering.h"

#include <catch2/catch.hpp>
#include <llvm/ADT/STLExtras.h>

#include <set>

using namespace meshc;

namespace {

// Four calls of a layer with a layer norm, a GELU MLP and dropout; the backward of each needs
// most of the layer's forward values. Activations outweigh params (and SGD keeps no state), so
// they set the peak of live memory.
constexpr const char* kSource = R"(
mesh grid[data = 2]
dim batch = 64
dim d = 8
dim f = 32
layout batch: data

RECOMPUTEdef layer(x: f32[batch, d]) -> f32[batch, d] {
  param w_in: f32[d, f] = normal(stddev = 0.3)
  param w_out: f32[f, d] = normal(stddev = 0.3)
  let h = gelu(einsum(layer_norm(x, d), w_in -> batch, f))
  return x + einsum(dropout(h, rate = 0.25), w_out -> batch, d)
}

train t(x: f32[batch, d], y: f32[batch, d]) {
  let h = x
  repeat 4 {
    h = layer(h)
  }
  minimize mean(square(h - y)) with sgd(lr = 0.1)
}
)";

std::string source(bool annotated) {
  std::string text = kSource;
  text.replace(text.find("RECOMPUTE"), 9, annotated ? "recompute " : "");
  return text;
}

struct Trained {
  testing::CompiledSource compiled;
  ir::Module module;
  explicit Trained(const std::string& text, SemaOptions options = {})
      : compiled(llvm::StringRef(text), options) {
    INFO(compiled.errors);
    REQUIRE(compiled.module);
    module = *compiled.module;
    for (ir::Function& fn : module.functions)
      REQUIRE(train::lowerTraining(fn, compiled.diag));
  }
  ir::Function& fn() { return module.functions.front(); }
};

bool isCopy(const ir::Op& op) {
  return op.attr(ir::kRecomputeAttr) != nullptr;
}

/// Per value: the indices of the ops that read it.
std::vector<std::vector<size_t>> readers(const ir::Function& fn) {
  std::vector<std::vector<size_t>> out(fn.values.size());
  for (size_t i = 0; i < fn.ops.size(); ++i)
    for (ir::ValueId operand : fn.ops[i].operands)
      out[operand].push_back(i);
  return out;
}

} // namespace

TEST_CASE("recompute copies a call's activations before its backward and rewires the reads") {
  Trained plain(source(false));
  Trained recomputed(source(true));
  const ir::Function& fn = recomputed.fn();
  // The forward ops are unchanged and first: the copies go into the backward part.
  size_t forwardOps = 0;
  while (forwardOps < plain.fn().ops.size() && !isCopy(fn.ops[forwardOps]) &&
         plain.fn().ops[forwardOps].kind == fn.ops[forwardOps].kind)
    ++forwardOps;
  REQUIRE(fn.ops.size() > plain.fn().ops.size());
  size_t copies = 0;
  std::set<std::string> paths;
  for (size_t i = 0; i < fn.ops.size(); ++i)
    if (isCopy(fn.ops[i])) {
      ++copies;
      CHECK(i >= forwardOps);
      paths.insert(fn.ops[i].string(ir::kRecomputeAttr));
    }
  CHECK(copies == fn.ops.size() - plain.fn().ops.size());
  CHECK(paths == std::set<std::string>{"layer[0]", "layer[1]", "layer[2]", "layer[3]"});
  // The layers' copies are each one run, the last layer's first (the backward runs in reverse).
  size_t firstCopy = 0;
  while (!isCopy(fn.ops[firstCopy]))
    ++firstCopy;
  CHECK(fn.ops[firstCopy].string(ir::kRecomputeAttr) == "layer[3]");

  // A forward value of a layer that the backward reads is only the layer's result (read by the
  // next layer or the loss, before the layer's own backward starts); everything else the
  // backward reads from the copies.
  std::vector<std::vector<size_t>> readersOf = readers(fn);
  std::vector<std::vector<size_t>> plainReaders = readers(plain.fn());
  size_t keptBefore = 0, keptAfter = 0;
  for (size_t i = 0; i < forwardOps; ++i) {
    const ir::Op& op = fn.ops[i];
    if (op.loc.call == 0 || op.kind == ir::OpKind::Param || op.kind == ir::OpKind::Literal)
      continue;
    auto inBackward = [&](size_t reader) { return reader >= forwardOps; };
    bool readInBackward = llvm::any_of(readersOf[op.result], inBackward);
    keptBefore += llvm::any_of(plainReaders[op.result], inBackward);
    keptAfter += readInBackward;
    if (readInBackward) {
      INFO("value %" << op.result << " " << ir::opSpelling(op.kind));
      CHECK(llvm::any_of(readersOf[op.result], [&](size_t reader) {
        return reader < forwardOps && fn.ops[reader].loc.call != op.loc.call;
      }));
    }
  }
  // Plain: per layer its layer norm's, first einsum's and dropout's results, and the results of
  // layers 0-2 (read by the next layer's backward); recomputed: only the latter.
  INFO(keptBefore << " values kept for backward, " << keptAfter << " with recomputation");
  CHECK(keptAfter <= 3);
  CHECK(keptBefore >= 12);
  // The copy of the dropout draws the same mask: same stream and rate.
  size_t dropouts = 0;
  for (const ir::Op& op : fn.ops)
    if (op.kind == ir::OpKind::Dropout && isCopy(op)) {
      ++dropouts;
      CHECK(llvm::any_of(fn.ops, [&](const ir::Op& original) {
        return original.kind == ir::OpKind::Dropout && !isCopy(original) &&
               original.string("stream") == op.string("stream");
      }));
    }
  CHECK(dropouts == 4);
}

TEST_CASE("--recompute names a def as the annotation does; other defs are untouched") {
  SemaOptions options;
  options.recompute = {"layer"};
  Trained byOption(source(false), options);
  Trained annotated(source(true));
  REQUIRE(byOption.fn().ops.size() == annotated.fn().ops.size());
  for (size_t i = 0; i < annotated.fn().ops.size(); ++i) {
    CHECK(byOption.fn().ops[i].kind == annotated.fn().ops[i].kind);
    CHECK(byOption.fn().ops[i].operands == annotated.fn().ops[i].operands);
  }
  Trained plain(source(false));
  for (const ir::Op& op : plain.fn().ops)
    CHECK_FALSE(isCopy(op));
}

TEST_CASE("recomputation chosen after training (to fit a budget) is the annotation's") {
  Trained annotated(source(true));
  Trained late(source(false));
  ir::Function& fn = late.fn();
  CHECK(train::repeatedLayerDef(fn) == "layer");
  CHECK(train::markRecompute(fn, "layer") == 4);
  CHECK(train::recomputeActivations(fn) == 4);
  REQUIRE(fn.ops.size() == annotated.fn().ops.size());
  for (size_t i = 0; i < fn.ops.size(); ++i) {
    CHECK(fn.ops[i].kind == annotated.fn().ops[i].kind);
    CHECK(fn.ops[i].operands == annotated.fn().ops[i].operands);
  }
}

TEST_CASE("a plain trained module with applyRecompute is the one --recompute loads") {
  // A program calling the layer too: sema marks every call of a def --recompute names.
  std::string text = source(false) + R"(
program p(x: f32[batch, d]) -> (y: f32[batch, d]) {
  y = layer(x)
}
)";
  testing::CompiledSource plainSource(llvm::StringRef{text});
  INFO(plainSource.errors);
  REQUIRE(plainSource.module);
  ir::Module plain = *plainSource.module;
  std::vector<size_t> forwardOps(plain.functions.size());
  for (size_t f = 0; f < plain.functions.size(); ++f) {
    size_t before = plain.functions[f].ops.size();
    REQUIRE(train::lowerTraining(plain.functions[f], plainSource.diag, {}, &forwardOps[f]));
    bool trained = plain.functions[f].kind == ir::Function::Kind::Train;
    CHECK(forwardOps[f] == (trained ? before : SIZE_MAX));
  }
  SemaOptions options;
  options.recompute = {"layer"};
  testing::CompiledSource loadedSource(llvm::StringRef{text}, options);
  REQUIRE(loadedSource.module);
  ir::Module loaded = *loadedSource.module;
  for (ir::Function& fn : loaded.functions)
    REQUIRE(train::lowerTraining(fn, loadedSource.diag));

  ir::Module derived = plain;
  REQUIRE(train::applyRecompute(derived, {"layer"}, forwardOps));
  auto printed = [](const ir::Module& module) {
    std::string out;
    llvm::raw_string_ostream os(out);
    ir::printModule(module, os);
    return os.str();
  };
  CHECK(printed(derived) == printed(loaded));
  CHECK(printed(derived) != printed(plain)); // the copies are there
  REQUIRE(derived.functions.size() == loaded.functions.size());
  for (size_t f = 0; f < derived.functions.size(); ++f) {
    const std::vector<ir::DefCall>& a = derived.functions[f].calls;
    const std::vector<ir::DefCall>& b = loaded.functions[f].calls;
    REQUIRE(a.size() == b.size());
    for (size_t c = 0; c < a.size(); ++c) {
      CHECK(a[c].def == b[c].def);
      CHECK(a[c].path == b[c].path);
      CHECK(a[c].recompute == b[c].recompute);
    }
    CHECK(llvm::any_of(a, [](const ir::DefCall& call) { return call.recompute; }));
  }

  // A def no train block calls is sema's error: nothing is derived, the module stays as it was.
  ir::Module unchanged = plain;
  CHECK_FALSE(train::applyRecompute(unchanged, {"nothing"}, forwardOps));
  CHECK_FALSE(train::applyRecompute(unchanged, {"layer"}, {forwardOps.front()}));
  CHECK(printed(unchanged) == printed(plain));
}

TEST_CASE("the interpreter trains the recomputed step exactly as the plain one") {
  Trained plain(source(false));
  Trained recomputed(source(true));
  interp::Options opts;
  opts.seed = 5;
  opts.training = true;
  interp::TensorMap inputs;
  for (const ir::InputInfo& input : plain.fn().inputs)
    inputs[input.name] = interp::synthesizeInput(input, 3);
  interp::TensorMap plainState, recomputedState;
  for (uint64_t step = 0; step < 3; ++step) {
    opts.step = step;
    llvm::Expected<double> a = interp::trainStep(plain.fn(), inputs, opts, plainState);
    if (!a) FAIL(llvm::toString(a.takeError()));
    llvm::Expected<double> b = interp::trainStep(recomputed.fn(), inputs, opts, recomputedState);
    if (!b) FAIL(llvm::toString(b.takeError()));
    CHECK(*a == *b);
  }
  REQUIRE(plainState.size() == recomputedState.size());
  for (const auto& [path, tensor] : plainState) {
    INFO(path);
    CHECK(tensor.data == recomputedState.at(path).data);
  }
}

TEST_CASE("the plan's activation memory drops; the report's figure is the dropped activations") {
  auto planOf = [](Trained& trained) {
    plan::PlannerOptions options;
    std::optional<std::vector<plan::PlannedFunction>> plans =
        plan::planModule(trained.module, options, trained.compiled.diag);
    REQUIRE(plans);
    return std::move(plans->front());
  };
  Trained plain(source(false));
  Trained recomputed(source(true));
  plan::PlannedFunction before = planOf(plain), after = planOf(recomputed);
  CHECK(plan::summarizeRecompute(before.spmd).empty());
  std::vector<plan::RecomputeSummary> summary = plan::summarizeRecompute(after.spmd);
  REQUIRE(summary.size() == 1);
  CHECK(summary[0].def == "layer");
  CHECK(summary[0].calls == 4);
  CHECK(summary[0].flops > 0);
  CHECK(summary[0].seconds > 0);
  // The dropped activations, from the IR: the copies the rest of the step reads, each its local
  // size under `batch: data` over 2 devices.
  const ir::Function& fn = recomputed.fn();
  std::vector<std::vector<size_t>> readersOf = readers(fn);
  double dropped = 0;
  for (const ir::Op& op : fn.ops)
    if (isCopy(op) && llvm::any_of(readersOf[op.result],
                                   [&](size_t reader) { return !isCopy(fn.ops[reader]); })) {
      const ir::TensorType& type = fn.typeOf(op.result);
      dropped += double(type.numElements() / (type.hasDim("batch") ? 2 : 1) *
                        plan::dtypeBytes(type.dtype));
    }
  CHECK(dropped > 0);
  CHECK(summary[0].droppedBytes == dropped);
  CHECK(after.spmd.memory.peakActivationBytes < before.spmd.memory.peakActivationBytes);
  CHECK(after.spmd.summary.computeSeconds > before.spmd.summary.computeSeconds);
}

TEST_CASE("the kernel passes keep the copies apart and the arena shrinks") {
  auto lower = [](Trained& trained, std::vector<std::string> disabled) {
    std::optional<std::vector<plan::PlannedFunction>> plans =
        plan::planModule(trained.module, plan::PlannerOptions{}, trained.compiled.diag);
    REQUIRE(plans);
    llvm::Expected<kir::KernelModule> kernels =
        kir::lowerModule(trained.module, *plans, kir::LowerOptions{std::move(disabled)});
    if (!kernels) FAIL(llvm::toString(kernels.takeError()));
    return std::move(kernels->functions.front());
  };
  auto copiesIn = [](const kir::KernelFunction& fn) {
    return llvm::count_if(fn.body, [](const kir::Stmt& stmt) { return stmt.recomputed; });
  };
  Trained recomputed(source(true));
  std::vector<std::string> allPasses;
  for (const kir::KernelPass& pass : kir::kernelPasses())
    allPasses.push_back(pass.name);
  kir::KernelFunction unpassed = lower(recomputed, allPasses);
  ptrdiff_t copies = copiesIn(unpassed);
  REQUIRE(copies > 0);
  kir::KernelFunction merged = unpassed;
  kir::eliminateCommonSubexpressions(merged);
  CHECK(copiesIn(merged) == copies);
  // Unmarked, copies are merged into the forward statements they repeat (those whose reads are
  // single-writer buffers, and the copies reading them): the mark is what keeps them.
  for (kir::Stmt& stmt : unpassed.body)
    stmt.recomputed = false;
  size_t statements = unpassed.body.size();
  kir::eliminateCommonSubexpressions(unpassed);
  CHECK(unpassed.body.size() < statements);

  // With every pass, the arena (planned by liveness) is smaller than without recomputation.
  Trained plain(source(false));
  CHECK(lower(recomputed, {}).arenaBytes < lower(plain, {}).arenaBytes);
}

// A layer computing in bf16 from f32 master weights: the copies include `cast(w, bf16)`, which
// reads a param and has its shape (the update's signature in planner/SpmdLowering.cpp's
// opPhases). The copies must still be backward: they run in the backward pass once per
// microbatch, and so does every gradient they feed (Megatron-1T with --recompute predicted a
// stage's backward at 1.3 ms against 77.5 ms without, its gradients charged once per step).
constexpr const char* kMixedSource = R"(
mesh grid[data = 2]
dim batch = 64
dim d = 8
dim f = 32
layout batch: data

RECOMPUTEdef layer(x: bf16[batch, d]) -> bf16[batch, d] {
  param w_in: f32[d, f] = normal(stddev = 0.3)
  param w_out: f32[f, d] = normal(stddev = 0.3)
  let h = gelu(einsum(layer_norm(x, d), cast(w_in, bf16) -> batch, f))
  return x + einsum(h, cast(w_out, bf16) -> batch, d)
}

train t(x: f32[batch, d], y: f32[batch, d]) {
  let h = cast(x, bf16)
  repeat 4 {
    h = layer(h)
  }
  minimize mean(square(cast(h, f32) - y)) with sgd(lr = 0.1)
}
)";

TEST_CASE("recomputed copies are backward: the backward grows by exactly their time") {
  auto mixed = [](bool annotated) {
    std::string text = kMixedSource;
    text.replace(text.find("RECOMPUTE"), 9, annotated ? "recompute " : "");
    return text;
  };
  auto planOf = [](Trained& trained) {
    std::optional<std::vector<plan::PlannedFunction>> plans =
        plan::planModule(trained.module, plan::PlannerOptions{}, trained.compiled.diag);
    REQUIRE(plans);
    return std::move(plans->front());
  };
  Trained plain(mixed(false));
  Trained recomputed(mixed(true));
  // The copies of the weights' casts are there (the case this checks).
  const ir::Function& fn = recomputed.fn();
  CHECK(llvm::any_of(fn.ops, [&](const ir::Op& op) {
    return isCopy(op) && op.kind == ir::OpKind::Cast &&
           fn.values[op.operands[0]].definingOp < fn.ops.size() &&
           fn.ops[fn.values[op.operands[0]].definingOp].kind == ir::OpKind::Param;
  }));
  plan::PlannedFunction before = planOf(plain), after = planOf(recomputed);
  auto seconds = [](const plan::SpmdFunction& spmd, plan::Phase phase) {
    double total = 0;
    for (const plan::SpmdOp& op : spmd.ops)
      total += op.phase == phase ? op.seconds : 0;
    return total;
  };
  // Every SPMD op lowered from a copy is backward.
  std::set<size_t> copySources;
  for (size_t i = 0; i < fn.ops.size(); ++i)
    if (isCopy(fn.ops[i])) copySources.insert(i);
  size_t copyOps = 0;
  for (const plan::SpmdOp& op : after.spmd.ops)
    if (copySources.count(op.sourceOp)) {
      CHECK(op.phase == plan::Phase::Backward);
      ++copyOps;
    }
  CHECK(copyOps > 0);
  std::vector<plan::RecomputeSummary> summary = plan::summarizeRecompute(after.spmd);
  REQUIRE(summary.size() == 1);
  REQUIRE(summary[0].seconds > 0);
  // Forward and update as without recomputation; backward longer by the copies' time, exactly
  // (the report's "compute added").
  CHECK(seconds(after.spmd, plan::Phase::Forward) == seconds(before.spmd, plan::Phase::Forward));
  CHECK(seconds(after.spmd, plan::Phase::Update) == seconds(before.spmd, plan::Phase::Update));
  CHECK(seconds(after.spmd, plan::Phase::Backward) ==
        Approx(seconds(before.spmd, plan::Phase::Backward) + summary[0].seconds).epsilon(1e-12));
  CHECK(after.spmd.memory.peakActivationBytes < before.spmd.memory.peakActivationBytes);
}

TEST_CASE("the search's exact costing merges a recomputed layer's all-reduces as the plan does") {
  // d split over `model`: each layer's first einsum (over d) is a partial sum that gelu needs
  // resolved, by a forward all-reduce and again by one in its recomputed copy. The plan's merge
  // keeps the copy's out of forward buckets (MergeCollectives.cpp); the evaluator's exact costing,
  // which lowers without describing the ops, must see the copies too, or it prices another merge
  // than the one the plan then reports.
  std::string text = source(true);
  text.replace(text.find("mesh grid[data = 2]"), 19, "mesh grid[data = 2, model = 2]");
  text.replace(text.find("layout batch: data"), 18, "layout batch: data, d: model");
  text.replace(text.find("dropout(h, rate = 0.25)"), 23, "h");
  Trained recomputed(text);
  std::optional<std::vector<plan::PlannedFunction>> plans =
      plan::planModule(recomputed.module, plan::PlannerOptions{}, recomputed.compiled.diag);
  REQUIRE(plans);
  const plan::SpmdFunction& spmd = plans->front().spmd;
  // The case this checks: all-reduces lowered from the copies exist.
  std::set<size_t> copySources;
  for (size_t i = 0; i < recomputed.fn().ops.size(); ++i)
    if (isCopy(recomputed.fn().ops[i])) copySources.insert(i);
  CHECK(llvm::any_of(spmd.ops, [&](const plan::SpmdOp& op) {
    return op.kind == plan::SpmdOp::Kind::Collective && copySources.count(op.sourceOp);
  }));
  llvm::Expected<plan::Machine> cpu = plan::loadMachine("cpu");
  REQUIRE(static_cast<bool>(cpu));
  plan::PlanEvaluator evaluator(recomputed.module, recomputed.fn(), spmd.mesh, *cpu);
  CHECK(evaluator.stepSeconds(spmd.layout) == Approx(spmd.summary.stepSeconds).epsilon(1e-12));
}
