// The planner's reports. Everything printed is a function of the plan alone (predicted times,
// not measured ones), so the text is stable and golden tests can compare it.
#include "planner/PlanReport.h"

#include "ir/IRPrinter.h"
#include "planner/CostModel.h"
#include "planner/Microbatching.h"
#include "planner/RecomputeReport.h"

#include <fmt/format.h>
#include <llvm/Support/JSON.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

namespace meshc::plan {

namespace {

/// The ZeRO section of --emit=plan.
void printZeroReport(const ZeroReport& report, llvm::raw_ostream& os) {
  size_t sharded = 0;
  for (const ZeroWeight& weight : report.weights)
    sharded += !weight.dim.empty();
  static const char* const what[] = {"", "optimizer state", "optimizer state and gradients",
                                     "optimizer state, gradients and params"};
  os << fmt::format("\nZeRO stage {}: {} split over each weight's data-parallel axes{}\n",
                    report.stage, what[std::clamp(report.stage, 1, 3)],
                    report.chosen ? " (chosen: no layout fits the budget without it)" : "");
  os << fmt::format("  weights       {} of {} sharded\n", sharded, report.weights.size());
  for (const ZeroWeight& weight : report.weights)
    if (weight.dim.empty())
      os << fmt::format("    {} stays whole: {}\n", weight.path, weight.reason);
  auto line = [&](const char* name, double before, double after) {
    os << fmt::format("  {:<13} {} -> {}\n", name, bytesString(before), bytesString(after));
  };
  line("parameters", report.before.params, report.after.params);
  line("gradients", report.before.gradients, report.after.gradients);
  line("optimizer", report.before.optimizer, report.after.optimizer);
  line("plan total", report.totalBefore, report.totalAfter);
  os << fmt::format("  traffic       {} reduce-scatters ({}, {}), {} all-gathers ({}, {})\n",
                    report.reduceScatters, bytesString(report.reduceScatterBytes),
                    secondsString(report.reduceScatterSeconds), report.allGathers,
                    bytesString(report.allGatherBytes), secondsString(report.allGatherSeconds));
  os << fmt::format("  step          {} -> {}\n", secondsString(report.stepBefore),
                    secondsString(report.stepAfter));
}

/// The `zero` object of plan-json.
void printZeroReportJson(const ZeroReport& report, llvm::json::OStream& json) {
  json.attributeObject("zero", [&] {
    json.attribute("stage", report.stage);
    json.attribute("chosen", report.chosen);
    json.attributeArray("weights", [&] {
      for (const ZeroWeight& weight : report.weights)
        json.object([&] {
          json.attribute("path", weight.path);
          json.attribute("dim", weight.dim);
          json.attributeArray("axes", [&] {
            for (const std::string& axis : weight.axes)
              json.value(axis);
          });
          json.attribute("reason", weight.reason);
        });
    });
    auto memory = [&](const char* key, const ZeroMemory& m) {
      json.attributeObject(key, [&] {
        json.attribute("paramBytes", m.params);
        json.attribute("gradientBytes", m.gradients);
        json.attribute("optimizerBytes", m.optimizer);
      });
    };
    memory("before", report.before);
    memory("after", report.after);
    json.attribute("totalBytesBefore", report.totalBefore);
    json.attribute("totalBytesAfter", report.totalAfter);
    json.attribute("stepSecondsBefore", report.stepBefore);
    json.attribute("stepSecondsAfter", report.stepAfter);
    json.attribute("reduceScatters", report.reduceScatters);
    json.attribute("reduceScatterBytes", report.reduceScatterBytes);
    json.attribute("reduceScatterSeconds", report.reduceScatterSeconds);
    json.attribute("allGathers", report.allGathers);
    json.attribute("allGatherBytes", report.allGatherBytes);
    json.attribute("allGatherSeconds", report.allGatherSeconds);
  });
}

std::string locString(const ir::Location& loc) {
  if (loc.line == 0) return "<no location>";
  return fmt::format("{}:{}:{}", loc.file, loc.line, loc.col);
}

std::string globalTypeString(const ir::TensorType& type) {
  std::string text;
  llvm::raw_string_ostream os(text);
  ir::printType(type, os);
  return os.str();
}

/// "f32[batch=4, seq=32]": a type with its sizes (local shapes differ from the declared ones).
std::string shapeString(const ir::TensorType& type) {
  std::vector<std::string> dims;
  for (const ir::Dim& dim : type.dims)
    dims.push_back(fmt::format("{}={}", dim.name, dim.size));
  return fmt::format("{}[{}]", ir::dtypeName(type.dtype), fmt::join(dims, ", "));
}

std::string axesString(const AxisList& axes) {
  return fmt::format("[{}]", fmt::join(axes, ", "));
}

std::string meshString(const Mesh& mesh) {
  if (mesh.axes.empty()) return "none";
  std::vector<std::string> axes;
  for (const ir::MeshAxis& axis : mesh.axes)
    axes.push_back(fmt::format("{}={}", axis.name, axis.size));
  return fmt::format("[{}]", fmt::join(axes, ", "));
}

std::string valueName(const SpmdFunction& fn, SpmdValueId id) {
  if (id < fn.values.size() && !fn.values[id].name.empty())
    return fmt::format("%{} ({})", id, fn.values[id].name);
  return fmt::format("%{}", id);
}

std::string percent(double part, double whole) {
  return whole > 0 ? fmt::format("{:.1f}%", 100 * part / whole) : "-";
}

const char* kindName(ir::Function::Kind kind) {
  return kind == ir::Function::Kind::Train ? "train" : "program";
}

std::string attrValueString(const ir::AttrValue& value) {
  if (const auto* number = std::get_if<double>(&value)) return fmt::format("{}", *number);
  if (const auto* integer = std::get_if<int64_t>(&value)) return fmt::format("{}", *integer);
  if (const auto* text = std::get_if<std::string>(&value)) return fmt::format("\"{}\"", *text);
  return fmt::format("[{}]", fmt::join(std::get<std::vector<std::string>>(value), ", "));
}

/// What one collective does, in words: "allreduce_sum over [model]", "all_gather of d_ff ...".
std::string collectiveSummary(const Collective& c) {
  std::string text = fmt::format("{} over {}", collectiveName(c.kind), axesString(c.axes));
  if (!c.dim.empty()) text += fmt::format(" dim {}", c.dim);
  if (!c.toDim.empty()) text += fmt::format(" -> {}", c.toDim);
  if (c.kind == CollectiveKind::Permute) text += fmt::format(" by {}", c.offset);
  return text;
}

/// Every dim of the function's tensors, with where its layout came from.
struct DimRow {
  std::string dim;
  AxisList axes;
  const char* source;
};

std::vector<DimRow> dimRows(const PlannedFunction& plan) {
  std::set<std::string> dims;
  for (const SpmdValue& value : plan.spmd.values)
    for (const ir::Dim& dim : value.globalType.dims)
      dims.insert(dim.name);
  std::set<std::string> searched;
  if (plan.search)
    searched.insert(plan.search->searchedDims.begin(), plan.search->searchedDims.end());
  std::vector<DimRow> rows;
  for (const std::string& dim : dims) {
    const char* source = plan.pinnedDims.count(dim) ? "pinned"
                         : searched.count(dim)      ? "searched"
                                                    : "replicated (not laid out)";
    rows.push_back({dim, plan.spmd.layout.of(dim), source});
  }
  return rows;
}

/// Inputs, params and outputs: the tensors whose local shape every report lists.
struct TensorRow {
  const char* role;
  std::string name;
  SpmdValueId value;
};

std::vector<TensorRow> tensorRows(const SpmdFunction& fn) {
  std::vector<TensorRow> rows;
  for (SpmdValueId id : fn.inputs)
    rows.push_back({"input", fn.values[id].name, id});
  for (SpmdValueId id : fn.params)
    rows.push_back({"param", fn.values[id].name, id});
  for (const auto& [name, id] : fn.outputs)
    rows.push_back({"output", name, id});
  return rows;
}

/// The source of every param value: its call path, from the Param op's attribute.
std::map<SpmdValueId, std::string> paramPaths(const SpmdFunction& fn) {
  std::map<SpmdValueId, std::string> paths;
  for (const SpmdOp& op : fn.ops)
    if (op.kind == SpmdOp::Kind::Compute && op.computeKind == ir::OpKind::Param)
      for (const auto& [key, value] : op.attrs)
        if (key == "path")
          if (const auto* path = std::get_if<std::string>(&value)) paths[op.result] = *path;
  return paths;
}

std::string tensorName(const TensorRow& row, const std::map<SpmdValueId, std::string>& paths) {
  auto it = paths.find(row.value);
  if (std::string(row.role) == "param" && it != paths.end()) return it->second;
  return row.name;
}

/// The collectives the generated code issues, in order (a merged all-reduce is one); local
/// slices, which only take this rank's part of a value, are not among them.
std::vector<const SpmdOp*> collectivesOf(const SpmdFunction& fn) {
  std::vector<const SpmdOp*> result;
  for (const SpmdOp& op : fn.ops)
    if (op.kind == SpmdOp::Kind::Collective && op.collective.kind != CollectiveKind::LocalSlice)
      result.push_back(&op);
  return result;
}

size_t localSlicesOf(const SpmdFunction& fn, std::optional<Phase> phase) {
  return static_cast<size_t>(std::count_if(fn.ops.begin(), fn.ops.end(), [&](const SpmdOp& op) {
    return op.kind == SpmdOp::Kind::Collective &&
           op.collective.kind == CollectiveKind::LocalSlice && (!phase || op.phase == *phase);
  }));
}

/// The attributes of plan-json's `jointSearch` object.
void jointSearchAttributes(const JointSearchReport& joint, llvm::json::OStream& json) {
  auto candidate = [&](const JointCandidate& c) {
    json.attribute("stages", c.stages);
    json.attribute("stageAxis", c.stageAxis);
    json.attribute("splitAxis", c.splitAxis);
    json.attribute("recompute", c.recompute);
    json.attribute("microbatches", c.microbatches);
    json.attribute("zeroStage", static_cast<int64_t>(c.zeroStage));
    json.attribute("stepSeconds", c.stepSeconds);
    json.attribute("memoryBytes", c.memoryBytes);
    json.attribute("fits", c.fits);
  };
  json.attribute("budgetBytes", joint.budgetBytes);
  json.attribute("plainMemoryBytes", joint.plainMemoryBytes);
  json.attribute("microbatchDim", joint.microbatchDim);
  json.attributeArray("considered", [&] {
    for (const JointCandidate& c : joint.considered)
      json.object([&] { candidate(c); });
  });
  if (joint.chosen >= 0)
    json.attributeObject("chosen", [&] { candidate(joint.considered[size_t(joint.chosen)]); });
  json.attributeArray("notTried", [&] {
    for (const std::string& line : joint.notTried)
      json.value(line);
  });
}

} // namespace

std::string jointSearchJson(const JointSearchReport& report) {
  std::string text;
  llvm::raw_string_ostream os(text);
  llvm::json::OStream json(os);
  json.object([&] { jointSearchAttributes(report, json); });
  return os.str();
}

std::string bytesString(double bytes) {
  if (!std::isfinite(bytes)) return "unbounded";
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} B", static_cast<int64_t>(std::llround(bytes)));
  double scaled = bytes / 1024;
  size_t unit = 0;
  while (scaled >= 1024 && unit + 1 < std::size(units)) {
    scaled /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", scaled, units[unit]);
}

std::string secondsString(double seconds) {
  if (!std::isfinite(seconds)) return "unbounded";
  if (seconds >= 1) return fmt::format("{:.3f} s", seconds);
  if (seconds >= 1e-3) return fmt::format("{:.3f} ms", seconds * 1e3);
  if (seconds >= 1e-6) return fmt::format("{:.3f} us", seconds * 1e6);
  return fmt::format("{:.1f} ns", seconds * 1e9);
}

void printPlan(const PlannedFunction& plan, const Machine& machine, llvm::raw_ostream& os) {
  const SpmdFunction& fn = plan.spmd;
  os << fmt::format("plan of {} {}\n", kindName(fn.kind), fn.name);
  os << fmt::format("  machine  {}: {}\n", machine.name, machine.description);
  os << fmt::format("  mesh     {}, {} device{}\n", meshString(fn.mesh), fn.mesh.numDevices(),
                    fn.mesh.numDevices() == 1 ? "" : "s");
  if (!plan.meshCandidates.empty()) {
    os << fmt::format("  mesh search: {} factorization{} of {} devices\n",
                      plan.meshCandidates.size(), plan.meshCandidates.size() == 1 ? "" : "s",
                      fn.mesh.numDevices());
    for (const auto& [mesh, seconds] : plan.meshCandidates)
      os << fmt::format("    {:<28} {}\n", meshString(mesh),
                        std::isfinite(seconds) ? secondsString(seconds) : "no layout fits");
  }

  os << "\nlayout\n";
  std::vector<DimRow> dims = dimRows(plan);
  size_t dimWidth = 0;
  for (const DimRow& row : dims)
    dimWidth = std::max(dimWidth, row.dim.size());
  for (const DimRow& row : dims)
    os << fmt::format("  {:<{}}  {:<16}  {}\n", row.dim, dimWidth, axesString(row.axes),
                      row.source);
  if (plan.search) {
    const SearchResult& search = *plan.search;
    os << fmt::format("  search: {} dim{} searched ({}), {} candidate layout{} evaluated, ",
                      search.searchedDims.size(), search.searchedDims.size() == 1 ? "" : "s",
                      fmt::join(search.searchedDims, ", "), search.candidatesEvaluated,
                      search.candidatesEvaluated == 1 ? "" : "s");
    if (search.exact)
      os << "exact (branch and bound)\n";
    else
      os << fmt::format("heuristic (coordinate descent), within {:.1f}% of a lower bound\n",
                        100 * search.gapBound);
  }

  os << "\ntensors (global type -> local shape per device, layout)\n";
  std::map<SpmdValueId, std::string> paths = paramPaths(fn);
  for (const TensorRow& row : tensorRows(fn)) {
    const SpmdValue& value = fn.values[row.value];
    os << fmt::format("  {:<6} {}: {} -> {}  {}\n", row.role, tensorName(row, paths),
                      globalTypeString(value.globalType), shapeString(value.localType),
                      tensorLayoutString(value.globalType, value.layout));
  }

  std::vector<const SpmdOp*> collectives = collectivesOf(fn);
  // A train step that went through autodiff lists its collectives per phase; otherwise all are
  // forward ones (and a train block's backward is modelled).
  std::vector<Phase> phases{Phase::Forward};
  if (fn.summary.backwardIsReal) phases = {Phase::Forward, Phase::Backward, Phase::Update};
  for (Phase phase : phases) {
    std::vector<const SpmdOp*> inPhase;
    double collectiveBytes = 0, collectiveSeconds = 0;
    for (const SpmdOp* op : collectives) {
      if (fn.summary.backwardIsReal && op->phase != phase) continue;
      inPhase.push_back(op);
      collectiveBytes += static_cast<double>(op->collective.bytes);
      collectiveSeconds += op->seconds;
    }
    os << fmt::format("\ncollectives of the {} ops: {}, {} per device, {} predicted{}\n",
                      phaseName(phase), inPhase.size(), bytesString(collectiveBytes),
                      secondsString(collectiveSeconds),
                      fn.summary.includesBackward && !fn.summary.backwardIsReal
                          ? " (backward mirrors them; gradient reductions are in the step below)"
                          : "");
    if (size_t slices =
            localSlicesOf(fn, fn.summary.backwardIsReal ? std::optional(phase) : std::nullopt))
      os << fmt::format("  and {} local slice{} (no communication: a rank takes its part of a "
                        "replicated value)\n",
                        slices, slices == 1 ? "" : "s");
    for (const SpmdOp* op : inPhase) {
      const Collective& c = op->collective;
      SpmdValueId operand = op->operands.empty() ? op->result : op->operands.front();
      os << fmt::format(
          "  {}  {} (group {}), {} -> {}: {} of {} {}, {}\n", locString(op->loc),
          collectiveSummary(c), c.groupSize, valueName(fn, operand), valueName(fn, op->result),
          bytesString(static_cast<double>(c.bytes)), shapeString(fn.values[operand].localType),
          tensorLayoutString(fn.values[operand].globalType, fn.values[operand].layout),
          secondsString(op->seconds));
      os << fmt::format(
          "      result {} {}", shapeString(fn.values[op->result].localType),
          tensorLayoutString(fn.values[op->result].globalType, fn.values[op->result].layout));
      if (!op->note.empty()) os << "; " << op->note;
      os << "\n";
    }
  }

  os << fmt::format("\nforced replications: {}\n", fn.replications.size());
  for (const Replication& r : fn.replications)
    os << fmt::format("  {}  dim {} replicated instead of split over {}: {}\n", locString(r.loc),
                      r.dim, axesString(r.droppedAxes), r.reason);

  const MemoryEstimate& memory = fn.memory;
  double budget = plan.memoryBudgetBytes > 0 ? plan.memoryBudgetBytes : machine.memoryBytes;
  os << fmt::format("\nmemory per device (budget {})\n", bytesString(budget));
  os << fmt::format("  parameters    {}\n", bytesString(memory.paramBytes));
  os << fmt::format("  optimizer     {}\n", bytesString(memory.optimizerBytes));
  os << fmt::format("  gradients     {}\n", bytesString(memory.gradientBytes));
  os << fmt::format("  activations   {} (peak live)\n", bytesString(memory.peakActivationBytes));
  if (std::string line = microbatchingSummary(fn); !line.empty())
    os << fmt::format("  microbatches  {}\n", line);
  os << fmt::format("  total         {} ({} of budget{})\n", bytesString(memory.total()),
                    percent(memory.total(), budget),
                    budget > 0 && memory.total() > budget ? ", OVER BUDGET" : "");
  if (plan.zero) printZeroReport(*plan.zero, os);
  printRecompute(fn, os);
  if (plan.joint) printJointSearch(*plan.joint, os);

  const PlanSummary& summary = fn.summary;
  os << fmt::format("\npredicted step{}\n",
                    summary.backwardIsReal     ? " (forward, backward and update, as planned)"
                    : summary.includesBackward ? " (forward, backward and gradient reduction)"
                                               : "");
  if (summary.backwardIsReal) {
    double seconds[3] = {0, 0, 0};
    for (const SpmdOp& op : fn.ops)
      seconds[static_cast<int>(op.phase)] += op.seconds;
    if (fn.microbatching.count > 1) // the whole step: the loop's ops count times
      std::copy(std::begin(fn.microbatching.phaseSeconds), std::end(fn.microbatching.phaseSeconds),
                seconds);
    os << fmt::format("  by phase      forward {}, backward {}, update {}\n",
                      secondsString(seconds[0]), secondsString(seconds[1]),
                      secondsString(seconds[2]));
  }
  os << fmt::format("  time          {}\n", secondsString(summary.stepSeconds));
  os << fmt::format("  compute       {} ({})\n", secondsString(summary.computeSeconds),
                    percent(summary.computeSeconds, summary.stepSeconds));
  os << fmt::format("  communication {} ({})\n", secondsString(summary.communicationSeconds),
                    percent(summary.communicationSeconds, summary.stepSeconds));
  os << fmt::format("  flops         {:.4g} (useful, all devices)\n", summary.totalFlops);
  os << fmt::format("  utilization   {:.1f}% of {} devices' peak\n", 100 * summary.utilization,
                    fn.mesh.numDevices());
}

void printPlanJson(const PlannedFunction& plan, const Machine& machine, llvm::raw_ostream& os) {
  const SpmdFunction& fn = plan.spmd;
  llvm::json::OStream json(os, 2);
  auto location = [&](const ir::Location& loc) {
    json.attributeObject("location", [&] {
      json.attribute("file", loc.file);
      json.attribute("line", static_cast<int64_t>(loc.line));
      json.attribute("col", static_cast<int64_t>(loc.col));
    });
  };
  auto axisArray = [&](llvm::StringRef key, const AxisList& axes) {
    json.attributeArray(key, [&] {
      for (const std::string& axis : axes)
        json.value(axis);
    });
  };
  json.object([&] {
    json.attribute("function", fn.name);
    json.attribute("kind", kindName(fn.kind));
    json.attributeObject("machine", [&] {
      json.attribute("name", machine.name);
      json.attribute("description", machine.description);
      json.attribute("devices", machine.numDevices);
      json.attribute("peakFlops", machine.peakFlops);
      json.attribute("memoryBytes", machine.memoryBytes);
    });
    json.attributeArray("mesh", [&] {
      for (const ir::MeshAxis& axis : fn.mesh.axes)
        json.object([&] {
          json.attribute("axis", axis.name);
          json.attribute("size", axis.size);
        });
    });
    json.attribute("devices", fn.mesh.numDevices());
    json.attributeArray("layout", [&] {
      for (const DimRow& row : dimRows(plan))
        json.object([&] {
          json.attribute("dim", row.dim);
          axisArray("axes", row.axes);
          json.attribute("source", llvm::StringRef(row.source).split(' ').first);
        });
    });
    json.attributeArray("meshCandidates", [&] {
      // Not a structured binding: captured by the lambda below, which is C++20 only, and this
      // file is compiled as C++17 under clang < 15 (compiler/CMakeLists.txt: llvm/Support/JSON.h).
      for (const auto& candidate : plan.meshCandidates)
        json.object([&] {
          json.attribute("mesh", meshString(candidate.first));
          if (std::isfinite(candidate.second))
            json.attribute("stepSeconds", candidate.second);
          else
            json.attribute("stepSeconds", nullptr);
        });
    });
    if (plan.search) {
      const SearchResult& search = *plan.search;
      json.attributeObject("search", [&] {
        json.attribute("exact", search.exact);
        json.attribute("gapBound", search.gapBound);
        json.attribute("candidatesEvaluated", static_cast<int64_t>(search.candidatesEvaluated));
        axisArray("searchedDims", search.searchedDims);
      });
    } else {
      json.attribute("search", nullptr);
    }
    std::map<SpmdValueId, std::string> paths = paramPaths(fn);
    json.attributeArray("tensors", [&] {
      for (const TensorRow& row : tensorRows(fn)) {
        const SpmdValue& value = fn.values[row.value];
        json.object([&] {
          json.attribute("role", row.role);
          json.attribute("name", tensorName(row, paths));
          json.attribute("value", static_cast<int64_t>(row.value));
          json.attribute("globalType", globalTypeString(value.globalType));
          json.attribute("globalShape", shapeString(value.globalType));
          json.attribute("localShape", shapeString(value.localType));
          json.attribute("layout", tensorLayoutString(value.globalType, value.layout));
        });
      }
    });
    json.attributeArray("collectives", [&] {
      for (const SpmdOp* op : collectivesOf(fn)) {
        const Collective& c = op->collective;
        SpmdValueId operand = op->operands.empty() ? op->result : op->operands.front();
        json.object([&] {
          json.attribute("kind", collectiveName(c.kind));
          json.attribute("phase", phaseName(op->phase));
          axisArray("axes", c.axes);
          json.attribute("dim", c.dim);
          json.attribute("toDim", c.toDim);
          json.attribute("offset", c.offset);
          json.attribute("groupSize", c.groupSize);
          json.attribute("bytes", c.bytes);
          json.attribute("seconds", op->seconds);
          json.attribute("operand", static_cast<int64_t>(operand));
          json.attribute("operandShape", shapeString(fn.values[operand].localType));
          json.attribute("result", static_cast<int64_t>(op->result));
          json.attribute("resultShape", shapeString(fn.values[op->result].localType));
          // A bucketed all-reduce resolves several values: all of them, in buffer order.
          json.attributeArray("operands", [&] {
            for (SpmdValueId id : op->operands)
              json.value(static_cast<int64_t>(id));
          });
          json.attributeArray("results", [&] {
            for (SpmdValueId id : op->results.empty() ? std::vector{op->result} : op->results)
              json.value(static_cast<int64_t>(id));
          });
          json.attribute("note", op->note);
          location(op->loc);
        });
      }
    });
    json.attribute("localSlices", static_cast<int64_t>(localSlicesOf(fn, std::nullopt)));
    json.attributeArray("replications", [&] {
      for (const Replication& r : fn.replications)
        json.object([&] {
          json.attribute("dim", r.dim);
          axisArray("droppedAxes", r.droppedAxes);
          json.attribute("reason", r.reason);
          location(r.loc);
        });
    });
    json.attributeObject("memory", [&] {
      json.attribute("paramBytes", fn.memory.paramBytes);
      json.attribute("optimizerBytes", fn.memory.optimizerBytes);
      json.attribute("gradientBytes", fn.memory.gradientBytes);
      json.attribute("peakActivationBytes", fn.memory.peakActivationBytes);
      json.attribute("totalBytes", fn.memory.total());
      json.attribute("budgetBytes",
                     plan.memoryBudgetBytes > 0 ? plan.memoryBudgetBytes : machine.memoryBytes);
    });
    if (plan.zero) printZeroReportJson(*plan.zero, json);
    if (fn.microbatching.count > 1)
      json.attributeObject("microbatching", [&] {
        json.attribute("dim", fn.microbatching.dim);
        json.attribute("count", fn.microbatching.count);
        json.attribute("accumulatorBytes", fn.microbatching.accumulatorBytes);
      });
    if (plan.joint)
      json.attributeObject("jointSearch", [&] { jointSearchAttributes(*plan.joint, json); });
    json.attributeObject("summary", [&] {
      json.attribute("stepSeconds", fn.summary.stepSeconds);
      json.attribute("computeSeconds", fn.summary.computeSeconds);
      json.attribute("communicationSeconds", fn.summary.communicationSeconds);
      json.attribute("totalFlops", fn.summary.totalFlops);
      json.attribute("utilization", fn.summary.utilization);
      json.attribute("includesBackward", fn.summary.includesBackward);
      json.attribute("backwardIsReal", fn.summary.backwardIsReal);
    });
  });
  os << "\n";
}

void printSpmd(const SpmdFunction& fn, llvm::raw_ostream& os) {
  os << fmt::format("spmd {} {} on mesh {} ({} devices), machine {}\n", kindName(fn.kind), fn.name,
                    meshString(fn.mesh), fn.mesh.numDevices(), fn.machineName);
  os << fmt::format("  layout {}\n", layoutString(fn.layout));
  bool phased = fn.summary.backwardIsReal;
  std::optional<Phase> current;
  for (const SpmdOp& op : fn.ops) {
    if (phased && op.phase != current) {
      current = op.phase;
      os << fmt::format("  // {}\n", phaseName(op.phase));
    }
    const SpmdValue& result = fn.values[op.result];
    std::vector<std::string> operands;
    for (SpmdValueId id : op.operands)
      operands.push_back(fmt::format("%{}", id));
    std::string head;
    if (op.kind == SpmdOp::Kind::Collective) {
      const Collective& c = op.collective;
      std::vector<std::string> attrs{fmt::format("axes = {}", axesString(c.axes))};
      if (!c.dim.empty()) attrs.push_back(fmt::format("dim = {}", c.dim));
      if (!c.toDim.empty()) attrs.push_back(fmt::format("to = {}", c.toDim));
      if (c.kind == CollectiveKind::Permute) attrs.push_back(fmt::format("offset = {}", c.offset));
      attrs.push_back(fmt::format("group = {}", c.groupSize));
      attrs.push_back(fmt::format("bytes = {}", c.bytes));
      head = fmt::format("{} {} {{{}}}", collectiveName(c.kind), fmt::join(operands, ", "),
                         fmt::join(attrs, ", "));
    } else {
      std::vector<std::string> attrs;
      for (const auto& [key, value] : op.attrs)
        attrs.push_back(fmt::format("{} = {}", key, attrValueString(value)));
      head = fmt::format("{}{}{}", ir::opSpelling(op.computeKind),
                         operands.empty() ? "" : " " + fmt::format("{}", fmt::join(operands, ", ")),
                         attrs.empty() ? "" : fmt::format(" {{{}}}", fmt::join(attrs, ", ")));
    }
    std::string resultIds = fmt::format("%{}", op.result);
    if (op.results.size() > 1) {
      std::vector<std::string> ids;
      for (SpmdValueId id : op.results)
        ids.push_back(fmt::format("%{}", id));
      resultIds = fmt::format("{}", fmt::join(ids, ", "));
    }
    os << fmt::format("  {} = {} : {} local {} {}", resultIds, head,
                      globalTypeString(result.globalType), shapeString(result.localType),
                      tensorLayoutString(result.globalType, result.layout));
    os << fmt::format("  // {}{}{}{}\n", result.name.empty() ? "" : result.name + " ",
                      locString(op.loc), op.seconds > 0 ? ", " + secondsString(op.seconds) : "",
                      op.note.empty() ? "" : ", " + op.note);
  }
  for (const auto& [name, id] : fn.outputs)
    os << fmt::format("  return {} = %{}\n", name, id);
  std::map<SpmdValueId, std::string> paths = paramPaths(fn);
  for (const auto& [param, id] : fn.updates)
    os << fmt::format("  update {} = %{}\n", paths[fn.params[param]], id);
}

void printDot(const SpmdFunction& fn, llvm::raw_ostream& os) {
  auto escape = [](const std::string& text) {
    std::string out;
    for (char c : text) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out;
  };
  os << fmt::format("digraph \"{}\" {{\n", escape(fn.name));
  os << "  rankdir=TB;\n  node [shape=ellipse, fontname=\"Helvetica\", fontsize=10];\n";
  std::map<SpmdValueId, size_t> producer;
  for (size_t i = 0; i < fn.ops.size(); ++i) {
    const SpmdOp& op = fn.ops[i];
    producer[op.result] = i;
    for (SpmdValueId id : op.results)
      producer[id] = i;
    const SpmdValue& result = fn.values[op.result];
    if (op.kind == SpmdOp::Kind::Collective) {
      const Collective& c = op.collective;
      os << fmt::format(
          "  op{} [shape=box, style=\"filled,bold\", color=red, fillcolor=\"#ffd0d0\", "
          "label=\"{}{}\\n{}\\n{}, {}\\n{}\"];\n",
          i, escape(collectiveSummary(c)),
          fn.summary.backwardIsReal ? fmt::format(" ({})", phaseName(op.phase)) : "",
          escape(shapeString(result.localType)), bytesString(static_cast<double>(c.bytes)),
          secondsString(op.seconds), escape(locString(op.loc)));
    } else {
      std::string name = result.name.empty() ? "" : " " + result.name;
      os << fmt::format("  op{} [label=\"%{}{} = {}\\n{}\"];\n", i, op.result, escape(name),
                        ir::opSpelling(op.computeKind), escape(shapeString(result.localType)));
    }
  }
  for (size_t i = 0; i < fn.ops.size(); ++i)
    for (SpmdValueId id : fn.ops[i].operands) {
      auto it = producer.find(id);
      if (it != producer.end()) os << fmt::format("  op{} -> op{};\n", it->second, i);
    }
  for (const auto& [name, id] : fn.outputs) {
    os << fmt::format("  out_{} [shape=plaintext, label=\"{}\"];\n", escape(name), escape(name));
    auto it = producer.find(id);
    if (it != producer.end()) os << fmt::format("  op{} -> out_{};\n", it->second, escape(name));
  }
  os << "}\n";
}

} // namespace meshc::plan
