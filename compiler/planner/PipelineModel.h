// Pipeline stages: the predicted time and memory of a train step whose repeated layers are split
// into consecutive stages over one mesh axis and whose batch runs as microbatches, GPipe (every
// forward, then every backward) or 1F1B (one forward, one backward, at most as many microbatches
// in flight as stages remain). This file composes per-layer figures; the driver obtains them by
// planning the step at one and at two layers (driver/PlanPipeline.h). docs/planner.md,
// "Pipeline stages".
#pragma once

#include "planner/Machine.h"
#include "planner/SpmdIR.h"

#include <cstdint>
#include <string>
#include <vector>

namespace meshc::plan {

enum class PipelineSchedule { GPipe, OneFOneB };
const char* scheduleName(PipelineSchedule schedule);

/// The work of one part of a stage (one repeated layer, or the ops outside the layers), per
/// device of the stage.
struct StageWork {
  double forwardSeconds = 0;      // one microbatch
  double backwardSeconds = 0;     // one microbatch, without the gradients' reductions
  double gradientSyncSeconds = 0; // once per step: the gradients' reductions (accumulated first)
  double updateSeconds = 0;       // once per step
  double flops = 0;               // useful flops of one microbatch, all devices of the stage
  int64_t collectives = 0;        // per microbatch (forward and backward)
  MemoryEstimate memory;          // params, optimizer, gradients; activations of one microbatch

  StageWork& operator+=(const StageWork& other);
  /// `this` minus `other`, never below zero (a difference of two plans).
  StageWork minus(const StageWork& other) const;
  StageWork times(double factor) const;
};

struct PipelineShape {
  int64_t layers = 1;       // iterations of the repeat the stages split
  int64_t stages = 1;       // the stage axis's size
  int64_t microbatches = 1; // per step
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  /// Bytes one device sends to the next stage per microbatch (the carried activation; its
  /// gradient goes back), and the link between neighbouring stages.
  double boundaryBytes = 0;
  Link link;
  /// With recomputation: one layer's whole activations, live while that layer is recomputed in
  /// backward, one layer and one microbatch at a time: added once to every stage's activations
  /// (the layer's own figure then holds only what a recomputed layer keeps, its inputs); on the
  /// last stage only what exceeds one microbatch's rest activations, which are freed by then.
  double recomputeWorkingBytes = 0;
  /// The layers of each stage as the layout pins them (`layers: stage(3, 1)`); empty: balanced.
  std::vector<int64_t> pinnedSplit;
  /// Where the rest's params, gradients and optimizer state live, as the code generator places
  /// them: a param on the stages whose forward reads it (the embedding on the first, the head on
  /// the last, a tied embedding on both), its gradient with it, its optimizer state on the first
  /// of them (where its update runs). Each is the share of the rest's bytes held by the first
  /// and by the last stage (a param both hold counts in each, so they may add up to more than 1).
  /// One stage holds the rest whole.
  struct RestShare {
    double first = 0, last = 1;
  };
  RestShare restParams;    // params
  RestShare restOptimizer; // optimizer state and gradient accumulators (where the update runs)
  /// Where the rest's time runs, as the code places its ops (driver/PlaceRest.h): the share of
  /// the rest's seconds spent by ops that run on the first stage only (the embedding's forward
  /// and backward, its update), on the last only (the final norm, the head, the loss, their
  /// updates) and on every stage (what each stage computes for itself: a mask built from the
  /// batch, the global norm's scalars). Stage s runs its share, first + last + every for one
  /// stage, which holds the rest whole. The default puts all of it on the last stage.
  struct RestTime {
    double first = 0, last = 1, every = 0;
    /// Stage `s`'s share of `p` stages.
    double of(int64_t s, int64_t p) const {
      if (p <= 1) return 1;
      return (s == 0 ? first : 0) + (s == p - 1 ? last : 0) + every;
    }
  };
  RestTime restForward, restBackward; // per microbatch
  RestTime restOnce;                  // the gradients' reductions and the update, once per step
  /// Activations per device as the code places the rest (driver/PlaceRest.h): the one-layer
  /// plan's peak live bytes of one microbatch restricted to what a first, a middle and a last
  /// stage hold (its layer's values; the rest's before the layers on the first, after them on
  /// the last; a value sent on both), and the rest's values kept from forward to backward per
  /// microbatch on the first and on the last stage, and the layer's (its values the code keeps:
  /// fused chains left out, so not the plans' difference). A stage of n layers holding k
  /// microbatches adds n - 1 layers' and k - 1 microbatches' kept values to its peak. Unset
  /// (first < 0): the rest's activations stay whole on the last stage (rest.memory).
  struct StagePeaks {
    double first = -1, middle = 0, last = 0;
    double firstKept = 0, lastKept = 0, layerKept = 0;
  };
  StagePeaks stagePeaks;
};

struct StagePrediction {
  int64_t firstLayer = 0, layerCount = 0;
  bool holdsRest = false; // the last stage: the ops after the layers (head, loss) live here
  double restForwardSeconds = 0, restBackwardSeconds = 0; // of the rest run here, per microbatch
  double forwardSeconds = 0;                              // one microbatch
  double backwardSeconds = 0;                             // one microbatch
  double onceSeconds = 0; // gradient reductions and update, once per step
  int64_t inFlight = 0;   // microbatches whose activations the stage holds at once
  MemoryEstimate memory;  // activations: inFlight microbatches' worth
};

struct PipelinePrediction {
  std::vector<StagePrediction> stages;
  double p2pSeconds = 0;     // one boundary transfer (activation or its gradient)
  double slotSeconds = 0;    // the slowest stage's forward + backward of one microbatch + sends
  double bubbleFraction = 0; // (p - 1) / (m + p - 1): slots in which a stage idles
  double stepSeconds = 0;    // (m + p - 1) slots + the slowest stage's once-per-step work
  double flopsPerStep = 0;   // useful flops of the step, all devices
  double peakMemoryBytes = 0;
};

/// Splits `layers` over `stages` (consecutive, at least one layer each) so that the slowest stage's
/// forward + backward of a microbatch is as small as it can be; `rest` (the ops outside the layers)
/// runs where `forward` and `backward` place it (by default on the last stage). Returns the layer
/// count of each stage.
std::vector<int64_t> balanceLayers(const StageWork& layer, const StageWork& rest, int64_t layers,
                                   int64_t stages, const PipelineShape::RestTime& forward = {},
                                   const PipelineShape::RestTime& backward = {});

/// The step's prediction: the per-stage split from balanceLayers (or the pinned one), then the
/// schedule's timeline.
PipelinePrediction predictPipeline(const StageWork& layer, const StageWork& rest,
                                   const PipelineShape& shape);

} // namespace meshc::plan
