// bench_collectives: bus bandwidth of the threads backend's allreduce against OpenMPI's
// MPI_Allreduce (bench_collectives_mpi, launched through mpirun) at the same sizes and rank
// counts, and against one thread's memcpy bandwidth, printed as one table of ratios measured
// side by side in one run. bench/collectives.sh builds and runs it.
//
// Both sides time the same loop: f32 sum, out of place, 2 warm-up calls, then `iterations`
// calls between two barriers, the slowest rank's time, best of `repeats`; and the whole
// measurement (MPI then threads, per rank count) is repeated `rounds` times, keeping the best,
// because the machine is shared and noisy.
//
// A second table (--overlap, on by default) times one training-like step per rank: an all-reduce
// of a gradient bucket plus a fixed amount of compute, written three ways: blocking (allReduce,
// then compute), started (startAllReduce, compute, wait) and started with test() between slices
// of the compute; the three alternate round by round.
#include "ListOptions.h"
#include "meshrt/Threads.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <unistd.h>
#include <vector>

using namespace meshrt;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<int> ranks = {2, 4};
  std::vector<size_t> sizes;
  int repeats = 3;
  int rounds = 2;
  std::string mpiProgram;
  bool overlap = true;
};

enum class StepKind { Blocking, Started, StartedTested };

/// Seconds per step (all-reduce of `bytes` + compute over a 1 MiB buffer) on `ranks` threads,
/// the slowest rank's, best of the repeats.
double timeOverlapStep(const Options& options, int ranks, size_t bytes, StepKind kind) {
  double result = 0;
  runThreads(Mesh({{"x", ranks}}), [&](Communicator& comm) {
    size_t count = bytes / sizeof(float);
    std::vector<float> grads(count, 1.0f), work(size_t(1) << 18, 1.0f);
    auto compute = [&](int slices, Request* request) {
      for (int slice = 0; slice < slices; ++slice) {
        for (int pass = 0; pass < 32 / slices; ++pass)
          for (float& x : work)
            x = x * 0.999f + 0.001f;
        asm volatile("" : : "r"(work.data()) : "memory");
        if (request) request->test();
      }
    };
    auto step = [&] {
      std::fill(grads.begin(), grads.end(), 1.0f);
      if (kind == StepKind::Blocking) {
        comm.allReduce(grads.data(), count);
        compute(1, nullptr);
        return;
      }
      Request request = comm.startAllReduce(grads.data(), count);
      if (kind == StepKind::Started)
        compute(1, nullptr);
      else
        compute(8, &request);
      comm.wait(request);
    };
    int iterations = 20;
    step();
    double best = 1e30;
    for (int repeat = 0; repeat < options.repeats; ++repeat) {
      comm.barrier();
      Clock::time_point start = Clock::now();
      for (int iteration = 0; iteration < iterations; ++iteration)
        step();
      comm.barrier();
      double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
      comm.allReduce(&seconds, 1, ReduceOp::Max);
      best = std::min(best, seconds);
    }
    if (grads[count - 1] != float(ranks)) throw std::runtime_error("overlap step: wrong sum");
    if (comm.rank() == 0) result = best;
  });
  return result;
}

int iterationsFor(size_t bytes) {
  return int(std::clamp<size_t>((size_t(256) << 20) / bytes, 3, 2000));
}

/// Seconds per allreduce of each size on `ranks` threads.
std::map<size_t, double> timeThreads(const Options& options, int ranks) {
  std::map<size_t, double> result;
  runThreads(Mesh({{"x", ranks}}), [&](Communicator& comm) {
    for (size_t bytes : options.sizes) {
      size_t count = bytes / sizeof(float);
      std::vector<float> in(count, float(comm.rank() + 1)), out(count, 0.0f);
      int iterations = iterationsFor(bytes);
      for (int warmup = 0; warmup < 2; ++warmup)
        comm.allReduce(in.data(), out.data(), count);
      double best = 1e30;
      for (int repeat = 0; repeat < options.repeats; ++repeat) {
        comm.barrier();
        Clock::time_point start = Clock::now();
        for (int iteration = 0; iteration < iterations; ++iteration)
          comm.allReduce(in.data(), out.data(), count);
        comm.barrier();
        double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
        comm.allReduce(&seconds, 1, ReduceOp::Max);
        best = std::min(best, seconds);
      }
      if (out[count - 1] != float(ranks * (ranks + 1) / 2))
        throw std::runtime_error("threads allreduce gave a wrong sum");
      if (comm.rank() == 0) result[bytes] = best;
    }
  });
  return result;
}

/// Seconds per MPI_Allreduce of each size on `ranks` processes (empty if mpirun failed).
std::map<size_t, double> timeMpi(const Options& options, int ranks) {
  std::map<size_t, double> result;
  char errors[] = "/tmp/bench_collectives_mpi.XXXXXX";
  int fd = mkstemp(errors);
  if (fd >= 0) close(fd);
  std::string command = "mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) +
                        " '" + options.mpiProgram + "' r" + std::to_string(options.repeats);
  for (size_t bytes : options.sizes) {
    command += ' '; // (not " " + ...: GCC 12 warns falsely on that at -O3, its bug 105329)
    command += std::to_string(bytes);
  }
  command += std::string(" 2>") + errors;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    size_t bytes = 0;
    double seconds = 0;
    while (std::fscanf(pipe, "%zu %lf", &bytes, &seconds) == 2)
      result[bytes] = seconds;
    if (pclose(pipe) != 0) result.clear();
  }
  if (result.size() != options.sizes.size()) {
    std::fprintf(stderr, "bench_collectives: '%s' failed:\n", command.c_str());
    std::ifstream log(errors);
    std::string line;
    while (std::getline(log, line))
      std::fprintf(stderr, "  %s\n", line.c_str());
    result.clear();
  }
  std::remove(errors);
  return result;
}

/// Seconds per memcpy of each size, on one thread.
std::map<size_t, double> timeMemcpy(const Options& options) {
  std::map<size_t, double> result;
  for (size_t bytes : options.sizes) {
    std::vector<char> from(bytes, 1), to(bytes, 0);
    int iterations = iterationsFor(bytes);
    double best = 1e30;
    for (int repeat = 0; repeat < options.repeats; ++repeat) {
      Clock::time_point start = Clock::now();
      for (int iteration = 0; iteration < iterations; ++iteration) {
        std::memcpy(to.data(), from.data(), bytes);
        asm volatile("" : : "r"(to.data()) : "memory"); // keep every copy
      }
      best =
          std::min(best, std::chrono::duration<double>(Clock::now() - start).count() / iterations);
    }
    result[bytes] = best;
  }
  return result;
}

void keepBest(std::map<size_t, double>& best, const std::map<size_t, double>& round) {
  for (auto [bytes, seconds] : round)
    if (!best.count(bytes) || seconds < best[bytes]) best[bytes] = seconds;
}

std::string sizeName(size_t bytes) {
  if (bytes >= (size_t(1) << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

std::string selfDirectory() {
  std::vector<char> path(4096);
  ssize_t length = readlink("/proc/self/exe", path.data(), path.size() - 1);
  std::string self(path.data(), length > 0 ? size_t(length) : 0);
  return self.substr(0, self.rfind('/'));
}

Options parseOptions(int argc, char** argv) {
  Options options;
  for (size_t bytes = 1024; bytes <= (size_t(64) << 20); bytes *= 4)
    options.sizes.push_back(bytes);
  options.mpiProgram = selfDirectory() + "/bench_collectives_mpi";
  // Options come in pairs: --name value.
  for (int arg = 1; arg < argc; arg += 2) {
    std::string name = argv[arg];
    const char* value = arg + 1 < argc ? argv[arg + 1] : "";
    if (bench::parseRanksOrSizes(name, value, options.ranks, options.sizes)) continue;
    if (name == "--repeats") {
      options.repeats = std::max(1, std::atoi(value));
    } else if (name == "--rounds") {
      options.rounds = std::max(1, std::atoi(value));
    } else if (name == "--overlap") {
      options.overlap = std::atoi(value) != 0;
    } else if (name == "--mpi") {
      options.mpiProgram = value;
    } else {
      std::fprintf(stderr,
                   "usage: bench_collectives [--ranks 2,4] [--sizes bytes,...] [--repeats 3] "
                   "[--rounds 2] [--mpi path/to/bench_collectives_mpi] [--overlap 1|0]\n");
      std::exit(name == "--help" ? 0 : 2);
    }
  }
  return options;
}

std::string loadAverage() {
  std::ifstream file("/proc/loadavg");
  std::string one, five;
  file >> one >> five;
  return one + " (1 min), " + five + " (5 min)";
}

void printOverlap(const Options& options) {
  const std::vector<size_t> buckets = {size_t(64) << 10, size_t(4) << 20};
  // [ranks][bucket][kind], best over rounds; the kinds alternate within each round.
  std::map<int, std::map<size_t, std::map<int, double>>> best;
  for (int round = 0; round < options.rounds; ++round)
    for (int ranks : options.ranks)
      for (size_t bytes : buckets)
        for (int kind = 0; kind < 3; ++kind) {
          double seconds = timeOverlapStep(options, ranks, bytes, StepKind(kind));
          auto& slot = best[ranks][bytes];
          if (!slot.count(kind) || seconds < slot[kind]) slot[kind] = seconds;
        }
  std::printf(
      "\nstep = all-reduce of a bucket (f32 sum, in place) + compute (32 passes over 1 MiB); "
      "threads backend, best of %d x %d\n",
      options.rounds, options.repeats);
  std::printf("%8s %5s %12s %12s %16s %14s %18s\n", "bucket", "ranks", "blocking us",
              "start/wait us", "start/test/wait us", "blocking/start", "blocking/start+test");
  for (int ranks : options.ranks)
    for (size_t bytes : buckets) {
      auto& times = best[ranks][bytes];
      std::printf("%8s %5d %12.1f %12.1f %16.1f %13.2fx %17.2fx\n", sizeName(bytes).c_str(), ranks,
                  times[0] * 1e6, times[1] * 1e6, times[2] * 1e6, times[0] / times[1],
                  times[0] / times[2]);
    }
}

} // namespace

int main(int argc, char** argv) try {
  Options options = parseOptions(argc, argv);
  std::string loadBefore = loadAverage();
  std::map<int, std::map<size_t, double>> threads, mpi;
  std::map<size_t, double> memcpyTimes;
  for (int round = 0; round < options.rounds; ++round) {
    std::fprintf(stderr, "round %d of %d...\n", round + 1, options.rounds);
    for (int ranks : options.ranks) {
      keepBest(mpi[ranks], timeMpi(options, ranks));
      keepBest(threads[ranks], timeThreads(options, ranks));
    }
    keepBest(memcpyTimes, timeMemcpy(options));
  }

  std::printf("allreduce, f32 sum, out of place: meshrt threads backend vs OpenMPI MPI_Allreduce "
              "(mpirun --oversubscribe), best of %d x %d\n",
              options.rounds, options.repeats);
  std::printf("bus bandwidth GB/s = bytes / time * 2(n-1)/n; memcpy GB/s = bytes / time, one "
              "thread; %ld cores; load average %s\n\n",
              sysconf(_SC_NPROCESSORS_ONLN), loadBefore.c_str());
  std::printf("%8s %5s %11s %11s %11s %11s %9s %11s\n", "size", "ranks", "threads us",
              "threads GB/s", "MPI us", "MPI GB/s", "thr/MPI", "thr/memcpy");
  for (int ranks : options.ranks) {
    double busFactor = 2.0 * (ranks - 1) / ranks;
    for (size_t bytes : options.sizes) {
      double threadSeconds = threads[ranks][bytes];
      double threadBus = double(bytes) / threadSeconds * busFactor / 1e9;
      double memcpyBandwidth = double(bytes) / memcpyTimes[bytes] / 1e9;
      std::printf("%8s %5d %11.1f %11.2f", sizeName(bytes).c_str(), ranks, threadSeconds * 1e6,
                  threadBus);
      if (mpi[ranks].count(bytes)) {
        double mpiSeconds = mpi[ranks][bytes];
        double mpiBus = double(bytes) / mpiSeconds * busFactor / 1e9;
        std::printf(" %11.1f %11.2f %8.2fx", mpiSeconds * 1e6, mpiBus, threadBus / mpiBus);
      } else {
        std::printf(" %11s %11s %9s", "n/a", "n/a", "n/a");
      }
      std::printf(" %10.2fx\n", threadBus / memcpyBandwidth);
    }
  }
  std::printf("\nmemcpy GB/s:");
  for (size_t bytes : options.sizes)
    std::printf(" %s %.1f;", sizeName(bytes).c_str(), double(bytes) / memcpyTimes[bytes] / 1e9);
  size_t largest = options.sizes.back();
  std::printf("\ngoal: threads >= 3x OpenMPI bus bandwidth at %s:", sizeName(largest).c_str());
  for (int ranks : options.ranks) {
    if (!mpi[ranks].count(largest)) {
      std::printf(" %d ranks n/a (no MPI result);", ranks);
      continue;
    }
    double ratio = mpi[ranks][largest] / threads[ranks][largest];
    std::printf(" %d ranks %.2fx%s;", ranks, ratio, ratio >= 3 ? " (met)" : " (NOT met)");
  }
  std::printf("\n");
  if (options.overlap) printOverlap(options);
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "bench_collectives: %s\n", error.what());
  return 1;
}
