// The measurements behind `meshc calibrate` (header-only: meshc writes a two-line probe program
// that includes this and builds it exactly as it builds generated code, with the same compiler,
// flags, GEMM library and runtime, so that what is measured is what generated code gets).
//
// The probe prints one JSON object on stdout (world rank 0):
//   {"backend": "threads", "ranks": 2, "cores": 2, "memory_bytes": ...,
//    "gemm": [{"m": 1024, "n": 1024, "k": 1024, "flops_per_s": ...}, ...],
//    "stream_bytes_per_s": ..., "cache_bytes": ..., "cache_stream_bytes_per_s": ...,
//    "gemm_small": [{"m": 32, ..., "seconds": ...}, ...],
//    "gemm_batched": {"batch": 16, "m": 16, "n": 16, "k": 8, "seconds": ...,
//                     "small_gemm_terms": ...},
//    "collectives": [{"kind": "all_reduce", "bytes": 4, "seconds": ...}, ...],
//    "loops": {"vector_flops": ..., "transcendental_element_seconds": ...,
//              "dropout_element_seconds": ..., "normal_element_seconds": ..., "call_seconds": ...,
//              "softmax_element_seconds": ..., "softmax_row_seconds": ...,
//              "layer_norm_element_seconds": ..., "reduce_element_seconds": ...,
//              "output_seconds": ...},
//    "oversubscribed": {"ranks": 4, "work_seconds": ..., "iteration_seconds": ...,
//                       "shared_iteration_seconds": ...,
//                       "more": {"ranks": 8, "work_seconds": ..., "iteration_seconds": ...,
//                                "shared_iteration_seconds": ...}}}
// (the last on the threads backend only; "more": four ranks per core instead of two).
// GEMM and bandwidth run on one rank with one thread (a device of the machine description is a
// rank); each time is the best of several repetitions (the machine may be shared), collectives
// the median over repetitions of the slowest rank's time.
#pragma once

#include "meshrt/Launch.h"
#include "meshrt/Random.h"
#include "meshrt/Threads.h"
#include "meshrt/kernels/Einsum.h"
#include "meshrt/kernels/Fill.h"
#include "meshrt/kernels/MathF32.h"
#include "meshrt/kernels/Reduce.h"

#if __has_include("meshc/GeneratedSupport.h")
#include "meshc/GeneratedSupport.h" // generated code's row kernels, as it calls them
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace meshrt::calibrate {

using Clock = std::chrono::steady_clock;

inline double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// A JSON number with 9 significant digits (std::to_string's fixed 6 decimals lose latencies).
inline std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

/// The best of `repetitions` timed runs of `plan` on these operands, after a warm-up run (the
/// library's first call sets up).
inline double bestRunSeconds(const kernels::EinsumPlan& plan, const std::vector<float>& a,
                             const std::vector<float>& b, std::vector<float>& out,
                             int repetitions) {
  plan.run(a.data(), b.data(), out.data());
  double best = 1e30;
  for (int r = 0; r < repetitions; ++r) {
    Clock::time_point start = Clock::now();
    plan.run(a.data(), b.data(), out.data());
    best = std::min(best, secondsSince(start));
  }
  return best;
}

/// Best GEMM rate (FLOP/s) of out[m, n] = a[m, k] . b[k, n] through the einsum generated code
/// calls, on one thread.
inline double gemmFlopsPerSecond(int64_t m, int64_t n, int64_t k, int repetitions) {
  kernels::EinsumPlan plan({{m, n, k}, {{{0, 2}}, {{2, 1}}}, {{0, 1}}});
  std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), out(m * n);
  return 2.0 * double(m) * double(n) * double(k) / bestRunSeconds(plan, a, b, out, repetitions);
}

/// Best time of a batched GEMM as attention runs it: out[batch, m, n] = a[m, batch, k] .
/// b[n, batch, k] (the batch, e.g. heads, between the rows and the terms, as in [seq, heads,
/// d_head]), through the einsum generated code calls, on one thread. Against gemmSeconds' one
/// matrix it shows what the library pays per matrix of a batch.
inline double batchedGemmSeconds(int64_t batch, int64_t m, int64_t n, int64_t k, int repetitions) {
  kernels::EinsumPlan plan({{batch, m, n, k}, {{{1, 0, 3}}, {{2, 0, 3}}}, {{0, 1, 2}}});
  std::vector<float> a(batch * m * k, 0.5f), b(batch * k * n, 0.25f), out(batch * m * n);
  return bestRunSeconds(plan, a, b, out, repetitions);
}

/// Best rate (bytes read and written per second) of the elementwise loop generated code runs
/// for a fused `a = b + s * c` over f32 arrays much larger than the caches.
inline double streamBytesPerSecond(size_t elements, int repetitions) {
  std::vector<float> a(elements), b(elements, 1.0f), c(elements, 2.0f);
  float s = 0.5f;
  double best = 1e30;
  for (int r = 0; r <= repetitions; ++r) {
    Clock::time_point start = Clock::now();
    float* __restrict out = a.data();
    const float* __restrict x = b.data();
    const float* __restrict y = c.data();
    for (size_t i = 0; i < elements; ++i)
      out[i] = x[i] + s * y[i];
    if (r > 0) best = std::min(best, secondsSince(start)); // r = 0 touches the pages first
    s += a[elements / 2] * 1e-9f;                          // keeps the loops from folding
  }
  return 3.0 * sizeof(float) * double(elements) / best;
}

/// Best time of one GEMM of m x n x k (small GEMMs: the library's fixed cost per call shows
/// next to the FLOPs).
inline double gemmSeconds(int64_t m, int64_t n, int64_t k, int repetitions) {
  return 2.0 * double(m) * double(n) * double(k) / gemmFlopsPerSecond(m, n, k, repetitions);
}

/// The cache the ops of one rank may keep their operands in: the last level's share per core,
/// from Linux's sysfs (level, size and the CPUs sharing it; sysconf's figures are the host's in
/// some VMs). 0 when unknown.
inline size_t cacheBytesPerCore() {
  size_t best = 0;
  int bestLevel = 0;
  for (int index = 0; index < 8; ++index) {
    std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    auto read = [&](const char* name) {
      std::string text;
      if (std::FILE* file = std::fopen((dir + name).c_str(), "r")) {
        char line[256] = {};
        if (std::fgets(line, sizeof line, file)) text = line;
        std::fclose(file);
      }
      return text;
    };
    std::string level = read("level"), size = read("size"), shared = read("shared_cpu_list");
    if (level.empty() || size.empty() || read("type").rfind("Instruction", 0) == 0) continue;
    size_t bytes = std::strtoull(size.c_str(), nullptr, 10);
    if (size.find('K') != std::string::npos) bytes <<= 10;
    if (size.find('M') != std::string::npos) bytes <<= 20;
    // "0-1,4-5": count the CPUs sharing it.
    size_t sharing = 0;
    for (size_t at = 0; at < shared.size();) {
      size_t end = shared.find(',', at);
      std::string part = shared.substr(at, end == std::string::npos ? std::string::npos : end - at);
      size_t dash = part.find('-');
      sharing += dash == std::string::npos ? 1
                                           : std::strtoull(part.c_str() + dash + 1, nullptr, 10) -
                                                 std::strtoull(part.c_str(), nullptr, 10) + 1;
      at = end == std::string::npos ? shared.size() : end + 1;
    }
    if (std::atoi(level.c_str()) > bestLevel && bytes > 0) {
      bestLevel = std::atoi(level.c_str());
      best = bytes / std::max<size_t>(sharing, 1);
    }
  }
  return best;
}

/// Ranks that outnumber the cores (threads): each iteration is an in-cache loop of `elements`
/// then a 4-byte all-reduce. Reports the loop's time alone on one thread (best) and an
/// iteration's (median) twice: all-reducing over every rank (the groups span the cores) and,
/// the ranks being [cores, ranks / cores], over the second axis (each group is the ranks one
/// core holds: meshrt's consecutive blocks). Without a cost of synchronizing, an iteration
/// would take the loop's time times ranks / cores.
struct OversubscribedTime {
  int ranks = 0;
  double workSeconds = 0, iterationSeconds = 0, sharedIterationSeconds = 0;
};

inline double streamLoopSeconds(std::vector<float>& a, const std::vector<float>& b, float s) {
  Clock::time_point start = Clock::now();
  float* __restrict out = a.data();
  const float* __restrict x = b.data();
  for (size_t i = 0; i < a.size(); ++i)
    out[i] = x[i] + s * out[i];
  return secondsSince(start);
}

/// The median of `samples` (the upper one of an even count).
inline double medianOf(std::vector<double> samples) {
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

/// Rank 0's median iteration (the loop over `elements`, then an all-reduce over `axes`, the
/// world when empty) on `mesh`.
inline double oversubscribedIterationSeconds(const LaunchOptions& options, const Mesh& mesh,
                                             const std::vector<std::string>& axes, size_t elements,
                                             int iterations) {
  double median = 0;
  launch(mesh, options, [&](Communicator& world) {
    Communicator& comm = axes.empty() ? world : world.subgroup(axes);
    std::vector<float> a(elements, 1.0f), b(elements, 2.0f);
    float value = 1;
    std::vector<double> samples;
    world.barrier();
    // Rank 0's time from one all-reduce's return to the next: the all-reduce holds every rank
    // of its group, and the groups run alike, so that is the world's iteration, without one
    // collective more to measure it.
    Clock::time_point start = Clock::now();
    for (int r = 0; r <= iterations; ++r) {
      streamLoopSeconds(a, b, 1e-6f);
      comm.allReduce(&value, 1, ReduceOp::Sum);
      Clock::time_point now = Clock::now();
      if (r > 0) samples.push_back(std::chrono::duration<double>(now - start).count());
      start = now; // r = 0: first touches
    }
    world.barrier(); // no group leaves while another still loops
    if (world.rank() != 0) return;
    median = medianOf(std::move(samples));
  });
  return median;
}

inline OversubscribedTime oversubscribedTime(const LaunchOptions& options, int ranks,
                                             int iterations) {
  // 256 KiB per rank, a few microseconds: with a longer loop, the median iteration also counts
  // the time other processes take from the loop on a loaded machine (2 MiB measured 81 us where
  // 256 KiB measured 30 and generated programs' collectives 20-30 in their best runs).
  const size_t elements = 32768;
  OversubscribedTime result;
  result.ranks = ranks;
  {
    std::vector<float> a(elements, 1.0f), b(elements, 2.0f);
    double best = 1e30;
    for (int r = 0; r < 3 * iterations; ++r)
      best = std::min(best, streamLoopSeconds(a, b, 1e-6f));
    result.workSeconds = best;
  }
  // Each the median of kLaunches launches: one launch's median iteration moved by 4x between
  // launches a second apart (the per-rank growth from four ranks a core to two came out 8.4,
  // 8.7, 9.5 and 32.9 us in four calibrations), as the ranks' placement and the host's other
  // load at that moment go.
  constexpr int kLaunches = 3;
  auto medianOfLaunches = [&](const Mesh& mesh, const std::vector<std::string>& axes) {
    std::vector<double> launches;
    for (int launch = 0; launch < kLaunches; ++launch)
      launches.push_back(oversubscribedIterationSeconds(options, mesh, axes, elements, iterations));
    return medianOf(std::move(launches));
  };
  result.iterationSeconds = medianOfLaunches(Mesh({{"x", ranks}}), {});
  int cores = usableCores();
  if (ranks % cores == 0)
    result.sharedIterationSeconds =
        medianOfLaunches(Mesh({{"core", cores}, {"shared", ranks / cores}}), {"shared"});
  return result;
}

/// Best rate (bytes read and written per second) of a fused loop like the generated optimizer
/// update (AdamW: reads param, gradient and two moments, writes three; a square root and a
/// division per element) over arrays that together fill `workingSetBytes`: what the generated
/// code's fused loops reach on data that stays in the cache.
inline double cachedLoopBytesPerSecond(size_t workingSetBytes, int repetitions) {
  size_t elements = std::max<size_t>(workingSetBytes / (4 * sizeof(float)), 1024);
  std::vector<float> p(elements, 1.0f), g(elements, 0.1f), m(elements, 0.0f), v(elements, 0.0f);
  float lr = 1e-3f;
  double best = 1e30;
  for (int r = 0; r <= repetitions; ++r) {
    Clock::time_point start = Clock::now();
    float* __restrict param = p.data();
    const float* __restrict grad = g.data();
    float* __restrict m1 = m.data();
    float* __restrict m2 = v.data();
    for (size_t i = 0; i < elements; ++i) {
      float first = 0.9f * m1[i] + 0.1f * grad[i];
      float second = 0.999f * m2[i] + 0.001f * grad[i] * grad[i];
      m1[i] = first;
      m2[i] = second;
      param[i] -= lr * (first / (std::sqrt(second) + 1e-8f) + 0.01f * param[i]);
    }
    if (r > 0) best = std::min(best, secondsSince(start)); // r = 0 brings the arrays in
    lr *= 1.0000001f;                                      // keeps the loops from folding
  }
  return 7.0 * sizeof(float) * double(elements) / best;
}

/// What the generated code's loops and the runtime's row-wise kernels reach on data in the
/// cache (LoopRates in the report; CostModel.h prices ops with them). Each is the best of
/// `repetitions` timings.
struct LoopRates {
  double vectorFlops = 0;                  // simple FLOPs per second of a fused loop
  double transcendentalElementSeconds = 0; // one exp / log / tanh / sigmoid / gelu element
  double dropoutElementSeconds = 0;        // one element of a fused dropout (its Philox word)
  double normalElementSeconds = 0;  // one element of random_normal's fill (Box-Muller, doubles)
  double callSeconds = 0;           // a kernel call or loop nest over a few elements
  double softmaxElementSeconds = 0; // softmax and log_softmax along the last dim
  double softmaxRowSeconds = 0;     // ... their fixed cost per row (generated code's kernels)
  double layerNormElementSeconds = 0;
  double reduceElementSeconds = 0; // sum along the last dim
  double outputSeconds = 0;        // run() returning a small output (a new Tensor, copied)
};

/// Best time of `body()` over `repetitions` runs (one more first, as a warm-up).
template <typename Body> double bestSeconds(int repetitions, Body body) {
  double best = 1e30;
  for (int r = 0; r <= repetitions; ++r) {
    Clock::time_point start = Clock::now();
    body();
    if (r > 0) best = std::min(best, secondsSince(start));
  }
  return best;
}

inline LoopRates loopRates(int repetitions) {
  LoopRates rates;
  // 16 Ki elements per array: 64 KiB, in the cache as the tensors of one op group are.
  const size_t elements = 16384;
  std::vector<float> x(elements), y(elements), out(elements);
  for (size_t i = 0; i < elements; ++i) {
    x[i] = 0.001f * float(i % 977) - 0.4f;
    y[i] = 0.5f + 0.0001f * float(i % 131);
  }
  float s = 0.5f;
  // A chain of 8 adds and multiplies per element over two loaded operands, stored once: what a
  // fused elementwise nest of a few ops does per point.
  double chain = bestSeconds(repetitions, [&] {
    float* __restrict o = out.data();
    const float* __restrict a = x.data();
    const float* __restrict b = y.data();
    for (size_t i = 0; i < elements; ++i) {
      float v = a[i] * b[i] + s;
      v = v * a[i] - b[i];
      v = v * s + a[i];
      v = v * b[i] - s;
      o[i] = v;
    }
    s += o[elements / 2] * 1e-9f; // keeps the loops from folding
  });
  rates.vectorFlops = 8.0 * double(elements) / chain;
  // The transcendental functions generated loops call (meshrt::kernels::f32, vectorized), one
  // per element, each in its own loop as generated code has it; their mean time per element.
  auto perElement = [&](auto function) {
    return bestSeconds(repetitions,
                       [&] {
                         float* __restrict o = out.data();
                         const float* __restrict a = x.data();
                         for (size_t i = 0; i < elements; ++i)
                           o[i] = function(a[i]);
                       }) /
           double(elements);
  };
  rates.transcendentalElementSeconds =
      (perElement([](float v) { return kernels::f32::exp(v); }) +
       perElement([](float v) { return kernels::f32::log(v + 1.0f); }) +
       perElement([](float v) { return kernels::f32::tanh(v); }) +
       perElement([](float v) { return kernels::f32::sigmoid(v); }) +
       perElement([](float v) { return kernels::f32::gelu(v); })) /
      5;
  // Dropout as generated loops do it (docs/codegen.md): the keep masks of a run of up to 1024
  // points drawn first (dropoutKeepMasks: a Philox call per four points, eight calls at once),
  // then the loop over the run. Until session 23 this probe drew a whole Philox call per
  // element, which no generated loop does (4-6 times the cost the planner then charged).
  const uint32_t threshold = dropoutThreshold(0.1);
  rates.dropoutElementSeconds =
      bestSeconds(repetitions,
                  [&] {
                    constexpr size_t kRun = 1024;
                    for (size_t start = 0; start < elements; start += kRun) {
                      size_t count = std::min(kRun, elements - start);
                      uint32_t keep[kRun];
                      dropoutKeepMasks(0x1234u, start, int64_t(count), threshold, keep);
                      float* __restrict o = out.data() + start;
                      const float* __restrict a = x.data() + start;
                      for (size_t i = 0; i < count; ++i) {
                        uint32_t bits;
                        float value = a[i] * 1.1111112f;
                        std::memcpy(&bits, &value, sizeof bits);
                        bits &= keep[i];
                        std::memcpy(&o[i], &bits, sizeof bits);
                      }
                    }
                  }) /
      double(elements);
  // random_normal as generated code calls it (the runtime's fill: a Box-Muller pair per two
  // elements, log, sqrt and sin/cos in double), far dearer than a dropout's word per element.
  kernels::Dims whole{int64_t(elements)};
  rates.normalElementSeconds =
      bestSeconds(repetitions,
                  [&] {
                    kernels::fillRandomNormal(out.data(), kernels::Shard{whole, {0}, whole}, 1,
                                              "normal#0#0", 0.0, 1.0);
                  }) /
      double(elements);
  // A kernel call on a [4, 4] tensor: the fixed cost of an op group.
  rates.callSeconds = bestSeconds(repetitions, [&] {
    kernels::reduce(kernels::ReduceKind::Sum, x.data(), kernels::Dims{4, 4}, kernels::axis(1),
                    out.data());
  });
  // Row-wise kernels along the last dim of [128, 128].
  kernels::Dims shape{128, 128};
  const double rowElements = 128.0 * 128.0;
  double softmax =
      bestSeconds(repetitions, [&] { kernels::softmax(x.data(), out.data(), shape, 1); });
  double logSoftmax =
      bestSeconds(repetitions, [&] { kernels::logSoftmax(x.data(), out.data(), shape, 1); });
  rates.softmaxElementSeconds = (softmax + logSoftmax) / 2 / rowElements;
#if __has_include("meshc/GeneratedSupport.h")
  // Generated code calls its own row kernels (meshc::gen::alongContiguous), not meshrt's: a
  // fixed cost per row and a smaller one per element (rows of 17 cost 4x rows of 128 per
  // element). Both from rows of 16 and of 128 over the same elements, softmax and log_softmax
  // (their mean): time = rows x softmaxRowSeconds + elements x softmaxElementSeconds.
  auto generatedRows = [&](int64_t size) {
    int64_t rows = int64_t(elements) / size;
    meshc::gen::RowBase base{size, nullptr};
    auto timed = [&](meshc::gen::Along kind) {
      return bestSeconds(repetitions, [&] {
        meshc::gen::alongContiguous(out.data(), x.data(), rows, base, base, size, kind, 1e-5, size);
      });
    };
    return (timed(meshc::gen::Along::Softmax) + timed(meshc::gen::Along::LogSoftmax)) / 2;
  };
  const double shortRows = double(elements) / 16, longRows = double(elements) / 128;
  double shortTime = generatedRows(16), longTime = generatedRows(128);
  rates.softmaxRowSeconds = std::max(0.0, (shortTime - longTime) / (shortRows - longRows));
  rates.softmaxElementSeconds =
      std::max(0.0, (longTime - longRows * rates.softmaxRowSeconds) / double(elements));
  // What run() pays per output: a new Tensor (its shape and a copy of its shard) returned to the
  // caller, the previous one freed; of 16 elements, so that the copy itself is negligible. A
  // hundred per timing: one is near the clock's own cost.
  constexpr int kOutputs = 100;
  auto returnOutputs = [&] {
    for (int k = 0; k < kOutputs; ++k) {
      meshc::gen::Tensor tensor{{4, 4}, meshc::gen::Buffer(x.begin(), x.begin() + 16)};
      asm volatile("" : : "r"(tensor.data.data()), "r"(tensor.shape.data()) : "memory");
    }
  };
  rates.outputSeconds = bestSeconds(repetitions, returnOutputs) / kOutputs;
#endif
  rates.layerNormElementSeconds =
      bestSeconds(
          repetitions,
          [&] { kernels::layerNorm(x.data(), out.data(), shape, kernels::axis(1), 1e-5); }) /
      rowElements;
  rates.reduceElementSeconds = bestSeconds(repetitions,
                                           [&] {
                                             kernels::reduce(kernels::ReduceKind::Sum, x.data(),
                                                             shape, kernels::axis(1), out.data());
                                           }) /
                               rowElements;
  return rates;
}

struct CollectiveTime {
  const char* kind;
  size_t bytes;
  double seconds;
};

/// Median over `repetitions` of the slowest rank's time of each collective kind at each size
/// (bytes per rank of the all-reduce's buffer, the reduce-scatter's input, the all-gather's
/// output), over the whole world. `in` and `out` hold maxBytes / 4 + ranks floats, in memory
/// the communicator reads as it is (device memory for NCCL); `finish()` waits for a collective
/// that returned before completing (NCCL enqueues on a stream), a no-op elsewhere.
template <class Finish>
std::vector<CollectiveTime> collectiveTimes(Communicator& comm, float* in, float* out,
                                            size_t maxBytes, int repetitions, Finish finish) {
  std::vector<CollectiveTime> times;
  int ranks = comm.mesh().size();
  for (size_t bytes = 4; bytes <= maxBytes; bytes *= 8) {
    size_t count = std::max<size_t>(bytes / sizeof(float), ranks);
    count -= count % ranks;
    for (const char* kind : {"all_reduce", "reduce_scatter", "all_gather"}) {
      auto once = [&] {
        if (std::strcmp(kind, "all_reduce") == 0)
          comm.allReduce(in, out, count);
        else if (std::strcmp(kind, "reduce_scatter") == 0)
          comm.reduceScatter(in, out, count / ranks);
        else
          comm.allGather(in, out, count / ranks);
        finish();
      };
      once(); // warm-up
      std::vector<double> samples;
      for (int r = 0; r < repetitions; ++r) {
        comm.barrier();
        Clock::time_point start = Clock::now();
        once();
        double seconds = secondsSince(start);
        comm.allReduce(&seconds, 1, ReduceOp::Max);
        samples.push_back(seconds);
      }
      times.push_back({kind, count * sizeof(float), medianOf(std::move(samples))});
    }
  }
  return times;
}

/// collectiveTimes on host buffers.
inline std::vector<CollectiveTime> collectiveTimes(Communicator& comm, size_t maxBytes,
                                                   int repetitions) {
  std::vector<float> in(maxBytes / sizeof(float) + comm.mesh().size()), out(in.size());
  return collectiveTimes(comm, in.data(), out.data(), maxBytes, repetitions, [] {});
}

/// The probe's JSON pieces: one GEMM entry (`key`: flops_per_s or seconds) and the
/// collectives' array elements.
inline std::string gemmJson(int64_t m, int64_t n, int64_t k, const char* key, double value) {
  return "{\"m\": " + std::to_string(m) + ", \"n\": " + std::to_string(n) +
         ", \"k\": " + std::to_string(k) + ", \"" + key + "\": " + number(value) + "}";
}
inline std::string gemmJson(int64_t size, const char* key, double value) {
  return gemmJson(size, size, size, key, value);
}
inline std::string collectivesJson(const std::vector<CollectiveTime>& times) {
  std::string json;
  for (const CollectiveTime& time : times)
    json += (json.empty() ? "" : ", ") + std::string("{\"kind\": \"") + time.kind +
            "\", \"bytes\": " + std::to_string(time.bytes) +
            ", \"seconds\": " + number(time.seconds) + "}";
  return json;
}

/// The probe's own arguments (after the launcher's options were taken out of argv).
struct ProbeArgs {
  int ranks = 2;
  size_t maxBytes = size_t(16) << 20; // of the collectives' largest buffer
  bool quick = false;

  /// Reads `--ranks N`, `--max-bytes B` and `--quick`; prints the problem and returns false on
  /// anything else.
  bool parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--ranks" && i + 1 < argc)
        ranks = std::atoi(argv[++i]);
      else if (arg == "--max-bytes" && i + 1 < argc)
        maxBytes = std::strtoull(argv[++i], nullptr, 10);
      else if (arg == "--quick")
        quick = true;
      else {
        std::fprintf(stderr, "probe: unknown argument '%s'\n", arg.c_str());
        return false;
      }
    }
    if (ranks >= 1) return true;
    std::fprintf(stderr, "probe: --ranks must be at least 1\n");
    return false;
  }
};

/// The probe: `probe [--backend threads|mpi] [--ranks N] [--max-bytes B] [--quick]`.
inline int probeMain(int argc, char** argv) {
  LaunchOptions options = LaunchOptions::fromArgs(argc, argv);
  ProbeArgs args;
  if (!args.parse(argc, argv)) return 2;
  int ranks = args.ranks;
  size_t maxBytes = args.maxBytes;
  bool quick = args.quick;
  int repetitions = quick ? 3 : 10;
  std::string report;
  bool first = launch(Mesh({{"x", ranks}}), options, [&](Communicator& comm) {
    std::vector<CollectiveTime> times;
    if (ranks > 1) times = collectiveTimes(comm, quick ? maxBytes / 64 : maxBytes, repetitions);
    if (comm.rank() != 0) return;
    kernels::setBlasThreads(1);
    std::string gemm;
    for (int64_t size : quick ? std::vector<int64_t>{256} : std::vector<int64_t>{256, 512, 1024}) {
      double rate = gemmFlopsPerSecond(size, size, size, repetitions);
      gemm += (gemm.empty() ? "" : ", ") + gemmJson(size, "flops_per_s", rate);
    }
    double stream =
        streamBytesPerSecond(quick ? (size_t(8) << 20) : (size_t(32) << 20), repetitions);
    // In cache: an update-like fused loop over half the per-core share, many repetitions.
    size_t cacheBytes = cacheBytesPerCore();
    double cacheStream =
        cacheBytes ? cachedLoopBytesPerSecond(cacheBytes / 2, quick ? 20 : 100) : 0;
    // Small GEMMs, square and skinny: the model's rate falls with the smallest of m, n and k,
    // which squares alone confound with the size (whose fixed costs the latency term takes).
    // The examples' GEMMs are mostly skinny: a head's 8 to 64 terms, a rank's slice of d_ff.
    std::vector<std::array<int64_t, 3>> smallShapes = {
        {16, 16, 16}, {32, 32, 32}, {64, 64, 64}, {128, 128, 128}};
    for (int64_t thin : {8, 16, 32})
      for (std::array<int64_t, 3> shape :
           {std::array<int64_t, 3>{thin, 128, 128}, std::array<int64_t, 3>{128, thin, 128},
            std::array<int64_t, 3>{128, 128, thin}})
        smallShapes.push_back(shape);
    std::string gemmSmall;
    for (const auto& [m, n, k] : smallShapes) {
      double seconds = gemmSeconds(m, n, k, quick ? 20 : 100);
      gemmSmall += (gemmSmall.empty() ? "" : ", ") + gemmJson(m, n, k, "seconds", seconds);
    }
    // Attention's shape in the examples: 16 heads' (or batch x heads') matrices of 16 x 16 x 8.
    constexpr int64_t kBatch = 16, kRows = 16, kCols = 16, kTerms = 8;
    double batched = batchedGemmSeconds(kBatch, kRows, kCols, kTerms, quick ? 20 : 200);
    std::string gemmBatched =
        "{\"batch\": " + std::to_string(kBatch) + ", \"m\": " + std::to_string(kRows) +
        ", \"n\": " + std::to_string(kCols) + ", \"k\": " + std::to_string(kTerms) +
        ", \"seconds\": " + number(batched) +
        ", \"small_gemm_terms\": " + std::to_string(kernels::smallGemmMaxTerms()) + "}";
    LoopRates loops = loopRates(quick ? 20 : 200);
    std::string collectives = collectivesJson(times);
    long pages = sysconf(_SC_PHYS_PAGES), pageSize = sysconf(_SC_PAGE_SIZE);
    report = std::string("{\"backend\": \"") + comm.backend() +
             "\", \"ranks\": " + std::to_string(ranks) +
             ", \"cores\": " + std::to_string(usableCores()) +
             ", \"memory_bytes\": " + number(double(pages) * double(pageSize)) + ", \"gemm\": [" +
             gemm + "], \"stream_bytes_per_s\": " + number(stream) +
             ", \"cache_bytes\": " + std::to_string(cacheBytes) +
             ", \"cache_stream_bytes_per_s\": " + number(cacheStream) + ", \"gemm_small\": [" +
             gemmSmall + "], \"gemm_batched\": " + gemmBatched + ", \"collectives\": [" +
             collectives + "]" + ", \"loops\": {\"vector_flops\": " + number(loops.vectorFlops) +
             ", \"transcendental_element_seconds\": " + number(loops.transcendentalElementSeconds) +
             ", \"dropout_element_seconds\": " + number(loops.dropoutElementSeconds) +
             ", \"normal_element_seconds\": " + number(loops.normalElementSeconds) +
             ", \"call_seconds\": " + number(loops.callSeconds) +
             ", \"softmax_element_seconds\": " + number(loops.softmaxElementSeconds) +
             ", \"softmax_row_seconds\": " + number(loops.softmaxRowSeconds) +
             ", \"layer_norm_element_seconds\": " + number(loops.layerNormElementSeconds) +
             ", \"reduce_element_seconds\": " + number(loops.reduceElementSeconds) +
             ", \"output_seconds\": " + number(loops.outputSeconds) + "}";
  });
  // Twice as many thread ranks as cores, after the main measurements (their threads are gone).
  if (first && options.backend == Backend::Threads) {
    int cores = usableCores();
    // Two and four ranks per core: what a collective's sync grows by per rank a core holds.
    auto fields = [](const OversubscribedTime& over) {
      return "\"ranks\": " + std::to_string(over.ranks) +
             ", \"work_seconds\": " + number(over.workSeconds) +
             ", \"iteration_seconds\": " + number(over.iterationSeconds) +
             ", \"shared_iteration_seconds\": " + number(over.sharedIterationSeconds);
    };
    int iterations = quick ? 100 : 1000;
    report += ", \"oversubscribed\": {" +
              fields(oversubscribedTime(options, 2 * cores, iterations)) + ", \"more\": {" +
              fields(oversubscribedTime(options, 4 * cores, iterations)) + "}}";
  }
  if (first) std::fputs((report + "}\n").c_str(), stdout);
  return 0;
}

} // namespace meshrt::calibrate
