#include "planner/CostModel.h"

#include <algorithm>

namespace meshc::plan {

double computeSeconds(const Machine& machine, double flops, double bytes, ir::DType dtype) {
  double peak = machine.peakFlops;
  if ((dtype == ir::DType::BF16 || dtype == ir::DType::F16) && machine.peakFlopsBf16 > 0)
    peak = machine.peakFlopsBf16;
  double flopSeconds = peak > 0 ? flops / peak : 0;
  double memorySeconds = machine.memoryBandwidth > 0 ? bytes / machine.memoryBandwidth : 0;
  return std::max(flopSeconds, memorySeconds);
}

double collectiveSeconds(const Machine& machine, const Mesh& mesh, const Collective& collective) {
  if (collective.kind == CollectiveKind::LocalSlice) return 0;
  double p = static_cast<double>(splitFactor(mesh, collective.axes));
  if (p <= 1) return 0;
  const Link& link = linkFor(machine, mesh, collective.axes);
  double a = link.alphaSeconds;
  double b = link.bandwidthBytesPerS > 0 ? 1.0 / link.bandwidthBytesPerS : 0;
  double n = static_cast<double>(collective.bytes);
  double fraction = (p - 1) / p;
  switch (collective.kind) {
  case CollectiveKind::AllReduceSum:
  case CollectiveKind::AllReduceMax:
  case CollectiveKind::AllReduceMin:
  case CollectiveKind::BucketedAllReduceSum:
    return 2 * a + 2 * b * fraction * n;
  case CollectiveKind::ReduceScatter:
  case CollectiveKind::AllGather:
    return a + b * fraction * n;
  case CollectiveKind::AllToAll:
    return (p - 1) * a + b * fraction * n;
  case CollectiveKind::Permute:
    return a + b * n;
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
  return 2 * linkFor(machine, mesh, collective.axes).alphaSeconds;
}

} // namespace meshc::plan
