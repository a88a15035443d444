// Microbatching's schedule of a planned train step (Microbatching.h).
#include "planner/Microbatching.h"

#include "ir/OpTraits.h"
#include "planner/CostModel.h"
#include "planner/PlanReport.h"
#include "planner/Reshard.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <span>

namespace meshc::plan {
namespace {

llvm::Error refuse(const SpmdFunction& fn, const std::string& why) {
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(), "%s",
      fmt::format("cannot microbatch train block '{}': {}", fn.name, why).c_str());
}

bool isGradientName(const std::string& name) {
  return name.rfind("grad/", 0) == 0;
}

bool drawsRandom(const SpmdOp& op) {
  return op.kind == SpmdOp::Kind::Compute &&
         (op.computeKind == ir::OpKind::RandomNormal ||
          op.computeKind == ir::OpKind::RandomUniform || op.computeKind == ir::OpKind::RandomInt ||
          op.computeKind == ir::OpKind::Dropout);
}

/// The values `op` writes (a view: asked for every op of every microbatched plan).
std::span<const SpmdValueId> resultsOf(const SpmdOp& op) {
  return op.results.empty() ? std::span<const SpmdValueId>(&op.result, 1)
                            : std::span<const SpmdValueId>(op.results);
}

/// Per value, the ops that write it, in op order (in-place ops, a lane op's collectives, write
/// their operand): one array and offsets rather than an array per value.
class Producers {
public:
  explicit Producers(const SpmdFunction& fn) : begin_(fn.values.size() + 1, 0) {
    for (const SpmdOp& op : fn.ops)
      for (SpmdValueId id : resultsOf(op))
        ++begin_[id + 1];
    for (size_t v = 0; v + 1 < begin_.size(); ++v)
      begin_[v + 1] += begin_[v];
    ops_.resize(begin_.back());
    std::vector<size_t> next(begin_.begin(), begin_.end() - 1);
    for (size_t i = 0; i < fn.ops.size(); ++i)
      for (SpmdValueId id : resultsOf(fn.ops[i]))
        ops_[next[id]++] = i;
  }
  std::span<const size_t> of(SpmdValueId id) const {
    return std::span<const size_t>(ops_).subspan(begin_[id], begin_[id + 1] - begin_[id]);
  }
  bool empty(SpmdValueId id) const { return begin_[id] == begin_[id + 1]; }

private:
  std::vector<size_t> begin_, ops_;
};

} // namespace

llvm::Expected<MicrobatchSchedule> scheduleMicrobatches(const SpmdFunction& fn) {
  size_t ops = fn.ops.size(), values = fn.values.size();
  Producers producers(fn);

  // What depends on the batch: the inputs and the random draws (keyed by the batch's elements).
  std::vector<bool> fromBatch(values, false);
  for (SpmdValueId id : fn.inputs)
    fromBatch[id] = true;
  for (const SpmdOp& op : fn.ops) {
    bool depends =
        drawsRandom(op) || llvm::any_of(op.operands, [&](SpmdValueId id) { return fromBatch[id]; });
    for (SpmdValueId id : resultsOf(op))
      fromBatch[id] = fromBatch[id] || depends;
  }

  // Gradients: the values autodiff named, what collectives make of them, and what is linear in
  // them with batch-independent factors (the planner may resolve `lr * grad` instead of `grad`,
  // or the sum of a shared weight's contributions): the mean over microbatches commutes with it.
  std::vector<bool> gradient(values, false);
  for (SpmdValueId id = 0; id < values; ++id)
    gradient[id] = isGradientName(fn.values[id].name);
  for (const SpmdOp& op : fn.ops) {
    bool linear = false;
    if (op.kind == SpmdOp::Kind::Collective) {
      linear = llvm::any_of(op.operands, [&](SpmdValueId id) { return gradient[id]; });
    } else {
      // One batch-dependent operand, a gradient the op is linear in; or a sum of gradients.
      const ir::OpTraits& traits = ir::opTraits(op.computeKind);
      bool sum = op.computeKind == ir::OpKind::Add || op.computeKind == ir::OpKind::Sub;
      size_t dependent = 0, linearGradients = 0;
      for (size_t k = 0; k < op.operands.size(); ++k) {
        if (!fromBatch[op.operands[k]]) continue;
        ++dependent;
        linearGradients += gradient[op.operands[k]] && traits.isLinearIn(k);
      }
      linear = linearGradients > 0 && linearGradients == dependent && (dependent == 1 || sum);
    }
    if (linear)
      for (SpmdValueId id : resultsOf(op))
        gradient[id] = true;
  }

  // The loop: every op the outputs and the gradients need (the forward and backward passes).
  MicrobatchSchedule schedule;
  schedule.perMicrobatch.assign(ops, false);
  schedule.afterLoop.assign(ops, false);
  std::vector<SpmdValueId> work;
  for (const auto& output : fn.outputs)
    work.push_back(output.second);
  for (SpmdValueId id = 0; id < values; ++id)
    if (isGradientName(fn.values[id].name)) work.push_back(id);
  while (!work.empty()) {
    SpmdValueId value = work.back();
    work.pop_back();
    for (size_t index : producers.of(value)) {
      if (schedule.perMicrobatch[index]) continue;
      schedule.perMicrobatch[index] = true;
      for (SpmdValueId operand : fn.ops[index].operands)
        work.push_back(operand);
    }
  }
  // What the update needs (outside the loop's own ops). What nothing needs (a forward value no
  // loss reads, a step count no schedule reads) runs in the loop, unless it reads the update's
  // values; dead-code elimination drops it either way.
  std::vector<bool> update(ops, false);
  for (const auto& [param, id] : fn.updates)
    work.push_back(id);
  while (!work.empty()) {
    SpmdValueId value = work.back();
    work.pop_back();
    for (size_t index : producers.of(value)) {
      if (schedule.perMicrobatch[index] || update[index]) continue;
      update[index] = true;
      for (SpmdValueId operand : fn.ops[index].operands)
        work.push_back(operand);
    }
  }
  std::vector<bool> afterLoop(values, false); // written by an op of the update
  for (size_t i = 0; i < ops; ++i) {
    const SpmdOp& op = fn.ops[i];
    if (!update[i] && llvm::none_of(op.operands, [&](SpmdValueId id) { return afterLoop[id]; }))
      schedule.perMicrobatch[i] = true;
    if (!schedule.perMicrobatch[i])
      for (SpmdValueId id : resultsOf(op))
        afterLoop[id] = true;
  }
  auto computedInLoop = [&](SpmdValueId id) {
    return llvm::any_of(producers.of(id), [&](size_t i) { return schedule.perMicrobatch[i]; });
  };

  // Values of the loop read after it: by an op of the update, an update or the caller.
  std::vector<bool> readInLoop(values, false), readAfter(values, false);
  for (size_t i = 0; i < ops; ++i)
    for (SpmdValueId operand : fn.ops[i].operands)
      (schedule.perMicrobatch[i] ? readInLoop : readAfter)[operand] = true;
  for (const auto& [param, id] : fn.updates) {
    if (computedInLoop(id))
      return refuse(fn, fmt::format("the next value of '{}' is computed from the batch (a step "
                                    "state cannot be split into microbatches)",
                                    fn.values[fn.params[param]].name));
  }
  std::set<SpmdValueId> outputs;
  // The loss and the metrics: f32 scalars (sema's rule), averaged over the microbatches.
  for (const auto& output : fn.outputs) {
    outputs.insert(output.second);
    readAfter[output.second] = true;
  }
  std::set<SpmdValueId> accumulated;
  for (SpmdValueId id = 0; id < values; ++id) {
    if (!readAfter[id] || !fromBatch[id]) continue; // a batch-independent value is the same
    bool inLoop = computedInLoop(id);
    if (!producers.empty(id) && !inLoop) continue; // computed by the update itself
    if (!inLoop || (!gradient[id] && !outputs.count(id)))
      return refuse(fn, fmt::format("the update reads '{}', which is computed from the batch "
                                    "and is no gradient",
                                    fn.values[id].name.empty() ? fmt::format("%{}", id)
                                                               : fn.values[id].name));
    accumulated.insert(id);
  }
  schedule.accumulated.assign(accumulated.begin(), accumulated.end());

  // Sums over ranks of values only read after the loop: summed once, after it.
  for (size_t i = 0; i < ops; ++i) {
    const SpmdOp& op = fn.ops[i];
    if (!schedule.perMicrobatch[i] || op.kind != SpmdOp::Kind::Collective ||
        (op.collective.kind != CollectiveKind::AllReduceSum &&
         op.collective.kind != CollectiveKind::BucketedAllReduceSum))
      continue;
    std::span<const SpmdValueId> results = resultsOf(op);
    schedule.afterLoop[i] = llvm::all_of(
        results, [&](SpmdValueId id) { return !readInLoop[id] && accumulated.count(id); });
  }
  return schedule;
}

namespace {

bool isBucket(const SpmdOp& op) {
  return op.kind == SpmdOp::Kind::Collective &&
         op.collective.kind == CollectiveKind::BucketedAllReduceSum;
}

/// Per value: whether the loop needs it, i.e. the outputs or a raw gradient depend on it. A
/// bucket's result depends on its own operand only (the members are independent sums).
std::vector<bool> neededByLoop(const SpmdFunction& fn) {
  Producers producers(fn);
  std::vector<bool> needed(fn.values.size(), false);
  std::vector<SpmdValueId> work;
  auto need = [&](SpmdValueId id) {
    if (!needed[id]) needed[id] = true, work.push_back(id);
  };
  for (const auto& output : fn.outputs)
    need(output.second);
  for (SpmdValueId id = 0; id < fn.values.size(); ++id)
    if (isGradientName(fn.values[id].name)) need(id);
  while (!work.empty()) {
    SpmdValueId value = work.back();
    work.pop_back();
    for (size_t index : producers.of(value)) {
      const SpmdOp& op = fn.ops[index];
      if (!isBucket(op)) {
        for (SpmdValueId operand : op.operands)
          need(operand);
        continue;
      }
      for (size_t k = 0; k < op.results.size(); ++k)
        if (op.results[k] == value) need(op.operands[k]);
    }
  }
  return needed;
}

/// The all-reduce of `members` (indices into `bucket`'s operands): a plain one for one member.
SpmdOp bucketPart(const SpmdFunction& fn, const SpmdOp& bucket, const std::vector<size_t>& members,
                  const Machine& machine) {
  SpmdOp op = bucket;
  op.operands.clear();
  op.results.clear();
  op.collective.bytes = 0;
  for (size_t k : members) {
    op.operands.push_back(bucket.operands[k]);
    op.results.push_back(bucket.results[k]);
    const ir::TensorType& type = fn.values[bucket.operands[k]].localType;
    op.collective.bytes += type.numElements() * dtypeBytes(type.dtype);
  }
  op.result = op.results.front();
  if (members.size() == 1) {
    op.collective.kind = CollectiveKind::AllReduceSum;
    op.results.clear();
  }
  op.seconds = collectiveSeconds(machine, fn.mesh, op.collective);
  return op;
}

} // namespace

size_t splitBucketsAtLoop(SpmdFunction& fn, const Machine& machine) {
  std::vector<bool> needed = neededByLoop(fn);
  std::vector<size_t> loop, update;
  // Whether `op` is a bucket with members on both sides of the loop (their indices in loop and
  // update).
  auto straddles = [&](const SpmdOp& op) {
    loop.clear();
    update.clear();
    if (isBucket(op))
      for (size_t k = 0; k < op.results.size(); ++k)
        (needed[op.results[k]] ? loop : update).push_back(k);
    return !loop.empty() && !update.empty();
  };
  // The ops before the first bucket split stay where they are, and a plan with none is left as
  // it is (each microbatched plan moved all its ops, tens of thousands at 96 layers, into a new
  // array).
  size_t first = 0;
  while (first < fn.ops.size() && !straddles(fn.ops[first]))
    ++first;
  if (first == fn.ops.size()) return 0;
  std::vector<SpmdOp> ops;
  ops.reserve(fn.ops.size() - first + 1);
  size_t split = 0;
  for (size_t i = first; i < fn.ops.size(); ++i) {
    SpmdOp& op = fn.ops[i];
    if (!straddles(op)) {
      ops.push_back(std::move(op));
      continue;
    }
    SpmdOp inLoop = bucketPart(fn, op, loop, machine);
    SpmdOp after = bucketPart(fn, op, update, machine);
    after.phase = Phase::Update;
    after.note = fmt::format("the update's part of a bucket merged with the loop's ({} of {} "
                             "partial sums): a microbatched step resolves them after the loop",
                             update.size(), op.results.size());
    double added = inLoop.seconds + after.seconds - op.seconds;
    if (fn.summary.stepSeconds > 0)
      fn.summary.utilization *= fn.summary.stepSeconds / (fn.summary.stepSeconds + added);
    fn.summary.communicationSeconds += added;
    fn.summary.stepSeconds += added;
    ops.push_back(std::move(inLoop));
    ops.push_back(std::move(after));
    ++split;
  }
  fn.ops.erase(fn.ops.begin() + static_cast<std::ptrdiff_t>(first), fn.ops.end());
  fn.ops.insert(fn.ops.end(), std::make_move_iterator(ops.begin()),
                std::make_move_iterator(ops.end()));
  return split;
}

llvm::Error applyMicrobatching(SpmdFunction& fn, const std::string& dim, int64_t count,
                               const Machine& machine) {
  splitBucketsAtLoop(fn, machine);
  llvm::Expected<MicrobatchSchedule> schedule = scheduleMicrobatches(fn);
  if (!schedule) return schedule.takeError();
  fn.microbatching = Microbatching{dim, count, 0};
  Microbatching& m = fn.microbatching;
  // Each microbatch adds value / K into an f32 accumulator: a memory-bound pass per value.
  double accumulateSeconds = 0;
  for (SpmdValueId id : schedule->accumulated) { // held as f32
    const ir::TensorType& type = fn.values[id].localType;
    double elements = double(type.numElements());
    m.accumulatorBytes += elements * 4;
    accumulateSeconds += computeSeconds(
        machine, 2 * elements, elements * double(8 + dtypeBytes(type.dtype)), ir::DType::F32);
  }
  fn.memory.gradientBytes += m.accumulatorBytes;
  // The step runs the loop's ops K times: the summary becomes the whole step's.
  double compute = 0, communication = 0, loopFlops = 0, allFlops = 0;
  for (size_t i = 0; i < fn.ops.size(); ++i) {
    const SpmdOp& op = fn.ops[i];
    bool collective = op.kind == SpmdOp::Kind::Collective;
    bool inLoop = schedule->perMicrobatch[i] && !(collective && schedule->afterLoop[i]);
    double times = inLoop ? double(count) : 1;
    (collective ? communication : compute) += times * op.seconds;
    m.phaseSeconds[static_cast<int>(op.phase)] += times * op.seconds;
    allFlops += op.flops;
    if (inLoop) loopFlops += op.flops;
  }
  compute += double(count) * accumulateSeconds + fn.summary.outputSeconds; // once per step
  m.phaseSeconds[static_cast<int>(Phase::Backward)] += double(count) * accumulateSeconds;
  PlanSummary& summary = fn.summary;
  double flopsFactor =
      allFlops > 0 ? (loopFlops * double(count) + allFlops - loopFlops) / allFlops : double(count);
  double ideal = summary.utilization * summary.stepSeconds; // devices x peak cancel out
  summary.computeSeconds = compute;
  summary.communicationSeconds = communication;
  summary.stepSeconds = compute + communication;
  summary.totalFlops *= flopsFactor;
  summary.utilization = summary.stepSeconds > 0 ? ideal * flopsFactor / summary.stepSeconds : 0;
  return llvm::Error::success();
}

MicrobatchCollectives countCollectives(const SpmdFunction& fn, const MicrobatchSchedule& schedule) {
  MicrobatchCollectives count;
  for (size_t i = 0; i < fn.ops.size(); ++i) {
    const SpmdOp& op = fn.ops[i];
    if (op.kind != SpmdOp::Kind::Collective || op.collective.kind == CollectiveKind::LocalSlice ||
        op.collective.axes.empty())
      continue;
    if (schedule.perMicrobatch[i] && !schedule.afterLoop[i])
      ++count.perMicrobatch;
    else
      ++count.once;
  }
  return count;
}

std::string microbatchingSummary(const SpmdFunction& fn) {
  const Microbatching& m = fn.microbatching;
  if (m.count <= 1) return "";
  llvm::Expected<MicrobatchSchedule> schedule = scheduleMicrobatches(fn);
  if (!schedule) {
    llvm::consumeError(schedule.takeError());
    return "";
  }
  MicrobatchCollectives collectives = countCollectives(fn, *schedule);
  return fmt::format("{} microbatches along {} per step: activations above are one "
                     "microbatch's; gradient accumulators {} (in gradients); collectives per "
                     "step {} x {} in the loop + {} once",
                     m.count, m.dim, bytesString(m.accumulatorBytes), collectives.perMicrobatch,
                     m.count, collectives.once);
}

} // namespace meshc::plan
