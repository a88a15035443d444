// The cost model: roofline for compute, alpha-beta per mesh axis for collectives (the formulas
// of the brief), bytes per device for memory. All times in seconds. The refinements measured by
// `meshc calibrate` (a cache level, a GEMM's fixed cost, the synchronization of oversubscribed
// thread ranks) are 0 in a description without them, which then costs as before.
#pragma once

#include "planner/Contraction.h"
#include "planner/Machine.h"
#include "planner/SpmdIR.h"

namespace meshc::plan {

/// The bandwidth an op touching `bytes` streams at: the cache's when the machine has one and
/// the bytes fit in it, else the memory's.
double streamBandwidth(const Machine& machine, double bytes);

/// Roofline: max(flops / peak(dtype), bytes / streamBandwidth(bytes)).
double computeSeconds(const Machine& machine, double flops, double bytes, ir::DType dtype);

/// A GEMM (an einsum of two operands, which codegen calls the GEMM library for): the roofline
/// plus the machine's fixed cost per call, which small GEMMs do not amortize. With the machine's
/// gemm_shape_dim and the GEMM's smallest of m, n and k per batch element (`smallestDim`, 0:
/// unknown), its FLOPs run at peak / (1 + gemmShapeDim / smallestDim): small GEMMs reach less of
/// the peak than the large ones that measured it. A bf16/f16 GEMM on a CPU machine without
/// peak_flops_bf16 is priced as the C++ target runs it, in double (2x the FLOP time, plus a
/// pass converting the operands and the result). A batch of `batches` matrices, none of m, n
/// and k of 1 (`smallestDim` > 1), of at most machine.smallGemmTerms multiply-adds each runs in
/// meshrt's small GEMM loops: no call latency, machine.gemmBatchSeconds for every matrix. A
/// batch of larger ones pays it for each matrix after the first: the library sets each one up
/// (batches of outer products, GEMVs and dot products run as meshrt's other loops, Einsum.cpp
/// degenerateBatched, and pay nothing more).
double gemmSeconds(const Machine& machine, double flops, double bytes, ir::DType dtype,
                   double smallestDim = 0, double batches = 1);

/// An einsum that code generation contracts pairwise (Contraction.h: three or more operands, or
/// an output dim no operand has): each step a GEMM (gemmSeconds, its terms' and result's bytes),
/// then, with broadcast dims, the copy of the product over the output's `outElements` (a loop
/// nest reading the product and writing the output).
double contractionSeconds(const Machine& machine, const Contraction& contraction,
                          double outElements, ir::DType dtype);

/// Whether `machine` describes its loops and kernels (vector_flops given): ops are then priced
/// as the generated code runs them (loopShareSeconds, rowKernelSeconds), else by the roofline.
bool modelsLoops(const Machine& machine);

/// One op's share of a fused elementwise loop nest (docs/planner.md, "Loops and kernels"): its
/// FLOPs at the vector rate, each transcendental element (exp, log, tanh, ...) counting
/// machine.transcendentalFlops simple ones, against the bytes it moves to or from memory (its
/// operands that are not computed in the same nest, its result when stored), plus the nest's
/// fixed cost (loop_latency_seconds) when `closesNest` (the op whose loop the nest is):
///   max((flops + transcendental x transcendentalFlops) / vectorFlops,
///       bytes / streamBandwidth(bytes)) + [closesNest] loopLatencySeconds.
double loopShareSeconds(const Machine& machine, double flops, double transcendentalElements,
                        double bytes, bool closesNest);

/// The row-wise kernels of the runtime (calls, never fused).
enum class RowKernel { Softmax, LayerNorm, Reduce };

/// One call of a row-wise kernel over `elements` operand elements: its measured time per
/// element (softmax_element_seconds, ...), at least the bytes at streamBandwidth, plus the
/// call's fixed cost: max(elements x perElement [+ rows x softmax_row_seconds for softmax],
/// bytes / streamBandwidth(bytes)) + loopLatencySeconds.
double rowKernelSeconds(const Machine& machine, RowKernel kernel, double elements, double bytes,
                        double rows = 0);

/// Any other kernel call (one_hot, gather, a copy, a random fill, ...): the roofline of its
/// FLOPs at the vector rate and its bytes, plus the call's fixed cost.
double kernelCallSeconds(const Machine& machine, double flops, double bytes);

/// What run() pays to return one output of `bytes` (its local shard): machine.outputSeconds (a
/// new tensor; the previous one freed) plus the shard read and written at streamBandwidth; 0
/// where the machine does not give output_seconds.
double outputSeconds(const Machine& machine, double bytes);

/// How many ranks take turns on one core or device. On a CPU machine (cores > 0): the most
/// ranks one core holds when meshrt spreads them over the cores in consecutive blocks,
/// ceil(mesh ranks / cores); otherwise (GPUs, one rank per device) max(1, mesh ranks / machine
/// devices). Compute times are multiplied by it (the ranks sharing a core serialise their work).
double oversubscription(const Machine& machine, const Mesh& mesh);

/// What each collective over `axes` of an oversubscribed mesh pays on top of alpha-beta: 0 when
/// oversubscription(machine, mesh) <= 1; on a CPU machine (cores > 0) whose every group of the
/// collective lies on one core (meshrt's consecutive blocks of ranks per core),
/// shared_core_sync_seconds: the ranks hand the core to each other and none idles; otherwise
/// oversubscribed_sync_seconds, what a collective costs when a peer on another core must be
/// woken before the group can pass ("Fidelity, sixth pass"). Either grows by
/// oversubscribed_sync_rank_seconds per rank a core holds beyond 2, (k - 2) x that: at each
/// barrier every rank of a core must run once more ("Fidelity, tenth pass"; 0 in descriptions
/// without the field, whose sync is the same at any ranks per core).
double oversubscribedSyncSeconds(const Machine& machine, const Mesh& mesh, const AxisList& axes);

/// Alpha-beta time of one collective over its axes on `machine`:
///   allgather, reduce-scatter: a + b (p-1)/p n;  allreduce: 2a + 2b (p-1)/p n;
///   all-to-all: (p-1) a + b (p-1)/p n;  permute: a + b n;  local slice: 0.
/// with p the group size, n = collective.bytes, a/b of the link the group spans; plus
/// oversubscribedSyncSeconds (each but the local slice). On a CPU machine (cores > 0) b is
/// multiplied by oversubscription(machine, mesh): the ranks' threads copy and add the bytes.
double collectiveSeconds(const Machine& machine, const Mesh& mesh, const Collective& collective);

/// The latency part (2a, plus the oversubscribed sync) of an all-reduce-sum, which merged
/// all-reduces pay once (MergeCollectives.h): a merged collective costs 2a + 2b (p-1)/p (n1 + n2
/// + ...). 0 for the kinds that are never merged.
double mergeableLatencySeconds(const Machine& machine, const Mesh& mesh,
                               const Collective& collective);

} // namespace meshc::plan
