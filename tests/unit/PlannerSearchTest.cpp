// The layout search and the planner's reports: layout options, exactness of the search against
// brute force on generated programs, Megatron-LM's layout rediscovered on the transformer
// example, pure data parallelism where it pays, Mesh-TensorFlow's layout's collectives, the
// memory budget diagnostic and the report formats.
#include "CompiledSource.h"
#include "planner/LayoutSearch.h"
#include "planner/PlanReport.h"
#include "planner/Planner.h"
#include "sema/Sema.h"
#include "train/Optimizer.h"
#include "train/OrderFactoredSums.h"

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>
#include <llvm/Support/JSON.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

using namespace meshc;
using namespace meshc::plan;

namespace {

/// One compilation: sources, diagnostics captured as text, and the module.
struct Compiled : testing::CompiledSource {
  Compiled(llvm::StringRef text, const SemaOptions& options = {})
      : CompiledSource(text, options, "gen.mesh") {}
  Compiled(const std::string& path, const SemaOptions& options) : CompiledSource(path, options) {}
  const ir::Function& fn(const std::string& name) const {
    REQUIRE(module);
    const ir::Function* f = module->findFunction(name);
    REQUIRE(f);
    return *f;
  }
};

Machine machine(const std::string& name) {
  llvm::Expected<Machine> loaded = loadMachine(name);
  REQUIRE(static_cast<bool>(loaded));
  return std::move(*loaded);
}

/// A random program over 3-6 dims: a chain of einsums with fresh weights, elementwise ops,
/// bias adds, reductions and softmaxes, on a mesh of one or two axes of size 2 or 4, with
/// `layout auto`.
std::string generateProgram(unsigned seed) {
  std::mt19937 rng(seed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  static const int64_t sizes[] = {2, 4, 6, 8, 12, 16, 64, 256, 1024, 4096};
  size_t numDims = 3 + pick(4);
  std::vector<std::string> dims;
  std::string text;
  if (pick(2) == 0)
    text += fmt::format("mesh m[a = {}]\n", pick(2) ? 4 : 2);
  else
    text += fmt::format("mesh m[a = {}, b = {}]\n", pick(2) ? 4 : 2, pick(2) ? 4 : 2);
  for (size_t i = 0; i < numDims; ++i) {
    dims.push_back(fmt::format("d{}", i));
    text += fmt::format("dim d{} = {}\n", i, sizes[pick(std::size(sizes))]);
  }
  text += "layout auto\n";
  auto typeOf = [](const std::vector<std::string>& ds) {
    return fmt::format("f32[{}]", fmt::join(ds, ", "));
  };
  std::vector<std::string> cur{dims[0], dims[1]};
  std::vector<std::string> inputDims = cur;
  std::string body;
  int params = 0, lets = 0;
  std::string value = "x";
  size_t steps = 3 + pick(4);
  for (size_t s = 0; s < steps; ++s) {
    std::vector<std::string> absent;
    for (const std::string& d : dims)
      if (std::find(cur.begin(), cur.end(), d) == cur.end()) absent.push_back(d);
    std::string next = fmt::format("v{}", lets++);
    switch (pick(5)) {
    case 0:
    case 1: { // einsum with a weight: shares 1-2 dims of cur, adds 1-2 absent dims
      std::vector<std::string> shared{cur[pick(cur.size())]};
      if (cur.size() > 1 && pick(2)) {
        std::string other = cur[pick(cur.size())];
        if (other != shared[0]) shared.push_back(other);
      }
      std::vector<std::string> added;
      for (const std::string& d : absent)
        if (added.size() < 2 && pick(2)) added.push_back(d);
      std::vector<std::string> weight = shared;
      weight.insert(weight.end(), added.begin(), added.end());
      std::vector<std::string> out;
      for (const std::string& d : cur)
        if (std::find(shared.begin(), shared.end(), d) == shared.end() || pick(2)) out.push_back(d);
      out.insert(out.end(), added.begin(), added.end());
      if (out.empty()) out.push_back(cur[0]);
      body += fmt::format("  param w{}: {} = normal(stddev = 0.1)\n", params, typeOf(weight));
      body += fmt::format("  let {} = einsum({}, w{} -> {})\n", next, value, params++,
                          fmt::join(out, ", "));
      cur = out;
      break;
    }
    case 2:
      body += fmt::format("  let {} = {}({})\n", next, pick(2) ? "relu" : "tanh", value);
      break;
    case 3: { // bias over one dim of cur
      std::string d = cur[pick(cur.size())];
      body += fmt::format("  param w{}: f32[{}] = zeros()\n", params, d);
      body += fmt::format("  let {} = {} + w{}\n", next, value, params++);
      break;
    }
    default:
      if (cur.size() > 1 && pick(2)) {
        size_t i = pick(cur.size());
        body += fmt::format("  let {} = sum({}, {})\n", next, value, cur[i]);
        cur.erase(cur.begin() + static_cast<long>(i));
      } else {
        body += fmt::format("  let {} = softmax({}, {})\n", next, value, cur[pick(cur.size())]);
      }
      break;
    }
    value = next;
  }
  text += fmt::format("def net(x: {}) -> {} {{\n{}  return {}\n}}\n", typeOf(inputDims),
                      typeOf(cur), body, value);
  text += fmt::format("program p(x: {}) -> (y: {}) {{\n  y = net(x)\n}}\n", typeOf(inputDims),
                      typeOf(cur));
  return text;
}

/// Every dim of the module, searched; none pinned.
std::vector<std::string> allDims(const ir::Module& module) {
  std::vector<std::string> dims;
  for (const auto& [name, size] : module.dims)
    dims.push_back(name);
  return dims;
}

Mesh meshOf(const ir::Module& module) {
  Mesh mesh;
  mesh.axes = module.mesh;
  return mesh;
}

/// The collectives of a plan whose operand is computed by an op from `file` (a file name
/// suffix). A partial sum is resolved where it is consumed (a collective carries its
/// consumer's location), so the operand's producer says which def the communication is for.
std::vector<const SpmdOp*> collectivesIn(const SpmdFunction& fn, const std::string& file) {
  std::map<SpmdValueId, const SpmdOp*> producer;
  for (const SpmdOp& op : fn.ops)
    producer.emplace(op.result, &op);
  std::vector<const SpmdOp*> found;
  for (const SpmdOp& op : fn.ops) {
    if (op.kind != SpmdOp::Kind::Collective || op.operands.empty()) continue;
    auto it = producer.find(op.operands.front());
    if (it != producer.end() && llvm::StringRef(it->second->loc.file).endswith(file))
      found.push_back(&op);
  }
  return found;
}

/// The collectives the generated code issues (local slices do not communicate).
std::vector<const SpmdOp*> collectives(const SpmdFunction& fn) {
  std::vector<const SpmdOp*> found;
  for (const SpmdOp& op : fn.ops)
    if (op.kind == SpmdOp::Kind::Collective && op.collective.kind != CollectiveKind::LocalSlice)
      found.push_back(&op);
  return found;
}

std::string describe(const std::vector<const SpmdOp*>& ops) {
  std::string text;
  for (const SpmdOp* op : ops)
    text += fmt::format("{} over [{}] dim '{}' at {}:{}:{}\n", collectiveName(op->collective.kind),
                        fmt::join(op->collective.axes, ","), op->collective.dim, op->loc.file,
                        op->loc.line, op->loc.col);
  return text;
}

const std::string kTransformer = std::string(MESHC_SOURCE_DIR) + "/dsl-examples/transformer.mesh";

/// The transformer example at GPT-style widths (d_model 4096, 32 heads of 128, d_ff 16384,
/// vocab 32768) on a small step (4 sequences of 1024 tokens): there Megatron's split moves
/// fewer bytes (activations) than data parallelism (12 d_model^2 gradients per layer).
SemaOptions largeTransformer(std::vector<ir::MeshAxis> mesh, std::string layout) {
  SemaOptions options;
  options.dimSizes = {{"batch", 4},      {"seq", 1024},    {"mem", 1024},
                      {"d_model", 4096}, {"heads", 32},    {"d_head", 128},
                      {"d_ff", 16384},   {"vocab", 32768}, {"layers", 2}};
  options.mesh = std::move(mesh);
  options.layout = std::move(layout);
  return options;
}

} // namespace

TEST_CASE("layout options are the ordered axis lists whose product divides the size") {
  Mesh mesh;
  mesh.axes = {{"a", 2}, {"b", 4}};
  CHECK(layoutOptions(8, mesh) == std::vector<AxisList>{{}, {"a"}, {"b"}, {"a", "b"}, {"b", "a"}});
  CHECK(layoutOptions(4, mesh) == std::vector<AxisList>{{}, {"a"}, {"b"}});
  CHECK(layoutOptions(6, mesh) == std::vector<AxisList>{{}, {"a"}});
  CHECK(layoutOptions(7, mesh) == std::vector<AxisList>{{}});
  // Axes of size 1 split nothing and are left out.
  mesh.axes = {{"one", 1}, {"a", 2}};
  CHECK(layoutOptions(8, mesh) == std::vector<AxisList>{{}, {"a"}});
  CHECK(layoutOptions(8, Mesh{}) == std::vector<AxisList>{{}});
}

TEST_CASE("the search reaches brute force's cost on generated programs") {
  Machine cpu = machine("8xh100");
  int compared = 0;
  size_t largestSpace = 0, searchedSpaces = 0;
  for (unsigned seed = 1; compared < 24 && seed < 200; ++seed) {
    std::string text = generateProgram(seed);
    INFO("seed " << seed << "\n" << text);
    Compiled compiled{llvm::StringRef(text)};
    INFO(compiled.errors);
    REQUIRE(compiled.module);
    const ir::Function& fn = compiled.fn("p");
    Mesh mesh = meshOf(*compiled.module);
    std::vector<std::string> dims = allDims(*compiled.module);
    SearchOptions options;
    SearchResult oracle =
        bruteForceLayout(*compiled.module, fn, mesh, cpu, Layout{}, dims, options);
    std::optional<SearchResult> found =
        searchLayout(*compiled.module, fn, mesh, cpu, Layout{}, dims, options, compiled.diag);
    REQUIRE(found);
    CHECK(found->exact);
    CHECK(found->stepSeconds == Approx(oracle.stepSeconds).epsilon(1e-9));
    // The chosen layout really costs what the search says.
    PlanEvaluator evaluator(*compiled.module, fn, mesh, cpu);
    CHECK(evaluator.stepSeconds(found->layout) == Approx(found->stepSeconds).epsilon(1e-9));
    // The heuristic, forced, is never better than exact and reports a sane gap.
    SearchOptions heuristic;
    heuristic.exactLimit = 0;
    std::optional<SearchResult> approx =
        searchLayout(*compiled.module, fn, mesh, cpu, Layout{}, dims, heuristic, compiled.diag);
    REQUIRE(approx);
    CHECK_FALSE(approx->exact);
    CHECK(approx->stepSeconds >= oracle.stepSeconds * (1 - 1e-9));
    CHECK(approx->gapBound >= -1e-9);
    largestSpace = std::max(largestSpace, oracle.candidatesEvaluated);
    searchedSpaces += oracle.candidatesEvaluated > 1;
    ++compared;
  }
  CHECK(compared >= 20);
  // The generated programs give the search real choices, not just one candidate each.
  CHECK(searchedSpaces >= 20);
  CHECK(largestSpace >= 20);
}

TEST_CASE("the exact search finds the same layout from any start") {
  // SearchOptions::start only seeds the branch and bound's incumbent (the joint and pipeline
  // searches pass the layout of the search before): the layout found, its seconds and memory
  // are the same from the replicated layout, from the answer itself, from random layouts and
  // from a start the space does not have (foreign axes, a dim not searched), with and without
  // a budget that excludes some layouts, and with and without the bounds of idle levels.
  Machine gpu = machine("8xh100");
  int compared = 0;
  for (unsigned seed = 1; seed < 60; ++seed) {
    std::string text = generateProgram(seed);
    INFO("seed " << seed << "\n" << text);
    Compiled compiled{llvm::StringRef(text)};
    REQUIRE(compiled.module);
    const ir::Function& fn = compiled.fn("p");
    Mesh mesh = meshOf(*compiled.module);
    std::vector<std::string> dims = allDims(*compiled.module);
    PlanEvaluator evaluator(*compiled.module, fn, mesh, gpu);
    double replicated = evaluator.memory(Layout{}).total();
    for (double budget : {0.0, replicated * 0.6}) {
      SearchOptions options;
      options.memoryBudgetBytes = budget;
      DiagEngine quiet(compiled.sources, llvm::nulls());
      std::optional<SearchResult> plain =
          searchLayout(*compiled.module, fn, mesh, gpu, Layout{}, dims, options, quiet);
      if (!plain) continue;
      std::vector<Layout> starts = {plain->layout, Layout{}};
      std::mt19937 rng(seed);
      for (int r = 0; r < 3; ++r) {
        Layout random;
        for (const std::string& dim : dims) {
          std::vector<AxisList> choices = layoutOptions(compiled.module->dims.at(dim), mesh);
          random.axes[dim] = choices[rng() % choices.size()];
        }
        starts.push_back(random);
      }
      Layout foreign;
      foreign.axes[dims.front()] = {"no_such_axis"};
      foreign.axes["not_a_dim"] = {mesh.axes.front().name};
      starts.push_back(foreign);
      // With the bounds of idle levels left out too (SearchOptions::skipIdleBounds), and with
      // their tallies carried from each search to the next (SearchOptions::boundTally).
      auto tally = std::make_shared<BoundTally>();
      for (int skip : {0, 1, 2})
        for (const Layout& start : starts) {
          options.start = start;
          options.skipIdleBounds = skip > 0;
          options.boundTally = skip == 2 ? tally : nullptr;
          std::optional<SearchResult> found =
              searchLayout(*compiled.module, fn, mesh, gpu, Layout{}, dims, options, quiet);
          REQUIRE(found);
          CHECK(found->exact);
          CHECK(found->layout == plain->layout);
          CHECK(found->stepSeconds == plain->stepSeconds);
          CHECK(found->memory.total() == plain->memory.total());
        }
      ++compared;
    }
  }
  CHECK(compared >= 40);
}

TEST_CASE("the exact search finds the same layout with its idle levels unbounded") {
  // SearchOptions::skipIdleBounds (the pipeline searches' inner plans) leaves out the bounds of
  // levels that seldom cut: the layout, its seconds and memory are those of the search with
  // every bound, on the generated programs (above, from every start) and on a trained
  // transformer layer, every dim searched, on [data=4, model=8] (a stage of the GPT-3-shaped
  // joint search's splits), where it bounds fewer nodes.
  SemaOptions sema = largeTransformer({{"data", 4}, {"model", 8}}, "auto");
  sema.dimSizes["layers"] = 1;
  sema.dimSizes["batch"] = 16;
  Compiled compiled(kTransformer, sema);
  INFO(compiled.errors);
  REQUIRE(compiled.module);
  for (ir::Function& fn : compiled.module->functions)
    REQUIRE(train::lowerTraining(fn, compiled.diag));
  const ir::Function& fn = compiled.fn("lm_train");
  Mesh mesh = meshOf(*compiled.module);
  std::vector<std::string> dims = allDims(*compiled.module);
  Machine cluster = machine("h100-cluster");
  SearchOptions options;
  std::optional<SearchResult> plain =
      searchLayout(*compiled.module, fn, mesh, cluster, Layout{}, dims, options, compiled.diag);
  options.skipIdleBounds = true;
  std::optional<SearchResult> skipping =
      searchLayout(*compiled.module, fn, mesh, cluster, Layout{}, dims, options, compiled.diag);
  REQUIRE(plain);
  REQUIRE(skipping);
  CHECK(plain->exact);
  CHECK(skipping->exact);
  CHECK(skipping->layout == plain->layout);
  CHECK(skipping->stepSeconds == plain->stepSeconds);
  CHECK(skipping->memory.total() == plain->memory.total());
  CHECK(skipping->boundsComputed < plain->boundsComputed);
  // Its levels' tallies carried into a second search of the same block (SearchOptions::
  // boundTally, as the pipeline search's inner plans share them): the idle levels are not
  // bounded again, fewer bounds than alone, the same layout.
  options.boundTally = std::make_shared<BoundTally>();
  std::optional<SearchResult> first =
      searchLayout(*compiled.module, fn, mesh, cluster, Layout{}, dims, options, compiled.diag);
  std::optional<SearchResult> carried =
      searchLayout(*compiled.module, fn, mesh, cluster, Layout{}, dims, options, compiled.diag);
  REQUIRE(first);
  REQUIRE(carried);
  CHECK(first->boundsComputed == skipping->boundsComputed);
  CHECK_FALSE(options.boundTally->byDim.empty());
  CHECK(carried->exact);
  CHECK(carried->layout == plain->layout);
  CHECK(carried->stepSeconds == plain->stepSeconds);
  CHECK(carried->memory.total() == plain->memory.total());
  CHECK(carried->boundsComputed < skipping->boundsComputed);
}

TEST_CASE("the search is exact on the examples with layout auto on [data=2, model=4]") {
  Machine gpu = machine("8xh100");
  for (const char* example : {"mlp", "moe", "transformer", "bert", "performer"}) {
    SemaOptions sema;
    sema.mesh = std::vector<ir::MeshAxis>{{"data", 2}, {"model", 4}};
    sema.layout = "auto";
    Compiled compiled(std::string(MESHC_SOURCE_DIR) + "/dsl-examples/" + example + ".mesh", sema);
    INFO(example << ": " << compiled.errors);
    REQUIRE(compiled.module);
    Mesh mesh = meshOf(*compiled.module);
    std::vector<std::string> dims = allDims(*compiled.module);
    for (const ir::Function& fn : compiled.module->functions) {
      INFO(fn.name);
      SearchResult oracle = bruteForceLayout(*compiled.module, fn, mesh, gpu, Layout{}, dims, {});
      std::optional<SearchResult> found =
          searchLayout(*compiled.module, fn, mesh, gpu, Layout{}, dims, {}, compiled.diag);
      REQUIRE(found);
      CHECK(found->exact);
      CHECK(found->stepSeconds == Approx(oracle.stepSeconds).epsilon(1e-9));
      CHECK(found->candidatesEvaluated <= oracle.candidatesEvaluated);
    }
  }
}

/// The smallest memory of any legal layout of `dims` (each dim's layoutOptions; no two dims of
/// one tensor on one axis), every one of them costed.
double smallestLegalMemory(const ir::Function& fn, const Mesh& mesh, PlanEvaluator& evaluator,
                           const std::vector<std::string>& dims) {
  std::map<std::string, int64_t> sizes;
  std::set<std::pair<std::string, std::string>> together;
  for (const ir::Value& value : fn.values)
    for (const ir::Dim& dim : value.type.dims) {
      sizes[dim.name] = dim.size;
      for (const ir::Dim& other : value.type.dims)
        together.insert({dim.name, other.name});
    }
  std::vector<std::string> used;
  std::vector<std::vector<AxisList>> options;
  for (const std::string& dim : dims)
    if (sizes.count(dim)) {
      used.push_back(dim);
      options.push_back(layoutOptions(sizes[dim], mesh));
    }
  double smallest = std::numeric_limits<double>::infinity();
  std::vector<size_t> choice(used.size(), 0);
  while (true) {
    Layout layout;
    bool legal = true;
    for (size_t i = 0; i < used.size() && legal; ++i) {
      for (size_t j = 0; j < i && legal; ++j)
        for (const std::string& axis : options[i][choice[i]])
          if (together.count({used[i], used[j]}) && llvm::is_contained(options[j][choice[j]], axis))
            legal = false;
      layout.axes[used[i]] = options[i][choice[i]];
    }
    if (legal) smallest = std::min(smallest, evaluator.memory(layout).total());
    size_t i = 0;
    for (; i < used.size() && ++choice[i] == options[i].size(); ++i)
      choice[i] = 0;
    if (i == used.size()) return smallest;
  }
}

/// PlanEvaluator::memoryLowerBound of `fn` is at most the smallest memory of its legal layouts
/// over `dims`, and a search that need not name the smallest need (SearchOptions::exactNeed,
/// which may stop at that bound) finds what one that must finds, under budgets on both sides of
/// the bound and of the smallest need.
void checkMemoryLowerBound(const ir::Module& module, const ir::Function& fn,
                           const std::vector<std::string>& dims, const Machine& gpu,
                           DiagEngine& diag) {
  Mesh mesh = meshOf(module);
  PlanEvaluator evaluator(module, fn, mesh, gpu);
  double bound = evaluator.memoryLowerBound();
  double smallest = smallestLegalMemory(fn, mesh, evaluator, dims);
  INFO("bound " << bound << ", smallest " << smallest);
  CHECK(bound > 0);
  CHECK(bound <= smallest);
  for (double budget : {bound * (1 - 1e-9), bound, smallest * (1 - 1e-9), smallest}) {
    SearchOptions options;
    options.memoryBudgetBytes = budget;
    std::optional<SearchResult> exact =
        searchLayout(module, fn, mesh, gpu, Layout{}, dims, options, diag);
    options.exactNeed = false;
    std::optional<SearchResult> quick =
        searchLayout(module, fn, mesh, gpu, Layout{}, dims, options, diag);
    CHECK(exact.has_value() == (budget >= smallest));
    REQUIRE(quick.has_value() == exact.has_value());
    if (budget < bound) CHECK_FALSE(quick);
    if (!exact) continue;
    CHECK(quick->layout == exact->layout);
    CHECK(quick->stepSeconds == exact->stepSeconds);
  }
}

TEST_CASE("the search respects the memory budget, exactly") {
  Machine gpu = machine("8xh100");
  for (unsigned seed = 300; seed < 310; ++seed) {
    std::string text = generateProgram(seed);
    INFO("seed " << seed << "\n" << text);
    Compiled compiled{llvm::StringRef(text)};
    REQUIRE(compiled.module);
    const ir::Function& fn = compiled.fn("p");
    Mesh mesh = meshOf(*compiled.module);
    std::vector<std::string> dims = allDims(*compiled.module);
    PlanEvaluator evaluator(*compiled.module, fn, mesh, gpu);
    double replicated = evaluator.memory(Layout{}).total();
    SearchOptions options;
    options.memoryBudgetBytes = replicated * 0.6;
    SearchResult oracle =
        bruteForceLayout(*compiled.module, fn, mesh, gpu, Layout{}, dims, options);
    std::optional<SearchResult> found =
        searchLayout(*compiled.module, fn, mesh, gpu, Layout{}, dims, options, compiled.diag);
    if (!std::isfinite(oracle.stepSeconds)) {
      CHECK_FALSE(found);
    } else {
      REQUIRE(found);
      CHECK(found->memory.total() <= options.memoryBudgetBytes);
      CHECK(found->stepSeconds == Approx(oracle.stepSeconds).epsilon(1e-9));
    }
    // Until a layout fits, the search learns the memory of a layout above its cutoff from a
    // walk without lowering and keeps its seconds a bound: a budget at the smallest need must
    // still find brute force's layout, and one just under it must name that need.
    double smallest = smallestLegalMemory(fn, mesh, evaluator, dims);
    REQUIRE(std::isfinite(smallest));
    options.memoryBudgetBytes = smallest;
    oracle = bruteForceLayout(*compiled.module, fn, mesh, gpu, Layout{}, dims, options);
    found = searchLayout(*compiled.module, fn, mesh, gpu, Layout{}, dims, options, compiled.diag);
    REQUIRE(found);
    CHECK(found->memory.total() == smallest);
    CHECK(found->stepSeconds == Approx(oracle.stepSeconds).epsilon(1e-9));
    options.memoryBudgetBytes = smallest * (1 - 1e-9);
    CHECK_FALSE(
        searchLayout(*compiled.module, fn, mesh, gpu, Layout{}, dims, options, compiled.diag));
    compiled.errorStream.flush();
    CHECK(compiled.errors.find(fmt::format("(the smallest needs {})", bytesString(smallest))) !=
          std::string::npos);
    checkMemoryLowerBound(*compiled.module, fn, dims, gpu, compiled.diag);
  }
}

TEST_CASE("no layout of a train block needs less than the memory lower bound") {
  Machine gpu = machine("8xh100");
  // Before and after the training phase (backward modelled, then planned: its gradients and
  // optimizer state are params and activations of the step). Generated programs: "the search
  // respects the memory budget, exactly".
  for (bool trained : {false, true}) {
    INFO("trained " << trained);
    SemaOptions options;
    options.dimSizes = {{"batch", 4},  {"seq", 8},   {"mem", 8},    {"d_model", 16}, {"heads", 2},
                        {"d_head", 8}, {"d_ff", 32}, {"vocab", 64}, {"layers", 2}};
    options.mesh = std::vector<ir::MeshAxis>{{"data", 2}, {"model", 2}};
    Compiled compiled(kTransformer, options);
    INFO(compiled.errors);
    REQUIRE(compiled.module);
    if (trained)
      for (ir::Function& fn : compiled.module->functions)
        REQUIRE(train::lowerTraining(fn, compiled.diag));
    checkMemoryLowerBound(*compiled.module, compiled.fn("lm_train"),
                          {"batch", "d_model", "heads", "d_ff", "vocab"}, gpu, compiled.diag);
  }
}

TEST_CASE("an impossible memory budget is a located error naming the smallest need") {
  std::string text = generateProgram(7);
  Compiled compiled{llvm::StringRef(text)};
  REQUIRE(compiled.module);
  PlannerOptions options;
  options.machine = "8xh100";
  options.memoryBudgetBytes = 16;
  CHECK_FALSE(planModule(*compiled.module, options, compiled.diag));
  compiled.errorStream.flush();
  INFO(compiled.errors);
  CHECK(compiled.errors.find("error: no layout of program 'p' fits the memory budget of 16 B per "
                             "device (the smallest needs ") != std::string::npos);
  CHECK(compiled.errors.find("gen.mesh:") != std::string::npos);
}

TEST_CASE("Megatron rediscovered: heads and d_ff over model, two allreduces per layer") {
  Compiled compiled(kTransformer, largeTransformer({{"model", 4}}, "auto"));
  INFO(compiled.errors);
  REQUIRE(compiled.module);
  PlannerOptions options;
  options.machine = "8xh100";
  options.functions = {"lm_train"};
  std::optional<std::vector<PlannedFunction>> plans =
      planModule(*compiled.module, options, compiled.diag);
  compiled.errorStream.flush();
  INFO(compiled.errors);
  REQUIRE(plans);
  REQUIRE(plans->size() == 1);
  const PlannedFunction& plan = plans->front();
  INFO(layoutString(plan.spmd.layout));
  CHECK(plan.spmd.layout.of("heads") == AxisList{"model"});
  CHECK(plan.spmd.layout.of("d_ff") == AxisList{"model"});
  CHECK(plan.spmd.layout.of("d_model").empty());
  CHECK(plan.spmd.layout.of("batch").empty());
  // In the layers (lib/layers.mesh): the allreduce of attention's output projection and the
  // one of the ffn's second matmul, per layer, and nothing else.
  std::vector<const SpmdOp*> inLayers = collectivesIn(plan.spmd, "layers.mesh");
  INFO(describe(inLayers));
  CHECK(inLayers.size() == 2 * 2);
  for (const SpmdOp* op : inLayers) {
    CHECK(op->collective.kind == CollectiveKind::AllReduceSum);
    CHECK(op->collective.axes == AxisList{"model"});
  }
}

TEST_CASE("on [data=8] the small transformer is purely data parallel") {
  // The example's widths (d_model 64) on a large step (64 sequences of 512 tokens).
  SemaOptions sema;
  sema.dimSizes = {{"batch", 64}, {"seq", 512}, {"mem", 512}};
  sema.mesh = std::vector<ir::MeshAxis>{{"data", 8}};
  sema.layout = "auto";
  Compiled compiled(kTransformer, sema);
  INFO(compiled.errors);
  REQUIRE(compiled.module);
  PlannerOptions options;
  options.machine = "8xh100";
  std::optional<std::vector<PlannedFunction>> plans =
      planModule(*compiled.module, options, compiled.diag);
  REQUIRE(plans);
  for (const PlannedFunction& plan : *plans) {
    INFO(plan.spmd.name << ": " << layoutString(plan.spmd.layout));
    CHECK(plan.spmd.layout.of("batch") == AxisList{"data"});
    for (const auto& [dim, axes] : plan.spmd.layout.axes)
      CHECK((dim == "batch" || axes.empty()));
    std::vector<const SpmdOp*> all = collectives(plan.spmd);
    INFO(describe(all));
    if (plan.spmd.kind == ir::Function::Kind::Program) {
      CHECK(all.empty());
    } else {
      // Only the loss: sum(token_loss * has_next) / sum(has_next), both over the split batch,
      // resolved together by one all-reduce of the two scalars.
      CHECK(collectivesIn(plan.spmd, "layers.mesh").empty());
      REQUIRE(all.size() == 1);
      CHECK(all[0]->collective.kind == CollectiveKind::BucketedAllReduceSum);
      CHECK(all[0]->collective.axes == AxisList{"data"});
      CHECK(all[0]->collective.bytes == 2 * 4);
      CHECK(all[0]->results.size() == 2);
      CHECK(all[0]->loc.file == "transformer.mesh");
      CHECK(all[0]->loc.line > 53); // in lm_train, after `train lm_train(...)`
    }
  }
}

TEST_CASE("Mesh-TensorFlow's layout on [data=2, model=4] has the expected collectives") {
  Compiled compiled(kTransformer, largeTransformer({{"data", 2}, {"model", 4}},
                                                   "batch: data, d_ff: model, heads: model"));
  INFO(compiled.errors);
  REQUIRE(compiled.module);
  PlannerOptions options;
  options.machine = "8xh100";
  options.functions = {"lm"};
  std::optional<std::vector<PlannedFunction>> plans =
      planModule(*compiled.module, options, compiled.diag);
  REQUIRE(plans);
  const PlannedFunction& plan = plans->front();
  CHECK_FALSE(plan.search);
  CHECK(plan.spmd.layout.of("batch") == AxisList{"data"});
  std::vector<const SpmdOp*> all = collectives(plan.spmd);
  INFO(describe(all));
  // Per layer: attention output projection and ffn output each resolve a partial sum over
  // `model`, by a reduce-scatter of the sequence (sequence parallelism: the residual adds and
  // norms run on a quarter of the rows; batch/2 does not divide by 4); batch over `data` needs
  // nothing in the forward pass. All-gathers bring the rows back for the einsums reading a
  // norm: both FFNs', the second attention's and the unembedding's (vocab is replicated here:
  // the embedding and unembedding need no other communication).
  int scatters = 0, gathers = 0;
  for (const SpmdOp* op : all) {
    CHECK(op->collective.axes == AxisList{"model"});
    CHECK(op->collective.dim == "seq");
    scatters += op->collective.kind == CollectiveKind::ReduceScatter;
    gathers += op->collective.kind == CollectiveKind::AllGather;
  }
  CHECK(scatters == 2 * 2);
  CHECK(gathers == 4);
  CHECK(all.size() == 8);
}

TEST_CASE("the reports show the plan's facts") {
  Compiled compiled(kTransformer, SemaOptions{});
  REQUIRE(compiled.module);
  llvm::Expected<Machine> gpu = loadMachine("8xh100");
  REQUIRE(static_cast<bool>(gpu));
  PlannerOptions options;
  options.functions = {"lm"};
  std::optional<std::vector<PlannedFunction>> plans =
      planModule(*compiled.module, *gpu, options, compiled.diag);
  REQUIRE(plans);
  const PlannedFunction& plan = plans->front();
  std::string text, json, spmd, dot;
  llvm::raw_string_ostream textOs(text), jsonOs(json), spmdOs(spmd), dotOs(dot);
  printPlan(plan, *gpu, textOs);
  printPlanJson(plan, *gpu, jsonOs);
  printSpmd(plan.spmd, spmdOs);
  printDot(plan.spmd, dotOs);
  textOs.flush();
  jsonOs.flush();
  spmdOs.flush();
  dotOs.flush();
  CHECK(text.find("plan of program lm") != std::string::npos);
  CHECK(text.find("heads") != std::string::npos);
  CHECK(text.find("pinned") != std::string::npos);
  CHECK(text.find("layers.mesh:") != std::string::npos); // a collective's source location
  CHECK(text.find("utilization") != std::string::npos);
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(json);
  REQUIRE(static_cast<bool>(parsed));
  const llvm::json::Object* object = parsed->getAsObject();
  REQUIRE(object);
  CHECK(object->getString("function") == llvm::StringRef("lm"));
  const llvm::json::Array* jsonCollectives = object->getArray("collectives");
  REQUIRE(jsonCollectives);
  CHECK(jsonCollectives->size() == collectives(plan.spmd).size());
  CHECK(spmd.find("spmd program lm") != std::string::npos);
  CHECK(spmd.find("local") != std::string::npos);
  CHECK(dot.rfind("digraph", 0) == 0);
  CHECK(dot.find("color=red") != std::string::npos);
  CHECK(bytesString(1536) == "1.5 KiB");
  CHECK(bytesString(3.2 * (1 << 30)) == "3.2 GiB");
  CHECK(secondsString(0.0012345) == "1.234 ms");
}

TEST_CASE("--devices tries every factorization of the device count and keeps the fastest",
          "[planner][devices]") {
  Compiled c(std::string(MESHC_SOURCE_DIR) + "/dsl-examples/transformer.mesh",
             SemaOptions{{}, std::nullopt, std::string("auto")});
  REQUIRE(c.module);
  Machine h100 = machine("8xh100");
  PlannerOptions options;
  options.devices = 8;
  options.functions = {"lm"};
  auto plans = planModule(*c.module, h100, options, c.diag);
  REQUIRE(plans);
  REQUIRE(plans->size() == 1);
  const PlannedFunction& best = plans->front();
  // [1,8], [2,4], [4,2], [8,1] over the example's axes (data, model).
  REQUIRE(best.meshCandidates.size() == 4);
  CHECK(best.spmd.mesh.numDevices() == 8);
  double fastest = INFINITY;
  for (const auto& [mesh, seconds] : best.meshCandidates) {
    CHECK(mesh.numDevices() == 8);
    fastest = std::min(fastest, seconds);
    // Each candidate's time is what planning on that mesh directly predicts.
    ir::Module fixed = *c.module;
    fixed.mesh = mesh.axes;
    PlannerOptions direct;
    direct.functions = {"lm"};
    auto plan = planModule(fixed, h100, direct, c.diag);
    REQUIRE(plan);
    CHECK(plan->front().spmd.summary.stepSeconds == Approx(seconds));
  }
  CHECK(best.spmd.summary.stepSeconds == Approx(fastest));
}

TEST_CASE("--devices with no factorization that fits the pinned layout is an error",
          "[planner][devices]") {
  Compiled c(R"(mesh m[data = 2, model = 2]
dim batch = 4
dim d = 4
layout batch: data, d: model
program p(x: f32[batch, d]) -> (y: f32[batch, d]) { y = x * 2 }
)");
  REQUIRE(c.module);
  PlannerOptions options;
  options.devices = 3;
  CHECK_FALSE(planModule(*c.module, machine("cpu"), options, c.diag));
  c.errorStream.flush();
  CHECK_THAT(c.errors,
             Catch::Contains("no mesh of 3 devices over axes [data, model] fits program 'p'"));
}

namespace {

/// lm_train of the GPT-width transformer through the training phase (autodiff + AdamW), planned
/// under `layout` on `mesh`.
SpmdFunction plannedTrainStep(std::vector<ir::MeshAxis> mesh, const std::string& layout) {
  Compiled compiled(kTransformer, largeTransformer(mesh, layout));
  INFO(compiled.errors);
  REQUIRE(compiled.module);
  for (ir::Function& fn : compiled.module->functions)
    REQUIRE(train::lowerTraining(fn, compiled.diag));
  const ir::Function& fn = compiled.fn("lm_train");
  REQUIRE_FALSE(fn.updates.empty());
  Mesh planned;
  for (const ir::MeshAxis& axis : mesh)
    planned.axes.push_back(axis);
  Layout pinned;
  for (const ir::DimLayout& entry : compiled.module->layout)
    if (!entry.isAuto) pinned.axes[entry.dim] = entry.axes;
  std::optional<SpmdFunction> spmd =
      lowerToSpmd(*compiled.module, fn, planned, pinned, machine("8xh100"), compiled.diag);
  compiled.errorStream.flush();
  INFO(compiled.errors);
  REQUIRE(spmd);
  CHECK(spmd->summary.backwardIsReal);
  CHECK(spmd->gradientOps.empty());
  return std::move(*spmd);
}

std::vector<const SpmdOp*> inPhase(const std::vector<const SpmdOp*>& ops, Phase phase) {
  std::vector<const SpmdOp*> found;
  for (const SpmdOp* op : ops)
    if (op->phase == phase) found.push_back(op);
  return found;
}

} // namespace

TEST_CASE("trained on [model=4]: Megatron's 2 all-reduces forward and 2 backward per layer") {
  SpmdFunction fn = plannedTrainStep({{"model", 4}}, "heads: model, d_ff: model");
  std::vector<const SpmdOp*> inLayers = collectivesIn(fn, "layers.mesh");
  INFO(describe(collectives(fn)));
  std::vector<const SpmdOp*> forward = inPhase(inLayers, Phase::Forward);
  std::vector<const SpmdOp*> backward = inPhase(inLayers, Phase::Backward);
  // Forward: attention's output projection and the ffn's second matmul, per layer. Backward:
  // the input gradients of the q/k/v projections (summed lazily, one all-reduce) and of the
  // ffn's first matmul, per layer (Megatron's f and g operators, transposed).
  CHECK(forward.size() == 2 * 2);
  CHECK(backward.size() == 2 * 2);
  for (const SpmdOp* op : inLayers) {
    CHECK(op->collective.kind == CollectiveKind::AllReduceSum);
    CHECK(op->collective.axes == AxisList{"model"});
    // [batch, seq, d_model] activations (or their gradients) in f32.
    CHECK(op->collective.bytes == int64_t{4} * 1024 * 4096 * 4);
  }
  // Weights are split as their gradients come out: no gradient reduction, no update collective.
  // Outside the layers only the global-norm clipping's squared norms of the split weights'
  // gradients (scalars, partial over model) are resolved, at the optimizer's source line, all
  // by one collective.
  CHECK(inPhase(collectives(fn), Phase::Update).empty());
  std::vector<const SpmdOp*> outside;
  for (const SpmdOp* op : collectives(fn))
    if (std::find(inLayers.begin(), inLayers.end(), op) == inLayers.end()) outside.push_back(op);
  REQUIRE(outside.size() == 1);
  const SpmdOp& norm = *outside[0];
  CHECK(norm.loc.line == 61); // minimize loss with adamw(..., clip_norm = ...)
  CHECK(norm.collective.axes == AxisList{"model"});
  std::vector<SpmdValueId> results = norm.results.empty() ? std::vector{norm.result} : norm.results;
  CHECK(norm.collective.bytes == 4 * int64_t(results.size()));
  for (SpmdValueId result : results)
    CHECK(fn.values[result].globalType.dims.empty());
}

TEST_CASE("trained on [data=2, model=4]: plus the gradient reductions over data") {
  SpmdFunction fn =
      plannedTrainStep({{"data", 2}, {"model", 4}}, "batch: data, heads: model, d_ff: model");
  std::vector<const SpmdOp*> all = collectives(fn);
  INFO(describe(all));
  std::vector<const SpmdOp*> overModel, overData;
  for (const SpmdOp* op : all) {
    if (op->collective.axes == AxisList{"model"}) overModel.push_back(op);
    if (op->collective.axes == AxisList{"data"}) overData.push_back(op);
  }
  std::vector<const SpmdOp*> inLayers = collectivesIn(fn, "layers.mesh");
  // Megatron's count over model is unchanged by the data split.
  int modelInLayers = 0;
  for (const SpmdOp* op : inLayers)
    modelInLayers += op->collective.axes == AxisList{"model"};
  CHECK(modelInLayers == 2 * 2 * 2);
  // Every gradient is a partial sum over data (batch is split there): resolved in backward, by
  // all-reduce (alone when large, bucketed when small) before the optimizer reads it.
  REQUIRE_FALSE(overData.empty());
  int64_t reducedBytes = 0;
  bool bucketed = false;
  for (const SpmdOp* op : overData) {
    // In forward only the loss's own mean over the split batch (transformer.mesh:60).
    if (op->phase == Phase::Forward) CHECK(op->loc.line == 60);
    CHECK((op->collective.kind == CollectiveKind::AllReduceSum ||
           op->collective.kind == CollectiveKind::BucketedAllReduceSum));
    bucketed = bucketed || op->collective.kind == CollectiveKind::BucketedAllReduceSum;
    reducedBytes += op->collective.bytes;
  }
  CHECK(bucketed); // the small ones (norm gains and biases, the loss) share a bucket
  // At least every weight's local gradient once (per device: split weights count their shard).
  double weightBytes = 0;
  for (size_t k = 0; k < fn.params.size(); ++k) {
    const SpmdValue& param = fn.values[fn.params[k]];
    if (param.name.find('@') == std::string::npos)
      weightBytes += double(param.localType.numElements()) * 4;
  }
  CHECK(double(reducedBytes) >= weightBytes * 0.999);
  for (const SpmdOp* op : all)
    CHECK((op->collective.axes == AxisList{"model"} || op->collective.axes == AxisList{"data"}));
}

namespace {

/// An example's train block through the training phase, planned under its own layout on `mesh`.
SpmdFunction plannedExampleStep(const std::string& example, const std::string& function,
                                std::vector<ir::MeshAxis> mesh,
                                const std::string& machineName = "8xh100") {
  SemaOptions options;
  options.mesh = mesh;
  Compiled compiled(std::string(MESHC_SOURCE_DIR) + "/dsl-examples/" + example, options);
  INFO(compiled.errors);
  REQUIRE(compiled.module);
  for (ir::Function& fn : compiled.module->functions)
    REQUIRE(train::lowerTraining(fn, compiled.diag, train::pinnedDims(*compiled.module)));
  Mesh planned;
  planned.axes = mesh;
  Layout pinned;
  for (const ir::DimLayout& entry : compiled.module->layout)
    if (!entry.isAuto) pinned.axes[entry.dim] = entry.axes;
  std::optional<SpmdFunction> spmd = lowerToSpmd(*compiled.module, compiled.fn(function), planned,
                                                 pinned, machine(machineName), compiled.diag);
  compiled.errorStream.flush();
  INFO(compiled.errors);
  REQUIRE(spmd);
  return std::move(*spmd);
}

/// Every value is defined before it is read (the merged program is in dependency order).
void checkDefinedBeforeUse(const SpmdFunction& fn) {
  std::vector<bool> defined(fn.values.size(), false);
  for (const SpmdOp& op : fn.ops) {
    for (SpmdValueId operand : op.operands)
      CHECK(defined[operand]);
    defined[op.result] = true;
    for (SpmdValueId id : op.results)
      defined[id] = true;
  }
  for (const auto& [name, id] : fn.outputs)
    CHECK(defined[id]);
  for (const auto& [param, id] : fn.updates)
    CHECK(defined[id]);
}

bool resolvesOnlyScalars(const SpmdFunction& fn, const SpmdOp& op) {
  std::vector<SpmdValueId> results = op.results.empty() ? std::vector{op.result} : op.results;
  return std::all_of(results.begin(), results.end(),
                     [&](SpmdValueId id) { return fn.values[id].globalType.dims.empty(); });
}

} // namespace

TEST_CASE("lm_train on [data=2, model=2]: merged collectives, 2 of them scalar") {
  SpmdFunction fn = plannedExampleStep("transformer.mesh", "lm_train", {{"data", 2}, {"model", 2}});
  checkDefinedBeforeUse(fn);
  std::vector<const SpmdOp*> all = collectives(fn);
  INFO(describe(all));
  // Before merging: 32 (the gradient norm's 16 squares resolved one by one over model, the
  // loss's numerator and denominator apart). The 14 left are each needed before the next can
  // start (the forward's and backward's Megatron all-reduces, log_softmax's statistics in one
  // all-gather), but for the gradient bucket over data and the two scalar ones; log_softmax's
  // backward sums its one-hot cotangent without one (Autodiff's one-hot pick).
  CHECK(all.size() == 14);
  int scalar = 0;
  for (const SpmdOp* op : all)
    scalar += resolvesOnlyScalars(fn, *op);
  CHECK(scalar <= 2);
  // The loss's numerator and denominator (transformer.mesh:60) in one all-reduce: the
  // denominator's sum is taken over a slice of seq per model rank, so both are partial over
  // [data, model].
  std::vector<const SpmdOp*> loss;
  for (const SpmdOp* op : all)
    if (op->loc.line == 60) loss.push_back(op);
  REQUIRE(loss.size() == 1);
  CHECK(loss[0]->collective.kind == CollectiveKind::BucketedAllReduceSum);
  CHECK(loss[0]->results.size() == 2);
  CHECK(loss[0]->collective.axes == AxisList{"data", "model"});
  // The global norm: one all-reduce of one scalar after a local sum of every gradient's squares
  // (those of the gradients replicated over model are summed over a slice each).
  std::vector<const SpmdOp*> norm;
  for (const SpmdOp* op : all)
    if (op->loc.line == 61 && resolvesOnlyScalars(fn, *op)) norm.push_back(op);
  REQUIRE(norm.size() == 1);
  CHECK(norm[0]->collective.bytes == 4);
  CHECK(norm[0]->collective.axes == AxisList{"model"});
}

TEST_CASE("Adafactor's update: one all-reduce per group") {
  // moe_train's adafactor: per weight, the factored statistics (row and column means of g^2),
  // the mean of the new row statistic, and the RMS of the update are partial sums over the
  // split dims. Unmerged they were 12 all-reduces on [2, 2], one per weight and statistic; merged,
  // one per group and dependent stage (statistics, then the RMS of the update, which read them)
  // until the RMS's sum ran over the split dim first (train/Optimizer.cpp).
  for (std::vector<ir::MeshAxis> mesh : {std::vector<ir::MeshAxis>{{"data", 2}, {"model", 2}},
                                         std::vector<ir::MeshAxis>{{"data", 1}, {"model", 4}}}) {
    // On the cpu machine: on 8xh100 the reshard of a small partial vector (a row statistic) by a
    // reduce-scatter and an all-gather ties with its all-reduce and wins by rounding; those are
    // not merged.
    SpmdFunction fn = plannedExampleStep("moe.mesh", "moe_train", mesh, "cpu");
    checkDefinedBeforeUse(fn);
    // The optimizer's collectives (the gradients' bucket, the statistics, the sums of squares),
    // per group of axes: those at moe.mesh:131, the `minimize` line that every optimizer op
    // carries.
    std::map<AxisList, std::vector<size_t>> byGroup;
    for (size_t i = 0; i < fn.ops.size(); ++i) {
      const SpmdOp& op = fn.ops[i];
      if (op.kind == SpmdOp::Kind::Collective && op.loc.line == 131 &&
          op.collective.kind != CollectiveKind::LocalSlice)
        byGroup[op.collective.axes].push_back(i);
    }
    CHECK(byGroup.count(AxisList{"model"}) == 1);
    for (const auto& [axes, ops] : byGroup) {
      CAPTURE(mesh.size(), axes);
      CHECK(ops.size() == 1);
    }
  }
}

TEST_CASE("every example's train step stays in dependency order after merging") {
  for (const auto& [example, function] :
       std::vector<std::pair<std::string, std::string>>{{"mlp.mesh", "mlp_train"},
                                                        {"transformer.mesh", "lm_train"},
                                                        {"bert.mesh", "mlm_train"},
                                                        {"performer.mesh", "lm_train"},
                                                        {"moe.mesh", "moe_train"},
                                                        {"vit.mesh", "train_vit"}}) {
    CAPTURE(example);
    SpmdFunction fn = plannedExampleStep(example, function, {{"data", 2}, {"model", 2}});
    checkDefinedBeforeUse(fn);
    // In-place collectives (an op's own communication) still follow their op.
    for (size_t i = 0; i < fn.ops.size(); ++i) {
      const SpmdOp& op = fn.ops[i];
      if (op.kind != SpmdOp::Kind::Collective || op.operands.size() != 1 ||
          op.operands[0] != op.result)
        continue;
      REQUIRE(i > 0);
      CHECK(fn.ops[i - 1].result == op.result);
    }
  }
}

TEST_CASE("planZeroCandidates of an Adafactor block: stage 0 as planned alone, then the ZeRO "
          "stages in order") {
  // Adafactor's sums are ordered for stage 0's layout (planInFactoredOrder); its plan is that
  // stage's candidate (it was planned a second time before), and the ZeRO stages follow in the
  // same order, `keepGoing` seeing each.
  SemaOptions options;
  options.mesh = {{"data", 2}, {"model", 2}};
  Compiled compiled(std::string(MESHC_SOURCE_DIR) + "/dsl-examples/moe.mesh", options);
  REQUIRE(compiled.module);
  for (ir::Function& fn : compiled.module->functions)
    REQUIRE(train::lowerTraining(fn, compiled.diag, train::pinnedDims(*compiled.module)));
  REQUIRE_FALSE(train::factoredSumOrder(compiled.fn("moe_train")).empty());
  PlannerOptions plannerOptions;
  plannerOptions.machine = "8xh100";
  Machine h100 = machine("8xh100");
  auto alone = planZeroCandidates(*compiled.module, h100, plannerOptions, "moe_train", {0}, nullptr,
                                  compiled.diag);
  REQUIRE(alone);
  REQUIRE(alone->size() == 1);
  std::vector<int> seen;
  auto keepGoing = [&](PlannedFunction& plan) {
    seen.push_back(plan.zero ? plan.zero->stage : 0);
    return true;
  };
  auto all = planZeroCandidates(*compiled.module, h100, plannerOptions, "moe_train", {0, 3, 1},
                                keepGoing, compiled.diag);
  REQUIRE(all);
  REQUIRE(all->size() == 3);
  CHECK(seen == std::vector<int>{0, 3, 1});
  CHECK(all->front().spmd.summary.stepSeconds == alone->front().spmd.summary.stepSeconds);
  CHECK(all->front().spmd.memory.total() == alone->front().spmd.memory.total());
  CHECK(all->front().spmd.layout.axes == alone->front().spmd.layout.axes);
  CHECK(all->front().spmd.ops.size() == alone->front().spmd.ops.size());
  CHECK((*all)[1].zero->stage == 3);
  CHECK((*all)[2].zero->stage == 1);
  CHECK((*all)[1].spmd.memory.total() < all->front().spmd.memory.total());
  // Stopped after stage 0: one plan.
  auto first = planZeroCandidates(
      *compiled.module, h100, plannerOptions, "moe_train", {0, 3},
      [](PlannedFunction&) { return false; }, compiled.diag);
  REQUIRE(first);
  CHECK(first->size() == 1);
}

TEST_CASE("a ZeRO form's report compares it with the plan without ZeRO, lowered or not") {
  // planZeroCandidates lowers the fastest layout only when stage 0 asks for it: ZeRO stages
  // alone (the joint search's combinations) take its step and memory from the search's exact
  // costing, which must be the lowered plan's bit for bit, and the forms must be the same.
  SemaOptions options;
  options.mesh = {{"data", 2}, {"model", 2}};
  options.layout = "auto"; // searched: the forms carry the search
  Compiled compiled(std::string(MESHC_SOURCE_DIR) + "/dsl-examples/transformer.mesh", options);
  REQUIRE(compiled.module);
  for (ir::Function& fn : compiled.module->functions)
    REQUIRE(train::lowerTraining(fn, compiled.diag, train::pinnedDims(*compiled.module)));
  PlannerOptions plannerOptions;
  plannerOptions.machine = "8xh100";
  plannerOptions.memoryBudgetBytes = 1; // nothing fits: stage 0 is the fastest layout, lowered
  Machine h100 = machine("8xh100");
  auto lowered = planZeroCandidates(*compiled.module, h100, plannerOptions, "lm_train", {0, 3, 1},
                                    nullptr, compiled.diag);
  auto alone = planZeroCandidates(*compiled.module, h100, plannerOptions, "lm_train", {3, 1},
                                  nullptr, compiled.diag);
  REQUIRE(lowered);
  REQUIRE(alone);
  REQUIRE(lowered->size() == 3);
  REQUIRE(alone->size() == 2);
  const PlannedFunction& plain = lowered->front();
  REQUIRE_FALSE(plain.zero);
  for (size_t k = 0; k < 2; ++k) {
    const PlannedFunction& form = (*alone)[k];
    const PlannedFunction& afterPlain = (*lowered)[k + 1];
    REQUIRE(form.zero);
    REQUIRE(afterPlain.zero);
    CAPTURE(form.zero->stage);
    CHECK(form.zero->stage == afterPlain.zero->stage);
    CHECK(form.zero->stepBefore == plain.spmd.summary.stepSeconds);
    CHECK(form.zero->totalBefore == plain.spmd.memory.total());
    CHECK(afterPlain.zero->stepBefore == plain.spmd.summary.stepSeconds);
    CHECK(afterPlain.zero->totalBefore == plain.spmd.memory.total());
    CHECK(form.spmd.summary.stepSeconds == afterPlain.spmd.summary.stepSeconds);
    CHECK(form.spmd.memory.total() == afterPlain.spmd.memory.total());
    CHECK(form.spmd.ops.size() == afterPlain.spmd.ops.size());
    REQUIRE(form.search);
    REQUIRE(afterPlain.search);
    CHECK(form.search->layout.axes == afterPlain.search->layout.axes);
    CHECK(form.memoryBudgetBytes == afterPlain.memoryBudgetBytes);
    CHECK(form.pinnedDims == afterPlain.pinnedDims);
  }
}

TEST_CASE("an unlowered stage 0 over the budget has the lowered plan's figures") {
  // PlannerOptions::unloweredOverBudget (the joint search's first row): when no layout fits,
  // stage 0 is not lowered; its step, memory, layout and mesh must be the lowered plan's bit
  // for bit, and the ZeRO forms after it the same forms. Adam's transformer and Adafactor's
  // MoE (whose sums are ordered by stage 0's layout, read from that plan).
  struct Case {
    const char* file;
    const char* function;
  };
  for (Case c : {Case{"transformer.mesh", "lm_train"}, Case{"moe.mesh", "moe_train"}}) {
    CAPTURE(c.file);
    SemaOptions options;
    options.mesh = {{"data", 2}, {"model", 2}};
    options.layout = "auto";
    Compiled compiled(std::string(MESHC_SOURCE_DIR) + "/dsl-examples/" + c.file, options);
    REQUIRE(compiled.module);
    for (ir::Function& fn : compiled.module->functions)
      REQUIRE(train::lowerTraining(fn, compiled.diag, train::pinnedDims(*compiled.module)));
    PlannerOptions plannerOptions;
    plannerOptions.machine = "8xh100";
    plannerOptions.memoryBudgetBytes = 1; // nothing fits
    Machine h100 = machine("8xh100");
    auto lowered = planZeroCandidates(*compiled.module, h100, plannerOptions, c.function,
                                      {0, 3, 1}, nullptr, compiled.diag);
    plannerOptions.unloweredOverBudget = true;
    auto unlowered = planZeroCandidates(*compiled.module, h100, plannerOptions, c.function,
                                        {0, 3, 1}, nullptr, compiled.diag);
    REQUIRE(lowered);
    REQUIRE(unlowered);
    REQUIRE(lowered->size() == 3);
    REQUIRE(unlowered->size() == 3);
    const SpmdFunction& plain = lowered->front().spmd;
    const SpmdFunction& figures = unlowered->front().spmd;
    CHECK_FALSE(plain.ops.empty());
    CHECK(figures.ops.empty());
    CHECK(figures.summary.stepSeconds == plain.summary.stepSeconds);
    CHECK(figures.memory.total() == plain.memory.total());
    CHECK(figures.layout.axes == plain.layout.axes);
    CHECK(figures.mesh.numDevices() == plain.mesh.numDevices());
    CHECK(figures.name == plain.name);
    REQUIRE(unlowered->front().search);
    CHECK(unlowered->front().search->layout.axes == lowered->front().search->layout.axes);
    for (size_t k = 1; k < 3; ++k) {
      const PlannedFunction& form = (*unlowered)[k];
      const PlannedFunction& afterLowered = (*lowered)[k];
      REQUIRE(form.zero);
      REQUIRE(afterLowered.zero);
      CAPTURE(form.zero->stage);
      CHECK(form.zero->stage == afterLowered.zero->stage);
      CHECK(form.zero->stepBefore == afterLowered.zero->stepBefore);
      CHECK(form.zero->totalBefore == afterLowered.zero->totalBefore);
      CHECK(form.spmd.summary.stepSeconds == afterLowered.spmd.summary.stepSeconds);
      CHECK(form.spmd.memory.total() == afterLowered.spmd.memory.total());
      CHECK(form.spmd.ops.size() == afterLowered.spmd.ops.size());
    }
  }
}
