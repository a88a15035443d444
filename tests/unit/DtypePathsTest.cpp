// Per-output tolerance dtypes (interp/DtypePaths.h): a bf16 op coarsens only the outputs and
// params it feeds, through the data flow of one step and, in train blocks, across steps.
#include "interp/DtypePaths.h"
#include "CompiledSource.h"
#include "train/Optimizer.h"

#include <catch2/catch.hpp>

#include <map>

using namespace meshc;

namespace {

/// Every function's path dtypes by name, after the training phase.
std::map<std::string, std::string> pathDtypesOf(testing::CompiledSource& compiled) {
  INFO(compiled.errors);
  REQUIRE(compiled.module);
  std::map<std::string, std::string> dtypes;
  for (ir::Function& fn : compiled.module->functions) {
    REQUIRE(train::lowerTraining(fn, compiled.diag));
    for (const auto& [name, dtype] : interp::pathDtypes(fn))
      dtypes[name] = dtype;
  }
  return dtypes;
}

} // namespace

TEST_CASE("a bf16 branch coarsens only the outputs it feeds", "[dtype-paths]") {
  testing::CompiledSource compiled(
      std::string(MESHC_SOURCE_DIR) + "/tests/e2e/cases/mixed_precision.mesh", SemaOptions{});
  std::map<std::string, std::string> dtypes = pathDtypesOf(compiled);
  CHECK(dtypes.at("mixed_precision.fast") == "bf16");
  CHECK(dtypes.at("mixed_precision.exact") == "f32");
  // Training: the loss reads both branches; SGD's update of w_exact reads its gradient, which
  // reads only the f32 branch, and w_fast's reads the bf16 one.
  CHECK(dtypes.at("mixed_precision_train.loss") == "bf16");
  CHECK(dtypes.at("mixed_precision_train.param.branches/w_fast") == "bf16");
  CHECK(dtypes.at("mixed_precision_train.param.branches/w_exact") == "f32");
  CHECK(dtypes.size() == 5);
}

TEST_CASE("integer outputs and f16 paths", "[dtype-paths]") {
  testing::CompiledSource compiled(R"(
dim n = 4
program p(x: f32[n]) -> (ids: i32[n], half: f32[n], both: f32[n], plain: f32[n]) {
  ids = cast(iota(n), i32)
  half = cast(cast(x, f16) * 2.0, f32)
  both = cast(cast(x, bf16), f32) + half
  plain = x * 3.0
}
)");
  std::map<std::string, std::string> dtypes = pathDtypesOf(compiled);
  CHECK(dtypes.at("p.ids") == ""); // no float value reaches it: compared exactly as an i32
  CHECK(dtypes.at("p.half") == "f16");
  CHECK(dtypes.at("p.both") == "bf16"); // bf16 rounds coarser than f16
  CHECK(dtypes.at("p.plain") == "f32");
}

TEST_CASE("in a train block a param carries what its updates read, step after step",
          "[dtype-paths]") {
  // The state `low` is written from a bf16 value; `mid` from `low`; the metric `seen` reads `mid`
  // at the start of the step: from the third step on it carries bf16 rounding, though no op of
  // one step leads from a bf16 value to it.
  testing::CompiledSource compiled(R"(
dim d = 2
train t(x: f32[d]) -> (seen: f32[]) {
  param w: f32[d] = constant(value = 1)
  param v: f32[d] = constant(value = 1)
  state low: f32[d] = zeros()
  state mid: f32[d] = zeros()
  let loss = sum(w * x) + sum(v * x * x)
  next low = cast(cast(x * w, bf16), f32)
  next mid = low * 2.0
  seen = sum(mid)
  minimize loss with sgd(lr = 0.5)
}
)");
  std::map<std::string, std::string> dtypes = pathDtypesOf(compiled);
  CHECK(dtypes.at("t.seen") == "bf16");
  CHECK(dtypes.at("t.param.low") == "bf16");
  CHECK(dtypes.at("t.param.mid") == "bf16");
  // The weights' updates read only f32 values: the state does not feed the loss.
  CHECK(dtypes.at("t.param.w") == "f32");
  CHECK(dtypes.at("t.param.v") == "f32");
  CHECK(dtypes.at("t.loss") == "f32");
}
