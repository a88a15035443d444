// The lm forward's per-rank FFN GEMMs on [data=2, model=2] (transformer.mesh at batch 8, seq 128,
// d_model 256, d_ff 1024: x[512,256] . w_in[256,512] and h[512,512] . w_out[512,256]) as oneDNN's
// matmul runs them for EinsumPlan: plain, with the bias post-op, with bias and gelu_tanh post-ops
// (what fuse-gemm-epilogues emits today), with the bias post-op followed by a pass of MathF32's
// vectorized gelu over the result, and with the weights in oneDNN's own blocked layout (as if
// packed once per step-invariant weight; the packing itself not timed). One core, one oneDNN
// thread, each call timed by the thread's CPU time, contenders alternated call by call, best of
// N (load only slows a sample). Prints microseconds, GFLOP/s and the ratio to the plain GEMM.
// Usage: bench_gemm_epilogue [--reps N]
#include "meshrt/kernels/MathF32.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using Tag = dnnl::memory::format_tag;
using Type = dnnl::memory::data_type;

enum class Epilogue { None, Bias, BiasGelu };

struct Case {
  const char* name;
  int64_t m, k, n;
  Epilogue epilogue;
  bool geluPass; // MathF32's gelu over the result after the GEMM
  Tag weights;   // ab: row-major as the generated code holds it; any: oneDNN's choice
};

struct Prepared {
  dnnl::matmul primitive;
  dnnl::memory a, b, c, bias, scratch;
  std::string impl;
};

double threadMicros(timespec start, timespec end) {
  return 1e6 * double(end.tv_sec - start.tv_sec) + 1e-3 * double(end.tv_nsec - start.tv_nsec);
}

[[gnu::noinline]] void geluPass(float* __restrict values, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    values[i] = meshrt::kernels::f32::gelu(values[i]);
}

Prepared prepare(const Case& c, const dnnl::engine& engine, dnnl::stream& stream) {
  dnnl::memory::desc aDesc({c.m, c.k}, Type::f32, Tag::ab), bDesc({c.k, c.n}, Type::f32, c.weights),
      cDesc({c.m, c.n}, Type::f32, Tag::ab), biasDesc({1, c.n}, Type::f32, Tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (c.epilogue == Epilogue::BiasGelu)
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f);
  attr.set_post_ops(ops);
  auto pd =
      c.epilogue == Epilogue::None
          ? dnnl::matmul::primitive_desc(dnnl::matmul::desc(aDesc, bDesc, cDesc), attr, engine)
          : dnnl::matmul::primitive_desc(dnnl::matmul::desc(aDesc, bDesc, biasDesc, cDesc), attr,
                                         engine);
  std::vector<float> weights(size_t(c.k * c.n));
  for (size_t i = 0; i < weights.size(); ++i)
    weights[i] = float((i * 7919) % 1000) / 1000.0f - 0.5f;
  dnnl::memory rowMajor({{c.k, c.n}, Type::f32, Tag::ab}, engine, weights.data());
  dnnl::memory b(pd.weights_desc(), engine);
  dnnl::reorder(rowMajor, b).execute(stream, rowMajor, b);
  stream.wait();
  dnnl::memory a(aDesc, engine), out(cDesc, engine), bias(biasDesc, engine);
  auto* x = static_cast<float*>(a.get_data_handle());
  for (int64_t i = 0; i < c.m * c.k; ++i)
    x[i] = float((i * 31) % 997) / 997.0f - 0.5f;
  auto* beta = static_cast<float*>(bias.get_data_handle());
  for (int64_t i = 0; i < c.n; ++i)
    beta[i] = 0.01f * float(i % 50);
  return {dnnl::matmul(pd),  a, b, out, bias, dnnl::memory(pd.scratchpad_desc(), engine),
          pd.impl_info_str()};
}

} // namespace

int main(int argc, char** argv) {
  int reps = 400;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  const std::vector<Case> cases = {
      {"w_in plain", 512, 256, 512, Epilogue::None, false, Tag::ab},
      {"w_in +bias", 512, 256, 512, Epilogue::Bias, false, Tag::ab},
      {"w_in +bias+gelu post-ops", 512, 256, 512, Epilogue::BiasGelu, false, Tag::ab},
      {"w_in +bias, MathF32 gelu pass", 512, 256, 512, Epilogue::Bias, true, Tag::ab},
      {"w_in +bias+gelu, w blocked", 512, 256, 512, Epilogue::BiasGelu, false, Tag::any},
      {"w_in plain, w blocked", 512, 256, 512, Epilogue::None, false, Tag::any},
      {"w_out plain", 512, 512, 256, Epilogue::None, false, Tag::ab},
      {"w_out plain, w blocked", 512, 512, 256, Epilogue::None, false, Tag::any},
  };
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::vector<Prepared> prepared;
  for (const Case& c : cases)
    prepared.push_back(prepare(c, engine, stream));
  std::vector<double> best(cases.size(), 1e30);
  for (int rep = 0; rep < reps; ++rep)
    for (size_t i = 0; i < cases.size(); ++i) {
      Prepared& p = prepared[i];
      std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, p.a},
                                                 {DNNL_ARG_WEIGHTS, p.b},
                                                 {DNNL_ARG_DST, p.c},
                                                 {DNNL_ARG_SCRATCHPAD, p.scratch}};
      if (cases[i].epilogue != Epilogue::None) args.emplace(DNNL_ARG_BIAS, p.bias);
      timespec start{}, end{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
      p.primitive.execute(stream, args);
      stream.wait();
      if (cases[i].geluPass)
        geluPass(static_cast<float*>(p.c.get_data_handle()), cases[i].m * cases[i].n);
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
      best[i] = std::min(best[i], threadMicros(start, end));
    }
  std::printf("bench_gemm_epilogue --reps %d (OMP_NUM_THREADS=1 taskset -c 1 recommended)\n", reps);
  std::printf("| %-30s | %8s | %8s | %-9s | %-16s |\n", "GEMM", "best us", "GFLOP/s", "vs plain",
              "oneDNN impl");
  std::printf(
      "|--------------------------------|----------|----------|-----------|------------------|\n");
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    size_t plain = c.k == 256 ? 0 : 6; // the same GEMM, row-major weights, no post-op
    std::printf("| %-30s | %8.1f | %8.1f | %9.3f | %-16s |\n", c.name, best[i],
                2.0 * double(c.m * c.k * c.n) / best[i] * 1e-3, best[i] / best[plain],
                prepared[i].impl.c_str());
  }
}
