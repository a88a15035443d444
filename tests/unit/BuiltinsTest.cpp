// The builtins that sema writes with other ops (argmax, argmin, clip) and the i32 operators, at
// the source level: .mesh text through sema, run by the reference interpreter on given inputs.
#include "interp/Interpreter.h"
#include "sema/Sema.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

using namespace meshc;

namespace {

const char* kDims = R"(
dim a = 2
dim b = 4
dim k = 3
)";

/// Runs function `name` of `body` (after kDims) on `inputs` at train step `step`.
interp::TensorMap runFunction(const std::string& body, const std::string& name,
                              const interp::TensorMap& inputs, uint64_t step) {
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream errorStream(errors);
  DiagEngine diag(sources, errorStream);
  std::optional<ir::Module> module;
  if (auto set = loadSourcesFromBuffer(std::string(kDims) + body, "t.mesh", diag))
    module = analyze(*set, diag);
  errorStream.flush();
  INFO(errors);
  REQUIRE(module);
  const ir::Function* fn = module->findFunction(name);
  REQUIRE(fn);
  interp::Options opts;
  opts.step = step;
  auto outputs = interp::run(*fn, inputs, opts);
  if (!outputs) FAIL(llvm::toString(outputs.takeError()));
  return std::move(*outputs);
}

interp::TensorMap runProgram(const std::string& body, const interp::TensorMap& inputs) {
  return runFunction(body, "p", inputs, 0);
}

interp::Tensor tensorAB(ir::DType dtype, std::vector<double> data) {
  return interp::Tensor{ir::TensorType{dtype, {{"a", 2}, {"b", 4}}}, std::move(data)};
}

/// The errors sema reports for program text after kDims (empty when it is accepted).
std::string semaErrors(const std::string& body) {
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream errorStream(errors);
  DiagEngine diag(sources, errorStream);
  if (auto set = loadSourcesFromBuffer(std::string(kDims) + body, "t.mesh", diag))
    analyze(*set, diag);
  errorStream.flush();
  return errors;
}

} // namespace

TEST_CASE("argmax and argmin: the first index of the extreme, NaN counting as it", "[builtins]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::string program = R"(
program p(x: f32[a, b], n: i32[a, b]) -> (hi: i32[a], lo: i32[a], col: i32[b], ihi: i32[a]) {
  hi = argmax(x, b)
  lo = argmin(x, b)
  col = argmax(x, a)
  ihi = argmax(n, b)
})";
  SECTION("ties go to the lower index") {
    interp::TensorMap out =
        runProgram(program, {{"x", tensorAB(ir::DType::F32, {1, 5, 5, -2, 3, -1, 3, -1})},
                             {"n", tensorAB(ir::DType::I32, {4, 9, 9, 2, -7, -7, -8, -7})}});
    CHECK(out.at("hi").data == std::vector<double>{1, 0});
    CHECK(out.at("lo").data == std::vector<double>{3, 1});
    CHECK(out.at("col").data == std::vector<double>{1, 0, 0, 1});
    CHECK(out.at("ihi").data == std::vector<double>{1, 0});
  }
  SECTION("a NaN is the extreme of its row, as in NumPy") {
    interp::TensorMap out =
        runProgram(program, {{"x", tensorAB(ir::DType::F32, {1, nan, 7, nan, -3, -4, -5, -6})},
                             {"n", tensorAB(ir::DType::I32, {0, 0, 0, 0, 0, 0, 0, 0})}});
    CHECK(out.at("hi").data == std::vector<double>{1, 0});
    CHECK(out.at("lo").data == std::vector<double>{1, 3});
    CHECK(out.at("ihi").data == std::vector<double>{0, 0});
  }
}

TEST_CASE("clip bounds elementwise by literals or tensors", "[builtins]") {
  interp::TensorMap out = runProgram(
      R"(
program p(x: f32[a, b], lo: f32[b], n: i32[a, b]) -> (y: f32[a, b], z: f32[a, b], k: i32[a, b]) {
  y = clip(x, -1.0, 2.0)
  z = clip(x, lo, 0.5)
  k = clip(n, 0, 3)
})",
      {{"x", tensorAB(ir::DType::F32, {-3, -1, 0.25, 2, 2.5, 1, -0.5, 9})},
       {"lo", interp::Tensor{ir::TensorType{ir::DType::F32, {{"b", 4}}}, {0, -2, 0.5, 1}}},
       {"n", tensorAB(ir::DType::I32, {-5, 0, 2, 3, 4, 1, -1, 7})}});
  CHECK(out.at("y").data == std::vector<double>{-1, -1, 0.25, 2, 2, 1, -0.5, 2});
  // A lower bound above the upper one gives the upper bound (min is applied last).
  CHECK(out.at("z").data == std::vector<double>{0, -1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5});
  CHECK(out.at("k").data == std::vector<double>{0, 0, 2, 3, 3, 1, 0, 3});
}

TEST_CASE("i32 math: %, floordiv, mod, abs, neg, maximum, minimum and where", "[builtins]") {
  interp::TensorMap out = runProgram(
      R"(
program p(n: i32[a, b], m: i32[b]) -> (r: i32[a, b], q: i32[a, b], s: i32[a, b], t: i32[a, b],
                                       u: i32[a, b], v: i32[a, b]) {
  r = n % m
  q = floordiv(n, m)
  s = mod(n, 3) + floordiv(7, 2)
  t = abs(n) - n
  u = maximum(n, m) * minimum(n, -m)
  v = where(n > 0, n, -1)
})",
      {{"n", tensorAB(ir::DType::I32, {7, -7, 7, -7, 0, 5, -1, 9})},
       {"m", interp::Tensor{ir::TensorType{ir::DType::I32, {{"b", 4}}}, {2, 2, -2, -2}}}});
  CHECK(out.at("r").data == std::vector<double>{1, 1, -1, -1, 0, 1, -1, -1});
  CHECK(out.at("q").data == std::vector<double>{3, -4, -4, 3, 0, 2, 0, -5});
  CHECK(out.at("s").data == std::vector<double>{4, 5, 4, 5, 3, 5, 5, 3});
  CHECK(out.at("t").data == std::vector<double>{0, 14, 0, 14, 0, 0, 2, 0});
  CHECK(out.at("u").data == std::vector<double>{-14, -14, 14, 14, -4, -10, 1, 18});
  CHECK(out.at("v").data == std::vector<double>{7, -1, 7, -1, -1, 5, -1, 9});
}

TEST_CASE("top_k_values and top_k_indices: one selection, infinities kept apart", "[builtins]") {
  const double inf = std::numeric_limits<double>::infinity();
  interp::TensorMap out =
      runProgram(R"(
program p(x: f32[a, b]) -> (i: i32[a, k], v: f32[a, k]) {
  i = top_k_indices(x, b -> k)
  v = top_k_values(x, b -> k)
})",
                 {{"x", tensorAB(ir::DType::F32, {2, -inf, 7, 2, inf, 1, 1, -1})}});
  CHECK(out.at("i").data == std::vector<double>{2, 0, 3, 0, 1, 2});
  CHECK(out.at("v").data == std::vector<double>{7, 2, 2, inf, 1, 1});
}

TEST_CASE("scatter_add adds rows at ids into zeros; ids out of range add nothing", "[builtins]") {
  interp::TensorMap out =
      runProgram(R"(
program p(u: f32[a, b], ids: i32[a]) -> (s: f32[k, b], back: f32[a, b]) {
  s = scatter_add(u, ids, k)
  back = gather(scatter_add(u, ids, k), ids, k)
})",
                 {{"u", tensorAB(ir::DType::F32, {1, 2, 3, 4, 10, 20, 30, 40})},
                  {"ids", interp::Tensor{ir::TensorType{ir::DType::I32, {{"a", 2}}}, {2, 2}}}});
  CHECK(out.at("s").data == std::vector<double>{0, 0, 0, 0, 0, 0, 0, 0, 11, 22, 33, 44});
  CHECK(out.at("back").data == std::vector<double>{11, 22, 33, 44, 11, 22, 33, 44});
  interp::TensorMap apart =
      runProgram(R"(
program p(u: f32[a, b], ids: i32[a]) -> (s: f32[k, b]) {
  s = scatter_add(u, ids, k)
})",
                 {{"u", tensorAB(ir::DType::F32, {1, 2, 3, 4, 10, 20, 30, 40})},
                  {"ids", interp::Tensor{ir::TensorType{ir::DType::I32, {{"a", 2}}}, {0, 7}}}});
  CHECK(apart.at("s").data == std::vector<double>{1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0});
}

TEST_CASE("random_permutation and random_int: fixed in programs, fresh each train step",
          "[builtins]") {
  const std::string source = R"(
dim n = 64
program p() -> (perm: i32[n], again: i32[n], ints: i32[a, n]) {
  perm = random_permutation(n)
  again = random_permutation(n)
  ints = random_int(i32[a, n], max = 5)
}
train t(x: f32[n]) {
  param w: f32[n] = normal()
  minimize sum(w * x * cast(random_permutation(n) + random_int(i32[n], max = 3), f32))
      with sgd(lr = 0.1)
})";
  interp::TensorMap out = runProgram(source, {});
  std::vector<double> sorted = out.at("perm").data, identity(64);
  std::iota(identity.begin(), identity.end(), 0.0);
  CHECK(sorted != identity);
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == identity);
  CHECK(out.at("again").data != out.at("perm").data); // each call its own stream
  for (double v : out.at("ints").data) {
    CHECK(v >= 0);
    CHECK(v < 5);
  }
  CHECK(runProgram(source, {}).at("perm").data == out.at("perm").data);
  interp::Tensor ones{ir::TensorType{ir::DType::F32, {{"n", 64}}}, std::vector<double>(64, 1.0)};
  double first = runFunction(source, "t", {{"x", ones}}, 0).at("loss").data.at(0);
  CHECK(runFunction(source, "t", {{"x", ones}}, 0).at("loss").data.at(0) == first);
  CHECK(runFunction(source, "t", {{"x", ones}}, 1).at("loss").data.at(0) != first);
}

TEST_CASE("bad arguments to the new builtins are located errors", "[builtins]") {
  CHECK(semaErrors("program p(x: f32[a, b]) -> (y: f32[a, b]) {\n  y = x % 2.0\n}")
            .find("t.mesh:6:9: error: '%' requires i32 operands but got f32[a, b]") !=
        std::string::npos);
  CHECK(semaErrors("program p(n: i32[a, b]) -> (y: i32[a, b]) {\n  y = floordiv(n, 1.5)\n}")
            .find("an i32 operand requires an integer literal, not 1.5") != std::string::npos);
  CHECK(semaErrors("program p(x: f32[a, b]) -> (y: f32[a, b]) {\n  y = clip(x, 1.0, 0.0)\n}")
            .find("'hi' of 'clip' must be >= 1, not 0") != std::string::npos);
  CHECK(semaErrors("program p(x: f32[a]) -> (y: i32[]) {\n  y = argmax(x, b)\n}")
            .find("error: dim 'b' is not a dim of f32[a]") != std::string::npos);
  CHECK(semaErrors("program p(n: i32[a]) -> (y: i32[a]) {\n  y = round(n)\n}")
            .find("'round' requires a float tensor but got i32[a]") != std::string::npos);
  CHECK(semaErrors("program p(x: f32[a, b]) -> (y: f32[k, b]) {\n  y = top_k_values(x, a -> k)\n}")
            .find("'top_k_values' selects size(k) = 3 elements, more than size(a) = 2") !=
        std::string::npos);
  CHECK(semaErrors("program p(x: f32[a, b]) -> (y: i32[a, k]) {\n  y = top_k_indices(x, b)\n}")
            .find("'top_k_indices' needs '->' followed by its output dims") != std::string::npos);
  CHECK(semaErrors("program p(u: f32[a, b], i: i32[k]) -> (y: f32[k, b]) {\n"
                   "  y = scatter_add(u, i, a)\n}")
            .find("dim 'a' is already a dim of f32[a, b]") != std::string::npos);
  CHECK(semaErrors("program p(u: f32[a, b], i: i32[k]) -> (y: f32[k, a, b]) {\n"
                   "  y = scatter_add(u, i, k)\n}")
            .find("dim 'k' is not a dim of f32[a, b]") != std::string::npos);
}
