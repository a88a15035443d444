// Einsum on local buffers. A spec names every dim by a small integer id with its LOCAL size and
// lists, per operand and for the output, the ids in storage order (and optionally strides).
// Two-operand contractions run as one oneDNN matmul: dims are classified as batch (in a, b and
// out), M (a and out), N (b and out) and K (a and b, not out); transposes are folded into the
// strides (a column-major output swaps the operands); batch dims are the matmul's batch dims;
// an operand (or the output) whose M/N/K dims cannot be walked with one stride each is first
// copied to a packed layout. One operand is a strided sum (reductions in double); with two
// operands, a dim only one of them has (and not the output) is summed out of it first. Anything
// else (three or more operands, an output dim no operand has) runs a generic strided loop
// accumulating in double, the interpreter's semantics. Size-1 dims are ignored by the
// classification. Every form computes out = alpha * einsum + beta * out (beta = 0: out is only
// written, as in BLAS).
//
//   // out[b, s, f] = sum_d x[b, s, d] * w[d, f]   (ids: b=0, s=1, d=2, f=3)
//   static const meshrt::kernels::EinsumPlan plan({{B, S, D, F}, {{{0, 1, 2}}, {{2, 3}}},
//                                                  {{0, 1, 3}}});
//   plan.run(x, w, out);                 // out = x . w
//   plan.run(x, w, out, 0.125f, 1.0f);   // out = 0.125 * x . w + out
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace meshrt::kernels {

namespace detail {
class LibraryGemm;
} // namespace detail

struct EinsumOperand {
  std::vector<int> dims;        // dim ids in storage order
  std::vector<int64_t> strides; // element strides, one per dim; empty: dense row-major
};

struct EinsumSpec {
  std::vector<int64_t> sizes;          // the local size of dim id i
  std::vector<EinsumOperand> operands; // one or more
  EinsumOperand out;
};

/// A spec classified once (cheap to keep in a static or a member and run many times; run is
/// const and thread-safe). Throws std::invalid_argument on a malformed spec (unknown id, id
/// twice in one operand, wrong stride count, no operands).
class EinsumPlan {
public:
  explicit EinsumPlan(EinsumSpec spec);

  /// out = alpha * einsum(operands) + beta * out (beta = 0: out is not read). The GEMM path
  /// threads with the BLAS thread count (setBlasThreads).
  void run(const float* const* operands, float* out, float alpha = 1.0f, float beta = 0.0f) const;
  void run(const float* a, const float* b, float* out, float alpha = 1.0f, float beta = 0.0f) const;
  /// out = f(einsum(a, b) + bias), `bias` one value per index of the output's last dim (the
  /// output dense row-major), f the identity or, with `gelu`, MathF32.h's GELU (tanh form).
  /// Where the GEMM is one oneDNN matmul whose columns are that last dim and its post-ops are
  /// the faster form here (GemmLibrary), the bias and GELU are applied while a tile is in
  /// registers (no second pass over `out`); otherwise the einsum runs, then one pass over `out`.
  void runBiasActivation(const float* a, const float* b, const float* bias, float* out,
                         bool gelu) const;

  /// How it runs, e.g. "gemm batch=4 m=128 n=64 k=32 a=N b=T" (+ " pack-a" ..., " loops" for
  /// degenerate batches, " small loops" for batches of small matrices), "reduce"
  /// (one operand), "presum(a) + <main plan>" (a dim only one operand has is summed first), or
  /// "generic".
  std::string describe() const;
  bool usesGemm() const { return gemm.enabled; }
  /// The library path of the GEMM ("matmul brg:avx512_core", "sgemm loop"); empty without one.
  std::string gemmImplementation() const;
  const EinsumSpec& spec() const { return spec_; }

  /// A matrix operand of the GEMM: rows x cols walked with (rowStride, colStride), and its
  /// per-batch-dim strides; `pack` copies it first into dense [batch..., rows, cols].
  struct Matrix {
    std::vector<int> rowDims, colDims; // ids, outer to inner
    int64_t rows = 1, cols = 1, rowStride = 0, colStride = 0;
    std::vector<int64_t> batchStrides;
    bool pack = false;
    bool transpose = false; // for cblas: walk as its transpose
    int64_t ld = 1;
    // The source walk over [batch..., rowDims..., colDims...] (what packing copies).
    std::vector<int64_t> fullShape, fullStrides;
  };
  struct Gemm {
    bool enabled = false;
    bool swapped = false; // computes out^T = b^T a^T (the output is column-major in M, N)
    std::vector<int> batchDims;
    std::vector<int64_t> batchSizes;
    Matrix a, b, c; // operand a or b as given (swapped: exchanged), and the output
    std::shared_ptr<const detail::LibraryGemm> library; // built once, shared by copies
    // Batches of small matrices run in loops (SmallGemm.h) instead of the library.
    bool smallBatches = false;
    // Batches of outer products, GEMVs or dot products (runDegenerateBatched) or of small
    // matrices: a's, b's and c's offsets per batch, three a batch.
    std::vector<int64_t> batchOffsets;
  };

private:
  void runGemm(const float* a, const float* b, float* out, float alpha, float beta) const;
  /// Whether the GEMM is a batch (more than one) of outer products (K = 1), GEMVs (M or N = 1)
  /// or dot products: runDegenerateBatched's loops instead of the library.
  bool degenerateBatched() const;
  /// c[batch] = alpha * a[batch] . b[batch] + beta * c[batch] over the (packed) matrices'
  /// strides, in f32 loops.
  void runDegenerateBatched(const float* a, const float* b, float* c, float alpha,
                            float beta) const;
  void runGeneric(const float* const* operands, float* out, float alpha, float beta) const;
  void planReduce();
  void planPresum();
  void runReduce(const float* in, float* out, float alpha, float beta) const;
  void runPresummed(const float* const* operands, float* out, float alpha, float beta) const;

  EinsumSpec spec_;
  std::vector<std::vector<int64_t>> strides; // per operand, then the output (last)
  Gemm gemm;
  // One dense operand whose dims include the output's: a strided sum (reduceStrided).
  bool singleReduce = false;
  std::vector<int64_t> reduceShape, reduceOutStrides;
  // Two operands where one has dims that nothing else has: those are summed first (presum[k]
  // for operand k, or null), then `main` runs on the summed operands.
  std::vector<std::shared_ptr<const EinsumPlan>> presum;
  std::vector<int64_t> presumCounts;
  std::shared_ptr<const EinsumPlan> main;
};

/// One-shot forms (classify and run). For repeated calls keep an EinsumPlan.
void einsum(const float* a, const float* b, float* out, const EinsumSpec& spec, float alpha = 1.0f,
            float beta = 0.0f);
void einsum(std::initializer_list<const float*> operands, float* out, const EinsumSpec& spec,
            float alpha = 1.0f, float beta = 0.0f);

/// Which library runs the einsums' GEMMs. Measured (the default): a GEMM times oneDNN against
/// OpenBLAS on its first call (with a bias epilogue, oneDNN's fused post-ops against the plain
/// GEMM then one pass) and keeps the faster for the process, per shape and BLAS thread count.
/// No library wins on every CPU (bench/README.md, "Kernels"). A measured choice can differ
/// between runs where two are close, and with it the last bits of a result; OneDnn or OpenBlas
/// fix it. The environment's MESHRT_GEMM_LIBRARY (onednn, openblas or measured) sets the
/// initial value.
enum class GemmLibrary { Measured, OneDnn, OpenBlas };
void setGemmLibrary(GemmLibrary library);
GemmLibrary gemmLibrary();

/// Whether plans made from now on run batches of small matrices (attention's in the examples:
/// 16 matrices of 16 x 16 x 8) in meshrt's own loops, 2-4x faster here than oneDNN's batched
/// matmul (true, the default), or through the library (false: bench/kernels.cpp's comparison).
/// The environment's MESHRT_SMALL_GEMM=0 sets false initially.
void setSmallGemmLoops(bool loops);
bool smallGemmLoops();
/// The most multiply-adds a matrix (m n k) that those loops take; 0 while they are off.
/// `meshc calibrate` writes it into the machine description (small_gemm_terms) for the planner.
int64_t smallGemmMaxTerms();

/// The BLAS thread count for this process (set 1 when ranks are threads sharing the cores),
/// initially OpenBLAS's (OPENBLAS_NUM_THREADS, ...): the einsums' GEMMs run on that many OpenMP
/// threads, oneDNN's by its own threading and OpenBLAS's split over a team (OpenBLAS's own pool
/// is held to one thread, see BlasThreads.cpp).
void setBlasThreads(int threads);
int blasThreads();

} // namespace meshrt::kernels
