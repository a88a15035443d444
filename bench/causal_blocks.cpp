// Causal attention's GEMMs in lm's shapes per rank on [2, 2] at bench/lm_sharded.py's sizes
// (batch 4, heads 2, seq = mem = 128, d_head 64): the whole einsum through EinsumPlan, each way
// of splitting the lower triangle of blocks into GEMMs (query-row blocks or key-column blocks,
// 16, 32 and 64 positions), and support::CausalEinsum (causal-attention-blocks' split, with its
// fill and its run-time check), whose values are checked against the whole einsum first; then the
// masked softmax between them, over whole rows and over each row's keys (causalMaskedSoftmax).
// One thread; the best of 300 calls each (docs/codegen.md, bench/README.md).
//
//   OMP_NUM_THREADS=1 taskset -c 1 build/bench/bench_causal_blocks
// The softmax calls below pass literal sizes, as the generated code does; GCC 12 propagates them
// into the row kernels' tail loops and warns of iterations that cannot happen there.
#pragma GCC diagnostic ignored "-Waggressive-loop-optimizations"
#include "meshc/GeneratedSupport.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

namespace {

using meshrt::kernels::EinsumPlan;
using meshrt::kernels::EinsumSpec;

template <class F> double bestMicroseconds(F&& f) {
  double best = 1e30;
  for (int i = 0; i < 300; ++i) {
    auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(
        best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                  .count());
  }
  return best;
}

constexpr int64_t kBatch = 4, kHeads = 2, kSize = 128, kHead = 64;
// q, k, v as [batch, position, heads, d_head]; scores and weights as [batch, heads, seq, mem].
constexpr int64_t kPositionStride = kHeads * kHead, kBatchStride = kSize * kPositionStride;

/// scores[b,h,s,m] = 0.125 q[b,s,h,e] . k[b,m,h,e] over `rows` x `cols` (dims b h s e m).
EinsumPlan scoresPlan(int64_t rows, int64_t cols) {
  return EinsumPlan(EinsumSpec{{kBatch, kHeads, rows, kHead, cols},
                               {{{0, 2, 1, 3}, {kBatchStride, kPositionStride, kHead, 1}},
                                {{0, 4, 1, 3}, {kBatchStride, kPositionStride, kHead, 1}}},
                               {{0, 1, 2, 4}, {kHeads * kSize * kSize, kSize * kSize, kSize, 1}}});
}
/// context[b,s,h,e] = weights[b,h,s,m] . v[b,m,h,e] over `rows` x `keys` (dims b h s m e).
EinsumPlan contextPlan(int64_t rows, int64_t keys) {
  return EinsumPlan(EinsumSpec{{kBatch, kHeads, rows, keys, kHead},
                               {{{0, 1, 2, 3}, {kHeads * kSize * kSize, kSize * kSize, kSize, 1}},
                                {{0, 3, 1, 4}, {kBatchStride, kPositionStride, kHead, 1}}},
                               {{0, 2, 1, 4}, {kBatchStride, kPositionStride, kHead, 1}}});
}

} // namespace

int main() {
  meshrt::kernels::setBlasThreads(1);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t(kBatch * kBatchStride)), k(q.size()), v(q.size()),
      weights(size_t(kBatch * kHeads * kSize * kSize)), scores(weights.size()),
      blocked(weights.size()), context(q.size()), blockedContext(q.size());
  for (auto* x : {&q, &k, &v})
    for (float& e : *x)
      e = normal(rng);
  for (size_t i = 0; i < weights.size(); ++i) // zero above the diagonal, as a causal softmax's
    weights[i] = int64_t(i) % kSize > int64_t(i) / kSize % kSize ? 0.0f : normal(rng);

  EinsumPlan wholeScores = scoresPlan(kSize, kSize), wholeContext = contextPlan(kSize, kSize);
  EinsumSpec scoresSpec = wholeScores.spec(), contextSpec = wholeContext.spec();
  for (auto* spec : {&scoresSpec, &contextSpec}) { // dense: what the printer gives
    for (auto& operand : spec->operands)
      operand.strides.clear();
    spec->out.strides.clear();
  }
  using Blocks = meshc::gen::CausalEinsum::Blocks;
  using Check = meshc::gen::CausalEinsum::Check;
  meshc::gen::CausalEinsum causalScores(scoresSpec, 2, 4, 32, Blocks::Keys, -1, Check::None, -1e9f),
      causalContext(contextSpec, 2, 3, 32, Blocks::Queries, 0, Check::Every);

  // The values first: the blocks on and below the diagonal as the whole einsum's.
  wholeScores.run(q.data(), k.data(), scores.data(), 0.125f);
  causalScores.run(q.data(), k.data(), blocked.data(), 0.125f);
  wholeContext.run(weights.data(), v.data(), context.data());
  causalContext.run(weights.data(), v.data(), blockedContext.data(), 1.0f);
  double error = 0;
  for (size_t i = 0; i < scores.size(); ++i)
    if (int64_t(i) % kSize / 32 <= int64_t(i) / kSize % kSize / 32)
      error = std::max(error, double(std::fabs(scores[i] - blocked[i])));
  for (size_t i = 0; i < context.size(); ++i)
    error = std::max(error, double(std::fabs(context[i] - blockedContext[i])));
  std::printf("CausalEinsum against the whole einsum: largest difference %g\n", error);

  std::printf("%-44s %10s %10s\n", "GEMMs (best of 300, one thread)", "scores us", "context us");
  std::printf(
      "%-44s %10.1f %10.1f\n", "whole einsum",
      bestMicroseconds([&] { wholeScores.run(q.data(), k.data(), scores.data(), 0.125f); }),
      bestMicroseconds([&] { wholeContext.run(weights.data(), v.data(), context.data()); }));
  for (int64_t block : {16, 32, 64}) {
    int64_t blocks = kSize / block;
    std::vector<EinsumPlan> rowScores, colScores, rowContext, colContext;
    for (int64_t j = 0; j < blocks; ++j) {
      rowScores.push_back(scoresPlan(block, (j + 1) * block));
      colScores.push_back(scoresPlan(kSize - j * block, block));
      rowContext.push_back(contextPlan(block, (j + 1) * block));
      colContext.push_back(contextPlan(kSize - j * block, block));
    }
    // Query block j against keys < (j + 1) block; key block j against queries >= j block (the
    // context accumulating: beta 1 after the first).
    double rs = bestMicroseconds([&] {
      for (int64_t j = 0; j < blocks; ++j)
        rowScores[size_t(j)].run(q.data() + j * block * kPositionStride, k.data(),
                                 scores.data() + j * block * kSize, 0.125f);
    });
    double cs = bestMicroseconds([&] {
      for (int64_t j = 0; j < blocks; ++j)
        colScores[size_t(j)].run(q.data() + j * block * kPositionStride,
                                 k.data() + j * block * kPositionStride,
                                 scores.data() + j * block * (kSize + 1), 0.125f);
    });
    double rc = bestMicroseconds([&] {
      for (int64_t j = 0; j < blocks; ++j)
        rowContext[size_t(j)].run(weights.data() + j * block * kSize, v.data(),
                                  context.data() + j * block * kPositionStride);
    });
    double cc = bestMicroseconds([&] {
      for (int64_t j = 0; j < blocks; ++j)
        colContext[size_t(j)].run(
            weights.data() + j * block * (kSize + 1), v.data() + j * block * kPositionStride,
            context.data() + j * block * kPositionStride, 1.0f, j ? 1.0f : 0.0f);
    });
    std::printf("blocks of %-3ld query rows against keys below   %10.1f %10.1f\n", long(block), rs,
                rc);
    std::printf("blocks of %-3ld keys against query rows from    %10.1f %10.1f\n", long(block), cs,
                cc);
  }
  std::printf(
      "%-44s %10.1f %10.1f\n", "CausalEinsum (32: keys / query rows, fill, check)",
      bestMicroseconds([&] { causalScores.run(q.data(), k.data(), blocked.data(), 0.125f); }),
      bestMicroseconds(
          [&] { causalContext.run(weights.data(), v.data(), blockedContext.data(), 1.0f); }));
  meshc::gen::CausalEinsum unfilledScores(scoresSpec, 2, 4, 32, Blocks::Keys, -1, Check::None,
                                          -1e9f, /*fillAbove=*/false),
      uniformContext(contextSpec, 2, 3, 32, Blocks::Queries, 0, Check::Tails),
      knownContext(contextSpec, 2, 3, 32, Blocks::Queries, 0, Check::None);
  std::printf("%-44s %10.1f\n", "CausalEinsum scores, above unwritten", bestMicroseconds([&] {
                unfilledScores.run(q.data(), k.data(), blocked.data(), 0.125f);
              }));
  std::printf("%-44s %10s %10.1f\n", "CausalEinsum context, one check per row", "",
              bestMicroseconds([&] {
                uniformContext.run(weights.data(), v.data(), blockedContext.data(), 1.0f);
              }));
  std::printf("%-44s %10s %10.1f\n", "CausalEinsum context, known zeros (d_q)", "",
              bestMicroseconds([&] {
                knownContext.run(weights.data(), v.data(), blockedContext.data(), 1.0f);
              }));

  // Backward's key gradients: d_v[b,m,h,e] = weights[b,h,s,m] . d_context[b,s,h,e] (the query
  // positions contracted; d_k = d_scores^T . q has the same shape), whole and as key blocks
  // against the query rows from theirs on, with one check per row (d_v) or none (d_k).
  EinsumSpec keySpec{{kBatch, kHeads, kSize, kSize, kHead},
                     {{{0, 1, 2, 3}, {}}, {{0, 2, 1, 4}, {}}},
                     {{0, 3, 1, 4}, {}}};
  EinsumPlan wholeKeys(keySpec);
  meshc::gen::CausalEinsum tailsKeys(keySpec, 2, 3, 32, Blocks::Keys, 0, Check::Tails),
      knownKeys(keySpec, 2, 3, 32, Blocks::Keys, 0, Check::None);
  std::vector<float> keyGradient(q.size()), blockedKeyGradient(q.size());
  wholeKeys.run(weights.data(), v.data(), keyGradient.data());
  tailsKeys.run(weights.data(), v.data(), blockedKeyGradient.data(), 1.0f);
  double keyError = 0;
  for (size_t i = 0; i < keyGradient.size(); ++i)
    keyError = std::max(keyError, double(std::fabs(keyGradient[i] - blockedKeyGradient[i])));
  std::printf("%-44s %10s %10.1f\n", "key gradient, whole einsum", "", bestMicroseconds([&] {
                wholeKeys.run(weights.data(), v.data(), keyGradient.data());
              }));
  std::printf("%-44s %10s %10.1f\n", "CausalEinsum key gradient, one check per row", "",
              bestMicroseconds([&] {
                tailsKeys.run(weights.data(), v.data(), blockedKeyGradient.data(), 1.0f);
              }));
  std::printf("%-44s %10s %10.1f\n", "CausalEinsum key gradient, known zeros (d_k)", "",
              bestMicroseconds([&] {
                knownKeys.run(weights.data(), v.data(), blockedKeyGradient.data(), 1.0f);
              }));
  std::printf("key gradient blocks against the whole einsum: largest difference %g\n", keyError);

  // The softmax between them: where(mask, scores, -1e9) along the keys, the causal mask
  // [batch, seq, mem] broadcast over the heads (lm's `allowed > 0.5`); maskedSoftmax over whole
  // rows against causalMaskedSoftmax over each row's prefix (the same values to the bit).
  std::vector<float> mask(size_t(kBatch * kSize * kSize)), probs(weights.size()),
      causalProbs(weights.size());
  for (size_t i = 0; i < mask.size(); ++i)
    mask[i] = int64_t(i) % kSize <= int64_t(i) / kSize % kSize ? 1.0f : 0.0f;
  causalScores.run(q.data(), k.data(), blocked.data(), 0.125f);
  const meshc::gen::Shape outer = {kBatch, kHeads, kSize}, maskOuter = {kSize * kSize, 0, kSize};
  meshc::gen::maskedSoftmax(probs.data(), blocked.data(), mask.data(), outer, maskOuter, kSize, 1,
                            -1e9f);
  meshc::gen::causalMaskedSoftmax(causalProbs.data(), blocked.data(), mask.data(), outer, maskOuter,
                                  kSize, 1, -1e9f, 2);
  std::printf("causalMaskedSoftmax against maskedSoftmax: %s\n",
              std::memcmp(probs.data(), causalProbs.data(), probs.size() * sizeof(float)) == 0
                  ? "the same bits"
                  : "DIFFERENT");
  std::printf("%-44s %10s\n", "softmax rows (best of 300, one thread)", "us");
  std::printf("%-44s %10.1f\n", "maskedSoftmax (whole rows)", bestMicroseconds([&] {
                meshc::gen::maskedSoftmax(probs.data(), blocked.data(), mask.data(), outer,
                                          maskOuter, kSize, 1, -1e9f);
              }));
  std::printf("%-44s %10.1f\n", "causalMaskedSoftmax (each row's prefix)", bestMicroseconds([&] {
                meshc::gen::causalMaskedSoftmax(causalProbs.data(), blocked.data(), mask.data(),
                                                outer, maskOuter, kSize, 1, -1e9f, 2);
              }));
  return 0;
}
