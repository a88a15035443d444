// The BLAS thread count (Einsum.h: setBlasThreads, blasThreads), in a unit of its own: a
// program that only sets it (generated CUDA code's runner) links OpenBLAS, not the einsums'
// oneDNN.
#include "meshrt/kernels/Einsum.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>

namespace meshrt::kernels {

namespace {
/// The thread count meshrt's GEMMs run with: OpenBLAS's own count when meshrt first needs it
/// (OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, else the cores), after which OpenBLAS itself is
/// held to one thread. Its pool's idle workers wait by calling sched_yield for about 2^28 cycles
/// after each call (OpenBLAS's THREAD_TIMEOUT), longer than a whole training step, so at two
/// threads on two cores they took time slices from the OpenMP team of every loop and row kernel
/// after each GEMM: a quarter of bench/train_step.py's samples at two threads were in the
/// kernel's scheduler. A GEMM OpenBLAS runs on more threads is split over an OpenMP team
/// instead (LibraryGemm::runOpenBlas), whose waits follow OMP_WAIT_POLICY as every other
/// region's do (bench/README.md, "session 27").
std::atomic<int>& blasThreadCount() {
  static std::atomic<int> count{[] {
    int threads = std::max(1, openblas_get_num_threads());
    openblas_set_num_threads(1);
    return threads;
  }()};
  return count;
}
} // namespace

void setBlasThreads(int threads) {
  blasThreadCount().store(std::max(1, threads));
}
int blasThreads() {
  return blasThreadCount().load();
}

} // namespace meshrt::kernels
