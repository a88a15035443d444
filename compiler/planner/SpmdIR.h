// The SPMD IR: what every rank runs. Values carry their global type, their local (per-device)
// type and their TensorLayout; ops are the named-dim IR's compute ops on local shards plus
// explicit collectives. Produced by lowerToSpmd (SpmdLowering.h); printed by --emit=spmd; the
// single input of code generation.
#pragma once

#include "ir/IR.h"
#include "planner/Layout.h"
#include "planner/Machine.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshc::plan {

enum class CollectiveKind {
  AllReduceSum,  // resolve a partial sum over `axes`
  AllReduceMax,  // resolve a partial max over `axes`
  AllReduceMin,  // combine per-shard minima over `axes` (min over a split dim)
  ReduceScatter, // resolve a partial sum over `axes` and split `dim` over them
  AllGather,     // unsplit `dim` from its minor-most axes `axes`
  AllToAll,      // move `axes` from splitting `dim` to splitting `toDim`
  Permute,       // collective permute along `axes` for shift/halo of split `dim` by `offset`
  LocalSlice,    // split `dim` further over `axes` by taking this rank's slice: no communication
  /// Resolve the partial sums of several values over the same `axes` in one collective: the
  /// operands are packed into one buffer, all-reduced, and unpacked into `SpmdOp::results`.
  /// Made from small gradient all-reduces (kBucketBytes), see docs/planner.md.
  BucketedAllReduceSum,
};
const char* collectiveName(CollectiveKind kind);

struct Collective {
  CollectiveKind kind = CollectiveKind::AllReduceSum;
  AxisList axes;      // the mesh axes whose groups take part
  std::string dim;    // the dim split / gathered / shifted ("" for all-reduce)
  std::string toDim;  // all-to-all: the dim that becomes split
  int64_t offset = 0; // permute: the shift
  int64_t bytes = 0;  // the n of the alpha-beta formula (per device), see CostModel.h
  int64_t groupSize = 1;
};

using SpmdValueId = uint32_t;

/// Small all-reduces on the same axes are merged into buckets of at most this many bytes (per
/// device) in train steps: one collective pays the latency once (as DDP's gradient buckets).
constexpr int64_t kBucketBytes = 4 << 20;

/// Which part of a train step an op belongs to: the forward pass (the loss and what it reads),
/// the backward pass (gradients), or the update (the optimizer, once gradients are resolved).
/// Programs are all forward.
enum class Phase { Forward, Backward, Update };
const char* phaseName(Phase phase);

struct SpmdValue {
  ir::TensorType globalType;
  ir::TensorType localType;
  TensorLayout layout;
  std::string name;
};

struct SpmdOp {
  enum class Kind { Compute, Collective };
  Kind kind = Kind::Compute;
  ir::OpKind computeKind = ir::OpKind::Input; // Compute: the IR op, applied to local shards
  Collective collective;                      // Collective
  std::vector<SpmdValueId> operands;
  SpmdValueId result = 0;
  std::vector<std::pair<std::string, ir::AttrValue>> attrs; // copied from the IR op
  ir::Location loc;       // the .mesh source of the IR op this comes from
  uint32_t sourceOp = 0;  // index of that op in the ir::Function
  double flops = 0;       // per device
  double memoryBytes = 0; // bytes read + written per device (roofline)
  double seconds = 0;     // predicted: roofline for compute, alpha-beta for collectives
  std::string note;       // why, when not obvious ("partial sum over model resolved for relu")
  Phase phase = Phase::Forward;
  /// BucketedAllReduceSum: the resolved value of each operand, in order (results[0] == result).
  std::vector<SpmdValueId> results;

  /// The attribute `name` (copied from the IR op), or null.
  const ir::AttrValue* attr(std::string_view name) const {
    for (const auto& [key, value] : attrs)
      if (key == name) return &value;
    return nullptr;
  }
};

/// A place where the plan had to replicate a dim the layout splits (e.g. an axis used twice by
/// one tensor). Reported with the op's source location; never silent.
struct Replication {
  ir::Location loc;
  std::string dim;
  AxisList droppedAxes;
  std::string reason;
};

struct MemoryEstimate {
  double paramBytes = 0;          // parameters and consts, per device
  double optimizerBytes = 0;      // optimizer state (train blocks; per TrainInfo's optimizer)
  double gradientBytes = 0;       // gradients (train blocks)
  double peakActivationBytes = 0; // peak live activations under the op order
  double total() const { return paramBytes + optimizerBytes + gradientBytes + peakActivationBytes; }
};

struct PlanSummary {
  double computeSeconds = 0;
  double communicationSeconds = 0;
  double stepSeconds = 0;   // predicted (no overlap assumed): compute + communication
  double outputSeconds = 0; // of computeSeconds: run() returning its outputs (CostModel.h)
  double totalFlops = 0;    // useful global FLOPs of the function
  double utilization = 0;   // totalFlops / (devices * peak * stepSeconds)
  /// For train blocks, the estimate also covers backward (~2x forward compute, forward
  /// collectives mirrored) and the gradient reductions of params over the axes they are
  /// replicated on; see docs/planner.md.
  bool includesBackward = false;
  /// The train block went through autodiff (it has updates): the ops ARE forward, backward and
  /// update, and the costs above are theirs, not the model's.
  bool backwardIsReal = false;
};

/// Microbatching (meshc --microbatches DIM=K, planner/Microbatching.h): the function was planned
/// for one microbatch, `dim` at 1/count of the step's size; the generated step runs it `count`
/// times over slices of its inputs and accumulates the gradients before one update.
struct Microbatching {
  std::string dim;
  int64_t count = 1;
  double accumulatorBytes = 0; // gradient (and loss) accumulators per device, in memory's gradients
  /// The whole step's predicted seconds per Phase (forward, backward, update): the loop's ops
  /// count times, the rest once, plus the accumulation passes (in backward). The summary's
  /// times are the whole step's too.
  double phaseSeconds[3] = {0, 0, 0};
};

struct SpmdFunction {
  std::string name;
  ir::Function::Kind kind = ir::Function::Kind::Program;
  Mesh mesh;
  Layout layout;
  std::string machineName;
  std::vector<SpmdValue> values;
  std::vector<SpmdOp> ops;
  std::vector<SpmdValueId> inputs;                          // parallel to ir::Function::inputs
  std::vector<SpmdValueId> params;                          // parallel to ir::Function::params
  std::vector<std::pair<std::string, SpmdValueId>> outputs; // resolved, in their global layout
  /// Train steps: parallel to ir::Function::updates, each update's value resharded (resolved)
  /// into its param's layout; written into the param's storage when the step ends.
  std::vector<std::pair<size_t, SpmdValueId>> updates;
  std::vector<Replication> replications;
  MemoryEstimate memory;
  PlanSummary summary;
  /// Train blocks without updates only: the estimated gradient reductions (one all-reduce per
  /// trainable param replicated over an axis its consumers split) that the summary counts. Not
  /// part of `ops`. Empty once autodiff ran: the real gradient collectives are in `ops`.
  std::vector<SpmdOp> gradientOps;
  Microbatching microbatching;
  /// Pipeline stages for code generation (driver/StagedCode.h): the plan is one stage's mesh
  /// (without `axis`), `mesh` has the axis back, and the repeat over `dim` is split over its
  /// `count` stages (codegen/SplitStages.h): consecutive layers, `layers[s]` on stage s, as the
  /// pipeline plan balanced them (empty: an even split).
  struct Stages {
    std::string axis, dim;
    int64_t count = 1;
    bool oneFOneB = false; // --pipeline-schedule 1f1b (else GPipe)
    std::vector<int64_t> layers;
  };
  Stages stages;
};

} // namespace meshc::plan
