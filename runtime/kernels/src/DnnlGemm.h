// The GEMM behind EinsumPlan: oneDNN's matmul primitive over the plan's (strided, batched)
// operands, or a loop of dnnl_sgemm calls where no fast matmul implementation takes the layout.
// Internal to meshrt_kernels (keeps oneDNN's headers out of the public ones).
#pragma once

#include "meshrt/kernels/Einsum.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace meshrt::kernels::detail {

/// Sets the calling thread's OpenMP thread count (oneDNN's threading runtime) to the BLAS thread
/// count (setBlasThreads), so that oneDNN obeys it; returns it.
/// Per thread: rank threads that each set one thread do not oversubscribe the cores.
int useBlasThreadCount();

/// The calling thread's OpenMP thread count set to `threads` while one GEMM runs, and back to
/// what it was after (the thread's own parallel loops keep theirs): a GEMM too small to gain
/// from a team runs on one thread (LibraryGemm::threads).
class OmpThreadsFor {
public:
  explicit OmpThreadsFor(int threads);
  ~OmpThreadsFor();
  OmpThreadsFor(const OmpThreadsFor&) = delete;
  OmpThreadsFor& operator=(const OmpThreadsFor&) = delete;

private:
  int previous_;
};

/// c[batch...] = alpha * a[batch...] . b[batch...] + beta * c[batch...], every operand walked
/// by its Matrix (rows x cols with one stride each, and per-batch-dim strides). c is never
/// transposed. Thread-safe: run may be called concurrently (per-thread scratchpad and stream).
class DnnlGemm {
public:
  DnnlGemm(const std::vector<int64_t>& batchSizes, const EinsumPlan::Matrix& a,
           const EinsumPlan::Matrix& b, const EinsumPlan::Matrix& c);

  /// On `threads` OpenMP threads (the calling thread's count for the call, see OmpThreadsFor).
  void run(const float* a, const float* b, float* c, float alpha, float beta, int threads) const;
  /// c = f(a . b + bias[col]), bias one value per column of c, f the identity or (gelu) GELU in
  /// its tanh form: oneDNN's bias and eltwise post-op, applied while a tile of c is in registers.
  /// False (and c untouched) where this GEMM has no such matmul (the sgemm loop, or oneDNN
  /// offers only its reference implementation with the post-ops).
  bool runBiasActivation(const float* a, const float* b, const float* bias, float* c, bool gelu,
                         int threads) const;
  /// "matmul <oneDNN implementation>" or "sgemm loop".
  std::string describe() const;

private:
  /// What a primitive adds to alpha * a.b: nothing, c (a sum post-op: beta = 1), or a bias
  /// along c's columns and then an activation.
  enum class Epilogue { None, Accumulate, Bias, BiasGelu };
  struct Variant {
    int threads;
    Epilogue epilogue;
    bool usable; // false: oneDNN offers only its reference matmul (or none) for it
    bool scaled; // alpha a runtime output scale (not under a bias epilogue: alpha 1)
    dnnl::matmul primitive;
    dnnl::memory::desc scratchpad;
    std::string implementation; // oneDNN's name for what it chose, e.g. "brg:avx512_core"
  };
  /// The primitive for this thread count (oneDNN fixes a primitive's thread count when it is
  /// created) and epilogue, created on first use.
  std::shared_ptr<const Variant> variant(int threads, Epilogue epilogue) const;
  std::shared_ptr<const Variant> create(int threads, Epilogue epilogue) const;
  /// A variant bound to one thread: its stream, and memory objects that each call points at
  /// its operands and the thread's scratchpad (alpha's has a buffer of its own).
  struct Bound {
    bool usable = false; // the variant's
    bool scaled = false; // the variant's
    dnnl::matmul primitive;
    dnnl::stream stream;
    dnnl::memory a, b, c, scale, scratch, bias;
    size_t scratchBytes = 0;
  };
  /// The calling thread's Bound for this plan and variant, made on first use.
  Bound& boundFor(int threads, Epilogue epilogue) const;
  void execute(Bound& bound, const float* a, const float* b, const float* bias, float* c,
               float alpha) const;
  void runSgemmLoop(const float* a, const float* b, float* c, float alpha, float beta) const;
  /// c *= beta over c's walk (beta other than 0 and 1 before an accumulating matmul).
  void scaleOutput(float* c, float beta) const;

  std::vector<int64_t> batchSizes_;
  EinsumPlan::Matrix a_, b_, c_;
  dnnl::memory::desc aDesc_, bDesc_, cDesc_, biasDesc_;
  bool useMatmul_ = false;
  uint64_t serial_; // unique per plan: the key of its threads' Bound caches
  std::string implementation_;
  mutable std::mutex mutex_;
  mutable std::vector<std::shared_ptr<const Variant>> variants_;
};

} // namespace meshrt::kernels::detail
