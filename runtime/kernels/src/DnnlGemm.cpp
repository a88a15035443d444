// oneDNN GEMM for EinsumPlan: one matmul primitive per plan over all batch dims (their strides
// as given), alpha as a runtime output scale and beta as a sum post-op. Measured (bench/README.md):
// for one GEMM matmul and dnnl_sgemm run alike; for the attention's batches of small GEMMs one
// matmul call beats a loop of dnnl_sgemm calls, so matmul is the default and the dnnl_sgemm loop
// serves the layouts for which oneDNN offers only its reference matmul.
#include "DnnlGemm.h"

#include "meshrt/kernels/Index.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

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
  int threads = blasThreads();
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
  return threads;
}

OmpThreadsFor::OmpThreadsFor(int threads) : previous_(omp_get_max_threads()) {
  if (previous_ != threads) omp_set_num_threads(threads);
}

OmpThreadsFor::~OmpThreadsFor() {
  if (omp_get_max_threads() != previous_) omp_set_num_threads(previous_);
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
  // A bias along c's columns: 1 on every batch dim and the rows.
  dnnl::memory::dims biasDims(batchSizes_.size(), 1), biasStrides(batchSizes_.size(), c_.cols);
  biasDims.insert(biasDims.end(), {1, c_.cols});
  biasStrides.insert(biasStrides.end(), {c_.cols, 1});
  biasDesc_ = dnnl::memory::desc(biasDims, Type::f32, biasStrides);
  auto first = create(useBlasThreadCount(), Epilogue::None);
  if (!first->usable) return; // the sgemm loop takes any strides, and is far faster than ref
  variants_.push_back(first);
  useMatmul_ = true;
  implementation_ = "matmul " + first->implementation;
}

std::string DnnlGemm::describe() const {
  return implementation_;
}

std::shared_ptr<const DnnlGemm::Variant> DnnlGemm::create(int threads, Epilogue epilogue) const {
  dnnl::primitive_attr attr;
  // A scratchpad per call (from the calling thread's buffer) keeps concurrent runs apart.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // alpha as a runtime output scale, except under a bias epilogue (alpha is 1 there): oneDNN
  // 2.6 then chooses its brgemm matmul, which applies the bias and GELU to each tile in
  // registers, where with the runtime scale it falls back to gemm:jit and a post-processing
  // pass (FFN 512x256 . 256x512 with bias + GELU, one core of the AMD EPYC host, best of 150:
  // gemm:jit 1442 us, brg:avx512_core 1345 us, the plain GEMM 1166-1180 us either way).
  bool scaled = epilogue == Epilogue::None || epilogue == Epilogue::Accumulate;
  if (scaled) attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
  dnnl::post_ops ops;
  if (epilogue == Epilogue::Accumulate) ops.append_sum(1.0f);
  if (epilogue == Epilogue::BiasGelu)
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f);
  attr.set_post_ops(ops);
  bool bias = epilogue == Epilogue::Bias || epilogue == Epilogue::BiasGelu;
  try {
    dnnl::matmul::primitive_desc pd(bias ? dnnl::matmul::desc(aDesc_, bDesc_, biasDesc_, cDesc_)
                                         : dnnl::matmul::desc(aDesc_, bDesc_, cDesc_),
                                    attr, cpuEngine());
    std::string name = pd.impl_info_str();
    // The reference implementation is a scalar loop: not worth its post-ops.
    return std::make_shared<const Variant>(Variant{threads, epilogue, name.rfind("ref", 0) != 0,
                                                   scaled, dnnl::matmul(pd), pd.scratchpad_desc(),
                                                   name});
  } catch (const dnnl::error&) {
    // A layout or post-op oneDNN's matmul rejects.
    return std::make_shared<const Variant>(Variant{threads, epilogue, false, scaled, {}, {}, ""});
  }
}

std::shared_ptr<const DnnlGemm::Variant> DnnlGemm::variant(int threads, Epilogue epilogue) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& v : variants_)
    if (v->threads == threads && v->epilogue == epilogue) return v;
  variants_.push_back(create(threads, epilogue));
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

void DnnlGemm::run(const float* a, const float* b, float* c, float alpha, float beta,
                   int threads) const {
  OmpThreadsFor scope(threads);
  if (!useMatmul_) {
    runSgemmLoop(a, b, c, alpha, beta);
    return;
  }
  bool accumulate = beta != 0;
  if (accumulate && beta != 1) scaleOutput(c, beta);
  execute(boundFor(threads, accumulate ? Epilogue::Accumulate : Epilogue::None), a, b, nullptr, c,
          alpha);
}

bool DnnlGemm::runBiasActivation(const float* a, const float* b, const float* bias, float* c,
                                 bool gelu, int threads) const {
  if (!useMatmul_) return false;
  OmpThreadsFor scope(threads);
  Bound& bound = boundFor(threads, gelu ? Epilogue::BiasGelu : Epilogue::Bias);
  if (!bound.usable) return false;
  execute(bound, a, b, bias, c, 1.0f);
  return true;
}

void DnnlGemm::execute(Bound& bound, const float* a, const float* b, const float* bias, float* c,
                       float alpha) const {
  // The calling thread's memory objects for this plan and variant, made once: a call only
  // points them at this call's buffers.
  bound.a.set_data_handle(const_cast<float*>(a));
  bound.b.set_data_handle(const_cast<float*>(b));
  bound.c.set_data_handle(c);
  thread_local std::vector<char> scratch; // one per thread, as large as its largest plan's
  scratch.resize(std::max<size_t>(scratch.size(), bound.scratchBytes));
  bound.scratch.set_data_handle(scratch.data());
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, bound.a},
                                             {DNNL_ARG_WEIGHTS, bound.b},
                                             {DNNL_ARG_DST, bound.c},
                                             {DNNL_ARG_SCRATCHPAD, bound.scratch}};
  if (bound.scaled) {
    *static_cast<float*>(bound.scale.get_data_handle()) = alpha;
    args.emplace(DNNL_ARG_ATTR_OUTPUT_SCALES, bound.scale);
  } else if (alpha != 1.0f) {
    throw std::logic_error("meshrt::kernels: a GEMM epilogue with alpha other than 1");
  }
  if (bias) {
    bound.bias.set_data_handle(const_cast<float*>(bias));
    args.emplace(DNNL_ARG_BIAS, bound.bias);
  }
  bound.primitive.execute(bound.stream, args);
  bound.stream.wait();
}

DnnlGemm::Bound& DnnlGemm::boundFor(int threads, Epilogue epilogue) const {
  // Keyed by the plan's serial number, never reused (an address may be, by a later plan). A
  // thread that has run many plans starts over, so that dead plans' primitives are let go.
  // Creating five dnnl::memory per call cost allocations and a lock on the plan, which the
  // ranks of a threads world share: each thread keeps its own.
  constexpr size_t kMaxBound = 256;
  using Key = std::tuple<uint64_t, int, Epilogue>;
  thread_local std::map<Key, std::unique_ptr<Bound>> cache;
  Key key{serial_, threads, epilogue};
  if (cache.size() >= kMaxBound && !cache.count(key)) cache.clear();
  std::unique_ptr<Bound>& slot = cache[key];
  if (slot) return *slot;
  std::shared_ptr<const Variant> v = variant(threads, epilogue);
  if (!v->usable) {
    slot = std::make_unique<Bound>();
    return *slot;
  }
  const dnnl::engine& engine = cpuEngine();
  slot = std::make_unique<Bound>(Bound{
      true, v->scaled, v->primitive, threadStream(), dnnl::memory(aDesc_, engine, DNNL_MEMORY_NONE),
      dnnl::memory(bDesc_, engine, DNNL_MEMORY_NONE),
      dnnl::memory(cDesc_, engine, DNNL_MEMORY_NONE),
      dnnl::memory({{1}, Type::f32, Tag::x}, engine),
      dnnl::memory(v->scratchpad, engine, DNNL_MEMORY_NONE),
      dnnl::memory(biasDesc_, engine, DNNL_MEMORY_NONE), v->scratchpad.get_size()});
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
