// The op table (OpKinds.def through ir/OpTraits.h) and the IR verifier: every example verifies
// after sema, after the training phase and after planning; hand-broken IR is rejected with a
// message naming what is wrong.
#include "ir/Verifier.h"
#include "CompiledSource.h"
#include "frontend/SourceLoader.h"
#include "ir/OpTraits.h"
#include "planner/Planner.h"
#include "planner/VerifySpmd.h"
#include "sema/Sema.h"
#include "train/Optimizer.h"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <llvm/Support/SourceMgr.h>

#include <filesystem>
#include <set>

using namespace meshc;
using ir::OpKind;
using ir::ResultRule;

namespace {

std::string joined(const std::vector<ir::VerifierError>& errors) {
  std::string text;
  for (const ir::VerifierError& error : errors)
    text += error.format() + "\n";
  return text;
}

using Compiled = testing::CompiledSource;

const char* const kSmallTrain = R"(
dim batch = 4
dim d = 8
dim h = 6
train small(x: f32[batch, d]) {
  param w: f32[d, h] = normal(stddev = 0.1)
  let y = einsum(x, w -> batch, h)
  let loss = mean(square(y + 1.0))
  minimize loss with sgd(lr = 0.1)
}
)";

/// The small train block after sema and the training phase: verified clean.
ir::Function trainedSmall() {
  Compiled compiled(kSmallTrain, {}, "small.mesh");
  INFO(compiled.errors);
  REQUIRE(compiled.module);
  ir::Function fn = compiled.module->functions.at(0);
  REQUIRE(train::lowerTraining(fn, compiled.diag));
  REQUIRE(!fn.updates.empty());
  REQUIRE(joined(ir::verifyFunction(fn)).empty());
  return fn;
}

size_t firstOp(const ir::Function& fn, OpKind kind) {
  for (size_t i = 0; i < fn.ops.size(); ++i)
    if (fn.ops[i].kind == kind) return i;
  FAIL("no " << ir::opSpelling(kind) << " op");
  return 0;
}

void requireError(const ir::Function& fn, const std::string& expected) {
  std::string errors = joined(ir::verifyFunction(fn));
  INFO(errors);
  CHECK(errors.find(expected) != std::string::npos);
}

} // namespace

TEST_CASE("Every op has its traits filled consistently", "[ir][optable]") {
  REQUIRE(ir::kNumOpKinds > static_cast<size_t>(OpKind::Dropout));
  std::set<std::string> spellings;
  for (size_t k = 0; k < ir::kNumOpKinds; ++k) {
    OpKind kind = static_cast<OpKind>(k);
    const ir::OpTraits& traits = ir::opTraits(kind);
    INFO(ir::opSpelling(kind));
    CHECK(spellings.insert(ir::opSpelling(kind)).second);
    CHECK(!std::string(ir::opDescription(kind)).empty());
    CHECK(traits.arity >= ir::Variadic);
    // Sources take no operands and nothing else does.
    CHECK((traits.result == ResultRule::Source) == (traits.arity == 0));
    if (traits.isSource()) {
      CHECK(traits.linear == ir::NoOperands);
      CHECK(traits.gradient == ir::NoOperands);
      CHECK(!traits.isElementwise());
    }
    // An elementwise op's result has the operands' dims (or a reordering, or more of them).
    if (traits.isElementwise()) {
      static const std::set<ResultRule> kElementwiseRules = {
          ResultRule::Same,      ResultRule::Convert, ResultRule::Permute, ResultRule::Expand,
          ResultRule::Broadcast, ResultRule::Compare, ResultRule::Select,  ResultRule::External};
      CHECK(kElementwiseRules.count(traits.result) == 1);
    }
    // Fixed-arity ops only name operands they have.
    if (!traits.isVariadic() && traits.arity > 0) {
      unsigned operandBits = (1u << traits.arity) - 1;
      CHECK((traits.linear & ~operandBits) == 0);
      CHECK((traits.gradient & ~operandBits) == 0);
    }
    // Compares give i32 0/1: no gradient and not linear; an op that rejects differentiation has
    // no rule.
    if (traits.result == ResultRule::Compare) CHECK(!traits.isDifferentiable());
    if (traits.rejectsGradient()) CHECK(!traits.isDifferentiable());
    // The RNG is keyed by a stream; an op linear in an operand is differentiable in it.
    if (traits.readsRng()) CHECK(std::string(traits.attrs).find("stream") != std::string::npos);
    for (size_t operand = 0; operand < 3; ++operand)
      if (traits.isLinearIn(operand) && kind != OpKind::StopGradient)
        CHECK(traits.hasGradientFor(operand));
    // Reductions and ops along a dim name it.
    if (traits.result == ResultRule::Reduce)
      CHECK(std::string(traits.attrs).find("dims") != std::string::npos);
  }
  CHECK(ir::opTraits(OpKind::Add).isLinearIn(1));
  CHECK(!ir::opTraits(OpKind::Div).isLinearIn(1));
  CHECK(ir::opTraits(OpKind::Where).hasGradientFor(1));
  CHECK(!ir::opTraits(OpKind::Where).hasGradientFor(0));
  CHECK(ir::opTraits(OpKind::Einsum).acceptsOperandCount(3));
  CHECK(!ir::opTraits(OpKind::Einsum).acceptsOperandCount(0));
  CHECK(!ir::opTraits(OpKind::Add).acceptsOperandCount(3));
}

TEST_CASE("Every example and golden case verifies after sema, training and planning",
          "[ir][verifier]") {
  // The examples, and the golden IR cases (which cover sharing, tying and the rarer ops).
  std::vector<std::string> paths;
  for (const char* dir : {"/dsl-examples", "/tests/golden"})
    for (const auto& entry :
         std::filesystem::directory_iterator(std::string(MESHC_SOURCE_DIR) + dir))
      if (entry.path().extension() == ".mesh") paths.push_back(entry.path().string());
  std::sort(paths.begin(), paths.end());
  REQUIRE(paths.size() >= 19);
  for (const std::string& path : paths) {
    SECTION(std::filesystem::path(path).parent_path().filename().string() + "/" +
            std::filesystem::path(path).stem().string()) {
      Compiled compiled(path, {});
      INFO(compiled.errors);
      REQUIRE(compiled.module);
      CHECK(joined(ir::verifyModule(*compiled.module)) == "");
      for (ir::Function& fn : compiled.module->functions) {
        REQUIRE(train::lowerTraining(fn, compiled.diag));
        if (fn.kind == ir::Function::Kind::Train) CHECK(!fn.updates.empty());
      }
      CHECK(joined(ir::verifyModule(*compiled.module)) == "");
      std::optional<std::vector<plan::PlannedFunction>> plans =
          plan::planModule(*compiled.module, plan::PlannerOptions{}, compiled.diag);
      compiled.errorStream.flush();
      INFO(compiled.errors);
      REQUIRE(plans);
      CHECK(plans->size() == compiled.module->functions.size());
      for (const plan::PlannedFunction& planned : *plans)
        CHECK(joined(plan::verifySpmdFunction(planned.spmd)) == "");
    }
  }
}

TEST_CASE("The verifier rejects hand-broken IR", "[ir][verifier]") {
  ir::Function fn = trainedSmall();

  SECTION("wrong arity") {
    fn.ops[firstOp(fn, OpKind::Add)].operands.pop_back();
    requireError(fn, "op %");
    requireError(fn, "= add: has 1 operands but takes 2");
  }
  SECTION("wrong result dims") {
    size_t einsum = firstOp(fn, OpKind::Einsum);
    fn.values[fn.ops[einsum].result].type.dims.push_back({"nowhere", 3});
    requireError(fn, "= einsum: result dim nowhere=3 is not a dim of any operand");
    size_t add = firstOp(fn, OpKind::Add);
    ir::TensorType& addType = fn.values[fn.ops[add].result].type;
    addType.dims.pop_back();
    requireError(fn, "= add: result dims");
    requireError(fn, "differ from the union of the operands'");
  }
  SECTION("a dim twice in one type") {
    size_t einsum = firstOp(fn, OpKind::Einsum);
    fn.values[fn.ops[einsum].result].type.dims.push_back({"h", 6});
    requireError(fn, "= einsum: dim 'h' appears twice in its result f32[batch=4, h=6, h=6]");
  }
  SECTION("a reduction that keeps a reduced dim") {
    size_t sum = firstOp(fn, OpKind::ReduceMean);
    fn.ops[sum].setAttr("dims", std::vector<std::string>{"batch"});
    requireError(fn, "= mean: result dims [] differ from its operand's less [dims]");
  }
  SECTION("a compare that is not i32") {
    ir::Op lt{OpKind::Lt, {fn.params[0].value, fn.params[0].value}, 0, {}, {}};
    fn.addOp(lt, fn.params[0].type);
    requireError(fn, "= lt: result dtype f32 differs from a comparison's i32");
  }
  SECTION("a layer_norm_grad whose cotangent is not x's type") {
    // x: f32[d, h] (the param), ct: the einsum's f32[batch, h].
    size_t einsum = firstOp(fn, OpKind::Einsum);
    ir::Op grad{OpKind::LayerNormGrad,
                {fn.params[0].value, fn.ops[einsum].result},
                0,
                {{"dims", std::vector<std::string>{"h"}}, {"eps", 1e-5}},
                {}};
    fn.addOp(grad, fn.params[0].type);
    requireError(fn, "= layer_norm_grad: result type f32[d=8, h=6] differs from its operand's "
                     "f32[batch=4, h=6]");
  }
  SECTION("use before def") {
    size_t einsum = firstOp(fn, OpKind::Einsum);
    fn.ops[einsum].operands[1] = static_cast<ir::ValueId>(fn.values.size() - 1);
    requireError(fn, fmt::format("= einsum: uses %{} before its definition", fn.values.size() - 1));
  }
  SECTION("a value defined twice") {
    fn.ops[1].result = fn.ops[0].result;
    requireError(fn, "a second time");
    requireError(fn, "is defined by no op");
  }
  SECTION("mismatched update type") {
    ir::ParamUpdate& update = fn.updates.front();
    update.value = fn.train->loss; // an f32[] scalar for a matrix
    requireError(fn, "the update of param 'w' has type f32[] but the param has type "
                     "f32[d=8, h=6]");
  }
  SECTION("missing attr") {
    size_t mean = firstOp(fn, OpKind::ReduceMean);
    fn.ops[mean].attrs.clear();
    requireError(fn, "= mean: lacks its attribute [dims]");
  }
  SECTION("a param op outside the params table") {
    fn.params.front().type.dims.pop_back();
    requireError(fn, "= param: result type f32[d=8, h=6] differs from param 'w''s f32[d=8]");
  }
  SECTION("the error names the op's source location") {
    size_t add = firstOp(fn, OpKind::Add);
    fn.ops[add].operands.pop_back();
    std::vector<ir::VerifierError> errors = ir::verifyFunction(fn);
    REQUIRE(!errors.empty());
    CHECK(errors.front().loc.file == "small.mesh");
    CHECK(errors.front().loc.line == 8);
    CHECK(errors.front().format().rfind("small.mesh:8:", 0) == 0);
    CHECK(errors.front().function == "small");
  }
}

TEST_CASE("The SPMD verifier checks the planner's output", "[planner][verifier]") {
  Compiled compiled(kSmallTrain, {}, "small.mesh");
  REQUIRE(compiled.module);
  REQUIRE(train::lowerTraining(compiled.module->functions.at(0), compiled.diag));
  auto plans = plan::planModule(*compiled.module, plan::PlannerOptions{}, compiled.diag);
  REQUIRE(plans);
  plan::SpmdFunction spmd = plans->at(0).spmd;
  REQUIRE(joined(plan::verifySpmdFunction(spmd)).empty());
  SECTION("use before def") {
    size_t last = spmd.ops.size() - 1;
    spmd.ops.front().operands.push_back(spmd.ops[last].result);
    CHECK(joined(plan::verifySpmdFunction(spmd)).find("before its definition") !=
          std::string::npos);
  }
  SECTION("mismatched update type") {
    REQUIRE(!spmd.updates.empty());
    spmd.updates.front().second = spmd.outputs.front().second;
    CHECK(joined(plan::verifySpmdFunction(spmd)).find("has local type f32[]") != std::string::npos);
  }
}
