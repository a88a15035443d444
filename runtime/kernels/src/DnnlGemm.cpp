// oneDNN GEMM for EinsumPlan: one matmul primitive per plan over all batch dims (their strides
// as given), alpha as a runtime output scale and beta as a sum post-op. Measured (bench/README.md):
// for one GEMM matmul and dnnl_sgemm run alike; for the attention's batches of small GEMMs one
// matmul call beats a loop of dnnl_sgemm calls, so matmul is the default and the dnnl_sgemm loop
// serves the layouts for which oneDNN offers only its reference matmul.
#include "DnnlGemm.h"

#include "meshrt/kernels/Index.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <stdexcept>
#include <tuple>

namespace meshrt::kernels::detail {
namespace {

using Tag = dnnl::memory::format_tag;
using Type = dnnl::memory::data_type;

const dnnl::engine& cpuEngine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

/// A stream per thread: streams are not meant to be shared between threads.
dnnl::stream& threadStream() {
  thread_local dnnl::stream stream(cpuEngine());
  return stream;
}

/// Rows and cols strides as the matrix is walked by a GEMM (leading dim and unit stride).
std::pair<int64_t, int64_t> matrixStrides(const EinsumPlan::Matrix& m) {
  return m.transpose ? std::pair<int64_t, int64_t>{1, m.ld} : std::pair<int64_t, int64_t>{m.ld, 1};
}

dnnl::memory::desc describeMatrix(const std::vector<int64_t>& batchSizes,
                                  const EinsumPlan::Matrix& m) {
  dnnl::memory::dims dims(batchSizes.begin(), batchSizes.end());
  dnnl::memory::dims strides(m.batchStrides.begin(), m.batchStrides.end());
  auto [rowStride, colStride] = matrixStrides(m);
  dims.push_back(m.rows);
  dims.push_back(m.cols);
  strides.push_back(rowStride);
  strides.push_back(colStride);
  return dnnl::memory::desc(dims, Type::f32, strides);
}

uint64_t nextSerial() {
  static std::atomic<uint64_t> serial{0};
  return serial.fetch_add(1, std::memory_order_relaxed);
}

} // namespace

int useBlasThreadCount() {
  int threads = std::max(1, openblas_get_num_threads());
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
  return threads;
}

DnnlGemm::DnnlGemm(const std::vector<int64_t>& batchSizes, const EinsumPlan::Matrix& a,
                   const EinsumPlan::Matrix& b, const EinsumPlan::Matrix& c)
    : batchSizes_(batchSizes), a_(a), b_(b), c_(c), serial_(nextSerial()) {
  implementation_ = "sgemm loop";
  // oneDNN's matmul takes at most 12 dims (2 of them the matrix's).
  if (batchSizes_.size() + 2 > DNNL_MAX_NDIMS) return;
  aDesc_ = describeMatrix(batchSizes_, a_);
  bDesc_ = describeMatrix(batchSizes_, b_);
  cDesc_ = describeMatrix(batchSizes_, c_);
  try {
    auto first = create(useBlasThreadCount(), false);
    const std::string& name = first->implementation;
    // The reference implementation is a scalar loop: the sgemm loop is far faster.
    if (name.rfind("ref", 0) == 0) return;
    variants_.push_back(first);
    useMatmul_ = true;
    implementation_ = "matmul " + name;
  } catch (const dnnl::error&) {
    // A layout oneDNN's matmul rejects: the sgemm loop takes any strides.
  }
}

std::string DnnlGemm::describe() const {
  return implementation_;
}

std::shared_ptr<const DnnlGemm::Variant> DnnlGemm::create(int threads, bool accumulate) const {
  dnnl::primitive_attr attr;
  // A scratchpad per call (from the calling thread's buffer) keeps concurrent runs apart.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(aDesc_, bDesc_, cDesc_), attr, cpuEngine());
  return std::make_shared<const Variant>(
      Variant{threads, accumulate, dnnl::matmul(pd), pd.scratchpad_desc(), pd.impl_info_str()});
}

std::shared_ptr<const DnnlGemm::Variant> DnnlGemm::variant(int threads, bool accumulate) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& v : variants_)
    if (v->threads == threads && v->accumulate == accumulate) return v;
  variants_.push_back(create(threads, accumulate));
  return variants_.back();
}

void DnnlGemm::scaleOutput(float* c, float beta) const {
  int64_t rows = c_.rows, cols = c_.cols, ld = c_.ld;
  forEachIndex<1>(Dims(batchSizes_), {Dims(c_.batchStrides)}, [&](int64_t offset) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        c[offset + i * ld + j] *= beta;
  });
}

void DnnlGemm::run(const float* a, const float* b, float* c, float alpha, float beta) const {
  int threads = useBlasThreadCount();
  if (!useMatmul_) {
    runSgemmLoop(a, b, c, alpha, beta);
    return;
  }
  bool accumulate = beta != 0;
  if (accumulate && beta != 1) scaleOutput(c, beta);
  // The calling thread's memory objects for this plan and variant, made once: a call then only
  // points them at this call's buffers (creating five dnnl::memory per call cost allocations
  // and a lock on the plan, which the ranks of a threads world share).
  Bound& bound = boundFor(threads, accumulate);
  bound.a.set_data_handle(const_cast<float*>(a));
  bound.b.set_data_handle(const_cast<float*>(b));
  bound.c.set_data_handle(c);
  *static_cast<float*>(bound.scale.get_data_handle()) = alpha;
  thread_local std::vector<char> scratch; // one per thread, as large as its largest plan's
  scratch.resize(std::max<size_t>(scratch.size(), bound.scratchBytes));
  bound.scratch.set_data_handle(scratch.data());
  bound.primitive.execute(bound.stream, {{DNNL_ARG_SRC, bound.a},
                                         {DNNL_ARG_WEIGHTS, bound.b},
                                         {DNNL_ARG_DST, bound.c},
                                         {DNNL_ARG_ATTR_OUTPUT_SCALES, bound.scale},
                                         {DNNL_ARG_SCRATCHPAD, bound.scratch}});
  bound.stream.wait();
}

DnnlGemm::Bound& DnnlGemm::boundFor(int threads, bool accumulate) const {
  // Keyed by the plan's serial number, never reused (an address may be, by a later plan). A
  // thread that has run many plans starts over, so that dead plans' primitives are let go.
  constexpr size_t kMaxBound = 256;
  thread_local std::map<std::tuple<uint64_t, int, bool>, std::unique_ptr<Bound>> cache;
  if (cache.size() >= kMaxBound && !cache.count({serial_, threads, accumulate})) cache.clear();
  std::unique_ptr<Bound>& slot = cache[{serial_, threads, accumulate}];
  if (slot) return *slot;
  std::shared_ptr<const Variant> v = variant(threads, accumulate);
  const dnnl::engine& engine = cpuEngine();
  slot = std::make_unique<Bound>(
      Bound{v->primitive, threadStream(), dnnl::memory(aDesc_, engine, DNNL_MEMORY_NONE),
            dnnl::memory(bDesc_, engine, DNNL_MEMORY_NONE),
            dnnl::memory(cDesc_, engine, DNNL_MEMORY_NONE),
            dnnl::memory({{1}, Type::f32, Tag::x}, engine),
            dnnl::memory(v->scratchpad, engine, DNNL_MEMORY_NONE), v->scratchpad.get_size()});
  return *slot;
}

void DnnlGemm::runSgemmLoop(const float* a, const float* b, float* c, float alpha,
                            float beta) const {
  int64_t m = c_.rows, n = c_.cols, k = a_.cols;
  char transA = a_.transpose ? 'T' : 'N', transB = b_.transpose ? 'T' : 'N';
  forEachIndex<3>(
      Dims(batchSizes_), {Dims(a_.batchStrides), Dims(b_.batchStrides), Dims(c_.batchStrides)},
      [&](int64_t offsetA, int64_t offsetB, int64_t offsetC) {
        dnnl_status_t status = dnnl_sgemm(transA, transB, m, n, k, alpha, a + offsetA, a_.ld,
                                          b + offsetB, b_.ld, beta, c + offsetC, c_.ld);
        if (status != dnnl_success) throw std::runtime_error("meshrt::kernels: dnnl_sgemm failed");
      });
}

} // namespace meshrt::kernels::detail
