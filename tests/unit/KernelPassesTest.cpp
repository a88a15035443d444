// The kernel IR's passes and verifier on small hand-built functions: each pass's rewrite where
// it applies, its refusal where it would change the result, and the verifier's checks. (That the
// rewritten programs still compute the interpreter's values is tested end to end: tests/e2e.)
#include "codegen/CausalAttentionBlocks.h"
#include "codegen/ContractPairwise.h"
#include "codegen/EliminateCommonSubexpressions.h"
#include "codegen/EliminateDeadCode.h"
#include "codegen/FoldConstants.h"
#include "codegen/FuseGemmEpilogues.h"
#include "codegen/FuseLoops.h"
#include "codegen/FuseRowKernels.h"
#include "codegen/GatherOneHotProducts.h"
#include "codegen/HoistInvariants.h"
#include "codegen/KeepDropoutMasks.h"
#include "codegen/Lower.h"
#include "codegen/OutlineRepeatedCode.h"
#include "codegen/PlanBuffers.h"
#include "codegen/ScheduleCollectives.h"
#include "codegen/ScheduleMicrobatches.h"
#include "codegen/SplitStages.h"
#include "codegen/VerifyKernels.h"
#include "codegen/WriteUpdatesInPlace.h"
#include "planner/Contraction.h"

#include <catch2/catch.hpp>

using namespace meshc;
using namespace meshc::kir;

namespace {

/// A function with helpers to add buffers and statements.
struct Builder {
  KernelFunction fn;

  Builder() { fn.name = "test"; }
  BufferId buffer(int64_t elements, Storage storage = Storage::Arena) {
    Buffer b;
    b.name = "b" + std::to_string(fn.buffers.size());
    b.elements = elements;
    b.storage = storage;
    if (storage == Storage::Input) b.index = 0;
    if (storage == Storage::Param) {
      b.index = int64_t(fn.params.size());
      fn.params.push_back(BufferId(fn.buffers.size()));
    }
    return fn.addBuffer(b);
  }
  /// out[i] = op(reads[i]...) over `n` points (contiguous), or a constant when `op` is Literal.
  void loop(BufferId out, ir::OpKind op, std::vector<BufferId> reads, int64_t n, double value = 0) {
    Loop loop;
    loop.dims = {"i"};
    loop.extents = {n};
    std::vector<int> args;
    for (BufferId read : reads) {
      Shape strides = {fn.buffers[size_t(read)].elements == 1 ? 0 : 1};
      loop.reads.push_back(Access{read, strides});
      args.push_back(int(loop.body.size()));
      loop.body.push_back(Scalar{.kind = Scalar::Kind::Load, .read = int(loop.reads.size() - 1)});
    }
    if (op == ir::OpKind::Literal) // held in f32, as lowerToKernels rounds literals
      loop.body.push_back(Scalar{.kind = Scalar::Kind::Const, .value = double(float(value))});
    else
      loop.body.push_back(Scalar{.kind = Scalar::Kind::Compute, .op = op, .args = args});
    loop.stores.push_back(Store{Access{out, {1}}, int(loop.body.size() - 1)});
    if (fn.buffers[size_t(out)].elements == 1) loop.stores.back().at.strides = {0};
    fn.body.push_back(Stmt{.node = std::move(loop)});
  }
  void gemm(BufferId out, BufferId a, BufferId b, int64_t m, int64_t k, int64_t n) {
    Gemm g;
    g.dims = {"m", "k", "n"};
    g.sizes = {m, k, n};
    g.operands = {a, b};
    g.operandDims = {{0, 1}, {1, 2}};
    g.out = out;
    g.outDims = {0, 2};
    fn.body.push_back(Stmt{.node = std::move(g)});
  }
  void allReduce(std::vector<BufferId> buffers) {
    fn.body.push_back(Stmt{.node = Collective{.kind = plan::CollectiveKind::AllReduceSum,
                                              .axes = {"data"},
                                              .buffers = std::move(buffers)}});
  }
};

} // namespace

TEST_CASE("fold-constants puts literals into loops and scales into GEMM alpha") {
  Builder b;
  BufferId x = b.buffer(16, Storage::Input), w = b.buffer(16, Storage::Input);
  BufferId scale = b.buffer(1), product = b.buffer(16), scaled = b.buffer(16), y = b.buffer(16);
  b.loop(scale, ir::OpKind::Literal, {}, 1, 0.125);
  b.gemm(product, x, w, 4, 4, 4);
  b.loop(scaled, ir::OpKind::Mul, {product, scale}, 16);
  b.loop(y, ir::OpKind::Exp, {scaled}, 16);
  b.fn.outputs = {y};
  REQUIRE(verifyKernels(b.fn).empty());
  foldConstants(b.fn);
  eliminateDeadCode(b.fn);
  REQUIRE(verifyKernels(b.fn).empty());
  // The literal loop and the scaling loop are gone; the GEMM carries the scale.
  REQUIRE(b.fn.body.size() == 2);
  const Gemm& gemm = std::get<Gemm>(b.fn.body[0].node);
  CHECK(gemm.alpha == 0.125);
  const Loop& exp = std::get<Loop>(b.fn.body[1].node);
  REQUIRE(exp.reads.size() == 1);
  CHECK(exp.reads[0].buffer == product);
}

TEST_CASE("fold-constants evaluates constant arithmetic with the interpreter's rounding") {
  Builder b;
  BufferId one = b.buffer(1), beta = b.buffer(1), rest = b.buffer(1),
           x = b.buffer(8, Storage::Input);
  BufferId y = b.buffer(8);
  b.loop(one, ir::OpKind::Literal, {}, 1, 1.0);
  b.loop(beta, ir::OpKind::Literal, {}, 1, 0.9);
  b.loop(rest, ir::OpKind::Sub, {one, beta}, 1); // 1 - beta1
  b.loop(y, ir::OpKind::Mul, {x, rest}, 8);
  b.fn.outputs = {y};
  foldConstants(b.fn);
  eliminateDeadCode(b.fn);
  REQUIRE(b.fn.body.size() == 1);
  const Loop& loop = std::get<Loop>(b.fn.body[0].node);
  REQUIRE(loop.reads.size() == 1);
  bool found = false;
  for (const Scalar& s : loop.body)
    if (s.kind == Scalar::Kind::Const) {
      CHECK(s.value == double(float(1.0 - double(float(0.9)))));
      found = true;
    }
  CHECK(found);
}

TEST_CASE("fuse-loops fuses a chain, keeps stores others read, and respects hazards") {
  SECTION("a single-use chain becomes one loop") {
    Builder b;
    BufferId x = b.buffer(32, Storage::Input), t = b.buffer(32), u = b.buffer(32), y = b.buffer(32);
    b.loop(t, ir::OpKind::Exp, {x}, 32);
    b.loop(u, ir::OpKind::Neg, {t}, 32);
    b.loop(y, ir::OpKind::Tanh, {u}, 32);
    b.fn.outputs = {y};
    fuseLoops(b.fn);
    REQUIRE(verifyKernels(b.fn).empty());
    REQUIRE(b.fn.body.size() == 1);
    const Loop& loop = std::get<Loop>(b.fn.body[0].node);
    REQUIRE(loop.stores.size() == 1);
    CHECK(loop.stores[0].at.buffer == y);
    CHECK(loop.reads.size() == 1);
  }
  SECTION("a producer read again later keeps its store") {
    Builder b;
    BufferId x = b.buffer(32, Storage::Input), t = b.buffer(32), u = b.buffer(32), y = b.buffer(32);
    b.loop(t, ir::OpKind::Exp, {x}, 32);
    b.loop(u, ir::OpKind::Neg, {t}, 32);
    b.loop(y, ir::OpKind::Add, {u, t}, 32);
    b.fn.outputs = {y};
    fuseLoops(b.fn);
    REQUIRE(verifyKernels(b.fn).empty());
    REQUIRE(b.fn.body.size() == 1);
    CHECK(std::get<Loop>(b.fn.body[0].node).stores.size() == 1);
  }
  SECTION("a statement between that rewrites the producer's input blocks the fusion") {
    Builder b;
    BufferId x = b.buffer(32), t = b.buffer(32), y = b.buffer(32),
             in = b.buffer(32, Storage::Input);
    b.loop(x, ir::OpKind::Neg, {in}, 32);
    b.loop(t, ir::OpKind::Exp, {x}, 32);
    b.allReduce({x}); // writes x after t read it
    b.loop(y, ir::OpKind::Add, {t, x}, 32);
    b.fn.outputs = {y};
    fuseLoops(b.fn);
    REQUIRE(verifyKernels(b.fn).empty());
    // exp(x) must read x before the all-reduce: it stays before it.
    bool expBeforeCollective = false;
    for (const Stmt& stmt : b.fn.body) {
      if (std::holds_alternative<Collective>(stmt.node)) break;
      if (const Loop* loop = std::get_if<Loop>(&stmt.node))
        for (const Scalar& s : loop->body)
          expBeforeCollective = expBeforeCollective || s.op == ir::OpKind::Exp;
    }
    CHECK(expBeforeCollective);
  }
  SECTION("a cheap producer is recomputed across a broadcast, an expensive one is not") {
    for (ir::OpKind op : {ir::OpKind::Neg, ir::OpKind::Exp}) {
      Builder b;
      BufferId x = b.buffer(4, Storage::Input), t = b.buffer(4), y = b.buffer(32);
      BufferId z = b.buffer(32, Storage::Input);
      b.loop(t, op, {x}, 4);
      Loop consumer;
      consumer.dims = {"i", "j"};
      consumer.extents = {8, 4};
      consumer.reads = {Access{t, {0, 1}}, Access{z, {4, 1}}};
      consumer.body = {
          Scalar{.kind = Scalar::Kind::Load, .read = 0},
          Scalar{.kind = Scalar::Kind::Load, .read = 1},
          Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Add, .args = {0, 1}}};
      consumer.stores = {Store{Access{y, {4, 1}}, 2}};
      std::get<Loop>(b.fn.body[0].node).dims = {"j"};
      b.fn.body.push_back(Stmt{.node = consumer});
      b.fn.outputs = {y};
      fuseLoops(b.fn);
      REQUIRE(verifyKernels(b.fn).empty());
      CHECK(b.fn.body.size() == (op == ir::OpKind::Neg ? 1u : 2u));
    }
  }
}

TEST_CASE("eliminate-common-subexpressions merges identical pure loops") {
  Builder b;
  BufferId x = b.buffer(8, Storage::Input), t1 = b.buffer(8), t2 = b.buffer(8), y = b.buffer(8);
  b.loop(t1, ir::OpKind::Exp, {x}, 8);
  b.loop(t2, ir::OpKind::Exp, {x}, 8);
  b.loop(y, ir::OpKind::Add, {t1, t2}, 8);
  b.fn.outputs = {y};
  eliminateCommonSubexpressions(b.fn);
  REQUIRE(verifyKernels(b.fn).empty());
  REQUIRE(b.fn.body.size() == 2);
  const Loop& add = std::get<Loop>(b.fn.body[1].node);
  CHECK(add.reads[0].buffer == t1);
  CHECK(add.reads[1].buffer == t1);
}

TEST_CASE("hoist-invariants moves what only constants feed into the constructor") {
  Builder b;
  BufferId c = b.buffer(1), mask = b.buffer(8), x = b.buffer(8, Storage::Input), y = b.buffer(8);
  b.loop(c, ir::OpKind::Literal, {}, 1, 2.0);
  b.loop(mask, ir::OpKind::Exp, {c}, 8);
  b.loop(y, ir::OpKind::Mul, {x, mask}, 8);
  b.fn.outputs = {y};
  hoistInvariants(b.fn);
  REQUIRE(verifyKernels(b.fn).empty());
  CHECK(b.fn.init.size() == 2);
  CHECK(b.fn.body.size() == 1);
  CHECK(b.fn.buffers[size_t(mask)].storage == Storage::Persistent);
  CHECK(b.fn.buffers[size_t(y)].storage == Storage::Arena);
}

TEST_CASE("write-updates-in-place stores an update into its param when the old value dies") {
  Builder b;
  BufferId p = b.buffer(8, Storage::Param), g = b.buffer(8, Storage::Input), next = b.buffer(8);
  b.loop(next, ir::OpKind::Sub, {p, g}, 8);
  b.fn.updates = {{0, next, true}};
  writeUpdatesInPlace(b.fn);
  REQUIRE(verifyKernels(b.fn).empty());
  CHECK(b.fn.updates[0].value == p);
  CHECK(std::get<Loop>(b.fn.body[0].node).stores[0].at.buffer == p);

  Builder later; // the old value is read after the update: no
  p = later.buffer(8, Storage::Param);
  g = later.buffer(8, Storage::Input);
  next = later.buffer(8);
  BufferId y = later.buffer(8);
  later.loop(next, ir::OpKind::Sub, {p, g}, 8);
  later.loop(y, ir::OpKind::Neg, {p}, 8);
  later.fn.outputs = {y};
  later.fn.updates = {{0, next, true}};
  writeUpdatesInPlace(later.fn);
  CHECK(later.fn.updates[0].value == next);
}

TEST_CASE("schedule-collectives waits just before the first statement that touches the buffers") {
  Builder b;
  BufferId x = b.buffer(8, Storage::Input), g = b.buffer(8), other = b.buffer(8), y = b.buffer(8);
  b.loop(g, ir::OpKind::Neg, {x}, 8);
  b.allReduce({g});
  b.loop(other, ir::OpKind::Exp, {x}, 8); // independent: overlaps the all-reduce
  b.loop(y, ir::OpKind::Add, {g, other}, 8);
  b.fn.outputs = {y};
  scheduleCollectives(b.fn);
  REQUIRE(verifyKernels(b.fn).empty());
  REQUIRE(b.fn.body.size() == 5);
  CHECK(std::get<Collective>(b.fn.body[1].node).phase == Collective::Phase::Start);
  CHECK(std::holds_alternative<Loop>(b.fn.body[2].node));
  CHECK(std::get<Collective>(b.fn.body[3].node).phase == Collective::Phase::Wait);
}

TEST_CASE("plan-buffers shares bytes only between values not alive together") {
  Builder b;
  BufferId x = b.buffer(16, Storage::Input), t = b.buffer(16), u = b.buffer(16), v = b.buffer(16);
  BufferId y = b.buffer(16);
  b.loop(t, ir::OpKind::Neg, {x}, 16);
  b.loop(u, ir::OpKind::Exp, {t}, 16); // t dies here
  b.loop(v, ir::OpKind::Neg, {u}, 16); // may reuse t's bytes
  b.loop(y, ir::OpKind::Add, {v, u}, 16);
  b.fn.outputs = {y};
  planBuffers(b.fn);
  REQUIRE(verifyKernels(b.fn).empty());
  CHECK(b.fn.buffers[size_t(t)].offset != b.fn.buffers[size_t(u)].offset);
  CHECK(b.fn.buffers[size_t(v)].offset == b.fn.buffers[size_t(t)].offset);
  CHECK(b.fn.arenaBytes == 3 * 64);
  CHECK(b.fn.temporaryBytes == 4 * 16 * sizeof(float));
}

TEST_CASE("the verifier rejects malformed kernel IR") {
  Builder b;
  BufferId x = b.buffer(8, Storage::Input), t = b.buffer(8), y = b.buffer(8);
  b.loop(y, ir::OpKind::Add, {x, t}, 8); // t is never written
  b.fn.outputs = {y};
  CHECK(verifyKernels(b.fn).find("before any statement writes it") != std::string::npos);

  Builder bounds;
  x = bounds.buffer(4, Storage::Input);
  y = bounds.buffer(8);
  bounds.loop(y, ir::OpKind::Neg, {x}, 8); // reads 8 elements of a 4-element input
  bounds.fn.outputs = {y};
  CHECK(verifyKernels(bounds.fn).find("reaches element 7") != std::string::npos);

  Builder ssa;
  x = ssa.buffer(4, Storage::Input);
  y = ssa.buffer(4);
  ssa.loop(y, ir::OpKind::Neg, {x}, 4);
  std::get<Loop>(ssa.fn.body[0].node).body[1].args = {1}; // uses itself
  ssa.fn.outputs = {y};
  CHECK(verifyKernels(ssa.fn).find("not defined before it") != std::string::npos);

  Builder wait;
  x = wait.buffer(4, Storage::Input);
  y = wait.buffer(4);
  wait.loop(y, ir::OpKind::Neg, {x}, 4);
  wait.fn.body.push_back(Stmt{.node = Collective{.kind = plan::CollectiveKind::AllReduceSum,
                                                 .axes = {"data"},
                                                 .buffers = {y},
                                                 .phase = Collective::Phase::Wait,
                                                 .request = 3}});
  wait.fn.outputs = {y};
  CHECK(verifyKernels(wait.fn).find("not started") != std::string::npos);

  Builder overlap;
  x = overlap.buffer(16, Storage::Input);
  BufferId t1 = overlap.buffer(16), t2 = overlap.buffer(16);
  y = overlap.buffer(16);
  overlap.loop(t1, ir::OpKind::Neg, {x}, 16);
  overlap.loop(t2, ir::OpKind::Neg, {x}, 16);
  overlap.loop(y, ir::OpKind::Add, {t1, t2}, 16);
  overlap.fn.outputs = {y};
  planBuffers(overlap.fn);
  overlap.fn.buffers[size_t(t2)].offset = overlap.fn.buffers[size_t(t1)].offset; // alive together
  CHECK(verifyKernels(overlap.fn).find("share arena bytes") != std::string::npos);
}

TEST_CASE("gather-one-hot-products turns einsums of a one-hot tensor into gathers and scatters") {
  // ids [n=6] -> one-hot [n, v=4]; forward: [n, v] x table [v, d=5] -> [n, d] (a gather);
  // backward: grad [n, d] x one-hot [n, v] -> [v, d] (a scatter-add); a product that sums the
  // one-hot dim away within its own operand (the table's d with the output keeping neither v nor
  // d) stays a GEMM.
  Builder b;
  BufferId ids = b.buffer(6, Storage::Input), table = b.buffer(20, Storage::Param);
  BufferId grad = b.buffer(30, Storage::Input), hot = b.buffer(24);
  BufferId looked = b.buffer(30), rows = b.buffer(20), summed = b.buffer(6);
  auto ints = [](Shape values) { return Arg{.kind = Arg::Kind::Ints, .ints = std::move(values)}; };
  b.fn.body.push_back(
      Stmt{.node = Call{.callee = Callee::OneHot,
                        .args = {Arg{.kind = Arg::Kind::Data, .buffer = hot}, ints({6, 4}),
                                 Arg{.kind = Arg::Kind::Data, .buffer = ids}, ints({1, 0}),
                                 ints({0, 1}), Arg{.kind = Arg::Kind::Int, .value = 0}},
                        .out = hot,
                        .reads = {ids}}});
  Gemm forward{.dims = {"n", "v", "d"},
               .sizes = {6, 4, 5},
               .operands = {hot, table},
               .operandDims = {{0, 1}, {1, 2}},
               .out = looked,
               .outDims = {0, 2}};
  Gemm backward{.dims = {"n", "d", "v"},
                .sizes = {6, 5, 4},
                .operands = {grad, hot},
                .operandDims = {{0, 1}, {0, 2}},
                .out = rows,
                .outDims = {2, 1}};
  Gemm total{.dims = {"n", "v", "d"},
             .sizes = {6, 4, 5},
             .operands = {hot, table},
             .operandDims = {{0, 1}, {1, 2}},
             .out = summed,
             .outDims = {0}};
  b.fn.body.push_back(Stmt{.node = forward});
  b.fn.body.push_back(Stmt{.node = backward});
  b.fn.body.push_back(Stmt{.node = total});
  b.fn.outputs = {looked, rows, summed};
  REQUIRE(verifyKernels(b.fn).empty());
  gatherOneHotProducts(b.fn);
  REQUIRE(verifyKernels(b.fn).empty());
  const Call& gather = std::get<Call>(b.fn.body[1].node);
  CHECK(gather.callee == Callee::Gather);
  CHECK(gather.out == looked);
  CHECK(gather.args[1].ints == Shape{6, 5}); // out sizes
  CHECK(gather.args[3].ints == Shape{0, 1}); // the table over the out dims
  CHECK(gather.args[5].ints == Shape{1, 0}); // the ids over the out dims
  CHECK(gather.args[6].value == 4);          // rows of the block
  CHECK(gather.args[7].value == 5);          // the table's row stride
  const Call& scatter = std::get<Call>(b.fn.body[2].node);
  CHECK(scatter.callee == Callee::ScatterAdd);
  CHECK(scatter.out == rows);
  CHECK(scatter.args[1].ints == Shape{4, 5}); // out [v, d]
  CHECK(scatter.args[3].ints == Shape{0, 1}); // grad over the out dims
  CHECK(scatter.args[6].ints == Shape{6});    // the points: n
  CHECK(scatter.args[7].ints == Shape{5});    // grad over the points
  CHECK(scatter.args[8].ints == Shape{1});    // ids over the points
  CHECK(scatter.args[9].value == 0);          // v's position in out
  CHECK(std::holds_alternative<Gemm>(b.fn.body[3].node));
  eliminateDeadCode(b.fn); // the one-hot tensor is still read by the GEMM left
  CHECK(std::holds_alternative<Call>(b.fn.body[0].node));
}

namespace {

Arg intsArg(Shape values) {
  return Arg{.kind = Arg::Kind::Ints, .ints = std::move(values)};
}

/// along(out, in) of `kind` over rows [rows] of one lane of `size` (dense), over `group`.
Stmt alongRows(BufferId out, BufferId in, int64_t rows, int64_t size, const char* kind,
               std::vector<std::string> group = {}) {
  return Stmt{.node = Call{.callee = Callee::Along,
                           .args = {Arg{.kind = Arg::Kind::Data, .buffer = out},
                                    Arg{.kind = Arg::Kind::Data, .buffer = in}, intsArg({rows}),
                                    intsArg({size}), intsArg({size}), intsArg({size}), intsArg({1}),
                                    intsArg({1}), Arg{.kind = Arg::Kind::Enum, .text = kind},
                                    Arg{.kind = Arg::Kind::Real, .value = 1e-5},
                                    Arg{.kind = Arg::Kind::Int, .value = double(size)},
                                    Arg{.kind = Arg::Kind::GroupPointer, .names = group}},
                           .out = out,
                           .reads = {in}},
              .sources = {std::string("t.mesh:1:1 ") +
                          (std::string(kind) == "Along::Softmax" ? "softmax" : "layer_norm")}};
}

/// out = in * gain + bias over [rows, size], gain and bias along the row.
Stmt affineLoop(BufferId out, BufferId in, BufferId gain, BufferId bias, int64_t rows, int64_t size,
                Shape gainStrides = {0, 1}) {
  Loop loop{.dims = {"r", "i"}, .extents = {rows, size}};
  loop.reads = {Access{in, {size, 1}}, Access{gain, gainStrides}, Access{bias, {0, 1}}};
  loop.body = {Scalar{.kind = Scalar::Kind::Load, .read = 0},
               Scalar{.kind = Scalar::Kind::Load, .read = 1},
               Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Mul, .args = {1, 0}},
               Scalar{.kind = Scalar::Kind::Load, .read = 2},
               Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Add, .args = {2, 3}}};
  loop.stores = {Store{Access{out, {size, 1}}, 4}};
  return Stmt{.node = std::move(loop), .sources = {"t.mesh:2:1 mul"}};
}

/// out = where(mask, in, fill) over [a, b, size], the mask [a, size] broadcast over b.
Stmt maskLoop(BufferId out, BufferId in, BufferId mask, int64_t a, int64_t b, int64_t size,
              bool fillWhenTrue = false) {
  Loop loop{.dims = {"a", "b", "i"}, .extents = {a, b, size}};
  loop.reads = {Access{mask, {size, 0, 1}}, Access{in, {b * size, size, 1}}};
  loop.body = {Scalar{.kind = Scalar::Kind::Load, .read = 0, .dtype = DType::I32},
               Scalar{.kind = Scalar::Kind::Load, .read = 1},
               Scalar{.kind = Scalar::Kind::Const, .value = -1e9}};
  std::vector<int> args = fillWhenTrue ? std::vector<int>{0, 2, 1} : std::vector<int>{0, 1, 2};
  loop.body.push_back(Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Where, .args = args});
  loop.stores = {Store{Access{out, {b * size, size, 1}}, 3}};
  return Stmt{.node = std::move(loop), .sources = {"t.mesh:3:1 where"}};
}

} // namespace

TEST_CASE("fuse-row-kernels: layer_norm with its gain and bias, a mask with its softmax") {
  SECTION("layer_norm, then * gain + bias along the row: one layerNormAffine") {
    Builder b;
    BufferId x = b.buffer(24, Storage::Input), gain = b.buffer(8, Storage::Param),
             bias = b.buffer(8, Storage::Param), normalized = b.buffer(24), y = b.buffer(24);
    b.fn.body.push_back(alongRows(normalized, x, 3, 8, "Along::LayerNorm"));
    b.fn.body.push_back(affineLoop(y, normalized, gain, bias, 3, 8));
    b.fn.outputs = {y};
    REQUIRE(verifyKernels(b.fn).empty());
    fuseRowKernels(b.fn);
    REQUIRE(verifyKernels(b.fn).empty());
    REQUIRE(b.fn.body.size() == 1);
    const Call& call = std::get<Call>(b.fn.body[0].node);
    CHECK(call.callee == Callee::LayerNormAffine);
    CHECK(call.out == y);
    CHECK(call.reads == std::vector<BufferId>{x, gain, bias});
    CHECK(call.args[1].buffer == x);
    CHECK(call.args[2].value == 3); // rows
    CHECK(call.args[3].value == 8); // size
    CHECK(call.args[4].buffer == gain);
    CHECK(call.args[5].buffer == bias);
    CHECK(call.args[6].value == 1e-5);
    CHECK(call.args[7].value == 8); // the lane's global count
    CHECK(b.fn.body[0].sources ==
          std::vector<std::string>{"t.mesh:1:1 layer_norm", "t.mesh:2:1 mul"});
  }
  SECTION("where(mask, x, fill), then softmax along the row: one maskedSoftmax") {
    Builder b;
    BufferId mask = b.buffer(16, Storage::Input), scores = b.buffer(48, Storage::Input),
             masked = b.buffer(48), weights = b.buffer(48);
    b.fn.body.push_back(maskLoop(masked, scores, mask, 2, 3, 8));
    b.fn.body.push_back(alongRows(weights, masked, 6, 8, "Along::Softmax"));
    // The rows of the along as [a, b]: the loop's outer dims.
    Call& along = std::get<Call>(b.fn.body[1].node);
    along.args[2] = intsArg({2, 3});
    along.args[3] = along.args[4] = intsArg({24, 8});
    b.fn.outputs = {weights};
    REQUIRE(verifyKernels(b.fn).empty());
    fuseRowKernels(b.fn);
    REQUIRE(verifyKernels(b.fn).empty());
    REQUIRE(b.fn.body.size() == 1);
    const Call& call = std::get<Call>(b.fn.body[0].node);
    CHECK(call.callee == Callee::MaskedSoftmax);
    CHECK(call.out == weights);
    CHECK(call.reads == std::vector<BufferId>{scores, mask});
    CHECK(call.args[0].buffer == weights);
    CHECK(call.args[1].buffer == scores);
    CHECK(call.args[2].buffer == mask);
    CHECK(call.args[3].ints == Shape{2, 3}); // outer
    CHECK(call.args[4].ints == Shape{8, 0}); // the mask over the outer dims
    CHECK(call.args[5].value == 8);          // size
    CHECK(call.args[6].value == 1);          // the mask along the row
    CHECK(call.args[7].value == -1e9);       // fill
    CHECK(b.fn.body[0].sources.front() == "t.mesh:1:1 softmax");
  }
  SECTION("not fused: the value between them read again, a gain across rows, a split lane, "
          "the fill where the mask holds") {
    Builder b;
    BufferId x = b.buffer(24, Storage::Input), gain = b.buffer(24, Storage::Param),
             bias = b.buffer(8, Storage::Param), normalized = b.buffer(24), y = b.buffer(24),
             normalized2 = b.buffer(24), y2 = b.buffer(24), normalized3 = b.buffer(24),
             y3 = b.buffer(24);
    BufferId mask = b.buffer(8, Storage::Input), scores = b.buffer(24, Storage::Input),
             masked = b.buffer(24), weights = b.buffer(24);
    // normalized is also an output.
    b.fn.body.push_back(alongRows(normalized, x, 3, 8, "Along::LayerNorm"));
    b.fn.body.push_back(affineLoop(y, normalized, gain, bias, 3, 8));
    // A gain that differs per row.
    b.fn.body.push_back(alongRows(normalized2, x, 3, 8, "Along::LayerNorm"));
    b.fn.body.push_back(affineLoop(y2, normalized2, gain, bias, 3, 8, {8, 1}));
    // The lane split over `model`: the kernel's moments are a collective.
    b.fn.body.push_back(alongRows(normalized3, x, 3, 8, "Along::LayerNorm", {"model"}));
    b.fn.body.push_back(affineLoop(y3, normalized3, gain, bias, 3, 8));
    // where(mask, fill, x): the fill where the mask holds.
    b.fn.body.push_back(maskLoop(masked, scores, mask, 1, 3, 8, /*fillWhenTrue=*/true));
    b.fn.body.push_back(alongRows(weights, masked, 3, 8, "Along::Softmax"));
    b.fn.outputs = {y, normalized, y2, y3, weights};
    REQUIRE(verifyKernels(b.fn).empty());
    std::vector<Stmt> before = b.fn.body;
    fuseRowKernels(b.fn);
    REQUIRE(b.fn.body.size() == before.size());
    for (size_t k = 0; k < before.size(); ++k)
      CHECK(b.fn.body[k].node == before[k].node);
  }
}

namespace {

/// products = x * y over [a, b, size] (y broadcast over b when `yStrides` say so), then
/// sum(products) along the row times `scale` into out[a, b].
std::vector<Stmt> productRowSum(BufferId out, BufferId products, BufferId x, BufferId y, int64_t a,
                                int64_t b, int64_t size, Shape yStrides, double scale,
                                const char* kind = "Reduce::Sum") {
  Loop loop{.dims = {"a", "b", "i"}, .extents = {a, b, size}};
  loop.reads = {Access{x, {b * size, size, 1}}, Access{y, std::move(yStrides)}};
  loop.body = {Scalar{.kind = Scalar::Kind::Load, .read = 0},
               Scalar{.kind = Scalar::Kind::Load, .read = 1},
               Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Mul, .args = {0, 1}}};
  loop.stores = {Store{Access{products, {b * size, size, 1}}, 2}};
  Call sum{.callee = Callee::Reduce,
           .args = {Arg{.kind = Arg::Kind::Data, .buffer = out}, intsArg({a, b}),
                    Arg{.kind = Arg::Kind::Data, .buffer = products}, intsArg({b * size, size}),
                    intsArg({size}), intsArg({1}), Arg{.kind = Arg::Kind::Enum, .text = kind},
                    Arg{.kind = Arg::Kind::Real, .value = scale}},
           .out = out,
           .reads = {products}};
  return {Stmt{.node = std::move(loop), .sources = {"t.mesh:5:1 mul"}},
          Stmt{.node = std::move(sum), .sources = {"t.mesh:5:2 sum"}}};
}

} // namespace

TEST_CASE("fuse-row-kernels: a product summed along the row") {
  SECTION("x * y, then their sum along the row: one reduceProduct, the products never stored") {
    Builder b;
    BufferId x = b.buffer(48, Storage::Input), y = b.buffer(16, Storage::Input),
             products = b.buffer(48), out = b.buffer(6);
    for (Stmt& stmt : productRowSum(out, products, x, y, 2, 3, 8, {8, 0, 1}, 0.5))
      b.fn.body.push_back(std::move(stmt));
    b.fn.outputs = {out};
    REQUIRE(verifyKernels(b.fn).empty());
    fuseRowKernels(b.fn);
    REQUIRE(verifyKernels(b.fn).empty());
    REQUIRE(b.fn.body.size() == 1);
    const Call& call = std::get<Call>(b.fn.body[0].node);
    CHECK(call.callee == Callee::ReduceProduct);
    CHECK(call.out == out);
    CHECK(call.reads == std::vector<BufferId>{x, y});
    CHECK(call.args[0].buffer == out);
    CHECK(call.args[1].ints == Shape{2, 3}); // outer
    CHECK(call.args[2].value == 8);          // size
    CHECK(call.args[3].buffer == x);
    CHECK(call.args[4].ints == Shape{24, 8}); // x over the outer dims
    CHECK(call.args[5].buffer == y);
    CHECK(call.args[6].ints == Shape{8, 0}); // y broadcast over b
    CHECK(call.args[7].value == 0.5);        // scale
    eliminateDeadCode(b.fn);
    CHECK(b.fn.body.size() == 1);
  }
  SECTION("not fused: the products read again, a max, a row that is not contiguous") {
    Builder b;
    BufferId x = b.buffer(48, Storage::Input), y = b.buffer(48, Storage::Input);
    BufferId products = b.buffer(48), out = b.buffer(6), products2 = b.buffer(48),
             out2 = b.buffer(6), products3 = b.buffer(48), out3 = b.buffer(6);
    for (Stmt& stmt : productRowSum(out, products, x, y, 2, 3, 8, {24, 8, 1}, 1))
      b.fn.body.push_back(std::move(stmt));
    for (Stmt& stmt : productRowSum(out2, products2, x, y, 2, 3, 8, {24, 8, 1}, 1, "Reduce::Max"))
      b.fn.body.push_back(std::move(stmt));
    for (Stmt& stmt : productRowSum(out3, products3, x, y, 2, 3, 8, {0, 1, 3}, 1))
      b.fn.body.push_back(std::move(stmt));
    b.fn.outputs = {out, products, out2, out3}; // products: an output too
    REQUIRE(verifyKernels(b.fn).empty());
    std::vector<Stmt> before = b.fn.body;
    fuseRowKernels(b.fn);
    REQUIRE(b.fn.body.size() == before.size());
    for (size_t k = 0; k < before.size(); ++k)
      CHECK(b.fn.body[k].node == before[k].node);
  }
}

namespace {

/// sum = terms[0] + (terms[1] + terms[2]) (or terms[0] + terms[1]) over [a, b, size], each term
/// read with its strides; `op` the outer operation (Add, or anything else for a loop that is not
/// a sum).
Stmt sumLoop(BufferId sum, std::vector<Access> terms, int64_t a, int64_t b, int64_t size,
             ir::OpKind op = ir::OpKind::Add) {
  Loop loop{.dims = {"a", "b", "i"}, .extents = {a, b, size}};
  loop.reads = terms;
  for (size_t t = 0; t < terms.size(); ++t)
    loop.body.push_back(Scalar{.kind = Scalar::Kind::Load, .read = int(t)});
  if (terms.size() == 3) {
    loop.body.push_back(
        Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Add, .args = {1, 2}});
    loop.body.push_back(Scalar{.kind = Scalar::Kind::Compute, .op = op, .args = {3, 0}});
  } else {
    loop.body.push_back(Scalar{.kind = Scalar::Kind::Compute, .op = op, .args = {1, 0}});
  }
  loop.stores = {Store{Access{sum, {b * size, size, 1}}, int(loop.body.size() - 1)}};
  return Stmt{.node = std::move(loop), .sources = {"t.mesh:4:1 add"}};
}

} // namespace

TEST_CASE("fuse-row-kernels: the residual add before a layerNormAffine") {
  SECTION("prev + (partial + bias along the row), then layer_norm * gain + bias: one "
          "addLayerNormAffine that stores the sum too") {
    Builder b;
    BufferId prev = b.buffer(48, Storage::Input), partial = b.buffer(48, Storage::Input),
             rowBias = b.buffer(8, Storage::Param), gain = b.buffer(8, Storage::Param),
             bias = b.buffer(8, Storage::Param), sum = b.buffer(48), normalized = b.buffer(48),
             y = b.buffer(48);
    b.fn.body.push_back(sumLoop(
        sum, {Access{prev, {24, 8, 1}}, Access{partial, {24, 8, 1}}, Access{rowBias, {0, 0, 1}}}, 2,
        3, 8));
    b.fn.body.push_back(alongRows(normalized, sum, 6, 8, "Along::LayerNorm"));
    b.fn.body.push_back(affineLoop(y, normalized, gain, bias, 6, 8));
    b.fn.outputs = {y, sum}; // the sum is read again (the next residual add)
    REQUIRE(verifyKernels(b.fn).empty());
    fuseRowKernels(b.fn);
    REQUIRE(verifyKernels(b.fn).empty());
    REQUIRE(b.fn.body.size() == 1);
    const Call& call = std::get<Call>(b.fn.body[0].node);
    CHECK(call.callee == Callee::AddLayerNormAffine);
    CHECK(call.out == y);
    CHECK(call.alsoWrites == std::vector<BufferId>{sum});
    CHECK(writesOf(b.fn.body[0]) == std::vector<BufferId>{y, sum});
    CHECK(call.reads == std::vector<BufferId>{prev, partial, rowBias, gain, bias});
    REQUIRE(call.args.size() == 14);
    CHECK(call.args[0].buffer == y);
    CHECK(call.args[1].buffer == sum);
    CHECK(call.args[2].ints == Shape{2, 3}); // outer
    CHECK(call.args[3].value == 8);          // size
    CHECK(call.args[4].buffer == gain);
    CHECK(call.args[5].buffer == bias);
    CHECK(call.args[6].value == 1e-5);
    CHECK(call.args[7].value == 8);     // the lane's global count
    CHECK(call.args[8].buffer == prev); // prev + (partial + rowBias), the loop's order
    CHECK(call.args[9].ints == Shape{24, 8});
    CHECK(call.args[10].buffer == partial);
    CHECK(call.args[11].ints == Shape{24, 8});
    CHECK(call.args[12].buffer == rowBias);
    CHECK(call.args[13].ints == Shape{0, 0});
    CHECK(b.fn.body[0].sources ==
          std::vector<std::string>{"t.mesh:1:1 layer_norm", "t.mesh:2:1 mul", "t.mesh:4:1 add"});
  }
  SECTION("two terms, one broadcast over the outer dim (a position embedding)") {
    Builder b;
    BufferId tokens = b.buffer(48, Storage::Input), position = b.buffer(24, Storage::Param),
             gain = b.buffer(8, Storage::Param), bias = b.buffer(8, Storage::Param),
             sum = b.buffer(48), normalized = b.buffer(48), y = b.buffer(48);
    b.fn.body.push_back(
        sumLoop(sum, {Access{tokens, {24, 8, 1}}, Access{position, {0, 8, 1}}}, 2, 3, 8));
    b.fn.body.push_back(alongRows(normalized, sum, 6, 8, "Along::LayerNorm"));
    b.fn.body.push_back(affineLoop(y, normalized, gain, bias, 6, 8));
    b.fn.outputs = {y, sum};
    fuseRowKernels(b.fn);
    REQUIRE(verifyKernels(b.fn).empty());
    REQUIRE(b.fn.body.size() == 1);
    const Call& call = std::get<Call>(b.fn.body[0].node);
    CHECK(call.callee == Callee::AddLayerNormAffine);
    CHECK(call.reads == std::vector<BufferId>{position, tokens, gain, bias});
    CHECK(call.args[8].buffer == position); // the add's operands in its order
    CHECK(call.args[9].ints == Shape{0, 8});
    CHECK(call.args[10].buffer == tokens);
    CHECK(call.args[11].ints == Shape{24, 8});
    CHECK(call.args[12].kind == Arg::Kind::Text); // no third term
    CHECK(call.args[12].text == "nullptr");
    CHECK(call.args[13].ints == Shape{});
  }
  SECTION("not fused: a product instead of a sum, a term read across its row, a sum that is "
          "not the norm's input, a norm without its gain and bias") {
    Builder b;
    BufferId x = b.buffer(48, Storage::Input), w = b.buffer(48, Storage::Input),
             gain = b.buffer(8, Storage::Param), bias = b.buffer(8, Storage::Param);
    std::vector<BufferId> outputs;
    auto block = [&](Stmt loop, BufferId sum, BufferId normIn, bool affine) {
      BufferId normalized = b.buffer(48), y = b.buffer(48);
      b.fn.body.push_back(std::move(loop));
      b.fn.body.push_back(alongRows(normalized, normIn, 6, 8, "Along::LayerNorm"));
      if (affine) b.fn.body.push_back(affineLoop(y, normalized, gain, bias, 6, 8));
      outputs.insert(outputs.end(), {sum, affine ? y : normalized});
    };
    BufferId product = b.buffer(48), across = b.buffer(48), other = b.buffer(48),
             plain = b.buffer(48);
    block(
        sumLoop(product, {Access{x, {24, 8, 1}}, Access{w, {24, 8, 1}}}, 2, 3, 8, ir::OpKind::Mul),
        product, product, true);
    // w read with its row across the outer dim (element i of row (a, b) at a*24 + i*3 + b).
    block(sumLoop(across, {Access{x, {24, 8, 1}}, Access{w, {24, 1, 3}}}, 2, 3, 8), across, across,
          true);
    // The norm reads x, not the sum.
    block(sumLoop(other, {Access{x, {24, 8, 1}}, Access{w, {24, 8, 1}}}, 2, 3, 8), other, x, true);
    // layer_norm alone (no layerNormAffine to join).
    block(sumLoop(plain, {Access{x, {24, 8, 1}}, Access{w, {24, 8, 1}}}, 2, 3, 8), plain, plain,
          false);
    b.fn.outputs = outputs;
    REQUIRE(verifyKernels(b.fn).empty());
    fuseRowKernels(b.fn);
    REQUIRE(verifyKernels(b.fn).empty());
    for (const Stmt& stmt : b.fn.body) {
      const Call* call = std::get_if<Call>(&stmt.node);
      CHECK((!call || call->callee != Callee::AddLayerNormAffine));
    }
    // Each block's norm still fuses with its gain and bias (where it has them).
    CHECK(b.fn.body.size() == 8);
  }
}

namespace {

/// y[r, c] = [gelu](product[r, c] + bias[c]) over rows x cols (bias read with `biasStrides`).
Stmt biasLoop(BufferId y, BufferId product, BufferId bias, int64_t rows, int64_t cols, bool gelu,
              Shape biasStrides = {0, 1}) {
  Loop loop;
  loop.dims = {"r", "c"};
  loop.extents = {rows, cols};
  loop.reads = {Access{product, {cols, 1}}, Access{bias, std::move(biasStrides)}};
  loop.body = {Scalar{.kind = Scalar::Kind::Load, .read = 0},
               Scalar{.kind = Scalar::Kind::Load, .read = 1},
               Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Add, .args = {1, 0}}};
  if (gelu)
    loop.body.push_back(Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Gelu, .args = {2}});
  loop.stores = {Store{Access{y, {cols, 1}}, int(loop.body.size() - 1)}};
  return Stmt{.node = std::move(loop), .sources = {"t.mesh:2:1 add"}};
}

} // namespace

TEST_CASE("fuse-gemm-epilogues: a bias along the last dim and GELU become the GEMM's") {
  SECTION("gelu(x . w + bias) and x . w + bias: one GEMM each") {
    for (bool gelu : {true, false}) {
      Builder b;
      BufferId x = b.buffer(12, Storage::Input), w = b.buffer(32, Storage::Param),
               bias = b.buffer(8, Storage::Param), product = b.buffer(24), y = b.buffer(24);
      b.gemm(product, x, w, 3, 4, 8);
      b.fn.body.back().sources = {"t.mesh:1:1 einsum"};
      b.fn.body.push_back(biasLoop(y, product, bias, 3, 8, gelu));
      b.fn.outputs = {y};
      REQUIRE(verifyKernels(b.fn).empty());
      fuseGemmEpilogues(b.fn);
      REQUIRE(verifyKernels(b.fn).empty());
      REQUIRE(b.fn.body.size() == 1);
      const Gemm& gemm = std::get<Gemm>(b.fn.body[0].node);
      CHECK(gemm.out == y);
      CHECK(gemm.operands == std::vector<BufferId>{x, w});
      CHECK(gemm.bias == bias);
      CHECK(gemm.gelu == gelu);
      CHECK(b.fn.body[0].sources ==
            std::vector<std::string>{"t.mesh:1:1 einsum", "t.mesh:2:1 add"});
      CHECK(readsOf(b.fn.body[0]) == std::vector<BufferId>{x, w, bias});
    }
  }
  SECTION("not fused: the product read again, a bias across rows, a scaled GEMM, more work in "
          "the loop, a loop over other points") {
    Builder b;
    BufferId x = b.buffer(12, Storage::Input), w = b.buffer(32, Storage::Param),
             bias = b.buffer(8, Storage::Param), wide = b.buffer(24, Storage::Param);
    auto add = [&](bool keepProduct) {
      BufferId product = b.buffer(24), y = b.buffer(24);
      b.gemm(product, x, w, 3, 4, 8);
      if (keepProduct) b.fn.outputs.push_back(product);
      b.fn.outputs.push_back(y);
      return std::pair{product, y};
    };
    // The product is also an output.
    auto [p1, y1] = add(true);
    b.fn.body.push_back(biasLoop(y1, p1, bias, 3, 8, true));
    // A bias that differs per row.
    auto [p2, y2] = add(false);
    b.fn.body.push_back(biasLoop(y2, p2, wide, 3, 8, true, {8, 1}));
    // alpha 0.5 (a folded scale).
    auto [p3, y3] = add(false);
    std::get<Gemm>(b.fn.body.back().node).alpha = 0.5;
    b.fn.body.push_back(biasLoop(y3, p3, bias, 3, 8, true));
    // gelu(product + bias) * 2.
    auto [p4, y4] = add(false);
    b.fn.body.push_back(biasLoop(y4, p4, bias, 3, 8, true));
    Loop& scaled = std::get<Loop>(b.fn.body.back().node);
    scaled.body.push_back(Scalar{.kind = Scalar::Kind::Const, .value = 2});
    scaled.body.push_back(
        Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Mul, .args = {3, 4}});
    scaled.stores[0].value = 5;
    // The loop walks the product transposed ([c, r]).
    auto [p5, y5] = add(false);
    Stmt transposed = biasLoop(y5, p5, bias, 8, 3, true, {1, 0});
    std::get<Loop>(transposed.node).reads[0].strides = {1, 8};
    b.fn.body.push_back(std::move(transposed));
    REQUIRE(verifyKernels(b.fn).empty());
    std::vector<Stmt> before = b.fn.body;
    fuseGemmEpilogues(b.fn);
    REQUIRE(b.fn.body.size() == before.size());
    for (size_t k = 0; k < before.size(); ++k)
      CHECK(b.fn.body[k].node == before[k].node);
  }
  SECTION("the verifier rejects an epilogue with alpha other than 1 or a bias of another size") {
    Builder b;
    BufferId x = b.buffer(12, Storage::Input), w = b.buffer(32, Storage::Param),
             bias = b.buffer(8, Storage::Param), wide = b.buffer(24, Storage::Param),
             y = b.buffer(24);
    b.gemm(y, x, w, 3, 4, 8);
    b.fn.outputs = {y};
    Gemm& gemm = std::get<Gemm>(b.fn.body.back().node);
    gemm.bias = bias;
    gemm.gelu = true;
    CHECK(verifyKernels(b.fn).empty());
    gemm.alpha = 0.5;
    CHECK(!verifyKernels(b.fn).empty());
    gemm.alpha = 1;
    gemm.bias = wide;
    CHECK(!verifyKernels(b.fn).empty());
  }
}

namespace {

/// Causal attention as lowering and the passes before causal-attention-blocks leave it, over
/// [batch 1, heads 2, seq = mem = `size`, d_head 4]: in the constructor an iota of the
/// positions and `causal` = cast(pos[s] `compare` pos[m]) (Ge: the causal mask, key m <= query
/// s); in run() mask = cast(tokens >= 0) * causal > 0.5 (`rawFactor`: an f32 input times causal
/// instead, which may be inf or NaN), scores = 0.125 * q . k, weights = maskedSoftmax(scores,
/// mask), context = weights . v.
struct Attention {
  Builder b;
  BufferId pos, causal, tokens, mask, q, k, v, scores, weights, context;
  size_t scoresGemm = 0, softmax = 0, contextGemm = 0;

  explicit Attention(int64_t size, ir::OpKind compare = ir::OpKind::Ge, bool rawFactor = false) {
    const int64_t heads = 2, dHead = 4;
    pos = b.buffer(size, Storage::Persistent);
    causal = b.buffer(size * size, Storage::Persistent);
    tokens = b.buffer(size, Storage::Input);
    mask = b.buffer(size * size);
    q = b.buffer(size * heads * dHead, Storage::Input);
    k = b.buffer(size * heads * dHead, Storage::Input);
    v = b.buffer(size * heads * dHead, Storage::Input);
    scores = b.buffer(heads * size * size);
    weights = b.buffer(heads * size * size);
    context = b.buffer(size * heads * dHead);
    b.fn.buffers[size_t(pos)].dtype = b.fn.buffers[size_t(tokens)].dtype =
        b.fn.buffers[size_t(mask)].dtype = DType::I32;
    if (rawFactor) b.fn.buffers[size_t(tokens)].dtype = DType::F32;
    b.fn.init.push_back(
        Stmt{.node = Call{.callee = Callee::Iota,
                          .args = {Arg{.kind = Arg::Kind::Data, .buffer = pos}, intsArg({size}),
                                   intsArg({1}), Arg{.kind = Arg::Kind::Int, .value = 0}},
                          .out = pos}});
    Loop triangle{.dims = {"seq", "mem"}, .extents = {size, size}};
    triangle.reads = {Access{pos, {1, 0}}, Access{pos, {0, 1}}};
    triangle.body = {
        Scalar{.kind = Scalar::Kind::Load, .read = 0, .dtype = DType::I32},
        Scalar{.kind = Scalar::Kind::Load, .read = 1, .dtype = DType::I32},
        Scalar{.kind = Scalar::Kind::Compute, .op = compare, .args = {0, 1}, .dtype = DType::I32},
        Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Cast, .args = {2}}};
    triangle.stores = {Store{Access{causal, {size, 1}}, 3}};
    b.fn.init.push_back(Stmt{.node = std::move(triangle)});

    Loop masking{.dims = {"seq", "mem"}, .extents = {size, size}};
    masking.reads = {Access{tokens, {1, 0}}, Access{causal, {size, 1}}};
    DType tokenType = rawFactor ? DType::F32 : DType::I32;
    masking.body = {Scalar{.kind = Scalar::Kind::Load, .read = 0, .dtype = tokenType},
                    Scalar{.kind = Scalar::Kind::Const, .value = 0, .dtype = tokenType},
                    Scalar{.kind = Scalar::Kind::Compute,
                           .op = ir::OpKind::Ge,
                           .args = {0, 1},
                           .dtype = DType::I32},
                    Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Cast, .args = {2}},
                    Scalar{.kind = Scalar::Kind::Load, .read = 1},
                    Scalar{.kind = Scalar::Kind::Compute,
                           .op = ir::OpKind::Mul,
                           .args = {rawFactor ? 0 : 3, 4}},
                    Scalar{.kind = Scalar::Kind::Const, .value = 0.5},
                    Scalar{.kind = Scalar::Kind::Compute,
                           .op = ir::OpKind::Gt,
                           .args = {5, 6},
                           .dtype = DType::I32}};
    masking.stores = {Store{Access{mask, {size, 1}}, 7}};
    b.fn.body.push_back(Stmt{.node = std::move(masking)});

    // dims b=0 h=1 s=2 e=3 m=4: q[b,s,h,e] . k[b,m,h,e] -> scores[b,h,s,m]
    scoresGemm = b.fn.body.size();
    b.fn.body.push_back(Stmt{.node = Gemm{.dims = {"batch", "heads", "seq", "d_head", "mem"},
                                          .sizes = {1, heads, size, dHead, size},
                                          .operands = {q, k},
                                          .operandDims = {{0, 2, 1, 3}, {0, 4, 1, 3}},
                                          .out = scores,
                                          .outDims = {0, 1, 2, 4},
                                          .alpha = 0.125}});
    softmax = b.fn.body.size();
    b.fn.body.push_back(Stmt{
        .node =
            Call{.callee = Callee::MaskedSoftmax,
                 .args = {Arg{.kind = Arg::Kind::Data, .buffer = weights},
                          Arg{.kind = Arg::Kind::Data, .buffer = scores},
                          Arg{.kind = Arg::Kind::Data, .buffer = mask}, intsArg({1, heads, size}),
                          intsArg({0, 0, size}), Arg{.kind = Arg::Kind::Int, .value = double(size)},
                          Arg{.kind = Arg::Kind::Int, .value = 1},
                          Arg{.kind = Arg::Kind::Real, .value = -1e9}},
                 .out = weights,
                 .reads = {scores, mask}}});
    // dims b=0 h=1 s=2 m=3 e=4: weights[b,h,s,m] . v[b,m,h,e] -> context[b,s,h,e]
    contextGemm = b.fn.body.size();
    b.fn.body.push_back(Stmt{.node = Gemm{.dims = {"batch", "heads", "seq", "mem", "d_head"},
                                          .sizes = {1, heads, size, size, dHead},
                                          .operands = {weights, v},
                                          .operandDims = {{0, 1, 2, 3}, {0, 3, 1, 4}},
                                          .out = context,
                                          .outDims = {0, 2, 1, 4}}});
    b.fn.outputs = {context};
  }
  const Gemm& gemm(size_t index) const { return std::get<Gemm>(b.fn.body[index].node); }

  /// Backward's GEMMs of the same attention (dims b=0 h=1 s=2 m=3 e=4): d_v = weights^T .
  /// d_context, then d_scores = where(mask, d_probs * weights, `fill`) * 0.125 stored by a loop,
  /// d_q = d_scores . k and d_k = d_scores^T . q.
  size_t dvGemm = 0, dqGemm = 0, dkGemm = 0;
  void backward(double fill = 0) {
    const int64_t heads = 2, dHead = 4, size = b.fn.buffers[size_t(pos)].elements;
    BufferId dContext = b.buffer(size * heads * dHead, Storage::Input),
             dProbs = b.buffer(heads * size * size, Storage::Input),
             dScores = b.buffer(heads * size * size), dv = b.buffer(size * heads * dHead),
             dq = b.buffer(size * heads * dHead), dk = b.buffer(size * heads * dHead);
    auto gemm = [&](BufferId x, std::vector<int64_t> xDims, BufferId y, std::vector<int64_t> yDims,
                    BufferId out, std::vector<int64_t> outDims) {
      b.fn.body.push_back(Stmt{.node = Gemm{.dims = {"batch", "heads", "seq", "mem", "d_head"},
                                            .sizes = {1, heads, size, size, dHead},
                                            .operands = {x, y},
                                            .operandDims = {std::move(xDims), std::move(yDims)},
                                            .out = out,
                                            .outDims = std::move(outDims)}});
      return b.fn.body.size() - 1;
    };
    dvGemm = gemm(dContext, {0, 2, 1, 4}, weights, {0, 1, 2, 3}, dv, {0, 3, 1, 4});
    Loop scoresGradient{.dims = {"batch", "heads", "seq", "mem"},
                        .extents = {1, heads, size, size}};
    scoresGradient.reads = {Access{dProbs, {0, size * size, size, 1}},
                            Access{weights, {0, size * size, size, 1}},
                            Access{mask, {0, 0, size, 1}}};
    scoresGradient.body = {
        Scalar{.kind = Scalar::Kind::Load, .read = 0},
        Scalar{.kind = Scalar::Kind::Load, .read = 1},
        Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Mul, .args = {0, 1}},
        Scalar{.kind = Scalar::Kind::Load, .read = 2, .dtype = DType::I32},
        Scalar{.kind = Scalar::Kind::Const, .value = fill},
        Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Where, .args = {3, 2, 4}},
        Scalar{.kind = Scalar::Kind::Const, .value = 0.125},
        Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Mul, .args = {5, 6}}};
    scoresGradient.stores = {Store{Access{dScores, {0, size * size, size, 1}}, 7}};
    b.fn.body.push_back(Stmt{.node = std::move(scoresGradient)});
    dqGemm = gemm(dScores, {0, 1, 2, 3}, k, {0, 3, 1, 4}, dq, {0, 2, 1, 4});
    dkGemm = gemm(dScores, {0, 1, 2, 3}, q, {0, 2, 1, 4}, dk, {0, 3, 1, 4});
    b.fn.outputs.insert(b.fn.outputs.end(), {dv, dq, dk});
  }
};

} // namespace

TEST_CASE("causal-attention-blocks: the scores and probs . v GEMMs of a causal mask in blocks") {
  SECTION("the causal mask: both GEMMs over the lower triangle of 32-position blocks") {
    Attention a(64);
    REQUIRE(verifyKernels(a.b.fn).empty());
    causalAttentionBlocks(a.b.fn);
    REQUIRE(verifyKernels(a.b.fn).empty());
    const Gemm::Causal& scores = a.gemm(a.scoresGemm).causal;
    CHECK(scores.kind == Gemm::Causal::Kind::Scores);
    CHECK(scores.row == 2); // seq
    CHECK(scores.col == 4); // mem
    CHECK(scores.block == 32);
    CHECK(scores.fill == -1e9);
    CHECK(!scores.fillAbove); // the softmax reads none of it
    // The softmax over the keys each row sees: its query position is outer dim 2 (seq).
    const Call& softmax = std::get<Call>(a.b.fn.body[a.softmax].node);
    CHECK(softmax.callee == Callee::CausalMaskedSoftmax);
    REQUIRE(softmax.args.size() == 9);
    CHECK(softmax.args[8].value == 2);
    const Gemm::Causal& context = a.gemm(a.contextGemm).causal;
    CHECK(context.kind == Gemm::Causal::Kind::Context);
    CHECK(context.row == 2); // seq
    CHECK(context.col == 3); // mem, contracted
    CHECK(context.block == 32);
    CHECK(context.weights == 0);
    CHECK(context.uniformTails); // the weights are the causalMaskedSoftmax's
    // A train step's: cast(tokens >= 0) stored into an f32 buffer of its own first (finite).
    Attention stored(64);
    BufferId valid = stored.b.buffer(64);
    Loop& masking = std::get<Loop>(stored.b.fn.body[0].node);
    Loop cast{.dims = {"seq"}, .extents = {64}, .reads = {Access{stored.tokens, {1}}}};
    cast.body = {masking.body[0], masking.body[1], masking.body[2], masking.body[3]};
    cast.stores = {Store{Access{valid, {1}}, 3}};
    masking.reads[0] = Access{valid, {1, 0}};
    masking.body[0].dtype = DType::F32;
    masking.body[5].args = {0, 4};
    stored.b.fn.body.insert(stored.b.fn.body.begin(), Stmt{.node = std::move(cast)});
    REQUIRE(verifyKernels(stored.b.fn).empty());
    causalAttentionBlocks(stored.b.fn);
    CHECK(std::get<Gemm>(stored.b.fn.body[stored.scoresGemm + 1].node).causal.kind ==
          Gemm::Causal::Kind::Scores);
    // Everything else as it was.
    Attention plain(64);
    Call& plainSoftmax = std::get<Call>(plain.b.fn.body[plain.softmax].node);
    plainSoftmax.callee = Callee::CausalMaskedSoftmax;
    plainSoftmax.args.push_back(Arg{.kind = Arg::Kind::Int, .value = 2});
    for (size_t k = 0; k < a.b.fn.body.size(); ++k)
      if (k != a.scoresGemm && k != a.contextGemm)
        CHECK(a.b.fn.body[k].node == plain.b.fn.body[k].node);
  }
  SECTION("i <= j, i < j and i > j: the mirrored masks, and a strict causal one") {
    for (auto [compare, fires] :
         {std::pair{ir::OpKind::Le, false}, std::pair{ir::OpKind::Lt, false},
          std::pair{ir::OpKind::Gt, true}}) {
      Attention a(64, compare);
      causalAttentionBlocks(a.b.fn);
      CHECK((a.gemm(a.scoresGemm).causal.kind == Gemm::Causal::Kind::Scores) == fires);
      CHECK((a.gemm(a.contextGemm).causal.kind == Gemm::Causal::Kind::Context) == fires);
      CHECK((std::get<Call>(a.b.fn.body[a.softmax].node).callee == Callee::CausalMaskedSoftmax) ==
            fires);
    }
  }
  SECTION("not blocked: seq not a multiple of the block or one block only, a factor that may be "
          "inf, a mask not built from positions, scores read again") {
    auto unchanged = [](Attention& a) {
      std::vector<Stmt> before = a.b.fn.body;
      causalAttentionBlocks(a.b.fn);
      REQUIRE(a.b.fn.body.size() == before.size());
      for (size_t k = 0; k < before.size(); ++k)
        CHECK(a.b.fn.body[k].node == before[k].node);
    };
    Attention ragged(48), single(32), raw(64, ir::OpKind::Ge, /*rawFactor=*/true);
    unchanged(ragged);
    unchanged(single);
    unchanged(raw);
    // The mask an input: nothing known of it.
    Attention input(64);
    input.b.fn.buffers[size_t(input.mask)].storage = Storage::Input;
    input.b.fn.buffers[size_t(input.mask)].index = 1;
    input.b.fn.body.erase(input.b.fn.body.begin());
    --input.scoresGemm, --input.softmax, --input.contextGemm;
    unchanged(input);
    // The causal triangle written twice: its second writer may change it.
    Attention twice(64);
    twice.b.fn.init.push_back(twice.b.fn.init.back());
    unchanged(twice);
    // The scores also an output: their entries above the diagonal are needed.
    Attention kept(64);
    kept.b.fn.outputs.push_back(kept.scores);
    causalAttentionBlocks(kept.b.fn);
    CHECK(kept.gemm(kept.scoresGemm).causal.kind == Gemm::Causal::Kind::None);
    CHECK(kept.gemm(kept.contextGemm).causal.kind == Gemm::Causal::Kind::Context);
  }
  SECTION("backward: d_v over the weights' zeros (checked), d_q and d_k over d_scores' (known)") {
    Attention a(64);
    a.backward();
    REQUIRE(verifyKernels(a.b.fn).empty());
    causalAttentionBlocks(a.b.fn);
    REQUIRE(verifyKernels(a.b.fn).empty());
    const Gemm::Causal &dv = a.gemm(a.dvGemm).causal, &dq = a.gemm(a.dqGemm).causal,
                       &dk = a.gemm(a.dkGemm).causal;
    CHECK(dv.kind == Gemm::Causal::Kind::KeyGradient);      // the query positions contracted
    CHECK((dv.row == 2 && dv.col == 3 && dv.weights == 1)); // seq, mem; the weights second
    CHECK((dv.uniformTails && !dv.knownZeros));
    CHECK(dq.kind == Gemm::Causal::Kind::Context); // the key positions contracted
    CHECK((dq.row == 2 && dq.col == 3 && dq.weights == 0 && dq.knownZeros && !dq.uniformTails));
    CHECK(dk.kind == Gemm::Causal::Kind::KeyGradient);
    CHECK((dk.row == 2 && dk.col == 3 && dk.weights == 0 && dk.knownZeros));
    // where(mask, x, 0.5): not zero above the diagonal.
    Attention filled(64);
    filled.backward(0.5);
    causalAttentionBlocks(filled.b.fn);
    CHECK(filled.gemm(filled.dvGemm).causal.kind == Gemm::Causal::Kind::KeyGradient);
    CHECK(filled.gemm(filled.dqGemm).causal.kind == Gemm::Causal::Kind::None);
    CHECK(filled.gemm(filled.dkGemm).causal.kind == Gemm::Causal::Kind::None);
    // The verifier: a key gradient keeps the key positions, not the query positions.
    Gemm& dkGemm = std::get<Gemm>(a.b.fn.body[a.dkGemm].node);
    dkGemm.causal.kind = Gemm::Causal::Kind::Context;
    CHECK(!verifyKernels(a.b.fn).empty());
    dkGemm.causal.kind = Gemm::Causal::Kind::KeyGradient;
    dkGemm.causal.uniformTails = true; // known zeros need no check
    CHECK(!verifyKernels(a.b.fn).empty());
  }
  SECTION("the verifier rejects a causal GEMM whose dims do not fit") {
    Attention a(64);
    causalAttentionBlocks(a.b.fn);
    REQUIRE(verifyKernels(a.b.fn).empty());
    Gemm& scores = std::get<Gemm>(a.b.fn.body[a.scoresGemm].node);
    scores.causal.block = 48; // 64 is no multiple of it
    CHECK(!verifyKernels(a.b.fn).empty());
    scores.causal.block = 32;
    scores.causal.col = 3; // d_head: not the key dim's size
    CHECK(!verifyKernels(a.b.fn).empty());
    scores.causal.col = 4;
    Gemm& context = std::get<Gemm>(a.b.fn.body[a.contextGemm].node);
    context.causal.weights = 1; // v has no query dim
    CHECK(!verifyKernels(a.b.fn).empty());
  }
}

TEST_CASE("every kernel pass has a name and a description, in one list") {
  const auto& passes = kernelPasses();
  REQUIRE(passes.size() >= 9);
  // Outlining runs on placed buffers (calls pass arena views), so it comes after planning.
  CHECK(std::string(passes[passes.size() - 2].name) == "plan-buffers");
  CHECK(std::string(passes.back().name) == "outline-repeated-code");
  for (const KernelPass& pass : passes) {
    CHECK(std::string(pass.name).find(' ') == std::string::npos);
    CHECK(std::string(pass.description).size() > 20);
  }
}

namespace {

/// One "layer": y = w @ tanh(x + b), then z = y * y, over fresh buffers; a dropout loop keyed by
/// `stream` when it is not empty. Returns the layer's output.
BufferId layer(Builder& b, BufferId x, const std::string& stream = "") {
  BufferId w = b.buffer(64, Storage::Param), bias = b.buffer(8, Storage::Param);
  BufferId h = b.buffer(8), y = b.buffer(8), z = b.buffer(8);
  b.loop(h, ir::OpKind::Add, {x, bias}, 8);
  b.loop(h, ir::OpKind::Tanh, {h}, 8);
  b.gemm(y, w, h, 8, 8, 1);
  b.loop(z, ir::OpKind::Mul, {y, y}, 8);
  if (!stream.empty()) {
    Loop& dropout = std::get<Loop>(b.fn.body.back().node);
    dropout.invariants = {Arg{.kind = Arg::Kind::StreamKey, .text = stream},
                          Arg{.kind = Arg::Kind::GlobalBase}};
    dropout.body.push_back(Scalar{.kind = Scalar::Kind::Dropout,
                                  .args = {int(dropout.body.size() - 1)},
                                  .read = 0,
                                  .value = 0.1,
                                  .strides = {1}});
    dropout.stores.back().value = int(dropout.body.size() - 1);
  }
  return z;
}

/// The statements' nodes, for comparing what runs before and after outlining.
std::vector<std::string> printed(const KernelFunction& fn, const std::vector<Stmt>& stmts) {
  KernelFunction copy = fn;
  copy.body = stmts;
  copy.subroutines.clear();
  std::string text = printKernels(copy);
  return {text.substr(text.find("run:"))};
}

} // namespace

TEST_CASE("outline-repeated-code calls one subroutine per repeated layer, same statements run") {
  Builder b;
  BufferId x = b.buffer(8, Storage::Input);
  for (int k = 0; k < 3; ++k)
    x = layer(b, x, "layer[" + std::to_string(k) + "]/dropout");
  b.fn.outputs = {x};
  planBuffers(b.fn);
  KernelFunction before = b.fn;
  outlineRepeatedCode(b.fn);
  CHECK(verifyKernels(b.fn) == "");
  REQUIRE(b.fn.subroutines.size() == 1);
  const Subroutine& sub = b.fn.subroutines[0];
  CHECK(sub.body.size() == 4);
  CHECK(sub.textParameters == 1); // each layer's dropout draws from its own stream
  REQUIRE(b.fn.body.size() == 3);
  for (size_t k = 0; k < 3; ++k) {
    const Invoke& call = std::get<Invoke>(b.fn.body[k].node);
    CHECK(call.subroutine == 0);
    CHECK(call.texts == std::vector<std::string>{"layer[" + std::to_string(k) + "]/dropout"});
    CHECK(call.arguments.size() == sub.parameters.size());
  }
  // Inlined back, the calls are the original statements, buffer for buffer and stream for stream.
  CHECK(printed(b.fn, b.fn.inlinedBody()) == printed(before, before.body));
}

TEST_CASE("outline-repeated-code renames buffers one-to-one over the whole stretch") {
  // Two stretches whose statements agree one by one, but the second one's tanh reads the
  // stretch's input where the first one's reads the sum: one subroutine cannot serve both.
  Builder b;
  BufferId x = b.buffer(8, Storage::Input);
  std::vector<BufferId> outs;
  for (int k = 0; k < 2; ++k) {
    BufferId bias = b.buffer(8, Storage::Param), w = b.buffer(64, Storage::Param);
    BufferId h = b.buffer(8), t = b.buffer(8), y = b.buffer(8);
    b.loop(h, ir::OpKind::Add, {x, bias}, 8);
    b.loop(t, ir::OpKind::Tanh, {k == 0 ? h : x}, 8);
    b.gemm(y, w, t, 8, 8, 1);
    for (int n = 0; n < 4; ++n) {
      BufferId next = b.buffer(8);
      b.loop(next, ir::OpKind::Mul, {y, h}, 8);
      y = next;
    }
    outs.push_back(y);
    x = y;
  }
  b.fn.outputs = outs;
  planBuffers(b.fn);
  KernelFunction before = b.fn;
  outlineRepeatedCode(b.fn);
  CHECK(verifyKernels(b.fn) == "");
  CHECK(printed(b.fn, b.fn.inlinedBody()) == printed(before, before.body));
  for (const Subroutine& sub : b.fn.subroutines) // only the tail after the tanh can be shared
    CHECK(sub.body.size() < 7);
}

TEST_CASE("outline-repeated-code takes a collective's start and wait together or not at all") {
  Builder b;
  BufferId x = b.buffer(8, Storage::Input);
  std::vector<BufferId> outs;
  for (int k = 0; k < 2; ++k) {
    x = layer(b, x);
    BufferId sum = b.buffer(8);
    b.loop(sum, ir::OpKind::Neg, {x}, 8);
    b.allReduce({sum});
    outs.push_back(sum);
  }
  b.fn.outputs = outs;
  scheduleCollectives(b.fn);
  planBuffers(b.fn);
  outlineRepeatedCode(b.fn);
  CHECK(verifyKernels(b.fn) == "");
  for (const Subroutine& sub : b.fn.subroutines) {
    int open = 0;
    for (const Stmt& stmt : sub.body)
      if (const Collective* c = std::get_if<Collective>(&stmt.node))
        open += c->phase == Collective::Phase::Start  ? 1
                : c->phase == Collective::Phase::Wait ? -1
                                                      : 0;
    CHECK(open == 0);
  }
  CHECK(!b.fn.subroutines.empty());
}

TEST_CASE("the verifier rejects malformed subroutines and calls") {
  Builder b;
  BufferId x = b.buffer(8, Storage::Input);
  for (int k = 0; k < 2; ++k)
    x = layer(b, x);
  b.fn.outputs = {x};
  planBuffers(b.fn);
  outlineRepeatedCode(b.fn);
  REQUIRE(verifyKernels(b.fn) == "");
  REQUIRE(b.fn.subroutines.size() == 1);

  KernelFunction wrongCount = b.fn;
  std::get<Invoke>(wrongCount.body[0].node).arguments.pop_back();
  CHECK(verifyKernels(wrongCount).find("arguments for the") != std::string::npos);

  KernelFunction wrongSize = b.fn;
  Invoke& call = std::get<Invoke>(wrongSize.body[0].node);
  call.arguments[0] = wrongSize.addBuffer(Buffer{.name = "odd", .elements = 3});
  CHECK(verifyKernels(wrongSize).find("does not match its parameter") != std::string::npos);

  KernelFunction foreign = b.fn;
  replaceBuffer(foreign.subroutines[0].body[0], foreign.subroutines[0].parameters[0], x);
  CHECK(verifyKernels(foreign).find("not passed") != std::string::npos);
}

namespace {

/// A two-stage step of 2 microbatches: a = x + p0 on stage 0, b = a * p1 on stage 1 (forward);
/// gb = b * b on stage 1, ga = gb * a on stage 0 (backward), accumulated into acc (zeroed before
/// the loop, statements without a stage), which the update reads.
struct TwoStages {
  Builder b;
  BufferId x, p0, p1, a, bOut, gb, ga, acc, next;
  TwoStages(bool oneFOneB) {
    b.fn.stages = {"stage", 2, oneFOneB};
    b.fn.microbatches = {2, "batch"};
    x = b.buffer(8, Storage::Input);
    p0 = b.buffer(8, Storage::Param);
    p1 = b.buffer(8, Storage::Param);
    a = b.buffer(8), bOut = b.buffer(8), gb = b.buffer(8), ga = b.buffer(8), acc = b.buffer(8);
    next = b.buffer(8);
    b.loop(acc, ir::OpKind::Literal, {}, 8, 0);
    b.loop(a, ir::OpKind::Add, {x, p0}, 8);
    mark(0, plan::Phase::Forward);
    b.loop(bOut, ir::OpKind::Mul, {a, p1}, 8);
    mark(1, plan::Phase::Forward);
    b.loop(gb, ir::OpKind::Mul, {bOut, bOut}, 8);
    mark(1, plan::Phase::Backward);
    b.loop(ga, ir::OpKind::Mul, {gb, a}, 8);
    mark(0, plan::Phase::Backward);
    b.loop(acc, ir::OpKind::Add, {acc, ga}, 8);
    mark(-1, plan::Phase::Backward);
    b.loop(next, ir::OpKind::Sub, {p0, acc}, 8);
    b.fn.body.back().phase = plan::Phase::Update;
    b.fn.updates = {{0, next, true}};
  }
  void mark(int stage, plan::Phase phase) {
    b.fn.body.back().stage = stage;
    b.fn.body.back().phase = phase;
    b.fn.body.back().perMicrobatch = true;
  }
  const Stmt& writerOf(BufferId id) const {
    for (const Stmt& stmt : b.fn.body)
      if (std::holds_alternative<Loop>(stmt.node) && llvm::is_contained(writesOf(stmt), id))
        return stmt;
    FAIL("no writer");
    return b.fn.body.front();
  }
  std::vector<const Call*> calls(Callee callee) const {
    std::vector<const Call*> found;
    for (const Stmt& stmt : b.fn.body)
      if (const Call* call = std::get_if<Call>(&stmt.node); call && call->callee == callee)
        found.push_back(call);
    return found;
  }
};

} // namespace

TEST_CASE("split-stages places statements and params on stages, sends what crosses") {
  TwoStages t(false);
  splitStages(t.b.fn);
  CHECK(t.writerOf(t.a).stageMask == 1);
  CHECK(t.writerOf(t.bOut).stageMask == 2);
  CHECK(t.writerOf(t.ga).stageMask == 1);
  // Each param lives on the stage that reads it; p0's update runs there, on its gradient
  // accumulated there (zeroed there), which no other stage needs: no all-reduce over the stages.
  CHECK(t.b.fn.paramStages == std::vector<uint64_t>{1, 2});
  CHECK(t.writerOf(t.next).stageMask == 1);
  CHECK(t.b.fn.body.front().stageMask == 1);
  // The accumulation runs where the gradient is.
  const Stmt* accumulate = nullptr;
  for (const Stmt& stmt : t.b.fn.body)
    if (stmt.perMicrobatch && llvm::is_contained(writesOf(stmt), t.acc)) accumulate = &stmt;
  REQUIRE(accumulate);
  CHECK(accumulate->stageMask == 1);
  // a goes forward to stage 1, gb back to stage 0, each right after its write.
  std::vector<const Call*> transfers = t.calls(Callee::StageTransfer);
  REQUIRE(transfers.size() == 2);
  CHECK(transfers[0]->reads == std::vector<BufferId>{t.a});
  CHECK(transfers[0]->args[2].value == 0);
  CHECK(transfers[0]->args[3].value == 2);
  CHECK(transfers[1]->reads == std::vector<BufferId>{t.gb});
  CHECK(transfers[1]->args[2].value == 1);
  CHECK(transfers[1]->args[3].value == 1);
  for (const Stmt& stmt : t.b.fn.body)
    CHECK(!std::holds_alternative<Collective>(stmt.node));
}

TEST_CASE("split-stages: a param both stages read, its gradient all-reduced over the stages; a "
          "bucket of both stages' gradients split") {
  TwoStages t(false);
  // Stage 1 reads p0 too (b = a * p1 * p0) and adds its own part of p0's gradient; p1's
  // gradient accumulates on stage 1 and one all-reduce over `data` holds both accumulators.
  BufferId ab = t.b.fn.addBuffer(Buffer{.name = "ab", .elements = 8});
  BufferId acc1 = t.b.fn.addBuffer(Buffer{.name = "acc1", .elements = 8});
  BufferId next1 = t.b.fn.addBuffer(Buffer{.name = "next1", .elements = 8});
  std::vector<Stmt>& body = t.b.fn.body;
  Stmt zero1 = body.front();
  replaceBuffer(zero1, t.acc, acc1);
  body.insert(body.begin() + 1, zero1);
  auto writer = [&](BufferId id) {
    return llvm::find_if(body,
                         [&](const Stmt& stmt) { return llvm::is_contained(writesOf(stmt), id); });
  };
  Stmt scale = *writer(t.bOut);
  std::get<Loop>(scale.node).reads[0].buffer = t.p0; // ab = p0 * p1
  replaceBuffer(scale, t.bOut, ab);
  body.insert(writer(t.bOut), scale);
  auto accumulateGa = llvm::find_if(body, [&](const Stmt& stmt) {
    return stmt.perMicrobatch && llvm::is_contained(writesOf(stmt), t.acc);
  });
  Stmt onStage1 = *accumulateGa, intoAcc1 = *accumulateGa;
  replaceBuffer(onStage1, t.ga, ab); // acc += ab (read on stage 1: stage 1's part)
  onStage1.stage = 1;
  replaceBuffer(intoAcc1, t.acc, acc1);
  replaceBuffer(intoAcc1, t.ga, t.gb); // acc1 += gb on stage 1
  intoAcc1.stage = 1;
  accumulateGa = body.insert(accumulateGa + 1, onStage1);
  body.insert(accumulateGa + 1, intoAcc1);
  auto update = writer(t.next);
  update = body.insert(update, Stmt{.node = Collective{.kind = plan::CollectiveKind::AllReduceSum,
                                                       .axes = {"data"},
                                                       .buffers = {t.acc, acc1}},
                                    .phase = plan::Phase::Backward});
  Stmt update1 = *(update + 1);
  replaceBuffer(update1, t.p0, t.p1);
  replaceBuffer(update1, t.acc, acc1);
  replaceBuffer(update1, t.next, next1);
  body.insert(update + 2, update1);
  t.b.fn.updates.push_back({1, next1, true});
  REQUIRE(verifyKernels(t.b.fn) == "");

  splitStages(t.b.fn);
  CHECK(t.b.fn.paramStages == std::vector<uint64_t>{0, 2}); // 0: on every stage (both)
  CHECK(t.writerOf(t.next).stageMask == 3); // p0's update on both stages that hold it
  CHECK(t.writerOf(next1).stageMask == 2);
  std::vector<std::pair<std::vector<std::string>, std::vector<BufferId>>> collectives;
  std::vector<uint64_t> masks;
  for (const Stmt& stmt : t.b.fn.body)
    if (const auto* c = std::get_if<Collective>(&stmt.node)) {
      collectives.push_back({c->axes, c->buffers});
      masks.push_back(stmt.stageMask);
    }
  // p0's gradient, accumulated on both stages, all-reduced over them after the loop; then the
  // `data` bucket split in two, each on its stage.
  REQUIRE(collectives.size() == 3);
  CHECK(collectives[0].first == std::vector<std::string>{"stage"});
  CHECK(collectives[0].second == std::vector<BufferId>{t.acc});
  CHECK(collectives[1].second == std::vector<BufferId>{t.acc});
  CHECK(masks[1] == 3);
  CHECK(collectives[2].second == std::vector<BufferId>{acc1});
  CHECK(masks[2] == 2);
  planBuffers(t.b.fn);
  CHECK(verifyKernels(t.b.fn) == "");
}

TEST_CASE("schedule-microbatches: GPipe's two loops, kept activations copied per microbatch") {
  for (bool oneFOneB : {false, true}) {
    TwoStages t(oneFOneB);
    splitStages(t.b.fn);
    scheduleMicrobatches(t.b.fn);
    int loop = 0;
    for (const Stmt& stmt : t.b.fn.body) {
      if (!stmt.perMicrobatch) continue;
      CHECK(stmt.microbatchLoop >= loop); // every forward before every backward
      loop = stmt.microbatchLoop;
      CHECK(stmt.microbatchLoop == (stmt.phase == plan::Phase::Forward ? 0 : 1));
    }
    CHECK(loop == 1);
    CHECK(t.b.fn.buffers[size_t(t.a)].copies == 2); // read by the backwards
    // Read by the backwards on the last stage, which under 1F1B holds one microbatch at a time.
    CHECK(t.b.fn.buffers[size_t(t.bOut)].copies == (oneFOneB ? 1 : 2));
    CHECK(t.b.fn.buffers[size_t(t.gb)].copies == 1);  // the backwards' own
    CHECK(t.b.fn.buffers[size_t(t.acc)].copies == 1); // shared with the update
    // Either schedule starts the loops' sends and waits for them after the loops.
    CHECK(t.calls(Callee::StageTransferStarted).size() == 2u);
    CHECK(t.calls(Callee::StageTransfer).empty());
    CHECK(t.calls(Callee::WaitStageSends).size() == 1u);
    planBuffers(t.b.fn);
    REQUIRE(verifyKernels(t.b.fn) == "");
    if (!oneFOneB) continue;
    // Untagged messages: a forwards' value sent back to an earlier stage is refused.
    KernelFunction wrong = t.b.fn;
    for (Stmt& stmt : wrong.body)
      if (Call* call = std::get_if<Call>(&stmt.node);
          call && call->callee == Callee::StageTransferStarted && stmt.microbatchLoop == 0) {
        call->args[2].value = 1;
        call->args[3].value = 1;
      }
    CHECK(verifyKernels(wrong).find("under 1F1B") != std::string::npos);
  }
}

TEST_CASE("split-stages: a sum of scalars held on different stages becomes each stage's sum and "
          "one all-reduce over the stages") {
  TwoStages t(false);
  // The update sums a scalar of each stage (AdamW's global norm: each param's sum of squared
  // gradients) and takes its square root; p0's update reads the result.
  BufferId s0 = t.b.fn.addBuffer(Buffer{.name = "s0", .elements = 1});
  BufferId s1 = t.b.fn.addBuffer(Buffer{.name = "s1", .elements = 1});
  BufferId sum = t.b.fn.addBuffer(Buffer{.name = "sum", .elements = 1});
  BufferId norm = t.b.fn.addBuffer(Buffer{.name = "norm", .elements = 1});
  Stmt update = t.b.fn.body.back();
  t.b.fn.body.pop_back();
  t.b.loop(s0, ir::OpKind::Mul, {t.acc, t.acc}, 1);
  t.b.loop(s1, ir::OpKind::Mul, {t.p1, t.p1}, 1);
  t.b.loop(sum, ir::OpKind::Add, {s0, s1}, 1);
  t.b.loop(norm, ir::OpKind::Sqrt, {sum}, 1);
  for (size_t k = t.b.fn.body.size() - 4; k < t.b.fn.body.size(); ++k)
    t.b.fn.body[k].phase = plan::Phase::Update;
  std::get<Loop>(update.node).reads.push_back(Access{norm, {0}});
  t.b.fn.body.push_back(update);
  REQUIRE(verifyKernels(t.b.fn) == "");

  splitStages(t.b.fn);
  // Each stage sums what it holds into `sum`; one all-reduce over the stages adds them; the
  // square root runs where it is read (p0's update, stage 0); no scalar goes point to point.
  std::vector<uint64_t> sumWriters;
  for (const Stmt& stmt : t.b.fn.body)
    if (std::holds_alternative<Loop>(stmt.node) && llvm::is_contained(writesOf(stmt), sum))
      sumWriters.push_back(stmt.stageMask);
  CHECK(sumWriters == std::vector<uint64_t>{1, 2});
  int overStages = 0;
  for (const Stmt& stmt : t.b.fn.body)
    if (const auto* c = std::get_if<Collective>(&stmt.node))
      overStages +=
          c->axes == std::vector<std::string>{"stage"} && c->buffers == std::vector<BufferId>{sum};
  CHECK(overStages == 1);
  CHECK(t.writerOf(norm).stageMask == 1);
  for (const Call* call : t.calls(Callee::StageTransfer))
    for (BufferId scalar : {s0, s1, sum, norm})
      CHECK(!llvm::is_contained(call->reads, scalar));
  planBuffers(t.b.fn);
  CHECK(verifyKernels(t.b.fn) == "");
}

TEST_CASE("plan-buffers: buffers of different stages share bytes; each stage's arena its own") {
  Builder b;
  b.fn.stages = {"stage", 2, false};
  BufferId x = b.buffer(64, Storage::Input), u = b.buffer(16), v = b.buffer(64);
  BufferId u2 = b.buffer(16), v2 = b.buffer(64);
  b.loop(u, ir::OpKind::Neg, {x}, 16);
  b.fn.body.back().stageMask = 1;
  b.loop(v, ir::OpKind::Neg, {x}, 64);
  b.fn.body.back().stageMask = 2;
  b.loop(u2, ir::OpKind::Exp, {u}, 16); // u and v are alive together, on different stages
  b.fn.body.back().stageMask = 1;
  b.loop(v2, ir::OpKind::Exp, {v}, 64);
  b.fn.body.back().stageMask = 2;
  planBuffers(b.fn);
  REQUIRE(verifyKernels(b.fn).empty());
  CHECK(b.fn.buffers[size_t(u)].stages == 1);
  CHECK(b.fn.buffers[size_t(v)].stages == 2);
  CHECK(b.fn.buffers[size_t(u)].offset == b.fn.buffers[size_t(v)].offset);
  CHECK(b.fn.stageArenaBytes == std::vector<size_t>{2 * 64, 2 * 256});
  CHECK(b.fn.arenaBytes == 2 * 256);
  // The verifier rejects a buffer touched on a stage that does not hold it.
  b.fn.body.back().stageMask = 3;
  CHECK(verifyKernels(b.fn).find("touched on stages") != std::string::npos);
}

TEST_CASE("contract-pairwise: a three-operand einsum as two GEMMs, fewest FLOPs first") {
  // t5's attention output: weights[b, h, s, k] values[b, k, h, e] o[h, e, d] -> [b, s, d].
  // weights.values first: 2 b h s k e + 2 b h s e d = 16384 + 32768 FLOPs; values.o first:
  // 32768 + 32768; weights.o first: 2 b h s k e d, more than both.
  const int64_t b = 2, h = 4, s = 8, k = 16, e = 8, d = 32;
  plan::Contraction order =
      plan::planContraction({{0, 1, 2, 3}, {0, 3, 1, 4}, {1, 4, 5}}, {0, 2, 5}, {b, h, s, k, e, d});
  REQUIRE(order.steps.size() == 2);
  CHECK(order.steps[0].left == 0);
  CHECK(order.steps[0].right == 1);
  CHECK(order.steps[0].dims == std::vector<int64_t>{0, 1, 2, 4}); // batch b, h; m s; n e
  CHECK(order.steps[0].flops == 2.0 * b * h * s * k * e);
  CHECK(order.steps[1].left == 2);
  CHECK(order.steps[1].right == 3);
  CHECK(order.steps[1].dims == std::vector<int64_t>{0, 2, 5});
  CHECK(order.flops == 2.0 * b * h * s * k * e + 2.0 * b * h * s * e * d);
  CHECK(order.broadcast.empty());
  CHECK(order.rewritten());

  Builder builder;
  BufferId w = builder.buffer(b * h * s * k, Storage::Input);
  BufferId v = builder.buffer(b * k * h * e, Storage::Input);
  BufferId o = builder.buffer(h * e * d, Storage::Param);
  BufferId out = builder.buffer(b * s * d);
  Gemm gemm{.dims = {"b", "h", "s", "k", "e", "d"},
            .sizes = {b, h, s, k, e, d},
            .operands = {w, v, o},
            .operandDims = {{0, 1, 2, 3}, {0, 3, 1, 4}, {1, 4, 5}},
            .out = out,
            .outDims = {0, 2, 5}};
  builder.fn.body.push_back(Stmt{.node = gemm});
  builder.fn.outputs = {out};
  contractPairwise(builder.fn);
  REQUIRE(verifyKernels(builder.fn).empty());
  REQUIRE(builder.fn.body.size() == 2);
  const Gemm& first = std::get<Gemm>(builder.fn.body[0].node);
  const Gemm& second = std::get<Gemm>(builder.fn.body[1].node);
  CHECK(first.operands == std::vector<BufferId>{w, v});
  CHECK(first.dims == std::vector<std::string>{"b", "h", "s", "k", "e"}); // d is not used
  BufferId middle = first.out;
  CHECK(builder.fn.buffers[size_t(middle)].storage == Storage::Arena);
  CHECK(builder.fn.buffers[size_t(middle)].elements == b * h * s * e);
  CHECK(second.operands == std::vector<BufferId>{o, middle});
  CHECK(second.out == out);
  // The intermediate gets its arena slot; it dies at the second GEMM, the output lives on.
  planBuffers(builder.fn);
  REQUIRE(verifyKernels(builder.fn).empty());
  CHECK(builder.fn.temporaryBytes == size_t(b * h * s * e + b * s * d) * sizeof(float));

  // Two operands and every output dim in one of them: one GEMM, left as it is.
  Builder plain;
  BufferId x = plain.buffer(12, Storage::Input), y = plain.buffer(20, Storage::Input);
  BufferId z = plain.buffer(15);
  plain.gemm(z, x, y, 3, 4, 5);
  plain.fn.outputs = {z};
  KernelFunction before = plain.fn;
  contractPairwise(plain.fn);
  CHECK(plain.fn.body.size() == 1);
  CHECK(std::get<Gemm>(plain.fn.body[0].node) == std::get<Gemm>(before.body[0].node));
}

TEST_CASE("contract-pairwise: an output dim no operand has is a GEMM, then a broadcast copy") {
  // x[s, d] p[d, e] -> [s, r, e]: the product over [s, e], repeated along r.
  const int64_t s = 3, d = 4, e = 5, r = 2;
  Builder builder;
  BufferId x = builder.buffer(s * d, Storage::Input), p = builder.buffer(d * e, Storage::Param);
  BufferId out = builder.buffer(s * r * e);
  builder.fn.body.push_back(Stmt{.node = Gemm{.dims = {"s", "d", "e", "r"},
                                              .sizes = {s, d, e, r},
                                              .operands = {x, p},
                                              .operandDims = {{0, 1}, {1, 2}},
                                              .out = out,
                                              .outDims = {0, 3, 2},
                                              .alpha = 0.5}});
  builder.fn.outputs = {out};
  contractPairwise(builder.fn);
  REQUIRE(verifyKernels(builder.fn).empty());
  REQUIRE(builder.fn.body.size() == 2);
  const Gemm& product = std::get<Gemm>(builder.fn.body[0].node);
  CHECK(product.alpha == 0.5);
  CHECK(product.outDims.size() == 2);
  CHECK(builder.fn.buffers[size_t(product.out)].elements == s * e);
  const Loop& copy = std::get<Loop>(builder.fn.body[1].node);
  CHECK(copy.extents == Shape{s, r, e});
  REQUIRE(copy.reads.size() == 1);
  CHECK(copy.reads[0] == Access{product.out, {e, 0, 1}});
  REQUIRE(copy.stores.size() == 1);
  CHECK(copy.stores[0].at == Access{out, {r * e, e, 1}});
}

namespace {

/// out = dropout(in) over 8 points, its mask keyed by `stream` (rate `rate`, global index i).
void dropoutLoop(Builder& b, BufferId out, BufferId in, const std::string& stream,
                 double rate = 0.1, bool recomputed = false) {
  b.loop(out, ir::OpKind::Neg, {in}, 8);
  Loop& loop = std::get<Loop>(b.fn.body.back().node);
  loop.body.pop_back(); // the Neg: the loaded value is dropped out as it is
  loop.invariants = {Arg{.kind = Arg::Kind::StreamKey, .text = stream},
                     Arg{.kind = Arg::Kind::GlobalBase}};
  loop.body.push_back(
      Scalar{.kind = Scalar::Kind::Dropout, .args = {0}, .read = 0, .value = rate, .strides = {1}});
  loop.stores.back().value = 1;
  b.fn.body.back().recomputed = recomputed;
}

const Loop& loopAt(const Builder& b, size_t k) {
  return std::get<Loop>(b.fn.body[k].node);
}

} // namespace

TEST_CASE("keep-dropout-masks: a later dropout of the same mask reads the bytes the first stores") {
  Builder b;
  BufferId x = b.buffer(8, Storage::Input), g = b.buffer(8, Storage::Input);
  BufferId y = b.buffer(8), other = b.buffer(8), dx = b.buffer(8), again = b.buffer(8);
  BufferId rate = b.buffer(8);
  dropoutLoop(b, y, x, "s");         // 0: the forward draws
  dropoutLoop(b, other, x, "t");     // 1: another stream
  dropoutLoop(b, dx, g, "s");        // 2: backward's dropout of the gradient
  dropoutLoop(b, again, g, "s");     // 3: the same mask once more
  dropoutLoop(b, rate, g, "s", 0.2); // 4: another rate draws its own
  b.fn.outputs = {y, other, dx, again, rate};
  size_t buffers = b.fn.buffers.size();
  keepDropoutMasks(b.fn);
  REQUIRE(verifyKernels(b.fn).empty());
  REQUIRE(b.fn.buffers.size() == buffers + 1); // one mask, for stream s at rate 0.1
  BufferId mask = BufferId(buffers);
  CHECK(b.fn.buffers[size_t(mask)].keepMask);
  CHECK(b.fn.buffers[size_t(mask)].elements == 2); // 8 bytes in two float slots
  CHECK(accessibleElements(b.fn.buffers[size_t(mask)]) == 8);
  const Loop& forward = loopAt(b, 0);
  REQUIRE(forward.stores.size() == 2);
  CHECK((forward.stores[1].at.buffer == mask && forward.stores[1].keepBit &&
         forward.stores[1].value == 1));
  for (size_t k : {2u, 3u}) {
    const Loop& backward = loopAt(b, k);
    CHECK(backward.invariants.empty()); // nothing drawn: no key, no base
    REQUIRE(backward.body.size() == 3);
    CHECK(backward.body[1].kind == Scalar::Kind::Load);
    CHECK(backward.reads[size_t(backward.body[1].read)].buffer == mask);
    CHECK(backward.body[2].args == std::vector<int>{0, 1});
    CHECK(backward.stores[0].value == 2);
  }
  for (size_t k : {1u, 4u}) {
    CHECK(loopAt(b, k).stores.size() == 1);
    CHECK(loopAt(b, k).body.back().args.size() == 1);
  }
  CHECK(printKernels(b.fn).find("dropout %0 rate 0.1 kept %1") != std::string::npos);
  CHECK(printKernels(b.fn).find("= keep %1") != std::string::npos);
}

TEST_CASE("keep-dropout-masks: a recomputed forward draws, and its backward reads its mask") {
  Builder b;
  BufferId x = b.buffer(8, Storage::Input), g = b.buffer(8, Storage::Input);
  BufferId y = b.buffer(8), y2 = b.buffer(8), dx = b.buffer(8);
  dropoutLoop(b, y, x, "s");
  dropoutLoop(b, y2, x, "s", 0.1, /*recomputed=*/true);
  dropoutLoop(b, dx, g, "s");
  b.fn.outputs = {y, y2, dx};
  keepDropoutMasks(b.fn);
  REQUIRE(verifyKernels(b.fn).empty());
  CHECK(loopAt(b, 0).stores.size() == 1); // the forward keeps nothing alive
  CHECK(loopAt(b, 1).body.back().args.size() == 1);
  REQUIRE(loopAt(b, 1).stores.size() == 2);
  CHECK(loopAt(b, 1).stores[1].keepBit);
  CHECK(loopAt(b, 2).reads.back().buffer == loopAt(b, 1).stores[1].at.buffer);
}

TEST_CASE("the verifier rejects a keep mask used as anything but a dropout's bytes") {
  auto kept = [] {
    Builder b;
    BufferId x = b.buffer(8, Storage::Input), g = b.buffer(8, Storage::Input);
    BufferId y = b.buffer(8), dx = b.buffer(8);
    dropoutLoop(b, y, x, "s");
    dropoutLoop(b, dx, g, "s");
    b.fn.outputs = {y, dx};
    keepDropoutMasks(b.fn);
    REQUIRE(verifyKernels(b.fn).empty());
    return b;
  };
  const BufferId mask = BufferId(kept().fn.buffers.size() - 1);

  Builder gemm = kept();
  BufferId product = gemm.buffer(4);
  gemm.gemm(product, mask, mask, 2, 1, 2);
  CHECK(verifyKernels(gemm.fn).find("other than a loop or call touches the keep mask") !=
        std::string::npos);

  Builder plain = kept(); // the forward stores its value, not its keep bit, into the mask
  std::get<Loop>(plain.fn.body[0].node).stores[1].keepBit = false;
  CHECK(verifyKernels(plain.fn).find("not a dropout's keep bit into a keep mask") !=
        std::string::npos);

  Builder load = kept(); // the backward keeps by a value that is not the mask's byte
  std::get<Loop>(load.fn.body[1].node).body[2].args = {0, 0};
  CHECK(verifyKernels(load.fn).find("not a load of a keep mask") != std::string::npos);

  Builder far = kept(); // the mask is read past its 8 bytes
  std::get<Loop>(far.fn.body[1].node).reads.back().strides = {2};
  CHECK(verifyKernels(far.fn).find("reaches element 14") != std::string::npos);
}

TEST_CASE("outline-repeated-code passes a layer's keep mask to a keep-mask parameter") {
  Builder b;
  BufferId x = b.buffer(8, Storage::Input), g = b.buffer(8, Storage::Input);
  std::vector<BufferId> outputs;
  for (int k = 0; k < 3; ++k)
    outputs.push_back(x = layer(b, x, "layer[" + std::to_string(k) + "]/dropout"));
  for (int k = 3; k-- > 0;) { // the backward's dropouts of the same masks
    outputs.push_back(b.buffer(8));
    dropoutLoop(b, outputs.back(), g, "layer[" + std::to_string(k) + "]/dropout");
  }
  b.fn.outputs = outputs;
  keepDropoutMasks(b.fn);
  planBuffers(b.fn);
  KernelFunction before = b.fn;
  outlineRepeatedCode(b.fn);
  REQUIRE(verifyKernels(b.fn) == "");
  REQUIRE(!b.fn.subroutines.empty());
  size_t masks = 0;
  for (BufferId id : b.fn.subroutines[0].parameters)
    masks += b.fn.buffers[size_t(id)].keepMask;
  CHECK(masks == 1); // the layer's dropout stores its keep bits through it
  CHECK(printed(b.fn, b.fn.inlinedBody()) == printed(before, before.body));
  for (BufferId id : b.fn.subroutines[0].parameters) // a float parameter for a keep mask
    b.fn.buffers[size_t(id)].keepMask = false;
  CHECK(verifyKernels(b.fn).find("does not match its parameter") != std::string::npos);
}
