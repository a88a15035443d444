// planner/PipelineModel.h: the stages' split and the schedule's timeline and memory, on figures
// chosen so that each expected value follows from the formulas in docs/planner.md.
#include "planner/PipelineModel.h"

#include <catch2/catch.hpp>

using namespace meshc::plan;

namespace {

StageWork work(double forward, double backward, double activations) {
  StageWork w;
  w.forwardSeconds = forward;
  w.backwardSeconds = backward;
  w.flops = 100;
  w.memory.paramBytes = 10;
  w.memory.peakActivationBytes = activations;
  return w;
}

PipelineShape shape(int64_t layers, int64_t stages, int64_t microbatches,
                    PipelineSchedule schedule = PipelineSchedule::OneFOneB) {
  PipelineShape s;
  s.layers = layers;
  s.stages = stages;
  s.microbatches = microbatches;
  s.schedule = schedule;
  return s;
}

} // namespace

TEST_CASE("identical layers split evenly; the rest goes to the last stage") {
  StageWork layer = work(1, 2, 0), none;
  CHECK(balanceLayers(layer, none, 8, 4) == std::vector<int64_t>{2, 2, 2, 2});
  CHECK(balanceLayers(layer, none, 8, 1) == std::vector<int64_t>{8});
  // The rest costs two layers: the last stage takes fewer layers.
  StageWork rest = work(2, 4, 0);
  std::vector<int64_t> counts = balanceLayers(layer, rest, 10, 4);
  CHECK(counts == std::vector<int64_t>{3, 3, 3, 1});
}

TEST_CASE("the rest's time counts on the stages that run it, and the split balances it") {
  // A layer: 1 + 2 per microbatch; the rest: 4 + 8, of whose forward a quarter runs on the
  // first stage (the embedding), half on the last (the head, the loss) and a quarter on every
  // stage (a mask from the batch); of its backward half on the first and half on the last; its
  // once-per-step work (10 + 2) a sixth on the first, the rest on the last.
  StageWork layer = work(1, 2, 0), rest = work(4, 8, 0);
  rest.gradientSyncSeconds = 10;
  rest.updateSeconds = 2;
  PipelineShape s = shape(8, 2, 4);
  s.restForward = {0.25, 0.5, 0.25};
  s.restBackward = {0.5, 0.5, 0};
  s.restOnce = {1.0 / 6, 5.0 / 6, 0};
  CHECK(s.restForward.of(0, 2) == 0.5);
  CHECK(s.restForward.of(1, 2) == 0.75);
  CHECK(s.restForward.of(1, 3) == 0.25);
  CHECK(s.restForward.of(0, 1) == 1);
  // Stage 0 runs 2 + 4 of the rest per microbatch, stage 1 runs 3 + 4: 4 + 4 layers give slots
  // of 12 + 6 and 12 + 7, and moving a layer (3) would only swap the larger one: 4 + 4.
  CHECK(balanceLayers(layer, rest, 8, 2, s.restForward, s.restBackward) ==
        std::vector<int64_t>{4, 4});
  PipelinePrediction p = predictPipeline(layer, rest, s);
  REQUIRE(p.stages.size() == 2);
  CHECK(p.stages[0].forwardSeconds == Approx(4 + 2));
  CHECK(p.stages[0].backwardSeconds == Approx(8 + 4));
  CHECK(p.stages[0].restForwardSeconds == Approx(2));
  CHECK(p.stages[0].restBackwardSeconds == Approx(4));
  CHECK(p.stages[0].onceSeconds == Approx(2));
  CHECK(p.stages[1].forwardSeconds == Approx(4 + 3));
  CHECK(p.stages[1].backwardSeconds == Approx(8 + 4));
  CHECK(p.stages[1].restForwardSeconds == Approx(3));
  CHECK(p.stages[1].restBackwardSeconds == Approx(4));
  CHECK(p.stages[1].onceSeconds == Approx(10));
  CHECK(p.slotSeconds == Approx(19));
  CHECK(p.stepSeconds == Approx(5 * 19 + 10));
  // A middle stage runs only what every stage computes: a quarter of the rest's forward.
  s.stages = 3;
  s.layers = 9;
  PipelinePrediction three = predictPipeline(layer, rest, s);
  CHECK(three.stages[1].restForwardSeconds == Approx(1));
  CHECK(three.stages[1].restBackwardSeconds == 0);
  // The rest costs a whole layer on each end stage (3 per microbatch): 10 layers on 4 stages
  // go 2 + 3 + 3 + 2, where the same rest all on the last stage gives 3 + 3 + 3 + 1 (the first
  // test case).
  StageWork ends = work(2, 4, 0);
  PipelineShape shared = shape(10, 4, 1);
  shared.restForward = shared.restBackward = {0.5, 0.5, 0};
  CHECK(balanceLayers(layer, ends, 10, 4, shared.restForward, shared.restBackward) ==
        std::vector<int64_t>{2, 3, 3, 2});
  CHECK(predictPipeline(layer, ends, shared).slotSeconds == Approx(9));
}

TEST_CASE("the bubble is (p - 1) / (m + p - 1) and the step (m + p - 1) slots") {
  StageWork layer = work(1e-3, 2e-3, 0), none;
  for (int64_t m : {1, 4, 16})
    for (int64_t p : {1, 2, 4}) {
      PipelinePrediction prediction = predictPipeline(layer, none, shape(8, p, m));
      double slot = double(8 / p) * 3e-3;
      CHECK(prediction.bubbleFraction == Approx(double(p - 1) / double(m + p - 1)));
      CHECK(prediction.slotSeconds == Approx(slot));
      CHECK(prediction.stepSeconds == Approx(double(m + p - 1) * slot));
      // Every microbatch goes through every layer once.
      CHECK(prediction.flopsPerStep == Approx(100.0 * 8 * double(m)));
    }
}

TEST_CASE("GPipe holds every microbatch's activations, 1F1B at most p - s") {
  StageWork layer = work(1, 1, 1000), none;
  PipelinePrediction gpipe = predictPipeline(layer, none, shape(4, 4, 8, PipelineSchedule::GPipe));
  PipelinePrediction ofob = predictPipeline(layer, none, shape(4, 4, 8));
  for (size_t s = 0; s < 4; ++s) {
    CHECK(gpipe.stages[s].inFlight == 8);
    CHECK(ofob.stages[s].inFlight == int64_t(4 - s));
    CHECK(gpipe.stages[s].memory.peakActivationBytes == 8000);
  }
  CHECK(ofob.peakMemoryBytes == 10 + 4 * 1000);
  CHECK(gpipe.peakMemoryBytes == 10 + 8 * 1000);
  // Same timeline for both on identical stages.
  CHECK(gpipe.stepSeconds == Approx(ofob.stepSeconds));
  // Fewer microbatches than stages: 1F1B holds at most m.
  CHECK(predictPipeline(layer, none, shape(4, 4, 2)).stages[0].inFlight == 2);
}

TEST_CASE("boundary transfers lengthen the slot; once-per-step work is added once") {
  StageWork layer = work(1e-3, 1e-3, 0), none;
  layer.gradientSyncSeconds = 5e-3;
  layer.updateSeconds = 1e-3;
  PipelineShape s = shape(4, 2, 4);
  s.boundaryBytes = 1e6;
  s.link.alphaSeconds = 1e-5;
  s.link.bandwidthBytesPerS = 1e9;
  PipelinePrediction prediction = predictPipeline(layer, none, s);
  CHECK(prediction.p2pSeconds == Approx(1e-5 + 1e-3));
  // Two stages: each is an end stage, one transfer on its path per slot.
  double slot = 2 * 2e-3 + prediction.p2pSeconds;
  CHECK(prediction.slotSeconds == Approx(slot));
  CHECK(prediction.stepSeconds == Approx(5 * slot + 2 * 6e-3));
}

TEST_CASE("a difference of plans never goes below zero") {
  StageWork two = work(3, 6, 30), one = work(2, 4, 20);
  StageWork layer = two.minus(one);
  CHECK(layer.forwardSeconds == 1);
  CHECK(layer.memory.peakActivationBytes == 10);
  StageWork rest = one.minus(layer.times(3));
  CHECK(rest.forwardSeconds == 0);
  CHECK(rest.memory.paramBytes == 10); // one layer adds no params here: the rest keeps them
}

TEST_CASE("the rest's params live where the code holds them: first, last or both stages") {
  // A layer: 10 bytes of params; the rest: 100 of params, 200 of optimizer state, 100 of
  // gradients, 50 of activations (which stay on the last stage); no time, so 2 + 2 layers.
  StageWork layer = work(1, 1, 0), rest = work(0, 0, 50);
  rest.memory.paramBytes = 100;
  rest.memory.optimizerBytes = 200;
  rest.memory.gradientBytes = 100;
  PipelineShape split = shape(4, 2, 1);
  // Default: all of it on the last stage.
  PipelinePrediction last = predictPipeline(layer, rest, split);
  CHECK(last.stages[0].memory.total() == Approx(20));
  CHECK(last.stages[1].memory.total() == Approx(20 + 400 + 50));
  // An embedding of a quarter of the rest's bytes on the first stage, the head on the last.
  split.restParams = split.restOptimizer = {0.25, 0.75};
  PipelinePrediction placed = predictPipeline(layer, rest, split);
  CHECK(placed.stages[0].memory.paramBytes == Approx(20 + 25));
  CHECK(placed.stages[0].memory.total() == Approx(20 + 100));
  CHECK(placed.stages[1].memory.total() == Approx(20 + 300 + 50));
  // Tied: the whole rest is one param both stages hold, its optimizer state and gradient
  // accumulator on the first, where its update runs (split-stages sums the last stage's part of
  // the gradient into the first's accumulator).
  split.restParams = {1, 1};
  split.restOptimizer = {1, 0};
  PipelinePrediction tied = predictPipeline(layer, rest, split);
  CHECK(tied.stages[0].memory.total() == Approx(20 + 400));
  CHECK(tied.stages[1].memory.total() == Approx(20 + 100 + 50));
  // One stage holds the rest once, whatever the shares.
  PipelinePrediction one = predictPipeline(layer, rest, [&] {
    PipelineShape s = split;
    s.stages = 1;
    return s;
  }());
  CHECK(one.stages[0].memory.total() == Approx(40 + 400 + 50));
}

TEST_CASE("activations per stage from the stage peaks: one layer at the peak, the rest kept") {
  // A layer keeps 10 bytes per microbatch; a first stage's peak (its layer and the embedding's
  // backward) 100, a middle one's 30, a last one's (the head) 70; the rest keeps 5 on the first
  // and 20 on the last per microbatch.
  StageWork layer = work(1, 1, 999), rest = work(0, 0, 999);
  PipelineShape split = shape(6, 3, 4);
  split.schedule = PipelineSchedule::OneFOneB;
  split.stagePeaks = {100, 30, 70, 5, 20, 10};
  PipelinePrediction p = predictPipeline(layer, rest, split);
  REQUIRE(p.stages.size() == 3);
  // 1F1B: stage s holds min(m, p - s) = 3, 2, 1 microbatches, 2 layers each.
  CHECK(p.stages[0].memory.peakActivationBytes == Approx(100 + 10 + 2 * (20 + 5)));
  CHECK(p.stages[1].memory.peakActivationBytes == Approx(30 + 10 + 1 * 20));
  CHECK(p.stages[2].memory.peakActivationBytes == Approx(70 + 10));
  // GPipe: every stage holds all 4.
  split.schedule = PipelineSchedule::GPipe;
  PipelinePrediction g = predictPipeline(layer, rest, split);
  CHECK(g.stages[2].memory.peakActivationBytes == Approx(70 + 10 + 3 * (20 + 20)));
  // Unset peaks: the plans' figures, the rest's on the last stage, times the microbatches held.
  split.stagePeaks = {};
  PipelinePrediction old = predictPipeline(layer, rest, split);
  CHECK(old.stages[1].memory.peakActivationBytes == Approx(4 * 2 * 999));
}
