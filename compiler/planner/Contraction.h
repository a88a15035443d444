// How an einsum of two or more operands runs: as pairwise contractions, each one GEMM or batched
// GEMM, in the order of fewest FLOPs (opt_einsum's "optimal" order; greedy past kOptimalOperands),
// then a broadcast copy over the output dims no operand has. One decision, read by code
// generation (codegen/ContractPairwise.cpp writes the GEMMs) and by the cost model (which prices
// those GEMMs), so that the two cannot disagree. Dims are integer ids with their sizes (local
// sizes where the caller plans one rank's work); size-1 dims take no part.
#pragma once

#include "ir/IR.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace meshc::plan {

/// One pairwise contraction. Terms 0..n-1 are the einsum's operands; step s writes term n + s.
struct ContractionStep {
  size_t left = 0, right = 0; // the terms it contracts (left is the GEMM's first operand)
  std::vector<int64_t> dims;  // the result's dims in storage order (last step: the output's)
  double flops = 0;           // 2 x the product of the sizes of every dim of both terms
  double smallest = 1;        // the GEMM's smallest of m, n and k per batch element
  double batches = 1;         // its batch: the product of the dims of both terms and the result
  int64_t elements = 1;       // the result's elements
  int64_t leftElements = 1, rightElements = 1; // the terms'
};

struct Contraction {
  std::vector<ContractionStep> steps; // n - 1 of them; the last writes the output's dims
  std::vector<int64_t> broadcast;     // output dims of size > 1 that no operand has
  double flops = 0;                   // of every step
  /// Whether code generation rewrites the einsum (the GEMM library runs it as written
  /// otherwise: two operands and no broadcast dim).
  bool rewritten() const { return steps.size() > 1 || !broadcast.empty(); }
};

/// Past this many operands the order is greedy (the cheapest pair first), not searched.
constexpr size_t kOptimalOperands = 6;

/// The contraction of `operands` (each a list of dim ids) into `output`, with `sizes[id]` the
/// size of dim id. At least two operands. The last step's dims are `output` less the broadcast
/// dims; an intermediate's are the dims both terms have, then the left's own, then the right's,
/// each in its term's order (a GEMM's batch, m and n: written without a copy).
Contraction planContraction(const std::vector<std::vector<int64_t>>& operands,
                            const std::vector<int64_t>& output, const std::vector<int64_t>& sizes);

/// The same for einsum `op` of `fn` (two or more operands), with `size(name)` the size of each dim
/// (the local size where one rank's work is planned).
Contraction planContraction(const ir::Function& fn, const ir::Op& op,
                            const std::function<int64_t(const std::string&)>& size);

/// What an einsum of a one-hot tensor X (dims `oneHot`, its one-hot dim `dim`) with another
/// operand T (dims `other`) into `output` is, for code generation's gather-one-hot-products and
/// the cost model alike: `Gather` when `dim` is summed (T has it; every other dim of X and T is
/// an output dim): T's rows at the ids; `ScatterAdd` when `dim` is an output dim T lacks (every
/// other dim of X is an output dim or one T shares and sums, every dim of T an output dim or
/// one X has): T added into the output's rows at the ids; else `None`, a GEMM.
enum class OneHotProduct { None, Gather, ScatterAdd };
OneHotProduct oneHotProduct(const std::vector<int64_t>& oneHot, int64_t dim,
                            const std::vector<int64_t>& other, const std::vector<int64_t>& output);
/// The same for einsum `op` of `fn`: a two-operand f32 einsum of distinct values, one of them
/// (`*oneHotOperand`, 0 or 1) a one_hot op's result; `None` for any other op.
OneHotProduct oneHotProduct(const ir::Function& fn, const ir::Op& op, size_t* oneHotOperand);

} // namespace meshc::plan
