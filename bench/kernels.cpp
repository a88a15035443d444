// Generated-style einsum (an EinsumPlan over named dims, as generated code calls it) against
// raw cblas_sgemm on the same shapes, measured side by side in one run: interleaved samples of
// >= 20 ms each, best of N, timed by the calling thread's CPU time with one BLAS thread (so
// that other processes on a shared machine do not skew the ratios) and by wall time with more.
// The ratio is raw time / kernel time: 1.0 means the kernel costs nothing over the raw call;
// the goal is >= 0.9. Usage: bench_kernels [--threads N] [--reps N] (default 1 BLAS thread:
// ranks run as threads, one core each).
#include "meshrt/kernels/Einsum.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace meshrt::kernels;

namespace {

struct Case {
  std::string name;
  EinsumSpec spec;
  /// The raw BLAS call(s) computing the same result from the same (or pre-packed) buffers.
  std::function<void(const float*, const float*, float*)> raw;
  double flops;
};

std::vector<float> randomBuffer(int64_t count, uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& x : values)
    x = dist(engine);
  return values;
}

int64_t countOf(const EinsumSpec& spec, const EinsumOperand& operand) {
  int64_t count = 1;
  for (int id : operand.dims)
    count *= spec.sizes[size_t(id)];
  return count;
}

/// With one BLAS thread all work happens on the calling thread, so its CPU time measures the
/// work itself, unaffected by other processes preempting it on a shared machine; with more,
/// wall time.
bool useThreadTime = true;

double seconds(const std::function<void()>& fn) {
  if (useThreadTime) {
    timespec start{}, end{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    fn();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
    return double(end.tv_sec - start.tv_sec) + 1e-9 * double(end.tv_nsec - start.tv_nsec);
  }
  auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

EinsumSpec makeSpec(std::vector<int64_t> sizes, std::vector<int> a, std::vector<int> b,
                    std::vector<int> out) {
  return EinsumSpec{
      std::move(sizes), {{std::move(a), {}}, {std::move(b), {}}}, {std::move(out), {}}};
}

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, const float* a, int lda,
          const float* b, int ldb, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}

std::vector<Case> cases() {
  std::vector<Case> list;
  const auto N = CblasNoTrans, T = CblasTrans;
  {
    // ffn_in: x[b=8, s=64, d=512] w[d, f=2048] -> h[b, s, f]
    int M = 512, K = 512, F = 2048;
    list.push_back(
        {"x[b,s,d] w[d,f] -> [b,s,f]", makeSpec({8, 64, 512, 2048}, {0, 1, 2}, {2, 3}, {0, 1, 3}),
         [=](const float* a, const float* b, float* c) { gemm(N, N, M, F, K, a, K, b, F, c, F); },
         2.0 * M * K * F});
  }
  {
    // ffn_out: h[b, s, f=2048] w[f, d=512] -> y[b, s, d]
    int M = 512, K = 2048, D = 512;
    list.push_back(
        {"h[b,s,f] w[f,d] -> [b,s,d]", makeSpec({8, 64, 2048, 512}, {0, 1, 2}, {2, 3}, {0, 1, 3}),
         [=](const float* a, const float* b, float* c) { gemm(N, N, M, D, K, a, K, b, D, c, D); },
         2.0 * M * K * D});
  }
  {
    // weight gradient: x[b, s, d] dy[b, s, f] -> dw[d, f] (a transposed)
    int S = 512, D = 512, F = 1024;
    list.push_back(
        {"x[b,s,d] dy[b,s,f] -> [d,f]", makeSpec({8, 64, 512, 1024}, {0, 1, 2}, {0, 1, 3}, {2, 3}),
         [=](const float* a, const float* b, float* c) { gemm(T, N, D, F, S, a, D, b, F, c, F); },
         2.0 * S * D * F});
  }
  {
    // input gradient: dy[b, s, f] w[d, f] -> dx[b, s, d] (b transposed)
    int M = 512, F = 1024, D = 512;
    list.push_back(
        {"dy[b,s,f] w[d,f] -> [b,s,d]", makeSpec({8, 64, 1024, 512}, {0, 1, 2}, {3, 2}, {0, 1, 3}),
         [=](const float* a, const float* b, float* c) { gemm(N, T, M, D, F, a, F, b, F, c, D); },
         2.0 * M * F * D});
  }
  {
    // attention scores: q[b=4, s=128, h=8, e=64] k[b, t=128, h, e] -> [b, h, s, t]
    int B = 4, S = 128, H = 8, E = 64, Tt = 128;
    list.push_back({"q[b,s,h,e] k[b,t,h,e] -> [b,h,s,t]",
                    makeSpec({4, 128, 8, 64, 128}, {0, 1, 2, 3}, {0, 4, 2, 3}, {0, 2, 1, 4}),
                    [=](const float* a, const float* b, float* c) {
                      for (int bi = 0; bi < B; ++bi)
                        for (int hi = 0; hi < H; ++hi)
                          gemm(N, T, S, Tt, E, a + (bi * S * H + hi) * E, H * E,
                               b + (bi * Tt * H + hi) * E, H * E, c + (bi * H + hi) * S * Tt, Tt);
                    },
                    2.0 * B * H * S * Tt * E});
  }
  {
    // attention values: p[b, h, s, t] v[b, t, h, e] -> [b, s, h, e]
    int B = 4, S = 128, H = 8, E = 64, Tt = 128;
    list.push_back({"p[b,h,s,t] v[b,t,h,e] -> [b,s,h,e]",
                    makeSpec({4, 8, 128, 128, 64}, {0, 1, 2, 3}, {0, 3, 1, 4}, {0, 2, 1, 4}),
                    [=](const float* a, const float* b, float* c) {
                      for (int bi = 0; bi < B; ++bi)
                        for (int hi = 0; hi < H; ++hi)
                          gemm(N, N, S, E, Tt, a + (bi * H + hi) * S * Tt, Tt,
                               b + (bi * Tt * H + hi) * E, H * E, c + (bi * S * H + hi) * E, H * E);
                    },
                    2.0 * B * H * S * Tt * E});
  }
  {
    // column-major output: x[s, d] w[d, f] -> y[f, s] (computed as y = w^T x^T)
    int S = 512, D = 512, F = 512;
    list.push_back(
        {"x[s,d] w[d,f] -> [f,s]", makeSpec({512, 512, 512}, {0, 1}, {1, 2}, {2, 0}),
         [=](const float* a, const float* b, float* c) { gemm(T, T, F, S, D, b, F, a, D, c, S); },
         2.0 * S * D * F});
  }
  {
    // interleaved output (packed then scattered): x[b=8, s=64, d] w[d, f] -> [b, f, s]
    int Bb = 8, S = 64, D = 512, F = 512;
    list.push_back({"x[b,s,d] w[d,f] -> [b,f,s] (packed out)",
                    makeSpec({8, 64, 512, 512}, {0, 1, 2}, {2, 3}, {0, 3, 1}),
                    [=](const float* a, const float* b, float* c) {
                      // Raw: the best BLAS can do is a batched w^T x_b^T straight into place.
                      for (int bi = 0; bi < Bb; ++bi)
                        gemm(T, T, F, S, D, b, F, a + bi * S * D, D, c + bi * F * S, S);
                    },
                    2.0 * Bb * S * D * F});
  }
  {
    // Batch innermost in both operands: a[m, k, b] b[k, n, b] -> [b, m, n]. No GEMM walks them,
    // so ours packs both operands on every call; raw runs on copies packed once, untimed (what a
    // hand-written call could do only if the data were laid out for it).
    int Bb = 8, M = 128, K = 256, Nn = 128;
    auto packed = std::make_shared<std::vector<float>>();
    list.push_back({"a[m,k,b] b[k,n,b] -> [b,m,n] (packs both)",
                    makeSpec({8, 128, 256, 128}, {1, 2, 0}, {2, 3, 0}, {0, 1, 3}),
                    [=](const float* a, const float* b, float* c) {
                      if (packed->empty()) {
                        packed->resize(size_t(Bb) * (M * K + K * Nn));
                        float* pa = packed->data();
                        float* pb = pa + Bb * M * K;
                        for (int bi = 0; bi < Bb; ++bi)
                          for (int i = 0; i < M * K; ++i)
                            pa[bi * M * K + i] = a[i * Bb + bi];
                        for (int bi = 0; bi < Bb; ++bi)
                          for (int i = 0; i < K * Nn; ++i)
                            pb[bi * K * Nn + i] = b[i * Bb + bi];
                      }
                      const float* pa = packed->data();
                      const float* pb = pa + Bb * M * K;
                      for (int bi = 0; bi < Bb; ++bi)
                        gemm(N, N, M, Nn, K, pa + bi * M * K, K, pb + bi * K * Nn, Nn,
                             c + bi * M * Nn, Nn);
                    },
                    2.0 * Bb * M * K * Nn});
  }
  {
    // small: per-head projections x[n=64, d=64] w[d, e=64]
    int M = 64, K = 64, E = 64;
    list.push_back(
        {"small x[n,d] w[d,e] -> [n,e] (64^3)", makeSpec({64, 64, 64}, {0, 1}, {1, 2}, {0, 2}),
         [=](const float* a, const float* b, float* c) { gemm(N, N, M, E, K, a, K, b, E, c, E); },
         2.0 * M * K * E});
  }
  return list;
}

} // namespace

int main(int argc, char** argv) {
  int threads = 1, reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
  }
  setBlasThreads(threads);
  useThreadTime = threads == 1;
  std::printf("einsum through meshrt::kernels vs raw cblas_sgemm (OpenBLAS, %d thread%s, %s, "
              "best of %d interleaved samples)\n\n",
              threads, threads == 1 ? "" : "s", useThreadTime ? "thread CPU time" : "wall time",
              reps);
  std::printf("| %-42s | %-54s | %9s | %9s | %6s |\n", "einsum", "plan", "raw GF/s", "ours GF/s",
              "ratio");
  std::printf("|%s|%s|%s|%s|%s|\n", std::string(44, '-').c_str(), std::string(56, '-').c_str(),
              std::string(11, '-').c_str(), std::string(11, '-').c_str(),
              std::string(8, '-').c_str());
  double worst = 1e9;
  for (Case& c : cases()) {
    EinsumPlan plan(c.spec);
    std::vector<float> a = randomBuffer(countOf(c.spec, c.spec.operands[0]), 1);
    std::vector<float> b = randomBuffer(countOf(c.spec, c.spec.operands[1]), 2);
    std::vector<float> ours(size_t(countOf(c.spec, c.spec.out))), raw(ours.size());
    // Warm up both (page faults, OpenBLAS buffers, our packing scratch).
    plan.run(a.data(), b.data(), ours.data());
    c.raw(a.data(), b.data(), raw.data());
    // Each sample repeats the call for >= ~20 ms; the best sample of each side counts (the
    // machine is shared: load only ever slows a sample down).
    double once = seconds([&] { c.raw(a.data(), b.data(), raw.data()); });
    int inner = std::max(1, int(0.02 / std::max(once, 1e-7)));
    double bestOurs = 1e30, bestRaw = 1e30;
    for (int r = 0; r < reps; ++r) {
      bestRaw = std::min(bestRaw, seconds([&] {
                                    for (int i = 0; i < inner; ++i)
                                      c.raw(a.data(), b.data(), raw.data());
                                  }) / inner);
      bestOurs = std::min(bestOurs, seconds([&] {
                                      for (int i = 0; i < inner; ++i)
                                        plan.run(a.data(), b.data(), ours.data());
                                    }) / inner);
    }
    double maxDiff = 0;
    for (size_t i = 0; i < ours.size(); ++i)
      maxDiff = std::max(maxDiff, double(std::abs(ours[i] - raw[i])));
    double ratio = bestRaw / bestOurs;
    worst = std::min(worst, ratio);
    std::printf("| %-42s | %-54s | %9.1f | %9.1f | %6.2f |%s\n", c.name.c_str(),
                plan.describe().c_str(), c.flops / bestRaw * 1e-9, c.flops / bestOurs * 1e-9, ratio,
                maxDiff > 1e-3 ? "  MISMATCH" : "");
  }
  std::printf("\nworst ratio %.2f (goal >= 0.9)\n", worst);
  return 0;
}
