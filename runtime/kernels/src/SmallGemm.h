// Batches of small GEMMs in f32 loops (EinsumPlan's "small" path): where a library call per
// matrix costs more than the matrix's arithmetic (attention's batches of 16 x 16 x 8 matrices:
// 0.39 us a matrix through oneDNN's batched matmul, 11x its FLOPs at this core's peak).
#pragma once

#include "meshrt/kernels/Einsum.h"

#include <cstdint>

namespace meshrt::kernels::detail {

/// Whether a batch of `batches` GEMMs of m x n x k, b walked as `mb`, runs faster in
/// smallGemmBatches than through the library: more than one matrix, none of m, n, k of 1
/// (EinsumPlan's degenerate loops take those), at most 32 x 32 x 64 multiply-adds a matrix, and
/// where b must be copied, at least one row of a for 16 of b's rows (bench/README.md, "Kernels").
bool smallGemmBatched(int64_t batches, const EinsumPlan::Matrix& mb, int64_t m, int64_t n,
                      int64_t k);

/// c[batch] = alpha * a[batch] . b[batch] + beta * c[batch] (beta = 0: c not read), each matrix
/// walked by its rowStride and colStride from its batch's offsets (a, b, c per batch, three a
/// batch): blocks of rows times 16 columns accumulated in registers, b copied first into a
/// zero-padded panel of whole tiles unless it is dense in whole tiles already.
void smallGemmBatches(const EinsumPlan::Matrix& ma, const EinsumPlan::Matrix& mb,
                      const EinsumPlan::Matrix& mc, const int64_t* batchOffsets, int64_t batches,
                      const float* a, const float* b, float* c, float alpha, float beta);

} // namespace meshrt::kernels::detail
