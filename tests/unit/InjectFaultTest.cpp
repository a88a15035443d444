// `meshc --inject-fault` (planner/InjectFault.h) on SPMD functions written by hand: the first
// collective resolving a param's gradient stops communicating, the rest of the plan is unchanged.
#include "planner/InjectFault.h"

#include <catch2/catch.hpp>

using namespace meshc;
using namespace meshc::plan;

namespace {

/// A train step's SPMD function with values named `names` (each an f32 scalar) and no ops.
SpmdFunction stepWithValues(std::vector<std::string> names) {
  SpmdFunction fn;
  fn.name = "step";
  fn.kind = ir::Function::Kind::Train;
  for (std::string& name : names)
    fn.values.push_back(SpmdValue{{}, {}, {}, std::move(name)});
  return fn;
}

SpmdOp allReduce(SpmdValueId operand, SpmdValueId result, CollectiveKind kind) {
  SpmdOp op;
  op.kind = SpmdOp::Kind::Collective;
  op.collective.kind = kind;
  op.collective.axes = {"data"};
  op.operands = {operand};
  op.result = result;
  op.phase = Phase::Backward;
  return op;
}

} // namespace

TEST_CASE("drop-grad-allreduce takes the first gradient out of a bucket", "[inject-fault]") {
  // %0..%3 partial sums (the loss first), %4..%7 their resolved values.
  SpmdFunction fn =
      stepWithValues({"loss", "grad/w", "grad/b", "h", "loss.r", "grad/w.r", "grad/b.r", "h.r"});
  SpmdOp norm = allReduce(3, 7, CollectiveKind::AllReduceSum); // not a gradient: kept
  fn.ops.push_back(norm);
  SpmdOp bucket = allReduce(0, 4, CollectiveKind::BucketedAllReduceSum);
  bucket.operands = {0, 1, 2};
  bucket.results = {4, 5, 6};
  fn.ops.push_back(bucket);

  llvm::Expected<std::string> what = injectFault(fn, "drop-grad-allreduce");
  REQUIRE(bool(what));
  CHECK(*what == "grad/w's member of a bucketed_all_reduce_sum over [data]");
  REQUIRE(fn.ops.size() == 3);
  CHECK(fn.ops[0].collective.axes == AxisList{"data"});
  const SpmdOp& rest = fn.ops[1];
  CHECK(rest.operands == std::vector<SpmdValueId>{0, 2});
  CHECK(rest.results == std::vector<SpmdValueId>{4, 6});
  CHECK(rest.result == 4);
  CHECK(rest.collective.axes == AxisList{"data"});
  // grad/w's resolved value is still produced, by a copy that communicates nothing.
  const SpmdOp& dropped = fn.ops[2];
  CHECK(dropped.collective.kind == CollectiveKind::AllReduceSum);
  CHECK(dropped.collective.axes.empty());
  CHECK(dropped.operands == std::vector<SpmdValueId>{1});
  CHECK(dropped.result == 5);
  CHECK(dropped.results.empty());
}

TEST_CASE("drop-grad-allreduce empties a plain gradient all-reduce's axes", "[inject-fault]") {
  SpmdFunction fn = stepWithValues({"grad/w", "grad/w.r", "grad/b", "grad/b.r"});
  fn.ops.push_back(allReduce(0, 1, CollectiveKind::AllReduceSum));
  fn.ops.push_back(allReduce(2, 3, CollectiveKind::AllReduceSum));
  llvm::Expected<std::string> what = injectFault(fn, "drop-grad-allreduce");
  REQUIRE(bool(what));
  CHECK(*what == "all_reduce_sum of grad/w over [data]");
  CHECK(fn.ops[0].collective.axes.empty());
  CHECK(fn.ops[1].collective.axes == AxisList{"data"}); // only the first
}

TEST_CASE("drop-grad-allreduce finds a gradient resolved after SGD's lr * grad", "[inject-fault]") {
  // %1 = lr * grad/w (a partial sum still); the bucket resolves the loss %0 and %1.
  SpmdFunction fn = stepWithValues({"loss", "", "grad/w", "lr", "loss.r", "update.r"});
  SpmdOp scale;
  scale.computeKind = ir::OpKind::Mul;
  scale.operands = {3, 2};
  scale.result = 1;
  fn.ops.push_back(scale);
  SpmdOp bucket = allReduce(0, 4, CollectiveKind::BucketedAllReduceSum);
  bucket.operands = {0, 1};
  bucket.results = {4, 5};
  fn.ops.push_back(bucket);
  llvm::Expected<std::string> what = injectFault(fn, "drop-grad-allreduce");
  REQUIRE(bool(what));
  CHECK(*what == "%1's member of a bucketed_all_reduce_sum over [data]");
  REQUIRE(fn.ops.size() == 3);
  CHECK(fn.ops[1].operands == std::vector<SpmdValueId>{0}); // the loss is still resolved
  CHECK(fn.ops[2].operands == std::vector<SpmdValueId>{1});
  CHECK(fn.ops[2].collective.axes.empty());
}

TEST_CASE("nothing to drop, programs, unknown faults", "[inject-fault]") {
  SpmdFunction fn = stepWithValues({"h", "h.r"});
  fn.ops.push_back(allReduce(0, 1, CollectiveKind::AllReduceSum));
  llvm::Expected<std::string> what = injectFault(fn, "drop-grad-allreduce");
  REQUIRE(bool(what));
  CHECK(what->empty());
  CHECK(fn.ops[0].collective.axes == AxisList{"data"});

  SpmdFunction program = stepWithValues({"grad/w", "grad/w.r"});
  program.kind = ir::Function::Kind::Program;
  program.ops.push_back(allReduce(0, 1, CollectiveKind::AllReduceSum));
  what = injectFault(program, "drop-grad-allreduce");
  REQUIRE(bool(what));
  CHECK(what->empty());

  what = injectFault(fn, "flip-a-bit");
  REQUIRE_FALSE(bool(what));
  CHECK(llvm::toString(what.takeError()).find("no fault named 'flip-a-bit'") != std::string::npos);
}
