// Planner core: layouts, machine descriptions, the cost model's formulas, resharding as a
// shortest path, SPMD lowering (Megatron's collectives rediscovered from a layout, lazy partial
// sums, reduce-scatter, one_hot/shift over split dims, forced replications, layout errors) and
// the agreement of the fast evaluator with the lowering on every example.
#include "planner/AllReduceChains.h"
#include "planner/CostModel.h"
#include "planner/Reshard.h"
#include "planner/SpmdLowering.h"
#include "sema/Sema.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <unordered_map>

using namespace meshc;
using namespace meshc::plan;

namespace {

struct Analyzed {
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream errorStream{errors};
  DiagEngine diag{sources, errorStream};
  std::optional<ir::Module> module;

  explicit Analyzed(llvm::StringRef text, bool isPath = false) {
    std::optional<SourceSet> set =
        isPath ? loadSources(text.str(), diag) : loadSourcesFromBuffer(text, "t.mesh", diag);
    if (set) module = analyze(*set, diag);
    errorStream.flush();
  }
  const ir::Function& fn(const std::string& name) const {
    REQUIRE(module);
    const ir::Function* f = module->findFunction(name);
    REQUIRE(f);
    return *f;
  }
  std::string takeErrors() {
    errorStream.flush();
    return errors;
  }
};

Mesh meshOf(std::vector<std::pair<std::string, int64_t>> axes) {
  Mesh mesh;
  for (auto& [name, size] : axes)
    mesh.axes.push_back({name, size});
  return mesh;
}

/// The program's pinned layout entries (auto entries stay replicated).
Layout pinnedLayout(const ir::Module& module) {
  Layout layout;
  for (const ir::DimLayout& entry : module.layout)
    if (!entry.isAuto && !entry.axes.empty()) layout.axes[entry.dim] = entry.axes;
  return layout;
}

Machine machine(const std::string& name) {
  llvm::Expected<Machine> loaded = loadMachine(name);
  if (!loaded) {
    FAIL(llvm::toString(loaded.takeError()));
  }
  return *loaded;
}

std::string examplePath(const std::string& name) {
  return std::string(MESHC_SOURCE_DIR) + "/dsl-examples/" + name;
}

bool isCommunication(const SpmdOp& op) {
  return op.kind == SpmdOp::Kind::Collective && op.collective.kind != CollectiveKind::LocalSlice;
}

std::vector<const SpmdOp*> collectives(const SpmdFunction& fn) {
  std::vector<const SpmdOp*> out;
  for (const SpmdOp& op : fn.ops)
    if (isCommunication(op)) out.push_back(&op);
  return out;
}

/// The communicating collectives per transformer layer, attributed by the IR op they serve:
/// layer k spans from its first param to the next layer's (or the final norm's) first param.
std::vector<std::vector<const SpmdOp*>> collectivesPerLayer(const ir::Function& fn,
                                                            const SpmdFunction& spmd, int layers) {
  std::vector<uint32_t> starts;
  for (int k = 0; k <= layers; ++k) {
    std::string prefix =
        k < layers ? fmt::format("decoder/decoder_layer[{}]/", k) : std::string("decoder/norm/");
    for (uint32_t i = 0; i < fn.ops.size(); ++i)
      if (fn.ops[i].kind == ir::OpKind::Param && fn.ops[i].string("path").rfind(prefix, 0) == 0) {
        starts.push_back(i);
        break;
      }
  }
  REQUIRE(starts.size() == static_cast<size_t>(layers + 1));
  std::vector<std::vector<const SpmdOp*>> out(layers);
  for (const SpmdOp* op : collectives(spmd))
    for (int k = 0; k < layers; ++k)
      if (op->sourceOp >= starts[k] && op->sourceOp < starts[k + 1]) out[k].push_back(op);
  return out;
}

/// The collectives that resolve a partial sum (all-reduces, or reduce-scatters under sequence
/// parallelism), without the all-gathers that bring split rows back.
std::vector<const SpmdOp*> resolving(const std::vector<const SpmdOp*>& ops) {
  std::vector<const SpmdOp*> out;
  for (const SpmdOp* op : ops)
    if (op->collective.kind != CollectiveKind::AllGather) out.push_back(op);
  return out;
}

int count(const std::vector<const SpmdOp*>& ops, CollectiveKind kind) {
  return static_cast<int>(std::count_if(
      ops.begin(), ops.end(), [&](const SpmdOp* op) { return op->collective.kind == kind; }));
}

TensorLayout split(std::vector<AxisList> dims, std::set<std::string> partial = {}) {
  TensorLayout layout;
  layout.dimAxes = std::move(dims);
  layout.partialAxes = std::move(partial);
  return layout;
}

ir::TensorType f32(std::vector<std::pair<std::string, int64_t>> dims) {
  ir::TensorType type;
  for (auto& [name, size] : dims)
    type.dims.push_back({name, size});
  return type;
}

const char* kMachineJson = R"({
  "name": "toy", "devices": 4, "peak_flops": 1e9, "memory_bandwidth": 1e9, "memory_bytes": 1e9,
  "intra": {"name": "link", "alpha_seconds": 1e-6, "bandwidth": 1e9}
})";

Machine toyMachine() {
  llvm::Expected<Machine> machine = parseMachine(kMachineJson, "toy.json");
  REQUIRE(static_cast<bool>(machine));
  return *machine;
}

} // namespace

TEST_CASE("layouts: per-value layouts drop an axis used twice, local shapes divide", "[layout]") {
  Mesh mesh = meshOf({{"data", 2}, {"model", 4}});
  CHECK(mesh.numDevices() == 8);
  CHECK(mesh.axisSize("model") == 4);
  CHECK(mesh.axisSize("nope") == 0);
  Layout layout;
  layout.axes["batch"] = {"data"};
  layout.axes["d_ff"] = {"model"};
  layout.axes["heads"] = {"model", "data"};
  ir::TensorType type = f32({{"batch", 8}, {"d_ff", 32}, {"heads", 8}});
  TensorLayout tensor = tensorLayoutOf(type, layout, mesh);
  CHECK(tensor.dimAxes == std::vector<AxisList>{{"data"}, {"model"}, {}});
  ir::TensorType local = localType(type, tensor, mesh);
  CHECK(local.dims[0].size == 4);
  CHECK(local.dims[1].size == 8);
  CHECK(local.dims[2].size == 8);
  CHECK(splitFactor(mesh, {"data", "model"}) == 8);
  CHECK(layoutString(layout) == "batch: [data], d_ff: [model], heads: [model, data]");
  tensor.partialAxes = {"model"};
  CHECK(tensorLayoutString(f32({{"batch", 8}, {"d", 4}}), split({{"data"}, {}}, {"model"})) ==
        "[batch:[data], d] partial-sum{model}");
  CHECK(localBytes(type, split({{"data"}, {"model"}, {}}), mesh) == 4 * 8 * 8 * 4);
  CHECK(isLegalLayout(type, split({{"data"}, {"model"}, {}}), mesh));
  CHECK_FALSE(isLegalLayout(type, split({{"data"}, {"data"}, {}}), mesh));
  CHECK_FALSE(isLegalLayout(f32({{"d", 6}}), split({{"model"}}), mesh));
  CHECK_FALSE(isLegalLayout(type, split({{"data"}, {}, {}}, {"data"}), mesh));
}

TEST_CASE("machines: the built-ins load and have the brief's figures", "[machine]") {
  std::vector<std::string> names = builtinMachineNames();
  for (const char* name :
       {"cpu", "8xh100", "8xh200", "h100-cluster", "a100-cluster", "tpuv2-pod"}) {
    CAPTURE(name);
    CHECK(std::find(names.begin(), names.end(), name) != names.end());
    Machine m = machine(name);
    CHECK(m.name == name);
    CHECK(m.peakFlops > 0);
    CHECK(m.intra.bandwidthBytesPerS > 0);
  }
  CHECK(machine("cpu").description.find("meshc calibrate") != std::string::npos);
  CHECK(machine("tpuv2-pod").numDevices == 512);
  CHECK(machine("h100-cluster").inter.bandwidthBytesPerS == Approx(50e9));
  // A100 80GB: 312 TFLOP/s bf16, NVLink 600 GB/s both ways, 200 Gb/s per GPU between hosts.
  Machine a100 = machine("a100-cluster");
  CHECK(a100.peakFlopsBf16 == Approx(312e12));
  CHECK(a100.devicesPerNode == 8);
  CHECK(a100.intra.bandwidthBytesPerS == Approx(300e9));
  CHECK(a100.inter.bandwidthBytesPerS == Approx(25e9));
  CHECK(a100.memoryBytes == Approx(80e9));

  // 8xH200: a 1 MiB all-reduce over 8 GPUs gives ~53 GB/s of bus bandwidth (the fitted alpha),
  // an 8 GiB one ~480 GB/s.
  Machine h200 = machine("8xh200");
  Mesh mesh = meshOf({{"x", 8}});
  auto busBandwidth = [&](double bytes) {
    Collective allReduce;
    allReduce.kind = CollectiveKind::AllReduceSum;
    allReduce.axes = {"x"};
    allReduce.bytes = static_cast<int64_t>(bytes);
    return 2.0 * 7 / 8 * bytes / collectiveSeconds(h200, mesh, allReduce);
  };
  CHECK(busBandwidth(1 << 20) == Approx(53e9).epsilon(0.02));
  CHECK(busBandwidth(8.0 * (1 << 30)) == Approx(480e9).epsilon(0.01));
}

TEST_CASE("machines: parse errors name the field", "[machine]") {
  auto error = [](llvm::StringRef json) {
    llvm::Expected<Machine> m = parseMachine(json, "m.json");
    REQUIRE_FALSE(static_cast<bool>(m));
    return llvm::toString(m.takeError());
  };
  CHECK(error("{").find("m.json: invalid JSON") == 0);
  CHECK(error("[1]") == "m.json: a machine description must be a JSON object");
  CHECK(error(R"({"name": "x", "devices": 2, "peak_flops": 1, "memory_bandwidth": 1,
                  "memory_bytes": 1})") == "m.json: missing field 'intra' (an object)");
  CHECK(error(R"({"name": "x", "devices": 2, "peak_flops": "fast", "memory_bandwidth": 1,
                  "memory_bytes": 1, "intra": {"name": "l", "alpha_seconds": 0, "bandwidth": 1}})") ==
        "m.json: field 'peak_flops' must be a number");
  CHECK(error(R"({"name": "x", "devices": 0, "peak_flops": 1, "memory_bandwidth": 1,
                  "memory_bytes": 1, "intra": {"name": "l", "alpha_seconds": 0, "bandwidth": 1}})") ==
        "m.json: field 'devices' must be a positive integer");
  CHECK(error(R"({"name": "x", "devices": 2, "peak_flops": 1, "memory_bandwidth": 1,
                  "memory_bytes": 1, "intra": {"name": "l", "bandwidth": 1}})") ==
        "m.json: missing field 'intra.alpha_seconds' (a number)");
  CHECK(error(R"({"name": "x", "devices": 16, "devices_per_node": 8, "peak_flops": 1,
                  "memory_bandwidth": 1, "memory_bytes": 1,
                  "intra": {"name": "l", "alpha_seconds": 0, "bandwidth": 1}})") ==
        "m.json: missing field 'inter' (an object): the machine has several nodes");
  llvm::Expected<Machine> missing = loadMachine("/no/such/machine.json");
  REQUIRE_FALSE(static_cast<bool>(missing));
  CHECK(llvm::toString(missing.takeError()).find("unknown machine '/no/such/machine.json'") == 0);
}

TEST_CASE("machines: collectives over axes that span nodes use the inter-node link", "[machine]") {
  Machine cluster = machine("h100-cluster");
  Mesh mesh = meshOf({{"node", 8}, {"gpu", 8}});
  CHECK(linkFor(cluster, mesh, {"gpu"}).name == "nvlink");
  CHECK(linkFor(cluster, mesh, {"node"}).name == "infiniband");
  CHECK(linkFor(cluster, mesh, {"node", "gpu"}).name == "infiniband");
  // A mesh of 8 ranks fits in one node.
  CHECK(linkFor(cluster, meshOf({{"data", 2}, {"model", 4}}), {"data"}).name == "nvlink");
}

TEST_CASE("machines: linkFor's remembered answers follow the mesh and the machine", "[machine]") {
  // linkFor keeps its answers by the mesh's axis sizes and the axes' indices: meshes whose
  // names agree but whose sizes do not, asked in turn, each get their own.
  Machine cluster = machine("h100-cluster");
  Mesh wide = meshOf({{"data", 8}, {"model", 8}}), narrow = meshOf({{"data", 16}, {"model", 4}});
  Mesh swapped = meshOf({{"model", 8}, {"data", 8}});
  for (int round = 0; round < 3; ++round) {
    CHECK(linkFor(cluster, wide, {"model"}).name == "nvlink");
    CHECK(linkFor(cluster, wide, {"data"}).name == "infiniband");
    CHECK(linkFor(cluster, narrow, {"model"}).name == "nvlink");
    CHECK(linkFor(cluster, narrow, {"data"}).name == "infiniband");
    CHECK(linkFor(cluster, swapped, {"model"}).name == "infiniband");
    CHECK(linkFor(cluster, swapped, {"data"}).name == "nvlink");
    CHECK(linkFor(cluster, wide, {"model", "data"}).name == "infiniband");
    // Another node size: every group of 8 spans two nodes of 4.
    Machine small = cluster;
    small.devicesPerNode = 4;
    CHECK(linkFor(small, wide, {"model"}).name == "infiniband");
    CHECK(linkFor(small, narrow, {"model"}).name == "nvlink");
  }
  // Past the answers it keeps (64), still right.
  for (int64_t size = 2; size <= 80; ++size)
    CHECK(linkFor(cluster, meshOf({{"data", size}, {"model", 8}}), {"model"}).name == "nvlink");
  CHECK(linkFor(cluster, wide, {"data"}).name == "infiniband");
}

TEST_CASE("layouts: the interning hashes agree with equality", "[layout]") {
  TensorLayoutHash hash;
  AxisListHash axesHash;
  TensorLayout a = split({{"data"}, {"model"}}, {"stage"});
  TensorLayout same = split({{"data"}, {"model"}}, {"stage"});
  CHECK(hash(a) == hash(same));
  CHECK(axesHash({"data", "model"}) == axesHash(AxisList{"data", "model"}));
  // Layouts that differ only in where a dim's list ends, in the partial axes or in the kind of
  // partial, are different keys; the hashes tell these apart (a collision would only cost a
  // comparison, but none of these should meet).
  std::vector<TensorLayout> distinct = {
      split({{"data", "model"}, {}}), split({{"data"}, {"model"}}),
      split({{}, {"data", "model"}}), split({{"data"}, {}}, {"model"}),
      split({{"data"}, {}}),          split({{"datamodel"}, {}})};
  TensorLayout max = split({{"data"}, {}}, {"model"});
  max.partialIsMax = true;
  distinct.push_back(max);
  for (size_t i = 0; i < distinct.size(); ++i)
    for (size_t j = i + 1; j < distinct.size(); ++j) {
      CHECK_FALSE(distinct[i] == distinct[j]);
      CHECK(hash(distinct[i]) != hash(distinct[j]));
    }
  CHECK(axesHash({"data", "model"}) != axesHash({"model", "data"}));
  CHECK(axesHash({"datamodel"}) != axesHash({"data", "model"}));
  // As the interning tables use them: ids in the order first seen, the same layout the same id.
  std::unordered_map<TensorLayout, int, TensorLayoutHash> ids;
  for (const TensorLayout& layout : distinct)
    ids.try_emplace(layout, static_cast<int>(ids.size()));
  ids.try_emplace(a, static_cast<int>(ids.size()));
  auto [known, inserted] = ids.try_emplace(same, static_cast<int>(ids.size()));
  CHECK_FALSE(inserted);
  CHECK(known->second == static_cast<int>(distinct.size()));
  for (size_t i = 0; i < distinct.size(); ++i)
    CHECK(ids.at(distinct[i]) == static_cast<int>(i));
}

TEST_CASE("cost model: alpha-beta and roofline against hand-computed numbers", "[cost]") {
  Machine toy = toyMachine();
  Mesh mesh = meshOf({{"x", 4}, {"y", 2}});
  Collective c;
  c.axes = {"x"};
  c.bytes = 4000;
  c.kind = CollectiveKind::AllReduceSum; // 2a + 2 (3/4) n b
  CHECK(collectiveSeconds(toy, mesh, c) == Approx(2e-6 + 6e-6));
  c.kind = CollectiveKind::AllGather; // a + (3/4) n b
  CHECK(collectiveSeconds(toy, mesh, c) == Approx(1e-6 + 3e-6));
  c.kind = CollectiveKind::ReduceScatter;
  CHECK(collectiveSeconds(toy, mesh, c) == Approx(1e-6 + 3e-6));
  c.kind = CollectiveKind::AllToAll; // (p-1) a + (3/4) n b
  CHECK(collectiveSeconds(toy, mesh, c) == Approx(3e-6 + 3e-6));
  c.kind = CollectiveKind::Permute; // a + n b
  CHECK(collectiveSeconds(toy, mesh, c) == Approx(1e-6 + 4e-6));
  c.kind = CollectiveKind::LocalSlice;
  CHECK(collectiveSeconds(toy, mesh, c) == 0);
  c.kind = CollectiveKind::AllReduceSum;
  c.axes = {"x", "y"}; // p = 8
  CHECK(collectiveSeconds(toy, mesh, c) == Approx(2e-6 + 2 * 7.0 / 8 * 4000 / 1e9));
  CHECK(computeSeconds(toy, 2e9, 1e6, ir::DType::F32) == Approx(2.0)); // FLOP-bound
  CHECK(computeSeconds(toy, 1e3, 3e9, ir::DType::F32) == Approx(3.0)); // memory-bound
  Machine h100 = machine("8xh100");
  CHECK(computeSeconds(h100, 989.4e12, 0, ir::DType::BF16) == Approx(1.0));
  CHECK(computeSeconds(h100, 494.7e12, 0, ir::DType::F32) == Approx(1.0));
}

TEST_CASE("reshard: shortest paths over layout states", "[reshard]") {
  Machine toy = toyMachine();
  Mesh mesh = meshOf({{"data", 2}, {"model", 4}});
  ir::TensorType type = f32({{"batch", 8}, {"d_model", 64}});
  auto path = [&](const TensorLayout& from, const TensorLayout& to) {
    std::optional<ReshardPath> found = planReshard(type, from, to, mesh, toy);
    REQUIRE(found);
    return *found;
  };
  auto kinds = [](const ReshardPath& p) {
    std::vector<CollectiveKind> out;
    for (const ReshardStep& step : p.steps)
      out.push_back(step.collective.kind);
    return out;
  };

  SECTION("same layout: nothing") {
    CHECK(path(split({{}, {}}), split({{}, {}})).steps.empty());
  }
  SECTION("partial sum wanted split: reduce-scatter, not all-reduce + slice") {
    ReshardPath p = path(split({{}, {}}, {"model"}), split({{}, {"model"}}));
    REQUIRE(kinds(p) == std::vector{CollectiveKind::ReduceScatter});
    CHECK(p.steps[0].collective.dim == "d_model");
    CHECK(p.steps[0].collective.bytes == 8 * 64 * 4);
    CHECK(p.seconds == Approx(1e-6 + 0.75 * 2048 / 1e9));
  }
  SECTION("partial sum wanted replicated: all-reduce") {
    ReshardPath p = path(split({{"data"}, {}}, {"model"}), split({{"data"}, {}}));
    REQUIRE(kinds(p) == std::vector{CollectiveKind::AllReduceSum});
    CHECK(p.steps[0].collective.axes == AxisList{"model"});
    CHECK(p.steps[0].collective.bytes == 4 * 64 * 4);
  }
  SECTION("an all-reduce against reduce-scatter + all-gather, equal by the formulas: one step") {
    // 2a + 2 (1/2) n b either way on 8xh100 [2, 2]; floating-point rounding used to make the
    // pair cheaper by an ulp for some sizes, and the pair never merges into a bucket.
    Machine h100 = machine("8xh100");
    Mesh square = meshOf({{"data", 2}, {"model", 2}});
    for (int64_t size : {2, 8, 16, 32, 64, 128, 512, 4096}) {
      std::optional<ReshardPath> found =
          planReshard(f32({{"d", size}}), split({{}}, {"model"}), split({{}}), square, h100);
      REQUIRE(found);
      INFO("d = " << size);
      CHECK(kinds(*found) == std::vector{CollectiveKind::AllReduceSum});
    }
  }
  SECTION("partial max: all-reduce max") {
    TensorLayout from = split({{}, {}}, {"model"});
    from.partialIsMax = true;
    CHECK(kinds(path(from, split({{}, {}}))) == std::vector{CollectiveKind::AllReduceMax});
    // No reduce-scatter for a max. The cheapest path slices batch first (free), all-reduces
    // the smaller shard, slices d_model and all-gathers batch back: cheaper than all-reducing
    // everything (3.5 + 1.3 us against 5.1 us on this machine).
    ReshardPath p = path(from, split({{}, {"model"}}));
    CHECK(kinds(p) == std::vector{CollectiveKind::LocalSlice, CollectiveKind::AllReduceMax,
                                  CollectiveKind::LocalSlice, CollectiveKind::AllGather});
    CHECK(p.seconds < 2e-6 + 2 * 0.75 * 2048 / 1e9);
  }
  SECTION("moving a split between dims: all-to-all") {
    ReshardPath p = path(split({{"data"}, {}}), split({{}, {"data"}}));
    REQUIRE(kinds(p) == std::vector{CollectiveKind::AllToAll});
    CHECK(p.steps[0].collective.dim == "batch");
    CHECK(p.steps[0].collective.toDim == "d_model");
  }
  SECTION("replicated to split: a free local slice") {
    ReshardPath p = path(split({{}, {}}), split({{"data"}, {"model"}}));
    CHECK(p.seconds == 0);
    CHECK(kinds(p) == std::vector{CollectiveKind::LocalSlice, CollectiveKind::LocalSlice});
  }
  SECTION("unsplitting: all-gather of the minor-most axes") {
    ReshardPath p = path(split({{"data", "model"}, {}}), split({{"data"}, {}}));
    REQUIRE(kinds(p) == std::vector{CollectiveKind::AllGather});
    CHECK(p.steps[0].collective.axes == AxisList{"model"});
    CHECK(p.steps[0].collective.bytes == 4 * 64 * 4);
    ReshardPath both = path(split({{"data", "model"}, {}}), split({{}, {}}));
    REQUIRE(kinds(both) == std::vector{CollectiveKind::AllGather}); // one gather over 8
    CHECK(both.steps[0].collective.axes == AxisList{"data", "model"});
  }
  SECTION("two axes swapped between dims") {
    ReshardPath p = path(split({{"data"}, {"model"}}), split({{"model"}, {"data"}}));
    CHECK(p.steps.size() >= 2);
    CHECK(p.steps.back().after == split({{"model"}, {"data"}}));
    for (const ReshardStep& step : p.steps)
      CHECK(isLegalLayout(type, step.after, mesh));
  }
  SECTION("partial over two axes into two dims") {
    ReshardPath p = path(split({{}, {}}, {"data", "model"}), split({{"data"}, {"model"}}));
    CHECK(p.steps.size() == 2);
    for (const ReshardStep& step : p.steps)
      CHECK(step.collective.kind == CollectiveKind::ReduceScatter);
    CHECK(p.steps.back().after == split({{"data"}, {"model"}}));
  }
  SECTION("many axes: a legal path, found quickly") {
    Mesh wide = meshOf({{"a", 2}, {"b", 2}, {"c", 2}, {"d", 2}, {"e", 2}, {"f", 2}});
    ir::TensorType big = f32({{"p", 64}, {"q", 64}, {"r", 64}, {"s", 64}});
    TensorLayout from = split({{"a", "b"}, {"c"}, {}, {}}, {"d", "e", "f"});
    TensorLayout to = split({{"f"}, {"e", "d"}, {"c", "b"}, {"a"}});
    std::optional<ReshardPath> found = planReshard(big, from, to, wide, toy);
    REQUIRE(found);
    REQUIRE_FALSE(found->steps.empty());
    CHECK(found->steps.back().after == to);
    for (const ReshardStep& step : found->steps)
      CHECK(isLegalLayout(big, step.after, wide));
  }
  SECTION("illegal targets have no path") {
    CHECK_FALSE(planReshard(type, split({{}, {}}), split({{"data"}, {"data"}}), mesh, toy));
    CHECK_FALSE(planReshard(f32({{"d", 6}}), split({{}}), split({{"model"}}), mesh, toy));
    CHECK_FALSE(planReshard(type, split({{}, {}}), split({{}, {}}, {"model"}), mesh, toy));
  }
  SECTION("a partial target keeps the sum lazy while the dims move") {
    ReshardPath p = path(split({{"data"}, {}}, {"model"}), split({{}, {"data"}}, {"model"}));
    CHECK(kinds(p) == std::vector{CollectiveKind::AllToAll});
  }
}

namespace {

const char* kSmallHeader = R"(
mesh m[data = 2, model = 4]
dim batch = 8
dim seq = 16
dim d_model = 32
dim d_other = 32
dim d_ff = 64
dim vocab = 16
)";

struct Lowered {
  Analyzed analyzed;
  std::optional<SpmdFunction> spmd;
  Lowered(const std::string& body, const std::string& function, Mesh mesh, Layout layout,
          const std::string& machineName = "8xh100")
      : analyzed(std::string(kSmallHeader) + body) {
    REQUIRE(analyzed.module);
    spmd = lowerToSpmd(*analyzed.module, analyzed.fn(function), mesh, layout, machine(machineName),
                       analyzed.diag);
  }
};

} // namespace

TEST_CASE("lowering: local shapes and a lazy partial sum resolved by all-reduce", "[lowering]") {
  Layout layout;
  layout.axes["batch"] = {"data"};
  layout.axes["d_ff"] = {"model"};
  Lowered l(R"(
program mlp(x: f32[batch, d_model]) -> (y: f32[batch, d_model]) {
  param w_in: f32[d_model, d_ff] = normal()
  param w_out: f32[d_ff, d_model] = normal()
  let h = relu(einsum(x, w_in -> batch, d_ff))
  y = x + einsum(h, w_out -> batch, d_model) * 2.0
})",
            "mlp", meshOf({{"data", 2}, {"model", 4}}), layout);
  REQUIRE(l.spmd);
  const SpmdFunction& fn = *l.spmd;
  // x: [batch/2, d_model]; w_in: [d_model, d_ff/4]; h: [batch/2, d_ff/4].
  CHECK(fn.values[fn.inputs[0]].localType.dims[0].size == 4);
  CHECK(fn.values[fn.params[0]].localType.dims[1].size == 16);
  std::vector<const SpmdOp*> comm = collectives(fn);
  // The partial sum survives `* 2.0` (linear) and is resolved once, for the add: by a
  // reduce-scatter of the rows (sequence parallelism, SequenceParallel.h: the add runs on a
  // quarter of them), the output gathered back. Priced as an all-reduce's bytes and latencies
  // (2a + 2b (p-1)/p n either way on this GPU machine), less three quarters of the add.
  REQUIRE(comm.size() == 2);
  CHECK(comm[0]->collective.kind == CollectiveKind::ReduceScatter);
  CHECK(comm[0]->collective.axes == AxisList{"model"});
  CHECK(comm[0]->collective.bytes == 4 * 32 * 4);
  CHECK(comm[0]->loc.line == 14);
  CHECK(comm[1]->collective.kind == CollectiveKind::AllGather);
  const SpmdOp* mul = nullptr;
  for (const SpmdOp& op : fn.ops)
    if (op.kind == SpmdOp::Kind::Compute && op.computeKind == ir::OpKind::Mul) mul = &op;
  REQUIRE(mul);
  CHECK(fn.values[mul->result].layout.partialAxes == std::set<std::string>{"model"});
  CHECK(fn.replications.empty());
  CHECK(fn.summary.communicationSeconds == Approx(comm[0]->seconds + comm[1]->seconds));
  CHECK(fn.summary.stepSeconds ==
        Approx(fn.summary.computeSeconds + fn.summary.communicationSeconds));
  CHECK(fn.summary.totalFlops > 2.0 * 8 * 32 * 64 * 2);
  CHECK(fn.memory.paramBytes == (32 * 16 + 16 * 32) * 4);
}

TEST_CASE("lowering: reduce-scatter when the consumer wants the dim split", "[lowering]") {
  Layout layout;
  layout.axes["d_ff"] = {"model"};
  layout.axes["d_other"] = {"model"};
  Lowered l(R"(
program p(x: f32[batch, d_ff]) -> (y: f32[batch, d_other]) {
  param w: f32[d_ff, d_model] = normal()
  y = relu(rename(einsum(x, w -> batch, d_model), d_model -> d_other))
})",
            "p", meshOf({{"data", 2}, {"model", 4}}), layout);
  REQUIRE(l.spmd);
  std::vector<const SpmdOp*> comm = collectives(*l.spmd);
  REQUIRE(comm.size() == 1);
  CHECK(comm[0]->collective.kind == CollectiveKind::ReduceScatter);
  CHECK(comm[0]->collective.dim == "d_model");
  CHECK(comm[0]->collective.axes == AxisList{"model"});
}

TEST_CASE("lowering: one_hot over a split vocab needs no communication; gather is a lazy "
          "partial sum",
          "[lowering]") {
  Layout layout;
  layout.axes["vocab"] = {"model"};
  layout.axes["batch"] = {"data"};
  Lowered l(R"(
program p(ids: i32[batch, seq]) -> (y: f32[batch, seq, d_model]) {
  param table: f32[vocab, d_model] = normal()
  let hot = one_hot(ids, vocab)
  y = einsum(hot, table -> batch, seq, d_model) + gather(table, ids, vocab)
})",
            "p", meshOf({{"data", 2}, {"model", 4}}), layout);
  REQUIRE(l.spmd);
  const SpmdFunction& fn = *l.spmd;
  for (const SpmdOp& op : fn.ops)
    if (op.kind == SpmdOp::Kind::Compute && op.computeKind == ir::OpKind::OneHot) {
      CHECK(fn.values[op.result].localType.dims[2].size == 4); // vocab/4
      CHECK(fn.values[op.result].layout.partialAxes.empty());
    }
  // einsum and gather are both partial over model; their sum stays partial and the output is
  // resolved by a single all-reduce.
  std::vector<const SpmdOp*> comm = collectives(fn);
  REQUIRE(comm.size() == 1);
  CHECK(comm[0]->collective.kind == CollectiveKind::AllReduceSum);
  CHECK(comm[0]->note.find("output 'y'") != std::string::npos);
}

TEST_CASE("lowering: split-dim ops get their collectives", "[lowering]") {
  Layout layout;
  layout.axes["seq"] = {"model"};
  layout.axes["batch"] = {"data"};
  Lowered l(R"(
program p(x: f32[batch, seq, d_model]) -> (a: f32[batch, seq, d_model], b: f32[batch, seq, d_model],
                                           c: f32[batch, seq, d_model], d: f32[batch, d_model],
                                           e: f32[batch, seq, d_model]) {
  a = shift(x, seq, by = 1)
  b = softmax(x, seq)
  c = cumsum(x, seq)
  d = max(x, seq)
  e = layer_norm(x, seq)
})",
            "p", meshOf({{"data", 2}, {"model", 4}}), layout);
  REQUIRE(l.spmd);
  std::vector<const SpmdOp*> comm = collectives(*l.spmd);
  REQUIRE(count(comm, CollectiveKind::Permute) == 1);
  for (const SpmdOp* op : comm)
    if (op->collective.kind == CollectiveKind::Permute) {
      CHECK(op->collective.offset == 1);
      CHECK(op->collective.bytes == 4 * 1 * 32 * 4); // one row of [batch/2, d_model]
      CHECK(op->loc.line == 13);
    }
  CHECK(count(comm, CollectiveKind::AllReduceMax) == 1); // max's
  CHECK(count(comm, CollectiveKind::AllReduceSum) == 1); // layer_norm's
  // cumsum's shard totals, and softmax's per-row (max, sum of exp) of every block, two doubles
  // per row of [batch/2, d_model] from each of the 4 ranks: one collective, not a max then a sum.
  CHECK(count(comm, CollectiveKind::AllGather) == 2);
  int softmaxGathers = 0;
  for (const SpmdOp* op : comm)
    if (op->collective.kind == CollectiveKind::AllGather && op->note.find("softmax") == 0) {
      ++softmaxGathers;
      CHECK(op->collective.bytes == 4 * 32 * 2 * 8 * 4);
    }
  CHECK(softmaxGathers == 1);
  CHECK(comm.size() == 5);
}

TEST_CASE("lowering: argmax over a split dim is two all-reduces of the result, not an "
          "all-gather; rounding, clip and i32 math need no communication",
          "[lowering]") {
  Layout layout;
  layout.axes["seq"] = {"model"};
  layout.axes["batch"] = {"data"};
  Lowered l(R"(
program p(x: f32[batch, seq, d_model], n: i32[batch, seq])
    -> (i: i32[batch, d_model], j: i32[batch, d_model], y: f32[batch, seq, d_model],
        r: i32[batch, seq]) {
  i = argmax(x, seq)
  j = argmin(x, seq)
  y = clip(round(x), -1.0, 1.0) + floor(x) * ceil(x)
  r = n % 3 + floordiv(n, 2)
})",
            "p", meshOf({{"data", 2}, {"model", 4}}), layout);
  REQUIRE(l.spmd);
  std::vector<const SpmdOp*> comm = collectives(*l.spmd);
  // Each: the extremes (max or min) over the shards, then the first position holding one (min).
  CHECK(count(comm, CollectiveKind::AllReduceMax) == 1);
  CHECK(count(comm, CollectiveKind::AllReduceMin) == 3);
  CHECK(comm.size() == 4);
  for (const SpmdOp* op : comm) {
    CHECK(op->collective.axes == AxisList{"model"});
    CHECK(op->collective.bytes == 4 * 32 * 4); // [batch/2, d_model] of f32 or i32
    CHECK((op->loc.line == 13 || op->loc.line == 14));
  }
}

TEST_CASE("lowering: top_k along a split dim all-gathers the rows first", "[lowering]") {
  Layout layout;
  layout.axes["seq"] = {"model"};
  layout.axes["batch"] = {"data"};
  Lowered l(R"(
dim best = 4
program p(x: f32[batch, seq, d_model]) -> (i: i32[batch, best, d_model], v: f32[batch, seq, best]) {
  i = top_k_indices(x, seq -> best)
  v = top_k_values(x, d_model -> best)
})",
            "p", meshOf({{"data", 2}, {"model", 4}}), layout);
  REQUIRE(l.spmd);
  std::vector<const SpmdOp*> comm = collectives(*l.spmd);
  // Along seq (split): x's rows gathered over model. Along d_model (whole): nothing.
  REQUIRE(comm.size() == 1);
  CHECK(comm[0]->collective.kind == CollectiveKind::AllGather);
  CHECK(comm[0]->collective.axes == AxisList{"model"});
  CHECK(comm[0]->collective.dim == "seq");
}

TEST_CASE("lowering: random_permutation of a split dim sorts whole keys on every rank",
          "[lowering]") {
  Layout layout;
  layout.axes["seq"] = {"model"};
  Lowered l(R"(
program p() -> (perm: i32[seq]) {
  perm = random_permutation(seq)
})",
            "p", meshOf({{"data", 2}, {"model", 4}}), layout);
  REQUIRE(l.spmd);
  int selections = 0;
  for (const SpmdOp& op : l.spmd->ops)
    if (op.kind == SpmdOp::Kind::Compute && op.computeKind == ir::OpKind::TopK) {
      ++selections;
      CHECK(l.spmd->values[op.operands[0]].layout.dimAxes == std::vector<AxisList>{{}});
      CHECK(l.spmd->values[op.result].layout.dimAxes == std::vector<AxisList>{{}});
    }
  CHECK(selections == 1);
}

TEST_CASE("lowering: scatter_add into a split vocab is local, then one lazy all-reduce",
          "[lowering]") {
  Layout layout;
  layout.axes["vocab"] = {"model"};
  layout.axes["batch"] = {"data"};
  Lowered l(R"(
program p(g: f32[batch, seq, d_model], ids: i32[batch, seq]) -> (t: f32[vocab, d_model]) {
  t = scatter_add(g, ids, vocab)
})",
            "p", meshOf({{"data", 2}, {"model", 4}}), layout);
  REQUIRE(l.spmd);
  std::vector<const SpmdOp*> comm = collectives(*l.spmd);
  // Each rank adds its batch rows into its vocab block: partial over data, resolved once.
  REQUIRE(comm.size() == 1);
  CHECK(comm[0]->collective.kind == CollectiveKind::AllReduceSum);
  CHECK(comm[0]->collective.axes == AxisList{"data"});
}

TEST_CASE("lowering: forced replications are reported with their location", "[lowering]") {
  Analyzed a(examplePath("transformer.mesh"), true);
  REQUIRE(a.module);
  Layout layout;
  layout.axes["d_model"] = {"model"};
  layout.axes["heads"] = {"model"};
  std::optional<SpmdFunction> fn =
      lowerToSpmd(*a.module, a.fn("lm"), meshOf({{"model", 4}}), layout, machine("8xh200"), a.diag);
  REQUIRE(fn);
  auto found =
      std::find_if(fn->replications.begin(), fn->replications.end(), [](const Replication& r) {
        return r.dim == "heads" && r.loc.file == "layers.mesh" && r.loc.line == 31;
      });
  REQUIRE(found != fn->replications.end());
  CHECK(found->droppedAxes == AxisList{"model"});
  CHECK(found->reason.find("mesh axis model already splits") == 0);
}

TEST_CASE("lowering: a split that does not divide is a located error", "[lowering]") {
  Analyzed a(examplePath("transformer.mesh"), true);
  REQUIRE(a.module);
  Layout layout = pinnedLayout(*a.module);
  std::optional<SpmdFunction> fn = lowerToSpmd(
      *a.module, a.fn("lm"), meshOf({{"data", 2}, {"model", 3}}), layout, machine("cpu"), a.diag);
  CHECK_FALSE(fn);
  std::string errors = a.takeErrors();
  CHECK(errors.find("transformer.mesh:16:") != std::string::npos);
  CHECK(errors.find("error: dim 'heads' of size 4 is not divisible by 3 (axes model)") !=
        std::string::npos);
  // The evaluator says +infinity instead.
  PlanEvaluator evaluator(*a.module, a.fn("lm"), meshOf({{"data", 2}, {"model", 3}}),
                          machine("cpu"));
  CHECK(std::isinf(evaluator.stepSeconds(layout)));

  Layout unknown;
  unknown.axes["batch"] = {"rows"};
  CHECK_FALSE(
      lowerToSpmd(*a.module, a.fn("lm"), meshOf({{"data", 2}}), unknown, machine("cpu"), a.diag));
  CHECK(a.takeErrors().find("error: unknown mesh axis 'rows'") != std::string::npos);
}

TEST_CASE("Megatron rediscovered: 2 partial sums resolved per layer on [model=4]", "[megatron]") {
  Analyzed a(examplePath("transformer.mesh"), true);
  REQUIRE(a.module);
  const ir::Function& lm = a.fn("lm");
  Layout layout;
  layout.axes["heads"] = {"model"};
  layout.axes["d_ff"] = {"model"};
  std::optional<SpmdFunction> fn =
      lowerToSpmd(*a.module, lm, meshOf({{"model", 4}}), layout, machine("8xh200"), a.diag);
  REQUIRE(fn);
  CHECK(fn->replications.empty());
  auto perLayer = collectivesPerLayer(lm, *fn, 2);
  for (const auto& all : perLayer) {
    std::vector<const SpmdOp*> layer = resolving(all);
    REQUIRE(layer.size() == 2);
    // Sequence parallelism (SequenceParallel.h): the row-wise adds and norms between them run
    // on a quarter of the rows, so the partial sums are reduce-scattered, not all-reduced.
    CHECK(count(layer, CollectiveKind::ReduceScatter) == 2);
    // One after the attention output projection, one after the FFN's second matmul.
    CHECK(layer[0]->loc.line == 21); // h = x + attention(...)  (transformer.mesh:21)
    CHECK(layer[1]->loc.line == 55); // einsum(...) + b_out     (layers.mesh:55)
    for (const SpmdOp* op : all)
      CHECK(op->collective.axes == AxisList{"model"});
  }
  // Nothing else resolves a partial sum (vocab replicated); the all-gathers bring the rows back
  // for the einsums reading a norm: both FFNs', the second attention's and the unembedding's
  // (the first attention reads the replicated embedding's norm).
  CHECK(resolving(collectives(*fn)).size() == 4);
  CHECK(count(collectives(*fn), CollectiveKind::AllGather) == 4);
}

TEST_CASE("Mesh-TensorFlow's layout on [data=2, model=4]", "[megatron]") {
  Analyzed a(examplePath("transformer.mesh"), true);
  REQUIRE(a.module);
  const ir::Function& lm = a.fn("lm");
  Layout layout = pinnedLayout(*a.module); // batch:data, heads:model, d_ff:model, vocab:model
  CHECK(layout.of("vocab") == AxisList{"model"});
  std::optional<SpmdFunction> fn = lowerToSpmd(*a.module, lm, meshOf({{"data", 2}, {"model", 4}}),
                                               layout, machine("8xh200"), a.diag);
  REQUIRE(fn);
  for (const auto& all : collectivesPerLayer(lm, *fn, 2)) {
    std::vector<const SpmdOp*> layer = resolving(all);
    REQUIRE(layer.size() == 2);
    CHECK(count(layer, CollectiveKind::ReduceScatter) == 2); // sequence parallelism
    for (const SpmdOp* op : all) {
      CHECK(op->collective.axes == AxisList{"model"});
      CHECK(op->collective.bytes == 2 * 32 * 64 * 4); // [batch/2, seq, d_model] in f32
      // batch/2 does not divide by 4: the rows split are the sequence's.
      CHECK(op->collective.dim == "seq");
    }
  }
  // Outside the layers: the embedding's one_hot x table over the split vocab is a partial sum,
  // resolved for the position embedding's add; the logits stay split over vocab.
  CHECK(resolving(collectives(*fn)).size() == 5);
  CHECK(fn->values[fn->outputs[0].second].localType.dims[0].size == 2);
  CHECK(fn->values[fn->outputs[0].second].localType.dims[2].size == 24);
}

TEST_CASE("pure data parallel on [data=8]: no forward collective", "[megatron]") {
  // layers.mesh fixes batch = 4, so the same layers with batch = 8.
  std::string text = R"(
mesh m[data = 8]
dim batch = 8
dim seq = 16
dim d_model = 32
dim d_ff = 64
dim vocab = 16
def layer(x: f32[batch, seq, d_model]) -> f32[batch, seq, d_model] {
  param w_in: f32[d_model, d_ff] = normal()
  param w_out: f32[d_ff, d_model] = normal()
  let h = layer_norm(x, d_model)
  return x + einsum(gelu(einsum(h, w_in -> batch, seq, d_ff)), w_out -> batch, seq, d_model)
}
def net(tokens: i32[batch, seq]) -> f32[batch, seq, vocab] {
  param embed: f32[vocab, d_model] = normal()
  let x = einsum(one_hot(tokens, vocab), embed -> batch, seq, d_model)
  repeat 3 {
    x = layer(x)
  }
  return log_softmax(einsum(x, embed -> batch, seq, vocab), vocab)
}
program lm(tokens: i32[batch, seq]) -> (logp: f32[batch, seq, vocab]) {
  logp = net(tokens)
}
train step(tokens: i32[batch, seq]) {
  let loss = -mean(net(tokens) * one_hot(shift(tokens, seq, by = -1), vocab))
  minimize loss with adamw(lr = 1e-3)
}
)";
  Analyzed a(text);
  REQUIRE(a.module);
  Layout layout;
  layout.axes["batch"] = {"data"};
  Mesh mesh = meshOf({{"data", 8}});
  std::optional<SpmdFunction> program =
      lowerToSpmd(*a.module, a.fn("lm"), mesh, layout, machine("8xh200"), a.diag);
  REQUIRE(program);
  CHECK(collectives(*program).empty());
  CHECK(program->gradientOps.empty());
  CHECK_FALSE(program->summary.includesBackward);

  // Training: the loss's mean over the split batch is a partial sum resolved by one scalar
  // all-reduce (counted as a forward collective); every weight's gradient is all-reduced.
  std::optional<SpmdFunction> train =
      lowerToSpmd(*a.module, a.fn("step"), mesh, layout, machine("8xh200"), a.diag);
  REQUIRE(train);
  std::vector<const SpmdOp*> comm = collectives(*train);
  REQUIRE(comm.size() == 1);
  CHECK(comm[0]->collective.kind == CollectiveKind::AllReduceSum);
  CHECK(comm[0]->collective.bytes == 4);
  // The gradients of embed and 3 x (w_in, w_out), all partial over data: one fused all-reduce.
  REQUIRE(train->gradientOps.size() == 1);
  CHECK(train->gradientOps[0].collective.axes == AxisList{"data"});
  CHECK(train->gradientOps[0].collective.bytes == train->memory.paramBytes);
  CHECK(train->gradientOps[0].note.find("gradients of 7 params (net/embed, ") == 0);
  CHECK(train->summary.includesBackward);
  CHECK(train->memory.gradientBytes == train->memory.paramBytes);
  CHECK(train->memory.optimizerBytes == 2 * train->memory.paramBytes);
  CHECK(train->summary.totalFlops > 3 * program->summary.totalFlops * 0.9);
}

TEST_CASE("PlanEvaluator agrees with lowerToSpmd on every example", "[evaluator]") {
  for (const char* name :
       {"mlp.mesh", "transformer.mesh", "performer.mesh", "moe.mesh", "bert.mesh", "vit.mesh"}) {
    Analyzed a(examplePath(name), true);
    REQUIRE(a.module);
    Mesh mesh;
    mesh.axes = a.module->mesh;
    Layout layout = pinnedLayout(*a.module);
    for (const char* machineName : {"cpu", "8xh200", "tpuv2-pod"}) {
      Machine m = machine(machineName);
      for (const ir::Function& fn : a.module->functions) {
        CAPTURE(name, machineName, fn.name);
        std::optional<SpmdFunction> spmd = lowerToSpmd(*a.module, fn, mesh, layout, m, a.diag);
        INFO(a.takeErrors());
        REQUIRE(spmd);
        PlanEvaluator evaluator(*a.module, fn, mesh, m);
        CHECK(evaluator.stepSeconds(layout) == Approx(spmd->summary.stepSeconds));
        MemoryEstimate memory = evaluator.memory(layout);
        CHECK(memory.total() == Approx(spmd->memory.total()));
        CHECK(memory.peakActivationBytes == Approx(spmd->memory.peakActivationBytes));
        CHECK(spmd->summary.utilization > 0);
        CHECK(spmd->summary.utilization <= 1.0);
        // The bound never exceeds the true cost, with nothing or everything assigned.
        CHECK(evaluator.lowerBound(Layout{}, {}) <= spmd->summary.stepSeconds * (1 + 1e-9));
        CHECK(evaluator.lowerBound(layout, evaluator.relevantDims()) <=
              spmd->summary.stepSeconds * (1 + 1e-9));
        // Evaluating again (memoized) and another layout and back gives the same numbers.
        CHECK(evaluator.stepSeconds(Layout{}) > 0);
        CHECK(evaluator.stepSeconds(layout) == Approx(spmd->summary.stepSeconds));
        // With a cutoff the search does not need met, the answer is the exact time or a lower
        // bound above the cutoff; one above the exact time is the exact time.
        double exact = evaluator.stepSeconds(layout);
        for (double cutoff : {0.0, 0.5 * exact, exact * (1 - 1e-9), 2 * exact}) {
          PlanEvaluator fresh(*a.module, fn, mesh, m);
          double seconds = fresh.stepSeconds(layout, cutoff);
          CAPTURE(cutoff, seconds, exact);
          CHECK((seconds == Approx(exact).epsilon(1e-12) ||
                 (seconds > cutoff && seconds <= exact * (1 + 1e-12))));
          if (cutoff >= exact) CHECK(seconds == Approx(exact).epsilon(1e-12));
          // Asked again without a cutoff, the same evaluator gives the exact time.
          CHECK(fresh.stepSeconds(layout) == Approx(exact).epsilon(1e-12));
          CHECK(fresh.memory(layout).total() == Approx(spmd->memory.total()));
        }
        // Under a cutoff of zero the plan is not lowered: the bound is at most the exact time
        // and at least what the merged plan's all-reduces pay in latency besides the rest.
        PlanEvaluator fresh(*a.module, fn, mesh, m);
        double bound = fresh.stepSeconds(layout, 0);
        CHECK(bound <= exact * (1 + 1e-12));
      }
    }
  }
}

TEST_CASE("AllReduceChains: dependent all-reduces on one group pay their latency each",
          "[evaluator]") {
  Mesh mesh = meshOf({{"data", 2}, {"model", 4}});
  Machine m = machine("8xh100");
  auto allReduce = [&](AxisList axes) {
    ReshardPath path;
    ReshardStep step;
    step.collective.kind = CollectiveKind::AllReduceSum;
    step.collective.axes = std::move(axes);
    step.collective.bytes = 1024;
    step.collective.groupSize = splitFactor(mesh, step.collective.axes);
    path.steps.push_back(step);
    return path;
  };
  // The paths outlive the chains, as the planner's memoized ones do.
  ReshardPath overModel = allReduce({"model"}), overData = allReduce({"data"});
  double model = mergeableLatencySeconds(m, mesh, overModel.steps[0].collective);
  double data = mergeableLatencySeconds(m, mesh, overData.steps[0].collective);
  REQUIRE(model > 0);
  REQUIRE(data > 0);
  // Values 0..5: %1 = op(%0 resolved over model); %2 = op(%1 resolved over model, %0 resolved
  // over data); %3 = op(%0 resolved over model) is independent of %1: it may merge with it.
  AllReduceChains chains(m, mesh, 6);
  chains.write(0);
  chains.read(0, chains.groupsOf(overModel));
  chains.write(1);
  chains.read(1, chains.groupsOf(overModel));
  chains.read(0, chains.groupsOf(overData));
  chains.write(2);
  CHECK(chains.latencySeconds() == Approx(2 * model + data));
  chains.read(0, chains.groupsOf(overModel));
  chains.write(3);
  CHECK(chains.latencySeconds() == Approx(2 * model + data));
  // Through an op that communicates nothing, the chain goes on: a third link.
  chains.read(2, 0);
  chains.write(4);
  chains.read(4, chains.groupsOf(overModel));
  chains.write(5);
  CHECK(chains.latencySeconds() == Approx(3 * model + data));
  chains.reset();
  CHECK(chains.latencySeconds() == 0);
}

TEST_CASE("PlanEvaluator: relevant dims, and identical layers memoized", "[evaluator]") {
  Analyzed a(examplePath("transformer.mesh"), true);
  REQUIRE(a.module);
  Mesh mesh = meshOf({{"data", 2}, {"model", 4}});
  Machine m = machine("8xh200");
  PlanEvaluator evaluator(*a.module, a.fn("lm"), mesh, m);
  std::vector<std::string> dims = evaluator.relevantDims();
  for (const char* dim : {"batch", "seq", "mem", "d_model", "heads", "d_head", "d_ff", "vocab"})
    CHECK(std::find(dims.begin(), dims.end(), dim) != dims.end());
  CHECK(std::find(dims.begin(), dims.end(), "layers") == dims.end()); // never a value's dim
  // Every layout of the search space agrees with the lowering (a few, including illegal ones).
  for (const AxisList& heads : std::vector<AxisList>{{}, {"model"}, {"data"}, {"model", "data"}})
    for (const AxisList& batch : std::vector<AxisList>{{}, {"data"}, {"model"}}) {
      Layout layout;
      layout.axes["heads"] = heads;
      layout.axes["batch"] = batch;
      layout.axes["d_ff"] = {"model"};
      std::optional<SpmdFunction> spmd =
          lowerToSpmd(*a.module, a.fn("lm"), mesh, layout, m, a.diag);
      CAPTURE(layoutString(layout));
      if (!spmd) {
        CHECK(std::isinf(evaluator.stepSeconds(layout)));
        continue;
      }
      CHECK(evaluator.stepSeconds(layout) == Approx(spmd->summary.stepSeconds));
      CHECK(evaluator.lowerBound(layout, {"heads", "batch"}) <=
            spmd->summary.stepSeconds * (1 + 1e-9));
    }
  a.takeErrors();
}

TEST_CASE("lowering: reshape carries a major-most split, slice gathers its dim", "[lowering]") {
  Layout layout;
  layout.axes["d_model"] = {"model"};
  layout.axes["batch"] = {"data"};
  layout.axes["seq"] = {"model"};
  Lowered l(R"(
dim two = 2
program p(x: f32[batch, d_model]) -> (y: f32[batch, seq, two], z: f32[batch, seq]) {
  y = reshape(x, d_model -> seq, two)
  z = slice(x, d_model -> seq, start = 4)
})",
            "p", meshOf({{"data", 2}, {"model", 4}}), layout);
  REQUIRE(l.spmd);
  const SpmdFunction& fn = *l.spmd;
  // The reshape: d_model's split over model carries to seq (16 divisible by 4): no collective.
  // The slice: d_model is gathered whole first, and the plan says so.
  std::vector<const SpmdOp*> comm = collectives(fn);
  REQUIRE(comm.size() == 1);
  CHECK(comm[0]->collective.kind == CollectiveKind::AllGather);
  CHECK(comm[0]->collective.dim == "d_model");
  CHECK(comm[0]->loc.line == 13);
  REQUIRE(fn.replications.size() == 1);
  CHECK(fn.replications[0].dim == "d_model");
  CHECK(fn.replications[0].loc.line == 13);
  CHECK(fn.replications[0].reason.find("slice over a split dim gathers it whole") == 0);
  const SpmdValue& y = fn.values[fn.outputs[0].second];
  CHECK(y.layout.dimAxes == std::vector<AxisList>{{"data"}, {"model"}, {}});
}

TEST_CASE("lowering: a partial operand stays lazy through an einsum and a reduction",
          "[lowering]") {
  Layout layout;
  layout.axes["d_ff"] = {"model"};
  layout.axes["batch"] = {"data"};
  Lowered l(R"(
program p(x: f32[batch, d_ff], v: f32[d_model, seq]) -> (y: f32[seq]) {
  param w: f32[d_ff, d_model] = normal()
  let h = einsum(x, w -> batch, d_model)
  y = mean(einsum(h, v -> batch, seq), batch)
})",
            "p", meshOf({{"data", 2}, {"model", 4}}), layout);
  REQUIRE(l.spmd);
  // h is partial over model, the second einsum keeps it, the mean over the split batch adds
  // data: one all-reduce over both axes, for the output.
  std::vector<const SpmdOp*> comm = collectives(*l.spmd);
  REQUIRE(comm.size() == 1);
  CHECK(comm[0]->collective.kind == CollectiveKind::AllReduceSum);
  CHECK(comm[0]->collective.axes == AxisList{"data", "model"});
  CHECK(comm[0]->collective.bytes == 16 * 4);
}

TEST_CASE("lowering and evaluator agree on random layouts of every example", "[evaluator]") {
  std::mt19937 random(7);
  for (const char* name :
       {"mlp.mesh", "transformer.mesh", "performer.mesh", "moe.mesh", "bert.mesh", "vit.mesh"}) {
    Analyzed a(examplePath(name), true);
    REQUIRE(a.module);
    for (const Mesh& mesh :
         {meshOf({{"x", 4}}), meshOf({{"x", 2}, {"y", 2}}), meshOf({{"x", 2}, {"y", 4}})}) {
      std::vector<AxisList> options = {{}};
      for (const ir::MeshAxis& axis : mesh.axes)
        options.push_back({axis.name});
      if (mesh.axes.size() == 2) {
        options.push_back({mesh.axes[0].name, mesh.axes[1].name});
        options.push_back({mesh.axes[1].name, mesh.axes[0].name});
      }
      Machine m = machine("h100-cluster");
      std::vector<std::string> allDims;
      for (const auto& [dim, size] : a.module->dims)
        allDims.push_back(dim);
      for (const ir::Function& fn : a.module->functions) {
        PlanEvaluator evaluator(*a.module, fn, mesh, m);
        for (int trial = 0; trial < 12; ++trial) {
          Layout layout;
          for (const std::string& dim : evaluator.relevantDims())
            layout.axes[dim] = options[random() % options.size()];
          CAPTURE(name, fn.name, layoutString(layout));
          std::optional<SpmdFunction> spmd = lowerToSpmd(*a.module, fn, mesh, layout, m, a.diag);
          std::string errors = a.takeErrors();
          a.errors.clear();
          if (!spmd) {
            CHECK(errors.find("is not divisible by") != std::string::npos);
            CHECK(std::isinf(evaluator.stepSeconds(layout)));
            continue;
          }
          CHECK(evaluator.stepSeconds(layout) == Approx(spmd->summary.stepSeconds));
          CHECK(evaluator.memory(layout).total() == Approx(spmd->memory.total()));
          CHECK(evaluator.lowerBound(layout, evaluator.relevantDims()) <=
                spmd->summary.stepSeconds * (1 + 1e-9));
          CHECK(evaluator.lowerBound(Layout{}, {}) <= spmd->summary.stepSeconds * (1 + 1e-9));
          // With every dim assigned, a program's bound is its exact cost.
          if (fn.kind == ir::Function::Kind::Program)
            CHECK(evaluator.lowerBound(layout, allDims) == Approx(spmd->summary.stepSeconds));
          // A bound from some dims never exceeds any completion's cost.
          std::vector<std::string> some;
          for (const std::string& dim : evaluator.relevantDims())
            if (random() % 2) some.push_back(dim);
          double bound = evaluator.lowerBound(layout, some);
          for (int completion = 0; completion < 3; ++completion) {
            Layout other = layout;
            for (const std::string& dim : evaluator.relevantDims())
              if (std::find(some.begin(), some.end(), dim) == some.end())
                other.axes[dim] = options[random() % options.size()];
            CHECK(bound <= evaluator.stepSeconds(other) * (1 + 1e-9));
          }
          // Every value's layout is legal and its local type matches.
          for (const SpmdValue& value : spmd->values) {
            CHECK(isLegalLayout(value.globalType, value.layout, mesh));
            CHECK(value.localType == localType(value.globalType, value.layout, mesh));
          }
        }
      }
    }
  }
}

// Debugging aid (hidden): `test_planner_core "[.dump]"` prints a plan in a rough text form.
TEST_CASE("dump", "[.dump]") {
  const char* file = std::getenv("DUMP_FILE");
  const char* function = std::getenv("DUMP_FUNCTION");
  Analyzed a(examplePath(file ? file : "transformer.mesh"), true);
  REQUIRE(a.module);
  Mesh mesh;
  mesh.axes = a.module->mesh;
  std::optional<SpmdFunction> fn = lowerToSpmd(*a.module, a.fn(function ? function : "lm"), mesh,
                                               pinnedLayout(*a.module), machine("8xh200"), a.diag);
  INFO(a.takeErrors());
  REQUIRE(fn);
  for (const SpmdOp& op : fn->ops) {
    const SpmdValue& v = fn->values[op.result];
    if (op.kind == SpmdOp::Kind::Compute)
      fmt::print("%{} = {} {} {:.3g}s  {}\n", op.result, ir::opSpelling(op.computeKind),
                 tensorLayoutString(v.globalType, v.layout), op.seconds, op.note);
    else
      fmt::print("  %{} = {}({}) dim={} to={} bytes={} {:.3g}s  {}:{}  {}\n", op.result,
                 collectiveName(op.collective.kind), fmt::join(op.collective.axes, ","),
                 op.collective.dim, op.collective.toDim, op.collective.bytes, op.seconds,
                 op.loc.file, op.loc.line, op.note);
  }
  for (const SpmdOp& op : fn->gradientOps)
    fmt::print("  grad {}({}) bytes={} {:.3g}s {}\n", collectiveName(op.collective.kind),
               fmt::join(op.collective.axes, ","), op.collective.bytes, op.seconds, op.note);
  for (const Replication& r : fn->replications)
    fmt::print("replication {}:{}:{} {} {}\n", r.loc.file, r.loc.line, r.loc.col, r.dim, r.reason);
  fmt::print("compute {:.4g} comm {:.4g} step {:.4g} flops {:.4g} util {:.3f}\n",
             fn->summary.computeSeconds, fn->summary.communicationSeconds, fn->summary.stepSeconds,
             fn->summary.totalFlops, fn->summary.utilization);
  fmt::print("memory params {} opt {} grad {} act {}\n", fn->memory.paramBytes,
             fn->memory.optimizerBytes, fn->memory.gradientBytes, fn->memory.peakActivationBytes);
}

// Mesh-TensorFlow's largest language model (d_model 1024, d_ff 262144, 256 heads of 128, batch
// 256, 7 layers: 4.76B parameters) on the TPUv2-like pod with mesh batch:16 x model:32. The paper
// reports about 50% utilization; the roofline, which runs every matmul at peak, predicts more.
TEST_CASE("Mesh-TensorFlow's 4.9B-parameter LM on the TPUv2-like pod", "[megatron]") {
  std::string text = R"(
mesh pod[rows = 16, cols = 32]
dim batch = 256
dim seq = 256
dim mem = 256
dim d_model = 1024
dim heads = 256
dim d_head = 128
dim d_ff = 262144
dim vocab = 32768
dim layers = 7
layout batch: rows, heads: cols, d_ff: cols, vocab: cols
def norm(x: bf16[batch, seq, d_model]) -> bf16[batch, seq, d_model] {
  param gain: bf16[d_model] = ones()
  return layer_norm(x, d_model) * gain
}
def layer(x: bf16[batch, seq, d_model]) -> bf16[batch, seq, d_model] {
  param w_q: bf16[d_model, heads, d_head] = normal()
  param w_k: bf16[d_model, heads, d_head] = normal()
  param w_v: bf16[d_model, heads, d_head] = normal()
  param w_o: bf16[heads, d_head, d_model] = normal()
  param w_in: bf16[d_model, d_ff] = normal()
  param w_out: bf16[d_ff, d_model] = normal()
  let n = norm(x)
  let q = einsum(n, w_q -> batch, seq, heads, d_head)
  let k = rename(einsum(n, w_k -> batch, seq, heads, d_head), seq -> mem)
  let v = rename(einsum(n, w_v -> batch, seq, heads, d_head), seq -> mem)
  let w = softmax(einsum(q, k -> batch, heads, seq, mem), mem)
  let h = x + einsum(einsum(w, v -> batch, seq, heads, d_head), w_o -> batch, seq, d_model)
  return h + einsum(relu(einsum(norm(h), w_in -> batch, seq, d_ff)), w_out -> batch, seq, d_model)
}
train lm(tokens: i32[batch, seq]) {
  param emb: bf16[vocab, d_model] = normal()
  param unemb: bf16[d_model, vocab] = normal()
  let x = einsum(one_hot(tokens, vocab, dtype = bf16), emb -> batch, seq, d_model)
  repeat layers {
    x = layer(x)
  }
  let logits = cast(einsum(norm(x), unemb -> batch, seq, vocab), f32)
  let loss = -mean(log_softmax(logits, vocab) * one_hot(tokens, vocab))
  minimize loss with adafactor(lr = 1e-2)
}
)";
  Analyzed a(text);
  INFO(a.takeErrors());
  REQUIRE(a.module);
  Mesh mesh;
  mesh.axes = a.module->mesh;
  std::optional<SpmdFunction> fn = lowerToSpmd(*a.module, a.fn("lm"), mesh, pinnedLayout(*a.module),
                                               machine("tpuv2-pod"), a.diag);
  REQUIRE(fn);
  double params = 0;
  for (const ir::ParamInfo& p : a.fn("lm").params)
    params += static_cast<double>(p.type.numElements());
  CHECK(params == Approx(4.76e9).epsilon(0.01));
  // Per layer: the two Megatron all-reduces over cols (the residual stream stays a lazy partial
  // sum through the adds and is resolved for the next layer_norm), 16 x 256 x 1024 bf16 each.
  int allReduces = 0;
  for (const SpmdOp* op : collectives(*fn)) {
    if (op->collective.kind != CollectiveKind::AllReduceSum || op->collective.axes.size() != 1 ||
        op->collective.axes[0] != "cols" || op->note.find("resolve the partial sum") != 0)
      continue;
    ++allReduces;
    CHECK(op->collective.bytes == 16 * 256 * 1024 * 2);
  }
  CHECK(allReduces == 2 * 7 + 1); // + the final norm's
  CHECK(fn->memory.total() < machine("tpuv2-pod").memoryBytes);
  CHECK(fn->summary.utilization > 0.5);
  CHECK(fn->summary.utilization < 0.9);
  INFO(fmt::format("compute {:.4g} s, comm {:.4g} s, step {:.4g} s, utilization {:.3f}",
                   fn->summary.computeSeconds, fn->summary.communicationSeconds,
                   fn->summary.stepSeconds, fn->summary.utilization));
  CHECK(fn->summary.communicationSeconds < 0.2 * fn->summary.computeSeconds);
}
