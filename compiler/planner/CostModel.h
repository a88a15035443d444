// The cost model: roofline for compute, alpha-beta per mesh axis for collectives (the formulas
// of the brief), bytes per device for memory. All times in seconds. The refinements measured by
// `meshc calibrate` (a cache level, a GEMM's fixed cost, the synchronization of oversubscribed
// thread ranks) are 0 in a description without them, which then costs as before.
#pragma once

#include "planner/Machine.h"
#include "planner/SpmdIR.h"

namespace meshc::plan {

/// The bandwidth an op touching `bytes` streams at: the cache's when the machine has one and
/// the bytes fit in it, else the memory's.
double streamBandwidth(const Machine& machine, double bytes);

/// Roofline: max(flops / peak(dtype), bytes / streamBandwidth(bytes)).
double computeSeconds(const Machine& machine, double flops, double bytes, ir::DType dtype);

/// A GEMM (an einsum of two operands, which codegen calls the GEMM library for): the roofline
/// plus the machine's fixed cost per call, which small GEMMs do not amortize.
double gemmSeconds(const Machine& machine, double flops, double bytes, ir::DType dtype);

/// How many ranks share one device: max(1, mesh ranks / machine devices). Compute times are
/// multiplied by it (the ranks take turns on the cores).
double oversubscription(const Machine& machine, const Mesh& mesh);

/// What each collective of an oversubscribed mesh pays on top of alpha-beta (a peer that is not
/// running must be scheduled before the group can pass): the machine's
/// oversubscribed_sync_seconds when oversubscription(machine, mesh) > 1, else 0.
double oversubscribedSyncSeconds(const Machine& machine, const Mesh& mesh);

/// Alpha-beta time of one collective over its axes on `machine`:
///   allgather, reduce-scatter: a + b (p-1)/p n;  allreduce: 2a + 2b (p-1)/p n;
///   all-to-all: (p-1) a + b (p-1)/p n;  permute: a + b n;  local slice: 0.
/// with p the group size, n = collective.bytes, a/b of the link the group spans; plus
/// oversubscribedSyncSeconds (each but the local slice).
double collectiveSeconds(const Machine& machine, const Mesh& mesh, const Collective& collective);

/// The latency part (2a, plus the oversubscribed sync) of an all-reduce-sum, which merged
/// all-reduces pay once (MergeCollectives.h): a merged collective costs 2a + 2b (p-1)/p (n1 + n2
/// + ...). 0 for the kinds that are never merged.
double mergeableLatencySeconds(const Machine& machine, const Mesh& mesh,
                               const Collective& collective);

} // namespace meshc::plan
