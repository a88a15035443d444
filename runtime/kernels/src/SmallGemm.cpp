// Batches of small GEMMs in f32 loops (SmallGemm.h).
#include "SmallGemm.h"

#include "VectorClones.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace meshrt::kernels::detail {
namespace {

/// The columns of a tile: one AVX-512 vector, two AVX2 ones.
constexpr int64_t kTileCols = 16;
/// The most multiply-adds a matrix for which smallGemmBatches beats oneDNN's batched matmul
/// here (bench/kernels.cpp's batched rows, bench/README.md "Kernels": 2.1-2.7x at 32 x 32 x 64,
/// 0.95-1.4x at 48^3, 0.9x at 96 x 96 x 8).
constexpr int64_t kSmallGemmTerms = 32 * 32 * 64;

/// 16 floats: one AVX-512 register, two AVX2 ones, four SSE ones (GCC's generic vectors
/// follow each clone's target; the plain loops over 16 floats were not vectorized).
using Lanes = float __attribute__((vector_size(kTileCols * sizeof(float))));

/// Rows [i, i + kRows) by columns [j, j + kTileCols) of c: their sums over k in registers
/// (kRows independent accumulators, enough to cover the FMA latency), then stored with alpha
/// and beta for the `width` columns that exist. `panel` holds b's row kk at panel + kk * ld.
template <int kRows>
[[gnu::always_inline]] inline void tile(int64_t k, const float* A, int64_t aRow, int64_t aCol,
                                        const float* panel, int64_t ld, float* C, int64_t cRow,
                                        int64_t cCol, int64_t width, float alpha, float beta) {
  Lanes acc[kRows] = {};
  for (int64_t kk = 0; kk < k; ++kk) {
    Lanes row;
    std::memcpy(&row, panel + kk * ld, sizeof row);
    for (int r = 0; r < kRows; ++r)
      acc[r] += A[r * aRow + kk * aCol] * row;
  }
  for (int r = 0; r < kRows; ++r) {
    float* out = C + r * cRow;
    Lanes result = alpha * acc[r];
    if (width == kTileCols && cCol == 1) {
      if (beta != 0) {
        Lanes old;
        std::memcpy(&old, out, sizeof old);
        result += beta * old;
      }
      std::memcpy(out, &result, sizeof result);
      continue;
    }
    for (int64_t j = 0; j < width; ++j) {
      float& target = out[j * cCol];
      target = beta == 0 ? result[j] : result[j] + beta * target;
    }
  }
}

/// One matrix: c = alpha a . b + beta c, b's rows read from `panel` (ld apart, each at least
/// kTileCols wide past every tile's start).
MESHRT_VECTOR_CLONES
void matrix(int64_t m, int64_t n, int64_t k, const float* A, int64_t aRow, int64_t aCol,
            const float* panel, int64_t ld, float* C, int64_t cRow, int64_t cCol, float alpha,
            float beta) {
  for (int64_t j = 0; j < n; j += kTileCols) {
    int64_t width = std::min(kTileCols, n - j);
    const float* columns = panel + j;
    float* out = C + j * cCol;
    int64_t i = 0;
    for (; i + 4 <= m; i += 4)
      tile<4>(k, A + i * aRow, aRow, aCol, columns, ld, out + i * cRow, cRow, cCol, width, alpha,
              beta);
    switch (m - i) {
    case 3:
      tile<3>(k, A + i * aRow, aRow, aCol, columns, ld, out + i * cRow, cRow, cCol, width, alpha,
              beta);
      break;
    case 2:
      tile<2>(k, A + i * aRow, aRow, aCol, columns, ld, out + i * cRow, cRow, cCol, width, alpha,
              beta);
      break;
    case 1:
      tile<1>(k, A + i * aRow, aRow, aCol, columns, ld, out + i * cRow, cRow, cCol, width, alpha,
              beta);
      break;
    default:
      break;
    }
  }
}

/// Whether b itself serves as the panel: dense rows of whole tiles. Rows further apart are
/// copied: attention's values v[t, h, e] put them h * e floats apart, a multiple of 4 KiB that
/// maps every row to one L1 set (32 x 64 x 32 matrices ran at 0.6x the library in place).
bool panelInPlace(const EinsumPlan::Matrix& mb) {
  return mb.colStride == 1 && mb.rowStride == mb.cols && mb.cols % kTileCols == 0;
}

/// b (k x n, walked by rowStride and colStride) into the panel's first n columns, ld apart:
/// read along whichever of b's strides is 1 (a transposed b, attention's keys, reads its
/// columns: writing strided into the small panel costs less than reading strided).
MESHRT_VECTOR_CLONES
void copyPanel(int64_t k, int64_t n, const float* B, int64_t rowStride, int64_t colStride,
               float* panel, int64_t ld) {
  if (rowStride == 1 && colStride != 1) {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t kk = 0; kk < k; ++kk)
        panel[kk * ld + j] = B[j * colStride + kk];
    return;
  }
  for (int64_t kk = 0; kk < k; ++kk)
    for (int64_t j = 0; j < n; ++j)
      panel[kk * ld + j] = B[kk * rowStride + j * colStride];
}

std::atomic<bool>& loopsChoice() {
  static std::atomic<bool> choice{[] {
    const char* text = std::getenv("MESHRT_SMALL_GEMM");
    return !(text && std::string(text) == "0");
  }()};
  return choice;
}

} // namespace

bool smallGemmBatched(int64_t batches, const EinsumPlan::Matrix& mb, int64_t m, int64_t n,
                      int64_t k) {
  if (!smallGemmLoops()) return false;
  // A copied panel (k x n) serves m rows: with fewer than k / 16 of them the copy costs more
  // than the library's setup (2 x 16 x 48 matrices, transposed b: 0.29 us against 0.23).
  return batches > 1 && std::min({m, n, k}) > 1 && m * n * k <= kSmallGemmTerms &&
         (panelInPlace(mb) || k <= kTileCols * m);
}

void smallGemmBatches(const EinsumPlan::Matrix& ma, const EinsumPlan::Matrix& mb,
                      const EinsumPlan::Matrix& mc, const int64_t* batchOffsets, int64_t batches,
                      const float* a, const float* b, float* c, float alpha, float beta) {
  int64_t m = mc.rows, n = mc.cols, k = ma.cols;
  // b itself when dense in whole tiles (panelInPlace); otherwise copied into a panel of k rows
  // padded with zeros to whole tiles.
  bool inPlace = panelInPlace(mb);
  int64_t ld = inPlace ? mb.rowStride : (n + kTileCols - 1) / kTileCols * kTileCols;
  thread_local std::vector<float> panel;
  if (!inPlace) {
    // Each copy writes the first n columns of every row; the padding past them is zeroed once
    // a call (never stored to c, but read into the tiles' lanes).
    panel.resize(size_t(k * ld));
    for (int64_t kk = 0; kk < k && ld > n; ++kk)
      std::fill(panel.begin() + kk * ld + n, panel.begin() + (kk + 1) * ld, 0.0f);
  }
  for (int64_t batch = 0; batch < batches; ++batch) {
    const float* A = a + batchOffsets[3 * batch];
    const float* B = b + batchOffsets[3 * batch + 1];
    float* C = c + batchOffsets[3 * batch + 2];
    if (!inPlace) {
      copyPanel(k, n, B, mb.rowStride, mb.colStride, panel.data(), ld);
      B = panel.data();
    }
    matrix(m, n, k, A, ma.rowStride, ma.colStride, B, ld, C, mc.rowStride, mc.colStride, alpha,
           beta);
  }
}

} // namespace meshrt::kernels::detail

namespace meshrt::kernels {

void setSmallGemmLoops(bool loops) {
  detail::loopsChoice().store(loops);
}

bool smallGemmLoops() {
  return detail::loopsChoice().load();
}

int64_t smallGemmMaxTerms() {
  return smallGemmLoops() ? detail::kSmallGemmTerms : 0;
}

} // namespace meshrt::kernels
