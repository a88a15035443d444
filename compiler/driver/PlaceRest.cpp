// Where the rest of a pipelined step lives per stage (PlaceRest.h).
#include "driver/PlaceRest.h"

#include "ir/OpTraits.h"
#include "planner/Microbatching.h"
#include "planner/Reshard.h"
#include "planner/TrainPhases.h"

#include <llvm/ADT/STLExtras.h>
#include <llvm/ADT/StringRef.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace meshc {
namespace {

/// The parts of a one-layer step a value is held by: the rest before the layers (the first
/// stage), the layer (every stage), the rest after the layers (the last stage).
enum Part : int { kPre = 1, kLayer = 2, kPost = 4 };

class RestPlacer {
public:
  RestPlacer(const ir::Function& fn, const plan::SpmdFunction& spmd, bool accumulates,
             plan::PipelineShape& shape)
      : fn(fn), spmd(spmd), accumulates(accumulates), shape(shape),
        phases(plan::trainStepPhases(fn)) {}

  void run() {
    forwardEnd = fn.train ? size_t(fn.values[fn.train->loss].definingOp) + 1 : fn.ops.size();
    size_t firstLayer = fn.ops.size(), lastLayer = 0;
    for (size_t k = 0; k < forwardEnd && k < fn.ops.size(); ++k)
      if (inLayer(fn.ops[k])) {
        firstLayer = std::min(firstLayer, k);
        lastLayer = k;
      }
    if (firstLayer == fn.ops.size()) return;
    for (size_t k = 0; k < fn.ops.size(); ++k)
      if (llvm::StringRef(fn.values[fn.ops[k].result].name).startswith("grad/")) loopEnd = k;
    placeParams(firstLayer, lastLayer);
    placeActivations();
    placeTime();
  }

private:
  bool inLayer(const ir::Op& op) const {
    for (uint32_t call = op.loc.call; call > 0 && call <= fn.calls.size();
         call = fn.calls[call - 1].parent)
      if (llvm::StringRef(fn.calls[call - 1].path).contains('[')) return true;
    return false;
  }

  double bytesOf(const ir::TensorType& type) const {
    return double(
        plan::localBytes(type, plan::tensorLayoutOf(type, spmd.layout, spmd.mesh), spmd.mesh));
  }

  /// PipelineShape::restParams and restOptimizer, weighed by bytes per device; `paramPart` for
  /// the update's placement below.
  void placeParams(size_t firstLayer, size_t lastLayer) {
    // Per value: 1 read before the layers, 2 after them, 4 by a layer.
    std::map<ir::ValueId, int> readers;
    for (size_t k = 0; k < forwardEnd && k < fn.ops.size(); ++k)
      for (ir::ValueId operand : fn.ops[k].operands)
        readers[operand] |= inLayer(fn.ops[k]) ? 4 : k < firstLayer ? 1 : k > lastLayer ? 2 : 0;
    std::map<std::string, int> placed; // weight path -> its readers
    for (const ir::ParamInfo& param : fn.params)
      if (param.role != ir::ParamRole::OptimizerState) placed[param.path] = readers[param.value];
    double weights[3] = {0, 0, 0}, slots[3] = {0, 0, 0}; // first, last, all
    for (const ir::ParamInfo& param : fn.params) {
      std::string weight = param.path.substr(0, param.path.find('@'));
      int where = placed.count(weight) ? placed[weight] : readers[param.value];
      // Where its update runs: its layer's stage, else the first stage that holds it.
      paramPart[param.value] = (where & 4) ? kLayer : (where & 1) ? kPre : kPost;
      if (where & 4) continue;     // a layer's
      if (!(where & 3)) where = 2; // read nowhere in forward: with the head
      double bytes = bytesOf(param.type);
      bool slot = param.role == ir::ParamRole::OptimizerState;
      double* sums = slot ? slots : weights;
      sums[2] += bytes;
      if (where & 1) sums[0] += bytes;
      if ((where & 2) && !(slot && (where & 1))) sums[1] += bytes;
    }
    if (weights[2] > 0) shape.restParams = {weights[0] / weights[2], weights[1] / weights[2]};
    if (slots[2] > 0) shape.restOptimizer = {slots[0] / slots[2], slots[1] / slots[2]};
    // Optimizers whose state the plan counts per weight (no slot params): with the weight, on
    // the first of its stages.
    else if (weights[2] > 0)
      shape.restOptimizer = {weights[0] / weights[2], (weights[2] - weights[0]) / weights[2]};
  }

  /// The side of the pipeline a stage-bound value is on, as an op reading it sees it: the rest's
  /// before the layers and a layer's backward values (the first layer's gradient is what the
  /// rest reads) on the first, the rest's after them and a layer's forward values (the last
  /// layer's output) on the last.
  int sideOf(ir::ValueId value) const {
    int part = partOf[fn.values[value].definingOp];
    if (part == kLayer)
      return phases[fn.values[value].definingOp] == plan::Phase::Forward ? kPost : kPre;
    return part;
  }

  /// The part forward or backward op `k` of the rest runs in from the parts of what it reads
  /// (0: reads nothing stage-bound): forward on the latest, backward on the earliest
  /// (split-stages' rule: values flow to later stages in forward, to earlier ones in backward).
  int partFromReads(size_t k) const {
    int sides = 0;
    for (ir::ValueId operand : fn.ops[k].operands)
      if (bound[operand]) sides |= sideOf(operand);
    if (phases[k] == plan::Phase::Forward) return sides & kPost ? kPost : sides & kPre ? kPre : 0;
    return sides & kPre ? kPre : sides & kPost ? kPost : 0;
  }

  /// The part an op of the update runs in, its params placed: the part holding most of the
  /// bytes it reads (split-stages: where all it reads is, else the stage holding most of its
  /// elements: a weight's update and clipping with the weight, not with the norm's scalar);
  /// 0: it reads nothing stage-bound.
  int updatePart(size_t k) const {
    double bytes[5] = {0, 0, 0, 0, 0};
    for (ir::ValueId operand : fn.ops[k].operands) {
      int part = bound[operand] ? partOf[fn.values[operand].definingOp] : 0;
      if (part == kPre || part == kLayer || part == kPost)
        bytes[part] += std::max(1.0, bytesOf(fn.typeOf(operand)));
    }
    int best = 0;
    for (int part : {kLayer, kPre, kPost})
      if (bytes[part] > (best ? bytes[best] : 0)) best = part;
    return best;
  }

  /// Whether op `k` is in the update: its phase, or after the microbatch loop (the last op
  /// making a weight's gradient) when the step accumulates.
  bool inUpdate(size_t k) const {
    return phases[k] == plan::Phase::Update || (accumulates && k > loopEnd);
  }

  void placeActivations() {
    size_t n = fn.ops.size();
    partOf.assign(n, 0);
    held.assign(fn.values.size(), 0);
    bound.assign(fn.values.size(), false);
    std::vector<bool> pending(n, false);
    auto place = [&](size_t k, int part) {
      partOf[k] = part;
      held[fn.ops[k].result] |= part;
      bound[fn.ops[k].result] = true;
      for (ir::ValueId operand : fn.ops[k].operands)
        if (bound[operand]) held[operand] |= part; // sent there
    };
    // Forward and backward first (params bound to no stage yet), then the update with the
    // params on the stages where their updates run.
    for (bool update : {false, true}) {
      if (update)
        for (const auto& [value, part] : paramPart) {
          bound[value] = true;
          held[value] = part;
          partOf[fn.values[value].definingOp] = part;
        }
      for (size_t k = 0; k < n; ++k) {
        const ir::Op& op = fn.ops[k];
        if (inUpdate(k) != update || op.kind == ir::OpKind::Param) continue;
        int part = inLayer(op) ? kLayer : update ? updatePart(k) : partFromReads(k);
        if (part)
          place(k, part);
        else
          pending[k] = true;
      }
    }
    // What reads nothing stage-bound runs on the parts that read its result (back to front: the
    // readers first); read by none (a scalar of the update), everywhere.
    std::vector<std::vector<size_t>> readers(fn.values.size());
    for (size_t k = 0; k < n; ++k)
      for (ir::ValueId operand : fn.ops[k].operands)
        if (readers[operand].empty() || readers[operand].back() != k) readers[operand].push_back(k);
    for (size_t k = n; k-- > 0;) {
      if (!pending[k]) continue;
      int part = 0;
      for (size_t r : readers[fn.ops[k].result])
        part |= partOf[r];
      place(k, part ? part : kLayer);
    }

    // The plan's liveness (SpmdLowering's: from the op to its last reader, outputs to the end)
    // per stage kind, without what the code keeps in no buffer of its own.
    std::vector<size_t> lastUse(fn.values.size(), 0);
    std::vector<std::vector<ir::ValueId>> freesAt(n + 1);
    for (size_t v = 0; v < fn.values.size(); ++v)
      if (!readers[v].empty()) lastUse[v] = readers[v].back();
    for (const ir::OutputInfo& output : fn.outputs)
      lastUse[output.value] = n;
    // A param's new value is written into its storage (write-updates-in-place): no bytes of
    // its own, as a param's. An elementwise value that one elementwise op reads is computed in
    // that op's loop (fuse-loops): no buffer either.
    std::vector<bool> counted(fn.values.size(), true);
    for (const ir::ParamUpdate& write : fn.updates)
      counted[write.value] = false;
    for (size_t v = 0; v < fn.values.size(); ++v) {
      const ir::Op& def = fn.ops[fn.values[v].definingOp];
      bool fused = ir::opTraits(def.kind).isElementwise() && readers[v].size() == 1 &&
                   llvm::count(fn.ops[readers[v].front()].operands, ir::ValueId(v)) == 1 &&
                   ir::opTraits(fn.ops[readers[v].front()].kind).isElementwise();
      if (def.kind == ir::OpKind::Param || fused) counted[v] = false;
    }
    // Accumulating over microbatches, a weight's gradient is added to its accumulator (the
    // plan's gradient bytes) as it is made: the update reads the accumulator.
    if (accumulates) {
      for (size_t v = 0; v < fn.values.size(); ++v) {
        if (!llvm::StringRef(fn.values[v].name).startswith("grad/")) continue;
        size_t last = fn.values[v].definingOp;
        for (size_t k : readers[v])
          if (k <= loopEnd) last = std::max(last, k);
        lastUse[v] = last;
      }
    }
    for (size_t v = 0; v < fn.values.size(); ++v)
      if (counted[v])
        freesAt[std::max<size_t>(lastUse[v], fn.values[v].definingOp)].push_back(ir::ValueId(v));
    const int sets[3] = {kPre | kLayer, kLayer, kLayer | kPost}; // first, middle, last stage
    double live[3] = {0, 0, 0}, peak[3] = {0, 0, 0};
    plan::PipelineShape::StagePeaks& peaks = shape.stagePeaks;
    for (size_t k = 0; k < n; ++k) {
      const ir::Op& op = fn.ops[k];
      if (counted[op.result])
        for (int s = 0; s < 3; ++s)
          if (held[op.result] & sets[s]) {
            live[s] += bytesOf(fn.typeOf(op.result));
            peak[s] = std::max(peak[s], live[s]);
          }
      for (ir::ValueId dead : freesAt[k])
        for (int s = 0; s < 3; ++s)
          if (held[dead] & sets[s]) live[s] -= bytesOf(fn.typeOf(dead));
      // The rest's forward values kept for its backward: one microbatch's, on the first and on
      // the last stage.
      if (k + 1 == forwardEnd)
        for (size_t v = 0; v < fn.values.size(); ++v) {
          uint32_t def = fn.values[v].definingOp;
          if (def > k || lastUse[v] <= k || !counted[v]) continue;
          double bytes = bytesOf(fn.typeOf(ir::ValueId(v)));
          if (partOf[def] == kLayer) {
            peaks.layerKept += bytes;
            continue;
          }
          if (held[v] & kPre) peaks.firstKept += bytes;
          if (held[v] & kPost) peaks.lastKept += bytes;
        }
    }
    peaks.first = peak[0];
    peaks.middle = peak[1];
    peaks.last = peak[2];
  }

  /// The forward ops outside the layers that make the first layer's carried input (a value of
  /// the repeat's carried type that a layer reads: the embedding), with what only they need.
  /// They read nothing stage-bound, so they run on the stages that read their result, which is
  /// the first layer's, on the first stage (split-stages); placeActivations, whose one layer
  /// stands for every stage's, places them with the layer. A value the layers read that is not
  /// carried (the attention mask) every stage computes.
  std::vector<bool> firstLayerInputOps() const {
    std::vector<bool> marked(fn.ops.size(), false);
    std::vector<bool> readByLayer(fn.values.size(), false);
    for (const ir::Op& op : fn.ops)
      if (inLayer(op))
        for (ir::ValueId operand : op.operands)
          readByLayer[operand] = true;
    std::vector<ir::ValueId> work;
    for (size_t k = 0; k < forwardEnd && k < fn.ops.size(); ++k) {
      ir::ValueId result = fn.ops[k].result;
      if (inLayer(fn.ops[k]) || !readByLayer[result]) continue;
      for (const ir::RepeatInfo& repeat : fn.repeats)
        if (llvm::is_contained(repeat.carried, fn.typeOf(result))) work.push_back(result);
    }
    while (!work.empty()) {
      ir::ValueId value = work.back();
      work.pop_back();
      size_t def = fn.values[value].definingOp;
      if (def >= forwardEnd || marked[def] || inLayer(fn.ops[def]) || partOf[def] != kLayer ||
          fn.ops[def].kind == ir::OpKind::Param)
        continue;
      marked[def] = true;
      for (ir::ValueId operand : fn.ops[def].operands)
        work.push_back(operand);
    }
    return marked;
  }

  /// PipelineShape::restForward, restBackward and restOnce: the plan's seconds of the rest's ops
  /// (each SPMD op by the IR op it comes from) on the parts placeActivations runs them in, as
  /// shares of the rest's seconds per phase. The phases are the pipeline's (PlanPipeline.cpp's
  /// workOf): forward and backward per microbatch; the weights' gradient reductions (backward
  /// collectives of `grad/` values) and the update (accumulating: all after the microbatch loop)
  /// once per step. A layer's ops are the layer's, and so is the update of a layer's weight
  /// (placed with the layer), though outside the repeat: the plans' difference counts it per
  /// layer. The embedding (firstLayerInputOps) runs on the first stage.
  void placeTime() {
    auto isGradient = [&](plan::SpmdValueId id) {
      return llvm::StringRef(spmd.values[id].name).startswith("grad/");
    };
    // Per phase (forward, backward, once): seconds on the first stage only, on the last only,
    // on every stage, and in all (an op on both end stages counts once there).
    double first[3] = {0, 0, 0}, last[3] = {0, 0, 0}, every[3] = {0, 0, 0}, all[3] = {0, 0, 0};
    std::vector<bool> onceOps = oncePerStep(spmd, accumulates);
    std::vector<bool> embedding = firstLayerInputOps();
    for (size_t i = 0; i < spmd.ops.size(); ++i) {
      const plan::SpmdOp& op = spmd.ops[i];
      size_t k = op.sourceOp;
      if (op.seconds <= 0 || k >= fn.ops.size() || inLayer(fn.ops[k])) continue;
      int part = partOf[k];
      if (inUpdate(k) && (part & kLayer)) continue; // a layer's weight's update
      bool once = onceOps[i] || (op.kind == plan::SpmdOp::Kind::Collective &&
                                 llvm::any_of(op.operands, isGradient));
      int phase = once ? 2 : op.phase == plan::Phase::Forward ? 0 : 1;
      all[phase] += op.seconds;
      if (embedding[k]) {
        first[phase] += op.seconds;
        continue;
      }
      if (!part || (part & kLayer)) { // what every stage computes for itself (a mask)
        every[phase] += op.seconds;
        continue;
      }
      if (part & kPre) first[phase] += op.seconds;
      if (part & kPost) last[phase] += op.seconds;
    }
    plan::PipelineShape::RestTime* times[3] = {&shape.restForward, &shape.restBackward,
                                               &shape.restOnce};
    for (int phase = 0; phase < 3; ++phase)
      if (all[phase] > 0)
        *times[phase] = {first[phase] / all[phase], last[phase] / all[phase],
                         every[phase] / all[phase]};
  }

  const ir::Function& fn;
  const plan::SpmdFunction& spmd;
  bool accumulates;
  plan::PipelineShape& shape;
  std::vector<plan::Phase> phases;
  size_t forwardEnd = 0;
  size_t loopEnd = 0;                   // the last op making a weight's gradient
  std::map<ir::ValueId, int> paramPart; // where each param's update runs
  std::vector<int> partOf;              // per op
  std::vector<int> held;                // per value: the parts holding it
  std::vector<bool> bound;              // per value: placed on some stages
};

} // namespace

std::vector<bool> oncePerStep(const plan::SpmdFunction& spmd, bool accumulates) {
  std::vector<bool> once(spmd.ops.size(), false);
  std::optional<plan::MicrobatchSchedule> schedule;
  if (accumulates) {
    if (auto scheduled = plan::scheduleMicrobatches(spmd))
      schedule = std::move(*scheduled);
    else
      llvm::consumeError(scheduled.takeError());
  }
  for (size_t i = 0; i < spmd.ops.size(); ++i)
    once[i] = spmd.ops[i].phase == plan::Phase::Update ||
              (schedule && (!schedule->perMicrobatch[i] || schedule->afterLoop[i]));
  return once;
}

void placeRest(const ir::Function& fn, const plan::SpmdFunction& spmd, bool accumulates,
               plan::PipelineShape& shape) {
  RestPlacer(fn, spmd, accumulates, shape).run();
}

} // namespace meshc
