// The microbatch loop in the kernel IR (Stmt::perMicrobatch, KernelFunction::microbatches) on
// small hand-built functions: the passes keep to the loop's bounds, liveness keeps what the loop
// shares with the rest of run() alive over the whole loop, and the verifier rejects a loop that
// is not one stretch. (The loop lowerToKernels forms from a plan is tested by
// cli.microbatches.kernel_ir, its results against the interpreter by e2e.train.microbatch.*.)
#include "codegen/EliminateCommonSubexpressions.h"
#include "codegen/FuseLoops.h"
#include "codegen/HoistInvariants.h"
#include "codegen/OutlineRepeatedCode.h"
#include "codegen/PlanBuffers.h"
#include "codegen/ScheduleCollectives.h"
#include "codegen/VerifyKernels.h"

#include <catch2/catch.hpp>
#include <llvm/ADT/STLExtras.h>

using namespace meshc;
using namespace meshc::kir;

namespace {

constexpr int64_t kPoints = 64;

struct Builder {
  KernelFunction fn;
  bool inLoop = false;

  Builder() {
    fn.name = "test";
    fn.microbatches = {4, "batch"};
  }
  BufferId buffer(Storage storage = Storage::Arena) {
    Buffer b;
    b.name = "b" + std::to_string(fn.buffers.size());
    b.elements = kPoints;
    b.storage = storage;
    if (storage == Storage::Input) b.index = 0;
    if (storage == Storage::Param) {
      b.index = int64_t(fn.params.size());
      fn.params.push_back(BufferId(fn.buffers.size()));
    }
    return fn.addBuffer(b);
  }
  void add(Stmt stmt) {
    stmt.perMicrobatch = inLoop;
    fn.body.push_back(std::move(stmt));
  }
  /// out[i] = op(reads[i]...), or the constant `value` when there are no reads.
  void loop(BufferId out, std::vector<BufferId> reads, ir::OpKind op = ir::OpKind::Add,
            double value = 0) {
    Loop loop;
    loop.dims = {"i"};
    loop.extents = {kPoints};
    std::vector<int> args;
    for (BufferId read : reads) {
      loop.reads.push_back(Access{read, {1}});
      args.push_back(int(loop.body.size()));
      loop.body.push_back(Scalar{.kind = Scalar::Kind::Load, .read = int(loop.reads.size() - 1)});
    }
    if (reads.empty())
      loop.body.push_back(Scalar{.kind = Scalar::Kind::Const, .value = value});
    else if (reads.size() == 1)
      loop.body.push_back(
          Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Neg, .args = args});
    else
      loop.body.push_back(Scalar{.kind = Scalar::Kind::Compute, .op = op, .args = args});
    loop.stores.push_back(Store{Access{out, {1}}, int(loop.body.size() - 1)});
    add(Stmt{.node = std::move(loop)});
  }
  void gemm(BufferId out, BufferId a, BufferId b) { // [8, 8] x [8, 8]
    Gemm g;
    g.dims = {"m", "k", "n"};
    g.sizes = {8, 8, 8};
    g.operands = {a, b};
    g.operandDims = {{0, 1}, {1, 2}};
    g.out = out;
    g.outDims = {0, 2};
    add(Stmt{.node = std::move(g)});
  }
  void allReduce(BufferId id) {
    add(Stmt{.node = Collective{
                 .kind = plan::CollectiveKind::AllReduceSum, .axes = {"data"}, .buffers = {id}}});
  }
  /// This microbatch's slice of `input` (the loop's index as a block index).
  void slice(BufferId out, BufferId input) {
    add(Stmt{.node = Call{.callee = Callee::SliceDim,
                          .args = {Arg{.kind = Arg::Kind::View, .buffer = out},
                                   Arg{.kind = Arg::Kind::View, .buffer = input},
                                   Arg{.kind = Arg::Kind::Ints, .ints = {4 * kPoints}},
                                   Arg{.kind = Arg::Kind::Int, .value = 0},
                                   Arg{.kind = Arg::Kind::BlockIndex, .names = {kMicrobatchAxis}},
                                   Arg{.kind = Arg::Kind::Int, .value = 4}},
                          .out = out,
                          .reads = {input}}});
  }
  bool share(BufferId a, BufferId b) const {
    const Buffer& x = fn.buffers[size_t(a)];
    const Buffer& y = fn.buffers[size_t(b)];
    int64_t bytes = kPoints * 4;
    return x.offset < y.offset + bytes && y.offset < x.offset + bytes;
  }
};

} // namespace

TEST_CASE("liveness keeps what the microbatch loop shares with the rest of run() over the loop") {
  Builder b;
  BufferId param = b.buffer(Storage::Param);
  BufferId before = b.buffer(), acc = b.buffer(), late = b.buffer(), grad = b.buffer(),
           next = b.buffer();
  b.loop(before, {param, param});      // 0: read by the loop's first statement only
  b.loop(acc, {}, ir::OpKind::Add, 0); // 1: the accumulator, zeroed
  b.inLoop = true;
  b.loop(grad, {before, param}); // 2
  b.loop(late, {grad, param});   // 3: after `before`'s last read, in flat order
  b.loop(acc, {acc, late});      // 4
  b.inLoop = false;
  b.loop(next, {acc, param}); // 5: the update reads the accumulator
  b.fn.updates.push_back({0, next, true});

  LiveRanges ranges = liveRanges(b.fn, b.fn.body);
  CHECK(ranges.first[size_t(before)] == 0);
  CHECK(ranges.last[size_t(before)] == 4); // read again by the next microbatch's statement 2
  CHECK(ranges.first[size_t(acc)] == 1);
  CHECK(ranges.last[size_t(acc)] == 5);  // the update reads it
  CHECK(ranges.last[size_t(next)] == 6); // a result: the caller reads it
  CHECK(ranges.first[size_t(late)] == 3);
  CHECK(ranges.last[size_t(late)] == 4); // the loop's own: one microbatch at a time

  planBuffers(b.fn);
  CHECK_FALSE(b.share(before, late)); // without the loop's bounds they could share bytes
  CHECK_FALSE(b.share(acc, grad));
  CHECK_FALSE(b.share(acc, late));
  CHECK(verifyKernels(b.fn).empty());
  // The verifier's own liveness agrees: placing `late` over `before` is caught.
  b.fn.buffers[size_t(late)].offset = b.fn.buffers[size_t(before)].offset;
  CHECK(verifyKernels(b.fn).find("alive together") != std::string::npos);
}

TEST_CASE("the verifier wants the microbatch loop as one stretch of run(), with microbatches") {
  Builder b;
  BufferId param = b.buffer(Storage::Param);
  BufferId x = b.buffer(), y = b.buffer(), z = b.buffer();
  b.inLoop = true;
  b.loop(x, {param, param});
  b.inLoop = false;
  b.loop(y, {x, param});
  b.inLoop = true;
  b.loop(z, {y, param});
  b.fn.outputs = {z};
  CHECK(verifyKernels(b.fn).find("between its statements") != std::string::npos);
  b.fn.body[1].perMicrobatch = true;
  CHECK(verifyKernels(b.fn).empty());
  b.fn.microbatches.count = 1;
  CHECK(verifyKernels(b.fn).find("1 microbatches, and 3 statements") != std::string::npos);
}

TEST_CASE("a collective started in the microbatch loop is waited for in it") {
  Builder b;
  BufferId param = b.buffer(Storage::Param);
  BufferId x = b.buffer(), y = b.buffer(), z = b.buffer(), w = b.buffer();
  b.inLoop = true;
  b.loop(x, {param, param});
  b.allReduce(x);
  b.loop(y, {param, param}); // overlaps the all-reduce
  b.loop(z, {y, param});
  b.inLoop = false;
  b.loop(w, {x, z}); // x's first reader is after the loop
  b.fn.outputs = {w};
  scheduleCollectives(b.fn);
  REQUIRE(b.fn.body.size() == 6);
  const auto* wait = std::get_if<Collective>(&b.fn.body[4].node);
  REQUIRE(wait);
  CHECK(wait->phase == Collective::Phase::Wait);
  CHECK(b.fn.body[4].perMicrobatch); // the loop's last statement, not the first after it
  CHECK(verifyKernels(b.fn).empty());
  // Waiting after the loop would leave K requests started and one waited for.
  std::swap(b.fn.body[4], b.fn.body[5]);
  b.fn.body[4].perMicrobatch = false;
  b.fn.body[5].perMicrobatch = false;
  CHECK(verifyKernels(b.fn).find("two sides of the microbatch loop") != std::string::npos);
}

TEST_CASE("fusion and common subexpressions keep to the microbatch loop's bounds") {
  Builder b;
  BufferId param = b.buffer(Storage::Param);
  BufferId x = b.buffer(), y = b.buffer(), z = b.buffer(), w = b.buffer();
  b.inLoop = true;
  b.loop(x, {param, param});
  b.loop(y, {x, param}); // fuses with x's loop: both in the loop
  b.inLoop = false;
  b.loop(z, {param, param}); // the same code as x's loop, after the loop
  b.loop(w, {y, z});
  b.fn.outputs = {w};
  eliminateCommonSubexpressions(b.fn);
  CHECK(b.fn.body.size() == 4); // z is not x: x changes per microbatch
  fuseLoops(b.fn);
  // y's loop took x's; w's loop took z's (same side), but not y's (across the bound).
  REQUIRE(b.fn.body.size() == 2);
  CHECK(b.fn.body[0].perMicrobatch);
  CHECK_FALSE(b.fn.body[1].perMicrobatch);
  const Loop& last = std::get<Loop>(b.fn.body[1].node);
  CHECK(llvm::any_of(last.reads, [&](const Access& read) { return read.buffer == y; }));
  CHECK(llvm::none_of(last.reads, [&](const Access& read) { return read.buffer == x; }));
  CHECK(verifyKernels(b.fn).empty());
}

TEST_CASE("a statement that reads the microbatch index is not pure: it is never hoisted") {
  // An iota along the microbatched dim reads nothing, but its positions move per microbatch.
  auto iota = [](BufferId out, Arg start) {
    return Stmt{.node = Call{.callee = Callee::Iota,
                             .args = {Arg{.kind = Arg::Kind::Data, .buffer = out},
                                      Arg{.kind = Arg::Kind::Ints, .ints = {kPoints}},
                                      Arg{.kind = Arg::Kind::Ints, .ints = {1}}, start},
                             .out = out}};
  };
  Builder b;
  BufferId input = b.buffer(Storage::Input);
  b.fn.buffers[size_t(input)].elements = 4 * kPoints;
  BufferId slice = b.buffer(), positions = b.buffer(), fixed = b.buffer(), y = b.buffer();
  b.inLoop = true;
  b.slice(slice, input);
  b.add(iota(positions, Arg{.kind = Arg::Kind::ShardStart,
                            .value = double(kPoints),
                            .names = {"data", kMicrobatchAxis}}));
  b.add(iota(fixed, Arg{.kind = Arg::Kind::Int, .value = 0}));
  b.loop(y, {slice, positions, fixed}, ir::OpKind::Where);
  b.fn.outputs = {y};
  CHECK_FALSE(isPure(b.fn.body[0]));
  CHECK_FALSE(isPure(b.fn.body[1]));
  CHECK(isPure(b.fn.body[2]));
  hoistInvariants(b.fn);
  REQUIRE(b.fn.init.size() == 1); // the iota from 0 only
  CHECK(std::get<Call>(b.fn.init[0].node).out == fixed);
  CHECK(b.fn.body.size() == 3);
  CHECK(verifyKernels(b.fn).empty());
}

TEST_CASE("outlining outlines repeats on one side of the microbatch loop's bounds") {
  // Two repetitions of a layer in the loop, one more after it: the loop's two become calls in
  // the loop, the one after is left alone (a call there is a statement of its own side).
  Builder b;
  BufferId w = b.buffer(Storage::Param);
  std::vector<BufferId> h = {b.buffer()};
  b.inLoop = true;
  b.loop(h[0], {w, w});
  auto layer = [&] {
    BufferId a = b.buffer(), c = b.buffer(), d = b.buffer(), e = b.buffer();
    b.fn.buffers[size_t(a)].elements = b.fn.buffers[size_t(c)].elements = 64;
    b.gemm(a, h.back(), w);
    b.loop(c, {a, w}, ir::OpKind::Mul);
    b.loop(d, {c, a}, ir::OpKind::Sub);
    b.loop(e, {d, c}, ir::OpKind::Add);
    h.push_back(e);
  };
  layer();
  layer();
  b.inLoop = false;
  layer();
  b.fn.outputs = {h.back()};
  REQUIRE(verifyKernels(b.fn).empty());
  planBuffers(b.fn);
  outlineRepeatedCode(b.fn);
  REQUIRE(verifyKernels(b.fn).empty());
  size_t inLoopCalls = 0, afterCalls = 0;
  for (const Stmt& stmt : b.fn.body)
    if (std::holds_alternative<Invoke>(stmt.node))
      ++(stmt.perMicrobatch ? inLoopCalls : afterCalls);
  CHECK(inLoopCalls == 2);
  CHECK(afterCalls == 0); // the same code after the loop is another class of statements
  CHECK(b.fn.subroutines.size() == 1);
  for (const Subroutine& sub : b.fn.subroutines)
    for (const Stmt& stmt : sub.body)
      CHECK_FALSE(stmt.perMicrobatch);
}
