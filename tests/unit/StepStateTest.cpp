// Step state (`state name: type = init()`, `next name = expr`) through the phases after sema:
// the interpreter's steps against values computed by hand, autodiff (no gradient into or through
// a state), the training phase (the state's update is the user's write, not the optimizer's) and
// the planner (a state is sharded by its dims like a param; its update lands in its layout).
#include "CompiledSource.h"
#include "interp/Interpreter.h"
#include "ir/IRParser.h"
#include "ir/IRPrinter.h"
#include "planner/Machine.h"
#include "planner/SpmdLowering.h"
#include "sema/Sema.h"
#include "train/Autodiff.h"
#include "train/Optimizer.h"

#include <catch2/catch.hpp>

#include <llvm/Support/raw_ostream.h>

using namespace meshc;

namespace {

struct Compiled : testing::CompiledSource {
  using CompiledSource::CompiledSource;
  ir::Function& train() {
    INFO(errors);
    REQUIRE(module);
    REQUIRE(module->functions.size() == 1);
    return module->functions.front();
  }
};

size_t paramIndex(const ir::Function& fn, const std::string& path) {
  for (size_t i = 0; i < fn.params.size(); ++i)
    if (fn.params[i].path == path) return i;
  FAIL("no param " << path);
  return 0;
}

void checkData(const interp::Tensor& t, std::vector<double> want) {
  REQUIRE(t.data.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i)
    CHECK(t.data[i] == Approx(want[i]));
}

// A running counter and an exponential moving average of x * w, read as metrics.
constexpr const char* kCounterAndEma = R"(
dim d = 2
train t(x: f32[d]) -> (seen: f32[], ema_before: f32[]) {
  param w: f32[d] = constant(value = 1)
  state count: f32[] = zeros()
  state ema: f32[d] = constant(value = 2)
  let loss = sum(w * x)
  next count = count + 1.0
  next ema = 0.5 * ema + 0.5 * x * w
  seen = count
  ema_before = mean(ema)
  minimize loss with sgd(lr = 0.5)
}
)";

} // namespace

TEST_CASE("a counter and an EMA state evolve over three steps as computed by hand", "[state]") {
  Compiled compiled(kCounterAndEma);
  ir::Function& fn = compiled.train();
  const ir::ParamInfo& ema = fn.params[paramIndex(fn, "ema")];
  CHECK(ema.role == ir::ParamRole::StepState);
  CHECK_FALSE(ema.trainable);
  CHECK(fn.updates.size() == 2); // sema adds the two writes
  CHECK_FALSE(ir::hasOptimizerUpdates(fn));
  REQUIRE(train::lowerTraining(fn, compiled.diag));
  CHECK(ir::hasOptimizerUpdates(fn));
  CHECK(fn.updates.size() == 3); // and the optimizer only w's

  interp::TensorMap inputs{{"x", interp::Tensor{fn.inputs[0].type, {2, 4}}}}, state, outputs;
  interp::Options opts;
  // Step 1: w = (1, 1), count = 0, ema = (2, 2). After: w = w - 0.5 x = (0, -1), count = 1,
  // ema = 0.5 (2, 2) + 0.5 (2, 4) (1, 1) = (2, 3).
  auto loss = interp::trainStep(fn, inputs, opts, state, &outputs);
  REQUIRE(static_cast<bool>(loss));
  CHECK(*loss == Approx(6));
  checkData(outputs.at("seen"), {0});
  checkData(outputs.at("ema_before"), {2});
  checkData(state.at("count"), {1});
  checkData(state.at("ema"), {2, 3});
  // Step 2: loss = 0 * 2 - 1 * 4; ema = 0.5 (2, 3) + 0.5 (2, 4) (0, -1) = (1, -0.5).
  loss = interp::trainStep(fn, inputs, opts, state, &outputs);
  REQUIRE(static_cast<bool>(loss));
  CHECK(*loss == Approx(-4));
  checkData(outputs.at("seen"), {1});
  checkData(outputs.at("ema_before"), {2.5});
  checkData(state.at("count"), {2});
  checkData(state.at("ema"), {1, -0.5});
  // Step 3: w = (-1, -3): loss = -2 - 12; ema = 0.5 (1, -0.5) + 0.5 (2, 4) (-1, -3).
  loss = interp::trainStep(fn, inputs, opts, state, &outputs);
  REQUIRE(static_cast<bool>(loss));
  CHECK(*loss == Approx(-14));
  checkData(outputs.at("seen"), {2});
  checkData(outputs.at("ema_before"), {0.25});
  checkData(state.at("count"), {3});
  checkData(state.at("ema"), {-0.5, -6.25});
  checkData(state.at("w"), {-2, -5});
}

TEST_CASE("no gradient flows into or through a step state", "[state]") {
  // The loss reads the state (its value at the start of the step) and the state's next value
  // is computed from w: w's gradient is mem * k only, and the state gets none.
  Compiled compiled(R"(
dim d = 2
train t(k: f32[d]) {
  param w: f32[d] = constant(value = 3)
  state mem: f32[d] = constant(value = 0.5)
  let loss = sum(w * mem * k)
  next mem = w * w
  minimize loss with sgd(lr = 0.1)
}
)");
  ir::Function& fn = compiled.train();
  ir::Function forward = fn;
  std::optional<train::Gradients> grads = train::differentiate(forward, compiled.diag);
  REQUIRE(grads);
  REQUIRE(grads->size() == 1);
  CHECK(forward.params[grads->begin()->first].path == "w");
  forward.outputs.push_back(ir::OutputInfo{"dw", grads->begin()->second, {}});
  interp::TensorMap inputs{{"k", interp::Tensor{fn.inputs[0].type, {1.5, -2}}}};
  auto outputs = interp::run(forward, inputs, interp::Options{});
  REQUIRE(static_cast<bool>(outputs));
  checkData(outputs->at("dw"), {0.5 * 1.5, 0.5 * -2});

  // After the training phase the state's one update is still the user's write (w * w).
  ir::ValueId written = fn.updates.at(0).value;
  REQUIRE(train::lowerTraining(fn, compiled.diag));
  size_t mem = paramIndex(fn, "mem");
  std::vector<ir::ValueId> memUpdates;
  for (const ir::ParamUpdate& update : fn.updates)
    if (update.param == mem) memUpdates.push_back(update.value);
  CHECK(memUpdates == std::vector<ir::ValueId>{written});
  CHECK(fn.definingOp(written).kind == ir::OpKind::Mul);

  // Two steps: the second step reads the state the first wrote (w * w = 9), with w trained by
  // the gradient 0.5 k: w = 3 - 0.1 * 0.5 * k.
  interp::TensorMap state;
  REQUIRE(static_cast<bool>(interp::trainStep(fn, inputs, interp::Options{}, state)));
  checkData(state.at("mem"), {9, 9});
  auto second = interp::trainStep(fn, inputs, interp::Options{}, state);
  REQUIRE(static_cast<bool>(second));
  double w0 = 3 - 0.05 * 1.5, w1 = 3 - 0.05 * -2;
  CHECK(*second == Approx(w0 * 9 * 1.5 + w1 * 9 * -2));
  checkData(state.at("mem"), {w0 * w0, w1 * w1});
}

TEST_CASE("the IR of a step state prints and parses back", "[state]") {
  Compiled compiled(kCounterAndEma);
  ir::Function& fn = compiled.train();
  REQUIRE(train::lowerTraining(fn, compiled.diag));
  std::string text;
  llvm::raw_string_ostream os(text);
  ir::printModule(*compiled.module, os);
  os.flush();
  CHECK(text.find("step_state ema: f32[d] = constant(value = 2.0)") != std::string::npos);
  CHECK(text.find("update count = %") != std::string::npos);
  llvm::Expected<ir::Module> parsed = ir::parseModule(text);
  REQUIRE(static_cast<bool>(parsed));
  const ir::Function& back = parsed->functions.front();
  const ir::ParamInfo& ema = back.params[paramIndex(back, "ema")];
  CHECK(ema.role == ir::ParamRole::StepState);
  CHECK_FALSE(ema.trainable);
  CHECK(back.updates.size() == fn.updates.size());
  std::string again;
  llvm::raw_string_ostream os2(again);
  ir::printModule(*parsed, os2);
  os2.flush();
  CHECK(again == text);
}

TEST_CASE("the planner shards a step state by its dims and keeps its update in that layout",
          "[state]") {
  Compiled compiled(R"(
mesh grid[data = 2]
dim batch = 4
dim d = 3
layout batch: data
train t(x: f32[batch, d]) {
  param w: f32[d] = constant(value = 1)
  state mem: f32[batch, d] = zeros()
  let loss = mean(x * w + mem)
  next mem = transpose(x * w -> d, batch)
  minimize loss with sgd(lr = 0.1)
}
)");
  ir::Function& fn = compiled.train();
  REQUIRE(train::lowerTraining(fn, compiled.diag));
  plan::Mesh mesh;
  mesh.axes.push_back({"data", 2});
  plan::Layout layout;
  layout.axes["batch"] = {"data"};
  llvm::Expected<plan::Machine> machine = plan::loadMachine("cpu");
  REQUIRE(static_cast<bool>(machine));
  std::optional<plan::SpmdFunction> spmd =
      plan::lowerToSpmd(*compiled.module, fn, mesh, layout, *machine, compiled.diag);
  INFO(compiled.errors);
  REQUIRE(spmd);
  size_t mem = paramIndex(fn, "mem");
  const auto& stored = spmd->values[spmd->params[mem]];
  CHECK(stored.localType.numElements() == 2 * 3); // batch split over data
  bool found = false;
  for (const auto& [param, id] : spmd->updates)
    if (param == mem) {
      found = true;
      CHECK(spmd->values[id].layout == stored.layout);
      CHECK(spmd->values[id].localType == stored.localType);
    }
  CHECK(found);
}
