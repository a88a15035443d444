// The cost model's measured refinements (issue 15, item 4; docs/planner.md, "Cost model"): a
// cache level for memory-bound ops, a fixed cost per GEMM call, and the synchronization each
// collective pays when thread ranks outnumber the cores; each against hand-computed numbers and
// through the lowering, and a description without them costing as before.
#include "planner/CostModel.h"
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
  CHECK(oversubscribedSyncSeconds(m, fits) == 0);
  CHECK(oversubscribedSyncSeconds(m, over) == Approx(1e-4));
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
    // One all-reduce (the second einsum's partial sum); the sync only on 8 ranks.
    REQUIRE(with.communicating() == 1);
    CHECK(with.spmd->summary.communicationSeconds ==
          Approx(without.spmd->summary.communicationSeconds + (ranks > 4 ? 1e-4 : 0)));
  }
}
