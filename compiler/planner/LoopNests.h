// The loop nests codegen's fuse-loops pass (codegen/FuseLoops.cpp) will form, as the planner
// sees them in the IR: the cost model charges a fused nest's memory traffic and its fixed cost
// once, not per op (docs/planner.md, "Loops and kernels"). Layout-independent, so computed once
// per function; an approximation of the pass, which works on the SPMD kernel IR: a collective
// the layout puts between two ops still separates their loops there.
#pragma once

#include "ir/IR.h"

#include <cstdint>
#include <vector>

namespace meshc::plan {

/// How one op takes part in the loop nests.
struct LoopRole {
  bool loop = false;       // lowered to an elementwise loop nest (codegen's Loop)
  bool fused = false;      // computed inside a later op's nest
  bool stored = true;      // its result is written to memory (fused: still read elsewhere)
  uint32_t inRegister = 0; // bit k: operand k is computed in this op's nest, not read
  bool closesNest() const { return loop && !fused; } // the nest's own loop: it pays the nest
  /// A small integer that tells roles apart (the planner's memo key).
  uint32_t code() const {
    return (loop ? 1u : 0u) | (fused ? 2u : 0u) | (stored ? 4u : 0u) | (inRegister << 3);
  }
};

/// Whether codegen lowers `op` of `fn` to an elementwise loop nest (dropout only in train blocks:
/// elsewhere it is the identity).
bool isLoopOp(const ir::Function& fn, const ir::Op& op);

/// exp, log, tanh, sigmoid, gelu, sin, cos, pow: a libm-like call per element, not a few vector
/// instructions.
bool isTranscendental(ir::OpKind kind);

/// The vector instructions a fused loop spends rounding one element of `dtype` after computing
/// it in f32 (the C++ target's support::roundBF16: 8; roundF16: 14; none for f32 and i32).
double roundingFlops(ir::DType dtype);

/// Every op's role, by fuse-loops' rule: a loop nest fuses into the loop nest of its first
/// reader when that reader is a loop over the same dims (the producer's result stays stored when
/// something else reads it too), or over more dims when the producer is cheap (no transcendental,
/// no dropout) and read by nothing else (recomputed per point). Fusion is transitive: a nest is
/// the chain of such producers ending at an op that closes it.
std::vector<LoopRole> loopRoles(const ir::Function& fn);
/// The same with `readers`, valueReaders(fn), which the caller has already (the evaluator).
std::vector<LoopRole> loopRoles(const ir::Function& fn,
                                const std::vector<std::vector<uint32_t>>& readers);

/// Per value of `fn`, the ops reading it, in op order, each once.
std::vector<std::vector<uint32_t>> valueReaders(const ir::Function& fn);

} // namespace meshc::plan
