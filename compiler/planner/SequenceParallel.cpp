// Sequence parallelism: one walk over the ops groups the values a resolving all-reduce-sum
// feeds through row-wise ops into regions (union-find: a residual add joins two), prices each
// region both ways with the cost model, and rewrites the regions that gain: the all-reduces
// become reduce-scatters into the row dim, the region's values and ops shrink to the rank's
// rows, and each region value that a non-row-wise reader (or an output) needs is all-gathered
// once, right before its first such reader.
#include "planner/SequenceParallel.h"

#include "ir/OpTraits.h"
#include "planner/CostModel.h"
#include "planner/Reshard.h"

#include <fmt/format.h>
#include <llvm/ADT/StringExtras.h>

#include <algorithm>
#include <map>
#include <numeric>

namespace meshc::plan {

bool isRowWiseKind(ir::OpKind kind) {
  const ir::OpTraits& traits = ir::opTraits(kind);
  // An elementwise op keeps every named index. A transpose does too, but it reorders the local
  // buffer, so that a row split of its operand is not one of its result: kept whole.
  if (traits.isElementwise()) return traits.result != ir::ResultRule::Permute;
  // The ops that act along their [dims] (the reductions, layer_norm) keep the other dims' index;
  // the walk checks that the row dim is not among them. Softmax-like ops act along one [dim]
  // and dropout draws by global index: kept whole.
  for (llvm::StringRef attr :
       llvm::split(llvm::StringRef(traits.attrs.data(), traits.attrs.size()), ' '))
    if (attr == "dims") return true;
  return false;
}

namespace {

std::vector<std::string> reducedDims(const SpmdOp& op) {
  if (const ir::AttrValue* value = op.attr("dims"))
    if (const auto* dims = std::get_if<std::vector<std::string>>(value)) return *dims;
  return {};
}

/// A region: the values made from the all-reduces `seeds` by row-wise ops, all with the row
/// dim `dim` split over `before` (the axes it had), to be split further over `axes`.
struct Region {
  AxisList axes;
  std::string dim;
  AxisList before;
  int64_t group = 1;
  std::vector<size_t> seeds; // the all-reduce ops
  std::vector<size_t> ops;   // the row-wise ops
  std::vector<SpmdValueId> values;
};

class RowSplitter {
public:
  RowSplitter(SpmdFunction& fn, const Machine& machine)
      : fn_(fn), machine_(machine), regionOf_(fn.values.size(), -1) {}

  double run() {
    findRegions();
    double saved = 0;
    std::vector<bool> apply(regions_.size(), false);
    for (size_t r = 0; r < regions_.size(); ++r) {
      if (parent(r) != r) continue;
      double gain = gainOf(r);
      // Ties keep the all-reduce: one collective, which merging may still bucket.
      if (gain > 1e-9 * std::max(fn_.summary.stepSeconds, 1e-12)) {
        apply[r] = true;
        saved += gain;
      }
    }
    if (saved == 0) return 0;
    rewrite(apply);
    PlanSummary& summary = fn_.summary;
    double before = summary.stepSeconds;
    summary.communicationSeconds += communicationDelta_;
    summary.computeSeconds -= computeSaved_;
    summary.stepSeconds = summary.computeSeconds + summary.communicationSeconds;
    if (summary.stepSeconds > 0) summary.utilization *= before / summary.stepSeconds;
    return saved;
  }

private:
  size_t parent(size_t r) {
    while (parents_[r] != r)
      r = parents_[r] = parents_[parents_[r]];
    return r;
  }

  int regionOfValue(SpmdValueId id) {
    int r = regionOf_[id];
    return r < 0 ? -1 : static_cast<int>(parent(static_cast<size_t>(r)));
  }

  /// A resolving all-reduce-sum whose result can be split along a dim over its axes.
  void seed(size_t index) {
    const SpmdOp& op = fn_.ops[index];
    const SpmdValue& value = fn_.values[op.result];
    if (!value.layout.partialAxes.empty() || !ir::isFloat(value.globalType.dtype)) return;
    int64_t group = splitFactor(fn_.mesh, op.collective.axes);
    if (group <= 1) return;
    // The major-most dim that the group can split further: its rows are contiguous blocks.
    for (size_t d = 0; d < value.globalType.dims.size(); ++d) {
      const AxisList& axes = value.layout.dimAxes[d];
      int64_t split = splitFactor(fn_.mesh, axes) * group;
      if (value.globalType.dims[d].size % split != 0) continue;
      Region region{
          op.collective.axes, value.globalType.dims[d].name, axes, group, {index}, {}, {}};
      regionOf_[op.result] = static_cast<int>(regions_.size());
      parents_.push_back(regions_.size());
      regions_.push_back(std::move(region));
      return;
    }
  }

  /// Whether value `id` (in a region) has its region's row dim with the region's axes.
  bool hasRow(SpmdValueId id, const Region& region) const {
    const SpmdValue& value = fn_.values[id];
    int at = value.globalType.findDim(region.dim);
    return at >= 0 && value.layout.dimAxes[size_t(at)] == region.before;
  }

  /// Op `index` (compute) joins a region when each operand is in one region of the same kind or
  /// lacks the row dim, and the op keeps the rows: a row-wise kind not reducing over the row
  /// dim, a whole (non-partial) result with the row dim as the region has it, and no in-place
  /// collective of its own after it. Otherwise its region operands are read whole.
  void visitCompute(size_t index) {
    const SpmdOp& op = fn_.ops[index];
    int joined = -1;
    bool any = false, ok = isRowWiseKind(op.computeKind);
    for (SpmdValueId operand : op.operands) {
      int r = regionOfValue(operand);
      if (r < 0) continue;
      any = true;
      if (joined < 0) {
        joined = r;
      } else if (joined != r) {
        const Region &a = regions_[size_t(joined)], &b = regions_[size_t(r)];
        if (a.axes != b.axes || a.dim != b.dim || a.before != b.before) ok = false;
      }
    }
    if (!any) return;
    const Region& region = regions_[size_t(joined)];
    const SpmdValue& result = fn_.values[op.result];
    if (ok) {
      ok = result.layout.partialAxes.empty() && hasRow(op.result, region);
      std::vector<std::string> reduced = reducedDims(op);
      if (std::find(reduced.begin(), reduced.end(), region.dim) != reduced.end()) ok = false;
      for (SpmdValueId operand : op.operands)
        if (regionOfValue(operand) < 0 && !fn_.values[operand].layout.partialAxes.empty())
          ok = false;
        else if (regionOfValue(operand) < 0 &&
                 fn_.values[operand].globalType.findDim(region.dim) >= 0 &&
                 !sliceable(operand, region))
          ok = false;
      if (index + 1 < fn_.ops.size()) {
        const SpmdOp& next = fn_.ops[index + 1];
        if (next.kind == SpmdOp::Kind::Collective && next.result == op.result) ok = false;
      }
    }
    if (!ok) {
      for (SpmdValueId operand : op.operands)
        if (regionOfValue(operand) >= 0) wholeReads_.push_back({operand, index});
      return;
    }
    for (SpmdValueId operand : op.operands)
      if (int r = regionOfValue(operand); r >= 0 && r != joined)
        parents_[size_t(r)] = static_cast<size_t>(joined);
    regions_[size_t(joined)].ops.push_back(index);
    regionOf_[op.result] = joined;
    for (SpmdValueId operand : op.operands)
      if (regionOfValue(operand) < 0 && fn_.values[operand].globalType.findDim(region.dim) >= 0)
        sliceReads_.push_back({operand, index});
  }

  /// Whether a whole value outside the regions (the residual stream before the first partial
  /// sum, e.g. an embedding that is not one) can join `region` by a local slice of its rows:
  /// the row dim as the region has it and the region's axes unused by the value.
  bool sliceable(SpmdValueId id, const Region& region) const {
    const SpmdValue& value = fn_.values[id];
    if (!hasRow(id, region)) return false;
    for (const AxisList& axes : value.layout.dimAxes)
      for (const std::string& axis : region.axes)
        if (std::find(axes.begin(), axes.end(), axis) != axes.end()) return false;
    return true;
  }

  void findRegions() {
    for (size_t i = 0; i < fn_.ops.size(); ++i) {
      const SpmdOp& op = fn_.ops[i];
      if (op.kind == SpmdOp::Kind::Compute) {
        visitCompute(i);
        continue;
      }
      for (SpmdValueId operand : op.operands)
        if (regionOfValue(operand) >= 0) wholeReads_.push_back({operand, i});
      if (op.collective.kind == CollectiveKind::AllReduceSum && op.operands.size() == 1 &&
          op.operands[0] != op.result && !op.collective.axes.empty())
        seed(i);
    }
    for (const auto& [name, id] : fn_.outputs)
      if (regionOfValue(id) >= 0) wholeReads_.push_back({id, fn_.ops.size()});
    for (size_t r = 0; r < regions_.size(); ++r) {
      size_t root = parent(r);
      if (root == r) continue;
      Region& into = regions_[root];
      for (size_t s : regions_[r].seeds)
        into.seeds.push_back(s);
      for (size_t o : regions_[r].ops)
        into.ops.push_back(o);
    }
    for (SpmdValueId id = 0; id < fn_.values.size(); ++id)
      if (int r = regionOfValue(id); r >= 0) regions_[size_t(r)].values.push_back(id);
  }

  Collective scatterOf(const Region& region, const SpmdOp& allReduce) const {
    Collective c = allReduce.collective;
    c.kind = CollectiveKind::ReduceScatter;
    c.dim = region.dim;
    return c; // bytes: the input's, as for the all-reduce
  }

  Collective gatherOf(const Region& region, SpmdValueId id) const {
    Collective c;
    c.kind = CollectiveKind::AllGather;
    c.axes = region.axes;
    c.dim = region.dim;
    c.groupSize = region.group;
    c.bytes = localBytes(fn_.values[id].globalType, fn_.values[id].layout, fn_.mesh);
    return c;
  }

  const SpmdOp* producer(SpmdValueId id) const {
    for (const SpmdOp& op : fn_.ops)
      if (op.result == id) return &op;
    return nullptr;
  }

  /// Predicted seconds saved by region r's split form (negative: it costs more).
  double gainOf(size_t r) {
    const Region& region = regions_[r];
    double gain = 0;
    for (size_t s : region.seeds) {
      gain +=
          fn_.ops[s].seconds - collectiveSeconds(machine_, fn_.mesh, scatterOf(region, fn_.ops[s]));
    }
    for (size_t o : region.ops) {
      gain += fn_.ops[o].seconds * (1 - 1.0 / double(region.group));
    }
    std::vector<SpmdValueId> gathered;
    for (const auto& [id, reader] : wholeReads_)
      if (regionOfValue(id) == static_cast<int>(r) &&
          std::find(gathered.begin(), gathered.end(), id) == gathered.end()) {
        gathered.push_back(id);
        gain -= collectiveSeconds(machine_, fn_.mesh, gatherOf(region, id));
      }
    return gain;
  }

  void rewrite(const std::vector<bool>& apply) {
    // The gathers, before their first whole reader (readers come in op order).
    std::map<SpmdValueId, SpmdValueId> gatheredOf;
    std::multimap<size_t, SpmdOp> before; // op index -> gathers to insert before it
    for (const auto& [id, reader] : wholeReads_) {
      int r = regionOfValue(id);
      if (r < 0 || !apply[size_t(r)]) continue;
      auto [it, fresh] = gatheredOf.emplace(id, static_cast<SpmdValueId>(fn_.values.size()));
      if (fresh) {
        const Region& region = regions_[size_t(r)];
        SpmdValue whole = fn_.values[id];
        fn_.values.push_back(whole);
        SpmdOp gather;
        gather.kind = SpmdOp::Kind::Collective;
        gather.collective = gatherOf(region, id);
        gather.operands = {id};
        gather.result = it->second;
        // An output's gather takes the location of the op that made the value.
        const SpmdOp* at = reader < fn_.ops.size() ? &fn_.ops[reader] : producer(id);
        gather.loc = at ? at->loc : ir::Location{};
        gather.sourceOp = at ? at->sourceOp : 0;
        gather.phase = at ? at->phase : Phase::Forward;
        gather.seconds = collectiveSeconds(machine_, fn_.mesh, gather.collective);
        gather.note = fmt::format("sequence parallelism: gather the rows of %{} ({} split over {}) "
                                  "for a reader that needs them whole",
                                  id, region.dim, fmt::join(region.axes, ", "));
        communicationDelta_ += gather.seconds;
        before.emplace(reader, std::move(gather));
      }
      if (reader < fn_.ops.size()) {
        for (SpmdValueId& operand : fn_.ops[reader].operands)
          if (operand == id) operand = it->second;
      }
    }
    for (auto& [name, id] : fn_.outputs)
      if (auto it = gatheredOf.find(id); it != gatheredOf.end()) id = it->second;
    // The local slices of whole values that row-split ops read, before their first such reader.
    std::map<std::pair<SpmdValueId, int>, SpmdValueId> slicedOf;
    for (const auto& [id, reader] : sliceReads_) {
      int r = regionOfValue(fn_.ops[reader].result);
      if (r < 0 || !apply[size_t(r)]) continue;
      const Region& region = regions_[size_t(r)];
      auto [it, fresh] =
          slicedOf.emplace(std::pair{id, r}, static_cast<SpmdValueId>(fn_.values.size()));
      if (fresh) {
        SpmdValue sliced = fn_.values[id];
        int at = sliced.globalType.findDim(region.dim);
        AxisList& axes = sliced.layout.dimAxes[size_t(at)];
        axes.insert(axes.end(), region.axes.begin(), region.axes.end());
        sliced.localType.dims[size_t(at)].size /= region.group;
        SpmdOp slice;
        slice.kind = SpmdOp::Kind::Collective;
        slice.collective.kind = CollectiveKind::LocalSlice;
        slice.collective.axes = region.axes;
        slice.collective.dim = region.dim;
        slice.collective.groupSize = region.group;
        slice.collective.bytes = localBytes(sliced.globalType, sliced.layout, fn_.mesh);
        fn_.values.push_back(std::move(sliced));
        slice.operands = {id};
        slice.result = it->second;
        slice.loc = fn_.ops[reader].loc;
        slice.sourceOp = fn_.ops[reader].sourceOp;
        slice.phase = fn_.ops[reader].phase;
        slice.note = fmt::format("sequence parallelism: this rank's rows of %{} for the row-split "
                                 "region",
                                 id);
        before.emplace(reader, std::move(slice));
      }
      for (SpmdValueId& operand : fn_.ops[reader].operands)
        if (operand == id) operand = it->second;
    }

    for (size_t r = 0; r < regions_.size(); ++r) {
      if (!apply[r]) continue;
      const Region& region = regions_[r];
      for (SpmdValueId id : region.values) {
        SpmdValue& value = fn_.values[id];
        int at = value.globalType.findDim(region.dim);
        AxisList& axes = value.layout.dimAxes[size_t(at)];
        axes.insert(axes.end(), region.axes.begin(), region.axes.end());
        value.localType.dims[size_t(at)].size /= region.group;
      }
      for (size_t s : region.seeds) {
        SpmdOp& op = fn_.ops[s];
        double old = op.seconds;
        op.collective = scatterOf(region, op);
        op.seconds = collectiveSeconds(machine_, fn_.mesh, op.collective);
        communicationDelta_ += op.seconds - old;
        op.note = fmt::format("sequence parallelism: {}; the rows of {} split over {} until a "
                              "reader needs them whole",
                              op.note.empty() ? "resolve the partial sum" : op.note, region.dim,
                              fmt::join(region.axes, ", "));
      }
      double share = 1.0 / double(region.group);
      for (size_t o : region.ops) {
        SpmdOp& op = fn_.ops[o];
        computeSaved_ += op.seconds * (1 - share);
        op.seconds *= share;
        op.flops *= share;
        op.memoryBytes *= share;
      }
    }

    std::vector<SpmdOp> ops;
    ops.reserve(fn_.ops.size() + before.size());
    for (size_t i = 0; i <= fn_.ops.size(); ++i) {
      auto [first, last] = before.equal_range(i);
      for (auto it = first; it != last; ++it)
        ops.push_back(std::move(it->second));
      if (i < fn_.ops.size()) ops.push_back(std::move(fn_.ops[i]));
    }
    fn_.ops = std::move(ops);
  }

  SpmdFunction& fn_;
  const Machine& machine_;
  std::vector<int> regionOf_;
  std::vector<Region> regions_;
  std::vector<size_t> parents_;
  /// Reads of region values that need them whole: (value, reading op; ops.size(): an output).
  std::vector<std::pair<SpmdValueId, size_t>> wholeReads_;
  /// Reads of whole values outside the regions by row-split ops: (value, reading op).
  std::vector<std::pair<SpmdValueId, size_t>> sliceReads_;
  double communicationDelta_ = 0, computeSaved_ = 0;
};

} // namespace

double splitRowsOfPartialSums(SpmdFunction& fn, const Machine& machine) {
  // Train steps keep the all-reduce form: their backward reads the forward's values whole.
  if (fn.summary.includesBackward || !fn.updates.empty() || fn.stages.count > 1) return 0;
  double saved = RowSplitter(fn, machine).run();
  return saved;
}

} // namespace meshc::plan
