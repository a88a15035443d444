// Support for generated code, part 3 of 5 (meshc/GeneratedSupport.h includes them in order):
// einsums: meshrt::kernels::EinsumPlan shared per shape (SharedEinsum), causal attention's
// blocks (CausalEinsum), and the GEMM paths of narrow dtypes and the checked fallback (einsum2,
// einsumGeneric).
#pragma once

#include "meshc/SupportShards.h"

namespace meshc::gen {

//===------------------------------------------------------------------------------------------===//
// Einsum
//===------------------------------------------------------------------------------------------===//

/// A two-operand einsum as batched GEMM: out[b, m, n] = sum_k a[b, m, k] * b[b, k, n], where
/// each of b/m/n/k is a group of dims given by sizes and per-tensor strides. Operands whose
/// (m, k) / (k, n) groups are already contiguous in either order go to sgemm directly
/// (transposes folded into the call); others are packed first.
struct GemmDims {
  Shape batch, m, n, k;       // sizes of each group
  Shape aBatch, aM, aK;       // strides of a
  Shape bBatch, bK, bN;       // strides of b
  Shape outBatch, outM, outN; // strides of out
};

namespace detail {
/// Whether the group `sizes` through `strides` is one contiguous run with unit inner stride,
/// i.e. linear index * unit.
inline bool flatStride(const Shape& sizes, const Shape& strides, int64_t& unit) {
  unit = 0;
  int64_t expect = -1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 1) continue;
    if (expect < 0) {
      unit = strides[i];
      expect = strides[i] * sizes[i];
    } else {
      if (strides[i] != expect) return false;
      expect *= sizes[i];
    }
  }
  if (expect < 0) unit = 1; // empty or all size-1
  return true;
}

inline Shape concat(const Shape& a, const Shape& b) {
  Shape out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}
} // namespace detail

/// An f32 einsum of the generated code, planned on its first run (after the runner has set the
/// thread counts its GEMM's library primitive is created for) and shared by the ranks and by
/// every call site of the source file that computes it: one namespace-scope constant per
/// distinct einsum (a function-local static EinsumPlan per call site cost a guard and an
/// initializer each to compile).
class SharedEinsum {
public:
  explicit SharedEinsum(meshrt::kernels::EinsumSpec spec) : spec_(std::move(spec)) {}
  const meshrt::kernels::EinsumPlan& plan() const {
    std::call_once(once_, [this] { plan_.emplace(spec_); });
    return *plan_;
  }

private:
  meshrt::kernels::EinsumSpec spec_;
  mutable std::once_flag once_;
  mutable std::optional<meshrt::kernels::EinsumPlan> plan_;
};

/// A causal attention GEMM of the generated code (Gemm::Causal, causal-attention-blocks): the
/// f32 einsum `spec` (dense operands) over the lower triangle of `block` x `block` tiles of the
/// query dim `row` and the key dim `col`, as one EinsumPlan per block over the operands' own
/// strides (built on first use, shared as SharedEinsum's).
/// Blocks::Keys: key block j is taken against the query positions from j * block on (fewer,
/// taller GEMMs than row blocks: oneDNN's kernels are faster on tall blocks; bench/README.md).
///   With `weights` < 0 (the scores: row and col out dims) the entries above the blocks'
///   diagonal are written as `fill` (the masked softmax that alone reads them puts its fill there
///   anyway), or left as they are when `fillAbove` is false (the softmax is a
///   causalMaskedSoftmax, which never reads them). With `weights` >= 0 (a key gradient:
///   probs^T . d_context or d_scores^T . q, the query positions contracted with that operand,
///   zero above the diagonal) the query positions before the block are left out.
/// Blocks::Queries (probs . v: `col` contracted with operand `weights`, zero above the
/// diagonal): query block i is taken against the key positions below (i + 1) * block.
/// Where the weights' zeros are a softmax's (zero unless a whole row was masked), `check` reads
/// them at run time: Check::Every every entry above the blocks' diagonal, Check::Tails one per
/// row (the weights are a causalMaskedSoftmax's: past each row's prefix, which ends within its
/// block, its entries are all equal); a query block with a nonzero one is taken against every
/// key position (Queries), and any makes the whole einsum run (Keys), so the result is the
/// whole einsum's, up to the order of the sums. Check::None: the zeros are exact (a
/// where(causal mask, x, 0)). A factor's inf or NaN at a position the triangle leaves out does
/// not reach the result (0 * inf would).
class CausalEinsum {
public:
  enum class Blocks { Keys, Queries };
  enum class Check { None, Every, Tails };

  CausalEinsum(meshrt::kernels::EinsumSpec spec, int row, int col, int64_t block, Blocks blocks,
               int weights, Check check, float fill = 0.0f, bool fillAbove = true)
      : spec_(std::move(spec)), row_(row), col_(col), block_(block), blocks_(blocks),
        weights_(weights), check_(check), fill_(fill), fillAbove_(fillAbove) {}

  void run(const float* a, const float* b, float* out, float alpha) const {
    std::call_once(once_, [this] { plan(); });
    size_t count = parts_.size();
    // The query blocks with a nonzero weight above the diagonal (a wholly masked row).
    thread_local std::vector<char> whole;
    whole.assign(count, 0);
    if (weights_ >= 0 && check_ != Check::None)
      forSegments(size_t(weights_), weights_ ? b : a,
                  [&](const float* x, int64_t n, int64_t stride, int64_t i) {
                    if (whole[size_t(i)]) return;
                    if (check_ == Check::Tails)
                      n = 1; // the rest of the row's tail equals its first
                    // Any nonzero bit pattern (-0 too: then every key, as exact), one OR
                    // per element (a contiguous run vectorizes).
                    uint32_t bits = 0;
                    auto word = [](const float* at) {
                      uint32_t u;
                      std::memcpy(&u, at, sizeof u);
                      return u;
                    };
                    if (stride == 1)
                      for (int64_t c = 0; c < n; ++c)
                        bits |= word(x + c);
                    else
                      for (int64_t c = 0; c < n; ++c)
                        bits |= word(x + c * stride);
                    if (bits) whole[size_t(i)] = 1;
                  });
    if (blocks_ == Blocks::Keys && std::find(whole.begin(), whole.end(), 1) != whole.end()) {
      all_->run(a, b, out, alpha, 0.0f); // a key block meets every query row before it
      return;
    }
    for (size_t i = 0; i < count; ++i) {
      // Key blocks write disjoint columns (or key positions); query blocks disjoint query rows.
      const Part& part = parts_[i];
      const auto& plan = whole[i] ? *part.whole : part.lower;
      plan.run(a + part.offsets[0], b + part.offsets[1], out + part.offsets[2], alpha, 0.0f);
    }
    if (blocks_ == Blocks::Keys && weights_ < 0 && fillAbove_)
      forSegments(2, out, [&](const float* x, int64_t n, int64_t stride, int64_t) {
        float* y = const_cast<float*>(x);
        if (stride == 1) {
          std::fill_n(y, n, fill_);
          return;
        }
        for (int64_t c = 0; c < n; ++c)
          y[c * stride] = fill_;
      });
  }

private:
  /// One block's GEMM (key blocks: a key block's column of the triangle; query blocks: a query
  /// block's row of it, and `whole`, the same rows against every key position).
  struct Part {
    meshrt::kernels::EinsumPlan lower;
    std::optional<meshrt::kernels::EinsumPlan> whole;
    int64_t offsets[3] = {0, 0, 0};
  };

  /// Dense strides of operand k (2: the output) over the full sizes.
  Shape denseStrides(size_t k) const {
    const std::vector<int>& dims = k < 2 ? spec_.operands[k].dims : spec_.out.dims;
    Shape strides(dims.size(), 1);
    for (size_t d = dims.size(); d-- > 1;)
      strides[d - 1] = strides[d] * spec_.sizes[size_t(dims[d])];
    return strides;
  }
  int64_t strideOf(size_t k, int dim) const {
    const std::vector<int>& dims = k < 2 ? spec_.operands[k].dims : spec_.out.dims;
    Shape strides = denseStrides(k);
    for (size_t d = 0; d < dims.size(); ++d)
      if (dims[d] == dim) return strides[d];
    return 0;
  }

  /// Calls visit(start, count, col stride, query block) for the part above the blocks'
  /// diagonal of every line along `col` of operand k (2: the output) at `base`: the key
  /// positions from the end of the line's query block on.
  template <class Visit> void forSegments(size_t k, const float* base, Visit visit) const {
    const std::vector<int>& dims = k < 2 ? spec_.operands[k].dims : spec_.out.dims;
    Shape strides = denseStrides(k), extents, walk;
    int64_t colStride = 0;
    size_t rowAt = 0;
    for (size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] == col_) {
        colStride = strides[d];
        continue;
      }
      if (dims[d] == row_) rowAt = extents.size();
      extents.push_back(spec_.sizes[size_t(dims[d])]);
      walk.push_back(strides[d]);
    }
    // An odometer over the other dims (no division per line).
    Shape index(extents.size(), 0);
    int64_t lines = product(extents), offset = 0;
    for (int64_t line = 0; line < lines; ++line) {
      int64_t block = index[rowAt] / block_, from = (block + 1) * block_;
      if (from < size_) visit(base + offset + from * colStride, size_ - from, colStride, block);
      for (size_t d = extents.size(); d-- > 0;) {
        offset += walk[d];
        if (++index[d] < extents[d]) break;
        offset -= walk[d] * extents[d];
        index[d] = 0;
      }
    }
  }

  void plan() const {
    size_ = spec_.sizes[size_t(row_)];
    auto blockSpec = [&](int64_t rows, int64_t cols) {
      meshrt::kernels::EinsumSpec spec = spec_;
      spec.sizes[size_t(row_)] = rows;
      spec.sizes[size_t(col_)] = cols;
      for (size_t k = 0; k < 2; ++k)
        spec.operands[k].strides = denseStrides(k);
      spec.out.strides = denseStrides(2);
      return spec;
    };
    for (int64_t i = 0; i * block_ < size_; ++i) {
      int64_t start = i * block_;
      if (blocks_ == Blocks::Keys) { // key block i against the query rows from its start on
        Part part{meshrt::kernels::EinsumPlan(blockSpec(size_ - start, block_)), std::nullopt, {}};
        for (size_t k = 0; k < 3; ++k)
          part.offsets[k] = start * (strideOf(k, row_) + strideOf(k, col_));
        parts_.push_back(std::move(part));
        continue;
      }
      // query block i against the keys below its end (or all of them)
      Part part{meshrt::kernels::EinsumPlan(blockSpec(block_, start + block_)), std::nullopt, {}};
      if (check_ != Check::None) part.whole.emplace(blockSpec(block_, size_));
      for (size_t k = 0; k < 3; ++k)
        part.offsets[k] = start * strideOf(k, row_);
      parts_.push_back(std::move(part));
    }
    if (blocks_ == Blocks::Keys && weights_ >= 0 && check_ != Check::None)
      all_.emplace(blockSpec(size_, size_));
  }

  meshrt::kernels::EinsumSpec spec_;
  int row_, col_;
  int64_t block_;
  Blocks blocks_;
  int weights_;
  Check check_;
  float fill_;
  bool fillAbove_;
  mutable std::once_flag once_;
  mutable std::vector<Part> parts_;
  mutable std::optional<meshrt::kernels::EinsumPlan> all_; // Keys with a check: the whole einsum
  mutable int64_t size_ = 0;
};

inline void einsum2(float* out, const float* a, const float* b, const GemmDims& d) {
  int64_t M = product(d.m), N = product(d.n), K = product(d.k), B = product(d.batch);
  if (M == 0 || N == 0 || B == 0) return;
  // A as row-major [M, K] (lda) or its transpose.
  int64_t mUnit, kUnitA, kUnitB, nUnit, outMUnit, outNUnit;
  Buffer aPacked, bPacked, outPacked;
  bool aDirect =
      detail::flatStride(d.m, d.aM, mUnit) && detail::flatStride(d.k, d.aK, kUnitA) &&
      ((kUnitA == 1 && (M == 1 || mUnit >= K)) || (mUnit == 1 && (K == 1 || kUnitA >= M)));
  bool bDirect =
      detail::flatStride(d.k, d.bK, kUnitB) && detail::flatStride(d.n, d.bN, nUnit) &&
      ((nUnit == 1 && (K == 1 || kUnitB >= N)) || (kUnitB == 1 && (N == 1 || nUnit >= K)));
  bool outDirect = detail::flatStride(d.m, d.outM, outMUnit) &&
                   detail::flatStride(d.n, d.outN, outNUnit) && outNUnit == 1 &&
                   (M == 1 || outMUnit >= N);
  if (!aDirect) aPacked.resize(size_t(M * K));
  if (!bDirect) bPacked.resize(size_t(K * N));
  if (!outDirect) outPacked.resize(size_t(M * N));
  std::vector<int64_t> aBatch = offsetsOf(d.batch, d.aBatch), bBatch = offsetsOf(d.batch, d.bBatch),
                       outBatch = offsetsOf(d.batch, d.outBatch);
  Shape mk = detail::concat(d.m, d.k), kn = detail::concat(d.k, d.n), mn = detail::concat(d.m, d.n);
  Shape mkStrides = rowMajorStrides(mk), knStrides = rowMajorStrides(kn),
        mnStrides = rowMajorStrides(mn);
  Shape aStrides = detail::concat(d.aM, d.aK), bStrides = detail::concat(d.bK, d.bN),
        outStrides = detail::concat(d.outM, d.outN);
  for (int64_t batch = 0; batch < B; ++batch) {
    const float* aPtr = a + aBatch[size_t(batch)];
    const float* bPtr = b + bBatch[size_t(batch)];
    float* outPtr = out + outBatch[size_t(batch)];
    CBLAS_TRANSPOSE transA = CblasNoTrans, transB = CblasNoTrans;
    int64_t lda = K, ldb = N, ldc = N;
    if (aDirect) {
      if (kUnitA == 1 && (M == 1 || mUnit >= K)) {
        lda = M == 1 ? std::max<int64_t>(K, 1) : mUnit;
      } else {
        transA = CblasTrans;
        lda = K == 1 ? std::max<int64_t>(M, 1) : kUnitA;
      }
    } else {
      copyStrided(aPacked.data(), mk, mkStrides, aPtr, aStrides);
      aPtr = aPacked.data();
    }
    if (bDirect) {
      if (nUnit == 1 && (K == 1 || kUnitB >= N)) {
        ldb = K == 1 ? std::max<int64_t>(N, 1) : kUnitB;
      } else {
        transB = CblasTrans;
        ldb = N == 1 ? std::max<int64_t>(K, 1) : nUnit;
      }
    } else {
      copyStrided(bPacked.data(), kn, knStrides, bPtr, bStrides);
      bPtr = bPacked.data();
    }
    float* cPtr = outDirect ? outPtr : outPacked.data();
    if (outDirect) ldc = M == 1 ? std::max<int64_t>(N, 1) : outMUnit;
    if (K == 0) {
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
          cPtr[i * ldc + j] = 0;
    } else {
      cblas_sgemm(CblasRowMajor, transA, transB, int(M), int(N), int(K), 1.0f, aPtr, int(lda), bPtr,
                  int(ldb), 0.0f, cPtr, int(ldc));
    }
    if (!outDirect) copyStrided(outPtr, mn, outStrides, outPacked.data(), mnStrides);
  }
}

/// The same contraction accumulated in double (cblas_dgemm on double copies), for narrow result
/// dtypes (bf16, f16): the sum is then rounded once to the dtype, as the interpreter does, so
/// the rounding agrees instead of flipping an ulp where float accumulation lands near a tie.
inline void einsum2Double(float* out, const float* a, const float* b, const GemmDims& d) {
  int64_t M = product(d.m), N = product(d.n), K = product(d.k), B = product(d.batch);
  if (M == 0 || N == 0 || B == 0) return;
  // Each group walked with one stride where it can be (the usual dense layouts): a plain
  // strided copy per matrix. The tables of offsetsOf and the vectors allocated per call cost 4x
  // the dgemm (ViT's bf16 feed-forward, 68 x 64 x 128: 107 us against 21).
  int64_t mA, kA, kB, nB, mOut, nOut;
  bool flat = detail::flatStride(d.m, d.aM, mA) && detail::flatStride(d.k, d.aK, kA) &&
              detail::flatStride(d.k, d.bK, kB) && detail::flatStride(d.n, d.bN, nB) &&
              detail::flatStride(d.m, d.outM, mOut) && detail::flatStride(d.n, d.outN, nOut);
  std::vector<int64_t> aOffsets, bOffsets, outOffsets;
  if (!flat) {
    aOffsets = offsetsOf(detail::concat(d.m, d.k), detail::concat(d.aM, d.aK));
    bOffsets = offsetsOf(detail::concat(d.k, d.n), detail::concat(d.bK, d.bN));
    outOffsets = offsetsOf(detail::concat(d.m, d.n), detail::concat(d.outM, d.outN));
  }
  std::vector<int64_t> aBatch = offsetsOf(d.batch, d.aBatch), bBatch = offsetsOf(d.batch, d.bBatch),
                       outBatch = offsetsOf(d.batch, d.outBatch);
  thread_local std::vector<double> aPacked, bPacked, cPacked;
  aPacked.resize(size_t(M * K));
  bPacked.resize(size_t(K * N));
  cPacked.assign(size_t(M * N), 0.0);
  for (int64_t batch = 0; batch < B; ++batch) {
    const float* aBase = a + aBatch[size_t(batch)];
    const float* bBase = b + bBatch[size_t(batch)];
    float* outBase = out + outBatch[size_t(batch)];
    if (flat) {
      for (int64_t i = 0; i < M; ++i)
        for (int64_t k = 0; k < K; ++k)
          aPacked[size_t(i * K + k)] = aBase[i * mA + k * kA];
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j)
          bPacked[size_t(k * N + j)] = bBase[k * kB + j * nB];
    } else {
      for (size_t i = 0; i < aOffsets.size(); ++i)
        aPacked[i] = aBase[aOffsets[i]];
      for (size_t i = 0; i < bOffsets.size(); ++i)
        bPacked[i] = bBase[bOffsets[i]];
    }
    if (K > 0)
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(M), int(N), int(K), 1.0,
                  aPacked.data(), int(K), bPacked.data(), int(N), 0.0, cPacked.data(), int(N));
    if (flat) {
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
          outBase[i * mOut + j * nOut] = float(cPacked[size_t(i * N + j)]);
    } else {
      for (size_t i = 0; i < outOffsets.size(); ++i)
        outBase[outOffsets[i]] = float(cPacked[i]);
    }
  }
}

/// Any einsum: iterates the result's dims plus the contracted dims (sizes `space`), each
/// operand through its strides over that space; accumulates in double. `outDims` leading dims
/// of the space are the result's.
inline void einsumGeneric(float* out, const Shape& outSizes, const Shape& contracted,
                          const std::vector<const float*>& operands,
                          const std::vector<Shape>& outerStrides,
                          const std::vector<Shape>& innerStrides) {
  int64_t outCount = product(outSizes);
  std::vector<std::vector<int64_t>> inner(operands.size());
  for (size_t k = 0; k < operands.size(); ++k)
    inner[k] = offsetsOf(contracted, innerStrides[k]);
  int64_t innerCount = product(contracted);
  std::vector<Shape> strides(operands.size() + 1);
  strides[0] = rowMajorStrides(outSizes);
  for (size_t k = 0; k < operands.size(); ++k)
    strides[k + 1] = outerStrides[k];
  std::vector<int64_t> base(operands.size() + 1, 0), counter(outSizes.size(), 0);
  for (int64_t n = 0; n < outCount; ++n) {
    double sum = 0;
    for (int64_t i = 0; i < innerCount; ++i) {
      double term = 1;
      for (size_t k = 0; k < operands.size(); ++k)
        term *= double(operands[k][base[k + 1] + inner[k][size_t(i)]]);
      sum += term;
    }
    out[base[0]] = float(sum);
    for (size_t d = outSizes.size(); d-- > 0;) {
      for (size_t k = 0; k <= operands.size(); ++k)
        base[k] += strides[k][d];
      if (++counter[d] < outSizes[d]) break;
      for (size_t k = 0; k <= operands.size(); ++k)
        base[k] -= strides[k][d] * outSizes[d];
      counter[d] = 0;
    }
  }
}

} // namespace meshc::gen
