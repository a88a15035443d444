// meshrt_cuda: what generated CUDA code (meshc --emit=cuda) runs on besides its own fused
// elementwise kernels: the per-rank device context (device, stream, cuBLAS handle, matmul
// precision), stream-ordered scratch memory, einsum through cuBLAS, and the reduction,
// softmax / log_softmax, layer_norm and cumsum kernels (their per-lane math in RowMath.h, shared
// with the CPU tests), with the in-op collectives when a lane is split over a group.
//
// Every pointer is a device pointer of the current context's device; every call enqueues on
// the current context's stream and returns without waiting (the stream orders kernels, copies
// and the NCCL collectives of the rank). Errors throw std::runtime_error naming the call and
// cudaGetErrorString / the cuBLAS status.
#pragma once

#include "meshrt/Comm.h"
#include "meshrt/cuda/RowMath.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace meshrt::cuda {

/// Throws std::runtime_error("CUDA error in <what>: <name>: <string>") unless cudaSuccess.
void check(cudaError_t status, const char* what);
/// Throws std::runtime_error("cuBLAS error in <what>: <status>") unless CUBLAS_STATUS_SUCCESS.
void checkCublas(cublasStatus_t status, const char* what);

/// The precision of einsum's GEMMs (cuBLAS compute type), see docs/cuda.md:
/// FP32: strict fp32 (CUBLAS_COMPUTE_32F, no tensor-core rounding), the default;
/// TF32: fp32 in and out, TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32);
/// BF16: mixed precision: operands rounded to bf16 inside the GEMM (tensor cores,
///       CUBLAS_COMPUTE_32F_FAST_16BF), fp32 accumulation and result; parameters (master
///       weights) and all other ops stay fp32.
enum class MathMode { FP32, TF32, BF16 };
const char* mathModeName(MathMode mode);
/// The cuBLAS compute type of a mode's fp32-in, fp32-out GEMMs.
cublasComputeType_t computeTypeOf(MathMode mode);

/// One rank's device state. Generated code makes it current (Scope) in its constructor and in
/// run(); the support functions and this library use current().
struct Context {
  int device = 0;
  cudaStream_t stream = nullptr;
  MathMode math = MathMode::FP32;
  /// This thread's cuBLAS handle for `device`, bound to `stream` (created on first use).
  cublasHandle_t cublas() const;
};

/// The context the calling thread works in; throws std::logic_error when there is none.
const Context& current();

/// Makes `context` current on this thread (and its device the CUDA current device) for the
/// scope's lifetime.
class Scope {
public:
  explicit Scope(const Context& context);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

private:
  Context context_;
  const Context* previous_;
};

/// Stream-ordered temporary device memory on the current stream (cudaMallocAsync; freed with
/// cudaFreeAsync when the object dies, after the work enqueued so far).
class Scratch {
public:
  explicit Scratch(size_t bytes);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return memory_; }
  template <class T> T* as() const { return static_cast<T*>(memory_); }

private:
  void* memory_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

/// Copies a host array into device scratch (the host array may die right after the call).
template <class T> T* upload(Scratch& scratch, const std::vector<T>& values, size_t at = 0);
void copyToDevice(void* to, const void* from, size_t bytes);

/// Lanes of an op along dims: `inBase`/`outBase` one offset per row (lane), `inOffsets`/
/// `outOffsets` one per element of a lane.
struct Lanes {
  std::vector<int64_t> inBase, outBase, inOffsets, outOffsets;
};

/// out[outBase[r]] = the reduction of in's lane r (RowMath.h reduceLane).
void reduce(float* out, const float* in, const Lanes& lanes, row::ReduceKind kind, double scale);

enum class AlongKind { Softmax, LogSoftmax, LayerNorm, Cumsum, CumsumExclusive };
/// softmax / log_softmax / layer_norm / cumsum of every lane; `group` non-null when the lane
/// is split over it (block order = group rank): the partial maxima, sums, moments or totals are
/// combined with the group's collectives on the same stream (the group must be a device
/// communicator, i.e. the nccl backend).
void along(float* out, const float* in, const Lanes& lanes, AlongKind kind, double eps,
           int64_t globalLaneCount, meshrt::Communicator* group);

/// logsumexp over dims split over `group`: combines the ranks' local values in place.
void combineLogSumExp(float* local, size_t count, meshrt::Communicator& group);

/// A two-operand einsum as (batched) GEMM; the meaning of every field as meshc::gen::GemmDims.
struct Gemm {
  std::vector<int64_t> batch, m, n, k;
  std::vector<int64_t> aBatch, aM, aK;
  std::vector<int64_t> bBatch, bK, bN;
  std::vector<int64_t> outBatch, outM, outN;
};
/// out = a . b through cuBLAS in the current context's MathMode: one
/// cublasGemmStridedBatchedEx when each operand's batch dims flatten to one stride (operands
/// whose (m, k) / (k, n) are not plain row-major in either order are packed first), else one
/// GEMM per batch. `accumulateInDouble`: DGEMM on double copies (results of narrow dtypes,
/// rounded once afterwards, as the CPU path).
void einsum2(float* out, const float* a, const float* b, const Gemm& gemm,
             bool accumulateInDouble = false);

/// Any einsum (up to 8 operands): one thread per output element, accumulating in double.
void einsumGeneric(float* out, const std::vector<int64_t>& outSizes,
                   const std::vector<int64_t>& contracted,
                   const std::vector<const float*>& operands,
                   const std::vector<std::vector<int64_t>>& outerStrides,
                   const std::vector<std::vector<int64_t>>& innerStrides);

/// Every element = value.
void fill(float* data, size_t count, float value);
/// Rounds every element to bf16 (mantissaBits 7) or f16 (10), as Scalar.h's roundBF16/roundF16.
void roundBufferBF16(float* data, size_t count);
void roundBufferF16(float* data, size_t count);

} // namespace meshrt::cuda
