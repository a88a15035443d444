#include "planner/PipelineModel.h"

#include <algorithm>
#include <tuple>

namespace meshc::plan {

const char* scheduleName(PipelineSchedule schedule) {
  switch (schedule) {
  case PipelineSchedule::GPipe:
    return "gpipe";
  case PipelineSchedule::OneFOneB:
    return "1f1b";
  }
  return "?";
}

namespace {

MemoryEstimate combine(const MemoryEstimate& a, const MemoryEstimate& b, double sign) {
  auto at = [&](double x, double y) { return std::max(0.0, x + sign * y); };
  return {at(a.paramBytes, b.paramBytes), at(a.optimizerBytes, b.optimizerBytes),
          at(a.gradientBytes, b.gradientBytes), at(a.peakActivationBytes, b.peakActivationBytes)};
}

StageWork combine(const StageWork& a, const StageWork& b, double sign) {
  auto at = [&](double x, double y) { return std::max(0.0, x + sign * y); };
  StageWork result;
  result.forwardSeconds = at(a.forwardSeconds, b.forwardSeconds);
  result.backwardSeconds = at(a.backwardSeconds, b.backwardSeconds);
  result.gradientSyncSeconds = at(a.gradientSyncSeconds, b.gradientSyncSeconds);
  result.updateSeconds = at(a.updateSeconds, b.updateSeconds);
  result.flops = at(a.flops, b.flops);
  result.collectives = std::max<int64_t>(0, a.collectives + (sign > 0 ? 1 : -1) * b.collectives);
  result.memory = combine(a.memory, b.memory, sign);
  return result;
}

/// The rest's forward and backward of one microbatch on stage `s` of `p`.
double restSlotOf(const StageWork& rest, const PipelineShape::RestTime& forward,
                  const PipelineShape::RestTime& backward, int64_t s, int64_t p) {
  return rest.forwardSeconds * forward.of(s, p) + rest.backwardSeconds * backward.of(s, p);
}

} // namespace

StageWork& StageWork::operator+=(const StageWork& other) {
  return *this = combine(*this, other, 1);
}

StageWork StageWork::minus(const StageWork& other) const {
  return combine(*this, other, -1);
}

StageWork StageWork::times(double factor) const {
  StageWork result = *this;
  for (double* x : {&result.forwardSeconds, &result.backwardSeconds, &result.gradientSyncSeconds,
                    &result.updateSeconds, &result.flops, &result.memory.paramBytes,
                    &result.memory.optimizerBytes, &result.memory.gradientBytes,
                    &result.memory.peakActivationBytes})
    *x *= factor;
  result.collectives = int64_t(double(collectives) * factor + 0.5);
  return result;
}

std::vector<int64_t> balanceLayers(const StageWork& layer, const StageWork& rest, int64_t layers,
                                   int64_t stages, const PipelineShape::RestTime& forward,
                                   const PipelineShape::RestTime& backward) {
  std::vector<int64_t> counts(size_t(std::max<int64_t>(stages, 1)), 0);
  if (stages <= 1) {
    counts[0] = layers;
    return counts;
  }
  // Every stage holds at least one layer; each further layer goes to the stage whose slot grows
  // least (each stage also runs its share of the rest: the embedding on the first, the head and
  // the loss on the last). Greedy on identical layers is optimal: it keeps the largest slot
  // minimal one layer at a time.
  std::fill(counts.begin(), counts.end(), 1);
  for (int64_t placed = stages; placed < layers; ++placed) {
    size_t best = 0;
    double bestSlot = 0;
    for (size_t s = 0; s < counts.size(); ++s) {
      double slot = double(counts[s] + 1) * (layer.forwardSeconds + layer.backwardSeconds) +
                    restSlotOf(rest, forward, backward, int64_t(s), stages);
      if (s == 0 || slot < bestSlot) {
        best = s;
        bestSlot = slot;
      }
    }
    ++counts[best];
  }
  return counts;
}

PipelinePrediction predictPipeline(const StageWork& layer, const StageWork& rest,
                                   const PipelineShape& shape) {
  PipelinePrediction prediction;
  int64_t p = std::max<int64_t>(shape.stages, 1), m = std::max<int64_t>(shape.microbatches, 1);
  std::vector<int64_t> counts =
      shape.pinnedSplit.empty()
          ? balanceLayers(layer, rest, shape.layers, p, shape.restForward, shape.restBackward)
          : shape.pinnedSplit;
  if (p > 1)
    prediction.p2pSeconds =
        shape.link.alphaSeconds + (shape.link.bandwidthBytesPerS > 0
                                       ? shape.boundaryBytes / shape.link.bandwidthBytesPerS
                                       : 0);
  int64_t first = 0;
  double slowestSlot = 0, slowestOnce = 0;
  for (int64_t s = 0; s < p; ++s) {
    StagePrediction stage;
    stage.firstLayer = first;
    stage.layerCount = counts[size_t(s)];
    stage.holdsRest = s == p - 1;
    first += stage.layerCount;
    StageWork work = layer.times(double(stage.layerCount));
    if (stage.holdsRest) work += rest;
    // The rest's params, optimizer state and gradients where the code holds them (PipelineShape).
    if (p > 1) {
      auto more = [&](const PipelineShape::RestShare& share) {
        return (s == 0 ? share.first : 0) + (s == p - 1 ? share.last : 0) -
               (stage.holdsRest ? 1 : 0);
      };
      for (auto [held, ofRest, share] :
           {std::tuple{&work.memory.paramBytes, rest.memory.paramBytes, more(shape.restParams)},
            std::tuple{&work.memory.gradientBytes, rest.memory.gradientBytes,
                       more(shape.restOptimizer)},
            std::tuple{&work.memory.optimizerBytes, rest.memory.optimizerBytes,
                       more(shape.restOptimizer)}})
        *held = std::max(0.0, *held + share * ofRest);
    }
    // Time: the stage's layers and its share of the rest (where the code runs the rest's ops).
    StageWork layers = layer.times(double(stage.layerCount));
    stage.restForwardSeconds = rest.forwardSeconds * shape.restForward.of(s, p);
    stage.restBackwardSeconds = rest.backwardSeconds * shape.restBackward.of(s, p);
    stage.forwardSeconds = layers.forwardSeconds + stage.restForwardSeconds;
    stage.backwardSeconds = layers.backwardSeconds + stage.restBackwardSeconds;
    stage.onceSeconds = layers.gradientSyncSeconds + layers.updateSeconds +
                        (rest.gradientSyncSeconds + rest.updateSeconds) * shape.restOnce.of(s, p);
    // GPipe keeps every microbatch's activations until its backward; 1F1B starts backward as
    // soon as the last stage has one, so stage s holds at most p - s microbatches.
    stage.inFlight = shape.schedule == PipelineSchedule::GPipe ? m : std::min(m, p - s);
    stage.memory = work.memory;
    const PipelineShape::StagePeaks& peaks = shape.stagePeaks;
    if (p > 1 && peaks.first >= 0) {
      // One layer and one microbatch at the stage's peak (a recomputed layer's working set
      // included: the one-layer plan recomputes it), the other layers' and microbatches' kept
      // values beside it.
      double kept = peaks.layerKept, n = double(stage.layerCount);
      double restKept = (s == 0 ? peaks.firstKept : 0) + (s == p - 1 ? peaks.lastKept : 0);
      stage.memory.peakActivationBytes = (s == 0       ? peaks.first
                                          : s == p - 1 ? peaks.last
                                                       : peaks.middle) +
                                         (n - 1) * kept +
                                         double(stage.inFlight - 1) * (n * kept + restKept);
    } else {
      stage.memory.peakActivationBytes *= double(stage.inFlight);
    }
    // The layer being recomputed: on the stage of the rest, one microbatch's rest activations
    // are freed (its backward through the rest ran) before its layers are recomputed.
    if (shape.recomputeWorkingBytes > 0 && !(p > 1 && peaks.first >= 0))
      stage.memory.peakActivationBytes +=
          std::max(0.0, shape.recomputeWorkingBytes -
                            (stage.holdsRest ? rest.memory.peakActivationBytes : 0));
    // A stage sends its activation forward and receives the gradient back (the last stage only
    // receives; the first only sends back nothing): two transfers on a middle stage's path.
    double sends = p > 1 ? prediction.p2pSeconds * (s == 0 || s == p - 1 ? 1 : 2) : 0;
    slowestSlot = std::max(slowestSlot, stage.forwardSeconds + stage.backwardSeconds + sends);
    slowestOnce = std::max(slowestOnce, stage.onceSeconds);
    prediction.peakMemoryBytes = std::max(prediction.peakMemoryBytes, stage.memory.total());
    prediction.flopsPerStep += work.flops * double(m);
    prediction.stages.push_back(stage);
  }
  prediction.slotSeconds = slowestSlot;
  prediction.bubbleFraction = double(p - 1) / double(m + p - 1);
  prediction.stepSeconds = double(m + p - 1) * slowestSlot + slowestOnce;
  return prediction;
}

} // namespace meshc::plan
