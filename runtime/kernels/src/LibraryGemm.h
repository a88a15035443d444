// The GEMM behind EinsumPlan: oneDNN (DnnlGemm) or OpenBLAS, whichever runs this shape faster on
// this machine, measured on its first call and kept for the process. No one library wins
// everywhere: on AVX-512 cores oneDNN's matmul beats OpenBLAS (held to its Haswell kernels by
// OPENBLAS_CORETYPE) on every transformer GEMM, while on an AVX2-only core its gemm:jit runs
// a transposed A at 0.47-0.86 of OpenBLAS's speed and its GELU post-op as a slow second pass
// (bench/README.md, "Kernels"). Internal to meshrt_kernels.
#pragma once

#include "DnnlGemm.h"

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace meshrt::kernels::detail {

/// out[row, j] = f(out[row, j] + bias[j]) over `count` floats (rows of `lane`), f the identity or
/// (gelu) MathF32.h's GELU: the bias and activation as one pass after a GEMM.
void addBiasActivation(float* out, int64_t count, int64_t lane, const float* bias, bool gelu);

class LibraryGemm {
public:
  LibraryGemm(const std::vector<int64_t>& batchSizes, const EinsumPlan::Matrix& a,
              const EinsumPlan::Matrix& b, const EinsumPlan::Matrix& c);

  /// c = alpha * a . b + beta * c through the chosen library.
  void run(const float* a, const float* b, float* c, float alpha, float beta) const;
  /// c = f(a . b + bias[col]) in one oneDNN matmul with post-ops, where that is measured faster
  /// than the plain GEMM then addBiasActivation; false (c untouched) otherwise: the caller runs
  /// those two.
  bool runBiasActivation(const float* a, const float* b, const float* bias, float* c,
                         bool gelu) const;
  /// "matmul <oneDNN implementation>", "sgemm loop" or "cblas_sgemm loop" (once measured).
  std::string describe() const;

private:
  /// What a choice is made for: the plain GEMM, or with a bias (and GELU) epilogue.
  enum class Use { Plain, Bias, BiasGelu };
  /// The choice for `use` at this GEMM's thread count (threads()): for Plain, whether OpenBLAS
  /// runs it; for an epilogue, whether oneDNN's post-ops do. Cached per plan, measured once per
  /// process and shape (plans of the same shape, such as a repeated layer's, share it).
  bool choose(Use use, const float* a, const float* b, const float* bias) const;
  bool measure(Use use, const float* a, const float* b, const float* bias) const;
  void runOpenBlas(const float* a, const float* b, float* c, float alpha, float beta) const;
  /// The threads this GEMM runs on, either library: the BLAS count, or one below kSplitFlops
  /// (an OpenMP team's start and join cost more than they save there).
  int threads() const;
  /// The shape's key in the process's table of choices.
  std::vector<int64_t> key(Use use, int threads) const;

  std::vector<int64_t> batchSizes_;
  EinsumPlan::Matrix a_, b_, c_;
  DnnlGemm oneDnn_;
  int64_t flops_ = 0;
  int64_t cSpan_ = 0; // c's extent in floats (what a measurement writes)
  // Per use: 0 unknown, else 2 * (threads it was chosen for) + (choice).
  mutable std::atomic<int64_t> cached_[3] = {0, 0, 0};
};

} // namespace meshrt::kernels::detail
