// Support code for the CUDA that `meshc --emit=cuda` generates: the same names and signatures
// as meshc/GeneratedSupport.h's meshc::gen (the CUDA target writes meshc::cuda where the C++
// target writes meshc::gen), on device memory.
//
// - Buffer: an owning device array (parameters; run()'s inputs, uploaded from the host by the
//   implicit conversion from std::vector<float> that binds `const Buffer& v = inputs.x.data`;
//   outputs downloaded by the conversion back to std::vector<float>, which waits for the stream).
// - Arena: run()'s temporaries in one device allocation; View / ConstView: device spans.
// - Fused elementwise ops: forEachIndex / forEach launch the generated `__device__` lambdas
//   (nvcc --extended-lambda) whose bodies are the C++ target's scalar expressions, calling the
//   same MESHRT_HD scalar functions (meshc::gen's sigmoid, gelu, roundValue, ...).
// - einsum through cuBLAS, reductions, softmax, layer_norm, cumsum: meshrt_cuda.
// - Data movement (copyStrided, reshape, windows, one_hot, gather, iota, dropout, shift) as
//   device lambdas here; chunk packing around collectives with cudaMemcpy2DAsync.
// - RNG fills (parameters at construction, random ops in run()) run on the host through
//   meshrt::kernels' fills, then are copied to the device: the same values as the CPU path.
// - Collectives: the rank's communicator must be meshrt::nccl's (device pointers; its stream
//   is the stream everything here is enqueued on, so kernels and collectives are ordered).
// - The host param API (paramShards, getParam/setParam, save/load checkpoints) downloads and
//   uploads the device params through host copies; the step's updates are device copies.
//
// Compile generated code with nvcc -std=c++20 --extended-lambda --expt-relaxed-constexpr
// -fmad=false (no FMA contraction: the scalar bodies round as on the CPU).
#pragma once

#include "meshc/GeneratedSupport.h"
#include "meshrt/Checkpoint.h"
#include "meshrt/Nccl.h"
#include "meshrt/cuda/Cuda.h"
#include "meshrt/kernels/Scalar.h"

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshc::cuda {

using gen::Along;
using gen::blockIndex;
using gen::checkedWorld;
using gen::checkShape;
using gen::DType;
using gen::gatherShards; // host shards: the nccl backend stages host buffers
using gen::GemmDims;
using gen::globalBase;
using gen::ParamInit;
using gen::paramShardsOf;
using gen::ParamSpec;
using gen::product;
using gen::Reduce;
using gen::rowMajorStrides;
using gen::Shape;
using gen::shardStart;
using gen::shardStartOf;
using gen::shardStartsOf;
using gen::sliceShard;
using gen::Tensor;
using gen::useSingleThreadedBlas;
using gen::writeTensor;
// The scalar functions of the fused expressions (MESHRT_HD in GeneratedSupport.h).
using gen::castToI32;
using gen::divI32;
using gen::fceil;
using gen::fcos;
using gen::fexp;
using gen::ffloor;
using gen::fgelu;
using gen::flag;
using gen::flog;
using gen::floorDivI32;
using gen::fpow;
using gen::fround;
using gen::fsigmoid;
using gen::fsin;
using gen::fsqrt;
using gen::ftanh;
using gen::gelu;
using gen::keepOrZero;
using gen::maximum;
using gen::minimum;
using gen::modI32;
using gen::powI32;
using gen::relu;
using gen::roundBF16;
using gen::roundF16;
using gen::roundValue;
using gen::sigmoid;
using gen::where;
using gen::wrapI32;
using meshrt::cuda::MathMode;

inline void check(cudaError_t status, const char* what) {
  meshrt::cuda::check(status, what);
}

//===------------------------------------------------------------------------------------------===//
// Context
//===------------------------------------------------------------------------------------------===//

/// The device context of `world`'s rank: its NCCL communicator's device and stream.
inline meshrt::cuda::Context contextOf(meshrt::Communicator& world, MathMode math) {
  auto* nccl = dynamic_cast<meshrt::nccl::NcclCommunicator*>(&world);
  if (!nccl)
    throw std::invalid_argument(std::string("generated CUDA code needs the nccl backend "
                                            "(meshrt::nccl::runNccl), not '") +
                                world.backend() + "'");
  meshrt::cuda::Context context;
  context.device = nccl->device();
  context.stream = nccl->stream();
  context.math = math;
  return context;
}

/// A trace's probes wait for the device first, so that host timestamps bracket device work
/// (tracing serializes the streams; off, nothing waits).
inline void synchronizeForTrace() {
  cudaDeviceSynchronize();
}

/// Makes `world`'s device context current for a generated constructor or run().
class Scope {
public:
  Scope(meshrt::Communicator& world, MathMode math)
      : scope_(contextOf(world, math)), traced_(meshrt::trace::enabled()) {
    if (traced_) previousHook_ = meshrt::trace::setSyncHook(&synchronizeForTrace);
  }
  ~Scope() {
    if (traced_) meshrt::trace::setSyncHook(previousHook_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

private:
  meshrt::cuda::Scope scope_;
  bool traced_;
  meshrt::trace::SyncHook previousHook_ = nullptr;
};

inline cudaStream_t stream() {
  return meshrt::cuda::current().stream;
}

//===------------------------------------------------------------------------------------------===//
// Device storage
//===------------------------------------------------------------------------------------------===//

/// A device span (what support functions and fused kernels read and write).
struct View {
  float* pointer = nullptr;
  size_t count = 0;
  MESHRT_HD float* data() const { return pointer; }
  MESHRT_HD size_t size() const { return count; }
  MESHRT_HD float& operator[](size_t i) const { return pointer[i]; }
  float* begin() const { return pointer; }
  float* end() const { return pointer + count; }
};

struct ConstView {
  const float* pointer = nullptr;
  size_t count = 0;
  ConstView() = default;
  ConstView(const float* p, size_t n) : pointer(p), count(n) {}
  ConstView(View view) : pointer(view.pointer), count(view.count) {}
  MESHRT_HD const float* data() const { return pointer; }
  MESHRT_HD size_t size() const { return count; }
  MESHRT_HD const float& operator[](size_t i) const { return pointer[i]; }
  const float* begin() const { return pointer; }
  const float* end() const { return pointer + count; }
};

/// An owning device array, allocated and freed in stream order on the current stream.
class Buffer {
public:
  Buffer() = default;
  /// Uploads a host array (run()'s inputs).
  Buffer(const std::vector<float>& host) {
    resize(host.size());
    meshrt::cuda::copyToDevice(pointer_, host.data(), host.size() * sizeof(float));
  }
  /// A device copy of [begin, end) (run()'s outputs leave the arena).
  Buffer(const float* begin, const float* end) {
    resize(size_t(end - begin));
    if (count_)
      check(cudaMemcpyAsync(pointer_, begin, count_ * sizeof(float), cudaMemcpyDeviceToDevice,
                            stream_),
            "cudaMemcpyAsync (output)");
  }
  Buffer(Buffer&& other) noexcept { swap(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    swap(other);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }

  /// Downloads to the host (waits for the stream).
  operator std::vector<float>() const {
    std::vector<float> host(count_);
    if (count_) {
      check(cudaMemcpyAsync(host.data(), pointer_, count_ * sizeof(float), cudaMemcpyDeviceToHost,
                            stream_),
            "cudaMemcpyAsync (download)");
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (download)");
    }
    return host;
  }
  operator View() { return View{pointer_, count_}; }
  operator ConstView() const { return ConstView(pointer_, count_); }

  /// `count` elements (contents undefined).
  void resize(size_t count) {
    release();
    stream_ = stream();
    count_ = count;
    if (count) check(cudaMallocAsync(&pointer_, count * sizeof(float), stream_), "cudaMallocAsync");
  }
  /// `count` elements equal to `value`.
  void assign(size_t count, float value) {
    resize(count);
    meshrt::cuda::fill(pointer_, count, value);
  }
  float* data() { return pointer_; }
  const float* data() const { return pointer_; }
  size_t size() const { return count_; }
  const float* begin() const { return pointer_; }
  const float* end() const { return pointer_ + count_; }

private:
  void swap(Buffer& other) {
    std::swap(pointer_, other.pointer_);
    std::swap(count_, other.count_);
    std::swap(stream_, other.stream_);
  }
  void release() {
    if (pointer_) cudaFreeAsync(pointer_, stream_);
    pointer_ = nullptr;
    count_ = 0;
  }
  float* pointer_ = nullptr;
  size_t count_ = 0;
  cudaStream_t stream_ = nullptr;
};

/// The spans fused kernels capture by value.
inline View view(View v) {
  return v;
}
inline ConstView view(const Buffer& buffer) {
  return ConstView(buffer);
}
inline ConstView view(ConstView v) {
  return v;
}

/// run()'s temporaries in one device allocation, slots at the generator's byte offsets (as
/// meshc::gen::Arena). Allocated at the first slot, on the device of the current context (the
/// constructor's member initializers run before the generated code makes its context current).
class Arena {
public:
  static constexpr size_t kAlignment = gen::Arena::kAlignment;
  explicit Arena(size_t bytes) : bytes_(bytes) {}
  ~Arena() {
    if (memory_) cudaFreeAsync(memory_, stream_);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  size_t bytes() const { return bytes_; }

  /// The slot at `byteOffset` as it is (a statement that writes every element comes next).
  View view(size_t byteOffset, size_t count) { return at(byteOffset, count); }
  /// The slot at `byteOffset`, zeroed.
  View slot(size_t byteOffset, size_t count) {
    View view = at(byteOffset, count);
    if (count) check(cudaMemsetAsync(view.data(), 0, count * sizeof(float), stream()), "memset");
    return view;
  }
  View fill(size_t byteOffset, size_t count, float value) {
    View view = at(byteOffset, count);
    meshrt::cuda::fill(view.data(), count, value);
    return view;
  }
  View copy(size_t byteOffset, ConstView from) {
    View view = at(byteOffset, from.size());
    if (from.size())
      check(cudaMemcpyAsync(view.data(), from.data(), from.size() * sizeof(float),
                            cudaMemcpyDeviceToDevice, stream()),
            "cudaMemcpyAsync (arena copy)");
    return view;
  }

private:
  View at(size_t byteOffset, size_t count) {
    if (byteOffset % kAlignment != 0 || byteOffset + count * sizeof(float) > bytes_)
      throw std::logic_error("arena slot [" + std::to_string(byteOffset) + ", +" +
                             std::to_string(count * sizeof(float)) + ") outside the arena of " +
                             std::to_string(bytes_) + " bytes");
    if (!memory_) {
      // Stream-ordered (no device synchronization that could stall a peer's NCCL kernel).
      stream_ = stream();
      check(cudaMallocAsync(&memory_, std::max(bytes_, kAlignment), stream_), "cudaMallocAsync");
    }
    return View{static_cast<float*>(memory_) + byteOffset / sizeof(float), count};
  }
  size_t bytes_;
  void* memory_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

//===------------------------------------------------------------------------------------------===//
// Launching device lambdas
//===------------------------------------------------------------------------------------------===//

constexpr int kThreads = 256;
constexpr int kMaxRank = 12;

inline int blocksFor(int64_t count) {
  return int(std::min<int64_t>((count + kThreads - 1) / kThreads, 65535 * 8));
}

#ifdef __CUDACC__
template <typename Fn> __global__ void indexKernel(int64_t count, Fn fn) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x)
    fn(i);
}

/// fn(i) for i in [0, count), on the device.
template <typename Fn> inline void forEachIndex(size_t count, Fn fn) {
  if (count == 0) return;
  indexKernel<<<blocksFor(int64_t(count)), kThreads, 0, stream()>>>(int64_t(count), fn);
  check(cudaGetLastError(), "elementwise kernel launch");
}

template <size_t N> struct StridedBox {
  int rank = 0;
  int64_t count = 1;
  int64_t sizes[kMaxRank] = {};
  int64_t strides[N][kMaxRank] = {};
  int64_t base[N] = {};
};

template <size_t N, typename Fn> __global__ void boxKernel(StridedBox<N> box, Fn fn) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < box.count;
       i += int64_t(gridDim.x) * blockDim.x) {
    std::array<int64_t, N> at;
    for (size_t k = 0; k < N; ++k)
      at[k] = box.base[k];
    int64_t linear = i;
    for (int d = box.rank - 1; d >= 0; --d) {
      int64_t index = linear % box.sizes[d];
      linear /= box.sizes[d];
      for (size_t k = 0; k < N; ++k)
        at[k] += index * box.strides[k][d];
    }
    fn(at);
  }
}

/// meshc::gen::forEach on the device: fn(offsets) for every point of the box (any order).
template <size_t N, typename Fn>
inline void forEach(const Shape& sizes, const std::array<Shape, N>& strides,
                    std::array<int64_t, N> offsets, Fn fn) {
  if (sizes.size() > size_t(kMaxRank)) throw std::length_error("meshc::cuda::forEach: rank > 12");
  StridedBox<N> box;
  box.rank = int(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) {
    box.sizes[d] = sizes[d];
    box.count *= sizes[d];
    for (size_t k = 0; k < N; ++k)
      box.strides[k][d] = strides[k][d];
  }
  for (size_t k = 0; k < N; ++k)
    box.base[k] = offsets[k];
  if (box.count <= 0) return;
  boxKernel<N><<<blocksFor(box.count), kThreads, 0, stream()>>>(box, fn);
  check(cudaGetLastError(), "strided kernel launch");
}

//===------------------------------------------------------------------------------------------===//
// Data movement (the bodies of meshc::gen's, as device lambdas)
//===------------------------------------------------------------------------------------------===//

inline void copyStrided(float* out, const Shape& sizes, const Shape& outStrides, const float* in,
                        const Shape& inStrides, int64_t inBase = 0) {
  forEach<2>(sizes, {outStrides, inStrides}, {0, inBase},
             [=] __device__(const std::array<int64_t, 2>& at) { out[at[0]] = in[at[1]]; });
}

inline void reshape(float* out, const Shape& outSizes, const float* in, const Shape& otherStrides,
                    const Shape& linearStrides, const Shape& fromSizes, const Shape& fromStrides,
                    int64_t linearBase = 0) {
  std::vector<int64_t> offsets = gen::offsetsOf(fromSizes, fromStrides);
  meshrt::cuda::Scratch scratch(offsets.size() * sizeof(int64_t));
  const int64_t* fromOffsets = meshrt::cuda::upload(scratch, offsets);
  forEach<3>(outSizes, {rowMajorStrides(outSizes), otherStrides, linearStrides}, {0, 0, linearBase},
             [=] __device__(const std::array<int64_t, 3>& at) {
               out[at[0]] = in[at[1] + fromOffsets[at[2]]];
             });
}

inline void copyWindow(float* out, const float* in, const Shape& outer, const Shape& outOuter,
                       const Shape& inOuter, int64_t outStride, int64_t inStride, int64_t outSize,
                       int64_t inSize, int64_t offset) {
  int64_t begin = std::max<int64_t>(0, offset), end = std::min(outSize, inSize + offset);
  forEach<2>(outer, {outOuter, inOuter}, {0, 0}, [=] __device__(const std::array<int64_t, 2>& at) {
    for (int64_t j = begin; j < end; ++j)
      out[at[0] + j * outStride] = in[at[1] + (j - offset) * inStride];
  });
}

inline void oneHot(float* out, const Shape& outSizes, const float* ids, const Shape& idStrides,
                   const Shape& positionStrides, int64_t start) {
  forEach<3>(outSizes, {rowMajorStrides(outSizes), idStrides, positionStrides}, {0, 0, start},
             [=] __device__(const std::array<int64_t, 3>& at) {
               out[at[0]] = ids[at[1]] == float(at[2]) ? 1.0f : 0.0f;
             });
}

inline void gather(float* out, const Shape& outSizes, const float* table, const Shape& tableStrides,
                   const float* ids, const Shape& idStrides, int64_t rows, int64_t rowStride,
                   int64_t start) {
  forEach<3>(outSizes, {rowMajorStrides(outSizes), tableStrides, idStrides}, {0, 0, 0},
             [=] __device__(const std::array<int64_t, 3>& at) {
               double id = double(ids[at[2]]) - double(start);
               out[at[0]] =
                   id >= 0 && id < double(rows) ? table[at[1] + int64_t(id) * rowStride] : 0.0f;
             });
}

/// scatterAdd as meshc::gen::scatterAdd, one thread per output element summing the points
/// whose id selects its row (in point order).
inline void scatterAdd(float* out, const Shape& outSizes, const float* in, const Shape& inStrides,
                       const float* ids, const Shape& idStrides, const Shape& points,
                       const Shape& inPointStrides, const Shape& idPointStrides, int64_t at,
                       int64_t start) {
  std::vector<int64_t> inOffsets = gen::offsetsOf(points, inPointStrides);
  std::vector<int64_t> idOffsets = gen::offsetsOf(points, idPointStrides);
  meshrt::cuda::Scratch inScratch(inOffsets.size() * sizeof(int64_t));
  meshrt::cuda::Scratch idScratch(idOffsets.size() * sizeof(int64_t));
  const int64_t* inAt = meshrt::cuda::upload(inScratch, inOffsets);
  const int64_t* idAt = meshrt::cuda::upload(idScratch, idOffsets);
  int64_t count = int64_t(inOffsets.size());
  Shape position(outSizes.size(), 0);
  position[size_t(at)] = 1;
  forEach<4>(outSizes, {rowMajorStrides(outSizes), inStrides, idStrides, position},
             {0, 0, 0, start}, [=] __device__(const std::array<int64_t, 4>& o) {
               float sum = 0;
               for (int64_t p = 0; p < count; ++p)
                 if (ids[o[2] + idAt[p]] == float(o[3])) sum += in[o[1] + inAt[p]];
               out[o[0]] = sum;
             });
}

/// top_k as meshc::gen::topK, one thread per row element: its rank in the row (how many
/// elements come before it in gen::topKBefore's order), written at that rank when below k.
inline void topK(float* out, const Shape& outSizes, const float* in, const Shape& inStrides,
                 int64_t kAt, int64_t n, int64_t stride) {
  Shape lanes = outSizes, outBase = rowMajorStrides(outSizes), inAt = inStrides;
  Shape position(outSizes.size(), 0);
  int64_t k = lanes[size_t(kAt)], outStride = outBase[size_t(kAt)];
  lanes[size_t(kAt)] = n;
  outBase[size_t(kAt)] = 0;
  inAt[size_t(kAt)] = stride;
  position[size_t(kAt)] = 1;
  forEach<3>(lanes, {outBase, inAt, position}, {0, 0, 0},
             [=] __device__(const std::array<int64_t, 3>& at) {
               int64_t i = at[2];
               int64_t rank = gen::topKRank(in + at[1] - i * stride, stride, n, i);
               if (rank < k) out[at[0] + rank * outStride] = float(i);
             });
}

inline void iota(float* out, const Shape& outSizes, const Shape& positionStrides, int64_t start) {
  forEach<2>(outSizes, {rowMajorStrides(outSizes), positionStrides}, {0, start},
             [=] __device__(const std::array<int64_t, 2>& at) { out[at[0]] = float(at[1]); });
}

inline void dropout(float* out, const Shape& outSizes, const float* in, const Shape& inStrides,
                    const Shape& globalStrides, int64_t base, uint64_t key, double rate) {
  double scale = rate < 1 ? 1 / (1 - rate) : 0.0;
  forEach<3>(outSizes, {rowMajorStrides(outSizes), inStrides, globalStrides}, {0, 0, base},
             [=] __device__(const std::array<int64_t, 3>& at) {
               bool keep = meshrt::dropoutKeep(key, uint64_t(at[2]), rate);
               out[at[0]] = keep ? float(double(in[at[1]]) * scale) : 0.0f;
             });
}

/// Rows [fromRow, fromRow + rows) of `from` (dim size fromSize) to rows from toRow of `to`, for
/// every outer index (as meshc::gen::copyRowsBlock).
inline void copyRowsBlock(float* to, int64_t toSize, int64_t toRow, const float* from,
                          int64_t fromSize, int64_t fromRow, int64_t rows, int64_t outer,
                          int64_t inner) {
  if (rows * inner == 0 || outer == 0) return;
  size_t width = size_t(rows * inner) * sizeof(float);
  check(cudaMemcpy2DAsync(to + toRow * inner, size_t(toSize * inner) * sizeof(float),
                          from + fromRow * inner, size_t(fromSize * inner) * sizeof(float), width,
                          size_t(outer), cudaMemcpyDeviceToDevice, stream()),
        "cudaMemcpy2DAsync (rows)");
}

/// shift along a dim by `offset` (zeros shifted in); split dims exchange whole shards with the
/// group's permute, as meshc::gen::shift.
inline void shift(View out, ConstView in, const Shape& sizes, size_t dimIndex, int64_t offset,
                  meshrt::Communicator* group) {
  gen::DimView dims = gen::dimView(sizes, dimIndex);
  int64_t local = dims.size, inner = dims.inner;
  check(cudaMemsetAsync(out.data(), 0, out.size() * sizeof(float), stream()), "memset (shift)");
  auto copyRows = [&](const float* source, int64_t sourceStartGlobal, int64_t outStartGlobal) {
    // out global row g takes source global row g - offset: one contiguous run of rows.
    int64_t first = std::max<int64_t>(0, sourceStartGlobal + offset - outStartGlobal);
    int64_t last = std::min<int64_t>(local, sourceStartGlobal + local + offset - outStartGlobal);
    if (last <= first) return;
    int64_t from = outStartGlobal + first - offset - sourceStartGlobal;
    copyRowsBlock(out.data(), local, first, source, local, from, last - first, dims.outer, inner);
  };
  if (!group) {
    copyRows(in.data(), 0, 0);
    return;
  }
  int64_t rank = group->rank(), ranks = group->size(), myStart = rank * local;
  int64_t low = offset >= 0 ? offset / local : -((-offset + local - 1) / local);
  int64_t high = offset % local == 0 ? low : low + 1;
  meshrt::cuda::Scratch received(in.size() * sizeof(float));
  for (int64_t q = low; q <= high; ++q) {
    if (q == 0) {
      copyRows(in.data(), myStart, myStart);
      continue;
    }
    int64_t sendTo = rank + q, recvFrom = rank - q;
    int send = sendTo >= 0 && sendTo < ranks ? int(sendTo) : meshrt::Communicator::kNoPeer;
    int recv = recvFrom >= 0 && recvFrom < ranks ? int(recvFrom) : meshrt::Communicator::kNoPeer;
    group->permute(in.data(), received.as<float>(), in.size(), send, recv);
    if (recv != meshrt::Communicator::kNoPeer)
      copyRows(received.as<float>(), recvFrom * local, myStart);
  }
}
#endif // __CUDACC__

//===------------------------------------------------------------------------------------------===//
// Fills (host RNG, then copied), einsum, reductions, ops along dims
//===------------------------------------------------------------------------------------------===//

inline size_t elementsOf(const meshrt::kernels::Shard& shard) {
  size_t count = 1;
  for (int d = 0; d < shard.localShape.rank; ++d)
    count *= size_t(shard.localShape[d]);
  return count;
}

inline void fillParam(float* device, const meshrt::kernels::Shard& shard, uint64_t seed,
                      std::string_view path, const meshrt::kernels::Init& init,
                      meshrt::kernels::ValueType type = meshrt::kernels::ValueType::F32) {
  std::vector<float> host(elementsOf(shard));
  meshrt::kernels::fillParam(host.data(), shard, seed, path, init, type);
  meshrt::cuda::copyToDevice(device, host.data(), host.size() * sizeof(float));
}

/// The generated constructor's param initialization (meshc::gen::initParams), into device
/// buffers.
template <size_t N>
void initParams(meshrt::Communicator& world, uint64_t seed, int stage, const ParamSpec (&specs)[N],
                const ParamInit (&inits)[N], Buffer* const (&data)[N]) {
  gen::initParamsWith([](auto&&... args) { meshc::cuda::fillParam(args...); }, world, seed, stage,
                      specs, inits, data);
}

inline void fillRandomNormal(float* device, const meshrt::kernels::Shard& shard, uint64_t seed,
                             std::string_view streamName, double mean, double stddev,
                             meshrt::kernels::ValueType type = meshrt::kernels::ValueType::F32) {
  std::vector<float> host(elementsOf(shard));
  meshrt::kernels::fillRandomNormal(host.data(), shard, seed, streamName, mean, stddev, type);
  meshrt::cuda::copyToDevice(device, host.data(), host.size() * sizeof(float));
}

inline void fillRandomUniform(float* device, const meshrt::kernels::Shard& shard, uint64_t seed,
                              std::string_view streamName, double min, double max,
                              meshrt::kernels::ValueType type = meshrt::kernels::ValueType::F32) {
  std::vector<float> host(elementsOf(shard));
  meshrt::kernels::fillRandomUniform(host.data(), shard, seed, streamName, min, max, type);
  meshrt::cuda::copyToDevice(device, host.data(), host.size() * sizeof(float));
}

inline void fillRandomInt(float* device, const meshrt::kernels::Shard& shard, uint64_t seed,
                          std::string_view streamName, double max) {
  std::vector<float> host(elementsOf(shard));
  meshrt::kernels::fillRandomInt(host.data(), shard, seed, streamName, max);
  meshrt::cuda::copyToDevice(device, host.data(), host.size() * sizeof(float));
}

inline meshrt::cuda::Gemm gemmOf(const GemmDims& d) {
  return meshrt::cuda::Gemm{d.batch,  d.m,  d.n,  d.k,        d.aBatch, d.aM,  d.aK,
                            d.bBatch, d.bK, d.bN, d.outBatch, d.outM,   d.outN};
}

inline void einsum2(float* out, const float* a, const float* b, const GemmDims& d) {
  meshrt::cuda::einsum2(out, a, b, gemmOf(d));
}

#ifdef __CUDACC__
/// out *= alpha (a GEMM's folded scale: cuBLAS runs with alpha 1 here).
inline void scaleValues(View out, float alpha) {
  forEachIndex(out.size(), [=] __device__(int64_t i) { out[size_t(i)] *= alpha; });
}

/// out = f(out + bias[i mod bias's size]), f GELU or the identity: a GEMM's fused bias and
/// activation (fuse-gemm-epilogues), after cuBLAS.
inline void biasActivation(View out, ConstView bias, bool gelu) {
  size_t lane = bias.size();
  forEachIndex(out.size(), [=] __device__(int64_t i) {
    float value = out[size_t(i)] + bias[size_t(i) % lane];
    out[size_t(i)] = gelu ? fgelu(value) : value;
  });
}
#endif

inline void einsum2Double(float* out, const float* a, const float* b, const GemmDims& d) {
  meshrt::cuda::einsum2(out, a, b, gemmOf(d), /*accumulateInDouble=*/true);
}

inline void einsumGeneric(float* out, const Shape& outSizes, const Shape& contracted,
                          const std::vector<const float*>& operands,
                          const std::vector<Shape>& outerStrides,
                          const std::vector<Shape>& innerStrides) {
  meshrt::cuda::einsumGeneric(out, outSizes, contracted, operands, outerStrides, innerStrides);
}

inline void roundBufferBF16(View data) {
  meshrt::cuda::roundBufferBF16(data.data(), data.size());
}
inline void roundBufferF16(View data) {
  meshrt::cuda::roundBufferF16(data.data(), data.size());
}

inline void reduce(float* out, const Shape& outSizes, const float* in, const Shape& inOuter,
                   const Shape& lane, const Shape& laneStrides, Reduce kind, double scale) {
  meshrt::cuda::Lanes lanes;
  lanes.inBase = gen::offsetsOf(outSizes, inOuter);
  lanes.outBase = gen::offsetsOf(outSizes, rowMajorStrides(outSizes));
  lanes.inOffsets = gen::offsetsOf(lane, laneStrides);
  meshrt::cuda::row::ReduceKind rowKind = meshrt::cuda::row::ReduceKind::Sum;
  if (kind == Reduce::Max) rowKind = meshrt::cuda::row::ReduceKind::Max;
  if (kind == Reduce::Min) rowKind = meshrt::cuda::row::ReduceKind::Min;
  if (kind == Reduce::LogSumExp) rowKind = meshrt::cuda::row::ReduceKind::LogSumExp;
  meshrt::cuda::reduce(out, in, lanes, rowKind, scale);
}

inline void combineLogSumExp(View local, meshrt::Communicator& group) {
  meshrt::cuda::combineLogSumExp(local.data(), local.size(), group);
}

inline void along(float* out, const float* in, const Shape& outer, const Shape& inOuter,
                  const Shape& outOuter, const Shape& lane, const Shape& inLane,
                  const Shape& outLane, Along kind, double eps, int64_t globalLaneCount,
                  meshrt::Communicator* group) {
  meshrt::cuda::Lanes lanes{gen::offsetsOf(outer, inOuter), gen::offsetsOf(outer, outOuter),
                            gen::offsetsOf(lane, inLane), gen::offsetsOf(lane, outLane)};
  meshrt::cuda::AlongKind alongKind = meshrt::cuda::AlongKind::Softmax;
  switch (kind) {
  case Along::Softmax:
    break;
  case Along::LogSoftmax:
    alongKind = meshrt::cuda::AlongKind::LogSoftmax;
    break;
  case Along::LayerNorm:
    alongKind = meshrt::cuda::AlongKind::LayerNorm;
    break;
  case Along::Cumsum:
    alongKind = meshrt::cuda::AlongKind::Cumsum;
    break;
  case Along::CumsumExclusive:
    alongKind = meshrt::cuda::AlongKind::CumsumExclusive;
    break;
  }
  meshrt::cuda::along(out, in, lanes, alongKind, eps, globalLaneCount, group);
}

#ifdef __CUDACC__
/// along(LayerNorm) over dense rows, then `y * gain + bias` along the row (meshc::gen's
/// layerNormAffine; here the row kernel and one elementwise launch).
inline void layerNormAffine(float* out, const float* in, int64_t rows, int64_t size,
                            const float* gain, const float* bias, double eps,
                            int64_t globalLaneCount) {
  meshc::cuda::along(out, in, {rows}, {size}, {size}, {size}, {1}, {1}, Along::LayerNorm, eps,
                     globalLaneCount, nullptr);
  forEachIndex(size_t(rows * size), [=] __device__(int64_t i) {
    float scaled = out[i] * gain[i % size];
    out[i] = scaled + bias[i % size];
  });
}

/// The walk of up to three terms' rows that addLayerNormAffine's and reduceProduct's device
/// lambdas capture: a struct at namespace scope (a type local to a function cannot be captured;
/// with four local std::arrays captured instead, nvcc 13.0's host pass rejected maskedSoftmax's
/// std::array after it).
struct TermRows {
  static constexpr size_t kMaxDims = 8;
  int64_t sizes[kMaxDims];
  int64_t strides[3][kMaxDims];
  int dims = 0;

  /// Rows of `outer` (at most kMaxDims dims), term k's row r at r's index over them times
  /// termOuter[k] (terms past termOuter's size, or with a null entry, stay at stride 0).
  static TermRows of(const Shape& outer, std::initializer_list<const Shape*> termOuter,
                     const char* kernel) {
    if (outer.size() > kMaxDims)
      throw std::logic_error(std::string(kernel) + ": more than 8 outer dims");
    TermRows walk{};
    walk.dims = int(outer.size());
    for (size_t d = 0; d < outer.size(); ++d) {
      walk.sizes[d] = outer[d];
      size_t k = 0;
      for (const Shape* strides : termOuter)
        walk.strides[k++][d] = strides ? (*strides)[d] : 0;
    }
    return walk;
  }
  /// Element i of the dense [rows, size] box: each term's offset into `at`.
  MESHRT_HD void offsets(int64_t i, int64_t size, int64_t (&at)[3]) const {
    int64_t rest = i / size, lane = i % size;
    at[0] = at[1] = at[2] = lane;
    for (int d = dims; d-- > 0;) {
      int64_t index = rest % sizes[d];
      for (int k = 0; k < 3; ++k)
        at[k] += index * strides[k][d];
      rest /= sizes[d];
    }
  }
};

/// sum = t0 + t1 (+ t2, added to t1 first) over dense rows, each term's row at its index over
/// `outer` times its outer strides, then layerNormAffine of the sum into `out` (meshc::gen's
/// addLayerNormAffine; here one elementwise launch and layerNormAffine).
inline void addLayerNormAffine(float* out, float* sum, const Shape& outer, int64_t size,
                               const float* gain, const float* bias, double eps,
                               int64_t globalLaneCount, const float* t0, const Shape& t0Outer,
                               const float* t1, const Shape& t1Outer, const float* t2,
                               const Shape& t2Outer) {
  TermRows walk =
      TermRows::of(outer, {&t0Outer, &t1Outer, t2 ? &t2Outer : nullptr}, "addLayerNormAffine");
  int64_t rows = product(outer);
  forEachIndex(size_t(rows * size), [=] __device__(int64_t i) {
    int64_t at[3];
    walk.offsets(i, size, at);
    sum[i] = t2 ? t0[at[0]] + (t1[at[1]] + t2[at[2]]) : t0[at[0]] + t1[at[1]];
  });
  layerNormAffine(out, sum, rows, size, gain, bias, eps, globalLaneCount);
}

/// meshc::gen's reduceProduct: the products a * b of each row into a scratch buffer (one
/// elementwise launch, rows walked by TermRows as addLayerNormAffine's), then reduce's sum over
/// its dense rows, times `scale`.
inline void reduceProduct(float* out, const Shape& outer, int64_t size, const float* a,
                          const Shape& aOuter, const float* b, const Shape& bOuter, double scale) {
  TermRows walk = TermRows::of(outer, {&aOuter, &bOuter}, "reduceProduct");
  int64_t rows = product(outer);
  meshrt::cuda::Scratch products(size_t(rows * size) * sizeof(float));
  float* terms = products.as<float>();
  forEachIndex(size_t(rows * size), [=] __device__(int64_t i) {
    int64_t at[3];
    walk.offsets(i, size, at);
    terms[i] = a[at[0]] * b[at[1]];
  });
  meshc::cuda::reduce(out, Shape{rows}, terms, Shape{size}, Shape{size}, Shape{1}, Reduce::Sum,
                      scale);
}

/// meshc::gen's layerNormGrad: dx = r (ct - mean(ct) - y mean(ct y)) along every lane, one
/// thread per lane as meshrt_cuda's row kernels: one launch for the row sums of x, x^2, ct and
/// ct x (in double), their all-reduce over `group` when the lane is split, and one launch that
/// writes dx (a whole lane recomputes its variance and sum(ct y) centered, as the CPU's rows).
inline void layerNormGrad(float* dx, const float* x, const float* ct, const Shape& outer,
                          const Shape& xOuter, const Shape& ctOuter, const Shape& dxOuter,
                          const Shape& lane, const Shape& xLane, const Shape& ctLane,
                          const Shape& dxLane, double eps, int64_t globalLaneCount,
                          meshrt::Communicator* group) {
  if (group && group->size() <= 1) group = nullptr;
  int64_t rows = product(outer), size = product(lane);
  if (rows == 0) return;
  size_t rowCount = size_t(rows), laneCount = size_t(size);
  meshrt::cuda::Scratch tables((3 * rowCount + 3 * laneCount) * sizeof(int64_t)),
      moments(4 * rowCount * sizeof(double));
  const int64_t* xBase = meshrt::cuda::upload(tables, gen::offsetsOf(outer, xOuter), 0);
  const int64_t* ctBase = meshrt::cuda::upload(tables, gen::offsetsOf(outer, ctOuter), rowCount);
  const int64_t* dxBase =
      meshrt::cuda::upload(tables, gen::offsetsOf(outer, dxOuter), 2 * rowCount);
  const int64_t* xAt = meshrt::cuda::upload(tables, gen::offsetsOf(lane, xLane), 3 * rowCount);
  const int64_t* ctAt =
      meshrt::cuda::upload(tables, gen::offsetsOf(lane, ctLane), 3 * rowCount + laneCount);
  const int64_t* dxAt =
      meshrt::cuda::upload(tables, gen::offsetsOf(lane, dxLane), 3 * rowCount + 2 * laneCount);
  double* sums = moments.as<double>();
  forEachIndex(rowCount, [=] __device__(int64_t r) {
    double s[4] = {0, 0, 0, 0};
    for (int64_t i = 0; i < size; ++i) {
      double v = x[xBase[r] + xAt[i]], g = ct[ctBase[r] + ctAt[i]];
      s[0] += v;
      s[1] += v * v;
      s[2] += g;
      s[3] += g * v;
    }
    for (int k = 0; k < 4; ++k)
      sums[4 * r + k] = s[k];
  });
  if (group) group->allReduce(sums, 4 * rowCount);
  double count = double(globalLaneCount);
  bool split = group != nullptr;
  forEachIndex(rowCount, [=] __device__(int64_t r) {
    double mean = sums[4 * r] / count, meanCt = sums[4 * r + 2] / count;
    double variance = sums[4 * r + 1] / count - mean * mean;
    double meanCtCentered = sums[4 * r + 3] / count - mean * meanCt;
    if (!split) {
      variance = meanCtCentered = 0;
      for (int64_t i = 0; i < size; ++i) {
        double centered = x[xBase[r] + xAt[i]] - mean;
        variance += centered * centered;
        meanCtCentered += ct[ctBase[r] + ctAt[i]] * centered;
      }
      variance /= count;
      meanCtCentered /= count;
    }
    double scale = 1 / sqrt((variance < 0 ? 0 : variance) + eps), meanCtY = scale * meanCtCentered;
    for (int64_t i = 0; i < size; ++i) {
      double y = (x[xBase[r] + xAt[i]] - mean) * scale;
      dx[dxBase[r] + dxAt[i]] = float(scale * (ct[ctBase[r] + ctAt[i]] - meanCt - y * meanCtY));
    }
  });
}

/// where(mask != 0, in, fill) into a scratch buffer, then softmax over its dense rows into `out`
/// (meshc::gen's maskedSoftmax; here one elementwise launch and the row kernel).
inline void maskedSoftmax(float* out, const float* in, const float* mask, const Shape& outer,
                          const Shape& maskOuter, int64_t size, int64_t maskLane, float fill) {
  constexpr size_t kMaxDims = 8;
  if (outer.size() > kMaxDims) throw std::logic_error("maskedSoftmax: more than 8 outer dims");
  std::array<int64_t, kMaxDims> sizes{}, strides{};
  for (size_t d = 0; d < outer.size(); ++d) {
    sizes[d] = outer[d];
    strides[d] = maskOuter[d];
  }
  int dims = int(outer.size());
  int64_t rows = product(outer);
  meshrt::cuda::Scratch masked(size_t(rows * size) * sizeof(float));
  float* where = masked.as<float>();
  forEachIndex(size_t(rows * size), [=] __device__(int64_t i) {
    int64_t rest = i / size, maskAt = (i % size) * maskLane;
    for (int d = dims; d-- > 0;) {
      maskAt += (rest % sizes[size_t(d)]) * strides[size_t(d)];
      rest /= sizes[size_t(d)];
    }
    where[i] = mask[maskAt] != 0 ? in[i] : fill;
  });
  meshc::cuda::along(out, where, {rows}, {size}, {size}, {size}, {1}, {1}, Along::Softmax, 0.0,
                     size, nullptr);
}

/// meshc::gen's causalMaskedSoftmax: the same values as maskedSoftmax, which this target
/// computes over whole rows (the CUDA target computes causal attention's scores whole, so every
/// score it would read is written).
inline void causalMaskedSoftmax(float* out, const float* in, const float* mask, const Shape& outer,
                                const Shape& maskOuter, int64_t size, int64_t maskLane, float fill,
                                int64_t /*queryDim*/) {
  maskedSoftmax(out, in, mask, outer, maskOuter, size, maskLane, fill);
}
#endif // __CUDACC__

//===------------------------------------------------------------------------------------------===//
// Collectives over a dim (device buffers; packing as meshc::gen's)
//===------------------------------------------------------------------------------------------===//

#ifdef __CUDACC__
inline void allGatherDim(View out, ConstView in, const Shape& inSizes, size_t dimIndex,
                         meshrt::Communicator& group) {
  gen::DimView dims = gen::dimView(inSizes, dimIndex);
  int64_t ranks = group.size();
  if (dims.outer == 1) { // a major-most dim: the blocks are already in rank order
    group.allGather(in.data(), out.data(), in.size());
    return;
  }
  meshrt::cuda::Scratch chunks(in.size() * size_t(ranks) * sizeof(float));
  group.allGather(in.data(), chunks.as<float>(), in.size());
  for (int64_t i = 0; i < ranks; ++i)
    copyRowsBlock(out.data(), dims.size * ranks, i * dims.size, chunks.as<float>() + i * in.size(),
                  dims.size, 0, dims.size, dims.outer, dims.inner);
}

inline void reduceScatterDim(View out, ConstView in, const Shape& inSizes, size_t dimIndex,
                             meshrt::Communicator& group) {
  gen::DimView dims = gen::dimView(inSizes, dimIndex);
  int64_t ranks = group.size(), block = dims.size / ranks;
  if (dims.outer == 1) {
    group.reduceScatter(in.data(), out.data(), out.size());
    return;
  }
  meshrt::cuda::Scratch chunks(in.size() * sizeof(float));
  for (int64_t i = 0; i < ranks; ++i)
    copyRowsBlock(chunks.as<float>() + i * int64_t(out.size()), block, 0, in.data(), dims.size,
                  i * block, block, dims.outer, dims.inner);
  group.reduceScatter(chunks.as<float>(), out.data(), out.size());
}

inline void allToAllDims(View out, ConstView in, const Shape& inSizes, size_t fromIndex,
                         size_t toIndex, meshrt::Communicator& group) {
  int64_t ranks = group.size();
  Shape chunkSizes = inSizes;
  chunkSizes[toIndex] /= ranks;
  int64_t chunk = product(chunkSizes);
  meshrt::cuda::Scratch send(in.size() * sizeof(float)), received(in.size() * sizeof(float));
  gen::DimView toView = gen::dimView(inSizes, toIndex);
  for (int64_t i = 0; i < ranks; ++i)
    copyRowsBlock(send.as<float>() + i * chunk, chunkSizes[toIndex], 0, in.data(), toView.size,
                  i * chunkSizes[toIndex], chunkSizes[toIndex], toView.outer, toView.inner);
  group.allToAll(send.as<float>(), received.as<float>(), size_t(chunk));
  Shape outSizes = chunkSizes;
  outSizes[fromIndex] *= ranks;
  gen::DimView fromView = gen::dimView(chunkSizes, fromIndex);
  for (int64_t i = 0; i < ranks; ++i)
    copyRowsBlock(out.data(), outSizes[fromIndex], i * fromView.size,
                  received.as<float>() + i * chunk, fromView.size, 0, fromView.size, fromView.outer,
                  fromView.inner);
}

inline void sliceDim(View out, ConstView in, const Shape& inSizes, size_t dimIndex, int64_t block,
                     int64_t blocks) {
  gen::DimView dims = gen::dimView(inSizes, dimIndex);
  int64_t rows = dims.size / blocks;
  copyRowsBlock(out.data(), rows, 0, in.data(), dims.size, block * rows, rows, dims.outer,
                dims.inner);
}
#endif // __CUDACC__

//===------------------------------------------------------------------------------------------===//
// Params: the host side of device shards (getParam/setParam, checkpoints), train updates
//===------------------------------------------------------------------------------------------===//

/// meshc::gen::ParamShard over a device buffer.
struct ParamShard {
  std::string path;
  bool optimizerState = false;
  std::string dtype;
  Shape globalShape, localShape;
  std::vector<std::string> dims;
  std::vector<std::vector<std::string>> axes;
  Buffer* data = nullptr; // this rank's shard on the device, row-major over localShape
  std::string stageAxis;  // pipeline stages: gen::ParamShard's
  uint64_t stages = 0;

  /// The host-side description (gen's shard functions) over `host`.
  gen::ParamShard onHost(gen::Buffer& host) const {
    return {path, optimizerState, dtype, globalShape, localShape,
            dims, axes,           &host, stageAxis,   stages};
  }
};

inline ParamShard& findParamShard(std::vector<ParamShard>& shards, const std::string& path,
                                  const char* program) {
  for (ParamShard& shard : shards)
    if (shard.path == path) return shard;
  throw std::invalid_argument(std::string(program) + ": no param named '" + path + "'");
}

/// Host buffers for every shard, with gen's descriptions: downloaded (waits for the rank's
/// stream) for a save, only sized for a load.
struct HostParams {
  std::vector<gen::Buffer> values;
  std::vector<gen::ParamShard> shards;
  HostParams(const std::vector<ParamShard>& device, bool download) : values(device.size()) {
    for (size_t k = 0; k < device.size(); ++k) {
      if (download)
        values[k] = *device[k].data;
      else
        values[k].resize(device[k].data->size());
      shards.push_back(device[k].onHost(values[k]));
    }
  }
};

/// The global value of a param (collective over `world`): downloaded, then gathered as on the
/// CPU (the nccl backend stages host buffers).
inline Tensor gatherParam(meshrt::Communicator& world, const ParamShard& shard) {
  meshrt::cuda::Scope scope(contextOf(world, MathMode::FP32));
  gen::Buffer host = *shard.data;
  return gen::gatherParam(world, shard.onHost(host));
}

/// Sets this rank's device shard of a param from its global value (no communication).
inline void scatterParam(meshrt::Communicator& world, ParamShard& shard, const Tensor& global) {
  meshrt::cuda::Scope scope(contextOf(world, MathMode::FP32));
  gen::Buffer host;
  gen::ParamShard hostShard = shard.onHost(host);
  gen::scatterParam(world, hostShard, global);
  *shard.data = Buffer(host);
  check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (setParam)");
}

/// The generated save(): the params downloaded, then saved as meshc::gen::saveParams does (the
/// checkpoint's own collectives run on host memory, which the nccl backend stages).
inline void saveParams(meshrt::Communicator& world, const std::string& dir,
                       std::vector<ParamShard>& shards, const meshrt::CheckpointInfo& info) {
  meshrt::cuda::Scope scope(contextOf(world, MathMode::FP32));
  HostParams host(shards, /*download=*/true);
  gen::saveParams(world, dir, host.shards, info);
}

/// The generated load(): read into host copies, then uploaded into the device params.
inline meshrt::CheckpointInfo loadParams(meshrt::Communicator& world, const std::string& dir,
                                         std::vector<ParamShard>& shards) {
  meshrt::cuda::Scope scope(contextOf(world, MathMode::FP32));
  HostParams host(shards, /*download=*/false);
  meshrt::CheckpointInfo info = gen::loadParams(world, dir, host.shards);
  for (size_t k = 0; k < shards.size(); ++k)
    *shards[k].data = Buffer(host.values[k]);
  check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (load)");
  return info;
}

/// A train step's update: the param's device storage takes the step's new value.
inline void copyValues(View to, ConstView from) {
  if (from.size())
    check(cudaMemcpyAsync(to.data(), from.data(), from.size() * sizeof(float),
                          cudaMemcpyDeviceToDevice, stream()),
          "cudaMemcpyAsync (update)");
}

/// Zeroes a subroutine's argument before a kernel that writes only part of it.
inline void zero(View to) {
  meshrt::cuda::fill(to.data(), to.size(), 0.0f);
}

/// The planner's bucketed_all_reduce_sum: the values packed into one device buffer, one NCCL
/// all-reduce, unpacked.
inline void allReduceBucket(meshrt::Communicator& group, std::span<const View> values) {
  size_t total = 0;
  for (View value : values)
    total += value.size();
  meshrt::cuda::Scratch packed(total * sizeof(float));
  size_t at = 0;
  for (View value : values) {
    copyValues(View{packed.as<float>() + at, value.size()}, value);
    at += value.size();
  }
  group.allReduce(packed.as<float>(), total, meshrt::ReduceOp::Sum);
  at = 0;
  for (View value : values) {
    copyValues(value, ConstView(packed.as<float>() + at, value.size()));
    at += value.size();
  }
}
inline void allReduceBucket(meshrt::Communicator& group, std::initializer_list<View> values) {
  allReduceBucket(group, std::span<const View>(values.begin(), values.size()));
}

/// An all-reduce started by schedule-collectives (meshc::gen::startAllReduceOf), on device spans.
inline meshrt::Request startAllReduce(meshrt::Communicator& group,
                                      std::initializer_list<View> values, meshrt::ReduceOp op) {
  return gen::startAllReduceOf<View>(group, values, op);
}

/// Pipeline stages (meshc::gen::stageTransfer): point to point on device memory (NCCL
/// send/recv on the stream); a started send keeps a device copy.
using gen::stageTransfer;
using gen::stageTransferStarted;
using gen::waitStageSends;
using StageSend = gen::StageSendOf<Buffer>;

} // namespace meshc::cuda
