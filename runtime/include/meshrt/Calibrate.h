// The measurements behind `meshc calibrate` (header-only: meshc writes a two-line probe program
// that includes this and builds it exactly as it builds generated code, with the same compiler,
// flags, GEMM library and runtime, so that what is measured is what generated code gets).
//
// The probe prints one JSON object on stdout (world rank 0):
//   {"backend": "threads", "ranks": 2, "cores": 2, "memory_bytes": ...,
//    "gemm": [{"m": 1024, "n": 1024, "k": 1024, "flops_per_s": ...}, ...],
//    "stream_bytes_per_s": ...,
//    "collectives": [{"kind": "all_reduce", "bytes": 4, "seconds": ...}, ...]}
// GEMM and bandwidth run on one rank with one thread (a device of the machine description is a
// rank); each time is the best of several repetitions (the machine may be shared), collectives
// the median over repetitions of the slowest rank's time.
#pragma once

#include "meshrt/Launch.h"
#include "meshrt/kernels/Einsum.h"

#include <algorithm>
#include <chrono>
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

/// Best GEMM rate (FLOP/s) of out[m, n] = a[m, k] . b[k, n] through the einsum generated code
/// calls, on one thread.
inline double gemmFlopsPerSecond(int64_t m, int64_t n, int64_t k, int repetitions) {
  kernels::EinsumPlan plan({{m, n, k}, {{{0, 2}}, {{2, 1}}}, {{0, 1}}});
  std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), out(m * n);
  plan.run(a.data(), b.data(), out.data()); // warm-up: the library's first call sets up
  double best = 1e30;
  for (int r = 0; r < repetitions; ++r) {
    Clock::time_point start = Clock::now();
    plan.run(a.data(), b.data(), out.data());
    best = std::min(best, secondsSince(start));
  }
  return 2.0 * double(m) * double(n) * double(k) / best;
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

struct CollectiveTime {
  const char* kind;
  size_t bytes;
  double seconds;
};

/// Median over `repetitions` of the slowest rank's time of each collective kind at each size
/// (bytes per rank of the all-reduce's buffer, the reduce-scatter's input, the all-gather's
/// output), over the whole world.
inline std::vector<CollectiveTime> collectiveTimes(Communicator& comm, size_t maxBytes,
                                                   int repetitions) {
  std::vector<CollectiveTime> times;
  int ranks = comm.mesh().size();
  std::vector<float> in(maxBytes / sizeof(float) + ranks), out(in.size());
  for (size_t bytes = 4; bytes <= maxBytes; bytes *= 8) {
    size_t count = std::max<size_t>(bytes / sizeof(float), ranks);
    count -= count % ranks;
    for (const char* kind : {"all_reduce", "reduce_scatter", "all_gather"}) {
      auto once = [&] {
        if (std::strcmp(kind, "all_reduce") == 0)
          comm.allReduce(in.data(), out.data(), count);
        else if (std::strcmp(kind, "reduce_scatter") == 0)
          comm.reduceScatter(in.data(), out.data(), count / ranks);
        else
          comm.allGather(in.data(), out.data(), count / ranks);
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
      std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
      times.push_back({kind, count * sizeof(float), samples[samples.size() / 2]});
    }
  }
  return times;
}

/// The probe: `probe [--backend threads|mpi] [--ranks N] [--max-bytes B] [--quick]`.
inline int probeMain(int argc, char** argv) {
  LaunchOptions options = LaunchOptions::fromArgs(argc, argv);
  int ranks = 2;
  size_t maxBytes = size_t(16) << 20;
  bool quick = false;
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
      return 2;
    }
  }
  if (ranks < 1) {
    std::fprintf(stderr, "probe: --ranks must be at least 1\n");
    return 2;
  }
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
      gemm += (gemm.empty() ? "" : ", ") + std::string("{\"m\": ") + std::to_string(size) +
              ", \"n\": " + std::to_string(size) + ", \"k\": " + std::to_string(size) +
              ", \"flops_per_s\": " + number(rate) + "}";
    }
    double stream =
        streamBytesPerSecond(quick ? (size_t(8) << 20) : (size_t(32) << 20), repetitions);
    std::string collectives;
    for (const CollectiveTime& time : times)
      collectives += (collectives.empty() ? "" : ", ") + std::string("{\"kind\": \"") + time.kind +
                     "\", \"bytes\": " + std::to_string(time.bytes) +
                     ", \"seconds\": " + number(time.seconds) + "}";
    long pages = sysconf(_SC_PHYS_PAGES), pageSize = sysconf(_SC_PAGE_SIZE);
    report = std::string("{\"backend\": \"") + comm.backend() +
             "\", \"ranks\": " + std::to_string(ranks) +
             ", \"cores\": " + std::to_string(std::thread::hardware_concurrency()) +
             ", \"memory_bytes\": " + number(double(pages) * double(pageSize)) + ", \"gemm\": [" +
             gemm + "], \"stream_bytes_per_s\": " + number(stream) + ", \"collectives\": [" +
             collectives + "]}\n";
  });
  if (first) std::fputs(report.c_str(), stdout);
  return 0;
}

} // namespace meshrt::calibrate
