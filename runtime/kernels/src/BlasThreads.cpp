// The BLAS thread count (Einsum.h: setBlasThreads, blasThreads), in a unit of its own: a
// program that only sets it (generated CUDA code's runner) links OpenBLAS, not the einsums'
// oneDNN.
#include "meshrt/kernels/Einsum.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>

// OpenBLAS's pthreads build exports the call that stops its worker pool (what it runs before a
// fork); weak, so that a BLAS without it (the serial or OpenMP builds) links and skips it.
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));

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
/// region's do (bench/README.md, "session 27"). The pool is also stopped: its workers start
/// spinning when the library loads, before main, and a process's first ~70 ms of steps shared
/// the cores with them (moe_train on 2 ranks: its first 54 steps 1.4x slower, every op, until
/// the spin timed out; docs/runtime.md, "OpenBLAS's idle pool"). Held to one thread, OpenBLAS
/// never starts it again.
std::atomic<int>& blasThreadCount() {
  static std::atomic<int> count{[] {
    int threads = std::max(1, openblas_get_num_threads());
    openblas_set_num_threads(1);
    if (blas_thread_shutdown_) blas_thread_shutdown_();
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
