// meshc's einsum (an EinsumPlan, as generated code calls it) against the best library GEMM on
// this CPU (OpenBLAS's cblas_sgemm and oneDNN's dnnl_sgemm, each looped over the batch) and the
// core's measured peak (an FMA-throughput loop), on the transformer's GEMMs (batch 8, seq 128,
// d_model 256, 4 heads of 64, d_ff 1024, vocab 512) forward and backward. One core: one BLAS
// thread, timed by the calling thread's CPU time (other processes on a shared machine do not
// count), contenders alternated round by round, best sample of N each (load only slows a sample).
// Prints GFLOP/s, einsum / best library (goal >= 0.9) and best library / peak; then batches of
// small matrices (attention at the examples' sizes): the einsum's own loops against oneDNN's
// batched matmul, microseconds a matrix.
// Usage: bench_kernels [--reps N]
#include "meshrt/kernels/Einsum.h"

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace meshrt::kernels;

namespace {

double threadSeconds(const std::function<void()>& fn) {
  timespec start{}, end{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
  fn();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
  return double(end.tv_sec - start.tv_sec) + 1e-9 * double(end.tv_nsec - start.tv_nsec);
}

/// The core's f32 FMA throughput: 12 independent accumulator chains in registers (enough to
/// cover the FMA latency on every pipe), the widest vectors this build targets. GFLOP/s.
__attribute__((noinline)) double fmaPeak() {
#if defined(__AVX512F__)
  using Vec = __m512;
  constexpr int kLanes = 16;
#define MESHC_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define MESHC_SPLAT(x) _mm512_set1_ps(x)
#else
  using Vec = __m256;
  constexpr int kLanes = 8;
#define MESHC_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define MESHC_SPLAT(x) _mm256_set1_ps(x)
#endif
  constexpr long kIterations = 20'000'000;
  Vec a0 = MESHC_SPLAT(0.0f), a1 = MESHC_SPLAT(0.1f), a2 = MESHC_SPLAT(0.2f),
      a3 = MESHC_SPLAT(0.3f), a4 = MESHC_SPLAT(0.4f), a5 = MESHC_SPLAT(0.5f),
      a6 = MESHC_SPLAT(0.6f), a7 = MESHC_SPLAT(0.7f), a8 = MESHC_SPLAT(0.8f),
      a9 = MESHC_SPLAT(0.9f), a10 = MESHC_SPLAT(1.0f), a11 = MESHC_SPLAT(1.1f);
  Vec scale = MESHC_SPLAT(0.999999f), shift = MESHC_SPLAT(1e-7f);
  // Timed inline: inside a capturing lambda the accumulators would live in memory.
  timespec start{}, end{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
  {
    for (long i = 0; i < kIterations; ++i) {
      a0 = MESHC_FMA(a0, scale, shift);
      a1 = MESHC_FMA(a1, scale, shift);
      a2 = MESHC_FMA(a2, scale, shift);
      a3 = MESHC_FMA(a3, scale, shift);
      a4 = MESHC_FMA(a4, scale, shift);
      a5 = MESHC_FMA(a5, scale, shift);
      a6 = MESHC_FMA(a6, scale, shift);
      a7 = MESHC_FMA(a7, scale, shift);
      a8 = MESHC_FMA(a8, scale, shift);
      a9 = MESHC_FMA(a9, scale, shift);
      a10 = MESHC_FMA(a10, scale, shift);
      a11 = MESHC_FMA(a11, scale, shift);
    }
  }
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
  double seconds = double(end.tv_sec - start.tv_sec) + 1e-9 * double(end.tv_nsec - start.tv_nsec);
  Vec total = MESHC_FMA(a0, a1, MESHC_FMA(a2, a3, MESHC_FMA(a4, a5, a6)));
  total = MESHC_FMA(total, a7, MESHC_FMA(a8, a9, MESHC_FMA(a10, a11, total)));
#undef MESHC_FMA
#undef MESHC_SPLAT
  float sink[kLanes];
  std::memcpy(sink, &total, sizeof sink);
  if (std::isnan(sink[0])) std::puts(""); // keeps the chains alive
  return 2.0 * kLanes * 12 * double(kIterations) / seconds * 1e-9;
}

/// Seconds a call of each contender takes, the best of `reps` samples taken round by round:
/// each called once first (page faults, packing buffers, JIT kernels), then a sample repeats a
/// call often enough that the first contender's takes >= `sampleSeconds`.
std::vector<double> bestAlternated(const std::vector<std::function<void()>>& contenders, int reps,
                                   double sampleSeconds) {
  for (const auto& contender : contenders)
    contender();
  int inner = std::max(1, int(sampleSeconds / std::max(threadSeconds(contenders[0]), 1e-7)));
  std::vector<double> best(contenders.size(), 1e30);
  for (int r = 0; r < reps; ++r)
    for (size_t which = 0; which < contenders.size(); ++which)
      best[which] = std::min(best[which], threadSeconds([&] {
                                            for (int i = 0; i < inner; ++i)
                                              contenders[which]();
                                          }) / inner);
  return best;
}

/// A dense (batched) GEMM: out[batch, m, n] = sum_k a[batch, m, k] b[batch, k, n], a stored as
/// [batch, k, m] when transA, b as [batch, n, k] when transB.
struct Case {
  std::string name;
  int batch, m, n, k;
  bool transA, transB;
};

EinsumSpec specOf(const Case& c) {
  // ids: batch=0, m=1, n=2, k=3 (size-1 batch is ignored by the classification).
  std::vector<int> a = c.transA ? std::vector<int>{0, 3, 1} : std::vector<int>{0, 1, 3};
  std::vector<int> b = c.transB ? std::vector<int>{0, 2, 3} : std::vector<int>{0, 3, 2};
  return EinsumSpec{{c.batch, c.m, c.n, c.k}, {{a, {}}, {b, {}}}, {{0, 1, 2}, {}}};
}

std::vector<Case> transformerCases() {
  const int B = 8, S = 128, D = 256, H = 4, E = 64, F = 1024, V = 512, T = B * S;
  return {
      {"proj x[BS,256] w[256,256]", 1, T, D, D, false, false},
      {"ffn_in x[BS,256] w[256,1024]", 1, T, F, D, false, false},
      {"ffn_out h[BS,1024] w[1024,256]", 1, T, D, F, false, false},
      {"scores q[B,H,S,64] k[B,H,S,64]", B * H, S, S, E, false, true},
      {"values p[B,H,S,S] v[B,H,S,64]", B * H, S, E, S, false, false},
      {"unembed x[BS,256] w[256,512]", 1, T, V, D, false, false},
      {"bwd proj dW = x^T dy", 1, D, D, T, true, false},
      {"bwd proj dX = dy w^T", 1, T, D, D, false, true},
      {"bwd ffn_in dW = x^T dh", 1, D, F, T, true, false},
      {"bwd ffn_in dX = dh w^T", 1, T, D, F, false, true},
      {"bwd ffn_out dW = h^T dy", 1, F, D, T, true, false},
      {"bwd ffn_out dH = dy w^T", 1, T, F, D, false, true},
      {"bwd unembed dW = x^T dl", 1, D, V, T, true, false},
      {"bwd unembed dX = dl w^T", 1, T, D, V, false, true},
      {"bwd scores dq = ds k", B * H, S, E, S, false, false},
      {"bwd scores dk = ds^T q", B * H, S, E, S, true, false},
      {"bwd values dp = do v^T", B * H, S, S, E, false, true},
      {"bwd values dv = p^T do", B * H, S, E, S, true, false},
  };
}

std::vector<float> randomBuffer(size_t count, uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> values(count);
  for (float& x : values)
    x = dist(engine);
  return values;
}

/// Batches of small matrices in attention's layout (scores q[s, h, e] k[t, h, e] -> [h, s, t],
/// values p[h, s, t] v[t, h, e] -> [s, h, e]) at the examples' sizes and past the loops' limit:
/// the einsum's own loops (SmallGemm) against the same plan through oneDNN's batched matmul
/// (setSmallGemmLoops(false)), alternated; microseconds per matrix.
void smallBatches(int reps) {
  struct Small {
    std::string name;
    int64_t batch, m, n, k;
    bool scores; // else values
  };
  const std::vector<Small> cases = {
      {"scores 16 x 16 x 8 (examples)", 16, 16, 16, 8, true},
      {"values 16 x 8 x 16 (examples)", 16, 16, 8, 16, false},
      {"xlnet positions 2 x 16 x 8", 64, 2, 16, 8, true},
      {"scores 32 x 32 x 64", 16, 32, 32, 64, true},
      {"values 32 x 64 x 32", 16, 32, 64, 32, false},
      {"scores 48 x 48 x 48", 8, 48, 48, 48, true},
      {"scores 64 x 64 x 64 (library)", 8, 64, 64, 64, true},
  };
  std::printf("\nbatches of small GEMMs, attention's layout: us a matrix (best of %d alternated "
              "samples)\n\n| %-30s | %6s | %-18s | %9s | %9s | %8s |\n|%s|%s|%s|%s|%s|%s|\n",
              reps, "GEMM", "batch", "einsum's path", "einsum", "matmul", "speedup",
              std::string(32, '-').c_str(), std::string(8, '-').c_str(),
              std::string(20, '-').c_str(), std::string(11, '-').c_str(),
              std::string(11, '-').c_str(), std::string(10, '-').c_str());
  for (const Small& c : cases) {
    // ids: h=0, s=1, t=2, e=3 (scores: m=s, n=t, k=e; values: m=s, n=e, k=t).
    EinsumSpec spec = c.scores ? EinsumSpec{{c.batch, c.m, c.n, c.k},
                                            {{{1, 0, 3}, {}}, {{2, 0, 3}, {}}},
                                            {{0, 1, 2}, {}}}
                               : EinsumSpec{{c.batch, c.m, c.k, c.n},
                                            {{{0, 1, 2}, {}}, {{2, 0, 3}, {}}},
                                            {{1, 0, 3}, {}}};
    EinsumPlan ours(spec);
    setSmallGemmLoops(false);
    EinsumPlan library(spec);
    setSmallGemmLoops(true);
    size_t sizeA = size_t(c.batch * c.m * c.k), sizeB = size_t(c.batch * c.k * c.n);
    std::vector<float> a = randomBuffer(sizeA, 3), b = randomBuffer(sizeB, 4);
    std::vector<float> out1(size_t(c.batch * c.m * c.n)), out2(out1.size());
    std::vector<double> best =
        bestAlternated({[&] { ours.run(a.data(), b.data(), out1.data()); },
                        [&] { library.run(a.data(), b.data(), out2.data()); }},
                       reps, 0.005);
    double maxDiff = 0;
    for (size_t i = 0; i < out1.size(); ++i)
      maxDiff = std::max(maxDiff, double(std::fabs(out1[i] - out2[i])));
    double perMatrix = 1e6 / double(c.batch);
    std::printf("| %-30s | %6lld | %-18s | %9.3f | %9.3f | %8.2f |%s\n", c.name.c_str(),
                (long long)c.batch, ours.gemmImplementation().c_str(), best[0] * perMatrix,
                best[1] * perMatrix, best[1] / best[0], maxDiff > 1e-3 ? "  MISMATCH" : "");
  }
}

} // namespace

int main(int argc, char** argv) {
  int reps = 10;
  for (int i = 1; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  setBlasThreads(1);
  omp_set_num_threads(1); // dnnl_sgemm on this thread: one core too
  double peak = fmaPeak();
  std::printf("einsum (EinsumPlan) vs OpenBLAS cblas_sgemm and oneDNN dnnl_sgemm, one core "
              "(thread CPU time, best of %d alternated samples); FMA peak %.1f GFLOP/s\n\n",
              reps, peak);
  std::printf("| %-32s | %-22s | %8s | %8s | %8s | %12s | %11s |\n", "GEMM",
              "einsum's library path", "OpenBLAS", "oneDNN", "einsum", "einsum/best", "best/peak");
  std::printf("|%s|%s|%s|%s|%s|%s|%s|\n", std::string(34, '-').c_str(),
              std::string(24, '-').c_str(), std::string(10, '-').c_str(),
              std::string(10, '-').c_str(), std::string(10, '-').c_str(),
              std::string(14, '-').c_str(), std::string(13, '-').c_str());
  double worst = 1e9;
  for (const Case& c : transformerCases()) {
    EinsumPlan plan(specOf(c));
    size_t sizeA = size_t(c.batch) * c.m * c.k, sizeB = size_t(c.batch) * c.k * c.n;
    size_t sizeC = size_t(c.batch) * c.m * c.n;
    std::vector<float> a = randomBuffer(sizeA, 1), b = randomBuffer(sizeB, 2);
    std::vector<float> ours(sizeC), raw(sizeC);
    int lda = c.transA ? c.m : c.k, ldb = c.transB ? c.k : c.n;
    auto openblas = [&] {
      for (int i = 0; i < c.batch; ++i)
        cblas_sgemm(CblasRowMajor, c.transA ? CblasTrans : CblasNoTrans,
                    c.transB ? CblasTrans : CblasNoTrans, c.m, c.n, c.k, 1.0f,
                    a.data() + size_t(i) * c.m * c.k, lda, b.data() + size_t(i) * c.k * c.n, ldb,
                    0.0f, raw.data() + size_t(i) * c.m * c.n, c.n);
    };
    auto onednn = [&] {
      for (int i = 0; i < c.batch; ++i)
        dnnl_sgemm(c.transA ? 'T' : 'N', c.transB ? 'T' : 'N', c.m, c.n, c.k, 1.0f,
                   a.data() + size_t(i) * c.m * c.k, lda, b.data() + size_t(i) * c.k * c.n, ldb,
                   0.0f, raw.data() + size_t(i) * c.m * c.n, c.n);
    };
    auto einsum = [&] { plan.run(a.data(), b.data(), ours.data()); };
    std::vector<double> best = bestAlternated({openblas, onednn, einsum}, reps, 0.02);
    double maxDiff = 0;
    for (size_t i = 0; i < sizeC; ++i)
      maxDiff = std::max(maxDiff, double(std::fabs(ours[i] - raw[i])));
    double flops = 2.0 * c.batch * c.m * c.n * c.k;
    double gflops[3];
    for (int which = 0; which < 3; ++which)
      gflops[which] = flops / best[which] * 1e-9;
    double library = std::max(gflops[0], gflops[1]);
    double ratio = gflops[2] / library;
    worst = std::min(worst, ratio);
    std::printf("| %-32s | %-22s | %8.1f | %8.1f | %8.1f | %12.2f | %11.2f |%s\n", c.name.c_str(),
                plan.gemmImplementation().c_str(), gflops[0], gflops[1], gflops[2], ratio,
                library / peak, maxDiff > 1e-2 ? "  MISMATCH" : "");
  }
  std::printf("\nworst einsum / best library %.2f (goal >= 0.9)\n", worst);
  smallBatches(reps);
  return 0;
}
