// Einsum: classification into a (batched) GEMM at plan time, oneDNN or OpenBLAS at run time
// (LibraryGemm.cpp), and the generic strided loop for everything a GEMM cannot express.
#include "meshrt/kernels/Einsum.h"

#include "LibraryGemm.h"
#include "SmallGemm.h"
#include "VectorClones.h"

#include "meshrt/kernels/Index.h"
#include "meshrt/kernels/MathF32.h"
#include "meshrt/kernels/Reduce.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace meshrt::kernels {
namespace {

using Strides = std::vector<int64_t>;

Strides denseStrides(const std::vector<int64_t>& shape) {
  Strides strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

Dims toDims(const std::vector<int64_t>& values) {
  return Dims(values);
}

/// Where each id sits in `operand` (-1: absent).
std::vector<int> positionsOf(const EinsumOperand& operand, size_t idCount) {
  std::vector<int> positions(idCount, -1);
  for (size_t i = 0; i < operand.dims.size(); ++i)
    positions[size_t(operand.dims[i])] = int(i);
  return positions;
}

class GemmBuilder {
public:
  GemmBuilder(const EinsumSpec& spec, const std::vector<Strides>& strides)
      : spec(spec), strides(strides) {}

  /// Classifies the two-operand spec; false when it is not a GEMM.
  bool build(EinsumPlan::Gemm& gemm);

private:
  EinsumPlan::Matrix matrix(int tensor, const std::vector<int>& rowDims,
                            const std::vector<int>& colDims) const;
  /// Collapses `dims` (outer to inner) of `tensor` into one extent and stride; false if the
  /// dims are not nested contiguously in that order.
  bool collapse(int tensor, const std::vector<int>& dims, int64_t& extent, int64_t& stride) const;
  int64_t strideOf(int tensor, int id) const { return strides[tensor][positions[tensor][id]]; }

  const EinsumSpec& spec;
  const std::vector<Strides>& strides;
  std::vector<std::vector<int>> positions; // a, b, out
  std::vector<int> batchDims;
};

bool GemmBuilder::collapse(int tensor, const std::vector<int>& dims, int64_t& extent,
                           int64_t& stride) const {
  extent = 1;
  stride = 0;
  int64_t next = 0;
  for (size_t i = dims.size(); i-- > 0;) {
    int64_t own = strideOf(tensor, dims[i]);
    if (i + 1 == dims.size())
      stride = own;
    else if (own != next)
      return false;
    next = own * spec.sizes[dims[i]];
    extent *= spec.sizes[dims[i]];
  }
  return true;
}

/// Picks the cblas walk of a rows x cols matrix: row-major (col stride 1, ld = row stride) or
/// its transpose (row stride 1, ld = col stride); false when neither fits.
bool chooseLayout(EinsumPlan::Matrix& m) {
  int64_t rows = m.rows, cols = m.cols;
  if ((cols == 1 || m.colStride == 1) && (rows == 1 || m.rowStride >= std::max<int64_t>(cols, 1))) {
    m.transpose = false;
    m.ld = rows == 1 ? std::max<int64_t>(cols, 1) : m.rowStride;
    return true;
  }
  if ((rows == 1 || m.rowStride == 1) && (cols == 1 || m.colStride >= std::max<int64_t>(rows, 1))) {
    m.transpose = true;
    m.ld = cols == 1 ? std::max<int64_t>(rows, 1) : m.colStride;
    return true;
  }
  return false;
}

void makePacked(EinsumPlan::Matrix& m, const std::vector<int64_t>& batchSizes) {
  m.pack = true;
  m.transpose = false;
  m.rowStride = m.cols;
  m.colStride = 1;
  m.ld = std::max<int64_t>(m.cols, 1);
  Strides dense = denseStrides(batchSizes);
  m.batchStrides.clear();
  for (int64_t stride : dense)
    m.batchStrides.push_back(stride * m.rows * m.cols);
}

EinsumPlan::Matrix GemmBuilder::matrix(int tensor, const std::vector<int>& rowDims,
                                       const std::vector<int>& colDims) const {
  EinsumPlan::Matrix m;
  m.rowDims = rowDims;
  m.colDims = colDims;
  for (int id : batchDims) {
    m.batchStrides.push_back(strideOf(tensor, id));
    m.fullShape.push_back(spec.sizes[id]);
    m.fullStrides.push_back(strideOf(tensor, id));
  }
  for (const std::vector<int>* group : {&rowDims, &colDims})
    for (int id : *group) {
      m.fullShape.push_back(spec.sizes[id]);
      m.fullStrides.push_back(strideOf(tensor, id));
    }
  bool collapsible = collapse(tensor, rowDims, m.rows, m.rowStride) &&
                     collapse(tensor, colDims, m.cols, m.colStride);
  if (!collapsible) {
    m.rows = m.cols = 1;
    for (int id : rowDims)
      m.rows *= spec.sizes[id];
    for (int id : colDims)
      m.cols *= spec.sizes[id];
    m.pack = true;
  } else if (!chooseLayout(m)) {
    m.pack = true;
  }
  return m;
}

bool GemmBuilder::build(EinsumPlan::Gemm& gemm) {
  size_t idCount = spec.sizes.size();
  const EinsumOperand& a = spec.operands[0];
  const EinsumOperand& b = spec.operands[1];
  positions = {positionsOf(a, idCount), positionsOf(b, idCount), positionsOf(spec.out, idCount)};
  auto in = [&](int tensor, int id) { return positions[tensor][id] >= 0; };
  std::vector<int> mDims, nDims, kDims;
  for (int id : spec.out.dims) {
    if (spec.sizes[id] == 1) continue;
    if (in(0, id) && in(1, id))
      batchDims.push_back(id);
    else if (in(0, id))
      mDims.push_back(id);
    else if (in(1, id))
      nDims.push_back(id);
    else
      return false; // an output dim no operand has: a broadcast
  }
  for (int id : a.dims) {
    if (spec.sizes[id] == 1 || in(2, id)) continue;
    if (!in(1, id)) return false; // summed over in a alone
    kDims.push_back(id);
  }
  for (int id : b.dims)
    if (spec.sizes[id] != 1 && !in(2, id) && !in(0, id)) return false;

  gemm.batchDims = batchDims;
  gemm.batchSizes.clear();
  for (int id : batchDims)
    gemm.batchSizes.push_back(spec.sizes[id]);
  EinsumPlan::Matrix c = matrix(2, mDims, nDims);
  EinsumPlan::Matrix cSwapped = matrix(2, nDims, mDims);
  bool direct = !c.pack && !c.transpose;
  bool swapped = !direct && !cSwapped.pack && !cSwapped.transpose;
  gemm.swapped = swapped;
  if (swapped) {
    gemm.a = matrix(1, nDims, kDims);
    gemm.b = matrix(0, kDims, mDims);
    gemm.c = cSwapped;
  } else {
    gemm.a = matrix(0, mDims, kDims);
    gemm.b = matrix(1, kDims, nDims);
    gemm.c = c;
    if (!direct) makePacked(gemm.c, gemm.batchSizes);
  }
  if (gemm.a.pack) makePacked(gemm.a, gemm.batchSizes);
  if (gemm.b.pack) makePacked(gemm.b, gemm.batchSizes);
  gemm.library =
      std::make_shared<const detail::LibraryGemm>(gemm.batchSizes, gemm.a, gemm.b, gemm.c);
  gemm.enabled = true;
  return true;
}

/// Copies `m`'s source walk into dense [batch..., rows, cols].
void pack(const float* source, const EinsumPlan::Matrix& m, std::vector<float>& buffer) {
  Dims shape = toDims(m.fullShape), dense = rowMajorStrides(shape);
  buffer.resize(size_t(shape.product()));
  float* target = buffer.data();
  // Keep the target's innermost dim innermost (sequential writes) and order the others by the
  // source's strides, largest outermost: then each inner block of the source is small and
  // re-read from cache, e.g. a batch dim innermost in the source moves just outside.
  std::vector<int> order(m.fullShape.size());
  for (size_t d = 0; d < order.size(); ++d)
    order[d] = int(d);
  if (!order.empty())
    std::stable_sort(order.begin(), order.end() - 1, [&](int x, int y) {
      return m.fullStrides[size_t(x)] > m.fullStrides[size_t(y)];
    });
  Dims walkShape, walkSource, walkTarget;
  for (int d : order) {
    walkShape.push_back(shape[d]);
    walkSource.push_back(m.fullStrides[size_t(d)]);
    walkTarget.push_back(dense[d]);
  }
  forEachIndex<2>(walkShape, {walkTarget, walkSource},
                  [&](int64_t o, int64_t i) { target[o] = source[i]; });
}

/// sum over i < count of x[i * xStride] * y[i * yStride], in f32: 8 partial sums over
/// contiguous operands, so that the compiler vectorizes without reassociating one chain.
[[gnu::always_inline]] inline float dot(const float* x, int64_t xStride, const float* y,
                                        int64_t yStride, int64_t count) {
  if (xStride == 1 && yStride == 1) {
    float partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= count; i += 8)
      for (int j = 0; j < 8; ++j)
        partial[j] += x[i + j] * y[i + j];
    float sum = 0;
    for (; i < count; ++i)
      sum += x[i] * y[i];
    for (float value : partial)
      sum += value;
    return sum;
  }
  float sum = 0;
  for (int64_t i = 0; i < count; ++i)
    sum += x[i * xStride] * y[i * yStride];
  return sum;
}

// These loops are the kernel's whole cost: compiled for AVX2 and AVX-512 too (VectorClones.h).

/// sum over t < k of x[t] y[t], both contiguous, in f32: 8 lanes, then halved (a tree three adds
/// deep, where a sum of the lanes one after another is eight). `Terms` > 0 fixes k at compile
/// time (the loops unroll into a few vector instructions); 0 reads it at run time.
template <int64_t Terms>
[[gnu::always_inline]] inline float contiguousDot(const float* __restrict x,
                                                  const float* __restrict y, int64_t k) {
  if constexpr (Terms > 0) k = Terms;
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t t = 0;
  for (; t + 8 <= k; t += 8)
    for (int l = 0; l < 8; ++l)
      lanes[l] += x[t + l] * y[t + l];
  for (int l = 0; t + l < k; ++l)
    lanes[l] += x[t + l] * y[t + l];
  for (int l = 0; l < 4; ++l)
    lanes[l] += lanes[l + 4];
  for (int l = 0; l < 2; ++l)
    lanes[l] += lanes[l + 2];
  return lanes[0] + lanes[1];
}

template <int64_t Terms>
[[gnu::always_inline]] inline void
contiguousDotBatches(int64_t m, int64_t n, int64_t k, int64_t aRow, int64_t bCol, int64_t cRow,
                     int64_t cCol, const int64_t* batchOffsets, int aSlot, int64_t batches,
                     const float* a, const float* b, float* c, float alpha, float beta) {
  for (int64_t batch = 0; batch < batches; ++batch) {
    const float* A = a + batchOffsets[3 * batch + aSlot];
    const float* B = b + batchOffsets[3 * batch + 1 - aSlot];
    float* C = c + batchOffsets[3 * batch + 2];
    for (int64_t i = 0; i < m; ++i) {
      float* row = C + i * cRow;
      if (beta == 0)
        for (int64_t j = 0; j < n; ++j)
          row[j * cCol] = alpha * contiguousDot<Terms>(A + i * aRow, B + j * bCol, k);
      else
        for (int64_t j = 0; j < n; ++j)
          row[j * cCol] =
              alpha * contiguousDot<Terms>(A + i * aRow, B + j * bCol, k) + beta * row[j * cCol];
    }
  }
}

/// The dot products of degenerateBatches when both operands' terms are contiguous (a's rows, b's
/// columns): c[i, j] = alpha * a[i, :] . b[:, j] + beta * c[i, j] for every batch, beta tested
/// once per row, with the common term counts fixed at compile time. In degenerateBatches'
/// general loop, with k read at run time and beta tested per dot, performer's backward (32,768
/// dots of 16 terms a layer) took 159 and 215 us a call; fixed at 16, about 55.
MESHRT_VECTOR_CLONES
void contiguousDots(int64_t m, int64_t n, int64_t k, int64_t aRow, int64_t bCol, int64_t cRow,
                    int64_t cCol, const int64_t* batchOffsets, int64_t batches, const float* a,
                    const float* b, float* c, float alpha, float beta) {
  // One column (a GEMV): its dots are c's rows, the same dots with the operands traded, so the
  // inner loop runs over them (one dot per row of an outer loop cost 3x).
  int aSlot = 0;
  if (n == 1 && m > 1) {
    std::swap(a, b);
    std::swap(m, n);
    bCol = aRow;
    cCol = cRow;
    aSlot = 1;
  }
  switch (k) {
  case 8:
    return contiguousDotBatches<8>(m, n, k, aRow, bCol, cRow, cCol, batchOffsets, aSlot, batches, a,
                                   b, c, alpha, beta);
  case 16:
    return contiguousDotBatches<16>(m, n, k, aRow, bCol, cRow, cCol, batchOffsets, aSlot, batches,
                                    a, b, c, alpha, beta);
  case 32:
    return contiguousDotBatches<32>(m, n, k, aRow, bCol, cRow, cCol, batchOffsets, aSlot, batches,
                                    a, b, c, alpha, beta);
  case 64:
    return contiguousDotBatches<64>(m, n, k, aRow, bCol, cRow, cCol, batchOffsets, aSlot, batches,
                                    a, b, c, alpha, beta);
  default:
    return contiguousDotBatches<0>(m, n, k, aRow, bCol, cRow, cCol, batchOffsets, aSlot, batches, a,
                                   b, c, alpha, beta);
  }
}

/// An outer product's rows: c[i, :] = alpha a[i] b[:] (+ beta c[i, :]), b's row copied into a
/// local array first (the stores cannot change it, so nothing is reloaded or checked for
/// overlap), its width fixed at compile time where `Width` > 0, beta tested once (tested per
/// row, GCC kept the fixed-width rows in 128- and 256-bit pieces: 46 us against 32 for
/// performer's outer product).
template <int64_t Width>
[[gnu::always_inline]] inline void outerProductRows(int64_t m, int64_t n, const float* A,
                                                    int64_t aRow, const float* B, float* C,
                                                    int64_t cRow, float alpha, float beta) {
  if constexpr (Width > 0) {
    float source[Width];
    for (int64_t j = 0; j < Width; ++j)
      source[j] = B[j];
    if (beta == 0) {
      for (int64_t i = 0; i < m; ++i) {
        float* __restrict row = C + i * cRow;
        float scale = alpha * A[i * aRow];
        for (int64_t j = 0; j < Width; ++j)
          row[j] = scale * source[j];
      }
    } else {
      for (int64_t i = 0; i < m; ++i) {
        float* __restrict row = C + i * cRow;
        float scale = alpha * A[i * aRow];
        for (int64_t j = 0; j < Width; ++j)
          row[j] = scale * source[j] + beta * row[j];
      }
    }
  } else {
    for (int64_t i = 0; i < m; ++i) {
      float* __restrict row = C + i * cRow;
      const float* __restrict source = B;
      float scale = alpha * A[i * aRow];
      if (beta == 0)
        for (int64_t j = 0; j < n; ++j)
          row[j] = scale * source[j];
      else
        for (int64_t j = 0; j < n; ++j)
          row[j] = scale * source[j] + beta * row[j];
    }
  }
}

/// Batches of outer products whose b and c rows are contiguous (degenerateBatches' `rows` with
/// one term), the common row widths fixed at compile time: with the width read at run time each
/// row of 16 cost about 2.9 ns (performer's K'_l (x) V_l, 32,768 rows of 16 a layer: 94 us a
/// call against 21 us for a memset of its 2 MiB).
MESHRT_VECTOR_CLONES
void outerProducts(int64_t m, int64_t n, int64_t aRow, int64_t cRow, int aSlot,
                   const int64_t* batchOffsets, int64_t batches, const float* a, const float* b,
                   float* c, float alpha, float beta) {
  for (int64_t batch = 0; batch < batches; ++batch) {
    const float* A = a + batchOffsets[3 * batch + aSlot];
    const float* B = b + batchOffsets[3 * batch + 1 - aSlot];
    float* C = c + batchOffsets[3 * batch + 2];
    switch (n) {
    case 8:
      outerProductRows<8>(m, n, A, aRow, B, C, cRow, alpha, beta);
      break;
    case 16:
      outerProductRows<16>(m, n, A, aRow, B, C, cRow, alpha, beta);
      break;
    case 32:
      outerProductRows<32>(m, n, A, aRow, B, C, cRow, alpha, beta);
      break;
    case 64:
      outerProductRows<64>(m, n, A, aRow, B, C, cRow, alpha, beta);
      break;
    default:
      outerProductRows<0>(m, n, A, aRow, B, C, cRow, alpha, beta);
      break;
    }
  }
}

/// 16 f32 lanes as GCC's vector type: accumulators of this type stay in registers (as arrays,
/// -O2 kept them in memory).
typedef float Lanes16 __attribute__((vector_size(16 * sizeof(float))));

/// A row of c as a sum of k rows of b, c[i, :] = alpha sum_t a[i, t] b[t, :] (+ beta c[i, :]),
/// 16 x `Vectors` columns in four accumulators that take the terms in turn: with one, each
/// term's multiply-add waited for the last one's (performer's Q' (K'^T V), 256 rows of 64 terms
/// a layer: 36 us a call, about 2.2 ns a term; now 9.6 us).
template <int Vectors>
[[gnu::always_inline]] inline void rowSumRows(int64_t m, int64_t k, const float* A, int64_t aRow,
                                              int64_t aCol, const float* B, int64_t bRow, float* C,
                                              int64_t cRow, float alpha, float beta) {
  constexpr int Terms = 4;
  for (int64_t i = 0; i < m; ++i) {
    Lanes16 acc[Terms][Vectors] = {}, next;
    const float* scales = A + i * aRow;
    int64_t t = 0;
    for (; t + Terms <= k; t += Terms)
      for (int term = 0; term < Terms; ++term)
        for (int v = 0; v < Vectors; ++v) {
          std::memcpy(&next, B + (t + term) * bRow + 16 * v, sizeof next);
          acc[term][v] += scales[(t + term) * aCol] * next;
        }
    for (; t < k; ++t)
      for (int v = 0; v < Vectors; ++v) {
        std::memcpy(&next, B + t * bRow + 16 * v, sizeof next);
        acc[0][v] += scales[t * aCol] * next;
      }
    float* __restrict row = C + i * cRow;
    for (int v = 0; v < Vectors; ++v) {
      Lanes16 sum = (acc[0][v] + acc[1][v]) + (acc[2][v] + acc[3][v]);
      for (int j = 0; j < 16; ++j)
        row[16 * v + j] = beta == 0 ? alpha * sum[j] : alpha * sum[j] + beta * row[16 * v + j];
    }
  }
}

/// Batches of rowSumRows (degenerateBatches' `rows` with several terms) for the common widths;
/// false for any other width.
MESHRT_VECTOR_CLONES
bool rowSums(int64_t m, int64_t n, int64_t k, int64_t aRow, int64_t aCol, int64_t bRow,
             int64_t cRow, int aSlot, const int64_t* batchOffsets, int64_t batches, const float* a,
             const float* b, float* c, float alpha, float beta) {
  if (n != 16 && n != 32) return false;
  for (int64_t batch = 0; batch < batches; ++batch) {
    const float* A = a + batchOffsets[3 * batch + aSlot];
    const float* B = b + batchOffsets[3 * batch + 1 - aSlot];
    float* C = c + batchOffsets[3 * batch + 2];
    if (n == 16)
      rowSumRows<1>(m, k, A, aRow, aCol, B, bRow, C, cRow, alpha, beta);
    else
      rowSumRows<2>(m, k, A, aRow, aCol, B, bRow, C, cRow, alpha, beta);
  }
  return true;
}

/// c[batch] = alpha * a[batch] . b[batch] + beta * c[batch] for GEMMs of one row, one column or
/// one term (EinsumPlan::degenerateBatched), every matrix walked by its rowStride and colStride
/// (packed ones included, see makePacked) from its batch's offset (a, b, c per batch), in f32.
MESHRT_VECTOR_CLONES
void degenerateBatches(const EinsumPlan::Matrix& ma, const EinsumPlan::Matrix& mb,
                       const EinsumPlan::Matrix& mc, const int64_t* batchOffsets, int64_t batches,
                       const float* a, const float* b, float* c, float alpha, float beta) {
  int64_t m = mc.rows, n = mc.cols, k = ma.cols;
  int64_t aRow = ma.rowStride, aCol = ma.colStride, bRow = mb.rowStride, bCol = mb.colStride,
          cRow = mc.rowStride, cCol = mc.colStride;
  // One column of c whose rows are contiguous, as a's: computed as its transpose c^T = b^T a^T,
  // one row, so that the rows below apply (performer's backward: 16 strided dot products of 64
  // terms per batch became one contiguous pass per term).
  const bool transposed = n == 1 && m > 1 && aRow == 1 && cRow == 1;
  if (transposed) {
    std::swap(m, n);
    std::swap(aRow, bCol); // a^T's rows are b's columns, and b^T's rows a's columns
    std::swap(aCol, bRow);
    cCol = cRow;
    cRow = 0;
  }
  // Rows of b and c contiguous: each row of c is a sum of rows of b (one for an outer
  // product), accumulated in contiguous lanes the compiler vectorizes.
  const bool rows = bCol == 1 && cCol == 1 && n > 1;
  if (!transposed && !rows && aCol == 1 && bRow == 1 && k > 1) {
    contiguousDots(m, n, k, aRow, bCol, cRow, cCol, batchOffsets, batches, a, b, c, alpha, beta);
    return;
  }
  if (rows && k == 1) {
    // An outer product's rows: one scaled copy of b's row each.
    outerProducts(m, n, aRow, cRow, transposed ? 1 : 0, batchOffsets, batches, transposed ? b : a,
                  transposed ? a : b, c, alpha, beta);
    return;
  }
  if (rows && rowSums(m, n, k, aRow, aCol, bRow, cRow, transposed ? 1 : 0, batchOffsets, batches,
                      transposed ? b : a, transposed ? a : b, c, alpha, beta))
    return;
  for (int64_t batch = 0; batch < batches; ++batch) {
    const float* A = (transposed ? b : a) + batchOffsets[3 * batch + (transposed ? 1 : 0)];
    const float* B = (transposed ? a : b) + batchOffsets[3 * batch + (transposed ? 0 : 1)];
    float* C = c + batchOffsets[3 * batch + 2];
    for (int64_t i = 0; i < m; ++i) {
      if (rows) {
        // 16 columns at a time in an accumulator of fixed width, which stays in registers (a
        // loop over a runtime n reloading the row from memory per term ran 6x slower).
        for (int64_t j0 = 0; j0 < n; j0 += 16) {
          int64_t width = std::min<int64_t>(16, n - j0);
          float acc[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
          const float* column = B + j0;
          if (width == 16) {
            for (int64_t kk = 0; kk < k; ++kk) {
              float scale = A[i * aRow + kk * aCol];
              const float* next = column + kk * bRow;
              for (int j = 0; j < 16; ++j)
                acc[j] += scale * next[j];
            }
          } else {
            for (int64_t kk = 0; kk < k; ++kk) {
              float scale = A[i * aRow + kk * aCol];
              const float* next = column + kk * bRow;
              for (int64_t j = 0; j < width; ++j)
                acc[j] += scale * next[j];
            }
          }
          float* row = C + i * cRow + j0;
          if (beta == 0)
            for (int64_t j = 0; j < width; ++j)
              row[j] = alpha * acc[j];
          else
            for (int64_t j = 0; j < width; ++j)
              row[j] = alpha * acc[j] + beta * row[j];
        }
        continue;
      }
      for (int64_t j = 0; j < n; ++j) {
        float value = alpha * dot(A + i * aRow, aCol, B + j * bCol, bRow, k);
        float& target = C[i * cRow + j * cCol];
        target = beta == 0 ? value : value + beta * target;
      }
    }
  }
}

/// How many matrices the GEMM multiplies: the product of its batch dims' sizes.
int64_t matrixCount(const EinsumPlan::Gemm& gemm) {
  int64_t count = 1;
  for (int64_t size : gemm.batchSizes)
    count *= size;
  return count;
}

} // namespace

bool EinsumPlan::degenerateBatched() const {
  int64_t batch = matrixCount(gemm);
  return batch > 1 && std::min({gemm.c.rows, gemm.c.cols, gemm.a.cols}) == 1;
}

void EinsumPlan::runDegenerateBatched(const float* a, const float* b, float* c, float alpha,
                                      float beta) const {
  degenerateBatches(gemm.a, gemm.b, gemm.c, gemm.batchOffsets.data(),
                    int64_t(gemm.batchOffsets.size() / 3), a, b, c, alpha, beta);
}

EinsumPlan::EinsumPlan(EinsumSpec spec) : spec_(std::move(spec)) {
  if (spec_.operands.empty()) throw std::invalid_argument("einsum: no operands");
  size_t idCount = spec_.sizes.size();
  for (int64_t size : spec_.sizes)
    if (size < 0) throw std::invalid_argument("einsum: negative dim size");
  auto check = [&](const EinsumOperand& operand) {
    std::vector<bool> seen(idCount, false);
    std::vector<int64_t> shape;
    for (int id : operand.dims) {
      if (id < 0 || size_t(id) >= idCount)
        throw std::invalid_argument("einsum: dim id " + std::to_string(id) + " has no size");
      if (seen[size_t(id)])
        throw std::invalid_argument("einsum: dim id " + std::to_string(id) + " appears twice");
      seen[size_t(id)] = true;
      shape.push_back(spec_.sizes[size_t(id)]);
    }
    if (operand.strides.empty()) return denseStrides(shape);
    if (operand.strides.size() != operand.dims.size())
      throw std::invalid_argument("einsum: strides do not match dims");
    return operand.strides;
  };
  for (const EinsumOperand& operand : spec_.operands)
    strides.push_back(check(operand));
  strides.push_back(check(spec_.out));
  size_t operandCount = spec_.operands.size();
  if (operandCount == 1) {
    planReduce();
  } else if (operandCount == 2) {
    planPresum();
    if (!main && !GemmBuilder(spec_, strides).build(gemm)) gemm = Gemm{};
    if (gemm.enabled)
      gemm.smallBatches = detail::smallGemmBatched(matrixCount(gemm), gemm.b, gemm.c.rows,
                                                   gemm.c.cols, gemm.a.cols);
    if (gemm.enabled && (degenerateBatched() || gemm.smallBatches)) {
      // Each batch's offsets into a, b and c, once: built per call they cost about 35 ns a
      // batch (performer's 512 batches: 18 us of a 49 us outer product).
      forEachIndex<3>(
          toDims(gemm.batchSizes),
          {toDims(gemm.a.batchStrides), toDims(gemm.b.batchStrides), toDims(gemm.c.batchStrides)},
          [&](int64_t aBase, int64_t bBase, int64_t cBase) {
            gemm.batchOffsets.insert(gemm.batchOffsets.end(), {aBase, bBase, cBase});
          });
    }
  }
}

void EinsumPlan::planReduce() {
  // The operand must be dense and hold every output dim of size > 1.
  const EinsumOperand& in = spec_.operands[0];
  std::vector<int64_t> shape;
  for (int id : in.dims)
    shape.push_back(spec_.sizes[size_t(id)]);
  if (strides[0] != denseStrides(shape)) return;
  std::vector<int> inPositions = positionsOf(in, spec_.sizes.size());
  std::vector<int64_t> outShape;
  for (int id : spec_.out.dims) {
    if (inPositions[size_t(id)] < 0 && spec_.sizes[size_t(id)] != 1) return;
    outShape.push_back(spec_.sizes[size_t(id)]);
  }
  if (in.dims.size() > size_t(kMaxRank)) return;
  // Strides of the dense scratch result (over the output's dims) seen from the input's dims.
  Strides outDense = denseStrides(outShape);
  std::vector<int> outPositions = positionsOf(spec_.out, spec_.sizes.size());
  reduceOutStrides.assign(in.dims.size(), 0);
  for (size_t d = 0; d < in.dims.size(); ++d)
    if (int position = outPositions[size_t(in.dims[d])]; position >= 0)
      reduceOutStrides[d] = outDense[size_t(position)];
  reduceShape = shape;
  singleReduce = true;
}

void EinsumPlan::planPresum() {
  size_t idCount = spec_.sizes.size();
  std::vector<int> outPositions = positionsOf(spec_.out, idCount);
  EinsumSpec mainSpec = spec_;
  presum.assign(2, nullptr);
  presumCounts.assign(2, 0);
  bool any = false;
  for (size_t k = 0; k < 2; ++k) {
    std::vector<int> other = positionsOf(spec_.operands[1 - k], idCount);
    EinsumOperand kept;
    int64_t count = 1;
    for (int id : spec_.operands[k].dims) {
      bool lonely = outPositions[size_t(id)] < 0 && other[size_t(id)] < 0;
      if (lonely && spec_.sizes[size_t(id)] != 1) continue;
      kept.dims.push_back(id);
      count *= spec_.sizes[size_t(id)];
    }
    if (kept.dims.size() == spec_.operands[k].dims.size()) continue;
    EinsumSpec sumSpec{spec_.sizes, {spec_.operands[k]}, kept};
    presum[k] = std::make_shared<const EinsumPlan>(std::move(sumSpec));
    presumCounts[k] = count;
    mainSpec.operands[k] = kept;
    any = true;
  }
  if (any) main = std::make_shared<const EinsumPlan>(std::move(mainSpec));
}

std::string EinsumPlan::describe() const {
  if (singleReduce) return "reduce";
  if (main) {
    std::string text = "presum(";
    text += presum[0] ? (presum[1] ? "a, b" : "a") : "b";
    return text + ") + " + main->describe();
  }
  if (!gemm.enabled) return "generic";
  int64_t batch = matrixCount(gemm);
  std::string text = "gemm batch=" + std::to_string(batch) + " m=" + std::to_string(gemm.c.rows) +
                     " n=" + std::to_string(gemm.c.cols) + " k=" + std::to_string(gemm.a.cols) +
                     " a=" + (gemm.a.transpose ? "T" : "N") +
                     " b=" + (gemm.b.transpose ? "T" : "N");
  if (gemm.swapped) text += " swapped";
  if (gemm.a.pack) text += gemm.swapped ? " pack-b" : " pack-a";
  if (gemm.b.pack) text += gemm.swapped ? " pack-a" : " pack-b";
  if (gemm.c.pack) text += " pack-out";
  if (degenerateBatched()) text += " loops";
  if (gemm.smallBatches) text += " small loops";
  return text;
}

std::string EinsumPlan::gemmImplementation() const {
  if (main) return main->gemmImplementation();
  if (!gemm.enabled) return std::string();
  return gemm.smallBatches ? "small loops" : gemm.library->describe();
}

void EinsumPlan::run(const float* a, const float* b, float* out, float alpha, float beta) const {
  const float* operands[2] = {a, b};
  run(operands, out, alpha, beta);
}

void EinsumPlan::runBiasActivation(const float* a, const float* b, const float* bias, float* out,
                                   bool gelu) const {
  if (!spec_.out.strides.empty() || spec_.out.dims.empty())
    throw std::invalid_argument(
        "EinsumPlan::runBiasActivation: the output must be dense, with dims");
  int lastDim = spec_.out.dims.back();
  // One matmul writing `out` itself, its columns the last dim alone (unit stride).
  if (gemm.enabled && !gemm.swapped && !gemm.a.pack && !gemm.b.pack && !gemm.c.pack &&
      !gemm.c.transpose && gemm.c.colDims == std::vector<int>{lastDim} &&
      gemm.library->runBiasActivation(a, b, bias, out, gelu))
    return;
  run(a, b, out);
  int64_t total = 1;
  for (int id : spec_.out.dims)
    total *= spec_.sizes[size_t(id)];
  detail::addBiasActivation(out, total, spec_.sizes[size_t(lastDim)], bias, gelu);
}

void EinsumPlan::run(const float* const* operands, float* out, float alpha, float beta) const {
  if (gemm.enabled)
    runGemm(operands[0], operands[1], out, alpha, beta);
  else if (singleReduce)
    runReduce(operands[0], out, alpha, beta);
  else if (main)
    runPresummed(operands, out, alpha, beta);
  else
    runGeneric(operands, out, alpha, beta);
}

void EinsumPlan::runReduce(const float* in, float* out, float alpha, float beta) const {
  thread_local std::vector<float> scratch;
  Dims shape = toDims(reduceShape);
  std::vector<int64_t> outShape;
  for (int id : spec_.out.dims)
    outShape.push_back(spec_.sizes[size_t(id)]);
  Dims outDims = toDims(outShape);
  scratch.resize(size_t(outDims.product()));
  const float* sums = scratch.data();
  reduceStrided(ReduceKind::Sum, in, shape, toDims(reduceOutStrides), scratch.data());
  Dims outStrides = toDims(strides.back()), dense = rowMajorStrides(outDims);
  if (beta != 0)
    forEachIndex<2>(outDims, {outStrides, dense},
                    [&](int64_t o, int64_t i) { out[o] = alpha * sums[i] + beta * out[o]; });
  else
    forEachIndex<2>(outDims, {outStrides, dense},
                    [&](int64_t o, int64_t i) { out[o] = alpha * sums[i]; });
}

void EinsumPlan::runPresummed(const float* const* operands, float* out, float alpha,
                              float beta) const {
  thread_local std::vector<float> summed[2];
  const float* reduced[2] = {operands[0], operands[1]};
  for (size_t k = 0; k < 2; ++k) {
    if (!presum[k]) continue;
    summed[k].resize(size_t(presumCounts[k]));
    presum[k]->run(&operands[k], summed[k].data());
    reduced[k] = summed[k].data();
  }
  main->run(reduced, out, alpha, beta);
}

void EinsumPlan::runGemm(const float* a, const float* b, float* out, float alpha,
                         float beta) const {
  const Matrix &ma = gemm.a, &mb = gemm.b, &mc = gemm.c;
  int64_t batch = matrixCount(gemm);
  int64_t m = mc.rows, n = mc.cols, k = ma.cols;
  if (batch == 0 || m == 0 || n == 0) return;
  // The output's own walk (for an empty K and for scattering a packed result).
  Dims outShape = toDims(mc.fullShape), outStrides = toDims(mc.fullStrides);
  if (k == 0) {
    if (beta == 0)
      forEachIndex<1>(outShape, {outStrides}, [&](int64_t o) { out[o] = 0; });
    else if (beta != 1)
      forEachIndex<1>(outShape, {outStrides}, [&](int64_t o) { out[o] *= beta; });
    return;
  }
  const float* first = gemm.swapped ? b : a;
  const float* second = gemm.swapped ? a : b;
  thread_local std::vector<float> packedA, packedB, packedC;
  if (ma.pack) {
    pack(first, ma, packedA);
    first = packedA.data();
  }
  if (mb.pack) {
    pack(second, mb, packedB);
    second = packedB.data();
  }
  // Batches of outer products, GEMVs or dot products: a library call per batch costs more than
  // the arithmetic (oneDNN's batched matmul took 0.2-0.4 us per batch of performer's FAVOR+
  // einsums, 7-30x the loops below).
  // Batches of small matrices likewise (SmallGemm.h).
  auto multiply = [&](float* c, float cBeta) {
    int64_t batches = int64_t(gemm.batchOffsets.size() / 3);
    if (degenerateBatched())
      runDegenerateBatched(first, second, c, alpha, cBeta);
    else if (gemm.smallBatches)
      detail::smallGemmBatches(ma, mb, mc, gemm.batchOffsets.data(), batches, first, second, c,
                               alpha, cBeta);
    else
      gemm.library->run(first, second, c, alpha, cBeta);
  };
  if (!mc.pack) {
    multiply(out, beta);
    return;
  }
  packedC.resize(size_t(batch * m * n));
  multiply(packedC.data(), 0.0f);
  const float* packed = packedC.data();
  Dims dense = rowMajorStrides(outShape);
  if (beta != 0)
    forEachIndex<2>(outShape, {outStrides, dense},
                    [&](int64_t o, int64_t i) { out[o] = packed[i] + beta * out[o]; });
  else
    forEachIndex<2>(outShape, {outStrides, dense},
                    [&](int64_t o, int64_t i) { out[o] = packed[i]; });
}

void EinsumPlan::runGeneric(const float* const* operands, float* out, float alpha,
                            float beta) const {
  size_t operandCount = spec_.operands.size();
  size_t idCount = spec_.sizes.size();
  // The space: the output's dims, then every contracted dim in order of first appearance.
  std::vector<int> space = spec_.out.dims;
  std::vector<bool> inSpace(idCount, false);
  for (int id : space)
    inSpace[size_t(id)] = true;
  for (const EinsumOperand& operand : spec_.operands)
    for (int id : operand.dims)
      if (!inSpace[size_t(id)]) {
        inSpace[size_t(id)] = true;
        space.push_back(id);
      }
  size_t rank = space.size();
  std::vector<int64_t> sizes(rank);
  for (size_t d = 0; d < rank; ++d)
    sizes[d] = spec_.sizes[size_t(space[d])];
  // Strides over the space: operands, then the dense accumulator (0 on contracted dims).
  std::vector<Strides> walk(operandCount + 1);
  for (Strides& tensorWalk : walk)
    tensorWalk.assign(rank, 0);
  for (size_t t = 0; t < operandCount; ++t) {
    std::vector<int> positions = positionsOf(spec_.operands[t], idCount);
    for (size_t d = 0; d < rank; ++d)
      if (positions[size_t(space[d])] >= 0) walk[t][d] = strides[t][size_t(positions[space[d]])];
  }
  size_t outRank = spec_.out.dims.size();
  std::vector<int64_t> outShape(sizes.begin(), sizes.begin() + long(outRank));
  Strides dense = denseStrides(outShape);
  for (size_t d = 0; d < outRank; ++d)
    walk[operandCount][d] = dense[d];
  int64_t outCount = 1, total = 1;
  for (int64_t size : outShape)
    outCount *= size;
  for (int64_t size : sizes)
    total *= size;
  std::vector<double> sums(size_t(outCount), 0.0);
  if (total > 0) {
    std::vector<int64_t> counter(rank, 0), offset(operandCount + 1, 0);
    for (int64_t point = 0; point < total; ++point) {
      double product = 1;
      for (size_t t = 0; t < operandCount; ++t)
        product *= double(operands[t][offset[t]]);
      sums[size_t(offset[operandCount])] += product;
      for (size_t d = rank; d-- > 0;) {
        for (size_t t = 0; t <= operandCount; ++t)
          offset[t] += walk[t][d];
        if (++counter[d] < sizes[d]) break;
        for (size_t t = 0; t <= operandCount; ++t)
          offset[t] -= walk[t][d] * sizes[d];
        counter[d] = 0;
      }
    }
  }
  const double* result = sums.data();
  Dims shape = toDims(outShape);
  Dims outStrides = toDims(strides.back());
  if (beta != 0)
    forEachIndex<2>(shape, {outStrides, rowMajorStrides(shape)}, [&](int64_t o, int64_t i) {
      out[o] = float(double(beta) * double(out[o]) + double(alpha) * result[i]);
    });
  else
    forEachIndex<2>(shape, {outStrides, rowMajorStrides(shape)},
                    [&](int64_t o, int64_t i) { out[o] = float(double(alpha) * result[i]); });
}

void einsum(const float* a, const float* b, float* out, const EinsumSpec& spec, float alpha,
            float beta) {
  EinsumPlan(spec).run(a, b, out, alpha, beta);
}

void einsum(std::initializer_list<const float*> operands, float* out, const EinsumSpec& spec,
            float alpha, float beta) {
  std::vector<const float*> pointers(operands);
  EinsumPlan(spec).run(pointers.data(), out, alpha, beta);
}

} // namespace meshrt::kernels
