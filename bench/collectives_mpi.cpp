// The OpenMPI side of bench_collectives: times MPI_Allreduce (f32 sum, out of place) at the given
// sizes, exactly as bench_collectives times the threads backend, and prints on rank 0 one line
// "<bytes> <seconds per allreduce>" per size. Launched by bench_collectives through mpirun.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  int repeats = 3;
  for (int arg = 1; arg < argc; ++arg) {
    if (argv[arg][0] == 'r') { // "r<repeats>"
      repeats = std::atoi(argv[arg] + 1);
      continue;
    }
    size_t bytes = std::strtoull(argv[arg], nullptr, 10);
    size_t count = bytes / sizeof(float);
    int iterations = int(std::clamp<size_t>((size_t(256) << 20) / bytes, 3, 2000));
    std::vector<float> in(count, float(rank + 1)), out(count, 0.0f);
    for (int warmup = 0; warmup < 2; ++warmup)
      MPI_Allreduce(in.data(), out.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double best = 1e30;
    for (int repeat = 0; repeat < repeats; ++repeat) {
      MPI_Barrier(MPI_COMM_WORLD);
      double start = MPI_Wtime();
      for (int iteration = 0; iteration < iterations; ++iteration)
        MPI_Allreduce(in.data(), out.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      MPI_Barrier(MPI_COMM_WORLD);
      double seconds = (MPI_Wtime() - start) / iterations;
      // Every rank must agree on the time: take the slowest rank's.
      MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      best = std::min(best, seconds);
    }
    if (out[count - 1] != float(ranks * (ranks + 1) / 2)) {
      std::fprintf(stderr, "MPI_Allreduce gave %g, expected %d\n", out[count - 1],
                   ranks * (ranks + 1) / 2);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) std::printf("%zu %.9g\n", bytes, best);
  }
  MPI_Finalize();
  return 0;
}
