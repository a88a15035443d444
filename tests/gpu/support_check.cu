// Every device support function of generated CUDA (meshc/CudaSupport.h, meshrt_cuda) against
// the C++ target's (meshc/GeneratedSupport.h) on the same inputs: data movement, dropout,
// reductions, the ops along dims, einsum in every layout class and precision mode, and the
// chunk packing around collectives (on a one-rank NCCL group). Needs a GPU (tests/gpu/run.sh
// runs it); ctest only builds it, so that every template of the support header is compiled.
// Prints one line per check; the exit status is the number of failed checks.
#include "meshc/CudaSupport.h"

#include <cmath>
#include <cstdio>
#include <random>

namespace {

using meshc::gen::Buffer;
using meshc::gen::Shape;

int failures = 0;

Buffer randomBuffer(size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Buffer data(count);
  for (float& x : data)
    x = normal(rng);
  return data;
}

/// A device copy of `host` that lives as long as the object.
struct Device {
  meshc::cuda::Buffer buffer;
  explicit Device(const Buffer& host) : buffer(host) {}
  explicit Device(size_t count) : buffer(Buffer(count, 0.0f)) {}
  float* data() { return buffer.data(); }
  meshc::cuda::View view() { return meshc::cuda::View{buffer.data(), buffer.size()}; }
  Buffer host() const { return Buffer(buffer); }
};

void expectClose(const char* what, const Buffer& actual, const Buffer& expected, double tol) {
  double worst = 0;
  bool sizeOk = actual.size() == expected.size();
  for (size_t i = 0; sizeOk && i < actual.size(); ++i) {
    if (std::isnan(expected[i]) != std::isnan(actual[i])) worst = INFINITY;
    if (std::isnan(expected[i])) continue;
    double error =
        std::fabs(double(actual[i]) - expected[i]) / std::max(1.0, std::fabs(double(expected[i])));
    worst = std::max(worst, error);
  }
  bool ok = sizeOk && worst <= tol;
  std::printf("%-48s %s (max relative error %.3g, tolerance %.3g)\n", what, ok ? "ok" : "FAILED",
              worst, tol);
  failures += !ok;
}

/// A GEMM's elementwise error bound: |actual - expected| <= gamma * sum_k |a_mk| |b_kn| (the sum
/// in `absProducts`), with gamma = 2u + u^2 for the mode's conversion of both operands (u: 0 for
/// fp32; one unit in the last place, 2^-10 for TF32's 10-bit mantissa and 2^-7 for bf16's 7-bit
/// one, as cuBLAS does not say whether its conversion rounds to nearest or truncates), plus
/// fp32 accumulation in any order over K terms, K 2^-24 / (1 - K 2^-24) (Higham's gamma_K),
/// and the result's rounding, 2^-24. Deterministic: every correct order and rounding passes.
void expectWithinGemmBound(const char* what, const Buffer& actual, const Buffer& expected,
                           const Buffer& absProducts, double unitRoundoff, int64_t K) {
  double f32 = std::ldexp(1.0, -24), accumulation = double(K) * f32 / (1 - double(K) * f32);
  double gamma = (2 * unitRoundoff + unitRoundoff * unitRoundoff) +
                 accumulation * (1 + unitRoundoff) * (1 + unitRoundoff) + f32;
  double worst = 0;
  bool ok = actual.size() == expected.size();
  for (size_t i = 0; ok && i < actual.size(); ++i) {
    double error = std::fabs(double(actual[i]) - expected[i]);
    double bound = gamma * absProducts[i];
    ok = !std::isnan(actual[i]) && error <= bound;
    worst = std::max(worst, bound > 0 ? error / bound : error > 0 ? INFINITY : 0);
  }
  std::printf("%-48s %s (worst error / bound %.3g, gamma %.3g)\n", what, ok ? "ok" : "FAILED",
              worst, gamma);
  failures += !ok;
}

void checkMovement() {
  Shape sizes = {3, 4, 5};
  Buffer in = randomBuffer(60, 1);
  Device din(in);
  {
    Buffer expected(60);
    meshc::gen::copyStrided(expected.data(), {5, 4, 3}, {12, 3, 1}, in.data(), {1, 5, 20});
    Device out(60);
    meshc::cuda::copyStrided(out.data(), {5, 4, 3}, {12, 3, 1}, din.data(), {1, 5, 20});
    expectClose("copyStrided (transpose)", out.host(), expected, 0);
  }
  {
    Buffer expected(60);
    meshc::gen::reshape(expected.data(), {3, 20}, in.data(), {20, 0}, {0, 1}, {4, 5}, {5, 1});
    Device out(60);
    meshc::cuda::reshape(out.data(), {3, 20}, din.data(), {20, 0}, {0, 1}, {4, 5}, {5, 1});
    expectClose("reshape", out.host(), expected, 0);
  }
  {
    Buffer expected(3 * 7 * 5, 0.0f);
    meshc::gen::copyWindow(expected.data(), in.data(), {3, 5}, {35, 1}, {20, 1}, 5, 5, 7, 4, 2);
    Device out(3 * 7 * 5);
    meshc::cuda::copyWindow(out.data(), din.data(), {3, 5}, {35, 1}, {20, 1}, 5, 5, 7, 4, 2);
    expectClose("copyWindow (pad)", out.host(), expected, 0);
  }
  Buffer ids = {0, 3, 1, 2, 7, 5};
  Device dids(ids);
  {
    Buffer expected(6 * 4);
    meshc::gen::oneHot(expected.data(), {6, 4}, ids.data(), {1, 0}, {0, 1}, 2);
    Device out(6 * 4);
    meshc::cuda::oneHot(out.data(), {6, 4}, dids.data(), {1, 0}, {0, 1}, 2);
    expectClose("oneHot (shard start 2)", out.host(), expected, 0);
  }
  {
    Buffer expected(6 * 5);
    meshc::gen::gather(expected.data(), {6, 5}, in.data(), {0, 1}, ids.data(), {1, 0}, 4, 5, 1);
    Device out(6 * 5);
    meshc::cuda::gather(out.data(), {6, 5}, din.data(), {0, 1}, dids.data(), {1, 0}, 4, 5, 1);
    expectClose("gather (rows 1..4)", out.host(), expected, 0);
  }
  {
    Buffer expected(12);
    meshc::gen::iota(expected.data(), {3, 4}, {0, 1}, 8);
    Device out(12);
    meshc::cuda::iota(out.data(), {3, 4}, {0, 1}, 8);
    expectClose("iota", out.host(), expected, 0);
  }
  {
    uint64_t key = meshrt::streamKey(7, "drop#3");
    Buffer expected(60);
    meshc::gen::dropout(expected.data(), sizes, in.data(), {20, 5, 1}, {40, 5, 1}, 11, key, 0.3);
    Device out(60);
    meshc::cuda::dropout(out.data(), sizes, din.data(), {20, 5, 1}, {40, 5, 1}, 11, key, 0.3);
    expectClose("dropout (same mask)", out.host(), expected, 0);
  }
  for (int64_t offset : {-2, 1, 3}) {
    Buffer expected(60);
    meshc::gen::shift(meshc::gen::View(expected), meshc::gen::ConstView(in), sizes, 1, offset,
                      nullptr);
    Device out(60);
    meshc::cuda::shift(out.view(), meshc::cuda::ConstView(din.data(), 60), sizes, 1, offset,
                       nullptr);
    expectClose(("shift by " + std::to_string(offset)).c_str(), out.host(), expected, 0);
  }
  {
    Buffer expected = in;
    meshc::gen::roundBufferBF16(meshc::gen::View(expected));
    Device out(in);
    meshc::cuda::roundBufferBF16(out.view());
    expectClose("roundBufferBF16", out.host(), expected, 0);
  }
}

void checkLanes() {
  Buffer in = randomBuffer(60, 2);
  Device din(in);
  for (auto kind : {meshc::gen::Reduce::Sum, meshc::gen::Reduce::Max, meshc::gen::Reduce::Min,
                    meshc::gen::Reduce::LogSumExp}) {
    Buffer expected(12);
    meshc::gen::reduce(expected.data(), {3, 4}, in.data(), {20, 1}, {5}, {4}, kind, 0.5);
    Device out(12);
    meshc::cuda::reduce(out.data(), {3, 4}, din.data(), {20, 1}, {5}, {4}, kind, 0.5);
    expectClose("reduce", out.host(), expected, 0);
  }
  for (auto kind :
       {meshc::gen::Along::Softmax, meshc::gen::Along::LogSoftmax, meshc::gen::Along::LayerNorm,
        meshc::gen::Along::Cumsum, meshc::gen::Along::CumsumExclusive}) {
    Buffer expected(60);
    meshc::gen::along(expected.data(), in.data(), {3, 4}, {20, 1}, {20, 1}, {5}, {4}, {4}, kind,
                      1e-5, 5, nullptr);
    Device out(60);
    meshc::cuda::along(out.data(), din.data(), {3, 4}, {20, 1}, {20, 1}, {5}, {4}, {4}, kind, 1e-5,
                       5, nullptr);
    // exp/log on the device may differ from glibc's by an ulp.
    expectClose("along", out.host(), expected, 1e-6);
  }
}

void checkEinsum() {
  // out[b, m, n] = a[b, m, k] b[b, k, n] with a stored [m, b, k] and b stored [b, n, k].
  int64_t B = 3, M = 33, N = 17, K = 65;
  Buffer a = randomBuffer(size_t(B * M * K), 3), b = randomBuffer(size_t(B * K * N), 4);
  meshc::gen::GemmDims d{.batch = {B},
                         .m = {M},
                         .n = {N},
                         .k = {K},
                         .aBatch = {K},
                         .aM = {B * K},
                         .aK = {1},
                         .bBatch = {N * K},
                         .bK = {1},
                         .bN = {K},
                         .outBatch = {M * N},
                         .outM = {N},
                         .outN = {1}};
  Buffer expected(size_t(B * M * N)), absProducts(expected.size());
  meshc::gen::einsum2Double(expected.data(), a.data(), b.data(), d);
  Buffer absA(a), absB(b);
  for (float& x : absA)
    x = std::fabs(x);
  for (float& x : absB)
    x = std::fabs(x);
  meshc::gen::einsum2Double(absProducts.data(), absA.data(), absB.data(), d);
  Device da(a), db(b);
  for (auto [mode, unitRoundoff] : {std::pair{meshc::cuda::MathMode::FP32, 0.0},
                                    std::pair{meshc::cuda::MathMode::TF32, std::ldexp(1.0, -10)},
                                    std::pair{meshc::cuda::MathMode::BF16, std::ldexp(1.0, -7)}}) {
    meshrt::cuda::Context context = meshrt::cuda::current();
    context.math = mode;
    meshrt::cuda::Scope scope(context);
    Device out(expected.size());
    meshc::cuda::einsum2(out.data(), da.data(), db.data(), d);
    expectWithinGemmBound((std::string("einsum2 ") + meshrt::cuda::mathModeName(mode)).c_str(),
                          out.host(), expected, absProducts, unitRoundoff, K);
  }
  Device out(expected.size());
  meshc::cuda::einsum2Double(out.data(), da.data(), db.data(), d);
  expectClose("einsum2Double", out.host(), expected, 1e-12);
  // Three operands: out[m] = sum_k a[m, k] b[k] c[k].
  Buffer c = randomBuffer(size_t(K), 5), generic(static_cast<size_t>(M));
  meshc::gen::einsumGeneric(generic.data(), {M}, {K}, {a.data(), b.data(), c.data()},
                            {{B * K}, {0}, {0}}, {{1}, {1}, {1}});
  Device dc(c), gout(static_cast<size_t>(M));
  meshc::cuda::einsumGeneric(gout.data(), {M}, {K}, {da.data(), db.data(), dc.data()},
                             {{B * K}, {0}, {0}}, {{1}, {1}, {1}});
  expectClose("einsumGeneric (3 operands)", gout.host(), generic, 1e-12);
}

void checkCollectives(meshrt::Communicator& world) {
  meshrt::Communicator& group = world.subgroup({"data"});
  Buffer in = randomBuffer(24, 6);
  Device din(in);
  meshc::cuda::ConstView view(din.data(), 24);
  {
    Device out(24);
    meshc::cuda::allGatherDim(out.view(), view, {2, 3, 4}, 1, group);
    expectClose("allGatherDim (1 rank)", out.host(), in, 0);
  }
  {
    Device out(24);
    meshc::cuda::reduceScatterDim(out.view(), view, {2, 3, 4}, 1, group);
    expectClose("reduceScatterDim (1 rank)", out.host(), in, 0);
  }
  {
    Device out(24);
    meshc::cuda::allToAllDims(out.view(), view, {2, 3, 4}, 0, 2, group);
    expectClose("allToAllDims (1 rank)", out.host(), in, 0);
  }
  {
    Buffer expected(8);
    meshc::gen::sliceDim(meshc::gen::View(expected), meshc::gen::ConstView(in), {2, 3, 4}, 1, 1, 3);
    Device out(8);
    meshc::cuda::sliceDim(out.view(), view, {2, 3, 4}, 1, 1, 3);
    expectClose("sliceDim", out.host(), expected, 0);
  }
  {
    Device out(in);
    meshc::cuda::combineLogSumExp(out.view(), group);
    expectClose("combineLogSumExp (1 rank)", out.host(), in, 1e-6);
  }
}

} // namespace

int main() {
  if (meshrt::nccl::deviceCount() == 0) {
    std::fprintf(stderr, "support_check: no CUDA device\n");
    return 1;
  }
  try {
    meshrt::nccl::runNccl(meshrt::Mesh({{"data", 1}}), [](meshrt::Communicator& world) {
      meshc::cuda::Scope scope(world, meshc::cuda::MathMode::FP32);
      checkMovement();
      checkLanes();
      checkEinsum();
      checkCollectives(world);
    });
  } catch (const std::exception& error) {
    std::fprintf(stderr, "support_check: %s\n", error.what());
    return 1;
  }
  std::printf("%d check(s) failed\n", failures);
  return failures;
}
