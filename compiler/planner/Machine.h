// Machine descriptions: data, not code. Built-ins live as JSON in machines/*.json (embedded at
// build time); users pass their own file with the same schema (docs/planner.md).
#pragma once

#include "planner/Layout.h"

#include <llvm/ADT/STLFunctionalExtras.h>
#include <llvm/Support/Error.h>

#include <string>
#include <vector>

namespace meshc::plan {

/// One level of interconnect (NVLink inside a node, InfiniBand between nodes, ICI, shared memory).
struct Link {
  std::string name;
  double alphaSeconds = 0;       // per-message latency of one step
  double bandwidthBytesPerS = 0; // per-device unidirectional bandwidth (the alpha-beta 1/beta)
  bool operator==(const Link&) const = default;
};

struct Machine {
  std::string name;
  std::string description;
  int64_t numDevices = 1;
  int64_t devicesPerNode = 1; // devices sharing the fast link; mesh axes spanning nodes use `inter`
  /// Pipeline stages: a stage's plan is made on its own mesh, but all the stages' meshes run on
  /// the machine at once, so its ranks share the devices with this many meshes (oversubscription
  /// counts them all); 1 otherwise. Not read from a machine file.
  int64_t meshCopies = 1;
  double peakFlops = 0;       // per device, dense matmul, f32 (or the dtype it is quoted for)
  double peakFlopsBf16 = 0;   // per device, bf16/f16 tensor cores (0: same as peakFlops)
  double memoryBandwidth = 0; // bytes/s per device
  double memoryBytes = 0;     // capacity per device
  // Measured refinements (docs/planner.md, "Cost model"; 0: not modelled). An op whose bytes fit
  // in `cacheBytes` streams at `cacheBandwidth` instead of `memoryBandwidth`; every GEMM pays
  // `gemmLatencySeconds` on top of its roofline; every collective of a mesh with more ranks than
  // cores pays `oversubscribedSyncSeconds` on top of alpha-beta, or `sharedCoreSyncSeconds` when
  // each of its groups lies on one core (a hand-over between the ranks taking turns there: no
  // core idles until a peer elsewhere is woken). A description without shared_core_sync_seconds
  // charges every collective the oversubscribed sync, as before. Both grow by
  // `oversubscribedSyncRankSeconds` per rank a core holds beyond 2: at a barrier every rank of a
  // core must run once more before the group passes (0: the same sync at any ranks per core).
  double cacheBytes = 0;
  double cacheBandwidth = 0;
  double gemmLatencySeconds = 0;
  double oversubscribedSyncSeconds = 0;
  double sharedCoreSyncSeconds = 0;
  double oversubscribedSyncRankSeconds = 0;
  // The cores a CPU machine's ranks (threads or processes) run on, `meshc calibrate`'s count;
  // more ranks than cores take turns on them (CostModel.h, oversubscription). 0: not a CPU
  // description (GPUs: one rank per device), the ranks share the `numDevices` devices.
  int64_t cores = 0;
  // GEMM efficiency by shape (0: none): a GEMM whose smallest of m, n and k (per batch element)
  // is `gemmShapeDim` runs its FLOPs at half the peak, one with s at peak / (1 + gemmShapeDim / s).
  double gemmShapeDim = 0;
  // A batched GEMM's fixed cost per matrix (0: none): each matrix of a batch that meshrt's small
  // GEMM loops run (at most `smallGemmTerms` multiply-adds a matrix: b copied, tiles set up),
  // else each after the first that the library's batched matmul sets up. Not charged to
  // batches of outer products, GEMVs or dot products, which meshrt runs as other loops.
  double gemmBatchSeconds = 0;
  // The runtime's limit for its small GEMM loops, m n k of one matrix (meshrt's
  // smallGemmMaxTerms; 0: every batch goes to the library, as before the loops existed).
  double smallGemmTerms = 0;
  // What the generated code's loops and kernels reach (docs/planner.md, "Loops and kernels";
  // 0: not modelled, the roofline alone). A fused elementwise loop nest runs its FLOPs at
  // `vectorFlops` (not the GEMM peak), each exp/log/tanh/... element counting
  // `transcendentalFlops` of them; every loop nest and kernel call pays `loopLatencySeconds`;
  // the row-wise kernels run at their own measured time per element.
  double vectorFlops = 0;
  double transcendentalFlops = 0;
  double randomFlops = 0; // one element of dropout or a random fill, in simple FLOPs (0: 10)
  double normalFlops = 0; // one element of random_normal's fill (Box-Muller; 0: randomFlops)
  double loopLatencySeconds = 0;
  double softmaxElementSeconds = 0;   // softmax, log_softmax, logsumexp: per operand element
  double softmaxRowSeconds = 0;       // softmax, log_softmax, logsumexp: per row (0: none)
  double layerNormElementSeconds = 0; // layer_norm: per operand element
  double reduceElementSeconds = 0;    // sum, mean, max, min: per operand element
  double outputSeconds = 0;           // run() returning one output: a new tensor (0: not modelled)
  Link intra;                         // inside a node
  Link inter;                         // between nodes (unused when devicesPerNode >= numDevices)
  /// Every field equal (ReshardMemo shares paths between equal machines only).
  bool operator==(const Machine&) const = default;
};

/// Names of the built-in machines ("cpu", "8xh100", "8xh200", "h100-cluster", "a100-cluster",
/// "tpuv2-pod").
std::vector<std::string> builtinMachineNames();

/// A built-in by name, or else a JSON file at that path.
llvm::Expected<Machine> loadMachine(const std::string& nameOrPath);

/// Parses the JSON form (the schema of machines/*.json).
llvm::Expected<Machine> parseMachine(llvm::StringRef json, llvm::StringRef sourceName);

/// The link a collective over `axes` of `mesh` uses on `machine` (inter-node when the ranks of
/// one group lie on different nodes, given row-major rank numbering).
const Link& linkFor(const Machine& machine, const Mesh& mesh, const AxisList& axes);

/// Whether some group of a collective over `axes` (the ranks of `mesh` that differ only in those
/// axes, numbered row-major) has members at two places, `placeOf(rank)` (a node, a core).
bool groupSpans(const Mesh& mesh, const AxisList& axes,
                llvm::function_ref<int64_t(int64_t)> placeOf);

} // namespace meshc::plan
