// The per-rank device context, scratch memory and error checks of meshrt_cuda.
#include "meshrt/cuda/Cuda.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>

namespace meshrt::cuda {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(status) +
                           ": " + cudaGetErrorString(status));
}

void checkCublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(std::string("cuBLAS error in ") + what + ": " +
                           cublasGetStatusName(status) + ": " + cublasGetStatusString(status));
}

const char* mathModeName(MathMode mode) {
  switch (mode) {
  case MathMode::FP32:
    return "fp32";
  case MathMode::TF32:
    return "tf32";
  case MathMode::BF16:
    return "bf16";
  }
  return "fp32";
}

cublasComputeType_t computeTypeOf(MathMode mode) {
  switch (mode) {
  case MathMode::FP32:
    return CUBLAS_COMPUTE_32F;
  case MathMode::TF32:
    return CUBLAS_COMPUTE_32F_FAST_TF32;
  case MathMode::BF16:
    return CUBLAS_COMPUTE_32F_FAST_16BF;
  }
  return CUBLAS_COMPUTE_32F;
}

namespace {
thread_local const Context* currentContext = nullptr;

/// This thread's cuBLAS handles, one per device (a handle belongs to the device current when it
/// was made); destroyed with the thread.
struct Handles {
  std::map<int, cublasHandle_t> byDevice;
  ~Handles() {
    for (auto& [device, handle] : byDevice)
      cublasDestroy(handle);
  }
};
thread_local Handles handles;
} // namespace

cublasHandle_t Context::cublas() const {
  auto it = handles.byDevice.find(device);
  if (it == handles.byDevice.end()) {
    cublasHandle_t handle;
    checkCublas(cublasCreate(&handle), "cublasCreate");
    it = handles.byDevice.emplace(device, handle).first;
  }
  checkCublas(cublasSetStream(it->second, stream), "cublasSetStream");
  return it->second;
}

const Context& current() {
  if (!currentContext)
    throw std::logic_error("meshrt::cuda: no current context (generated code sets one with "
                           "meshrt::cuda::Scope)");
  return *currentContext;
}

Scope::Scope(const Context& context) : context_(context), previous_(currentContext) {
  check(cudaSetDevice(context.device), "cudaSetDevice");
  // Keep freed stream-ordered memory in the device's pool across synchronizations (the default
  // threshold 0 returns it to the driver at every sync, and generated code allocates per run).
  static std::mutex mutex;
  static std::set<int> configured;
  std::lock_guard<std::mutex> lock(mutex);
  if (configured.insert(context.device).second) {
    cudaMemPool_t pool;
    check(cudaDeviceGetDefaultMemPool(&pool, context.device), "cudaDeviceGetDefaultMemPool");
    uint64_t threshold = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
          "cudaMemPoolSetAttribute");
  }
  currentContext = &context_;
}

Scope::~Scope() {
  currentContext = previous_;
  if (previous_) cudaSetDevice(previous_->device);
}

Scratch::Scratch(size_t bytes) : stream_(current().stream) {
  if (bytes) check(cudaMallocAsync(&memory_, bytes, stream_), "cudaMallocAsync (scratch)");
}

Scratch::~Scratch() {
  if (memory_) cudaFreeAsync(memory_, stream_);
}

void copyToDevice(void* to, const void* from, size_t bytes) {
  if (bytes)
    check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, current().stream),
          "cudaMemcpyAsync (host to device)");
}

template <class T> T* upload(Scratch& scratch, const std::vector<T>& values, size_t at) {
  T* to = scratch.as<T>() + at;
  // From pageable memory: the copy is staged before the call returns, so `values` may die.
  copyToDevice(to, values.data(), values.size() * sizeof(T));
  return to;
}

template int64_t* upload<int64_t>(Scratch&, const std::vector<int64_t>&, size_t);
template float* upload<float>(Scratch&, const std::vector<float>&, size_t);
template double* upload<double>(Scratch&, const std::vector<double>&, size_t);
template const float** upload<const float*>(Scratch&, const std::vector<const float*>&, size_t);

} // namespace meshrt::cuda
