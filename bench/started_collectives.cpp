// bench_started_collectives: a started all-reduce (startAllReduce, then wait) against the
// blocking one (allReduce) on the threads backend, at 1, 2 and 4 ranks per core (the fidelity
// meshes [2], [2,2] and [2,4] on a 2-core machine), for a group spanning every rank. Each step
// is a short loop of compute (as a generated program's op groups between collectives) and one
// all-reduce; the three forms alternate round by round:
//   blocking   allReduce, then the loop
//   started    startAllReduce, the loop, wait (a gradient bucket overlapped with the next op)
//   at once    startAllReduce, wait, then the loop
// Printed: us per step (median over rounds of the slowest rank's median step) and the ratios
// to blocking. A measurement, not a test.
//
//   bench_started_collectives [--ranks 2,4,8] [--sizes 4,65536,285696] [--rounds 5]
//                             [--loop-us 10]
#include "ListOptions.h"
#include "meshrt/Threads.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

using namespace meshrt;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int> ranks = {2, 4, 8};
  std::vector<size_t> sizes = {4, 65536, 285696};
  int rounds = 5;
  double loopMicroseconds = 10;
};

enum class Form { Blocking, Started, AtOnce };

/// Spins for about `microseconds` of one core's time (calibrated once per rank).
struct Loop {
  explicit Loop(double microseconds) {
    size_t probe = 1 << 16;
    Clock::time_point start = Clock::now();
    run(probe);
    double perIteration =
        std::chrono::duration<double, std::micro>(Clock::now() - start).count() / double(probe);
    iterations = size_t(std::max(1.0, microseconds / perIteration));
  }
  void run(size_t count) {
    for (size_t i = 0; i < count; ++i) {
      value = value * 0.999999 + 1e-6;
      asm volatile("" : "+x"(value));
    }
  }
  void operator()() { run(iterations); }
  size_t iterations = 1;
  double value = 1;
};

/// The slowest rank's median microseconds per step of `form`.
double timeSteps(const Options& options, int ranks, size_t bytes, Form form) {
  double result = 0;
  runThreads(Mesh({{"x", ranks}}), [&](Communicator& comm) {
    size_t count = std::max<size_t>(1, bytes / sizeof(float));
    std::vector<float> grads(count);
    Loop loop(options.loopMicroseconds);
    auto step = [&] {
      std::fill(grads.begin(), grads.end(), 1.0f);
      if (form == Form::Blocking) {
        comm.allReduce(grads.data(), count);
        loop();
        return;
      }
      Request request = comm.startAllReduce(grads.data(), count);
      if (form == Form::Started) loop();
      comm.wait(request);
      if (form == Form::AtOnce) loop();
    };
    for (int warmup = 0; warmup < 5; ++warmup)
      step();
    std::vector<double> times;
    for (int repeat = 0; repeat < 7; ++repeat) {
      comm.barrier();
      int iterations = 50;
      Clock::time_point start = Clock::now();
      for (int iteration = 0; iteration < iterations; ++iteration)
        step();
      times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() /
                      iterations);
    }
    if (grads[count - 1] != float(ranks)) throw std::runtime_error("wrong sum");
    std::nth_element(times.begin(), times.begin() + 3, times.end());
    double median = times[3];
    comm.allReduce(&median, 1, ReduceOp::Max);
    if (comm.rank() == 0) result = median;
  });
  return result;
}

Options parseOptions(int argc, char** argv) {
  Options options;
  for (int arg = 1; arg < argc; arg += 2) {
    std::string name = argv[arg];
    const char* value = arg + 1 < argc ? argv[arg + 1] : "";
    if (bench::parseRanksOrSizes(name, value, options.ranks, options.sizes)) continue;
    if (name == "--rounds") {
      options.rounds = std::max(1, std::atoi(value));
    } else if (name == "--loop-us") {
      options.loopMicroseconds = std::atof(value);
    } else {
      std::fprintf(stderr, "usage: bench_started_collectives [--ranks 2,4,8] "
                           "[--sizes 4,65536,285696] [--rounds 5] [--loop-us 10]\n");
      std::exit(name == "--help" ? 0 : 2);
    }
  }
  return options;
}

std::string loadAverage() {
  std::ifstream file("/proc/loadavg");
  std::string one;
  file >> one;
  return one;
}

} // namespace

int main(int argc, char** argv) try {
  Options options = parseOptions(argc, argv);
  std::string loadBefore = loadAverage();
  // [ranks][bytes][form] -> one median per round; the forms alternate within each round, their
  // order rotated round by round.
  std::map<int, std::map<size_t, std::map<int, std::vector<double>>>> times;
  for (int round = 0; round < options.rounds; ++round)
    for (int ranks : options.ranks)
      for (size_t bytes : options.sizes)
        for (int k = 0; k < 3; ++k) {
          int form = (k + round) % 3;
          times[ranks][bytes][form].push_back(timeSteps(options, ranks, bytes, Form(form)));
        }
  auto median = [](std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
  };
  std::printf("all-reduce (f32 sum, in place, one group of all ranks) + a %.0f us loop per step; "
              "threads backend, %ld cores, median of %d rounds; load %s before, %s after\n",
              options.loopMicroseconds, sysconf(_SC_NPROCESSORS_ONLN), options.rounds,
              loadBefore.c_str(), loadAverage().c_str());
  std::printf("%9s %5s %12s %12s %12s %15s %15s\n", "bytes", "ranks", "blocking us", "started us",
              "at once us", "started/block", "at once/block");
  for (int ranks : options.ranks)
    for (size_t bytes : options.sizes) {
      auto& forms = times[ranks][bytes];
      double blocking = median(forms[0]), started = median(forms[1]), atOnce = median(forms[2]);
      std::printf("%9zu %5d %12.1f %12.1f %12.1f %14.2fx %14.2fx\n", bytes, ranks, blocking,
                  started, atOnce, started / blocking, atOnce / blocking);
    }
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "bench_started_collectives: %s\n", error.what());
  return 1;
}
