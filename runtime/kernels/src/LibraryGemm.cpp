// EinsumPlan's GEMM: oneDNN or OpenBLAS by measurement, per shape, once per process
// (LibraryGemm.h says why). A measurement times both on the call's own operands into a scratch
// output, warm-up first, then alternated rounds, best of each; from 4 MFLOP OpenBLAS is taken
// only when it is clearly faster (kMargin), so that a near tie keeps oneDNN, and below only when
// oneDNN is not clearly faster (kSmallMargin: a tight loop flatters oneDNN's small GEMMs). An
// epilogue takes the faster of oneDNN's post-ops and the plain GEMM then a pass, with no margin:
// the post-ops' GELU ran 3-4% slower on the lm forward's FFN GEMM and a near tie had kept them
// (docs/runtime.md).
#include "LibraryGemm.h"

#include "VectorClones.h"

#include "meshrt/kernels/Index.h"
#include "meshrt/kernels/MathF32.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace meshrt {
namespace kernels {
namespace {

/// Rounds enough that a short GEMM's best is not one lucky or interrupted call: as many as fit
/// in this time, 3 to 15 of them.
constexpr double kShortMeasureSeconds = 2e-4;
/// OpenBLAS (or the plain GEMM then a pass) must take less than this share of the other's time.
constexpr double kMargin = 0.95;
/// Below kSplitFlops the margin turns the other way: OpenBLAS is taken unless oneDNN takes less
/// than 1 / kSmallMargin of its time. A measurement calls a GEMM in a tight loop, its code and
/// operands in the core's caches; in a step, between other ops, oneDNN's small GEMMs ran
/// 1.2-3.4x their measured time and OpenBLAS's about theirs (the MoE train step on [data=2]:
/// 64 x 32 . 32 x 4 at 12.0 us a step against 3.5, the expert GEMMs 49.5-54.4 against
/// 36.4-36.5), and which library a near tie picked moved the step between 0.35 and 0.49 ms
/// from one process to the next (0.28-0.29 with OpenBLAS alone; docs/runtime.md).
constexpr double kSmallMargin = 1.25;
/// A GEMM runs on the BLAS threads from this size on, on one thread below: about 40 us on one
/// core here, where an OpenMP region's start and join with sleeping waits costs 10-30 us
/// (oneDNN's 128x64 . 64x256, 2^22 flops, best of 400 with passive waits: 46-49 us on one
/// thread, 49-76 on two; twice the flops, 88-89 against 81-95). An OpenBLAS GEMM is split in
/// blocks of rows or columns that are multiples of kSplitAlign (its f32 kernels' tile).
constexpr int64_t kSplitFlops = int64_t(1) << 22;
constexpr int64_t kSplitAlign = 16;

GemmLibrary libraryFromEnvironment() {
  const char* text = std::getenv("MESHRT_GEMM_LIBRARY");
  std::string name = text ? text : "";
  if (name.empty() || name == "measured") return GemmLibrary::Measured;
  if (name == "onednn") return GemmLibrary::OneDnn;
  if (name == "openblas") return GemmLibrary::OpenBlas;
  throw std::invalid_argument("meshrt: MESHRT_GEMM_LIBRARY='" + name +
                              "': expected onednn, openblas or measured");
}

std::atomic<GemmLibrary>& libraryChoice() {
  static std::atomic<GemmLibrary> choice{libraryFromEnvironment()};
  return choice;
}

/// Seconds `fn` takes: the calling thread's CPU time when it computes alone (other processes
/// and rank threads on the same core do not count), wall time when library threads help.
template <class Fn> double secondsOf(int threads, Fn&& fn) {
  if (threads > 1) {
    auto start = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  timespec start{}, end{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
  fn();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
  return double(end.tv_sec - start.tv_sec) + 1e-9 * double(end.tv_nsec - start.tv_nsec);
}

/// Times two contenders alternately: one warm-up each (primitive creation, JIT, first touches),
/// then rounds (one when a call is long: the first call pays the measurement); true when the
/// second's best is under `margin` of the first's.
template <class First, class Second>
bool secondFaster(int threads, First&& first, Second&& second, double margin) {
  double warm = secondsOf(threads, first);
  secondsOf(threads, second);
  int rounds = warm > 0.02 ? 1 : 3;
  double best[2] = {std::numeric_limits<double>::infinity(),
                    std::numeric_limits<double>::infinity()};
  for (int round = 0; round < rounds; ++round) {
    if (round == 1) // the first round's times, free of set-up, say how many more fit
      rounds = std::clamp(int(kShortMeasureSeconds / (best[0] + best[1])), rounds, 15);
    best[0] = std::min(best[0], secondsOf(threads, first));
    best[1] = std::min(best[1], secondsOf(threads, second));
  }
  return best[1] < margin * best[0];
}

/// The process's choices by shape; an entry is measured once, by the first thread to need it
/// (rank threads of the same layer wait for it rather than measure beside it).
struct Choice {
  std::once_flag once;
  bool value = false;
};

Choice& choiceFor(const std::vector<int64_t>& key) {
  static std::mutex mutex;
  static std::map<std::vector<int64_t>, std::unique_ptr<Choice>> table;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Choice>& slot = table[key];
  if (!slot) slot = std::make_unique<Choice>();
  return *slot;
}

void appendMatrix(std::vector<int64_t>& key, const EinsumPlan::Matrix& m) {
  key.insert(key.end(), {m.rows, m.cols, m.ld, m.transpose ? 1 : 0});
  key.insert(key.end(), m.batchStrides.begin(), m.batchStrides.end());
}

} // namespace

void setGemmLibrary(GemmLibrary library) {
  libraryChoice().store(library);
}

GemmLibrary gemmLibrary() {
  return libraryChoice().load();
}

namespace detail {

MESHRT_VECTOR_CLONES
void addBiasActivation(float* out, int64_t count, int64_t lane, const float* bias, bool gelu) {
  for (int64_t row = 0; row < count; row += lane) {
    float* __restrict values = out + row;
    if (gelu)
      for (int64_t j = 0; j < lane; ++j)
        values[j] = f32::gelu(values[j] + bias[j]);
    else
      for (int64_t j = 0; j < lane; ++j)
        values[j] += bias[j];
  }
}

LibraryGemm::LibraryGemm(const std::vector<int64_t>& batchSizes, const EinsumPlan::Matrix& a,
                         const EinsumPlan::Matrix& b, const EinsumPlan::Matrix& c)
    : batchSizes_(batchSizes), a_(a), b_(b), c_(c), oneDnn_(batchSizes, a, b, c) {
  int64_t batch = 1;
  cSpan_ = (c.rows - 1) * c.ld + c.cols; // c is never transposed
  for (size_t i = 0; i < batchSizes.size(); ++i) {
    batch *= batchSizes[i];
    cSpan_ += (batchSizes[i] - 1) * c.batchStrides[i];
  }
  flops_ = 2 * batch * c.rows * c.cols * a.cols;
}

std::string LibraryGemm::describe() const {
  GemmLibrary library = gemmLibrary();
  bool openBlas = library == GemmLibrary::OpenBlas ||
                  (library == GemmLibrary::Measured &&
                   cached_[int(Use::Plain)].load(std::memory_order_relaxed) % 2 == 1);
  return openBlas ? "cblas_sgemm loop" : oneDnn_.describe();
}

std::vector<int64_t> LibraryGemm::key(Use use, int threads) const {
  std::vector<int64_t> key{int64_t(use), threads};
  key.insert(key.end(), batchSizes_.begin(), batchSizes_.end());
  for (const EinsumPlan::Matrix* m : {&a_, &b_, &c_})
    appendMatrix(key, *m);
  return key;
}

bool LibraryGemm::choose(Use use, const float* a, const float* b, const float* bias) const {
  // First, whatever runs: the thread's OpenMP count follows the BLAS count (a GEMM may run on
  // fewer, see threads()).
  useBlasThreadCount();
  int threads = this->threads();
  switch (gemmLibrary()) {
  case GemmLibrary::OneDnn:
    return use != Use::Plain;
  case GemmLibrary::OpenBlas:
    return use == Use::Plain;
  case GemmLibrary::Measured:
    break;
  }
  // Every GEMM is measured, however small: until session 33 those under 4 MFLOP ran through
  // oneDNN unmeasured, and the MoE example's expert GEMMs (batches of 4 of 40 x 64 x 32, 0.3
  // MFLOP) took 1.3x OpenBLAS's time in its step; the smallest pay oneDNN's ~1 us a call most
  // (16^3: 1.1 us, 0.17 through OpenBLAS; docs/runtime.md).
  std::atomic<int64_t>& cached = cached_[int(use)];
  int64_t known = cached.load(std::memory_order_relaxed);
  if (known != 0 && known / 2 == threads) return known % 2 == 1;
  Choice& choice = choiceFor(key(use, threads));
  std::call_once(choice.once, [&] { choice.value = measure(use, a, b, bias); });
  cached.store(2 * threads + (choice.value ? 1 : 0), std::memory_order_relaxed);
  return choice.value;
}

int LibraryGemm::threads() const {
  return flops_ >= kSplitFlops ? blasThreads() : 1;
}

bool LibraryGemm::measure(Use use, const float* a, const float* b, const float* bias) const {
  // The plain GEMM's choice first: its measurement uses the same scratch.
  if (use != Use::Plain) choose(Use::Plain, a, b, nullptr);
  thread_local std::vector<float> scratch;
  scratch.resize(std::max<size_t>(scratch.size(), size_t(cSpan_)));
  float* out = scratch.data();
  int threads = this->threads();
  if (use == Use::Plain)
    return secondFaster(
        threads, [&] { oneDnn_.run(a, b, out, 1.0f, 0.0f, threads); },
        [&] { runOpenBlas(a, b, out, 1.0f, 0.0f); }, flops_ < kSplitFlops ? kSmallMargin : kMargin);
  bool gelu = use == Use::BiasGelu;
  if (!oneDnn_.runBiasActivation(a, b, bias, out, gelu, threads)) return false; // no fused form
  return !secondFaster(
      threads, [&] { oneDnn_.runBiasActivation(a, b, bias, out, gelu, threads); },
      [&] {
        run(a, b, out, 1.0f, 0.0f);
        addBiasActivation(out, cSpan_, c_.cols, bias, gelu);
      },
      1.0);
}

void LibraryGemm::run(const float* a, const float* b, float* c, float alpha, float beta) const {
  if (choose(Use::Plain, a, b, nullptr))
    runOpenBlas(a, b, c, alpha, beta);
  else
    oneDnn_.run(a, b, c, alpha, beta, threads());
}

bool LibraryGemm::runBiasActivation(const float* a, const float* b, const float* bias, float* c,
                                    bool gelu) const {
  return choose(gelu ? Use::BiasGelu : Use::Bias, a, b, bias) &&
         oneDnn_.runBiasActivation(a, b, bias, c, gelu, threads());
}

void LibraryGemm::runOpenBlas(const float* a, const float* b, float* c, float alpha,
                              float beta) const {
  int64_t m = c_.rows, n = c_.cols, k = a_.cols;
  auto transA = a_.transpose ? CblasTrans : CblasNoTrans;
  auto transB = b_.transpose ? CblasTrans : CblasNoTrans;
  // One call per batch index; with more than one BLAS thread (OpenBLAS itself runs one, see
  // BlasThreads.cpp) and work enough, each call's rows (or columns, where they are more) split
  // into blocks of a multiple of kSplitAlign, and the calls spread over an OpenMP team, as
  // OpenBLAS's own threads split a GEMM.
  thread_local std::vector<std::array<int64_t, 3>> callerOffsets;
  // The caller's list, by reference: the team's threads would name their own thread_local.
  std::vector<std::array<int64_t, 3>>& offsets = callerOffsets;
  offsets.clear();
  forEachIndex<3>(Dims(batchSizes_),
                  {Dims(a_.batchStrides), Dims(b_.batchStrides), Dims(c_.batchStrides)},
                  [&](int64_t offsetA, int64_t offsetB, int64_t offsetC) {
                    offsets.push_back({offsetA, offsetB, offsetC});
                  });
  bool byRows = m >= n;
  int64_t batches = int64_t(offsets.size()), extent = byRows ? m : n;
  if (batches == 0 || extent == 0) return; // nothing to compute (cblas_sgemm would do nothing)
  int threads = this->threads();
  // Blocks per matrix: enough for the threads the batch entries do not occupy.
  int64_t perMatrix = std::max<int64_t>(
      1, std::min((threads + batches - 1) / batches, (extent + kSplitAlign - 1) / kSplitAlign));
  int64_t block =
      ((extent + perMatrix - 1) / perMatrix + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
  int64_t blocks = (extent + block - 1) / block, tasks = batches * blocks;
  auto runTask = [&](int64_t task) {
    const std::array<int64_t, 3>& offset = offsets[size_t(task / blocks)];
    int64_t first = task % blocks * block, size = std::min(block, extent - first);
    const float* blockA = a + offset[0];
    const float* blockB = b + offset[1];
    float* blockC = c + offset[2];
    // A block of op(a)'s rows starts `first` rows down (a column over, transposed); of op(b)'s
    // columns, `first` columns over (a row down, transposed).
    if (byRows) {
      blockA += a_.transpose ? first : first * a_.ld;
      blockC += first * c_.ld;
    } else {
      blockB += b_.transpose ? first * b_.ld : first;
      blockC += first;
    }
    cblas_sgemm(CblasRowMajor, transA, transB, blasint(byRows ? size : m),
                blasint(byRows ? n : size), blasint(k), alpha, blockA, blasint(a_.ld), blockB,
                blasint(b_.ld), beta, blockC, blasint(c_.ld));
  };
  if (threads == 1 || tasks == 1) {
    for (int64_t task = 0; task < tasks; ++task)
      runTask(task);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t task = 0; task < tasks; ++task)
    runTask(task);
}

} // namespace detail
} // namespace kernels
} // namespace meshrt
