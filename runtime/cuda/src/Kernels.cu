// meshrt_cuda's kernels: reductions, softmax / log_softmax, layer_norm and cumsum per lane
// (bodies in RowMath.h), the in-op collectives of split lanes, einsum through cuBLAS and a
// generic einsum kernel, fills and dtype rounding.
//
// Lane kernels run one thread per lane (rows are independent; a lane is read in order so that
// the sums are the CPU kernels' sums, in the same order). Tensors of this code's scale have
// many lanes of modest length; a block-per-lane variant for long lanes is future work.
#include "meshrt/cuda/Cuda.h"
#include "meshrt/kernels/Scalar.h"
#include "meshrt/kernels/SoftmaxStats.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <stdexcept>

namespace meshrt::cuda {
namespace {

constexpr int kThreads = 256;

int blocksFor(int64_t count) {
  return int(std::min<int64_t>((count + kThreads - 1) / kThreads, 65535 * 8));
}

#define MESHRT_GRID_LOOP(i, count)                                                                 \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (count);                    \
       i += int64_t(gridDim.x) * blockDim.x)

void launched(const char* what) {
  check(cudaGetLastError(), what);
}

__global__ void reduceKernel(float* out, const float* in, const int64_t* inBase,
                             const int64_t* outBase, int64_t rows, const int64_t* offsets,
                             int64_t count, row::ReduceKind kind, double scale) {
  MESHRT_GRID_LOOP(r, rows) {
    out[outBase[r]] = row::reduceLane(in + inBase[r], offsets, count, kind, scale);
  }
}

__global__ void maxKernel(float* maxima, const float* in, const int64_t* inBase, int64_t rows,
                          const int64_t* offsets, int64_t count) {
  MESHRT_GRID_LOOP(r, rows) {
    maxima[r] = row::laneMax(in + inBase[r], offsets, count);
  }
}

__global__ void sumExpKernel(double* sums, const float* maxima, const float* in,
                             const int64_t* inBase, int64_t rows, const int64_t* offsets,
                             int64_t count) {
  MESHRT_GRID_LOOP(r, rows) {
    sums[r] = row::laneSumExp(in + inBase[r], offsets, count, row::softmaxShift(maxima[r]));
  }
}

__global__ void packSoftmaxStatsKernel(double* stats, const float* maxima, const double* sums,
                                       int64_t rows) {
  MESHRT_GRID_LOOP(r, rows) {
    stats[2 * r] = maxima[r];
    stats[2 * r + 1] = sums[r];
  }
}

/// The lane's max and its sum of exp(x - shift(max)) from the ranks' gathered pairs; softmaxLane
/// then recomputes each exponential against the lane's max (no rescale needed).
__global__ void combineSoftmaxStatsKernel(float* maxima, double* sums, const double* gathered,
                                          int64_t rows, int64_t ranks, int64_t self) {
  MESHRT_GRID_LOOP(r, rows) {
    double rescale = 1;
    meshrt::kernels::combineSoftmaxStatistics(gathered + 2 * r, 2 * rows, ranks, self, &maxima[r],
                                              &sums[r], &rescale);
  }
}

__global__ void softmaxKernel(float* out, const float* in, const int64_t* inBase,
                              const int64_t* outBase, int64_t rows, const int64_t* inOffsets,
                              const int64_t* outOffsets, int64_t count, const float* maxima,
                              const double* sums, bool logSoftmax) {
  MESHRT_GRID_LOOP(r, rows) {
    row::softmaxLane(out + outBase[r], outOffsets, in + inBase[r], inOffsets, count, maxima[r],
                     sums[r], logSoftmax);
  }
}

__global__ void layerNormKernel(float* out, const float* in, const int64_t* inBase,
                                const int64_t* outBase, int64_t rows, const int64_t* inOffsets,
                                const int64_t* outOffsets, int64_t count, double globalCount,
                                double eps) {
  MESHRT_GRID_LOOP(r, rows) {
    row::layerNormLane(out + outBase[r], outOffsets, in + inBase[r], inOffsets, count, globalCount,
                       eps);
  }
}

__global__ void momentsKernel(double* moments, const float* in, const int64_t* inBase, int64_t rows,
                              const int64_t* offsets, int64_t count) {
  MESHRT_GRID_LOOP(r, rows) {
    row::laneMoments(in + inBase[r], offsets, count, &moments[2 * r], &moments[2 * r + 1]);
  }
}

__global__ void layerNormFromMomentsKernel(float* out, const float* in, const int64_t* inBase,
                                           const int64_t* outBase, int64_t rows,
                                           const int64_t* inOffsets, const int64_t* outOffsets,
                                           int64_t count, const double* moments, double globalCount,
                                           double eps) {
  MESHRT_GRID_LOOP(r, rows) {
    row::layerNormLaneFromMoments(out + outBase[r], outOffsets, in + inBase[r], inOffsets, count,
                                  moments[2 * r], moments[2 * r + 1], globalCount, eps);
  }
}

__global__ void totalKernel(double* totals, const float* in, const int64_t* inBase, int64_t rows,
                            const int64_t* offsets, int64_t count) {
  MESHRT_GRID_LOOP(r, rows) {
    totals[r] = row::laneTotal(in + inBase[r], offsets, count);
  }
}

/// carry[r] = sum of the totals of the group ranks before `rank` (all: ranks x rows).
__global__ void carryKernel(double* carry, const double* all, int64_t rows, int rank) {
  MESHRT_GRID_LOOP(r, rows) {
    double sum = 0;
    for (int peer = 0; peer < rank; ++peer)
      sum += all[peer * rows + r];
    carry[r] = sum;
  }
}

__global__ void cumsumKernel(float* out, const float* in, const int64_t* inBase,
                             const int64_t* outBase, int64_t rows, const int64_t* inOffsets,
                             const int64_t* outOffsets, int64_t count, const double* carry,
                             bool exclusive) {
  MESHRT_GRID_LOOP(r, rows) {
    row::cumsumLane(out + outBase[r], outOffsets, in + inBase[r], inOffsets, count,
                    carry ? carry[r] : 0.0, exclusive);
  }
}

__global__ void sumExpAtKernel(double* sums, const float* local, const float* maxima,
                               int64_t count) {
  MESHRT_GRID_LOOP(i, count) {
    sums[i] = exp(double(local[i]) - row::softmaxShift(maxima[i]));
  }
}

__global__ void combineKernel(float* local, const float* maxima, const double* sums,
                              int64_t count) {
  MESHRT_GRID_LOOP(i, count) {
    local[i] = row::combineLogSumExp(maxima[i], sums[i]);
  }
}

__global__ void fillKernel(float* data, int64_t count, float value) {
  MESHRT_GRID_LOOP(i, count) {
    data[i] = value;
  }
}

__global__ void roundKernel(float* data, int64_t count, bool bf16) {
  MESHRT_GRID_LOOP(i, count) {
    data[i] = bf16 ? meshrt::kernels::roundBF16(data[i]) : meshrt::kernels::roundF16(data[i]);
  }
}

/// A box of up to 12 dims walked row-major, with one stride set: out[linear] <-> in[offset].
struct Box {
  int rank = 0;
  int64_t sizes[12] = {};
  int64_t strides[12] = {};
  int64_t count = 1;
};

Box makeBox(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  if (sizes.size() > 12) throw std::length_error("meshrt::cuda: rank > 12");
  Box box;
  box.rank = int(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    box.sizes[i] = sizes[i];
    box.strides[i] = strides[i];
    box.count *= sizes[i];
  }
  return box;
}

__device__ int64_t boxOffset(const Box& box, int64_t linear) {
  int64_t offset = 0;
  for (int d = box.rank - 1; d >= 0; --d) {
    int64_t size = box.sizes[d];
    offset += (linear % size) * box.strides[d];
    linear /= size;
  }
  return offset;
}

/// Packs `in` (through the box's strides, plus `batchOffsets[b]`) into dense row-major `out`,
/// converting to T; one dense block of box.count per batch.
template <class T>
__global__ void packKernel(T* out, const float* in, Box box, const int64_t* batchOffsets,
                           int64_t batches) {
  MESHRT_GRID_LOOP(i, box.count * batches) {
    int64_t b = i / box.count, linear = i % box.count;
    out[i] = T(in[batchOffsets[b] + boxOffset(box, linear)]);
  }
}

template <class T>
__global__ void unpackKernel(float* out, const T* in, Box box, const int64_t* batchOffsets,
                             int64_t batches) {
  MESHRT_GRID_LOOP(i, box.count * batches) {
    int64_t b = i / box.count, linear = i % box.count;
    out[batchOffsets[b] + boxOffset(box, linear)] = float(in[i]);
  }
}

constexpr int kMaxOperands = 8;
struct GenericEinsum {
  int operands = 0;
  const float* data[kMaxOperands] = {};
  Box outer[kMaxOperands]; // each operand's strides over the output box
  const int64_t* inner[kMaxOperands] = {};
  int64_t innerCount = 0;
  Box out; // the output box, dense row-major
};

__global__ void einsumGenericKernel(float* out, GenericEinsum e) {
  MESHRT_GRID_LOOP(i, e.out.count) {
    int64_t base[kMaxOperands];
    for (int k = 0; k < e.operands; ++k)
      base[k] = boxOffset(e.outer[k], i);
    double sum = 0;
    for (int64_t j = 0; j < e.innerCount; ++j) {
      double term = 1;
      for (int k = 0; k < e.operands; ++k)
        term *= double(e.data[k][base[k] + e.inner[k][j]]);
      sum += term;
    }
    out[i] = float(sum);
  }
}

int64_t product(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes)
    n *= s;
  return n;
}

std::vector<int64_t> rowMajor(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= sizes[i];
  }
  return strides;
}

/// Every offset of the box `sizes` through `strides`, row-major (host).
std::vector<int64_t> offsetsOf(const std::vector<int64_t>& sizes,
                               const std::vector<int64_t>& strides) {
  std::vector<int64_t> offsets{0};
  for (size_t d = 0; d < sizes.size(); ++d) {
    std::vector<int64_t> next;
    next.reserve(offsets.size() * size_t(std::max<int64_t>(sizes[d], 0)));
    for (int64_t offset : offsets)
      for (int64_t i = 0; i < sizes[d]; ++i)
        next.push_back(offset + i * strides[d]);
    offsets = std::move(next);
  }
  return offsets;
}

std::vector<int64_t> concat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// Whether a group of dims is one run of stride `unit` (as meshc::gen::detail::flatStride).
bool flatStride(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                int64_t& unit) {
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
  if (expect < 0) unit = 1;
  return true;
}

/// The device copies of a Lanes' four tables.
struct LaneTables {
  Scratch scratch;
  const int64_t *inBase, *outBase, *inOffsets, *outOffsets;
  int64_t rows, count;
  explicit LaneTables(const Lanes& lanes)
      : scratch((lanes.inBase.size() + lanes.outBase.size() + lanes.inOffsets.size() +
                 lanes.outOffsets.size()) *
                sizeof(int64_t)),
        rows(int64_t(lanes.inBase.size())), count(int64_t(lanes.inOffsets.size())) {
    size_t at = 0;
    inBase = upload(scratch, lanes.inBase, at);
    at += lanes.inBase.size();
    outBase = upload(scratch, lanes.outBase, at);
    at += lanes.outBase.size();
    inOffsets = upload(scratch, lanes.inOffsets, at);
    at += lanes.inOffsets.size();
    outOffsets = upload(scratch, lanes.outOffsets, at);
  }
};

} // namespace

void reduce(float* out, const float* in, const Lanes& lanes, row::ReduceKind kind, double scale) {
  LaneTables t(lanes);
  if (t.rows == 0) return;
  reduceKernel<<<blocksFor(t.rows), kThreads, 0, current().stream>>>(
      out, in, t.inBase, t.outBase, t.rows, t.inOffsets, t.count, kind, scale);
  launched("reduce kernel");
}

void along(float* out, const float* in, const Lanes& lanes, AlongKind kind, double eps,
           int64_t globalLaneCount, meshrt::Communicator* group) {
  LaneTables t(lanes);
  if (t.rows == 0) return;
  cudaStream_t stream = current().stream;
  int blocks = blocksFor(t.rows);
  size_t rows = size_t(t.rows);
  switch (kind) {
  case AlongKind::Softmax:
  case AlongKind::LogSoftmax: {
    Scratch maxima(rows * sizeof(float)), sums(rows * sizeof(double));
    maxKernel<<<blocks, kThreads, 0, stream>>>(maxima.as<float>(), in, t.inBase, t.rows,
                                               t.inOffsets, t.count);
    launched("softmax max kernel");
    sumExpKernel<<<blocks, kThreads, 0, stream>>>(sums.as<double>(), maxima.as<float>(), in,
                                                  t.inBase, t.rows, t.inOffsets, t.count);
    launched("softmax sum kernel");
    if (group) {
      // One all-gather of every rank's (max, sum) pairs, combined alike on every rank
      // (meshrt/kernels/SoftmaxStats.h); the CPU kernel does the same.
      size_t ranks = size_t(group->size());
      Scratch stats(2 * rows * sizeof(double)), all(ranks * 2 * rows * sizeof(double));
      packSoftmaxStatsKernel<<<blocks, kThreads, 0, stream>>>(
          stats.as<double>(), maxima.as<float>(), sums.as<double>(), t.rows);
      launched("softmax statistics pack kernel");
      group->allGather(stats.as<double>(), all.as<double>(), 2 * rows);
      combineSoftmaxStatsKernel<<<blocks, kThreads, 0, stream>>>(
          maxima.as<float>(), sums.as<double>(), all.as<double>(), t.rows, int64_t(ranks),
          int64_t(group->rank()));
      launched("softmax statistics combine kernel");
    }
    softmaxKernel<<<blocks, kThreads, 0, stream>>>(
        out, in, t.inBase, t.outBase, t.rows, t.inOffsets, t.outOffsets, t.count,
        maxima.as<float>(), sums.as<double>(), kind == AlongKind::LogSoftmax);
    launched("softmax kernel");
    return;
  }
  case AlongKind::LayerNorm: {
    double count = double(globalLaneCount);
    if (!group) {
      layerNormKernel<<<blocks, kThreads, 0, stream>>>(
          out, in, t.inBase, t.outBase, t.rows, t.inOffsets, t.outOffsets, t.count, count, eps);
      launched("layer_norm kernel");
      return;
    }
    Scratch moments(2 * rows * sizeof(double));
    momentsKernel<<<blocks, kThreads, 0, stream>>>(moments.as<double>(), in, t.inBase, t.rows,
                                                   t.inOffsets, t.count);
    launched("layer_norm moments kernel");
    group->allReduce(moments.as<double>(), 2 * rows);
    layerNormFromMomentsKernel<<<blocks, kThreads, 0, stream>>>(
        out, in, t.inBase, t.outBase, t.rows, t.inOffsets, t.outOffsets, t.count,
        moments.as<double>(), count, eps);
    launched("layer_norm kernel");
    return;
  }
  case AlongKind::Cumsum:
  case AlongKind::CumsumExclusive: {
    bool exclusive = kind == AlongKind::CumsumExclusive;
    if (!group) {
      cumsumKernel<<<blocks, kThreads, 0, stream>>>(out, in, t.inBase, t.outBase, t.rows,
                                                    t.inOffsets, t.outOffsets, t.count, nullptr,
                                                    exclusive);
      launched("cumsum kernel");
      return;
    }
    size_t ranks = size_t(group->size());
    Scratch totals(rows * sizeof(double)), all(rows * ranks * sizeof(double)),
        carry(rows * sizeof(double));
    totalKernel<<<blocks, kThreads, 0, stream>>>(totals.as<double>(), in, t.inBase, t.rows,
                                                 t.inOffsets, t.count);
    launched("cumsum total kernel");
    group->allGather(totals.as<double>(), all.as<double>(), rows);
    carryKernel<<<blocks, kThreads, 0, stream>>>(carry.as<double>(), all.as<double>(), t.rows,
                                                 group->rank());
    launched("cumsum carry kernel");
    cumsumKernel<<<blocks, kThreads, 0, stream>>>(out, in, t.inBase, t.outBase, t.rows, t.inOffsets,
                                                  t.outOffsets, t.count, carry.as<double>(),
                                                  exclusive);
    launched("cumsum kernel");
    return;
  }
  }
}

void combineLogSumExp(float* local, size_t count, meshrt::Communicator& group) {
  if (count == 0) return;
  cudaStream_t stream = current().stream;
  Scratch maxima(count * sizeof(float)), sums(count * sizeof(double));
  check(
      cudaMemcpyAsync(maxima.get(), local, count * sizeof(float), cudaMemcpyDeviceToDevice, stream),
      "cudaMemcpyAsync (logsumexp)");
  group.allReduce(maxima.as<float>(), count, meshrt::ReduceOp::Max);
  sumExpAtKernel<<<blocksFor(int64_t(count)), kThreads, 0, stream>>>(
      sums.as<double>(), local, maxima.as<float>(), int64_t(count));
  launched("logsumexp kernel");
  group.allReduce(sums.as<double>(), count);
  combineKernel<<<blocksFor(int64_t(count)), kThreads, 0, stream>>>(
      local, maxima.as<float>(), sums.as<double>(), int64_t(count));
  launched("logsumexp combine kernel");
}

void fill(float* data, size_t count, float value) {
  if (count == 0) return;
  fillKernel<<<blocksFor(int64_t(count)), kThreads, 0, current().stream>>>(data, int64_t(count),
                                                                           value);
  launched("fill kernel");
}

void roundBufferBF16(float* data, size_t count) {
  if (count == 0) return;
  roundKernel<<<blocksFor(int64_t(count)), kThreads, 0, current().stream>>>(data, int64_t(count),
                                                                            true);
  launched("bf16 rounding kernel");
}

void roundBufferF16(float* data, size_t count) {
  if (count == 0) return;
  roundKernel<<<blocksFor(int64_t(count)), kThreads, 0, current().stream>>>(data, int64_t(count),
                                                                            false);
  launched("f16 rounding kernel");
}

void einsum2(float* out, const float* a, const float* b, const Gemm& d, bool accumulateInDouble) {
  const Context& context = current();
  cudaStream_t stream = context.stream;
  int64_t M = product(d.m), N = product(d.n), K = product(d.k), B = product(d.batch);
  if (M == 0 || N == 0 || B == 0) return;
  std::vector<int64_t> mk = concat(d.m, d.k), kn = concat(d.k, d.n), mn = concat(d.m, d.n);
  Box aBox = makeBox(mk, concat(d.aM, d.aK)), bBox = makeBox(kn, concat(d.bK, d.bN)),
      outBox = makeBox(mn, concat(d.outM, d.outN));
  std::vector<int64_t> aBatch = offsetsOf(d.batch, d.aBatch), bBatch = offsetsOf(d.batch, d.bBatch),
                       outBatch = offsetsOf(d.batch, d.outBatch);
  // fp32 in and out. An operand is used in place when its (m, k) / (k, n) dims are one
  // row-major matrix in either order and its batch dims one stride; else packed densely. The
  // precision mode is cuBLAS's compute type alone: TF32 and BF16 round the fp32 operands inside
  // the tensor-core GEMM (CUBLAS_COMPUTE_32F_FAST_TF32 / _16BF), so no mode packs an operand that
  // fp32 would read in place (packing both operands to bf16 first made the einsum up to 5.9x
  // slower than cuBLAS's GEMM on an H200).
  int64_t mUnit, kUnitA, kUnitB, nUnit, outMUnit, outNUnit, aStride, bStride, outStride;
  bool batchFlat = flatStride(d.batch, d.aBatch, aStride) &&
                   flatStride(d.batch, d.bBatch, bStride) &&
                   flatStride(d.batch, d.outBatch, outStride);
  bool aDirect =
      batchFlat && flatStride(d.m, d.aM, mUnit) && flatStride(d.k, d.aK, kUnitA) &&
      ((kUnitA == 1 && (M == 1 || mUnit >= K)) || (mUnit == 1 && (K == 1 || kUnitA >= M)));
  bool bDirect =
      batchFlat && flatStride(d.k, d.bK, kUnitB) && flatStride(d.n, d.bN, nUnit) &&
      ((nUnit == 1 && (K == 1 || kUnitB >= N)) || (kUnitB == 1 && (N == 1 || nUnit >= K)));
  bool outDirect = batchFlat && flatStride(d.m, d.outM, outMUnit) &&
                   flatStride(d.n, d.outN, outNUnit) && outNUnit == 1 && (M == 1 || outMUnit >= N);

  // The batch offset tables feed the pack and unpack kernels alone: a GEMM that reads and writes
  // everything in place uploads none (an allocation and a host-to-device copy per call).
  bool packs = K == 0 || accumulateInDouble || !(aDirect && bDirect && outDirect);
  Scratch batchTables(packs ? 3 * size_t(B) * sizeof(int64_t) : 0);
  const int64_t* aBatchDevice = packs ? upload(batchTables, aBatch, 0) : nullptr;
  const int64_t* bBatchDevice = packs ? upload(batchTables, bBatch, size_t(B)) : nullptr;
  const int64_t* outBatchDevice = packs ? upload(batchTables, outBatch, 2 * size_t(B)) : nullptr;
  cublasHandle_t handle = context.cublas();
  int blocksA = blocksFor(M * K * B), blocksB = blocksFor(K * N * B),
      blocksC = blocksFor(M * N * B);

  if (K == 0) {
    Scratch zeros(size_t(M * N * B) * sizeof(float));
    fill(zeros.as<float>(), size_t(M * N * B), 0.0f);
    unpackKernel<float>
        <<<blocksC, kThreads, 0, stream>>>(out, zeros.as<float>(), outBox, outBatchDevice, B);
    launched("einsum unpack kernel");
    return;
  }

  if (accumulateInDouble) {
    // Narrow result dtypes: DGEMM on dense double copies, rounded once by the caller.
    Scratch aPacked(size_t(M * K * B) * sizeof(double)),
        bPacked(size_t(K * N * B) * sizeof(double)), cPacked(size_t(M * N * B) * sizeof(double));
    packKernel<double>
        <<<blocksA, kThreads, 0, stream>>>(aPacked.as<double>(), a, aBox, aBatchDevice, B);
    packKernel<double>
        <<<blocksB, kThreads, 0, stream>>>(bPacked.as<double>(), b, bBox, bBatchDevice, B);
    launched("einsum pack kernel");
    double one = 1, zero = 0;
    // Row-major C = A B is column-major C^T = B^T A^T.
    checkCublas(cublasDgemmStridedBatched(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K),
                                          &one, bPacked.as<double>(), int(N), K * N,
                                          aPacked.as<double>(), int(K), M * K, &zero,
                                          cPacked.as<double>(), int(N), M * N, int(B)),
                "cublasDgemmStridedBatched");
    unpackKernel<double>
        <<<blocksC, kThreads, 0, stream>>>(out, cPacked.as<double>(), outBox, outBatchDevice, B);
    launched("einsum unpack kernel");
    return;
  }

  // Row-major op(A) [M, K]: NoTrans with lda (row stride), or stored [K, M] (Trans).
  cublasOperation_t opA = CUBLAS_OP_N, opB = CUBLAS_OP_N;
  int64_t lda = K, ldb = N, ldc = N;
  long long strideA = M * K, strideB = K * N, strideC = M * N;
  const void* aPtr = a;
  const void* bPtr = b;
  void* cPtr = out;
  Scratch aPacked(aDirect ? 0 : size_t(M * K * B) * sizeof(float)),
      bPacked(bDirect ? 0 : size_t(K * N * B) * sizeof(float)),
      cPacked(outDirect ? 0 : size_t(M * N * B) * sizeof(float));
  if (aDirect) {
    if (kUnitA == 1 && (M == 1 || mUnit >= K)) {
      lda = M == 1 ? std::max<int64_t>(K, 1) : mUnit;
    } else {
      opA = CUBLAS_OP_T;
      lda = K == 1 ? std::max<int64_t>(M, 1) : kUnitA;
    }
    strideA = aStride * (B > 1);
  } else {
    packKernel<float>
        <<<blocksA, kThreads, 0, stream>>>(aPacked.as<float>(), a, aBox, aBatchDevice, B);
    launched("einsum pack kernel");
    aPtr = aPacked.get();
  }
  if (bDirect) {
    if (nUnit == 1 && (K == 1 || kUnitB >= N)) {
      ldb = K == 1 ? std::max<int64_t>(N, 1) : kUnitB;
    } else {
      opB = CUBLAS_OP_T;
      ldb = N == 1 ? std::max<int64_t>(K, 1) : nUnit;
    }
    strideB = bStride * (B > 1);
  } else {
    packKernel<float>
        <<<blocksB, kThreads, 0, stream>>>(bPacked.as<float>(), b, bBox, bBatchDevice, B);
    launched("einsum pack kernel");
    bPtr = bPacked.get();
  }
  if (outDirect) {
    ldc = M == 1 ? std::max<int64_t>(N, 1) : outMUnit;
    strideC = outStride * (B > 1);
  } else {
    cPtr = cPacked.get();
  }
  // Packed operands and outputs are dense per batch, so the batch stride is the matrix size;
  // direct ones have a flat batch stride (batchFlat), so one strided-batched call does all.
  cublasComputeType_t compute = computeTypeOf(context.math);
  float one = 1, zero = 0;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  checkCublas(cublasGemmStridedBatchedEx(handle, opB, opA, int(N), int(M), int(K), &one, bPtr,
                                         CUDA_R_32F, int(ldb), strideB, aPtr, CUDA_R_32F, int(lda),
                                         strideA, &zero, cPtr, CUDA_R_32F, int(ldc), strideC,
                                         int(B), compute, CUBLAS_GEMM_DEFAULT),
              "cublasGemmStridedBatchedEx");
  if (!outDirect) {
    unpackKernel<float>
        <<<blocksC, kThreads, 0, stream>>>(out, cPacked.as<float>(), outBox, outBatchDevice, B);
    launched("einsum unpack kernel");
  }
}

void einsumGeneric(float* out, const std::vector<int64_t>& outSizes,
                   const std::vector<int64_t>& contracted,
                   const std::vector<const float*>& operands,
                   const std::vector<std::vector<int64_t>>& outerStrides,
                   const std::vector<std::vector<int64_t>>& innerStrides) {
  if (operands.size() > size_t(kMaxOperands))
    throw std::length_error("meshrt::cuda::einsumGeneric: more than 8 operands");
  GenericEinsum e;
  e.operands = int(operands.size());
  e.out = makeBox(outSizes, rowMajor(outSizes));
  e.innerCount = product(contracted);
  if (e.out.count == 0) return;
  std::vector<int64_t> tables;
  std::vector<size_t> at;
  for (size_t k = 0; k < operands.size(); ++k) {
    e.data[k] = operands[k];
    e.outer[k] = makeBox(outSizes, outerStrides[k]);
    at.push_back(tables.size());
    std::vector<int64_t> inner = offsetsOf(contracted, innerStrides[k]);
    tables.insert(tables.end(), inner.begin(), inner.end());
  }
  Scratch scratch(tables.size() * sizeof(int64_t));
  int64_t* device = upload(scratch, tables, 0);
  for (size_t k = 0; k < operands.size(); ++k)
    e.inner[k] = device + at[k];
  einsumGenericKernel<<<blocksFor(e.out.count), kThreads, 0, current().stream>>>(out, e);
  launched("einsum kernel");
}

} // namespace meshrt::cuda
