// `meshc run --profile` (Profile.h): reads the run's Chrome trace, attributes every event to the
// run of a planned function that encloses it, and sets the measured time per source line (and
// phase) and per collective next to the cost model's prediction for the same ops.
#include "driver/Profile.h"

#include "planner/SpmdIR.h"

#include <fmt/format.h>
#include <llvm/ADT/StringExtras.h>
#include <llvm/ADT/StringRef.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/JSON.h>
#include <llvm/Support/MemoryBuffer.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

namespace meshc {

namespace {

/// One complete ("X") event of the trace, times in seconds.
struct Event {
  std::string kind, where, category;
  int64_t rank = 0;
  double start = 0, duration = 0;
  double self = 0;      // duration less that of the events directly inside it
  std::string function; // the planned function whose run encloses it ("": none)
  int64_t run = -1;     // the index of that run's event
};

bool readTrace(const std::string& path, llvm::json::Value& trace, std::string& error) {
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer) {
    error = fmt::format("cannot read the trace '{}'", path);
    return false;
  }
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse((*buffer)->getBuffer());
  if (!parsed) {
    error = fmt::format("the trace '{}' is not JSON: {}", path, llvm::toString(parsed.takeError()));
    return false;
  }
  trace = std::move(*parsed);
  if (!trace.getAsObject() || !trace.getAsObject()->getArray("traceEvents")) {
    error = fmt::format("the trace '{}' has no traceEvents", path);
    return false;
  }
  return true;
}

bool loadEvents(const std::string& path, std::vector<Event>& events, std::string& error) {
  llvm::json::Value trace(nullptr);
  if (!readTrace(path, trace, error)) return false;
  for (const llvm::json::Value& value : *trace.getAsObject()->getArray("traceEvents")) {
    const llvm::json::Object* object = value.getAsObject();
    if (!object || object->getString("ph").getValueOr("") != "X") continue;
    Event event;
    const llvm::json::Object* args = object->getObject("args");
    event.kind = args ? args->getString("kind").getValueOr("").str() : "";
    event.where = args ? args->getString("where").getValueOr("").str() : "";
    event.category = object->getString("cat").getValueOr("").str();
    event.rank = object->getInteger("pid").getValueOr(0);
    event.start = object->getNumber("ts").getValueOr(0) * 1e-6;
    event.duration = object->getNumber("dur").getValueOr(0) * 1e-6;
    event.self = event.duration;
    events.push_back(std::move(event));
  }
  // Per rank in time order (an enclosing event before what it encloses): the innermost open
  // event encloses the next one if it has not ended.
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    if (a.start != b.start) return a.start < b.start;
    return a.duration > b.duration;
  });
  std::vector<size_t> open;
  for (size_t k = 0; k < events.size(); ++k) {
    constexpr double kSlack = 1e-9; // the printed microseconds' rounding
    while (!open.empty() &&
           (events[open.back()].rank != events[k].rank ||
            events[open.back()].start + events[open.back()].duration <= events[k].start + kSlack))
      open.pop_back();
    if (!open.empty()) {
      Event& parent = events[open.back()];
      parent.self -= events[k].duration;
      bool parentIsRun = parent.kind == "run";
      events[k].function = parentIsRun ? parent.where : parent.function;
      events[k].run = parentIsRun ? int64_t(open.back()) : parent.run;
    }
    open.push_back(k);
  }
  return true;
}

/// "file:line" of "file:line:col".
std::string lineOf(const std::string& where) {
  size_t colon = where.rfind(':');
  return colon == std::string::npos || colon == 0 ? where : where.substr(0, colon);
}

std::string lineOf(const ir::Location& loc) {
  return fmt::format("{}:{}", loc.file, loc.line);
}

/// The collective's family, the same for the plan's kinds and meshrt's calls.
std::string familyOfPlanned(plan::CollectiveKind kind) {
  switch (kind) {
  case plan::CollectiveKind::AllReduceSum:
  case plan::CollectiveKind::AllReduceMax:
  case plan::CollectiveKind::AllReduceMin:
  case plan::CollectiveKind::BucketedAllReduceSum:
    return "all_reduce";
  default:
    return plan::collectiveName(kind);
  }
}

std::string familyOfCall(llvm::StringRef call) {
  std::string out;
  if (call.consume_front("start") && !call.empty()) {
    out += char(std::tolower(static_cast<unsigned char>(call.front())));
    call = call.drop_front();
  }
  for (char c : call) {
    if (std::isupper(static_cast<unsigned char>(c))) {
      out += '_';
      out += char(std::tolower(static_cast<unsigned char>(c)));
    } else {
      out += char(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  return out; // allReduce -> all_reduce, startAllGather -> all_gather
}

struct Row {
  std::string kind, where, phase;
  std::set<std::string> kinds, phases;
  double predicted = 0, measured = 0;
  int64_t planned = -1, ran = 0; // collectives: how many per run and rank
  bool collective = false;
};

std::string seconds(double s) {
  double a = std::fabs(s);
  if (a >= 1) return fmt::format("{:.3f} s", s);
  if (a >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

std::string ratio(double measured, double predicted) {
  return predicted > 0 ? fmt::format("{:.2f}", measured / predicted) : std::string("-");
}

void printFunction(const plan::PlannedFunction& plan, const std::vector<Event>& events,
                   llvm::raw_ostream& os) {
  const plan::SpmdFunction& fn = plan.spmd;
  // Each rank's runs of `fn`; the first is a warm-up (first touches, the GEMM library's
  // kernels made) and is left out when there are more.
  std::map<int64_t, std::vector<int64_t>> runsOfRank;
  for (size_t k = 0; k < events.size(); ++k)
    if (events[k].kind == "run" && events[k].where == fn.name)
      runsOfRank[events[k].rank].push_back(int64_t(k)); // in time order
  std::set<int64_t> counted;
  bool warmUpLeftOut = false;
  for (const auto& [rank, runList] : runsOfRank) {
    warmUpLeftOut = runList.size() > 1;
    counted.insert(runList.begin() + (warmUpLeftOut ? 1 : 0), runList.end());
  }
  int64_t runs = int64_t(counted.size());
  if (runs == 0) return;
  std::set<int64_t> ranks;
  double runSeconds = 0;
  for (int64_t k : counted) {
    ranks.insert(events[size_t(k)].rank);
    runSeconds += events[size_t(k)].duration;
  }
  double perRun = 1.0 / double(runs); // means over runs and ranks alike

  std::map<std::string, Row> rows;
  std::map<std::string, std::string> familyOfSite; // a wait joins its start's row
  double phaseMeasured[4] = {0, 0, 0, 0}, phasePredicted[4] = {0, 0, 0, 0};
  auto phaseIndex = [](llvm::StringRef phase) {
    return phase == "forward" ? 0 : phase == "backward" ? 1 : phase == "update" ? 2 : 3;
  };
  for (const plan::SpmdOp& op : fn.ops) {
    if (op.kind == plan::SpmdOp::Kind::Collective) {
      if (op.collective.kind == plan::CollectiveKind::LocalSlice) continue; // no communication
      std::string family = familyOfPlanned(op.collective.kind);
      Row& row = rows["c " + family + " " + lineOf(op.loc)];
      row.collective = true;
      row.kind = family;
      row.where = lineOf(op.loc);
      row.phases.insert(plan::phaseName(op.phase));
      row.predicted += op.seconds;
      row.planned = std::max<int64_t>(row.planned, 0) + 1;
      phasePredicted[3] += op.seconds;
      continue;
    }
    Row& row = rows[fmt::format("o {} {}", lineOf(op.loc), plan::phaseName(op.phase))];
    row.where = lineOf(op.loc);
    row.phases.insert(plan::phaseName(op.phase));
    row.predicted += op.seconds;
    phasePredicted[phaseIndex(plan::phaseName(op.phase))] += op.seconds;
  }
  for (const Event& event : events)
    if (event.function == fn.name && event.category == "collective" && event.kind != "wait")
      familyOfSite[event.where] = familyOfCall(event.kind);
  for (const Event& event : events) {
    if (event.function != fn.name || !counted.count(event.run)) continue;
    if (event.category == "collective") {
      std::string family =
          event.kind == "wait" ? familyOfSite[event.where] : familyOfCall(event.kind);
      Row& row = rows["c " + family + " " + lineOf(event.where)];
      row.collective = true;
      row.kind = family;
      row.where = event.where.empty() ? "(runtime)" : lineOf(event.where);
      row.measured += event.self * perRun;
      if (event.kind != "wait") ++row.ran;
      phaseMeasured[3] += event.self * perRun;
      continue;
    }
    Row& row = rows[fmt::format("o {} {}", lineOf(event.where), event.category)];
    row.where = lineOf(event.where);
    row.phases.insert(event.category);
    row.kinds.insert(event.kind);
    row.measured += event.self * perRun;
    phaseMeasured[phaseIndex(event.category)] += event.self * perRun;
  }

  std::vector<Row*> sorted;
  for (auto& [key, row] : rows)
    if (row.collective || row.predicted > 0 || row.measured > 0) // not params' declarations
      sorted.push_back(&row);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Row* a, const Row* b) {
    return std::fabs(a->measured - a->predicted) > std::fabs(b->measured - b->predicted);
  });

  bool train = fn.kind == ir::Function::Kind::Train;
  os << fmt::format("profile of {} {}: {} rank(s), {} run(s) per rank{}; times are means per "
                    "run and rank, predicted for the machine '{}'\n",
                    train ? "train block" : "program", fn.name, ranks.size(),
                    runs / int64_t(ranks.size()), warmUpLeftOut ? " after a warm-up run" : "",
                    fn.machineName);
  os << fmt::format("  {:<20} {:<24} {:<16} {:>7} {:>11} {:>11} {:>7} {:>11}\n", "what", "where",
                    "phase", "count", "predicted", "measured", "ratio", "error");
  for (const Row* row : sorted) {
    std::string what = row->collective ? row->kind : llvm::join(row->kinds, ",");
    if (what.empty()) what = "-"; // planned ops with no code of their own (folded, hoisted)
    // Collectives: planned per run / issued per run and rank.
    std::string count = row->collective ? fmt::format("{}/{:g}", std::max<int64_t>(row->planned, 0),
                                                      double(row->ran) * perRun)
                                        : "";
    os << fmt::format("  {:<20} {:<24} {:<16} {:>7} {:>11} {:>11} {:>7} {:>11}\n", what, row->where,
                      llvm::join(row->phases, ","), count, seconds(row->predicted),
                      seconds(row->measured), ratio(row->measured, row->predicted),
                      seconds(row->measured - row->predicted));
  }
  os << "  totals by phase:\n";
  const char* names[4] = {"forward", "backward", "update", "communication"};
  double measuredSum = 0;
  for (int p = 0; p < 4; ++p) {
    if (phasePredicted[p] == 0 && phaseMeasured[p] == 0) continue;
    measuredSum += phaseMeasured[p];
    os << fmt::format("    {:<14} predicted {:>11}  measured {:>11}  ratio {}\n", names[p],
                      seconds(phasePredicted[p]), seconds(phaseMeasured[p]),
                      ratio(phaseMeasured[p], phasePredicted[p]));
  }
  os << fmt::format("    {:<14} predicted {:>11}  measured {:>11}  ratio {} (a run's wall "
                    "time; the phases above sum to {})\n",
                    "total", seconds(fn.summary.stepSeconds), seconds(runSeconds * perRun),
                    ratio(runSeconds * perRun, fn.summary.stepSeconds), seconds(measuredSum));
}

} // namespace

bool mergeRankTraces(const std::string& path, int64_t ranks, std::string& error) {
  llvm::json::Array merged;
  int64_t worldSize = ranks;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    std::string part = fmt::format("{}.rank{}", path, rank);
    llvm::json::Value trace(nullptr);
    if (!readTrace(part, trace, error)) return false;
    for (llvm::json::Value& event : *trace.getAsObject()->getArray("traceEvents"))
      merged.push_back(std::move(event));
  }
  llvm::json::Object out{{"displayTimeUnit", "ms"},
                         {"otherData", llvm::json::Object{{"worldSize", worldSize}}},
                         {"traceEvents", std::move(merged)}};
  std::error_code ec;
  llvm::raw_fd_ostream file(path, ec);
  if (ec) {
    error = fmt::format("cannot write the trace '{}': {}", path, ec.message());
    return false;
  }
  file << llvm::json::Value(std::move(out)) << "\n";
  for (int64_t rank = 0; rank < ranks; ++rank)
    llvm::sys::fs::remove(fmt::format("{}.rank{}", path, rank));
  return true;
}

bool printProfile(const std::vector<plan::PlannedFunction>& plans, const std::string& tracePath,
                  llvm::raw_ostream& os, std::string& error) {
  std::vector<Event> events;
  if (!loadEvents(tracePath, events, error)) return false;
  for (const plan::PlannedFunction& plan : plans)
    printFunction(plan, events, os);
  return true;
}

} // namespace meshc
