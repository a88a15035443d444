#include "planner/CostModel.h"

#include "planner/Reshard.h"

#include <algorithm>
#include <cmath>

namespace meshc::plan {

double streamBandwidth(const Machine& machine, double bytes) {
  // Never below the memory's: an op's time then never decreases as its bytes grow, which the
  // search's lower bounds (smaller shards than any real layout's) rely on.
  if (bytes <= machine.cacheBytes) return std::max(machine.cacheBandwidth, machine.memoryBandwidth);
  return machine.memoryBandwidth;
}

/// bf16 and f16: the dtypes a machine's bf16 rate applies to, and a CPU rounds to after f32.
static bool isNarrowFloat(ir::DType dtype) {
  return dtype == ir::DType::BF16 || dtype == ir::DType::F16;
}

double computeSeconds(const Machine& machine, double flops, double bytes, ir::DType dtype) {
  double peak = machine.peakFlops;
  if (isNarrowFloat(dtype) && machine.peakFlopsBf16 > 0) peak = machine.peakFlopsBf16;
  double flopSeconds = peak > 0 ? flops / peak : 0;
  double bandwidth = streamBandwidth(machine, bytes);
  double memorySeconds = bandwidth > 0 ? bytes / bandwidth : 0;
  return std::max(flopSeconds, memorySeconds);
}

double gemmSeconds(const Machine& machine, double flops, double bytes, ir::DType dtype,
                   double smallestDim, double batches) {
  double slowdown =
      machine.gemmShapeDim > 0 && smallestDim > 0 ? 1 + machine.gemmShapeDim / smallestDim : 1;
  // A CPU (its loops described) without a bf16 rate runs a bf16/f16 GEMM as the C++ target
  // prints it: the f32 GEMM (the narrow operands' products are exact in f32), then a pass that
  // rounds the result to the dtype (support::roundBufferBF16), charged at the GEMM's bytes.
  bool narrowOnCpu = isNarrowFloat(dtype) && machine.peakFlopsBf16 <= 0 && modelsLoops(machine);
  double seconds = computeSeconds(machine, flops * slowdown, bytes, dtype);
  if (narrowOnCpu) seconds += loopShareSeconds(machine, 0, 0, bytes, /*closesNest=*/true);
  bool realMatrices = batches > 1 && smallestDim > 1;
  // A batch of small matrices: meshrt's own loops (SmallGemm.h), no library call; each matrix
  // pays its setup (b copied into a panel, the tiles' stores).
  if (realMatrices && flops / (2 * batches) <= machine.smallGemmTerms)
    return seconds + batches * machine.gemmBatchSeconds;
  seconds += machine.gemmLatencySeconds;
  // A batched GEMM of larger matrices: oneDNN's batched matmul sets each one up (meshrt's
  // DnnlGemm; 0.4 us a matrix of 16 x 16 x 8 here, 8x its FLOP time, before the loops took them).
  if (realMatrices) seconds += (batches - 1) * machine.gemmBatchSeconds;
  return seconds;
}

double contractionSeconds(const Machine& machine, const Contraction& contraction,
                          double outElements, ir::DType dtype) {
  double bytesPer = static_cast<double>(dtypeBytes(dtype)), seconds = 0;
  for (const ContractionStep& step : contraction.steps) {
    double elements = static_cast<double>(step.leftElements + step.rightElements + step.elements);
    seconds +=
        gemmSeconds(machine, step.flops, elements * bytesPer, dtype, step.smallest, step.batches);
  }
  if (!contraction.broadcast.empty()) {
    double product = static_cast<double>(contraction.steps.back().elements);
    seconds += modelsLoops(machine)
                   ? loopShareSeconds(machine, 0, 0, (product + outElements) * bytesPer, true)
                   : computeSeconds(machine, 0, (product + outElements) * bytesPer, dtype);
  }
  return seconds;
}

bool modelsLoops(const Machine& machine) {
  return machine.vectorFlops > 0;
}

namespace {

double memorySeconds(const Machine& machine, double bytes) {
  double bandwidth = streamBandwidth(machine, bytes);
  return bandwidth > 0 ? bytes / bandwidth : 0;
}

} // namespace

double loopShareSeconds(const Machine& machine, double flops, double transcendentalElements,
                        double bytes, bool closesNest) {
  double simpleFlops = flops + transcendentalElements * machine.transcendentalFlops;
  double flopSeconds = machine.vectorFlops > 0 ? simpleFlops / machine.vectorFlops : 0;
  return std::max(flopSeconds, memorySeconds(machine, bytes)) +
         (closesNest ? machine.loopLatencySeconds : 0);
}

double rowKernelSeconds(const Machine& machine, RowKernel kernel, double elements, double bytes,
                        double rows) {
  double perElement = kernel == RowKernel::Softmax     ? machine.softmaxElementSeconds
                      : kernel == RowKernel::LayerNorm ? machine.layerNormElementSeconds
                                                       : machine.reduceElementSeconds;
  // Generated code's softmax row kernel (GeneratedSupport.h, softmaxRow) pays a fixed cost per
  // row (its max, sum and scale passes each start over), which short rows (attention's 17
  // keys) do not amortize ("Fidelity, eleventh pass").
  double perRows = kernel == RowKernel::Softmax ? rows * machine.softmaxRowSeconds : 0;
  return std::max(elements * perElement + perRows, memorySeconds(machine, bytes)) +
         machine.loopLatencySeconds;
}

double kernelCallSeconds(const Machine& machine, double flops, double bytes) {
  return loopShareSeconds(machine, flops, 0, bytes, /*closesNest=*/true);
}

double outputSeconds(const Machine& machine, double bytes) {
  if (machine.outputSeconds <= 0) return 0;
  return machine.outputSeconds + 2 * bytes / streamBandwidth(machine, 2 * bytes);
}

double oversubscription(const Machine& machine, const Mesh& mesh) {
  // Pipeline stages: every stage's mesh runs on the machine at once (Machine::meshCopies).
  double ranks = static_cast<double>(mesh.numDevices() * std::max<int64_t>(machine.meshCopies, 1));
  if (machine.cores > 0) // meshrt's rankCores: consecutive blocks, the largest ceil(ranks / cores)
    return std::max(1.0, std::ceil(ranks / static_cast<double>(machine.cores)));
  return std::max(1.0, ranks / static_cast<double>(std::max<int64_t>(machine.numDevices, 1)));
}

double oversubscribedSyncSeconds(const Machine& machine, const Mesh& mesh, const AxisList& axes) {
  double k = oversubscription(machine, mesh);
  if (k <= 1) return 0;
  // Every barrier of the collective waits until each rank a core holds has run once more: one
  // hand-over of the core per rank, so the sync grows with the ranks per core (calibrated at 2
  // and 4 per core; "Fidelity, tenth pass").
  double perRank = std::max(0.0, k - 2) * machine.oversubscribedSyncRankSeconds;
  if (machine.cores <= 0) return machine.oversubscribedSyncSeconds + perRank;
  // meshrt's rankCores: rank r of all the meshes' ranks runs on core r x cores / ranks. Stage s
  // of a pipeline (meshCopies) holds ranks s N .. s N + N - 1.
  int64_t perMesh = mesh.numDevices(), copies = std::max<int64_t>(machine.meshCopies, 1);
  int64_t ranks = perMesh * copies;
  for (int64_t copy = 0; copy < copies; ++copy) {
    auto coreOf = [&](int64_t rank) { return (copy * perMesh + rank) * machine.cores / ranks; };
    if (groupSpans(mesh, axes, coreOf)) return machine.oversubscribedSyncSeconds + perRank;
  }
  return machine.sharedCoreSyncSeconds + perRank;
}

double collectiveSeconds(const Machine& machine, const Mesh& mesh, const Collective& collective) {
  if (collective.kind == CollectiveKind::LocalSlice) return 0;
  double p = static_cast<double>(splitFactor(mesh, collective.axes));
  if (p <= 1) return 0;
  const Link& link = linkFor(machine, mesh, collective.axes);
  double a = link.alphaSeconds;
  double b = link.bandwidthBytesPerS > 0 ? 1.0 / link.bandwidthBytesPerS : 0;
  // On a CPU machine the ranks' own threads move and add the bytes: ranks sharing a core take
  // turns at it, as at their compute.
  if (machine.cores > 0) b *= oversubscription(machine, mesh);
  double n = static_cast<double>(collective.bytes);
  double fraction = (p - 1) / p;
  double sync = oversubscribedSyncSeconds(machine, mesh, collective.axes);
  switch (collective.kind) {
  case CollectiveKind::AllReduceSum:
  case CollectiveKind::AllReduceMax:
  case CollectiveKind::AllReduceMin:
  case CollectiveKind::BucketedAllReduceSum:
    return sync + 2 * a + 2 * b * fraction * n;
  case CollectiveKind::ReduceScatter:
  case CollectiveKind::AllGather:
    return sync + a + b * fraction * n;
  case CollectiveKind::AllToAll:
    return sync + (p - 1) * a + b * fraction * n;
  case CollectiveKind::Permute:
    return sync + a + b * n;
  case CollectiveKind::LocalSlice:
    return 0;
  }
  return 0;
}

double mergeableLatencySeconds(const Machine& machine, const Mesh& mesh,
                               const Collective& collective) {
  if ((collective.kind != CollectiveKind::AllReduceSum &&
       collective.kind != CollectiveKind::BucketedAllReduceSum) ||
      splitFactor(mesh, collective.axes) <= 1)
    return 0;
  return oversubscribedSyncSeconds(machine, mesh, collective.axes) +
         2 * linkFor(machine, mesh, collective.axes).alphaSeconds;
}

} // namespace meshc::plan
