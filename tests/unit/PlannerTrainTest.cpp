// Planning train steps that went through autodiff (Function::updates set): broadcast and step
// lowered, updates resharded into their params' layouts, gradient partial sums over a split batch
// dim resolved by all-reduce, small ones bucketed into one collective placed as early as their
// producers allow, phases (forward / backward / update) attributed, and the real ops costed
// instead of the modelled backward. The train steps here are built by hand, as autodiff would
// emit them, so that these rules are tested independently of autodiff. Last, the merging of
// independent all-reduces (mergeAllReduces) on SPMD functions written by hand.
#include "planner/CostModel.h"
#include "planner/MergeCollectives.h"
#include "planner/PlanReport.h"
#include "planner/SpmdLowering.h"

#include <catch2/catch.hpp>

#include <llvm/Support/SourceMgr.h>

#include <algorithm>

using namespace meshc;
using namespace meshc::plan;

namespace {

ir::TensorType f32(std::vector<std::pair<std::string, int64_t>> dims) {
  ir::TensorType type;
  for (auto& [name, size] : dims)
    type.dims.push_back({name, size});
  return type;
}

/// A linear model's SGD step, as autodiff + optimizer lowering would write it:
///   y = einsum(x, w) + b;  loss = sum(y)
///   dy = broadcast(1);  dw = einsum(x, dy);  db = sum(dy over batch)
///   lr = 0.1 / (1 + step);  w' = w - lr * dw;  b' = b - lr * db
struct LinearStep {
  ir::Module module;
  ir::ValueId dw = 0, db = 0;

  LinearStep(int64_t batch, int64_t dIn, int64_t dOut) {
    module.mesh = {{"data", 2}, {"model", 2}};
    module.dims = {{"batch", batch}, {"d_in", dIn}, {"d_out", dOut}};
    ir::Function fn;
    fn.kind = ir::Function::Kind::Train;
    fn.name = "step";
    fn.train = ir::TrainInfo{};
    fn.train->optimizer = "sgd";
    auto op = [&](ir::OpKind kind, std::vector<ir::ValueId> operands, ir::TensorType type,
                  std::string name = {},
                  std::vector<std::pair<std::string, ir::AttrValue>> attrs = {}) {
      ir::Op o;
      o.kind = kind;
      o.operands = std::move(operands);
      o.attrs = std::move(attrs);
      o.loc.file = "hand.mesh";
      o.loc.line = static_cast<unsigned>(fn.ops.size() + 1);
      return fn.addOp(std::move(o), std::move(type), std::move(name));
    };
    ir::TensorType xType = f32({{"batch", batch}, {"d_in", dIn}});
    ir::TensorType wType = f32({{"d_in", dIn}, {"d_out", dOut}});
    ir::TensorType bType = f32({{"d_out", dOut}});
    ir::TensorType yType = f32({{"batch", batch}, {"d_out", dOut}});
    ir::TensorType scalar = f32({});
    ir::ValueId x = op(ir::OpKind::Input, {}, xType, "x", {{"name", std::string("x")}});
    fn.inputs.push_back({"x", xType, 0, {}, x});
    ir::ValueId w = op(ir::OpKind::Param, {}, wType, "w", {{"path", std::string("w")}});
    ir::ValueId b = op(ir::OpKind::Param, {}, bType, "b", {{"path", std::string("b")}});
    fn.params.push_back({"w", wType, {"normal", {}}, true, {}, w});
    fn.params.push_back({"b", bType, {"zeros", {}}, true, {}, b});
    ir::ValueId xw = op(ir::OpKind::Einsum, {x, w}, yType, "xw");
    ir::ValueId y = op(ir::OpKind::Add, {xw, b}, yType, "y");
    ir::ValueId loss = op(ir::OpKind::ReduceSum, {y}, scalar, "loss",
                          {{"dims", std::vector<std::string>{"batch", "d_out"}}});
    fn.outputs.push_back({"loss", loss, {}});
    fn.train->loss = loss;
    ir::ValueId one = op(ir::OpKind::Literal, {}, scalar, "", {{"value", 1.0}});
    ir::ValueId dy = op(ir::OpKind::Broadcast, {one}, yType, "dy");
    dw = op(ir::OpKind::Einsum, {x, dy}, wType, "dw");
    db =
        op(ir::OpKind::ReduceSum, {dy}, bType, "db", {{"dims", std::vector<std::string>{"batch"}}});
    ir::ValueId step = op(ir::OpKind::TrainStep, {}, scalar, "step");
    ir::ValueId oneMore = op(ir::OpKind::Add, {step, one}, scalar);
    ir::ValueId base = op(ir::OpKind::Literal, {}, scalar, "base", {{"value", 0.1}});
    ir::ValueId lr = op(ir::OpKind::Div, {base, oneMore}, scalar, "lr");
    ir::ValueId stepW = op(ir::OpKind::Mul, {dw, lr}, wType);
    ir::ValueId newW = op(ir::OpKind::Sub, {w, stepW}, wType, "w_new");
    ir::ValueId stepB = op(ir::OpKind::Mul, {db, lr}, bType);
    ir::ValueId newB = op(ir::OpKind::Sub, {b, stepB}, bType, "b_new");
    fn.updates = {{0, newW}, {1, newB}};
    module.functions.push_back(std::move(fn));
  }
  const ir::Function& fn() const { return module.functions.front(); }
};

Mesh meshOf(std::vector<std::pair<std::string, int64_t>> axes) {
  Mesh mesh;
  for (auto& [name, size] : axes)
    mesh.axes.push_back({name, size});
  return mesh;
}

Machine cpu() {
  llvm::Expected<Machine> machine = loadMachine("cpu");
  REQUIRE(static_cast<bool>(machine));
  return *machine;
}

std::optional<SpmdFunction> lower(const LinearStep& step, const Mesh& mesh, const Layout& layout) {
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream stream(errors);
  DiagEngine diag(sources, stream);
  std::optional<SpmdFunction> fn = lowerToSpmd(step.module, step.fn(), mesh, layout, cpu(), diag);
  INFO(stream.str());
  return fn;
}

std::vector<const SpmdOp*> collectivesOf(const SpmdFunction& fn) {
  std::vector<const SpmdOp*> out;
  for (const SpmdOp& op : fn.ops)
    if (op.kind == SpmdOp::Kind::Collective) out.push_back(&op);
  return out;
}

/// The index in fn.ops of the op defining value `id` (as a result or one of a bucket's).
size_t definerOf(const SpmdFunction& fn, SpmdValueId id) {
  for (size_t i = 0; i < fn.ops.size(); ++i)
    if (fn.ops[i].result == id || std::find(fn.ops[i].results.begin(), fn.ops[i].results.end(),
                                            id) != fn.ops[i].results.end())
      return i;
  FAIL("value %" << id << " has no defining op");
  return 0;
}

} // namespace

TEST_CASE("data parallel: the gradient partial sums over data are bucketed into one all-reduce") {
  LinearStep step(8, 16, 4);
  Layout layout;
  layout.axes["batch"] = {"data"};
  std::optional<SpmdFunction> fn = lower(step, meshOf({{"data", 2}}), layout);
  REQUIRE(fn);
  CHECK(fn->summary.backwardIsReal);
  CHECK(fn->gradientOps.empty()); // nothing modelled
  std::vector<const SpmdOp*> collectives = collectivesOf(*fn);
  // The loss (a partial sum over data, needed only when the step ends), dw (64 floats) and db
  // (4 floats) are resolved together: one collective.
  REQUIRE(collectives.size() == 1);
  const SpmdOp& bucket = *collectives[0];
  CHECK(bucket.collective.kind == CollectiveKind::BucketedAllReduceSum);
  CHECK(bucket.collective.axes == AxisList{"data"});
  CHECK(bucket.collective.bytes == (1 + 16 * 4 + 4) * 4);
  CHECK(bucket.phase == Phase::Backward);
  REQUIRE(bucket.operands.size() == 3);
  REQUIRE(bucket.results.size() == 3);
  CHECK(fn->values[bucket.operands[0]].name == "loss");
  CHECK(fn->values[bucket.operands[1]].name == "dw");
  CHECK(fn->values[bucket.operands[2]].name == "db");
  for (SpmdValueId id : bucket.operands)
    CHECK(fn->values[id].layout.partialAxes == std::set<std::string>{"data"});
  for (SpmdValueId id : bucket.results)
    CHECK(fn->values[id].layout.partialAxes.empty());
  CHECK(fn->outputs[0].second == bucket.results[0]);
  // Placed as early as dependencies allow: right after db (the later gradient) is computed,
  // before the step counter and the learning rate.
  size_t at = size_t(&bucket - fn->ops.data());
  REQUIRE(at > 0);
  CHECK(fn->ops[at - 1].computeKind == ir::OpKind::ReduceSum);
  CHECK(fn->ops[at - 1].result == bucket.operands[2]);
  CHECK(fn->ops[at + 1].computeKind == ir::OpKind::TrainStep);
  // Every operand is defined before its use, every result after its definition.
  for (size_t i = 0; i < fn->ops.size(); ++i)
    for (SpmdValueId id : fn->ops[i].operands)
      CHECK(definerOf(*fn, id) < i);

  // One summed cost: one bucket of 69 floats instead of three all-reduces.
  Collective single = bucket.collective;
  single.kind = CollectiveKind::AllReduceSum;
  CHECK(bucket.seconds == Approx(collectiveSeconds(cpu(), fn->mesh, single)));
  // The evaluator (the layout search's cost) agrees with the lowering.
  PlanEvaluator evaluator(step.module, step.fn(), fn->mesh, cpu());
  CHECK(evaluator.stepSeconds(layout) == Approx(fn->summary.stepSeconds).epsilon(1e-12));
}

TEST_CASE("phases: forward is the loss's cone, update the optimizer, backward the rest") {
  LinearStep step(8, 16, 4);
  std::optional<SpmdFunction> fn = lower(step, meshOf({{"data", 2}}), Layout{});
  REQUIRE(fn);
  auto phaseOf = [&](ir::OpKind kind, const std::string& name) {
    for (const SpmdOp& op : fn->ops)
      if (op.kind == SpmdOp::Kind::Compute && op.computeKind == kind &&
          fn->values[op.result].name == name)
        return op.phase;
    FAIL("no op " << ir::opSpelling(kind) << " -> " << name);
    return Phase::Forward;
  };
  CHECK(phaseOf(ir::OpKind::Einsum, "xw") == Phase::Forward);
  CHECK(phaseOf(ir::OpKind::ReduceSum, "loss") == Phase::Forward);
  CHECK(phaseOf(ir::OpKind::Broadcast, "dy") == Phase::Backward);
  CHECK(phaseOf(ir::OpKind::Einsum, "dw") == Phase::Backward);
  CHECK(phaseOf(ir::OpKind::TrainStep, "step") == Phase::Update);
  CHECK(phaseOf(ir::OpKind::Div, "lr") == Phase::Update);
  CHECK(phaseOf(ir::OpKind::Literal, "base") == Phase::Update); // its first consumer's
  CHECK(phaseOf(ir::OpKind::Sub, "w_new") == Phase::Update);
  // Replicated: no collective at all, and nothing modelled on top of the real ops but the
  // outputs' return (the machine's output_seconds, once a step).
  CHECK(collectivesOf(*fn).empty());
  double compute = 0;
  for (const SpmdOp& op : fn->ops)
    compute += op.seconds;
  CHECK(fn->summary.outputSeconds > 0);
  CHECK(fn->summary.computeSeconds == Approx(compute + fn->summary.outputSeconds));
  CHECK(fn->summary.communicationSeconds == 0);
}

TEST_CASE("updates are resharded into their params' layouts; broadcast makes new dims locally") {
  LinearStep step(8, 16, 4);
  Layout layout;
  layout.axes["batch"] = {"data"};
  layout.axes["d_out"] = {"model"};
  std::optional<SpmdFunction> fn = lower(step, meshOf({{"data", 2}, {"model", 2}}), layout);
  REQUIRE(fn);
  REQUIRE(fn->updates.size() == 2);
  for (const auto& [param, id] : fn->updates) {
    const TensorLayout& want = fn->values[fn->params[param]].layout;
    CHECK(fn->values[id].layout == want);
    CHECK(fn->values[id].localType == fn->values[fn->params[param]].localType);
  }
  // w is split over model along d_out: its update's local shape is [16, 2].
  CHECK(fn->values[fn->updates[0].second].localType.numElements() == 16 * 2);
  // dy = broadcast(1) is made in its own layout, with no communication.
  for (const SpmdOp& op : fn->ops)
    if (op.kind == SpmdOp::Kind::Compute && op.computeKind == ir::OpKind::Broadcast) {
      CHECK(op.operands.size() == 1);
      CHECK(fn->values[op.result].localType.numElements() == 4 * 2);
    }
  // The gradients are partial over data only (model splits d_out, as the params do).
  for (const SpmdOp* op : collectivesOf(*fn))
    if (op->phase == Phase::Backward) CHECK(op->collective.axes == AxisList{"data"});
}

TEST_CASE("gradients above the bucket size are reduced alone") {
  // dw: 1024 x 1025 floats, over kBucketBytes: its own all-reduce; the loss and db still share.
  LinearStep step(8, 1024, 1025);
  Layout layout;
  layout.axes["batch"] = {"data"};
  std::optional<SpmdFunction> fn = lower(step, meshOf({{"data", 2}}), layout);
  REQUIRE(fn);
  std::vector<const SpmdOp*> collectives = collectivesOf(*fn);
  REQUIRE(collectives.size() == 2);
  int buckets = 0, singles = 0;
  for (const SpmdOp* op : collectives) {
    if (op->collective.kind == CollectiveKind::BucketedAllReduceSum) {
      ++buckets;
      REQUIRE(op->operands.size() == 2);
      CHECK(fn->values[op->operands[0]].name == "loss");
      CHECK(fn->values[op->operands[1]].name == "db");
    } else if (op->collective.kind == CollectiveKind::AllReduceSum) {
      ++singles;
      CHECK(op->collective.bytes == 1024 * 1025 * 4);
      CHECK(op->phase == Phase::Backward);
    }
  }
  CHECK(buckets == 1);
  CHECK(singles == 1);
}

TEST_CASE("the plan report lists the collectives per phase") {
  LinearStep step(8, 16, 4);
  Layout layout;
  layout.axes["batch"] = {"data"};
  std::optional<SpmdFunction> fn = lower(step, meshOf({{"data", 2}}), layout);
  REQUIRE(fn);
  PlannedFunction planned;
  planned.spmd = *fn;
  std::string text;
  llvm::raw_string_ostream os(text);
  printPlan(planned, cpu(), os);
  printSpmd(*fn, os);
  os.flush();
  INFO(text);
  CHECK(text.find("collectives of the forward ops: 0") != std::string::npos);
  CHECK(text.find("collectives of the backward ops: 1") != std::string::npos);
  CHECK(text.find("collectives of the update ops: 0") != std::string::npos);
  CHECK(text.find("bucketed_all_reduce_sum") != std::string::npos);
  CHECK(text.find("(forward, backward and update, as planned)") != std::string::npos);
  CHECK(text.find("  // backward\n") != std::string::npos);
  CHECK(text.find("  update w = %") != std::string::npos);
}

namespace {

/// A hand-written SPMD function on [data=2, model=2] for mergeAllReduces: sources, negations,
/// adds and all-reduces, each op appended in the order given.
struct HandSpmd {
  SpmdFunction fn;

  HandSpmd() {
    fn.mesh = meshOf({{"data", 2}, {"model", 2}});
    fn.kind = ir::Function::Kind::Train;
  }
  SpmdValueId value(const std::string& name, bool partial = false) {
    SpmdValue v;
    v.globalType = f32({{"d", 8}});
    v.localType = v.globalType;
    v.layout.dimAxes = {{}};
    if (partial) v.layout.partialAxes = {"model"};
    v.name = name;
    fn.values.push_back(v);
    return SpmdValueId(fn.values.size() - 1);
  }
  SpmdValueId compute(ir::OpKind kind, std::vector<SpmdValueId> operands, const std::string& name,
                      bool partial = false) {
    SpmdOp op;
    op.computeKind = kind;
    op.operands = std::move(operands);
    op.result = value(name, partial);
    fn.ops.push_back(op);
    return op.result;
  }
  SpmdValueId allReduce(SpmdValueId operand, const std::string& name, AxisList axes = {"model"},
                        CollectiveKind kind = CollectiveKind::AllReduceSum, int64_t bytes = 32) {
    SpmdOp op;
    op.kind = SpmdOp::Kind::Collective;
    op.collective.kind = kind;
    op.collective.axes = std::move(axes);
    op.collective.bytes = bytes;
    op.collective.groupSize = splitFactor(fn.mesh, op.collective.axes);
    op.seconds = collectiveSeconds(cpu(), fn.mesh, op.collective);
    op.operands = {operand};
    op.result = value(name);
    fn.ops.push_back(op);
    fn.summary.communicationSeconds += op.seconds;
    fn.summary.stepSeconds += op.seconds;
    return op.result;
  }
  /// The names of the ops' results, in order ("ar(a,b)" for a collective over a and b).
  std::string order() const {
    std::string text;
    for (const SpmdOp& op : fn.ops) {
      if (!text.empty()) text += " ";
      if (op.kind == SpmdOp::Kind::Compute) {
        text += fn.values[op.result].name;
        continue;
      }
      text += "ar(";
      for (size_t k = 0; k < op.operands.size(); ++k)
        text += (k ? "," : "") + fn.values[op.operands[k]].name;
      text += ")";
    }
    return text;
  }
};

} // namespace

TEST_CASE("merging: independent all-reduce-sums over the same axes become one, moved to fit") {
  HandSpmd h;
  SpmdValueId a = h.compute(ir::OpKind::Input, {}, "a", true);
  SpmdValueId ra = h.allReduce(a, "ra");
  SpmdValueId x = h.compute(ir::OpKind::Neg, {ra}, "x");
  // b and its all-reduce come after ra's first use, but b does not need ra: b moves up.
  SpmdValueId b = h.compute(ir::OpKind::Input, {}, "b", true);
  SpmdValueId rb = h.allReduce(b, "rb");
  h.compute(ir::OpKind::Add, {x, rb}, "y");
  double before = h.fn.summary.stepSeconds;
  double saved = mergeAllReduces(h.fn, cpu());
  CHECK(h.order() == "a b ar(a,b) x y");
  const SpmdOp& merged = h.fn.ops[2];
  CHECK(merged.collective.kind == CollectiveKind::BucketedAllReduceSum);
  CHECK(merged.collective.axes == AxisList{"model"});
  CHECK(merged.collective.bytes == 64);
  CHECK(merged.results == std::vector<SpmdValueId>{ra, rb});
  CHECK(merged.result == ra);
  // Priced once: one alpha, the beta term on the total bytes; the summary saves one alpha.
  CHECK(merged.seconds == Approx(collectiveSeconds(cpu(), h.fn.mesh, merged.collective)));
  Collective single = merged.collective;
  single.kind = CollectiveKind::AllReduceSum;
  single.bytes = 32;
  CHECK(saved == Approx(2 * collectiveSeconds(cpu(), h.fn.mesh, single) - merged.seconds));
  // One latency: 2 alpha, and on this oversubscribed mesh (4 ranks, 2 cores) one sync.
  CHECK(saved == Approx(2 * linkFor(cpu(), h.fn.mesh, {"model"}).alphaSeconds +
                        oversubscribedSyncSeconds(cpu(), h.fn.mesh, {"model"})));
  CHECK(saved > 0);
  CHECK(h.fn.summary.stepSeconds == Approx(before - saved));
}

TEST_CASE("merging: an all-reduce that reads another's result is not merged with it") {
  HandSpmd h;
  SpmdValueId a = h.compute(ir::OpKind::Input, {}, "a", true);
  SpmdValueId ra = h.allReduce(a, "ra");
  SpmdValueId x = h.compute(ir::OpKind::Neg, {ra}, "x", true);
  SpmdValueId rx = h.allReduce(x, "rx"); // depends on ra through x
  h.compute(ir::OpKind::Neg, {rx}, "y");
  std::string before = h.order();
  CHECK(mergeAllReduces(h.fn, cpu()) == 0);
  CHECK(h.order() == before);
  for (const SpmdOp& op : h.fn.ops)
    CHECK(op.collective.kind != CollectiveKind::BucketedAllReduceSum);
}

TEST_CASE("merging: only all-reduce-sums over the same group, in-place ones stay with their op") {
  HandSpmd h;
  SpmdValueId a = h.compute(ir::OpKind::Input, {}, "a", true);
  SpmdValueId b = h.compute(ir::OpKind::Input, {}, "b", true);
  SpmdValueId c = h.compute(ir::OpKind::Input, {}, "c", true);
  SpmdValueId s = h.compute(ir::OpKind::Softmax, {a}, "s");
  // softmax's own row statistics: in place on its result, absorbed by the op.
  SpmdOp stats;
  stats.kind = SpmdOp::Kind::Collective;
  stats.collective.kind = CollectiveKind::AllReduceSum;
  stats.collective.axes = {"model"};
  stats.collective.bytes = 32;
  stats.operands = {s};
  stats.result = s;
  h.fn.ops.push_back(stats);
  SpmdValueId ra = h.allReduce(a, "ra");
  SpmdValueId rb = h.allReduce(b, "rb", {"data"});
  SpmdValueId rc = h.allReduce(c, "rc", {"model"}, CollectiveKind::AllReduceMax);
  h.compute(ir::OpKind::Add, {ra, rb}, "x");
  h.compute(ir::OpKind::Add, {rc, s}, "y");
  std::string before = h.order();
  CHECK(mergeAllReduces(h.fn, cpu()) == 0);
  CHECK(h.order() == before);
}

TEST_CASE("merging: a bucket stays within kBucketBytes") {
  HandSpmd h;
  SpmdValueId a = h.compute(ir::OpKind::Input, {}, "a", true);
  SpmdValueId b = h.compute(ir::OpKind::Input, {}, "b", true);
  SpmdValueId c = h.compute(ir::OpKind::Input, {}, "c", true);
  SpmdValueId ra = h.allReduce(a, "ra", {"model"}, CollectiveKind::AllReduceSum, kBucketBytes);
  SpmdValueId rb = h.allReduce(b, "rb", {"model"}, CollectiveKind::AllReduceSum, 16);
  SpmdValueId rc = h.allReduce(c, "rc", {"model"}, CollectiveKind::AllReduceSum, 16);
  h.compute(ir::OpKind::Add, {ra, rb}, "x");
  h.compute(ir::OpKind::Neg, {rc}, "y");
  mergeAllReduces(h.fn, cpu());
  CHECK(h.order() == "a b c ar(a) ar(b,c) x y");
}
