// meshrt's local compute kernels against the reference interpreter (the oracle of every op) and
// straightforward loops: einsum layouts (transposed, batched, packed, generic), elementwise
// math and broadcasting, dtype rounding bit for bit, reductions and the along-dims ops, their
// split-dim phases recombined across simulated shards, data movement, and RNG shard fills.
#include "meshrt/kernels/Kernels.h"

#include "interp/Interpreter.h"
#include "meshrt/Random.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <omp.h>
#include <random>
#include <thread>

using namespace meshc;
using namespace meshrt::kernels;
using ir::DType;
using ir::OpKind;
using meshc::interp::Tensor;

namespace {

using Attrs = std::vector<std::pair<std::string, ir::AttrValue>>;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> randomFloats(size_t count, uint32_t seed, float low = -2, float high = 2) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(count);
  for (float& x : values)
    x = dist(engine);
  return values;
}

/// A type over dims named by `names` with `sizes`.
ir::TensorType typeOf(DType dtype, const std::vector<std::string>& names,
                      const std::vector<int64_t>& sizes) {
  ir::TensorType type{dtype, {}};
  for (size_t i = 0; i < names.size(); ++i)
    type.dims.push_back({names[i], sizes[i]});
  return type;
}

template <typename T> Tensor tensorOf(ir::TensorType type, const std::vector<T>& data) {
  return Tensor{std::move(type), std::vector<double>(data.begin(), data.end())};
}

/// Runs one op through the interpreter on the given operands (as inputs x0, x1, ...).
Tensor interpret(OpKind kind, const std::vector<Tensor>& operands, const ir::TensorType& result,
                 Attrs attrs = {}, interp::Options opts = {}) {
  ir::Function fn;
  interp::TensorMap inputs;
  std::vector<ir::ValueId> ids;
  for (size_t i = 0; i < operands.size(); ++i) {
    std::string name = "x" + std::to_string(i);
    ir::Op op{OpKind::Input, {}, 0, {{"name", name}, {"index", int64_t(i)}}, {}};
    ir::ValueId id = fn.addOp(op, operands[i].type, name);
    fn.inputs.push_back(ir::InputInfo{name, operands[i].type, 0, {}, id});
    ids.push_back(id);
    inputs[name] = operands[i];
  }
  ir::ValueId out = fn.addOp(ir::Op{kind, ids, 0, std::move(attrs), {}}, result);
  fn.outputs.push_back(ir::OutputInfo{"out", out, {}});
  auto outputs = interp::run(fn, inputs, opts);
  if (!outputs) FAIL(llvm::toString(outputs.takeError()));
  return outputs->at("out");
}

/// Every element within `relative` (or `absolute` near zero); nan and inf must match exactly.
template <typename T>
void checkClose(const std::vector<T>& got, const std::vector<double>& expected,
                double relative = 1e-5, double absolute = 1e-6) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << double(got[i]) << ", expected " << expected[i]);
    if (std::isnan(expected[i]))
      CHECK(std::isnan(double(got[i])));
    else if (std::isinf(expected[i]))
      CHECK(double(got[i]) == expected[i]);
    else
      CHECK(double(got[i]) == Approx(expected[i]).epsilon(relative).margin(absolute));
  }
}

template <typename T>
void checkExact(const std::vector<T>& got, const std::vector<double>& expected) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << double(got[i]) << ", expected " << expected[i]);
    if (std::isnan(expected[i]))
      CHECK(std::isnan(double(got[i])));
    else
      CHECK(double(got[i]) == expected[i]);
  }
}

std::vector<std::string> dimNames(const std::vector<int>& ids) {
  std::vector<std::string> names;
  for (int id : ids)
    names.push_back("d" + std::to_string(id));
  return names;
}

std::vector<int64_t> sizesOf(const EinsumSpec& spec, const std::vector<int>& ids) {
  std::vector<int64_t> sizes;
  for (int id : ids)
    sizes.push_back(spec.sizes[size_t(id)]);
  return sizes;
}

/// Runs `spec` through the kernel (dense operands, or the given strided buffers) and the
/// interpreter (on the dense data) and compares.
std::string checkEinsum(const EinsumSpec& spec, const std::vector<std::vector<float>>& dense,
                        const std::vector<std::vector<float>>* strided = nullptr,
                        double absolute = 1e-5) {
  EinsumPlan plan(spec);
  std::vector<Tensor> operands;
  std::vector<const float*> pointers;
  for (size_t k = 0; k < spec.operands.size(); ++k) {
    operands.push_back(tensorOf(
        typeOf(DType::F32, dimNames(spec.operands[k].dims), sizesOf(spec, spec.operands[k].dims)),
        dense[k]));
    pointers.push_back(strided ? (*strided)[k].data() : dense[k].data());
  }
  ir::TensorType resultType =
      typeOf(DType::F32, dimNames(spec.out.dims), sizesOf(spec, spec.out.dims));
  Tensor expected = interpret(OpKind::Einsum, operands, resultType);
  // beta = 0 writes without reading: nan in the output must not leak (BLAS semantics).
  std::vector<float> out(size_t(resultType.numElements()), kNaN);
  plan.run(pointers.data(), out.data());
  checkClose(out, expected.data, 1e-5, absolute);
  // out = alpha * einsum + beta * out: beta = 1 adds onto what is there, alpha scales.
  plan.run(pointers.data(), out.data(), 2.0f, 1.0f);
  std::vector<double> tripled, scaled, alphaOnly;
  for (double x : expected.data) {
    tripled.push_back(3 * x);
    scaled.push_back(0.5 * x - 2 * 3 * x);
    alphaOnly.push_back(-0.25 * x);
  }
  checkClose(out, tripled, 1e-5, absolute);
  // Any other beta scales what is there.
  plan.run(pointers.data(), out.data(), 0.5f, -2.0f);
  checkClose(out, scaled, 1e-5, absolute);
  // alpha alone (the attention scale folded in), beta = 0 again.
  plan.run(pointers.data(), out.data(), -0.25f);
  checkClose(out, alphaOnly, 1e-5, absolute);
  return plan.describe();
}

EinsumSpec spec(std::vector<int64_t> sizes, std::vector<std::vector<int>> operands,
                std::vector<int> out) {
  EinsumSpec result{std::move(sizes), {}, {std::move(out), {}}};
  for (auto& dims : operands)
    result.operands.push_back({std::move(dims), {}});
  return result;
}

int64_t countOf(const EinsumSpec& s, const std::vector<int>& dims) {
  int64_t count = 1;
  for (int id : dims)
    count *= s.sizes[size_t(id)];
  return count;
}

std::vector<std::vector<float>> randomOperands(const EinsumSpec& s, uint32_t seed) {
  std::vector<std::vector<float>> data;
  for (const EinsumOperand& operand : s.operands)
    data.push_back(randomFloats(size_t(countOf(s, operand.dims)), seed++));
  return data;
}

} // namespace

//===------------------------------------------------------------------------------------------===//
// Einsum
//===------------------------------------------------------------------------------------------===//

TEST_CASE("einsum: plain, transposed and swapped GEMMs match the interpreter", "[kernels]") {
  // ids: m=0, k=1, n=2
  std::vector<int64_t> sizes = {13, 7, 9};
  struct Case {
    std::vector<int> a, b, out;
    std::string plan;
  };
  std::vector<Case> cases = {
      {{0, 1}, {1, 2}, {0, 2}, "gemm batch=1 m=13 n=9 k=7 a=N b=N"},
      {{1, 0}, {1, 2}, {0, 2}, "gemm batch=1 m=13 n=9 k=7 a=T b=N"},
      {{0, 1}, {2, 1}, {0, 2}, "gemm batch=1 m=13 n=9 k=7 a=N b=T"},
      {{1, 0}, {2, 1}, {0, 2}, "gemm batch=1 m=13 n=9 k=7 a=T b=T"},
      // A column-major output: computed as out^T = b^T a^T.
      {{0, 1}, {1, 2}, {2, 0}, "gemm batch=1 m=9 n=13 k=7 a=T b=T swapped"},
  };
  for (const Case& c : cases) {
    EinsumSpec s = spec(sizes, {c.a, c.b}, c.out);
    INFO(c.plan);
    CHECK(checkEinsum(s, randomOperands(s, 1)) == c.plan);
  }
}

TEST_CASE("einsum: batch dims loop around the GEMM, in any position", "[kernels]") {
  // b=0, s=1, h=2, d=3, t=4: attention-like scores[b, h, s, t] = q[b, s, h, d] k[b, t, h, d].
  // Small matrices: meshrt's loops by default, the library's batched GEMM when told.
  EinsumSpec scores = spec({2, 5, 3, 4, 6}, {{0, 1, 2, 3}, {0, 4, 2, 3}}, {0, 2, 1, 4});
  // Batch innermost in the operands: their K is not unit-stride, so they are packed.
  EinsumSpec inner = spec({3, 4, 5, 6}, {{1, 2, 0}, {2, 3, 0}}, {0, 1, 3});
  for (bool loops : {true, false}) {
    INFO("small loops " << loops);
    setSmallGemmLoops(loops);
    std::string small = loops ? " small loops" : "";
    CHECK(checkEinsum(scores, randomOperands(scores, 2)) ==
          "gemm batch=6 m=5 n=6 k=4 a=N b=T" + small);
    CHECK(checkEinsum(inner, randomOperands(inner, 3)) ==
          "gemm batch=3 m=4 n=6 k=5 a=N b=N pack-a pack-b" + small);
  }
  setSmallGemmLoops(true);
}

TEST_CASE("einsum: batches of small matrices run in meshrt's loops, in any layout", "[kernels]") {
  // ids: h=0 (batch), s=1 (m), t=2 (n), e=3 (k). Rows in blocks of 4 and tails of 1-3, columns
  // in tiles of 16 and tails, b transposed (copied), dense (in place), or rows far apart
  // (copied), an output walked by columns, and alpha/beta (checkEinsum).
  struct Case {
    int64_t m, n, k;
    std::vector<int> a, b, out;
  };
  const std::vector<int> scoresA = {1, 0, 3}, keys = {2, 0, 3}, byHead = {0, 1, 2};
  const std::vector<int> headsFirstB = {0, 3, 2}, valuesB = {3, 0, 2}, columns = {0, 2, 1};
  std::vector<Case> cases;
  for (int64_t m : {2, 3, 4, 5, 6, 7, 13})
    for (int64_t n : {2, 5, 16, 17, 33}) {
      cases.push_back({m, n, 7, scoresA, keys, byHead});        // b transposed
      cases.push_back({m, n, 7, scoresA, headsFirstB, byHead}); // b dense per head
      cases.push_back({m, n, 7, scoresA, valuesB, byHead});     // b's rows h * n apart
    }
  cases.push_back({16, 16, 8, scoresA, headsFirstB, columns}); // out written by columns
  for (const Case& c : cases) {
    INFO(c.m << " x " << c.n << " x " << c.k);
    EinsumSpec s{{3, c.m, c.n, c.k}, {{c.a, {}}, {c.b, {}}}, {c.out, {}}};
    std::string plan = checkEinsum(s, randomOperands(s, 40));
    CHECK(plan.find(" small loops") != std::string::npos);
  }
  // Rows of two dims that t separates in the output: a packed output, then scattered.
  EinsumSpec packedOut{{3, 2, 3, 5, 4}, {{{0, 1, 2, 4}, {}}, {{0, 3, 4}, {}}}, {{0, 1, 3, 2}, {}}};
  std::string packedPlan = checkEinsum(packedOut, randomOperands(packedOut, 44));
  CHECK(packedPlan.find("pack-out") != std::string::npos);
  CHECK(packedPlan.find(" small loops") != std::string::npos);
  // Past the limit (32 x 32 x 64 multiply-adds a matrix), the library; a copied b serving too
  // few rows of a (2 rows for 48 of b's), the library; the same b dense, the loops.
  EinsumSpec large{{2, 64, 64, 17}, {{scoresA, {}}, {keys, {}}}, {byHead, {}}};
  CHECK(checkEinsum(large, randomOperands(large, 41)).find("small") == std::string::npos);
  EinsumSpec fewRows{{4, 2, 16, 48}, {{scoresA, {}}, {keys, {}}}, {byHead, {}}};
  CHECK(checkEinsum(fewRows, randomOperands(fewRows, 42)).find("small") == std::string::npos);
  EinsumSpec fewRowsDense{{4, 2, 16, 48}, {{scoresA, {}}, {headsFirstB, {}}}, {byHead, {}}};
  CHECK(checkEinsum(fewRowsDense, randomOperands(fewRowsDense, 43)).find(" small loops") !=
        std::string::npos);
}

TEST_CASE("einsum: batches of outer products, GEMVs and dot products run as loops", "[kernels]") {
  // performer's FAVOR+ einsums, smaller: b=0, s=1, f=2, d=3.
  // kf[b, s, f] v[b, s, d] -> [b, s, f, d]: K = 1.
  EinsumSpec outer = spec({2, 3, 5, 4}, {{0, 1, 2}, {0, 1, 3}}, {0, 1, 2, 3});
  CHECK(checkEinsum(outer, randomOperands(outer, 20)) == "gemm batch=6 m=5 n=4 k=1 a=N b=N loops");
  // qf[b, s, f] kv[b, s, f, d] -> [b, s, d]: M = 1, b's rows contiguous.
  EinsumSpec gemv = spec({2, 3, 5, 4}, {{0, 1, 2}, {0, 1, 2, 3}}, {0, 1, 3});
  CHECK(checkEinsum(gemv, randomOperands(gemv, 21)) == "gemm batch=6 m=1 n=4 k=5 a=N b=N loops");
  // The same with kv stored [b, s, d, f]: dot products along f.
  EinsumSpec gemvT = spec({2, 3, 5, 4}, {{0, 1, 2}, {0, 1, 3, 2}}, {0, 1, 3});
  CHECK(checkEinsum(gemvT, randomOperands(gemvT, 22)) == "gemm batch=6 m=1 n=4 k=5 a=N b=T loops");
  // qf[b, s, f] ks[b, s, f] -> [b, s]: M = N = 1, 19 terms (past the 8 partial sums).
  EinsumSpec dots = spec({2, 3, 19}, {{0, 1, 2}, {0, 1, 2}}, {0, 1});
  CHECK(checkEinsum(dots, randomOperands(dots, 23)) == "gemm batch=6 m=1 n=1 k=19 a=N b=N loops");
  // N = 1 with the batch innermost in the output (packed out): x[b, s, f] w[b, f] -> [s, b].
  EinsumSpec column = spec({2, 3, 5}, {{0, 1, 2}, {0, 2}}, {1, 0});
  CHECK(checkEinsum(column, randomOperands(column, 24)).find(" loops") != std::string::npos);
  // One column per batch whose rows are contiguous in a and out: a[b, s, f, d] w[b, s, f] ->
  // [b, s, d] (d the rows, f the terms), run as its transpose.
  EinsumSpec column2 = spec({2, 3, 5, 4}, {{0, 1, 2, 3}, {0, 1, 2}}, {0, 1, 3});
  CHECK(checkEinsum(column2, randomOperands(column2, 26)).find(" loops") != std::string::npos);
  // Contiguous dots with the term counts fixed at compile time (8, 16, 32, 64) and one that is
  // not (24), as performer's backward: grad[b, s, d] kv[b, s, f, d] -> [b, s, f] (M = 1, b's
  // columns contiguous) and kv[b, s, f, d] v[b, s, d] -> [b, s, f] (N = 1, a's rows contiguous:
  // its dots run along f with the operands traded).
  for (int64_t terms : {8, 16, 24, 32, 64}) {
    INFO(terms << " terms");
    EinsumSpec rowDots = spec({2, 3, 5, terms}, {{0, 1, 3}, {0, 1, 2, 3}}, {0, 1, 2});
    CHECK(checkEinsum(rowDots, randomOperands(rowDots, 27)) ==
          "gemm batch=6 m=1 n=5 k=" + std::to_string(terms) + " a=N b=T loops");
    EinsumSpec columnDots = spec({2, 3, 5, terms}, {{0, 1, 2, 3}, {0, 1, 3}}, {0, 1, 2});
    CHECK(checkEinsum(columnDots, randomOperands(columnDots, 28)) ==
          "gemm batch=6 m=5 n=1 k=" + std::to_string(terms) + " a=N b=N loops");
  }
  // Outer products with the row widths fixed at compile time (8, 16, 32, 64) and one that is
  // not (12), as performer's K'_l (x) V_l: kf[b, s, f] v[b, s, d] -> [b, s, f, d].
  for (int64_t width : {8, 12, 16, 32, 64}) {
    INFO(width << " columns");
    EinsumSpec rows = spec({2, 3, 5, width}, {{0, 1, 2}, {0, 1, 3}}, {0, 1, 2, 3});
    CHECK(checkEinsum(rows, randomOperands(rows, 29)) ==
          "gemm batch=6 m=5 n=" + std::to_string(width) + " k=1 a=N b=N loops");
  }
  // Rows of sums with the widths fixed at compile time (16, 32) and one that is not (12), terms
  // a multiple of the four accumulators' turn (64) or not (5, 67), as performer's Q' (K'^T V):
  // qf[b, s, f] kv[b, s, f, d] -> [b, s, d].
  for (int64_t width : {12, 16, 32})
    for (int64_t terms : {5, 64, 67}) {
      INFO(width << " columns, " << terms << " terms");
      EinsumSpec sums = spec({2, 3, terms, width}, {{0, 1, 2}, {0, 1, 2, 3}}, {0, 1, 3});
      CHECK(checkEinsum(sums, randomOperands(sums, 30)) ==
            "gemm batch=6 m=1 n=" + std::to_string(width) + " k=" + std::to_string(terms) +
                " a=N b=N loops");
    }
  // One batch stays a library GEMM (one call).
  EinsumSpec single = spec({5, 4}, {{0}, {1}}, {0, 1});
  CHECK(checkEinsum(single, randomOperands(single, 25)) == "gemm batch=1 m=5 n=4 k=1 a=N b=N");
}

TEST_CASE("einsum: multi-dim M, N and K collapse; interleaved ones are packed", "[kernels]") {
  // x[b, s, d] w[d, f] -> y[b, s, f]: M = (b, s) collapses.
  EinsumSpec dense = spec({2, 3, 4, 5}, {{0, 1, 2}, {2, 3}}, {0, 1, 3});
  CHECK(checkEinsum(dense, randomOperands(dense, 4)) == "gemm batch=1 m=6 n=5 k=4 a=N b=N");
  // K split over two ids (heads, head_dim) contracted together.
  EinsumSpec twoK = spec({3, 2, 4, 5}, {{0, 1, 2}, {1, 2, 3}}, {0, 3});
  CHECK(checkEinsum(twoK, randomOperands(twoK, 5)) == "gemm batch=1 m=3 n=5 k=8 a=N b=N");
  // The output interleaves M and N dims: computed packed, then scattered.
  EinsumSpec interleaved = spec({2, 3, 4, 5}, {{0, 1, 2}, {2, 3}}, {0, 3, 1});
  CHECK(checkEinsum(interleaved, randomOperands(interleaved, 6)) ==
        "gemm batch=1 m=6 n=5 k=4 a=N b=N pack-out");
  // Size-1 dims are ignored wherever they are.
  EinsumSpec ones = spec({1, 4, 1, 3, 5}, {{0, 1, 3}, {3, 2, 4}}, {1, 2, 4});
  CHECK(checkEinsum(ones, randomOperands(ones, 7)) == "gemm batch=1 m=4 n=5 k=3 a=N b=N");
}

TEST_CASE("einsum: strided operands (views) fold into the GEMM's leading dims", "[kernels]") {
  // a[m=4, k=3] held with row stride 8 (a view of a wider buffer), b dense [k, n=5].
  EinsumSpec s = spec({4, 3, 5}, {{0, 1}, {1, 2}}, {0, 2});
  s.operands[0].strides = {8, 1};
  auto dense = randomOperands(s, 8);
  std::vector<float> wide(4 * 8, kNaN);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      wide[size_t(i * 8 + j)] = dense[0][size_t(i * 3 + j)];
  std::vector<std::vector<float>> strided = {wide, dense[1]};
  CHECK(checkEinsum(s, dense, &strided) == "gemm batch=1 m=4 n=5 k=3 a=N b=N");
}

TEST_CASE("einsum: a strided output (a window of a wider buffer) is written in place",
          "[kernels]") {
  // out[m=4, n=5] is columns [2, 7) of a [4, 12] buffer; the rest must stay untouched.
  for (bool interleave : {false, true}) {
    EinsumSpec s = spec({4, 3, 5}, {{0, 1}, {1, 2}}, {0, 2});
    s.out.strides = interleave ? std::vector<int64_t>{24, 2} : std::vector<int64_t>{12, 1};
    auto data = randomOperands(s, 13);
    std::vector<float> wide(size_t(4 * (interleave ? 24 : 12)), -5.0f);
    setBlasThreads(1);
    CHECK(blasThreads() == 1);
    EinsumPlan plan(s);
    CHECK(plan.describe() == (interleave ? "gemm batch=1 m=4 n=5 k=3 a=N b=N pack-out"
                                         : "gemm batch=1 m=4 n=5 k=3 a=N b=N"));
    plan.run(data[0].data(), data[1].data(), wide.data() + 2);
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 5; ++j) {
        double expected = 0;
        for (int64_t k = 0; k < 3; ++k)
          expected += double(data[0][size_t(i * 3 + k)]) * double(data[1][size_t(k * 5 + j)]);
        CHECK(wide[size_t(2 + i * s.out.strides[0] + j * s.out.strides[1])] ==
              Approx(expected).margin(1e-5));
      }
    int untouched = 0;
    for (float v : wide)
      untouched += v == -5.0f;
    CHECK(untouched == int(wide.size()) - 20);
  }
}

TEST_CASE("einsum: one operand is a strided sum; lonely dims are summed first", "[kernels]") {
  // One operand: a transposed sum (bias gradient shape), a full sum, a pure transpose.
  EinsumSpec single = spec({3, 4, 5}, {{0, 1, 2}}, {2, 0});
  CHECK(checkEinsum(single, randomOperands(single, 9)) == "reduce");
  EinsumSpec total = spec({3, 4}, {{0, 1}}, {});
  CHECK(checkEinsum(total, randomOperands(total, 14)) == "reduce");
  EinsumSpec permute = spec({3, 4}, {{0, 1}}, {1, 0});
  CHECK(checkEinsum(permute, randomOperands(permute, 15)) == "reduce");
  // A dim only a has (summed out of a), then a dot product as a GEMM.
  EinsumSpec lonely = spec({3, 4}, {{0, 1}, {1}}, {});
  CHECK(checkEinsum(lonely, randomOperands(lonely, 11)) ==
        "presum(a) + gemm batch=1 m=1 n=1 k=4 a=N b=N");
  // Lonely dims in both operands around a batched GEMM.
  EinsumSpec both = spec({2, 3, 4, 5, 6, 7}, {{0, 1, 2, 3}, {0, 3, 4, 5}}, {0, 2, 5});
  CHECK(checkEinsum(both, randomOperands(both, 16)) ==
        "presum(a, b) + gemm batch=2 m=4 n=7 k=5 a=N b=N small loops");
}

TEST_CASE("einsum: what a GEMM cannot express runs the generic loop", "[kernels]") {
  // Three operands; an output dim that no operand has; a strided single operand.
  EinsumSpec three = spec({3, 4, 5}, {{0, 1}, {1, 2}, {2}}, {0});
  CHECK(checkEinsum(three, randomOperands(three, 10)) == "generic");
  EinsumSpec broadcast = spec({3, 4, 2}, {{0, 1}, {1}}, {0, 2});
  CHECK(checkEinsum(broadcast, randomOperands(broadcast, 12)) == "generic");
  EinsumSpec spread = spec({3, 4, 2}, {{0, 1}}, {0, 2});
  CHECK(checkEinsum(spread, randomOperands(spread, 17)) == "generic");
  EinsumSpec view = spec({3, 4}, {{0, 1}}, {0});
  view.operands[0].strides = {4, 1};
  CHECK(checkEinsum(view, randomOperands(view, 18)) == "reduce"); // dense strides spelled out
  view.operands[0].strides = {1, 3};
  auto data = randomOperands(view, 18);
  std::vector<std::vector<float>> columnMajor = {std::vector<float>(12)};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      columnMajor[0][size_t(i + 3 * j)] = data[0][size_t(i * 4 + j)];
  CHECK(checkEinsum(view, data, &columnMajor) == "generic");
}

TEST_CASE("einsum: one plan runs concurrently on rank threads", "[kernels]") {
  // Ranks are threads sharing static plans; packing scratch is per thread.
  setBlasThreads(1);
  EinsumSpec s = spec({3, 8, 16, 12}, {{1, 2, 0}, {2, 3, 0}}, {3, 0, 1}); // packs both operands
  const EinsumPlan plan(s);
  auto data = randomOperands(s, 19);
  std::vector<float> expected(size_t(countOf(s, s.out.dims)));
  plan.run(data[0].data(), data[1].data(), expected.data());
  std::vector<std::vector<float>> results(4, std::vector<float>(expected.size()));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t)
    threads.emplace_back([&, t] {
      for (int repeat = 0; repeat < 50; ++repeat)
        plan.run(data[0].data(), data[1].data(), results[t].data());
    });
  for (std::thread& thread : threads)
    thread.join();
  for (const auto& result : results)
    CHECK(result == expected);
}

TEST_CASE("einsum: the transformer's GEMMs and their backward transposes, one matmul each",
          "[kernels]") {
  // Scaled-down transformer shapes (batch 2, seq 6, d_model 8, heads 2 of 4, d_ff 12). Every
  // layout must reach oneDNN's matmul as one call, batch dims included (no loop, no reference
  // implementation), and match the interpreter with alpha and beta; attention's batches of
  // small matrices do where meshrt's own loops are turned off (setSmallGemmLoops).
  struct Case {
    std::string name;
    EinsumSpec spec;
    std::string plan;
  };
  std::vector<Case> cases = {
      // x[b, s, d] w[d, f] -> [b, s, f] (ids b=0, s=1, d=2, f=3)
      {"ffn in", spec({2, 6, 8, 12}, {{0, 1, 2}, {2, 3}}, {0, 1, 3}),
       "gemm batch=1 m=12 n=12 k=8 a=N b=N"},
      // weight gradient x[b, s, d] dy[b, s, f] -> [d, f]: a transposed
      {"dW", spec({2, 6, 8, 12}, {{0, 1, 2}, {0, 1, 3}}, {2, 3}),
       "gemm batch=1 m=8 n=12 k=12 a=T b=N"},
      // input gradient dy[b, s, f] w[d, f] -> [b, s, d]: b transposed
      {"dX", spec({2, 6, 12, 8}, {{0, 1, 2}, {3, 2}}, {0, 1, 3}),
       "gemm batch=1 m=12 n=8 k=12 a=N b=T"},
      // scores q[b, s, h, e] k[b, t, h, e] -> [b, h, s, t] (ids b, s, h, e, t)
      {"scores", spec({2, 6, 2, 4, 6}, {{0, 1, 2, 3}, {0, 4, 2, 3}}, {0, 2, 1, 4}),
       "gemm batch=4 m=6 n=6 k=4 a=N b=T"},
      // values p[b, h, s, t] v[b, t, h, e] -> [b, s, h, e] (ids b, h, s, t, e)
      {"values", spec({2, 2, 6, 6, 4}, {{0, 1, 2, 3}, {0, 3, 1, 4}}, {0, 2, 1, 4}),
       "gemm batch=4 m=6 n=4 k=6 a=N b=N"},
      // scores' gradient wrt k: dscores[b, h, s, t] q[b, s, h, e] -> [b, t, h, e]
      {"dk", spec({2, 2, 6, 6, 4}, {{0, 1, 2, 3}, {0, 2, 1, 4}}, {0, 3, 1, 4}),
       "gemm batch=4 m=6 n=4 k=6 a=T b=N"},
  };
  // Each one oneDNN matmul (not its sgemm loop) where oneDNN runs it.
  const GemmLibrary initial = gemmLibrary();
  setGemmLibrary(GemmLibrary::OneDnn);
  setSmallGemmLoops(false);
  for (const Case& c : cases) {
    INFO(c.name);
    CHECK(checkEinsum(c.spec, randomOperands(c.spec, 21)) == c.plan);
    CHECK(EinsumPlan(c.spec).gemmImplementation().rfind("matmul ", 0) == 0);
  }
  setSmallGemmLoops(true);
  for (const Case& c : cases) {
    INFO(c.name << ", small loops");
    bool batched = c.plan.find("batch=1 ") == std::string::npos;
    CHECK(checkEinsum(c.spec, randomOperands(c.spec, 21)) ==
          c.plan + (batched ? " small loops" : ""));
    CHECK(EinsumPlan(c.spec).gemmImplementation().rfind(batched ? "small loops" : "matmul ", 0) ==
          0);
  }
  setGemmLibrary(initial);
}

/// runBiasActivation against the plan's own einsum, then the bias, then GELU's tanh form in
/// double (with and without GELU): the fused post-ops and the separate pass must both be that.
void checkBiasActivation(const EinsumSpec& spec, uint32_t seed) {
  auto gelu = [](double x) {
    return 0.5 * x * (1 + std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
  };
  const EinsumPlan plan(spec);
  auto data = randomOperands(spec, seed);
  int64_t lane = spec.sizes[size_t(spec.out.dims.back())];
  std::vector<float> bias = randomFloats(size_t(lane), seed + 1);
  size_t count = size_t(countOf(spec, spec.out.dims));
  std::vector<float> product(count);
  plan.run(data[0].data(), data[1].data(), product.data());
  for (bool withGelu : {false, true}) {
    std::vector<double> expected;
    for (size_t i = 0; i < count; ++i) {
      double x = double(product[i]) + double(bias[i % size_t(lane)]);
      expected.push_back(withGelu ? gelu(x) : x);
    }
    std::vector<float> out(count, kNaN); // written, never read
    plan.runBiasActivation(data[0].data(), data[1].data(), bias.data(), out.data(), withGelu);
    checkClose(out, expected, 2e-5, 2e-5);
  }
}

TEST_CASE("einsum: a bias along the last dim and GELU after the GEMM, fused or not", "[kernels]") {
  // out = gelu(einsum + bias[last dim]): oneDNN's bias and eltwise post-ops where the plan is one
  // matmul whose columns are the last dim (ffn in, the batched values), one pass over the output
  // otherwise (a swapped GEMM, a last dim merged into wider columns). Either way it must be the
  // einsum, then the bias, then GELU's tanh form.
  struct Case {
    std::string name;
    EinsumSpec spec;
  };
  std::vector<Case> cases = {
      {"ffn in", spec({2, 6, 8, 12}, {{0, 1, 2}, {2, 3}}, {0, 1, 3})},
      {"values", spec({2, 2, 6, 6, 4}, {{0, 1, 2, 3}, {0, 3, 1, 4}}, {0, 2, 1, 4})},
      {"swapped", spec({13, 7, 9}, {{0, 1}, {1, 2}}, {2, 0})},
      {"merged columns", spec({2, 6, 8, 3, 4}, {{0, 1, 2}, {2, 3, 4}}, {0, 1, 3, 4})},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    checkBiasActivation(c.spec, 23);
  }
  // The output must be dense: a strided one is refused.
  EinsumSpec strided = spec({2, 3, 4}, {{0, 1}, {1, 2}}, {0, 2});
  strided.out.strides = {8, 1};
  std::vector<float> a(6, 1), b(12, 1), bias(4, 0), out(16);
  CHECK_THROWS_AS(
      EinsumPlan(strided).runBiasActivation(a.data(), b.data(), bias.data(), out.data(), true),
      std::invalid_argument);
}

TEST_CASE("einsum: oneDNN, OpenBLAS or the measured choice between them, the same results",
          "[kernels]") {
  // GemmLibrary: oneDNN's matmul, a cblas_sgemm per batch, or whichever of the two this machine
  // runs faster, measured on the first call. The shapes are of 4 MFLOP and up, the least that is
  // measured: a plain GEMM, a transposed a (a weight gradient), a batch (attention scores).
  const GemmLibrary initial = gemmLibrary();
  struct Case {
    std::string name;
    EinsumSpec spec;
  };
  std::vector<Case> cases = {
      {"ffn in", spec({4, 32, 128, 160}, {{0, 1, 2}, {2, 3}}, {0, 1, 3})},
      {"dW", spec({4, 32, 128, 160}, {{0, 1, 2}, {0, 1, 3}}, {2, 3})},
      {"scores", spec({4, 64, 2, 64, 64}, {{0, 1, 2, 3}, {0, 4, 2, 3}}, {0, 2, 1, 4})},
  };
  for (GemmLibrary library : {GemmLibrary::OneDnn, GemmLibrary::OpenBlas, GemmLibrary::Measured}) {
    setGemmLibrary(library);
    for (const Case& c : cases) {
      INFO(c.name << ", library " << int(library));
      auto data = randomOperands(c.spec, 31);
      // K = 64 or 128 terms of |a b| ~ 1 (both uniform on [-2, 2]): a blocked f32 sum errs by
      // up to about 2 u sum |a b| ~ 2 u K (u = 2^-24; 1.7 u K seen), which the default 1e-5 does
      // not cover, and checkEinsum's alpha = 2, beta = 1 step triples it: 16 u K.
      checkEinsum(c.spec, data, nullptr, 16 * 128 * 0x1p-24);
      checkBiasActivation(c.spec, 32);
      const EinsumPlan plan(c.spec);
      std::vector<float> out(size_t(countOf(c.spec, c.spec.out.dims)));
      plan.run(data[0].data(), data[1].data(), out.data());
      std::string path = plan.gemmImplementation();
      bool oneDnn = path.rfind("matmul ", 0) == 0, openBlas = path == "cblas_sgemm loop";
      if (library == GemmLibrary::OneDnn) CHECK(oneDnn);
      if (library == GemmLibrary::OpenBlas) CHECK(openBlas);
      if (library == GemmLibrary::Measured) CHECK((oneDnn || openBlas));
    }
  }
  setGemmLibrary(initial);
}

TEST_CASE("einsum: an OpenBLAS GEMM split over the BLAS threads", "[kernels]") {
  // OpenBLAS itself runs one thread (its idle pool yield-spins, BlasThreads.cpp); with two BLAS
  // threads a GEMM of 4 MFLOP and up is split over an OpenMP team: rows (m >= n), columns
  // (m < n), either transposed, a row count that splits unevenly, or whole batch entries. Not
  // the same bits as one call: OpenBLAS's kernels sum a block of 16 rows or columns in another
  // order than a block of 8 (one cblas_sgemm of 160 rows and two of 80 differ in 1,918 of
  // 20,480 values), so both are held to the einsum's tolerance.
  const GemmLibrary initial = gemmLibrary();
  const int initialThreads = blasThreads();
  setGemmLibrary(GemmLibrary::OpenBlas);
  struct Case {
    std::string name;
    EinsumSpec spec;
  };
  std::vector<Case> cases = {
      {"rows", spec({4, 40, 128, 128}, {{0, 1, 2}, {2, 3}}, {0, 1, 3})},
      {"columns", spec({40, 128, 512}, {{0, 1}, {1, 2}}, {0, 2})},
      {"rows, a transposed", spec({4, 40, 128, 128}, {{2, 0, 1}, {2, 3}}, {0, 1, 3})},
      {"columns, b transposed", spec({40, 128, 512}, {{0, 1}, {2, 1}}, {0, 2})},
      {"dW", spec({4, 32, 128, 160}, {{0, 1, 2}, {0, 1, 3}}, {2, 3})},
      {"batches", spec({4, 64, 2, 64, 64}, {{0, 1, 2, 3}, {0, 4, 2, 3}}, {0, 2, 1, 4})},
      {"uneven rows", spec({333, 128, 70}, {{0, 1}, {1, 2}}, {0, 2})},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    auto data = randomOperands(c.spec, 41);
    setBlasThreads(2);
    CHECK(blasThreads() == 2);
    // K = 128 terms: the blocked f32 sum's bound of the test above, 16 u K.
    checkEinsum(c.spec, data, nullptr, 16 * 128 * 0x1p-24);
    const EinsumPlan plan(c.spec);
    REQUIRE(plan.usesGemm());
    std::vector<float> out(size_t(countOf(c.spec, c.spec.out.dims)));
    plan.run(data[0].data(), data[1].data(), out.data());
    CHECK(plan.gemmImplementation() == "cblas_sgemm loop");
  }
  setBlasThreads(initialThreads);
  setGemmLibrary(initial);
}

TEST_CASE("einsum: a GEMM below the split size runs on one thread, the caller's count kept",
          "[kernels]") {
  // With two BLAS threads, a GEMM under 2^22 flops runs oneDNN on one OpenMP thread (a team's
  // start and join cost more there) and sets the calling thread's count back after it: the
  // caller's own parallel loops keep their two threads. Either library, plain or with the bias
  // and GELU epilogue, and one large enough to use both threads.
  const GemmLibrary initial = gemmLibrary();
  const int initialThreads = blasThreads();
  const int initialOmp = omp_get_max_threads();
  setBlasThreads(2);
  omp_set_num_threads(2);
  for (GemmLibrary library : {GemmLibrary::OneDnn, GemmLibrary::OpenBlas, GemmLibrary::Measured})
    for (const EinsumSpec& s : {spec({2, 6, 8, 12}, {{0, 1, 2}, {2, 3}}, {0, 1, 3}),
                                spec({4, 40, 128, 128}, {{0, 1, 2}, {2, 3}}, {0, 1, 3})}) {
      INFO("library " << int(library) << ", " << s.sizes[1] << " rows");
      setGemmLibrary(library);
      checkEinsum(s, randomOperands(s, 43), nullptr, 16 * 128 * 0x1p-24);
      CHECK(omp_get_max_threads() == 2);
      checkBiasActivation(s, 44);
      CHECK(omp_get_max_threads() == 2);
    }
  setBlasThreads(initialThreads);
  omp_set_num_threads(initialOmp);
  setGemmLibrary(initial);
}

TEST_CASE("einsum: one plan runs concurrently with alpha and beta, matmul batches included",
          "[kernels]") {
  // Rank threads share a static plan; each accumulates into its own output with its own alpha.
  setBlasThreads(1);
  EinsumSpec s = spec({4, 16, 3, 8, 16}, {{0, 1, 2, 3}, {0, 4, 2, 3}}, {0, 2, 1, 4}); // scores
  const EinsumPlan plan(s);
  auto data = randomOperands(s, 22);
  size_t count = size_t(countOf(s, s.out.dims));
  std::vector<std::vector<float>> expected(4, std::vector<float>(count, 1.0f)), results = expected;
  for (size_t t = 0; t < expected.size(); ++t)
    for (int repeat = 0; repeat < 20; ++repeat)
      plan.run(data[0].data(), data[1].data(), expected[t].data(), float(t + 1), 0.5f);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t)
    threads.emplace_back([&, t] {
      for (int repeat = 0; repeat < 20; ++repeat)
        plan.run(data[0].data(), data[1].data(), results[t].data(), float(t + 1), 0.5f);
    });
  for (std::thread& thread : threads)
    thread.join();
  for (size_t t = 0; t < results.size(); ++t)
    CHECK(results[t] == expected[t]);
}

TEST_CASE("einsum: its GEMMs follow the BLAS thread count on every calling thread", "[kernels]") {
  // oneDNN threads with OpenMP, whose count is per thread: each rank thread must get the count
  // setBlasThreads gave OpenBLAS, not OpenMP's default of all cores.
  EinsumSpec s = spec({8, 8, 8}, {{0, 1}, {1, 2}}, {0, 2});
  const EinsumPlan plan(s);
  auto data = randomOperands(s, 23);
  std::vector<float> out(64);
  for (int count : {3, 1}) {
    setBlasThreads(count);
    int seen = 0;
    std::thread rank([&] {
      plan.run(data[0].data(), data[1].data(), out.data());
      seen = omp_get_max_threads();
    });
    rank.join();
    CHECK(seen == count);
  }
}

TEST_CASE("einsum: empty contractions zero the output; bad specs throw", "[kernels]") {
  EinsumSpec s = spec({2, 0, 3}, {{0, 1}, {1, 2}}, {0, 2});
  std::vector<float> out(6, 7.0f);
  einsum(nullptr, nullptr, out.data(), s);
  CHECK(out == std::vector<float>(6, 0.0f));
  einsum(nullptr, nullptr, out.data(), s, 1.0f, /*beta=*/1.0f);
  CHECK(out == std::vector<float>(6, 0.0f));
  std::fill(out.begin(), out.end(), 3.0f);
  einsum(nullptr, nullptr, out.data(), s, 1.0f, /*beta=*/0.5f);
  CHECK(out == std::vector<float>(6, 1.5f));
  CHECK_THROWS_AS(EinsumPlan(spec({2}, {{0, 0}}, {0})), std::invalid_argument);
  CHECK_THROWS_AS(EinsumPlan(spec({2}, {{1}}, {0})), std::invalid_argument);
  CHECK_THROWS_AS(EinsumPlan(spec({2}, {}, {0})), std::invalid_argument);
}

//===------------------------------------------------------------------------------------------===//
// Elementwise
//===------------------------------------------------------------------------------------------===//

TEST_CASE("unary math matches the interpreter", "[kernels]") {
  std::vector<float> x = {-30, -3.5f, -1, -0.25f, -0.0f, 0,    0.5f,
                          1,   2.75f, 12, 90,     kNaN,  kInf, -kInf};
  std::vector<float> positive = {1e-6f, 0.01f, 0.5f, 1, 2, 1000, 0, -1, kInf};
  for (float v : randomFloats(3000, 5, -12, 12))
    x.push_back(v);
  for (float v : randomFloats(1000, 6, 0, 50))
    positive.push_back(v);
  ir::TensorType type = typeOf(DType::F32, {"i"}, {int64_t(x.size())});
  ir::TensorType positiveType = typeOf(DType::F32, {"i"}, {int64_t(positive.size())});
  struct Case {
    OpKind kind;
    float (*fn)(float);
    bool positiveOnly;
  };
  std::vector<Case> cases = {{OpKind::Neg, neg, false},
                             {OpKind::Abs, meshrt::kernels::abs, false},
                             {OpKind::Exp, meshrt::kernels::exp, false},
                             {OpKind::Log, meshrt::kernels::log, true},
                             {OpKind::Sqrt, meshrt::kernels::sqrt, true},
                             {OpKind::Rsqrt, rsqrt, true},
                             {OpKind::Square, square, false},
                             {OpKind::Tanh, meshrt::kernels::tanh, false},
                             {OpKind::Sigmoid, sigmoid, false},
                             {OpKind::Relu, relu, false},
                             {OpKind::Gelu, gelu, false},
                             {OpKind::Sin, meshrt::kernels::sin, false},
                             {OpKind::Cos, meshrt::kernels::cos, false}};
  for (const Case& c : cases) {
    INFO(ir::opSpelling(c.kind));
    const std::vector<float>& in = c.positiveOnly ? positive : x;
    Tensor expected = interpret(c.kind, {tensorOf(c.positiveOnly ? positiveType : type, in)},
                                c.positiveOnly ? positiveType : type);
    std::vector<float> got(in.size());
    map(got.data(), Dims{int64_t(in.size())}, in.data(), Dims{1}, c.fn);
    checkClose(got, expected.data, 2e-6, 1e-7);
  }
}

TEST_CASE("binary math, comparisons and where match the interpreter", "[kernels]") {
  std::vector<float> a = {-2, -0.5f, 0, 1, 3, kNaN, kInf, 2, -0.0f, 0};
  std::vector<float> b = {3, -0.5f, 2, 0, 0.5f, 1, 1, kNaN, 0, -0.0f};
  ir::TensorType type = typeOf(DType::F32, {"i"}, {int64_t(a.size())});
  ir::TensorType i32Type = typeOf(DType::I32, {"i"}, {int64_t(a.size())});
  auto check = [&](OpKind kind, auto fn, bool toI32) {
    INFO(ir::opSpelling(kind));
    Tensor expected =
        interpret(kind, {tensorOf(type, a), tensorOf(type, b)}, toI32 ? i32Type : type);
    std::vector<double> got;
    for (size_t i = 0; i < a.size(); ++i)
      got.push_back(double(fn(a[i], b[i])));
    checkClose(got, expected.data, 1e-6, 0);
  };
  check(
      OpKind::Add, [](float x, float y) { return add(x, y); }, false);
  check(
      OpKind::Sub, [](float x, float y) { return sub(x, y); }, false);
  check(
      OpKind::Mul, [](float x, float y) { return mul(x, y); }, false);
  check(
      OpKind::Div, [](float x, float y) { return meshrt::kernels::div(x, y); }, false);
  check(
      OpKind::Pow, [](float x, float y) { return meshrt::kernels::pow(x, y); }, false);
  check(
      OpKind::Maximum, [](float x, float y) { return maximum(x, y); }, false);
  check(
      OpKind::Minimum, [](float x, float y) { return minimum(x, y); }, false);
  check(
      OpKind::Lt, [](float x, float y) { return lt(x, y); }, true);
  check(
      OpKind::Le, [](float x, float y) { return le(x, y); }, true);
  check(
      OpKind::Gt, [](float x, float y) { return gt(x, y); }, true);
  check(
      OpKind::Ge, [](float x, float y) { return ge(x, y); }, true);
  check(
      OpKind::Eq, [](float x, float y) { return eq(x, y); }, true);
  check(
      OpKind::Ne, [](float x, float y) { return ne(x, y); }, true);
  // where(cond, a, b)
  std::vector<int32_t> cond = {1, 0, 5, 0, -1, 0, 1, 0, 1, 0};
  Tensor expected = interpret(
      OpKind::Where, {tensorOf(i32Type, cond), tensorOf(type, a), tensorOf(type, b)}, type);
  std::vector<float> got(a.size());
  map(got.data(), Dims{int64_t(a.size())}, cond.data(), Dims{1}, a.data(), Dims{1}, b.data(),
      Dims{1}, [](int32_t c, float x, float y) { return where(c, x, y); });
  checkExact(got, expected.data);
}

TEST_CASE("i32 arithmetic wraps, truncates and divides by zero as 0", "[kernels]") {
  const int32_t kMin = std::numeric_limits<int32_t>::min();
  const int32_t kMax = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> a = {7, -7, 7, -7, 5, kMax, kMin, kMin, 3, -2, 2, 1, -1, 46341};
  std::vector<int32_t> b = {2, 2, -2, -2, 0, 1, -1, 1, 20, 3, -1, -5, -3, 46341};
  ir::TensorType type = typeOf(DType::I32, {"i"}, {int64_t(a.size())});
  auto check = [&](OpKind kind, int32_t (*fn)(int32_t, int32_t)) {
    INFO(ir::opSpelling(kind));
    Tensor expected = interpret(kind, {tensorOf(type, a), tensorOf(type, b)}, type);
    std::vector<int32_t> got;
    for (size_t i = 0; i < a.size(); ++i)
      got.push_back(fn(a[i], b[i]));
    checkExact(got, expected.data);
  };
  check(OpKind::Add, add);
  check(OpKind::Sub, sub);
  check(OpKind::Mul, mul);
  check(OpKind::Div, meshrt::kernels::div);
  check(OpKind::Pow, meshrt::kernels::pow);
  check(OpKind::Maximum, maximum);
  check(OpKind::Minimum, minimum);
  for (auto [kind, fn] : std::vector<std::pair<OpKind, int32_t (*)(int32_t)>>{
           {OpKind::Neg, neg}, {OpKind::Abs, meshrt::kernels::abs}, {OpKind::Relu, relu}}) {
    INFO(ir::opSpelling(kind));
    Tensor expected = interpret(kind, {tensorOf(type, a)}, type);
    std::vector<int32_t> got;
    for (int32_t x : a)
      got.push_back(fn(x));
    checkExact(got, expected.data);
  }
  // square wraps exactly; the interpreter squares in double, exact only while x^2 < 2^53.
  std::vector<int32_t> small = {-3, 0, 46341, -65536, 3037000, -94906265};
  ir::TensorType smallType = typeOf(DType::I32, {"i"}, {int64_t(small.size())});
  Tensor squared = interpret(OpKind::Square, {tensorOf(smallType, small)}, smallType);
  std::vector<int32_t> got;
  for (int32_t x : small)
    got.push_back(square(x));
  checkExact(got, squared.data);
  CHECK(square(kMax) == 1); // (2^31 - 1)^2 = 1 mod 2^32
}

TEST_CASE("casts round bit-exactly as the interpreter does", "[kernels]") {
  // Random bit patterns over the whole float range, plus the edges: ties, subnormals of every
  // format, the overflow thresholds, infinities and nan.
  std::mt19937 engine(42);
  std::vector<float> x;
  for (int i = 0; i < 4000; ++i) {
    uint32_t bits = engine();
    float value;
    std::memcpy(&value, &bits, sizeof value);
    if (!std::isnan(value)) x.push_back(value);
  }
  for (float v : randomFloats(2000, 43, -70000, 70000))
    x.push_back(v);
  for (float v : {0.0f,      -0.0f,    1.0f,          1.00390625f,     1.01171875f,     65504.0f,
                  65519.99f, 65520.0f, -65520.0f,     5.96046448e-08f, 2.98023224e-08f, 8.9e-08f,
                  6.1e-05f,  1e-40f,   3.3895314e38f, 3.3961776e38f,   3.40282347e38f,  kInf,
                  -kInf,     kNaN,     2147483520.0f, 2147483648.0f,   -2147483648.0f,  -3e9f,
                  7.9f,      -7.9f})
    x.push_back(v);
  // Ties of every kind for bf16 and f16: mantissas ending in exactly half a quantum.
  for (uint32_t high = 0x3F800000u; high < 0x3F800000u + (64u << 16); high += 1u << 16) {
    x.push_back(floatOf(high | 0x8000u));
    x.push_back(floatOf(high | 0x1000u));
  }
  int64_t n = int64_t(x.size());
  ir::TensorType from = typeOf(DType::F32, {"i"}, {n});
  for (auto [dtype, valueType] :
       {std::pair{DType::BF16, ValueType::BF16}, std::pair{DType::F16, ValueType::F16}}) {
    INFO(ir::dtypeName(dtype));
    Tensor expected = interpret(OpKind::Cast, {tensorOf(from, x)}, typeOf(dtype, {"i"}, {n}));
    std::vector<float> got(x.size());
    cast(x.data(), got.data(), n, valueType);
    checkExact(got, expected.data);
    // Rounding from double (the fills' path) agrees with the interpreter as well.
    std::vector<float> fromDouble;
    for (float v : x)
      fromDouble.push_back(roundTo(valueType, double(v)));
    checkExact(fromDouble, expected.data);
  }
  Tensor toInt = interpret(OpKind::Cast, {tensorOf(from, x)}, typeOf(DType::I32, {"i"}, {n}));
  std::vector<int32_t> ints(x.size());
  cast(x.data(), ints.data(), n);
  checkExact(ints, toInt.data);
  // Generated code holds i32 as float: the held value is the interpreter's too, out-of-range
  // values (inf, 2^31, -3e9) and nan included.
  std::vector<float> held;
  for (float v : x)
    held.push_back(roundTo(ValueType::I32, v));
  checkExact(held, toInt.data);
  // i32 -> bf16 rounds from the exact integer.
  std::vector<int32_t> integers = {
      0, 1, -1, 255, 257, 16777217, 2147483647, -2147483647 - 1, 33554435, 123456789};
  int64_t m = int64_t(integers.size());
  Tensor expected = interpret(OpKind::Cast, {tensorOf(typeOf(DType::I32, {"i"}, {m}), integers)},
                              typeOf(DType::BF16, {"i"}, {m}));
  std::vector<float> got(integers.size());
  cast(integers.data(), got.data(), m, ValueType::BF16);
  checkExact(got, expected.data);
}

TEST_CASE("forEachIndex broadcasts by strides and fuses chains", "[kernels]") {
  // y[b, s, d] = gelu(x[b, s, d] + bias[d]) * scale[b]: the inner stride pattern {1, 1, 1, 0}.
  const int64_t B = 3, S = 4, D = 5;
  auto x = randomFloats(size_t(B * S * D), 1), bias = randomFloats(size_t(D), 2),
       scale = randomFloats(size_t(B), 3);
  std::vector<float> y(x.size());
  Dims shape{B, S, D};
  map(y.data(), shape, x.data(), rowMajorStrides(shape), bias.data(), Dims{0, 0, 1}, scale.data(),
      Dims{1, 0, 0}, [](float v, float b, float s) { return mul(gelu(add(v, b)), s); });
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t d = 0; d < D; ++d) {
        size_t i = size_t((b * S + s) * D + d);
        CHECK(y[i] == gelu(x[i] + bias[size_t(d)]) * scale[size_t(b)]);
      }
  // A transposed read: out[d, b] = x[b, d]; strided inner loop.
  std::vector<float> t(size_t(B * D));
  copyStrided(x.data(), Dims{1, S * D}, t.data(), Dims{D, B});
  for (int64_t d = 0; d < D; ++d)
    for (int64_t b = 0; b < B; ++b)
      CHECK(t[size_t(d * B + b)] == x[size_t(b * S * D + d)]);
  // Rank 0 visits one point; a zero-size dim none; > 4 operands work.
  int calls = 0;
  forEachIndex<1>(Dims{}, {Dims{}}, [&](int64_t o) { calls += int(o == 0); });
  forEachIndex<1>(Dims{3, 0}, {Dims{0, 1}}, [&](int64_t) { calls += 10; });
  CHECK(calls == 1);
  int64_t sum = 0;
  forEachIndex<5>(
      Dims{2, 3}, {Dims{3, 1}, Dims{0, 1}, Dims{1, 0}, Dims{3, 1}, Dims{0, 0}},
      [&](int64_t a, int64_t b, int64_t c, int64_t d, int64_t e) { sum += a + b + c + d + e; });
  CHECK(sum == 15 + 6 + 3 + 15);
}

//===------------------------------------------------------------------------------------------===//
// Reductions and along-dims ops
//===------------------------------------------------------------------------------------------===//

namespace {
const std::vector<std::string> kABC = {"a", "b", "c"};
const std::vector<int64_t> kSizes = {3, 4, 5};
const Dims kShape{3, 4, 5};

ir::TensorType keptType(AxisMask mask) {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  for (int d = 0; d < 3; ++d)
    if (!(mask >> d & 1)) {
      names.push_back(kABC[size_t(d)]);
      sizes.push_back(kSizes[size_t(d)]);
    }
  return typeOf(DType::F32, names, sizes);
}

ir::AttrValue dimsAttr(AxisMask mask) {
  std::vector<std::string> names;
  for (int d = 0; d < 3; ++d)
    if (mask >> d & 1) names.push_back(kABC[size_t(d)]);
  return names;
}
} // namespace

TEST_CASE("reductions over any set of dims match the interpreter", "[kernels]") {
  auto x = randomFloats(60, 21);
  Tensor input = tensorOf(typeOf(DType::F32, kABC, kSizes), x);
  for (AxisMask mask :
       {axes({0}), axes({1}), axes({2}), axes({0, 2}), axes({1, 2}), axes({0, 1, 2})}) {
    for (auto [kind, opKind] : {std::pair{ReduceKind::Sum, OpKind::ReduceSum},
                                std::pair{ReduceKind::Mean, OpKind::ReduceMean},
                                std::pair{ReduceKind::Max, OpKind::ReduceMax},
                                std::pair{ReduceKind::Min, OpKind::ReduceMin},
                                std::pair{ReduceKind::LogSumExp, OpKind::LogSumExp}}) {
      INFO("mask " << mask << " op " << ir::opSpelling(opKind));
      Tensor expected = interpret(opKind, {input}, keptType(mask), {{"dims", dimsAttr(mask)}});
      std::vector<float> got(expected.data.size());
      reduce(kind, x.data(), kShape, mask, got.data());
      checkClose(got, expected.data, 1e-6, 1e-6);
    }
  }
  // i32 sums wrap; nan propagates through max.
  std::vector<int32_t> ints = {2147483647, 1, 5, -7};
  std::vector<int32_t> intSum(1);
  reduce(ReduceKind::Sum, ints.data(), Dims{4}, axes({0}), intSum.data());
  CHECK(intSum[0] == 2147483646); // 2^31 - 2 after passing 2^31
  std::vector<float> withNaN = {1, kNaN, 3}, max(1);
  reduce(ReduceKind::Max, withNaN.data(), Dims{3}, axes({0}), max.data());
  CHECK(std::isnan(max[0]));
}

TEST_CASE("softmax, log_softmax, layer_norm and cumsum match the interpreter", "[kernels]") {
  auto x = randomFloats(60, 22, -8, 8);
  x[7] = -kInf; // one -inf entry in a lane
  ir::TensorType type = typeOf(DType::F32, kABC, kSizes);
  Tensor input = tensorOf(type, x);
  for (int axis = 0; axis < 3; ++axis) {
    INFO("axis " << axis);
    std::vector<float> got(60);
    softmax(x.data(), got.data(), kShape, axis);
    checkClose(got, interpret(OpKind::Softmax, {input}, type, {{"dim", kABC[size_t(axis)]}}).data);
    logSoftmax(x.data(), got.data(), kShape, axis);
    checkClose(got,
               interpret(OpKind::LogSoftmax, {input}, type, {{"dim", kABC[size_t(axis)]}}).data);
    for (bool exclusive : {false, true}) {
      cumsum(x.data(), got.data(), kShape, axis, exclusive);
      checkClose(got, interpret(OpKind::Cumsum, {input}, type,
                                {{"dim", kABC[size_t(axis)]}, {"exclusive", int64_t(exclusive)}})
                          .data);
    }
  }
  auto y = randomFloats(60, 23, 90, 110); // a large mean: the two-pass variance matters
  Tensor yInput = tensorOf(type, y);
  for (AxisMask mask : {axes({2}), axes({1, 2}), axes({0})}) {
    INFO("mask " << mask);
    std::vector<float> got(60);
    layerNorm(y.data(), got.data(), kShape, mask, 1e-5);
    checkClose(
        got,
        interpret(OpKind::LayerNorm, {yInput}, type, {{"dims", dimsAttr(mask)}, {"eps", 1e-5}})
            .data,
        1e-5, 1e-5);
  }
  // All -inf: nan, as the interpreter.
  std::vector<float> dead = {-kInf, -kInf}, out(2);
  softmax(dead.data(), out.data(), Dims{2}, 0);
  CHECK(std::isnan(out[0]));
  std::vector<float> lse(1);
  reduce(ReduceKind::LogSumExp, dead.data(), Dims{2}, axes({0}), lse.data());
  CHECK(lse[0] == -kInf);
}

namespace {
/// Splits dim `axis` of a dense [3, 4, 5]-like buffer into `shards` equal pieces.
std::vector<std::vector<float>> splitAlong(const std::vector<float>& x, const Dims& shape, int axis,
                                           int shards) {
  std::vector<std::vector<float>> pieces;
  int64_t size = shape[axis] / shards;
  Dims local = shape;
  local[axis] = size;
  for (int s = 0; s < shards; ++s) {
    std::vector<float> piece(size_t(local.product()));
    slice(x.data(), shape, axis, s * size, size, piece.data());
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

std::vector<float> joinAlong(const std::vector<std::vector<float>>& pieces, const Dims& shape,
                             int axis) {
  std::vector<float> whole(size_t(shape.product()));
  int64_t size = shape[axis] / int64_t(pieces.size());
  Dims local = shape;
  local[axis] = size;
  for (size_t s = 0; s < pieces.size(); ++s)
    copyWindow(pieces[s].data(), local, whole.data(), shape[axis], axis, int64_t(s) * size, false);
  return whole;
}

std::vector<double> toDouble(const std::vector<float>& x) {
  return {x.begin(), x.end()};
}
} // namespace

TEST_CASE("split-dim phases recombined across shards equal the unsplit kernels", "[kernels]") {
  const Dims shape{3, 4, 6};
  auto x = randomFloats(72, 31, -6, 6);
  for (int axis : {1, 2}) {
    const int shards = 2;
    INFO("axis " << axis);
    AxisMask mask = meshrt::kernels::axis(axis);
    const size_t L = size_t(dropAxes(shape, mask).product());
    auto pieces = splitAlong(x, shape, axis, shards);
    Dims local = shape;
    local[axis] /= shards;
    int64_t lanes = int64_t(L);
    // softmax: local max -> allreduce max -> local sum exp -> allreduce sum -> normalize.
    std::vector<float> max(L, -kInf), localMaxima(L);
    for (const auto& piece : pieces) {
      localMax(piece.data(), local, mask, localMaxima.data());
      for (int64_t i = 0; i < lanes; ++i)
        max[size_t(i)] = maximum(max[size_t(i)], localMaxima[size_t(i)]);
    }
    std::vector<double> sum(L, 0), localSums(L);
    for (const auto& piece : pieces) {
      sumExp(piece.data(), local, mask, max.data(), localSums.data());
      for (int64_t i = 0; i < lanes; ++i)
        sum[size_t(i)] += localSums[size_t(i)];
    }
    for (bool log : {false, true}) {
      std::vector<std::vector<float>> outs;
      for (const auto& piece : pieces) {
        std::vector<float> out(piece.size());
        softmaxNormalize(piece.data(), out.data(), local, mask, max.data(), sum.data(), log);
        outs.push_back(std::move(out));
      }
      std::vector<float> whole(x.size());
      (log ? logSoftmax : softmax)(x.data(), whole.data(), shape, axis);
      checkClose(joinAlong(outs, shape, axis), toDouble(whole), 1e-6, 1e-7);
    }
    // logsumexp from the same statistics.
    std::vector<float> lse(L), wholeLse(L);
    logSumExpFinish(max.data(), sum.data(), lse.data(), lanes);
    reduce(ReduceKind::LogSumExp, x.data(), shape, mask, wholeLse.data());
    checkClose(lse, toDouble(wholeLse), 1e-6, 1e-7);
    // mean with the global count: partial means sum to the mean.
    std::vector<float> mean(L, 0), partial(L), wholeMean(L);
    for (const auto& piece : pieces) {
      reduce(ReduceKind::Mean, piece.data(), local, mask, partial.data(), shape[axis]);
      for (int64_t i = 0; i < lanes; ++i)
        mean[size_t(i)] += partial[size_t(i)];
    }
    reduce(ReduceKind::Mean, x.data(), shape, mask, wholeMean.data());
    checkClose(mean, toDouble(wholeMean), 1e-6, 1e-7);
    // layer_norm: local sums -> allreduce -> squared deviations -> allreduce -> normalize.
    std::vector<double> sums(L, 0), sqdev(L, 0), part(L);
    for (const auto& piece : pieces) {
      localSum(piece.data(), local, mask, part.data());
      for (int64_t i = 0; i < lanes; ++i)
        sums[size_t(i)] += part[size_t(i)];
    }
    for (const auto& piece : pieces) {
      sumSquaredDeviation(piece.data(), local, mask, sums.data(), shape[axis], part.data());
      for (int64_t i = 0; i < lanes; ++i)
        sqdev[size_t(i)] += part[size_t(i)];
    }
    std::vector<std::vector<float>> normed;
    for (const auto& piece : pieces) {
      std::vector<float> out(piece.size());
      layerNormNormalize(piece.data(), out.data(), local, mask, sums.data(), sqdev.data(),
                         shape[axis], 1e-5);
      normed.push_back(std::move(out));
    }
    std::vector<float> wholeNorm(x.size());
    layerNorm(x.data(), wholeNorm.data(), shape, mask, 1e-5);
    checkClose(joinAlong(normed, shape, axis), toDouble(wholeNorm), 1e-6, 1e-6);
    // cumsum: local totals -> allgather -> prefix of the lower shards -> offset cumsum.
    std::vector<float> gathered;
    for (const auto& piece : pieces) {
      std::vector<float> totals(L);
      reduce(ReduceKind::Sum, piece.data(), local, mask, totals.data());
      gathered.insert(gathered.end(), totals.begin(), totals.end());
    }
    for (bool exclusive : {false, true}) {
      std::vector<std::vector<float>> sums2;
      for (int s = 0; s < shards; ++s) {
        std::vector<float> offset(L), out(pieces[size_t(s)].size());
        shardPrefix(gathered.data(), s, lanes, offset.data());
        // Offsets are dense over the other dims in order: the cumsum lane layout.
        cumsum(pieces[size_t(s)].data(), out.data(), local, axis, exclusive, offset.data());
        sums2.push_back(std::move(out));
      }
      std::vector<float> wholeCumsum(x.size());
      cumsum(x.data(), wholeCumsum.data(), shape, axis, exclusive);
      checkClose(joinAlong(sums2, shape, axis), toDouble(wholeCumsum), 1e-5, 1e-5);
    }
  }
}

//===------------------------------------------------------------------------------------------===//
// Data movement
//===------------------------------------------------------------------------------------------===//

TEST_CASE("transpose, slice, pad, concat and shift match the interpreter", "[kernels]") {
  auto x = randomFloats(60, 41);
  ir::TensorType type = typeOf(DType::F32, kABC, kSizes);
  Tensor input = tensorOf(type, x);
  std::vector<float> got(60);
  transpose(x.data(), kShape, Dims{2, 0, 1}, got.data());
  checkExact(
      got,
      interpret(OpKind::Transpose, {input}, typeOf(DType::F32, {"c", "a", "b"}, {5, 3, 4})).data);
  std::vector<float> sliced(3 * 2 * 5);
  slice(x.data(), kShape, 1, 1, 2, sliced.data());
  checkExact(sliced,
             interpret(OpKind::Slice, {input}, typeOf(DType::F32, {"a", "w", "c"}, {3, 2, 5}),
                       {{"from", "b"}, {"to", "w"}, {"start", int64_t(1)}})
                 .data);
  std::vector<float> padded(3 * 7 * 5);
  pad(x.data(), kShape, 1, 2, 7, padded.data());
  checkExact(padded, interpret(OpKind::Pad, {input}, typeOf(DType::F32, {"a", "p", "c"}, {3, 7, 5}),
                               {{"from", "b"}, {"to", "p"}, {"before", int64_t(2)}})
                         .data);
  auto y = randomFloats(3 * 2 * 5, 42);
  std::vector<float> joined(3 * 6 * 5);
  concat<float>({x.data(), y.data()}, {4, 2}, Dims{3, 6, 5}, 1, joined.data());
  checkExact(joined, interpret(OpKind::Concat,
                               {input, tensorOf(typeOf(DType::F32, {"a", "e", "c"}, {3, 2, 5}), y)},
                               typeOf(DType::F32, {"a", "j", "c"}, {3, 6, 5}),
                               {{"from", std::vector<std::string>{"b", "e"}}, {"to", "j"}})
                         .data);
  for (int64_t offset : {-2, 0, 3, 9}) {
    INFO("offset " << offset);
    shift(x.data(), got.data(), kShape, 2, offset);
    checkExact(got,
               interpret(OpKind::Shift, {input}, type, {{"dim", "c"}, {"offset", offset}}).data);
  }
}

TEST_CASE("reshape regroups like the interpreter, adjacent or not", "[kernels]") {
  auto x = randomFloats(24, 45);
  Tensor input = tensorOf(typeOf(DType::F32, {"a", "b", "c"}, {2, 3, 4}), x);
  auto attrs = [](std::vector<std::string> from, std::vector<std::string> to) {
    return Attrs{{"from", from}, {"to", to}};
  };
  std::vector<float> got(24);
  // [a, b, c] -> [a, bc]: from (b, c), to (bc).
  reshape(x.data(), Dims{12, 0}, Dims{3, 4}, Dims{4, 1}, got.data(), Dims{2, 12}, Dims{1});
  checkExact(got, interpret(OpKind::Reshape, {input}, typeOf(DType::F32, {"a", "bc"}, {2, 12}),
                            attrs({"b", "c"}, {"bc"}))
                      .data);
  // [a, b, c] -> [ca, b]: from (c, a) (not adjacent, reversed), to (ca).
  reshape(x.data(), Dims{0, 4}, Dims{4, 2}, Dims{1, 12}, got.data(), Dims{8, 3}, Dims{0});
  checkExact(got, interpret(OpKind::Reshape, {input}, typeOf(DType::F32, {"ca", "b"}, {8, 3}),
                            attrs({"c", "a"}, {"ca"}))
                      .data);
  // [a, b, c] -> [a, p, q]: from (b, c), to (p, q) = (6, 2).
  reshape(x.data(), Dims{12, 0, 0}, Dims{3, 4}, Dims{4, 1}, got.data(), Dims{2, 6, 2}, Dims{1, 2});
  checkExact(got,
             interpret(OpKind::Reshape, {input}, typeOf(DType::F32, {"a", "p", "q"}, {2, 6, 2}),
                       attrs({"b", "c"}, {"p", "q"}))
                 .data);
  std::vector<int32_t> sevens(5);
  fill(sevens.data(), 5, 7);
  CHECK(sevens == std::vector<int32_t>(5, 7));
}

TEST_CASE("one_hot, gather and iota on vocab shards", "[kernels]") {
  const int64_t N = 6, V = 8, D = 3;
  std::vector<int32_t> ids = {0, 7, 3, 8, -1, 4}; // 8 and -1 are out of range
  ir::TensorType idType = typeOf(DType::I32, {"n"}, {N});
  // one_hot: the full result, and each of 2 shards [lo, lo + 4) equals its slice.
  std::vector<float> full(size_t(N * V));
  oneHot(ids.data(), Dims{1, 0}, full.data(), Dims{N, V}, 1);
  checkExact(full, interpret(OpKind::OneHot, {tensorOf(idType, ids)},
                             typeOf(DType::F32, {"n", "v"}, {N, V}), {{"dim", "v"}})
                       .data);
  for (int64_t lo : {0, 4}) {
    std::vector<float> shard(size_t(N * 4)), expected(size_t(N * 4));
    oneHot(ids.data(), Dims{1, 0}, shard.data(), Dims{N, 4}, 1, lo);
    slice(full.data(), Dims{N, V}, 1, lo, 4, expected.data());
    CHECK(shard == expected);
  }
  // gather rows of table[v, d] by ids[n] -> out[n, d]; shards of v sum to the full result.
  auto table = randomFloats(size_t(V * D), 51);
  std::vector<float> gathered(size_t(N * D));
  gather(table.data(), Dims{0, 1}, D, V, ids.data(), Dims{1, 0}, gathered.data(), Dims{N, D});
  checkExact(gathered, interpret(OpKind::Gather,
                                 {tensorOf(typeOf(DType::F32, {"v", "d"}, {V, D}), table),
                                  tensorOf(idType, ids)},
                                 typeOf(DType::F32, {"n", "d"}, {N, D}), {{"dim", "v"}})
                           .data);
  std::vector<float> summed(size_t(N * D), 0.0f);
  for (int64_t lo : {0, 4}) {
    std::vector<float> partial(size_t(N * D));
    gather(table.data() + lo * D, Dims{0, 1}, D, 4, ids.data(), Dims{1, 0}, partial.data(),
           Dims{N, D}, lo);
    for (size_t i = 0; i < summed.size(); ++i)
      summed[i] += partial[i];
  }
  CHECK(summed == gathered);
  // iota with an offset is the slice of the full iota.
  std::vector<int32_t> positions(6);
  iota(positions.data(), Dims{2, 3}, 1, 10);
  CHECK(positions == std::vector<int32_t>{10, 11, 12, 10, 11, 12});
  Tensor expected =
      interpret(OpKind::Iota, {}, typeOf(DType::I32, {"a", "b"}, {2, 3}), {{"dim", "a"}});
  iota(positions.data(), Dims{2, 3}, 0);
  checkExact(positions, expected.data);
}

//===------------------------------------------------------------------------------------------===//
// RNG fills
//===------------------------------------------------------------------------------------------===//

namespace {
/// Every 2-way x 3-way shard of a [rows, cols] tensor equals its slice of the whole fill.
template <typename T, typename Fill>
void checkShards(int64_t rows, int64_t cols, const std::vector<T>& whole, Fill fill) {
  for (int64_t r0 = 0; r0 < rows; r0 += rows / 2)
    for (int64_t c0 = 0; c0 < cols; c0 += cols / 3) {
      Shard shard{Dims{rows, cols}, Dims{r0, c0}, Dims{rows / 2, cols / 3}};
      std::vector<T> local(size_t(shard.localShape.product()));
      fill(local.data(), shard);
      for (int64_t r = 0; r < rows / 2; ++r)
        for (int64_t c = 0; c < cols / 3; ++c) {
          INFO("shard (" << r0 << ", " << c0 << ") element (" << r << ", " << c << ")");
          REQUIRE(local[size_t(r * (cols / 3) + c)] == whole[size_t((r0 + r) * cols + c0 + c)]);
        }
    }
}
} // namespace

TEST_CASE("input fills reproduce interp::synthesizeInput on every shard", "[kernels]") {
  const int64_t R = 6, C = 9;
  const uint64_t seed = 1234;
  for (auto [dtype, valueType] :
       {std::pair{DType::F32, ValueType::F32}, std::pair{DType::BF16, ValueType::BF16},
        std::pair{DType::F16, ValueType::F16}}) {
    ir::InputInfo info{"tokens", typeOf(dtype, {"r", "c"}, {R, C}), 0, {}, 0};
    Tensor expected = interp::synthesizeInput(info, seed);
    std::vector<float> whole(size_t(R * C));
    fillInput(whole.data(), wholeTensor(Dims{R, C}), seed, "tokens", valueType);
    checkExact(whole, expected.data);
    // Clang before 16 cannot capture a structured binding: an init-capture copies it.
    checkShards(R, C, whole, [&, type = valueType](float* out, const Shard& shard) {
      fillInput(out, shard, seed, "tokens", type);
    });
  }
  for (int64_t bound : {0, 50000}) {
    ir::InputInfo info{"ids", typeOf(DType::I32, {"r", "c"}, {R, C}), bound, {}, 0};
    Tensor expected = interp::synthesizeInput(info, seed);
    std::vector<int32_t> whole(size_t(R * C));
    fillInput(whole.data(), wholeTensor(Dims{R, C}), seed, "ids", bound);
    checkExact(whole, expected.data);
    checkShards(R, C, whole, [&](int32_t* out, const Shard& shard) {
      fillInput(out, shard, seed, "ids", bound);
    });
  }
}

TEST_CASE("param fills reproduce interp::initializeParam on every shard", "[kernels]") {
  const int64_t R = 8, C = 6; // orthogonal: blocks of 6 rows, the second one partial
  const uint64_t seed = 99;
  struct Case {
    std::string kind;
    std::vector<std::pair<std::string, double>> args;
    Init init;
  };
  std::vector<Case> cases = {
      {"zeros", {}, {InitKind::Zeros}},
      {"ones", {}, {InitKind::Ones}},
      {"constant", {{"value", 0.3}}, {InitKind::Constant, 0, 1, 0, 1, 0.3}},
      {"normal", {{"stddev", 0.02}}, {InitKind::Normal, 0, 0.02}},
      {"normal", {{"mean", 1}, {"stddev", 3}}, {InitKind::Normal, 1, 3}},
      {"truncated_normal", {{"stddev", 0.5}}, {InitKind::TruncatedNormal, 0, 0.5}},
      {"uniform", {{"min", -0.1}, {"max", 0.2}}, {InitKind::Uniform, 0, 1, -0.1, 0.2}},
      {"orthogonal", {{"scale", 2}}, {InitKind::Orthogonal, 0, 1, 0, 1, 0, 2}},
  };
  for (const Case& c : cases) {
    REQUIRE(parseInitKind(c.kind) == c.init.kind);
    for (auto [dtype, valueType] :
         {std::pair{DType::F32, ValueType::F32}, std::pair{DType::BF16, ValueType::BF16}}) {
      INFO(c.kind << " " << ir::dtypeName(dtype));
      ir::ParamInfo info;
      info.path = "block[1]/ffn/w";
      info.type = typeOf(dtype, {"r", "c"}, {R, C});
      info.init = ir::Initializer{c.kind, c.args};
      Tensor expected = interp::initializeParam(info, seed);
      std::vector<float> whole(size_t(R * C));
      fillParam(whole.data(), wholeTensor(Dims{R, C}), seed, info.path, c.init, valueType);
      checkExact(whole, expected.data);
      checkShards(R, C, whole, [&, type = valueType](float* out, const Shard& shard) {
        fillParam(out, shard, seed, info.path, c.init, type);
      });
    }
  }
  CHECK_FALSE(parseInitKind("xavier").has_value());
  Init byName = makeInit("uniform", {{"min", -0.1}, {"max", 0.2}});
  CHECK((byName.kind == InitKind::Uniform && byName.min == -0.1 && byName.max == 0.2));
  CHECK(makeInit("orthogonal", {{"scale", 2}}).scale == 2);
  CHECK_THROWS_AS(makeInit("xavier"), std::invalid_argument);
  CHECK_THROWS_AS(makeInit("normal", {{"sigma", 1}}), std::invalid_argument);
}

TEST_CASE("random ops and dropout reproduce the interpreter on every shard", "[kernels]") {
  const int64_t R = 4, C = 6;
  const uint64_t seed = 7;
  ir::TensorType type = typeOf(DType::F32, {"r", "c"}, {R, C});
  interp::Options opts;
  opts.seed = seed;
  Tensor normalExpected = interpret(OpKind::RandomNormal, {}, type,
                                    {{"mean", 0.5}, {"stddev", 2.0}, {"stream", "noise"}}, opts);
  std::vector<float> whole(size_t(R * C));
  fillRandomNormal(whole.data(), wholeTensor(Dims{R, C}), seed, "noise", 0.5, 2.0);
  checkExact(whole, normalExpected.data);
  checkShards(R, C, whole, [&](float* out, const Shard& shard) {
    fillRandomNormal(out, shard, seed, "noise", 0.5, 2.0);
  });
  Tensor uniformExpected = interpret(OpKind::RandomUniform, {}, type,
                                     {{"min", -1.0}, {"max", 3.0}, {"stream", "u"}}, opts);
  fillRandomUniform(whole.data(), wholeTensor(Dims{R, C}), seed, "u", -1, 3);
  checkExact(whole, uniformExpected.data);

  auto x = randomFloats(size_t(R * C), 61);
  opts.training = true;
  opts.step = 3;
  Tensor dropped = interpret(OpKind::Dropout, {tensorOf(type, x)}, type,
                             {{"rate", 0.25}, {"stream", "drop"}}, opts);
  uint64_t key = dropoutKey(seed, "drop", 3);
  dropout(x.data(), whole.data(), wholeTensor(Dims{R, C}), key, 0.25);
  checkExact(whole, dropped.data);
  checkShards(R, C, whole, [&](float* out, const Shard& shard) {
    std::vector<float> in(size_t(shard.localShape.product()));
    for (int64_t r = 0; r < shard.localShape[0]; ++r)
      for (int64_t c = 0; c < shard.localShape[1]; ++c)
        in[size_t(r * shard.localShape[1] + c)] =
            x[size_t((shard.offset[0] + r) * C + shard.offset[1] + c)];
    dropout(in.data(), out, shard, key, 0.25);
  });
}
