// Pass causal-attention-blocks: causal attention's GEMMs over the lower triangle of blocks,
// and its softmax over the keys each row sees. A maskedSoftmax whose mask is provably zero
// wherever the key position exceeds the query position (the causal mask: a comparison of two
// iotas, cast, multiplied by finite values or compared with a non-negative threshold, through
// loops and persistent buffers) becomes a causalMaskedSoftmax (row q reads its scores only up to
// key q, rounded up to 16, and writes zeros past them when that is exact: the same values). If
// it reads scores that a GEMM writes for it alone, that GEMM computes each block of query rows
// only against the key blocks up to its own (Gemm::Causal::Scores, the entries above left
// unwritten: the softmax never reads them). A GEMM that contracts the key positions of that
// softmax's result with another operand (probs . v) or, in backward, its query positions
// (probs^T . d_context) is marked Gemm::Causal::Context or KeyGradient: a row block skips the
// keys past it, a key block the queries before it, where the weights above the diagonal are all
// zero (checked at run time: a wholly masked row's weights are uniform). A buffer a loop stores
// as where(causal mask, x, 0) (times finite values: backward's d_scores) is exactly zero above
// the diagonal: the GEMMs contracting one of its positions (d_scores . k, d_scores^T . q) are
// marked the same way with nothing to check. Only for f32 GEMMs of two operands with beta 0 and
// no epilogue, the query and key extents equal and a multiple of the block (32) at least twice.
#pragma once

#include "codegen/KernelIR.h"

namespace meshc::kir {

/// The block of query and key positions the causal GEMMs are taken in.
inline constexpr int64_t kCausalBlock = 32;

void causalAttentionBlocks(KernelFunction& function);

} // namespace meshc::kir
