// The layout search's evaluator keeps memo tables across the layouts it costs (each op's plan by
// its key and its last key, reshard paths, the bound's levels, the shared partial sums'
// choices): a walk over a neighbouring layout reuses them. They must never change a result, so
// one evaluator walked over a random sequence of neighbouring layouts must give, for every
// layout, exactly what a fresh evaluator gives (step time with and without a cutoff, memory,
// lower bounds of partial layouts), and what the lowering's own summary says. On the 48-layer
// transformer train block (all layers alike) and on T5 and XLNet (encoder and decoder layers,
// relative attention: layers that are not all alike), and on a machine of several nodes, where a
// collective's latency depends on its axes (the reshard memo keeps each step's). The shared
// evaluator also replays copies of repeated segments (a layer, its backward, its updates) from
// memoized walks; the fresh ones walk every op (setReplaySegments(false)).
#include "CompiledSource.h"
#include "planner/InternCache.h"
#include "planner/LayoutSearch.h"
#include "planner/RepeatedSegments.h"
#include "planner/ReshardMemo.h"
#include "train/Optimizer.h"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <random>

using namespace meshc;
using namespace meshc::plan;

namespace {

struct Case {
  std::string file, function;
  std::map<std::string, int64_t> dims;
  std::vector<ir::MeshAxis> mesh;
  std::string machine = "8xh100";
};

Machine machine(const std::string& name) {
  llvm::Expected<Machine> loaded = loadMachine(name);
  REQUIRE(static_cast<bool>(loaded));
  return std::move(*loaded);
}

/// Equal as the search compares them: bit for bit (both infinite counts as equal).
bool same(double a, double b) {
  return a == b || (std::isinf(a) && std::isinf(b));
}

/// Every dim's size: the module's, and those of the function's values.
std::map<std::string, int64_t> dimSizes(const ir::Module& module, const ir::Function& fn) {
  std::map<std::string, int64_t> sizes(module.dims.begin(), module.dims.end());
  for (const ir::Value& value : fn.values)
    for (const ir::Dim& dim : value.type.dims)
      sizes[dim.name] = dim.size;
  return sizes;
}

void checkAgainstFreshEvaluators(const Case& c, size_t steps) {
  SemaOptions options;
  options.dimSizes = c.dims;
  options.mesh = c.mesh;
  options.layout = "auto";
  testing::CompiledSource compiled(std::string(MESHC_SOURCE_DIR) + "/dsl-examples/" + c.file,
                                   options);
  INFO(compiled.errors);
  REQUIRE(compiled.module);
  ir::Function* fn = nullptr;
  for (ir::Function& f : compiled.module->functions)
    if (f.name == c.function) fn = &f;
  REQUIRE(fn);
  REQUIRE(train::lowerTraining(*fn, compiled.diag));
  REQUIRE_FALSE(fn->updates.empty());
  Mesh mesh;
  mesh.axes = c.mesh;
  Machine h100 = machine(c.machine);

  PlanEvaluator shared(*compiled.module, *fn, mesh, h100);
  std::vector<std::string> dims = shared.relevantDims();
  std::map<std::string, int64_t> sizes = dimSizes(*compiled.module, *fn);
  // A random walk: each step moves one or two dims to another option, as the search's descent
  // and its branch and bound do; illegal layouts (an axis twice in a tensor) included.
  std::mt19937 rng(20261202);
  Layout layout;
  size_t compared = 0, finite = 0;
  for (size_t step = 0; step < steps; ++step) {
    // (A new layout each step: asked the layout it costed last, an evaluator reuses that.)
    Layout previous = layout;
    for (int moves = 1 + static_cast<int>(rng() % 2); moves > 0 || layout == previous; --moves) {
      const std::string& dim = dims[rng() % dims.size()];
      std::vector<AxisList> choices = layoutOptions(sizes[dim], mesh);
      AxisList axes = choices[rng() % choices.size()];
      if (axes.empty())
        layout.axes.erase(dim);
      else
        layout.axes[dim] = axes;
    }
    std::string text;
    for (const auto& [dim, axes] : layout.axes)
      text += fmt::format("{}: [{}] ", dim, fmt::join(axes, ", "));
    INFO(fmt::format("{} {} step {}: layout {}", c.file, c.function, step, text));
    // First with a cutoff below the cost (as the search asks): a bound above the cutoff, the
    // same from either evaluator. (Asked again, the shared one reuses what it knows of the
    // layout, which may be more: so once per layout, before the exact cost.)
    // Fresh evaluators walk every op; the shared one replays the copies of repeated segments
    // (a layer, its backward, its updates) from memoized walks of copies alike.
    auto freshEvaluator = [&] {
      auto evaluator = std::make_unique<PlanEvaluator>(*compiled.module, *fn, mesh, h100);
      evaluator->setReplaySegments(false);
      return evaluator;
    };
    std::unique_ptr<PlanEvaluator> freshOwner = freshEvaluator();
    PlanEvaluator& fresh = *freshOwner;
    double exact = freshEvaluator()->stepSeconds(layout);
    double cutoff = (step % 2 ? 0.5 : 0.9) * exact;
    double cut = fresh.stepSeconds(layout, cutoff);
    double sharedCut = shared.stepSeconds(layout, cutoff);
    INFO(fmt::format("cutoff {:.17g}: shared {:.17g}, fresh {:.17g}", cutoff, sharedCut, cut));
    CHECK(same(sharedCut, cut));
    if (std::isfinite(exact)) CHECK((cut > cutoff && cut <= exact * (1 + 1e-12)));
    // Asked for a complete walk (as a search without an incumbent asks, its memory next): a
    // bound above the cutoff, never above the cost, and the memory without another walk.
    std::unique_ptr<PlanEvaluator> freshComplete = freshEvaluator();
    double whole = freshComplete->stepSeconds(layout, cutoff, /*complete=*/true);
    CHECK(same(whole, PlanEvaluator(*compiled.module, *fn, mesh, h100)
                          .stepSeconds(layout, cutoff, /*complete=*/true)));
    if (std::isfinite(exact)) {
      CHECK((whole > cutoff && whole <= exact * (1 + 1e-12)));
      CHECK(freshComplete->memory(layout).total() ==
            PlanEvaluator(*compiled.module, *fn, mesh, h100).memory(layout).total());
    } else {
      CHECK(std::isinf(whole));
    }
    double seconds = fresh.stepSeconds(layout);
    CHECK(same(seconds, exact));
    CHECK(same(shared.stepSeconds(layout), seconds));
    if (std::isfinite(seconds)) {
      ++finite;
      CHECK(shared.memory(layout).total() == fresh.memory(layout).total());
      // The plan itself: the lowering's summary and memory.
      DiagEngine& diag = compiled.diag;
      std::optional<SpmdFunction> spmd =
          lowerToSpmd(*compiled.module, *fn, mesh, layout, h100, diag);
      REQUIRE(spmd);
      CHECK(spmd->summary.stepSeconds == seconds);
      CHECK(spmd->memory.total() == shared.memory(layout).total());
      // Lowered by the shared evaluator (as the planner lowers a search's layout): the same.
      std::optional<SpmdFunction> reused = shared.lower(layout, diag);
      REQUIRE(reused);
      CHECK(reused->summary.stepSeconds == spmd->summary.stepSeconds);
      CHECK(reused->memory.total() == spmd->memory.total());
      REQUIRE(reused->ops.size() == spmd->ops.size());
      for (size_t o = 0; o < spmd->ops.size(); ++o) {
        const SpmdOp& a = reused->ops[o];
        const SpmdOp& b = spmd->ops[o];
        CHECK((a.kind == b.kind && a.seconds == b.seconds && a.operands == b.operands &&
               a.collective.kind == b.collective.kind && a.collective.axes == b.collective.axes &&
               a.collective.bytes == b.collective.bytes && a.note == b.note));
      }
    }
    // The bound of a partial layout: the first k relevant dims assigned.
    size_t k = rng() % (dims.size() + 1);
    std::vector<std::string> assigned(dims.begin(), dims.begin() + static_cast<long>(k));
    Layout partial;
    for (const std::string& dim : assigned)
      if (layout.axes.count(dim)) partial.axes[dim] = layout.axes.at(dim);
    double bound = freshEvaluator()->lowerBound(partial, assigned);
    CHECK(same(shared.lowerBound(partial, assigned), bound));
    if (k < dims.size()) { // and stopped early at a cutoff, as the branch and bound asks
      CHECK(same(shared.lowerBound(partial, assigned, bound / 2),
                 freshEvaluator()->lowerBound(partial, assigned, bound / 2)));
      // A walk stopped at a cutoff (by what it summed, plus the rooflines of the known ops it
      // has not walked) cuts exactly where the whole walk does, and stays a lower bound: the
      // branch and bound cuts the same subtrees. Cutoffs on both sides of the bound, and close.
      if (std::isfinite(bound) && bound > 0) {
        for (double factor : {0.3, 0.9, 0.999999, 1.000001, 1.1}) {
          double at = bound * factor;
          double stopped = shared.lowerBound(partial, assigned, at);
          CHECK((stopped > at) == (bound > at));
          CHECK(stopped <= bound * (1 + 1e-12));
        }
      }
    }
    ++compared;
  }
  CHECK(compared == steps);
  CHECK(finite > steps / 4); // the walk costs real layouts, not only illegal ones
}

} // namespace

TEST_CASE("memo tables change nothing: the 48-layer transformer train block on [2, 2]") {
  checkAgainstFreshEvaluators(
      {"transformer.mesh", "lm_train", {{"layers", 48}}, {{"data", 2}, {"model", 2}}}, 24);
}

TEST_CASE("memo tables change nothing: T5's and XLNet's train blocks (unlike layers)") {
  checkAgainstFreshEvaluators({"t5.mesh", "t5_train", {{"layers", 3}}, {{"data", 2}, {"model", 4}}},
                              40);
  checkAgainstFreshEvaluators(
      {"xlnet.mesh", "xlnet_train", {{"layers", 3}}, {{"data", 2}, {"model", 4}}}, 40);
}

TEST_CASE("memo tables change nothing: on nodes of 8 devices, [data=8, model=8] (h100-cluster)") {
  // The `data` axis's groups span nodes, the `model` axis's do not: reshards over one and the
  // other pay different latencies.
  checkAgainstFreshEvaluators({"transformer.mesh",
                               "lm_train",
                               {{"layers", 4}, {"batch", 16}, {"heads", 8}, {"d_head", 8}},
                               {{"data", 8}, {"model", 8}},
                               "h100-cluster"},
                              24);
}

TEST_CASE("lower bounds replay the known ops of repeated layers; walks stop by rooflines") {
  // A partial layout's bound walks the ops it knows (their dims assigned, their operands known):
  // in a deep train block mostly each layer's params and their updates, alike in every layer.
  // Walked once per state of what they read and replayed in the copies alike, they add the same
  // terms in the same order: every bound, whatever its cutoff, is the bits a walk of every op
  // gives, and the same at a cutoff as asked (the branch and bound cuts the same subtrees).
  SemaOptions options;
  options.dimSizes = {{"layers", 6}, {"batch", 16}, {"seq", 64}, {"mem", 64}};
  options.mesh = {{"data", 8}, {"model", 8}};
  options.layout = "auto";
  testing::CompiledSource compiled(std::string(MESHC_SOURCE_DIR) + "/dsl-examples/transformer.mesh",
                                   options);
  INFO(compiled.errors);
  REQUIRE(compiled.module);
  ir::Function* fn = nullptr;
  for (ir::Function& f : compiled.module->functions)
    if (f.name == "lm_train") fn = &f;
  REQUIRE(fn);
  REQUIRE(train::lowerTraining(*fn, compiled.diag));
  Mesh mesh;
  mesh.axes = *options.mesh;
  Machine cluster = machine("h100-cluster"); // `data` spans nodes: chains of two latencies
  PlanEvaluator shared(*compiled.module, *fn, mesh, cluster);
  std::vector<std::string> dims = shared.relevantDims();
  std::map<std::string, int64_t> sizes = dimSizes(*compiled.module, *fn);
  std::mt19937 rng(20261204);
  size_t cut = 0, kept = 0;
  for (int step = 0; step < 60; ++step) {
    // The first k dims assigned, as a level of the branch and bound; k < all (else it is the
    // layout's cost).
    size_t k = 1 + rng() % (dims.size() - 1);
    std::vector<std::string> assigned(dims.begin(), dims.begin() + static_cast<long>(k));
    Layout partial;
    for (const std::string& dim : assigned) {
      std::vector<AxisList> choices = layoutOptions(sizes[dim], mesh);
      AxisList axes = choices[rng() % choices.size()];
      if (!axes.empty()) partial.axes[dim] = axes;
    }
    PlanEvaluator fresh(*compiled.module, *fn, mesh, cluster);
    fresh.setReplaySegments(false);
    double whole = fresh.lowerBound(partial, assigned);
    INFO(fmt::format("step {}: {} dims assigned, bound {:.17g}", step, k, whole));
    CHECK(same(shared.lowerBound(partial, assigned), whole));
    if (!std::isfinite(whole) || whole <= 0) continue;
    for (double factor : {0.3, 0.9, 0.999999, 1.000001, 1.1}) {
      double at = whole * factor;
      double stopped = shared.lowerBound(partial, assigned, at);
      CHECK(same(stopped, fresh.lowerBound(partial, assigned, at)));
      CHECK((stopped > at) == (whole > at));
      (stopped > at ? cut : kept) += 1;
    }
    CHECK(fresh.boundCopiesReplayed() == 0);
  }
  // The layers' known ops were replayed, and the cutoffs cut some bounds and kept others.
  CHECK(shared.boundCopiesReplayed() > 100);
  CHECK(cut > 0);
  CHECK(kept > 0);

  // A whole layout's walk at a cutoff counts the rooflines of the ops it has not walked yet, as
  // the bound does its known ops': it stops sooner, but only where the whole walk passes the
  // cutoff too, with a bound never above the cost (cutoffs on both sides of it, and close).
  size_t stopped = 0, costed = 0;
  for (int step = 0; step < 30; ++step) {
    Layout layout;
    for (const std::string& dim : dims) {
      std::vector<AxisList> choices = layoutOptions(sizes[dim], mesh);
      AxisList axes = choices[rng() % choices.size()];
      if (!axes.empty()) layout.axes[dim] = axes;
    }
    double exact = PlanEvaluator(*compiled.module, *fn, mesh, cluster).stepSeconds(layout);
    INFO(fmt::format("layout {}: {:.17g}", step, exact));
    if (!std::isfinite(exact)) continue;
    for (double factor : {0.5, 0.9, 0.999999, 1.000001, 1.1}) {
      double at = exact * factor;
      PlanEvaluator fresh(*compiled.module, *fn, mesh, cluster);
      fresh.setReplaySegments(false);
      double seconds = fresh.stepSeconds(layout, at);
      CHECK((seconds > at) == (exact > at));
      CHECK(seconds <= exact * (1 + 1e-12));
      // The shared evaluator replays layers (and may reuse its last walk of the layout).
      double replayed = shared.stepSeconds(layout, at);
      CHECK((replayed > at) == (exact > at));
      CHECK(replayed <= exact * (1 + 1e-12));
      (seconds < exact ? stopped : costed) += 1;
    }
  }
  CHECK(stopped > 0);
  CHECK(costed > 0);
}

TEST_CASE("repeated segments: the longest run of copies from each position") {
  // A head, three copies of a 20-op layer (an op kind recurring inside it), a tail; then a run
  // of 4-op copies, too short to memoize.
  std::vector<int> layer;
  for (int i = 0; i < 20; ++i)
    layer.push_back(i % 7 == 3 ? 100 : i);
  std::vector<int> ops = {50, 51};
  for (int copy = 0; copy < 3; ++copy)
    ops.insert(ops.end(), layer.begin(), layer.end());
  ops.push_back(52);
  for (int copy = 0; copy < 5; ++copy)
    ops.insert(ops.end(), {60, 61, 62, 63});
  std::vector<OpSegment> found = findRepeatedSegments(ops, 16);
  REQUIRE(found.size() == 3);
  for (uint32_t copy = 0; copy < 3; ++copy) {
    CHECK(found[copy].begin == 2 + 20 * copy);
    CHECK(found[copy].end == 22 + 20 * copy);
  }
  // Two layers are one copy of a run only when the run of single layers is shorter: the
  // shortest period wins a tie.
  std::vector<int> even(ops.begin() + 2, ops.begin() + 62);
  even.insert(even.end(), layer.begin(), layer.end());
  CHECK(findRepeatedSegments(even, 16).size() == 4);
  CHECK(findRepeatedSegments(ops, 4).size() == 3 + 5);
}

TEST_CASE("reshard memo: shared by equal machines and meshes, never by different ones") {
  // Every evaluator of a process on one machine and mesh shares the reshard paths
  // (ReshardMemo.h); a machine that differs in one number (here the inter-node latency, which
  // the `data` axis's all-reduce pays on h100-cluster) or another mesh gets its own, equal to
  // planReshard's.
  Machine cluster = machine("h100-cluster");
  Mesh mesh{{{"data", 8}, {"model", 8}}};
  ir::TensorType type;
  type.dims = {{"batch", 64}, {"d", 4096}};
  TensorLayout from{{{}, {"model"}}, {"data"}, false}; // a partial sum over `data`
  TensorLayout to{{{}, {"model"}}, {}, false};
  const std::string key = "f32,batch=64,d=4096";
  ReshardMemo first(cluster, mesh);
  Machine copy = cluster;
  ReshardMemo second(copy, mesh);
  const ReshardEntry& entry = first.entry(key, type, from, to);
  REQUIRE(entry.path);
  std::optional<ReshardPath> direct = planReshard(type, from, to, mesh, cluster);
  REQUIRE(direct);
  CHECK(entry.path->seconds == direct->seconds);
  CHECK(entry.path->steps.size() == direct->steps.size());
  CHECK(entry.mergeableSeconds.size() == direct->steps.size());
  CHECK(&second.entry(key, type, from, to) == &entry);

  Machine slower = cluster;
  slower.inter.alphaSeconds *= 10;
  const ReshardEntry& other = ReshardMemo(slower, mesh).entry(key, type, from, to);
  CHECK(&other != &entry);
  REQUIRE(other.path);
  CHECK(other.path->seconds == planReshard(type, from, to, mesh, slower)->seconds);
  CHECK(other.path->seconds > entry.path->seconds);

  Mesh wider{{{"data", 16}, {"model", 4}}};
  const ReshardEntry& elsewhere = ReshardMemo(cluster, wider).entry(key, type, from, to);
  CHECK(&elsewhere != &entry);
  REQUIRE(elsewhere.path);
  CHECK(elsewhere.path->seconds == planReshard(type, from, to, wider, cluster)->seconds);
}

TEST_CASE("intern cache: ids only for items its comparison finds equal, collisions kept apart") {
  // The evaluator interns types and ops by key strings behind this cache (InternCache.h): an
  // item is served an id only when it compares equal to one seen with the same hash, so two
  // items whose hashes collide keep their own ids, and an item unlike every one seen is none's.
  std::vector<std::string> items = {"a", "b", "c"};
  InternCache<size_t> cache;
  auto find = [&](uint64_t hash, const std::string& item) {
    return cache.find(hash, [&](size_t seen) { return items[seen] == item; });
  };
  CHECK(find(7, "a") == -1);
  cache.add(7, 0, 10);
  cache.add(7, 1, 11); // the same hash: a collision
  cache.add(8, 2, 12);
  CHECK(find(7, "a") == 10);
  CHECK(find(7, "b") == 11);
  CHECK(find(7, "c") == -1); // its hash is 8
  CHECK(find(8, "c") == 12);
  CHECK(find(9, "a") == -1);

  // Equal types hash alike. The comparison of attributes is at least as strict as the keys:
  // -0 and 0, which the keys print apart, differ; so do 1 and 1.0, which they print alike (on
  // a miss the key string decides, so stricter is safe).
  ir::TensorType x{ir::DType::F32, {{"batch", 8}, {"d", 16}}};
  ir::TensorType y = x;
  CHECK(typeHash(x) == typeHash(y));
  y.dims[1].size = 32;
  CHECK(typeHash(x) != typeHash(y));
  CHECK(sameAttrValue(ir::AttrValue{0.5}, ir::AttrValue{0.5}));
  CHECK(attrValueHash(ir::AttrValue{0.5}) == attrValueHash(ir::AttrValue{0.5}));
  CHECK_FALSE(sameAttrValue(ir::AttrValue{0.0}, ir::AttrValue{-0.0}));
  CHECK_FALSE(sameAttrValue(ir::AttrValue{int64_t{1}}, ir::AttrValue{1.0}));
  CHECK(sameAttrValue(ir::AttrValue{std::vector<std::string>{"i", "j"}},
                      ir::AttrValue{std::vector<std::string>{"i", "j"}}));
  CHECK_FALSE(sameAttrValue(ir::AttrValue{std::vector<std::string>{"i,j"}},
                            ir::AttrValue{std::vector<std::string>{"i", "j"}}));
}
