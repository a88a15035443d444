// The cost model's measured refinements (issue 15, item 4; docs/planner.md, "Cost model"): a
// cache level for memory-bound ops, a fixed cost per GEMM call, and the synchronization each
// collective pays when thread ranks outnumber the cores; each against hand-computed numbers and
// through the lowering, and a description without them costing as before.
#include "CompiledSource.h"
#include "ir/OpTraits.h"
#include "planner/CostModel.h"
#include "planner/LayoutSearch.h"
#include "planner/LoopNests.h"
#include "planner/SpmdLowering.h"
#include "sema/Sema.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <string>

using namespace meshc;
using namespace meshc::plan;

namespace {

// 4 devices, 1 GFLOP/s, 1 GB/s memory, 10 GB/s for ops within 1 MB, 1 us alpha at 1 GB/s.
const char* kRefinedJson = R"({
  "name": "refined", "devices": 4, "peak_flops": 1e9, "memory_bandwidth": 1e9,
  "memory_bytes": 1e9, "cache_bytes": 1e6, "cache_bandwidth": 1e10,
  "gemm_latency_seconds": 5e-6, "oversubscribed_sync_seconds": 1e-4,
  "intra": {"name": "link", "alpha_seconds": 1e-6, "bandwidth": 1e9}
})";

Machine parsed(const char* json) {
  llvm::Expected<Machine> machine = parseMachine(json, "m.json");
  if (!machine) FAIL(llvm::toString(machine.takeError()));
  return *machine;
}

/// The same machine without the refinements.
Machine plain() {
  Machine m = parsed(kRefinedJson);
  m.cacheBytes = m.cacheBandwidth = m.gemmLatencySeconds = m.oversubscribedSyncSeconds = 0;
  return m;
}

Mesh meshOf(std::vector<std::pair<std::string, int64_t>> axes) {
  Mesh mesh;
  for (auto& [name, size] : axes)
    mesh.axes.push_back({name, size});
  return mesh;
}

Collective allReduce(int64_t bytes) {
  Collective c;
  c.kind = CollectiveKind::AllReduceSum;
  c.axes = {"x"};
  c.bytes = bytes;
  return c;
}

const char* kProgram = R"(
mesh m[x = 8]
dim batch = 8
dim d_model = 32
dim d_ff = 64
program mlp(x: f32[batch, d_model]) -> (y: f32[batch, d_model]) {
  param w_in: f32[d_model, d_ff] = normal()
  param w_out: f32[d_ff, d_model] = normal()
  y = x + einsum(relu(einsum(x, w_in -> batch, d_ff)), w_out -> batch, d_model)
}
)";

/// kProgram lowered on [x = ranks] with d_ff split over x (two einsums, one all-reduce).
struct Lowered {
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream errorStream{errors};
  DiagEngine diag{sources, errorStream};
  std::optional<ir::Module> module;
  std::optional<SpmdFunction> spmd;

  Lowered(int64_t ranks, const Machine& machine) {
    std::optional<SourceSet> set = loadSourcesFromBuffer(kProgram, "t.mesh", diag);
    REQUIRE(set);
    module = analyze(*set, diag);
    REQUIRE(module);
    Layout layout;
    layout.axes["d_ff"] = {"x"};
    spmd = lowerToSpmd(*module, *module->findFunction("mlp"), meshOf({{"x", ranks}}), layout,
                       machine, diag);
    REQUIRE(spmd);
  }

  std::vector<const SpmdOp*> ops(ir::OpKind kind) const {
    std::vector<const SpmdOp*> found;
    for (const SpmdOp& op : spmd->ops)
      if (op.kind == SpmdOp::Kind::Compute && op.computeKind == kind) found.push_back(&op);
    return found;
  }
  int communicating() const {
    int count = 0;
    for (const SpmdOp& op : spmd->ops)
      count +=
          op.kind == SpmdOp::Kind::Collective && op.collective.kind != CollectiveKind::LocalSlice;
    return count;
  }
  /// The collectives that resolve the partial sum: not the all-gather of sequence parallelism
  /// (SequenceParallel.h), which brings back the rows of an add it ran on the rank's rows.
  int resolving() const {
    int count = 0;
    for (const SpmdOp& op : spmd->ops)
      count += op.kind == SpmdOp::Kind::Collective &&
               (op.collective.kind == CollectiveKind::AllReduceSum ||
                op.collective.kind == CollectiveKind::ReduceScatter);
    return count;
  }
};

} // namespace

TEST_CASE("machines: the refinements are optional, read, and checked", "[machine]") {
  Machine m = parsed(kRefinedJson);
  CHECK(m.cacheBytes == Approx(1e6));
  CHECK(m.cacheBandwidth == Approx(1e10));
  CHECK(m.gemmLatencySeconds == Approx(5e-6));
  CHECK(m.oversubscribedSyncSeconds == Approx(1e-4));
  Machine h100 = *loadMachine("8xh100");
  CHECK(h100.cacheBytes == 0);
  CHECK(h100.gemmLatencySeconds == 0);
  CHECK(h100.oversubscribedSyncSeconds == 0);
  llvm::Expected<Machine> negative = parseMachine(
      R"({"name": "x", "devices": 2, "peak_flops": 1, "memory_bandwidth": 1, "memory_bytes": 1,
          "gemm_latency_seconds": -1, "intra": {"name": "l", "alpha_seconds": 0, "bandwidth": 1}})",
      "m.json");
  REQUIRE_FALSE(static_cast<bool>(negative));
  CHECK(llvm::toString(negative.takeError()) ==
        "m.json: field 'gemm_latency_seconds' must not be negative");
}

TEST_CASE("machines: the built-in cpu is calibrated and says how", "[machine]") {
  Machine cpu = *loadMachine("cpu");
  CHECK(cpu.description.find("meshc calibrate") != std::string::npos);
  CHECK(cpu.peakFlops > 1e9);
  CHECK(cpu.cacheBandwidth > cpu.memoryBandwidth);
  CHECK(cpu.cacheBytes > 0);
  CHECK(cpu.gemmLatencySeconds > 0);
  CHECK(cpu.oversubscribedSyncSeconds > 0);
}

TEST_CASE("cost model: ops that fit in the cache stream at its bandwidth", "[cost]") {
  Machine m = parsed(kRefinedJson);
  CHECK(streamBandwidth(m, 1e6) == Approx(1e10));
  CHECK(streamBandwidth(m, 1e6 + 1) == Approx(1e9));
  CHECK(computeSeconds(m, 10, 5e5, ir::DType::F32) == Approx(5e-5));  // 0.5 MB at 10 GB/s
  CHECK(computeSeconds(m, 10, 2e6, ir::DType::F32) == Approx(2e-3));  // 2 MB at 1 GB/s
  CHECK(computeSeconds(m, 1e6, 5e5, ir::DType::F32) == Approx(1e-3)); // FLOP-bound
  // Never faster with more bytes (the search's lower bounds need it): the jump is upwards.
  CHECK(computeSeconds(m, 0, 1e6, ir::DType::F32) < computeSeconds(m, 0, 1e6 + 1, ir::DType::F32));
  // A "cache" slower than memory is ignored.
  Machine slow = m;
  slow.cacheBandwidth = 1e8;
  CHECK(streamBandwidth(slow, 10) == Approx(1e9));
  CHECK(computeSeconds(plain(), 10, 5e5, ir::DType::F32) == Approx(5e-4));
}

TEST_CASE("cost model: a GEMM pays the machine's fixed cost per call", "[cost]") {
  Machine m = parsed(kRefinedJson);
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32) == Approx(2e-6 + 5e-6));
  CHECK(gemmSeconds(plain(), 2e3, 100, ir::DType::F32) == Approx(2e-6));
}

TEST_CASE("cost model: oversubscribed ranks pay a sync per collective", "[cost]") {
  Machine m = parsed(kRefinedJson); // 4 devices
  Mesh fits = meshOf({{"x", 4}}), over = meshOf({{"x", 8}});
  CHECK(oversubscription(m, fits) == 1);
  CHECK(oversubscription(m, over) == 2);
  CHECK(oversubscribedSyncSeconds(m, fits, {"x"}) == 0);
  CHECK(oversubscribedSyncSeconds(m, over, {"x"}) == Approx(1e-4));
  // 2a + 2 (p-1)/p n b, plus the sync only when oversubscribed.
  CHECK(collectiveSeconds(m, fits, allReduce(4000)) == Approx(2e-6 + 2 * 0.75 * 4e-6));
  CHECK(collectiveSeconds(m, over, allReduce(4000)) == Approx(1e-4 + 2e-6 + 2 * 0.875 * 4e-6));
  // Merged all-reduces are one collective: one sync, as one alpha.
  CHECK(mergeableLatencySeconds(m, over, allReduce(4000)) == Approx(1e-4 + 2e-6));
  CHECK(mergeableLatencySeconds(m, fits, allReduce(4000)) == Approx(2e-6));
  Collective slice;
  slice.kind = CollectiveKind::LocalSlice;
  slice.axes = {"x"};
  slice.bytes = 4000;
  CHECK(collectiveSeconds(m, over, slice) == 0);
}

// A 2-core CPU machine (cores recorded, as meshc calibrate writes it): 1 GFLOP/s, 1 GB/s, no
// cache level, 1 us alpha at 1 GB/s, an oversubscribed collective syncing 100 us.
const char* kTwoCoresJson = R"({
  "name": "two-cores", "devices": 2, "cores": 2, "peak_flops": 1e9, "memory_bandwidth": 1e9,
  "memory_bytes": 1e9, "oversubscribed_sync_seconds": 1e-4,
  "intra": {"name": "threads", "alpha_seconds": 1e-6, "bandwidth": 1e9}
})";

TEST_CASE("cost model: ranks beyond the cores take turns on them", "[cost]") {
  Machine m = parsed(kTwoCoresJson);
  REQUIRE(m.cores == 2);
  // ceil(ranks / cores): meshrt gives the cores consecutive blocks of ranks (rankCores).
  CHECK(oversubscription(m, meshOf({{"x", 1}})) == 1);
  CHECK(oversubscription(m, meshOf({{"x", 2}})) == 1);
  CHECK(oversubscription(m, meshOf({{"x", 3}})) == 2);
  Mesh twoByTwo = meshOf({{"x", 2}, {"y", 2}}), twoByFour = meshOf({{"x", 2}, {"y", 4}});
  CHECK(oversubscription(m, twoByTwo) == 2);
  CHECK(oversubscription(m, twoByFour) == 4);
  // The sync is the same at 2 and 4 ranks per core, nothing without oversubscription.
  CHECK(oversubscribedSyncSeconds(m, meshOf({{"x", 2}}), {"x"}) == 0);
  CHECK(oversubscribedSyncSeconds(m, twoByTwo, {"x", "y"}) == Approx(1e-4));
  CHECK(oversubscribedSyncSeconds(m, twoByFour, {"x", "y"}) == Approx(1e-4));
  // An all-reduce of 4000 B over y: the ranks' threads move the bytes, so b is taken k times.
  Collective overY = allReduce(4000);
  overY.axes = {"y"};
  CHECK(collectiveSeconds(m, meshOf({{"x", 2}}), allReduce(4000)) == Approx(2e-6 + 2 * 0.5 * 4e-6));
  CHECK(collectiveSeconds(m, twoByTwo, overY) == Approx(1e-4 + 2e-6 + 2 * 0.5 * 4e-6 * 2));
  CHECK(collectiveSeconds(m, twoByFour, overY) == Approx(1e-4 + 2e-6 + 2 * 0.75 * 4e-6 * 4));
  CHECK(mergeableLatencySeconds(m, twoByFour, overY) == Approx(1e-4 + 2e-6));
  // Without cores (a GPU description: one rank per device) the devices are shared as before
  // and the link's bandwidth is not divided.
  Machine devicesOnly = m;
  devicesOnly.cores = 0;
  CHECK(oversubscription(devicesOnly, meshOf({{"x", 3}})) == Approx(1.5));
  CHECK(collectiveSeconds(devicesOnly, twoByFour, overY) == Approx(1e-4 + 2e-6 + 2 * 0.75 * 4e-6));
  Machine h100 = *loadMachine("8xh100");
  CHECK(h100.cores == 0);
  CHECK(oversubscription(h100, meshOf({{"x", 2}, {"y", 4}})) == 1);
  // The built-in cpu records its cores.
  CHECK(loadMachine("cpu")->cores == 2);
  llvm::Expected<Machine> zero = parseMachine(
      R"({"name": "x", "devices": 2, "cores": 0, "peak_flops": 1, "memory_bandwidth": 1,
          "memory_bytes": 1, "intra": {"name": "l", "alpha_seconds": 0, "bandwidth": 1}})",
      "m.json");
  REQUIRE_FALSE(static_cast<bool>(zero));
  CHECK(llvm::toString(zero.takeError()) == "m.json: field 'cores' must be a positive integer");
}

TEST_CASE("cost model: a group on one core pays the shared-core sync", "[cost]") {
  // Ranks 0-1 | 2-3 on the cores of [x = 2, y = 2]; 0-3 | 4-7 on those of [x = 2, y = 4].
  Machine m = parsed(kTwoCoresJson);
  CHECK(m.sharedCoreSyncSeconds == Approx(1e-4)); // absent: as every collective before
  m.sharedCoreSyncSeconds = 5e-6;
  Mesh twoByTwo = meshOf({{"x", 2}, {"y", 2}}), twoByFour = meshOf({{"x", 2}, {"y", 4}});
  CHECK(oversubscribedSyncSeconds(m, twoByTwo, {"y"}) == Approx(5e-6));
  CHECK(oversubscribedSyncSeconds(m, twoByFour, {"y"}) == Approx(5e-6));
  CHECK(oversubscribedSyncSeconds(m, twoByTwo, {"x"}) == Approx(1e-4)); // ranks 0 and 2
  CHECK(oversubscribedSyncSeconds(m, twoByFour, {"x", "y"}) == Approx(1e-4));
  CHECK(oversubscribedSyncSeconds(m, meshOf({{"x", 2}}), {"x"}) == 0); // a core each
  Collective overY = allReduce(4000);
  overY.axes = {"y"};
  CHECK(collectiveSeconds(m, twoByTwo, overY) == Approx(5e-6 + 2e-6 + 2 * 0.5 * 4e-6 * 2));
  CHECK(mergeableLatencySeconds(m, twoByFour, overY) == Approx(5e-6 + 2e-6));
  // Pipeline stages (meshCopies) are consecutive blocks of ranks: two [y = 2] stages are ranks
  // 0-1 (core 0) and 2-3 (core 1); of three, the second is ranks 2 (core 0) and 3 (core 1).
  m.meshCopies = 2;
  CHECK(oversubscribedSyncSeconds(m, meshOf({{"y", 2}}), {"y"}) == Approx(5e-6));
  m.meshCopies = 3;
  CHECK(oversubscribedSyncSeconds(m, meshOf({{"y", 2}}), {"y"}) == Approx(1e-4));
  m.meshCopies = 1;
  // [y = 3] on 2 cores: ranks 0-1 on core 0, rank 2 on core 1.
  CHECK(oversubscribedSyncSeconds(m, meshOf({{"y", 3}}), {"y"}) == Approx(1e-4));
  // GPU descriptions (no cores) keep one sync for every collective.
  Machine devicesOnly = m;
  devicesOnly.cores = 0;
  CHECK(oversubscribedSyncSeconds(devicesOnly, twoByFour, {"y"}) == Approx(1e-4));
  Machine read = parsed(R"({
    "name": "two-cores", "devices": 2, "cores": 2, "peak_flops": 1e9, "memory_bandwidth": 1e9,
    "memory_bytes": 1e9, "oversubscribed_sync_seconds": 1e-4, "shared_core_sync_seconds": 3e-6,
    "intra": {"name": "threads", "alpha_seconds": 1e-6, "bandwidth": 1e9}})");
  CHECK(read.sharedCoreSyncSeconds == Approx(3e-6));
  CHECK(read.oversubscribedSyncRankSeconds == 0); // absent: the same sync at any ranks per core
}

TEST_CASE("cost model: the sync grows with the ranks a core holds", "[cost]") {
  Machine m = parsed(R"({
    "name": "two-cores", "devices": 2, "cores": 2, "peak_flops": 1e9, "memory_bandwidth": 1e9,
    "memory_bytes": 1e9, "oversubscribed_sync_seconds": 4e-5, "shared_core_sync_seconds": 8e-6,
    "oversubscribed_sync_rank_seconds": 1e-5,
    "intra": {"name": "threads", "alpha_seconds": 1e-6, "bandwidth": 1e9}})");
  CHECK(m.oversubscribedSyncRankSeconds == Approx(1e-5));
  // 2 ranks per core: the calibrated figures as they are.
  Mesh twoByTwo = meshOf({{"x", 2}, {"y", 2}});
  CHECK(oversubscribedSyncSeconds(m, twoByTwo, {"y"}) == Approx(8e-6));
  CHECK(oversubscribedSyncSeconds(m, twoByTwo, {"x"}) == Approx(4e-5));
  // 4 per core ([2, 4]: ranks 0-3 | 4-7): two ranks more to hand the core to at each barrier.
  Mesh twoByFour = meshOf({{"x", 2}, {"y", 4}});
  CHECK(oversubscribedSyncSeconds(m, twoByFour, {"y"}) == Approx(8e-6 + 2e-5));
  CHECK(oversubscribedSyncSeconds(m, twoByFour, {"x"}) == Approx(4e-5 + 2e-5));
  Collective overY = allReduce(4000);
  overY.axes = {"y"};
  CHECK(collectiveSeconds(m, twoByFour, overY) == Approx(8e-6 + 2e-5 + 2e-6 + 2 * 0.75 * 4e-6 * 4));
  CHECK(mergeableLatencySeconds(m, twoByFour, overY) == Approx(8e-6 + 2e-5 + 2e-6));
  // [y = 3] on 2 cores holds 2 ranks on core 0: no more than 2 per core.
  CHECK(oversubscribedSyncSeconds(m, meshOf({{"y", 3}}), {"y"}) == Approx(4e-5));
  // One rank per core: no sync at all.
  CHECK(oversubscribedSyncSeconds(m, meshOf({{"y", 2}}), {"y"}) == 0);
  // A GPU description (no cores) scales by ranks / devices as well.
  Machine devicesOnly = m;
  devicesOnly.cores = 0;
  CHECK(oversubscribedSyncSeconds(devicesOnly, twoByFour, {"y"}) == Approx(4e-5 + 2e-5));
}

TEST_CASE("lowering: 8 ranks on 2 cores, exact compute and collective seconds",
          "[cost][lowering]") {
  Lowered lowered(8, parsed(kTwoCoresJson));
  // relu on its [batch = 8, d_ff = 64 / 8] shard: 64 FLOPs against 2 x 256 B at 1 GB/s, 4 ranks
  // per core.
  std::vector<const SpmdOp*> relu = lowered.ops(ir::OpKind::Relu);
  REQUIRE(relu.size() == 1);
  CHECK(relu[0]->seconds == Approx(4 * 512e-9));
  // The second einsum's partial sum: one all-reduce of [batch, d_model] f32 (1024 B) over 8
  // ranks: the sync (100 us), 2a, and 2 (7/8) n b four times (4 ranks per core).
  REQUIRE(lowered.communicating() == 1);
  CHECK(lowered.spmd->summary.communicationSeconds ==
        Approx(1e-4 + 2e-6 + 2 * 0.875 * 1024e-9 * 4));
}

TEST_CASE("lowering: GEMMs, oversubscribed compute and collectives as the model says",
          "[cost][lowering]") {
  Machine refined = parsed(kRefinedJson);
  for (int64_t ranks : {4, 8}) {
    CAPTURE(ranks);
    Lowered with(ranks, refined), without(ranks, plain());
    double factor = ranks > 4 ? 2 : 1;
    // Each einsum costs its roofline times the oversubscription, plus the GEMM latency (also
    // times the oversubscription: the ranks take turns); elementwise ops pay none.
    std::vector<const SpmdOp*> gemms = with.ops(ir::OpKind::Einsum);
    std::vector<const SpmdOp*> plainGemms = without.ops(ir::OpKind::Einsum);
    REQUIRE(gemms.size() == 2);
    REQUIRE(plainGemms.size() == 2);
    for (size_t i = 0; i < gemms.size(); ++i)
      CHECK(gemms[i]->seconds == Approx(plainGemms[i]->seconds + factor * 5e-6));
    // The ops here touch under 1 MB: they stream from the cache, 10x faster than memory, until
    // the FLOPs bind (relu: one per element of its [batch, d_ff / ranks] result).
    std::vector<const SpmdOp*> relu = with.ops(ir::OpKind::Relu);
    std::vector<const SpmdOp*> plainRelu = without.ops(ir::OpKind::Relu);
    REQUIRE(relu.size() == 1);
    REQUIRE(plainRelu.size() == 1);
    double elements = 8.0 * 64 / static_cast<double>(ranks);
    CHECK(plainRelu[0]->seconds == Approx(factor * 2 * 4 * elements / 1e9)); // in and out at 1 GB/s
    CHECK(relu[0]->seconds == Approx(factor * std::max(elements / 1e9, 2 * 4 * elements / 1e10)));
    // One collective resolves the second einsum's partial sum; the sync only on 8 ranks. Without
    // a sync a reduce-scatter and an all-gather cost what the all-reduce costs, and the add
    // `x + ...` on a share of the rows decides for them (sequence parallelism); the sync of
    // 8 ranks, paid once more, decides against them. Either way the bytes and alphas are equal.
    REQUIRE(with.resolving() == 1);
    CHECK(with.communicating() == (ranks > 4 ? 1 : 2));
    CHECK(without.communicating() == 2);
    CHECK(with.spmd->summary.communicationSeconds ==
          Approx(without.spmd->summary.communicationSeconds + (ranks > 4 ? 1e-4 : 0)));
  }
}

// Loops and kernels (docs/planner.md, "Loops and kernels"): fused loop nests priced once by
// their memory traffic and vector-rate FLOPs, transcendental elements at their measured cost, a
// fixed cost per nest and per kernel call, and the row-wise kernels at their rate per element.

namespace {

// kRefinedJson plus GEMMs at half the peak when their smallest dim is 16, and loops: 1e8 simple
// FLOP/s, exp & co. 20 FLOPs each, a dropout element 50, 1 us per nest or call, softmax 10 ns,
// layer_norm 20 ns and reductions 2 ns per operand element.
const char* kLoopsJson = R"({
  "name": "loops", "devices": 4, "peak_flops": 1e9, "memory_bandwidth": 1e9,
  "memory_bytes": 1e9, "cache_bytes": 1e6, "cache_bandwidth": 1e10,
  "gemm_latency_seconds": 5e-6, "oversubscribed_sync_seconds": 1e-4,
  "gemm_shape_dim": 16,
  "vector_flops": 1e8, "transcendental_flops": 20, "random_flops": 50,
  "loop_latency_seconds": 1e-6,
  "softmax_element_seconds": 1e-8, "layer_norm_element_seconds": 2e-8,
  "reduce_element_seconds": 2e-9,
  "intra": {"name": "link", "alpha_seconds": 1e-6, "bandwidth": 1e9}
})";

/// `source` analyzed (one module; REQUIREs success), with the accessors these tests use.
struct Analyzed : testing::CompiledSource {
  explicit Analyzed(const char* source) : CompiledSource(llvm::StringRef(source)) {
    INFO(errors);
    REQUIRE(module);
  }
  const ir::Function& fn(const char* name) const { return *module->findFunction(name); }
  /// The op that defines the value named `name`.
  uint32_t opNamed(const char* function, const std::string& name) const {
    const ir::Function& f = fn(function);
    for (uint32_t i = 0; i < f.ops.size(); ++i)
      if (f.values[f.ops[i].result].name == name) return i;
    FAIL("no value named " << name);
    return 0;
  }
};

/// The seconds of `function`'s einsums lowered on [a=1, b=1] with `machine`, in op order.
std::vector<double> einsumSeconds(Analyzed& program, const char* function, const Machine& machine) {
  std::optional<SpmdFunction> spmd =
      lowerToSpmd(*program.module, program.fn(function), meshOf({{"a", 1}, {"b", 1}}), Layout{},
                  machine, program.diag);
  REQUIRE(spmd);
  std::vector<double> einsums;
  for (const SpmdOp& op : spmd->ops)
    if (op.kind == SpmdOp::Kind::Compute && op.computeKind == ir::OpKind::Einsum)
      einsums.push_back(op.seconds);
  return einsums;
}

/// The search over `dims` on [a=2, b=2] finds brute force's cost: its lower bound stays a bound.
void checkSearchIsExact(Analyzed& program, const char* function, const Machine& machine,
                        const std::vector<std::string>& dims) {
  const ir::Function& fn = program.fn(function);
  Mesh mesh = meshOf({{"a", 2}, {"b", 2}});
  SearchResult oracle = bruteForceLayout(*program.module, fn, mesh, machine, Layout{}, dims, {});
  std::optional<SearchResult> found =
      searchLayout(*program.module, fn, mesh, machine, Layout{}, dims, {}, program.diag);
  REQUIRE(found);
  CHECK(found->exact);
  CHECK(found->stepSeconds == Approx(oracle.stepSeconds).epsilon(1e-9));
}

// a = x * s (same dims as its reader b: fused, not stored); b = exp(a) read twice (stored, and
// fused into c, its first reader); c = b + bias (bias [d] broadcast: a param, read from memory);
// the einsum reads b from memory; e = relu(einsum) is read by the output only.
const char* kChainProgram = R"(
mesh m[x = 1]
dim n = 64
dim d = 32
program chain(x: f32[n, d]) -> (y: f32[n, d], z: f32[n]) {
  param bias: f32[d] = zeros()
  let a = x * 2.0
  let b = exp(a)
  let c = b + bias
  y = softmax(c, d)
  z = relu(einsum(b, x -> n))
}
)";

} // namespace

TEST_CASE("machines: the loop and kernel rates are optional and read", "[machine]") {
  Machine m = parsed(kLoopsJson);
  CHECK(m.vectorFlops == Approx(1e8));
  CHECK(m.transcendentalFlops == Approx(20));
  CHECK(m.randomFlops == Approx(50));
  CHECK(m.loopLatencySeconds == Approx(1e-6));
  CHECK(m.softmaxElementSeconds == Approx(1e-8));
  CHECK(m.layerNormElementSeconds == Approx(2e-8));
  CHECK(m.reduceElementSeconds == Approx(2e-9));
  CHECK(modelsLoops(m));
  CHECK_FALSE(modelsLoops(parsed(kRefinedJson)));
  CHECK_FALSE(modelsLoops(*loadMachine("8xh100")));
  Machine cpu = *loadMachine("cpu");
  CHECK(modelsLoops(cpu));
  CHECK(cpu.transcendentalFlops > 1);
  CHECK(cpu.loopLatencySeconds > 0);
  CHECK(cpu.softmaxElementSeconds > 0);
  CHECK(cpu.layerNormElementSeconds > 0);
  CHECK(cpu.reduceElementSeconds > 0);
}

TEST_CASE("cost model: a loop nest's share is its FLOPs at the vector rate or its bytes",
          "[cost]") {
  Machine m = parsed(kLoopsJson);
  // 1000 simple FLOPs at 1e8: 10 us, against 4 KB from the cache at 10 GB/s: 0.4 us.
  CHECK(loopShareSeconds(m, 1000, 0, 4000, false) == Approx(1e-5));
  // The nest's own loop pays its fixed cost.
  CHECK(loopShareSeconds(m, 1000, 0, 4000, true) == Approx(1e-5 + 1e-6));
  // 100 exp elements: 100 x 20 FLOPs, plus the 100 simple ones given.
  CHECK(loopShareSeconds(m, 100, 100, 400, false) == Approx((100 + 2000) / 1e8));
  // Memory-bound: 4 MB (past the cache) at 1 GB/s.
  CHECK(loopShareSeconds(m, 1000, 0, 4e6, false) == Approx(4e-3));
  // A kernel call: the same roofline and its fixed cost.
  CHECK(kernelCallSeconds(m, 1000, 4000) == Approx(1e-5 + 1e-6));
}

TEST_CASE("cost model: a GEMM's efficiency by its smallest dim", "[cost]") {
  Machine m = parsed(kLoopsJson);
  // 2000 FLOPs at 1 GFLOP/s: 2 us at full efficiency, twice that when the smallest dim is 16,
  // 1 + 16/64 times when it is 64; plus the call.
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32, 16) == Approx(4e-6 + 5e-6));
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32, 64) == Approx(2.5e-6 + 5e-6));
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32) == Approx(2e-6 + 5e-6)); // shape unknown
  CHECK(gemmSeconds(parsed(kRefinedJson), 2e3, 100, ir::DType::F32, 16) == Approx(2e-6 + 5e-6));
  CHECK(m.gemmShapeDim == Approx(16));
}

TEST_CASE("cost model: a batched GEMM pays the machine's cost per matrix", "[cost]") {
  Machine m = parsed(kLoopsJson);
  CHECK(m.gemmBatchSeconds == 0); // absent: batches cost as before
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32, 64, 16) == Approx(2.5e-6 + 5e-6));
  m.gemmBatchSeconds = 1e-6;
  // 16 matrices of smallest dim 64 (2000 FLOPs in all): the FLOPs at 1 / (1 + 16/64) of the
  // peak, one call, and 15 matrices after the first at 1 us each.
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32, 64, 16) == Approx(2.5e-6 + 5e-6 + 15e-6));
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32, 64, 1) == Approx(2.5e-6 + 5e-6));
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32, 64) == Approx(2.5e-6 + 5e-6));
  // A batch of outer products, GEMVs or dot products (a dim of 1) runs as meshrt's loops.
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32, 1, 16) == Approx(2e-6 * 17 + 5e-6));
  // Within the runtime's small GEMM loops (62.5 multiply-adds a matrix here): no library call,
  // every matrix pays the cost; past their limit, the library again.
  CHECK(m.smallGemmTerms == 0);
  m.smallGemmTerms = 1000;
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32, 64, 16) == Approx(2.5e-6 + 16e-6));
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32, 64, 1) == Approx(2.5e-6 + 5e-6));
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32, 1, 16) == Approx(2e-6 * 17 + 5e-6));
  m.smallGemmTerms = 62;
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32, 64, 16) == Approx(2.5e-6 + 5e-6 + 15e-6));
  Machine read = parsed(R"({
    "name": "b", "devices": 1, "peak_flops": 1e9, "memory_bandwidth": 1e9, "memory_bytes": 1e9,
    "gemm_batch_seconds": 4e-7, "small_gemm_terms": 65536,
    "intra": {"name": "l", "alpha_seconds": 0, "bandwidth": 1}
  })");
  CHECK(read.gemmBatchSeconds == Approx(4e-7));
  CHECK(read.smallGemmTerms == 65536);
}

TEST_CASE("lowering: attention's batched GEMMs pay per local matrix", "[cost][lowering]") {
  // Scores over [batch, heads]: 4 x 2 matrices of 8 x 8 x 4, split over `a` by batch.
  Analyzed program(R"(
mesh m[a = 2]
dim batch = 4
dim heads = 2
dim q = 8
dim k = 8
dim e = 4
program scores(x: f32[batch, q, heads, e], y: f32[batch, k, heads, e]) -> (s: f32[batch, heads, q, k]) {
  s = einsum(x, y -> batch, heads, q, k)
}
)");
  const ir::Function& fn = program.fn("scores");
  Machine m = parsed(kLoopsJson);
  auto einsumOn = [&](const Machine& machine, int64_t ranks) {
    Layout layout;
    layout.axes["batch"] = {"a"};
    std::optional<SpmdFunction> spmd =
        lowerToSpmd(*program.module, fn, meshOf({{"a", ranks}}), layout, machine, program.diag);
    REQUIRE(spmd);
    for (const SpmdOp& op : spmd->ops)
      if (op.kind == SpmdOp::Kind::Compute && op.computeKind == ir::OpKind::Einsum)
        return op.seconds;
    FAIL("no einsum");
    return 0.0;
  };
  Machine batched = m;
  batched.gemmBatchSeconds = 1e-6;
  // One rank: 8 matrices (7 after the first); two ranks: 4 each (3).
  CHECK(einsumOn(batched, 1) == Approx(einsumOn(m, 1) + 7e-6));
  CHECK(einsumOn(batched, 2) == Approx(einsumOn(m, 2) + 3e-6));
  // In the runtime's small GEMM loops (8 x 8 x 4 = 256 multiply-adds a matrix): every matrix
  // pays, no call's latency (5 us).
  Machine loops = batched;
  loops.smallGemmTerms = 256;
  CHECK(einsumOn(loops, 1) == Approx(einsumOn(m, 1) + 8e-6 - 5e-6));
  CHECK(einsumOn(loops, 2) == Approx(einsumOn(m, 2) + 4e-6 - 5e-6));
  // The search's lower bound stays a bound.
  std::vector<std::string> dims = {"batch", "heads", "q", "k", "e"};
  Mesh mesh = meshOf({{"a", 2}});
  SearchResult oracle = bruteForceLayout(*program.module, fn, mesh, batched, Layout{}, dims, {});
  std::optional<SearchResult> found =
      searchLayout(*program.module, fn, mesh, batched, Layout{}, dims, {}, program.diag);
  REQUIRE(found);
  CHECK(found->exact);
  CHECK(found->stepSeconds == Approx(oracle.stepSeconds).epsilon(1e-9));
}

TEST_CASE("cost model: a bf16 GEMM on a CPU without a bf16 rate runs in f32, then rounds",
          "[cost]") {
  Machine m = parsed(kLoopsJson);
  // The C++ target's f32 GEMM: 2000 FLOPs (1 + 16/64 for its shape) at the f32 rate and the
  // call, then the pass rounding its result to the dtype over the 100 bytes (cached, 10 GB/s)
  // closing its own loop.
  double f32Gemm = 2.5e-6 + 5e-6;
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::BF16, 64) == Approx(f32Gemm + 100 / 1e10 + 1e-6));
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F16, 64) == Approx(f32Gemm + 100 / 1e10 + 1e-6));
  CHECK(gemmSeconds(m, 2e3, 100, ir::DType::F32, 64) == Approx(f32Gemm));
  // A machine with a bf16 rate (a GPU's tensor cores) runs it at that rate, unrounded after.
  Machine tensorCores = m;
  tensorCores.peakFlopsBf16 = 4e9;
  CHECK(gemmSeconds(tensorCores, 2e3, 100, ir::DType::BF16, 64) == Approx(2.5e-6 / 4 + 5e-6));
  // Without loop rates (a roofline machine) the dtype changes nothing.
  CHECK(gemmSeconds(parsed(kRefinedJson), 2e3, 100, ir::DType::BF16, 16) == Approx(2e-6 + 5e-6));
}

TEST_CASE("cost model: row-wise kernels run at their measured rate per element", "[cost]") {
  Machine m = parsed(kLoopsJson);
  // 1000 elements: softmax 10 us, layer_norm 20 us, a reduction 2 us; plus the call.
  CHECK(rowKernelSeconds(m, RowKernel::Softmax, 1000, 8000) == Approx(1e-5 + 1e-6));
  CHECK(rowKernelSeconds(m, RowKernel::LayerNorm, 1000, 8000) == Approx(2e-5 + 1e-6));
  CHECK(rowKernelSeconds(m, RowKernel::Reduce, 1000, 4004) == Approx(2e-6 + 1e-6));
  // Never faster than their bytes: 8 MB at 1 GB/s.
  CHECK(rowKernelSeconds(m, RowKernel::Reduce, 1000, 8e6) == Approx(8e-3 + 1e-6));
}

TEST_CASE("loop nests: which ops fuse, which results are stored", "[cost][loops]") {
  Analyzed program(kChainProgram);
  const ir::Function& fn = program.fn("chain");
  std::vector<LoopRole> roles = loopRoles(fn);
  const LoopRole& a = roles[program.opNamed("chain", "a")];
  const LoopRole& b = roles[program.opNamed("chain", "b")];
  const LoopRole& c = roles[program.opNamed("chain", "c")];
  CHECK(a.loop);
  CHECK(a.fused); // into b: same dims, b its only reader
  CHECK_FALSE(a.stored);
  CHECK(b.inRegister == 1u); // operand 0 (a) computed in b's nest
  CHECK(b.fused);            // into c, its first reader
  CHECK(b.stored);           // the einsum reads it too
  CHECK(c.inRegister == 1u); // b; bias (operand 1) is a param, read
  CHECK(c.closesNest());     // softmax is a kernel, not a loop: c's nest ends here
  CHECK(c.stored);
  // Ops that are not loops never fuse.
  for (uint32_t i = 0; i < fn.ops.size(); ++i)
    if (fn.ops[i].kind == ir::OpKind::Einsum || fn.ops[i].kind == ir::OpKind::Softmax) {
      CHECK_FALSE(roles[i].loop);
      CHECK_FALSE(roles[i].fused);
    }
}

TEST_CASE("loop nests: a broadcast producer fuses only when cheap and read once", "[cost][loops]") {
  Analyzed program(R"(
mesh m[x = 1]
dim n = 16
dim d = 8
program p(v: f32[d], w: f32[d], x: f32[n, d]) -> (y: f32[n, d], z: f32[n, d]) {
  let cheap = v * 2.0
  let dear = exp(w)
  y = x + cheap
  z = x * dear
}
)");
  std::vector<LoopRole> roles = loopRoles(program.fn("p"));
  CHECK(roles[program.opNamed("p", "cheap")].fused); // recomputed per point of y
  CHECK_FALSE(roles[program.opNamed("p", "cheap")].stored);
  CHECK_FALSE(roles[program.opNamed("p", "dear")].fused); // exp per point would cost n times
  CHECK(roles[program.opNamed("p", "dear")].stored);
  CHECK(roles[program.opNamed("p", "dear")].closesNest());
}

TEST_CASE("lowering: a fused chain is charged once, kernels at their rates", "[cost][lowering]") {
  Analyzed program(kChainProgram);
  Machine m = parsed(kLoopsJson);
  Layout layout;
  std::optional<SpmdFunction> spmd = lowerToSpmd(*program.module, program.fn("chain"),
                                                 meshOf({{"x", 1}}), layout, m, program.diag);
  REQUIRE(spmd);
  auto secondsOf = [&](ir::OpKind kind) {
    for (const SpmdOp& op : spmd->ops)
      if (op.kind == SpmdOp::Kind::Compute && op.computeKind == kind) return op.seconds;
    FAIL("no op of that kind");
    return 0.0;
  };
  const double elements = 64 * 32, bytes = 4 * elements; // one [n, d] f32 tensor: 8 KiB
  // a = x * 2: reads x, its result stays in the nest; 1 FLOP per element.
  CHECK(secondsOf(ir::OpKind::Mul) == Approx(std::max(elements / 1e8, bytes / 1e10)));
  // b = exp(a): reads nothing from memory, stores b (the einsum reads it); one exp per element.
  CHECK(secondsOf(ir::OpKind::Exp) == Approx(std::max(21 * elements / 1e8, bytes / 1e10)));
  // c = b + bias: reads bias (32 floats), stores c; closes the nest: pays its fixed cost.
  CHECK(secondsOf(ir::OpKind::Add) ==
        Approx(std::max(elements / 1e8, (bytes + 4 * 32) / 1e10) + 1e-6));
  // softmax: 10 ns per operand element, plus the call.
  CHECK(secondsOf(ir::OpKind::Softmax) == Approx(elements * 1e-8 + 1e-6));
  // The einsum b[n, d] . x[n, d] -> [n]: n is a batch dim, d the contraction (k = 32), m = n =
  // 1: its 2 x 64 x 32 FLOPs at 1 / (1 + 16 / 1) of the peak, plus the call.
  CHECK(secondsOf(ir::OpKind::Einsum) == Approx(2 * 64 * 32 / 1e9 * 17 + 5e-6));
  // relu of the [n] einsum: its own nest, reading and writing 64 floats.
  CHECK(secondsOf(ir::OpKind::Relu) == Approx(std::max(64 / 1e8, 2 * 4 * 64 / 1e10) + 1e-6));
  // Without the loop rates the same ops cost their rooflines, each reading and writing.
  std::optional<SpmdFunction> old =
      lowerToSpmd(*program.module, program.fn("chain"), meshOf({{"x", 1}}), layout,
                  parsed(kRefinedJson), program.diag);
  REQUIRE(old);
  for (const SpmdOp& op : old->ops)
    if (op.kind == SpmdOp::Kind::Compute && op.computeKind == ir::OpKind::Mul)
      CHECK(op.seconds == Approx(std::max(elements / 1e9, 2 * bytes / 1e10)));
}

TEST_CASE("lowering: a bf16 loop pays the rounding of every result", "[cost][lowering]") {
  // kChainProgram's first two ops in bf16: computed in f32 and each result rounded to bf16
  // (support::roundBF16: 8 vector instructions an element) in the same fused nest.
  Analyzed program(R"(
mesh m[x = 1]
dim n = 64
dim d = 32
program chain(x: bf16[n, d]) -> (y: bf16[n, d]) {
  let a = x * 2.0
  y = exp(a)
}
)");
  Machine m = parsed(kLoopsJson);
  std::optional<SpmdFunction> spmd = lowerToSpmd(*program.module, program.fn("chain"),
                                                 meshOf({{"x", 1}}), Layout{}, m, program.diag);
  REQUIRE(spmd);
  const double elements = 64 * 32, bytes = 2 * elements;
  CHECK(roundingFlops(ir::DType::BF16) == 8);
  CHECK(roundingFlops(ir::DType::F16) == 14);
  CHECK(roundingFlops(ir::DType::F32) == 0);
  for (const SpmdOp& op : spmd->ops) {
    if (op.kind != SpmdOp::Kind::Compute) continue;
    if (op.computeKind == ir::OpKind::Mul) // 1 FLOP and the rounding, the result kept in the nest
      CHECK(op.seconds == Approx(std::max(9 * elements / 1e8, bytes / 1e10)));
    if (op.computeKind == ir::OpKind::Exp) // one exp (21 FLOPs) and the rounding, stored
      CHECK(op.seconds == Approx(std::max(29 * elements / 1e8, bytes / 1e10) + 1e-6));
  }
}

TEST_CASE("lowering: a softmax pays softmax_row_seconds per local row", "[cost][lowering]") {
  // kChainProgram's softmax of c[n = 64, d = 32] along d: 64 rows of 32.
  Analyzed program(kChainProgram);
  Machine m = parsed(kLoopsJson);
  m.softmaxRowSeconds = 1e-7;
  auto softmaxSeconds = [&](const Machine& machine, const Mesh& mesh, const Layout& layout) {
    std::optional<SpmdFunction> spmd =
        lowerToSpmd(*program.module, program.fn("chain"), mesh, layout, machine, program.diag);
    REQUIRE(spmd);
    for (const SpmdOp& op : spmd->ops)
      if (op.kind == SpmdOp::Kind::Compute && op.computeKind == ir::OpKind::Softmax)
        return op.seconds;
    FAIL("no softmax");
    return 0.0;
  };
  const double elements = 64 * 32;
  // 10 ns per element, 100 ns per row, the call.
  CHECK(softmaxSeconds(m, meshOf({{"x", 1}}), Layout{}) ==
        Approx(elements * 1e-8 + 64 * 1e-7 + 1e-6));
  // n split over x = 2: 32 local rows of 32; d split instead: 64 local rows of 16 (each rank
  // walks every row, half as long).
  Layout byRows, byLanes;
  byRows.axes["n"] = {"x"};
  byLanes.axes["d"] = {"x"};
  CHECK(softmaxSeconds(m, meshOf({{"x", 2}}), byRows) ==
        Approx(elements / 2 * 1e-8 + 32 * 1e-7 + 1e-6));
  CHECK(softmaxSeconds(m, meshOf({{"x", 2}}), byLanes) ==
        Approx(elements / 2 * 1e-8 + 64 * 1e-7 + 1e-6));
  // Absent from the file: 0, the per-element price alone (as before the field).
  CHECK(parsed(kLoopsJson).softmaxRowSeconds == 0);
  CHECK(softmaxSeconds(parsed(kLoopsJson), meshOf({{"x", 1}}), Layout{}) ==
        Approx(elements * 1e-8 + 1e-6));
  CHECK(parsed(R"({
  "name": "rows", "devices": 1, "peak_flops": 1e9, "memory_bandwidth": 1e9, "memory_bytes": 1e9,
  "softmax_row_seconds": 3e-8, "intra": {"name": "link", "alpha_seconds": 1e-6, "bandwidth": 1e9}
})")
            .softmaxRowSeconds == Approx(3e-8));
}

TEST_CASE("search: the lower bound stays a bound when loops and kernels are priced",
          "[cost][search]") {
  // Every dim searched on [a=2, b=2]: the search (pruned by its lower bound, which now counts
  // fixed costs and per-element rates) must find brute force's cost.
  Analyzed program(R"(
mesh m[a = 2, b = 2]
dim batch = 8
dim seq = 4
dim d = 16
dim f = 32
program block(x: f32[batch, seq, d]) -> (y: f32[batch, seq, d]) {
  param w_in: f32[d, f] = normal()
  param w_out: f32[f, d] = normal()
  let h = gelu(einsum(layer_norm(x, d), w_in -> batch, seq, f) * 0.5)
  let s = softmax(h, f)
  y = x + einsum(s * h, w_out -> batch, seq, d) + sum(x, d)
}
)");
  for (const Machine& machine : {parsed(kLoopsJson), *loadMachine("cpu")}) {
    CAPTURE(machine.name);
    checkSearchIsExact(program, "block", machine, {"batch", "seq", "d", "f"});
  }
}

TEST_CASE("lowering: an einsum no GEMM expresses is priced as the GEMMs codegen runs",
          "[cost][lowering]") {
  // t5's attention output: three operands, which codegen contracts pairwise (contract-pairwise)
  // in the order of fewest FLOPs: w.v (2 x 4 x 2 x 8 x 8 x 4 = 4096 FLOPs) into t[batch, h, s,
  // e], then o.t (2 x 4 x 2 x 8 x 4 x 16 = 8192); v.o first would take 8192 + 16384.
  Analyzed program(R"(
mesh m[a = 2, b = 2]
dim batch = 4
dim s = 8
dim k = 8
dim h = 2
dim e = 4
dim d = 16
program attend(w: f32[batch, h, s, k], v: f32[batch, k, h, e]) -> (y: f32[batch, s, d]) {
  param o: f32[h, e, d] = normal()
  let two = einsum(w, v -> batch, h, s, e)
  y = einsum(w, v, o -> batch, s, d) + einsum(two, o -> batch, s, d)
}
)");
  Machine m = parsed(kLoopsJson);
  std::vector<double> einsums = einsumSeconds(program, "attend", m);
  REQUIRE(einsums.size() == 3);
  // Each GEMM: its FLOPs at the peak slowed by 1 + 16 / (its smallest of m, n, k), against its
  // operands' and result's bytes, plus the GEMM's fixed cost (5 us). w.v: m = s, n = e, k = k;
  // o.t: m = d, n = batch s, k = h e.
  auto gemm = [&](double flops, double elements, double smallest) {
    return gemmSeconds(m, flops, 4 * elements, ir::DType::F32, smallest);
  };
  const double wv = gemm(4096, 512 + 256 + 256, 4), ot = gemm(8192, 128 + 256 + 512, 8);
  CHECK(std::count_if(einsums.begin(), einsums.end(),
                      [&](double seconds) { return seconds == Approx(wv + ot); }) == 1);
  for (double seconds : einsums)
    CHECK(seconds >= 5e-6);
  // The search's lower bound counts the fewest FLOPs of any order, and stays a bound.
  checkSearchIsExact(program, "attend", m, {"batch", "s", "d"});
}

TEST_CASE("lowering: random fills at the machine's cost per random element", "[cost][lowering]") {
  Analyzed program(R"(
mesh m[x = 1]
dim n = 64
dim d = 32
program noisy(x: f32[n, d]) -> (y: f32[n, d]) {
  y = x * uniform(f32[n, d])
}
)");
  Layout layout;
  std::optional<SpmdFunction> spmd =
      lowerToSpmd(*program.module, program.fn("noisy"), meshOf({{"x", 1}}), layout,
                  parsed(kLoopsJson), program.diag);
  REQUIRE(spmd);
  const double elements = 64 * 32, bytes = 4 * elements;
  int checked = 0;
  for (const SpmdOp& op : spmd->ops) {
    if (op.kind != SpmdOp::Kind::Compute) continue;
    if (op.computeKind == ir::OpKind::RandomUniform) { // a kernel call: 50 FLOPs per element
      CHECK(op.seconds == Approx(std::max(50 * elements / 1e8, bytes / 1e10) + 1e-6));
      ++checked;
    }
    if (op.computeKind == ir::OpKind::Mul) { // reads x and the samples, stores y; its own nest
      CHECK(op.seconds == Approx(std::max(elements / 1e8, 3 * bytes / 1e10) + 1e-6));
      ++checked;
    }
  }
  CHECK(checked == 2);
}

TEST_CASE("lowering: random_normal at the machine's normal_flops, uniform at random_flops",
          "[cost][lowering]") {
  Analyzed program(R"(
mesh m[x = 1]
dim n = 64
dim d = 32
program noisy(x: f32[n, d]) -> (y: f32[n, d]) {
  y = x * uniform(f32[n, d]) + normal(f32[n, d])
}
)");
  std::string json = kLoopsJson;
  json.insert(json.find("\"random_flops\""), "\"normal_flops\": 400, ");
  Machine withNormal = parsed(json.c_str());
  REQUIRE(withNormal.normalFlops == Approx(400));
  CHECK(parsed(kLoopsJson).normalFlops == 0); // absent: normal fills cost random_flops
  const double elements = 64 * 32, bytes = 4 * elements;
  for (bool normalGiven : {false, true}) {
    std::optional<SpmdFunction> spmd =
        lowerToSpmd(*program.module, program.fn("noisy"), meshOf({{"x", 1}}), Layout{},
                    normalGiven ? withNormal : parsed(kLoopsJson), program.diag);
    REQUIRE(spmd);
    int checked = 0;
    for (const SpmdOp& op : spmd->ops) {
      if (op.kind != SpmdOp::Kind::Compute) continue;
      double perElement = op.computeKind == ir::OpKind::RandomNormal && normalGiven ? 400 : 50;
      if (op.computeKind == ir::OpKind::RandomUniform ||
          op.computeKind == ir::OpKind::RandomNormal) {
        CHECK(op.seconds == Approx(std::max(perElement * elements / 1e8, bytes / 1e10) + 1e-6));
        ++checked;
      }
    }
    CHECK(checked == 2);
  }
}

TEST_CASE("one-hot products: which einsums are a gather, a scatter-add or a GEMM", "[cost]") {
  // Dims: 0 batch, 1 seq, 2 vocab (the one-hot dim), 3 d.
  CHECK(oneHotProduct({0, 1, 2}, 2, {2, 3}, {0, 1, 3}) == OneHotProduct::Gather);
  CHECK(oneHotProduct({0, 1, 2}, 2, {0, 1, 3}, {2, 3}) == OneHotProduct::ScatterAdd);
  CHECK(oneHotProduct({0, 1, 2}, 2, {2, 3}, {0, 3}) == OneHotProduct::None);       // seq summed
  CHECK(oneHotProduct({0, 1, 2}, 2, {0, 1, 2, 3}, {2, 3}) == OneHotProduct::None); // T has it
  CHECK(oneHotProduct({0, 1, 2}, 2, {0, 3}, {2, 3}) == OneHotProduct::None);       // seq nowhere
  CHECK(oneHotProduct({0, 1}, 2, {2, 3}, {0, 1, 3}) == OneHotProduct::None);       // no one-hot dim
}

TEST_CASE("lowering: an einsum of a one-hot tensor is priced as the gather or scatter-add codegen "
          "runs",
          "[cost][lowering]") {
  Analyzed program(R"(
mesh m[a = 2, b = 2]
dim batch = 4
dim seq = 8
dim vocab = 64
dim d = 16
program embed(tokens: i32[batch, seq], g: f32[batch, seq, d]) -> (x: f32[batch, seq, d], t: f32[vocab, d]) {
  param table: f32[vocab, d] = normal()
  let hot = one_hot(tokens, vocab)
  x = einsum(hot, table -> batch, seq, d)
  t = einsum(hot, g -> vocab, d)
}
)");
  Machine m = parsed(kLoopsJson);
  std::vector<double> einsums = einsumSeconds(program, "embed", m);
  REQUIRE(einsums.size() == 2);
  // The gather: the 32 ids (128 bytes), a row of the table read and written per output row;
  // the scatter-add: the ids, the zeroed result, then each element of g read and added into it.
  const double ids = 32 * 4, x = 4 * 8 * 16 * 4, t = 64 * 16 * 4, g = 4 * 8 * 16 * 4;
  CHECK(einsums[0] == Approx(kernelCallSeconds(m, 0, ids + 2 * x)));
  CHECK(einsums[1] == Approx(kernelCallSeconds(m, 4 * 8 * 16, ids + t + 3 * g)));
  // Either far below the GEMM the planner charged before: 2 x 32 x 64 x 16 FLOPs at the peak.
  for (double seconds : einsums)
    CHECK(seconds < 0.2 * (2.0 * 32 * 64 * 16 / m.peakFlops));
  // The search's lower bound stays a bound: the search finds brute force's cost.
  checkSearchIsExact(program, "embed", m, {"batch", "seq", "vocab", "d"});
}

// A mask built from iotas is the same every run: generated code computes it once, in the
// constructor (kernel pass hoist-invariants), and the model charges it nothing per step.
const char* kMaskedProgram = R"(
mesh m[x = 2]
dim n = 64
dim d = 64
program masked(x: f32[n, d]) -> (y: f32[n, d]) {
  let allowed = iota(n) >= iota(d)
  y = where(allowed, x * 2, 0) + 1
}
)";

TEST_CASE("step invariants: ops built only from iotas and literals", "[cost][ir]") {
  Analyzed program(kMaskedProgram);
  const ir::Function& fn = program.fn("masked");
  std::vector<char> invariant = ir::stepInvariantOps(fn);
  REQUIRE(invariant.size() == fn.ops.size());
  int invariantCompares = 0, varying = 0;
  for (size_t i = 0; i < fn.ops.size(); ++i) {
    ir::OpKind kind = fn.ops[i].kind;
    if (kind == ir::OpKind::Iota || kind == ir::OpKind::Literal) CHECK(invariant[i]);
    if (kind == ir::OpKind::Input || kind == ir::OpKind::Where || kind == ir::OpKind::Mul)
      CHECK_FALSE(invariant[i]); // the input, and what reads it
    invariantCompares += kind == ir::OpKind::Ge && invariant[i];
    varying += !invariant[i];
  }
  CHECK(invariantCompares == 1);
  CHECK(varying >= 4); // input, mul, where, add
}

TEST_CASE("lowering: step-invariant ops cost nothing per step, outputs their copy",
          "[cost][lowering]") {
  Analyzed program(kMaskedProgram);
  Machine m = parsed(kLoopsJson);
  Layout layout;
  std::optional<SpmdFunction> spmd = lowerToSpmd(*program.module, program.fn("masked"),
                                                 meshOf({{"x", 1}}), layout, m, program.diag);
  REQUIRE(spmd);
  double varying = 0;
  for (const SpmdOp& op : spmd->ops) {
    if (op.kind != SpmdOp::Kind::Compute) continue;
    bool fromIotas = op.computeKind == ir::OpKind::Iota || op.computeKind == ir::OpKind::Ge;
    if (fromIotas) CHECK(op.seconds == 0);
    if (op.computeKind == ir::OpKind::Mul) CHECK(op.seconds > 0);
    varying += op.seconds;
  }
  CHECK(spmd->summary.outputSeconds == 0); // the machine gives no output_seconds
  CHECK(spmd->summary.computeSeconds == Approx(varying));

  // With output_seconds: y's [64, 64] f32 shard, a new tensor plus its bytes read and written
  // (32 KiB, in the cache); on 4 ranks of 2 cores, twice that (the ranks take turns).
  m.outputSeconds = 3e-7;
  const double bytes = 64 * 64 * 4;
  std::optional<SpmdFunction> copied = lowerToSpmd(*program.module, program.fn("masked"),
                                                   meshOf({{"x", 1}}), layout, m, program.diag);
  REQUIRE(copied);
  CHECK(copied->summary.outputSeconds == Approx(3e-7 + 2 * bytes / 1e10));
  CHECK(copied->summary.computeSeconds == Approx(varying + 3e-7 + 2 * bytes / 1e10));
  m.cores = 2;
  std::optional<SpmdFunction> shared = lowerToSpmd(*program.module, program.fn("masked"),
                                                   meshOf({{"x", 4}}), layout, m, program.diag);
  REQUIRE(shared);
  CHECK(shared->summary.outputSeconds == Approx(2 * (3e-7 + 2 * bytes / 1e10)));
}
