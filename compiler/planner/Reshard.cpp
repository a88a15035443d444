#include "planner/Reshard.h"

#include <algorithm>
#include <map>
#include <queue>
#include <tuple>
#include <unordered_map>

namespace meshc::plan {

int64_t dtypeBytes(ir::DType dtype) {
  switch (dtype) {
  case ir::DType::F32:
  case ir::DType::I32:
    return 4;
  case ir::DType::BF16:
  case ir::DType::F16:
    return 2;
  }
  return 4;
}

int64_t localBytes(const ir::TensorType& type, const TensorLayout& layout, const Mesh& mesh) {
  int64_t elements = 1;
  for (size_t i = 0; i < type.dims.size(); ++i) {
    int64_t factor = i < layout.dimAxes.size() ? splitFactor(mesh, layout.dimAxes[i]) : 1;
    elements *= factor > 0 ? type.dims[i].size / factor : type.dims[i].size;
  }
  return elements * dtypeBytes(type.dtype);
}

bool isLegalLayout(const ir::TensorType& type, const TensorLayout& layout, const Mesh& mesh) {
  if (layout.dimAxes.size() != type.dims.size()) return false;
  std::set<std::string> used;
  for (size_t i = 0; i < type.dims.size(); ++i) {
    for (const std::string& axis : layout.dimAxes[i])
      if (mesh.axisIndex(axis) < 0 || !used.insert(axis).second) return false;
    int64_t factor = splitFactor(mesh, layout.dimAxes[i]);
    if (factor <= 0 || type.dims[i].size % factor != 0) return false;
  }
  for (const std::string& axis : layout.partialAxes)
    if (mesh.axisIndex(axis) < 0 || used.count(axis)) return false;
  return true;
}

namespace {

/// Expands the states reachable in one collective from a state.
class ReshardGraph {
public:
  ReshardGraph(const ir::TensorType& type, const Mesh& mesh, const Machine& machine)
      : type_(type), mesh_(mesh), machine_(machine) {}

  template <typename Visit> void forEachEdge(const TensorLayout& state, Visit&& visit) const {
    auto used = [&](const std::string& axis) {
      for (const AxisList& axes : state.dimAxes)
        if (std::find(axes.begin(), axes.end(), axis) != axes.end()) return true;
      return false;
    };
    AxisList partial = inMeshOrder(state.partialAxes);
    int64_t bytes = localBytes(type_, state, mesh_);

    // Resolve some partial axes: all-reduce, or (sums only) reduce-scatter into a dim.
    for (const AxisList& subset : subsets(partial)) {
      TensorLayout reduced = state;
      for (const std::string& axis : subset)
        reduced.partialAxes.erase(axis);
      if (reduced.partialAxes.empty()) reduced.partialIsMax = false;
      Collective allReduce;
      allReduce.kind =
          state.partialIsMax ? CollectiveKind::AllReduceMax : CollectiveKind::AllReduceSum;
      allReduce.axes = subset;
      allReduce.bytes = bytes;
      emit(allReduce, reduced, visit);
      if (state.partialIsMax) continue;
      AxisList order = subset;
      do {
        for (size_t dim = 0; dim < type_.dims.size(); ++dim) {
          TensorLayout scattered = reduced;
          AxisList& axes = scattered.dimAxes[dim];
          axes.insert(axes.end(), order.begin(), order.end());
          if (!divides(dim, axes)) continue;
          Collective reduceScatter;
          reduceScatter.kind = CollectiveKind::ReduceScatter;
          reduceScatter.axes = order;
          reduceScatter.dim = type_.dims[dim].name;
          reduceScatter.bytes = bytes;
          emit(reduceScatter, scattered, visit);
        }
      } while (std::next_permutation(order.begin(), order.end(), meshOrder()));
    }

    for (size_t dim = 0; dim < type_.dims.size(); ++dim) {
      const AxisList& axes = state.dimAxes[dim];
      // All-gather the minor-most m axes of a dim.
      for (size_t m = 1; m <= axes.size(); ++m) {
        TensorLayout gathered = state;
        AxisList& kept = gathered.dimAxes[dim];
        AxisList removed(kept.end() - m, kept.end());
        kept.resize(kept.size() - m);
        Collective allGather;
        allGather.kind = CollectiveKind::AllGather;
        allGather.axes = removed;
        allGather.dim = type_.dims[dim].name;
        allGather.bytes = localBytes(type_, gathered, mesh_);
        emit(allGather, gathered, visit);
      }
      // Local slice: split further over an axis nobody uses. Free.
      for (const ir::MeshAxis& axis : mesh_.axes) {
        if (used(axis.name) || state.partialAxes.count(axis.name)) continue;
        TensorLayout sliced = state;
        sliced.dimAxes[dim].push_back(axis.name);
        if (!divides(dim, sliced.dimAxes[dim])) continue;
        Collective slice;
        slice.kind = CollectiveKind::LocalSlice;
        slice.axes = {axis.name};
        slice.dim = type_.dims[dim].name;
        slice.bytes = localBytes(type_, sliced, mesh_);
        emit(slice, sliced, visit);
      }
      // All-to-all: the minor-most axis of this dim becomes the minor-most axis of another.
      if (axes.empty()) continue;
      for (size_t to = 0; to < type_.dims.size(); ++to) {
        if (to == dim) continue;
        TensorLayout moved = state;
        std::string axis = moved.dimAxes[dim].back();
        moved.dimAxes[dim].pop_back();
        moved.dimAxes[to].push_back(axis);
        if (!divides(to, moved.dimAxes[to])) continue;
        Collective allToAll;
        allToAll.kind = CollectiveKind::AllToAll;
        allToAll.axes = {axis};
        allToAll.dim = type_.dims[dim].name;
        allToAll.toDim = type_.dims[to].name;
        allToAll.bytes = bytes;
        emit(allToAll, moved, visit);
      }
    }
  }

private:
  /// Visits an edge with a function that costs it: the search asks for the seconds only of an
  /// edge into a state not settled yet (a quarter of the edges lead back to settled ones).
  template <typename Visit>
  void emit(Collective collective, const TensorLayout& next, Visit& visit) const {
    collective.groupSize = splitFactor(mesh_, collective.axes);
    visit(collective, next, [&] { return collectiveSeconds(machine_, mesh_, collective); });
  }

  bool divides(size_t dim, const AxisList& axes) const {
    int64_t factor = splitFactor(mesh_, axes);
    return factor > 0 && type_.dims[dim].size % factor == 0;
  }

  /// Orders axis names as the mesh lists them. A named type, not `auto`: it is used above its
  /// definition, which clang rejects for a deduced return type.
  struct MeshOrder {
    const Mesh* mesh;
    bool operator()(const std::string& a, const std::string& b) const {
      return mesh->axisIndex(a) < mesh->axisIndex(b);
    }
  };
  MeshOrder meshOrder() const { return MeshOrder{&mesh_}; }

  AxisList inMeshOrder(const std::set<std::string>& axes) const {
    AxisList out(axes.begin(), axes.end());
    std::sort(out.begin(), out.end(), meshOrder());
    return out;
  }

  /// Non-empty subsets, each in mesh order.
  static std::vector<AxisList> subsets(const AxisList& axes) {
    std::vector<AxisList> out;
    size_t n = std::min<size_t>(axes.size(), 16);
    for (uint32_t mask = 1; mask < (1u << n); ++mask) {
      AxisList subset;
      for (size_t i = 0; i < n; ++i)
        if (mask & (1u << i)) subset.push_back(axes[i]);
      out.push_back(std::move(subset));
    }
    return out;
  }

  const ir::TensorType& type_;
  const Mesh& mesh_;
  const Machine& machine_;
};

/// Beyond this many states (meshes with many axes), the search gives up on optimality.
constexpr size_t kMaxStates = 20'000;

/// Costs this close (relative) are a tie, broken by fewer steps. The cost formulas make some
/// paths equal by construction (an all-reduce, 2a + 2bn, against a reduce-scatter and an
/// all-gather, a + bn each), and floating-point rounding must not pick the longer one: it costs
/// a second latency, and only single all-reduces merge into buckets (MergeCollectives.h).
constexpr double kTieTolerance = 1e-9;

/// Whether reaching a state at (`seconds`, `steps`) beats having reached it at (`bestSeconds`,
/// `bestSteps`): clearly cheaper, or as cheap within kTieTolerance with fewer steps.
bool betterPath(double seconds, size_t steps, double bestSeconds, size_t bestSteps) {
  double tolerance = kTieTolerance * std::max(seconds, bestSeconds);
  if (seconds < bestSeconds - tolerance) return true;
  return seconds <= bestSeconds + tolerance && steps < bestSteps;
}

/// Always legal, rarely optimal: resolve every partial axis, gather every split dim, slice.
ReshardPath fallbackPath(const ir::TensorType& type, const TensorLayout& from,
                         const TensorLayout& to, const Mesh& mesh, const Machine& machine) {
  ReshardPath path;
  TensorLayout state = from;
  auto step = [&](Collective collective) {
    collective.groupSize = splitFactor(mesh, collective.axes);
    double seconds = collectiveSeconds(machine, mesh, collective);
    path.seconds += seconds;
    path.steps.push_back({std::move(collective), state, seconds});
  };
  if (!state.partialAxes.empty()) {
    Collective allReduce;
    allReduce.kind =
        state.partialIsMax ? CollectiveKind::AllReduceMax : CollectiveKind::AllReduceSum;
    for (const ir::MeshAxis& axis : mesh.axes)
      if (state.partialAxes.count(axis.name)) allReduce.axes.push_back(axis.name);
    allReduce.bytes = localBytes(type, state, mesh);
    state.partialAxes.clear();
    state.partialIsMax = false;
    step(std::move(allReduce));
  }
  for (size_t dim = 0; dim < type.dims.size(); ++dim) {
    if (state.dimAxes[dim].empty() || state.dimAxes[dim] == to.dimAxes[dim]) continue;
    Collective allGather;
    allGather.kind = CollectiveKind::AllGather;
    allGather.axes = state.dimAxes[dim];
    allGather.dim = type.dims[dim].name;
    state.dimAxes[dim].clear();
    allGather.bytes = localBytes(type, state, mesh);
    step(std::move(allGather));
  }
  for (size_t dim = 0; dim < type.dims.size(); ++dim) {
    if (state.dimAxes[dim] == to.dimAxes[dim]) continue;
    Collective slice;
    slice.kind = CollectiveKind::LocalSlice;
    slice.axes = to.dimAxes[dim];
    slice.dim = type.dims[dim].name;
    state.dimAxes[dim] = to.dimAxes[dim];
    slice.bytes = localBytes(type, state, mesh);
    step(std::move(slice));
  }
  return path;
}

} // namespace

std::optional<ReshardPath> planReshard(const ir::TensorType& type, const TensorLayout& from,
                                       const TensorLayout& to, const Mesh& mesh,
                                       const Machine& machine) {
  if (!isLegalLayout(type, from, mesh) || !isLegalLayout(type, to, mesh)) return std::nullopt;
  // No collective creates a partial sum: a partial target keeps some of the source's.
  bool partialReachable = std::includes(from.partialAxes.begin(), from.partialAxes.end(),
                                        to.partialAxes.begin(), to.partialAxes.end()) &&
                          (to.partialAxes.empty() || to.partialIsMax == from.partialIsMax);
  if (!partialReachable) return std::nullopt;
  if (from == to) return ReshardPath{};

  struct Reached {
    double seconds = 0;
    size_t steps = 0;
    bool done = false;
    int64_t previous = -1; // the state it was reached from (an index into `states`)
    /// The step from there, without its layout after (the state itself: copied into the path
    /// only when one is returned, not each time a better way to a state is found).
    Collective collective;
    double stepSeconds = 0;
  };
  // The states reached, each once, named by an index in the queue and the back links (copying
  // a layout per queue entry and per link was most of a search's time).
  std::unordered_map<TensorLayout, size_t, TensorLayoutHash> indexOf; // indices in first-seen order
  std::vector<const TensorLayout*> states; // indexOf's keys, which stay put (its nodes do)
  std::vector<Reached> reached;
  auto indexFor = [&](const TensorLayout& state) -> std::pair<size_t, bool> {
    auto [it, inserted] = indexOf.try_emplace(state, states.size());
    if (inserted) {
      states.push_back(&it->first);
      reached.emplace_back();
    }
    return {it->second, inserted};
  };
  // Ordered by time, then steps, then the order queued (unique: the index never decides).
  using Entry = std::tuple<double, size_t, uint64_t, size_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  uint64_t order = 0;
  queue.emplace(0.0, 0, order++, indexFor(from).first);
  ReshardGraph graph(type, mesh, machine);

  while (!queue.empty()) {
    if (reached.size() > kMaxStates) return fallbackPath(type, from, to, mesh, machine);
    size_t index = std::get<3>(queue.top());
    queue.pop();
    if (reached[index].done) continue;
    reached[index].done = true;
    // The best path found, which a near-tie with fewer steps may have replaced after this
    // entry was queued.
    double seconds = reached[index].seconds;
    size_t steps = reached[index].steps;
    const TensorLayout& state = *states[index];
    if (state == to) {
      ReshardPath path;
      path.seconds = seconds;
      for (int64_t at = static_cast<int64_t>(index); reached[size_t(at)].previous >= 0;
           at = reached[size_t(at)].previous) {
        const Reached& link = reached[size_t(at)];
        path.steps.push_back(ReshardStep{link.collective, *states[size_t(at)], link.stepSeconds});
      }
      std::reverse(path.steps.begin(), path.steps.end());
      return path;
    }
    auto relax = [&](Collective& collective, const TensorLayout& next, const auto& costEdge) {
      auto [nextIndex, inserted] = indexFor(next);
      Reached& there = reached[nextIndex];
      if (!inserted && there.done) return;
      double edgeSeconds = costEdge();
      double total = seconds + edgeSeconds;
      if (!inserted && !betterPath(total, steps + 1, there.seconds, there.steps)) return;
      there.seconds = total;
      there.steps = steps + 1;
      there.previous = static_cast<int64_t>(index);
      there.collective = std::move(collective);
      there.stepSeconds = edgeSeconds;
      queue.emplace(total, steps + 1, order++, nextIndex);
    };
    graph.forEachEdge(state, relax);
  }
  return std::nullopt;
}

} // namespace meshc::plan
