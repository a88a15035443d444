// The reference interpreter, op by op, on small hand-built graphs with hand-computed answers.
#include "interp/Interpreter.h"
#include "interp/UserFunctions.h"

#include "meshrt/Random.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

using namespace meshc;
using namespace meshc::interp;
using ir::DType;
using ir::OpKind;

namespace {

using Attrs = std::vector<std::pair<std::string, ir::AttrValue>>;
using DimList = std::vector<std::string>;

ir::TensorType type(DType dtype, std::vector<ir::Dim> dims = {}) {
  return {dtype, dims};
}
ir::TensorType f32(std::vector<ir::Dim> dims = {}) {
  return type(DType::F32, std::move(dims));
}
ir::TensorType i32(std::vector<ir::Dim> dims = {}) {
  return type(DType::I32, std::move(dims));
}

Tensor tensor(ir::TensorType tensorType, std::vector<double> data) {
  return Tensor{std::move(tensorType), std::move(data)};
}

/// Builds a Function op by op.
struct Graph {
  ir::Function fn;

  ir::ValueId input(const std::string& name, ir::TensorType inputType, int64_t indexBound = 0) {
    ir::Op op{OpKind::Input, {}, 0, {{"name", name}, {"index", int64_t(fn.inputs.size())}}, {}};
    ir::ValueId id = fn.addOp(op, inputType, name);
    fn.inputs.push_back(ir::InputInfo{name, inputType, indexBound, {}, id});
    return id;
  }
  ir::ValueId param(const std::string& path, ir::TensorType paramType, ir::Initializer init) {
    ir::Op op{OpKind::Param, {}, 0, {{"path", path}}, {}};
    ir::ValueId id = fn.addOp(op, paramType, path);
    fn.params.push_back(ir::ParamInfo{path, paramType, std::move(init), true, {}, id});
    return id;
  }
  ir::ValueId op(OpKind kind, std::vector<ir::ValueId> operands, ir::TensorType resultType,
                 Attrs attrs = {}) {
    return fn.addOp(ir::Op{kind, std::move(operands), 0, std::move(attrs), {}}, resultType);
  }
  void output(const std::string& name, ir::ValueId id) {
    fn.outputs.push_back(ir::OutputInfo{name, id, {}});
  }
};

TensorMap runOk(const ir::Function& fn, const TensorMap& inputs, const Options& opts = {},
                const TensorMap& params = {}) {
  auto result = run(fn, inputs, opts, params);
  if (!result) {
    FAIL(llvm::toString(result.takeError()));
  }
  return std::move(*result);
}

std::string runError(const ir::Function& fn, const TensorMap& inputs, const Options& opts = {},
                     const TensorMap& params = {}) {
  auto result = run(fn, inputs, opts, params);
  bool failed = !result;
  REQUIRE(failed);
  return llvm::toString(result.takeError());
}

/// Runs one op on the given operands (fed as inputs x0, x1, ...) and returns its result.
Tensor evalOp(OpKind kind, std::vector<Tensor> operands, ir::TensorType resultType,
              Attrs attrs = {}, const Options& opts = {}) {
  Graph graph;
  TensorMap inputs;
  std::vector<ir::ValueId> ids;
  for (size_t i = 0; i < operands.size(); ++i) {
    std::string name = "x" + std::to_string(i);
    ids.push_back(graph.input(name, operands[i].type));
    inputs[name] = operands[i];
  }
  graph.output("out", graph.op(kind, ids, resultType, std::move(attrs)));
  Tensor out = runOk(graph.fn, inputs, opts).at("out");
  CHECK(out.type == resultType);
  CHECK(out.data.size() == size_t(resultType.numElements()));
  return out;
}

void checkData(const Tensor& got, const std::vector<double>& expected, double margin = 1e-6) {
  REQUIRE(got.data.size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("element " << i);
    if (std::isnan(expected[i]))
      CHECK(std::isnan(got.data[i]));
    else if (std::isinf(expected[i]))
      CHECK(got.data[i] == expected[i]);
    else
      CHECK(got.data[i] == Approx(expected[i]).margin(margin).epsilon(1e-6));
  }
}

// x: f32[a=2, b=3] = 1..6
const ir::TensorType kAB = f32({{"a", 2}, {"b", 3}});
const ir::TensorType kBA = f32({{"b", 3}, {"a", 2}});
Tensor x23() {
  return tensor(kAB, {1, 2, 3, 4, 5, 6});
}

} // namespace

TEST_CASE("elementwise unary ops", "[interp]") {
  Tensor x = tensor(f32({{"n", 4}}), {-1.5, 0.25, 1, 2});
  auto apply = [&](OpKind kind, double (*fn)(double)) {
    INFO(ir::opSpelling(kind));
    std::vector<double> expected;
    for (double v : x.data)
      expected.push_back(double(float(fn(v))));
    checkData(evalOp(kind, {x}, x.type), expected);
  };
  apply(OpKind::Neg, [](double v) { return -v; });
  apply(OpKind::Abs, [](double v) { return std::fabs(v); });
  apply(OpKind::Exp, [](double v) { return std::exp(v); });
  apply(OpKind::Square, [](double v) { return v * v; });
  apply(OpKind::Tanh, [](double v) { return std::tanh(v); });
  apply(OpKind::Sigmoid, [](double v) { return 1 / (1 + std::exp(-v)); });
  apply(OpKind::Relu, [](double v) { return v > 0 ? v : 0; });
  apply(OpKind::Sin, [](double v) { return std::sin(v); });
  apply(OpKind::Cos, [](double v) { return std::cos(v); });
  apply(OpKind::StopGradient, [](double v) { return v; });
  Tensor positive = tensor(f32({{"n", 3}}), {0.25, 1, 4});
  checkData(evalOp(OpKind::Log, {positive}, positive.type), {std::log(0.25), 0, std::log(4.0)});
  checkData(evalOp(OpKind::Sqrt, {positive}, positive.type), {0.5, 1, 2});
  checkData(evalOp(OpKind::Rsqrt, {positive}, positive.type), {2, 1, 0.5});
  // gelu, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  Tensor g = tensor(f32({{"n", 3}}), {-1, 0, 1});
  checkData(evalOp(OpKind::Gelu, {g}, g.type), {-0.1588080094, 0, 0.8411919906});
  // sigmoid does not overflow for large negative inputs.
  Tensor big = tensor(f32({{"n", 2}}), {-1000, 1000});
  checkData(evalOp(OpKind::Sigmoid, {big}, big.type), {0, 1});
  // i32 neg/abs/square stay integers.
  Tensor ints = tensor(i32({{"n", 3}}), {-3, 0, 7});
  checkData(evalOp(OpKind::Neg, {ints}, ints.type), {3, 0, -7});
  checkData(evalOp(OpKind::Square, {ints}, ints.type), {9, 0, 49});
}

TEST_CASE("binary ops broadcast by dim name", "[interp]") {
  Tensor x = x23();
  Tensor yTransposed = tensor(kBA, {10, 20, 30, 40, 50, 60}); // y[b][a]
  // result[a][b] = x[a][b] + y[b][a]
  checkData(evalOp(OpKind::Add, {x, yTransposed}, kAB), {11, 32, 53, 24, 45, 66});
  // The same sum laid out [b, a].
  checkData(evalOp(OpKind::Add, {x, yTransposed}, kBA), {11, 24, 32, 45, 53, 66});
  // Disjoint dims: outer sum, in both result orders.
  Tensor column = tensor(f32({{"a", 2}}), {100, 200});
  Tensor row = tensor(f32({{"b", 3}}), {1, 2, 3});
  checkData(evalOp(OpKind::Add, {column, row}, kAB), {101, 102, 103, 201, 202, 203});
  checkData(evalOp(OpKind::Sub, {row, column}, kBA), {-99, -199, -98, -198, -97, -197});
  // A scalar broadcasts everywhere.
  Tensor two = tensor(f32(), {2});
  checkData(evalOp(OpKind::Mul, {x, two}, kAB), {2, 4, 6, 8, 10, 12});
  checkData(evalOp(OpKind::Div, {x, two}, kAB), {0.5, 1, 1.5, 2, 2.5, 3});
  checkData(evalOp(OpKind::Pow, {x, two}, kAB), {1, 4, 9, 16, 25, 36});
  Tensor z = tensor(kAB, {6, 1, 3, 0, 9, 6});
  checkData(evalOp(OpKind::Maximum, {x, z}, kAB), {6, 2, 3, 4, 9, 6});
  checkData(evalOp(OpKind::Minimum, {x, z}, kAB), {1, 1, 3, 0, 5, 6});
}

TEST_CASE("comparisons give i32 0/1 and where selects", "[interp]") {
  Tensor x = x23();
  Tensor three = tensor(f32(), {3});
  auto compare = [&](OpKind kind, std::vector<double> expected) {
    INFO(ir::opSpelling(kind));
    Tensor out = evalOp(kind, {x, three}, i32({{"a", 2}, {"b", 3}}));
    checkData(out, expected);
  };
  compare(OpKind::Lt, {1, 1, 0, 0, 0, 0});
  compare(OpKind::Le, {1, 1, 1, 0, 0, 0});
  compare(OpKind::Gt, {0, 0, 0, 1, 1, 1});
  compare(OpKind::Ge, {0, 0, 1, 1, 1, 1});
  compare(OpKind::Eq, {0, 0, 1, 0, 0, 0});
  compare(OpKind::Ne, {1, 1, 0, 1, 1, 1});
  // where(cond[b], x[a, b], scalar)
  Tensor cond = tensor(i32({{"b", 3}}), {1, 0, 5});
  Tensor zero = tensor(f32(), {-1});
  checkData(evalOp(OpKind::Where, {cond, x, zero}, kAB), {1, -1, 3, 4, -1, 6});
  checkData(evalOp(OpKind::Where, {cond, x, zero}, kBA), {1, 4, -1, -1, 3, 6});
}

TEST_CASE("i32 arithmetic truncates, wraps and divides by zero as 0", "[interp]") {
  ir::TensorType n4 = i32({{"n", 4}});
  Tensor a = tensor(n4, {7, -7, 5, 65536});
  Tensor b = tensor(n4, {2, 2, 0, 65536});
  checkData(evalOp(OpKind::Div, {a, b}, n4), {3, -3, 0, 1});
  checkData(evalOp(OpKind::Mul, {a, b}, n4), {14, -14, 0, 0}); // 2^32 wraps to 0
  Tensor maxInt = tensor(i32(), {2147483647});
  Tensor one = tensor(i32(), {1});
  checkData(evalOp(OpKind::Add, {maxInt, one}, i32()), {-2147483648.0});
  // Products beyond a double's 53 bits still wrap exactly: (2^31 - 1)^2 = 1 mod 2^32.
  checkData(evalOp(OpKind::Mul, {maxInt, maxInt}, i32()), {1});
  checkData(evalOp(OpKind::Square, {maxInt}, i32()), {1});
  Tensor big = tensor(i32(), {123456789});
  checkData(evalOp(OpKind::Square, {big}, i32()),
            {double(int32_t(uint32_t(123456789ull * 123456789ull)))});
  Tensor base = tensor(n4, {2, 3, -2, 2});
  Tensor exponent = tensor(n4, {10, 0, 3, -1});
  checkData(evalOp(OpKind::Pow, {base, exponent}, n4), {1024, 1, -8, 0});
}

TEST_CASE("floor, ceil and round (halves to even)", "[interp]") {
  Tensor x = tensor(f32({{"n", 8}}), {-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.7, -2.7});
  checkData(evalOp(OpKind::Floor, {x}, x.type), {-3, -2, -1, 0, 1, 2, 2, -3});
  checkData(evalOp(OpKind::Ceil, {x}, x.type), {-2, -1, 0, 1, 2, 3, 3, -2});
  checkData(evalOp(OpKind::Round, {x}, x.type), {-2, -2, 0, 0, 2, 2, 3, -3});
  CHECK(std::signbit(evalOp(OpKind::Round, {x}, x.type).data[2])); // -0.5 rounds to -0
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor special = tensor(f32({{"n", 3}}), {inf, -inf, nan});
  checkData(evalOp(OpKind::Floor, {special}, special.type), {inf, -inf, nan});
}

TEST_CASE("i32 floordiv and mod round toward -inf; mod takes the divisor's sign", "[interp]") {
  ir::TensorType n8 = i32({{"n", 8}});
  Tensor a = tensor(n8, {7, -7, 7, -7, 0, 5, -2147483648.0, -2147483648.0});
  Tensor b = tensor(n8, {2, 2, -2, -2, 3, 0, -1, 2});
  // INT32_MIN // -1 = 2^31 wraps to INT32_MIN; by zero: quotient 0, modulo a.
  checkData(evalOp(OpKind::FloorDiv, {a, b}, n8), {3, -4, -4, 3, 0, 0, -2147483648.0, -1073741824});
  checkData(evalOp(OpKind::Mod, {a, b}, n8), {1, 1, -1, -1, 0, 5, 0, 0});
  // a == b * (a // b) + a % b with |a % b| < |b| and the sign of b, over a small grid.
  std::vector<double> as, bs;
  for (int x = -9; x <= 9; ++x)
    for (int y = -4; y <= 4; ++y)
      if (y != 0) {
        as.push_back(x);
        bs.push_back(y);
      }
  ir::TensorType grid = i32({{"n", int64_t(as.size())}});
  Tensor q = evalOp(OpKind::FloorDiv, {tensor(grid, as), tensor(grid, bs)}, grid);
  Tensor r = evalOp(OpKind::Mod, {tensor(grid, as), tensor(grid, bs)}, grid);
  for (size_t i = 0; i < as.size(); ++i) {
    INFO(as[i] << " and " << bs[i]);
    CHECK(bs[i] * q.data[i] + r.data[i] == as[i]);
    CHECK(std::fabs(r.data[i]) < std::fabs(bs[i]));
    CHECK((r.data[i] == 0 || (r.data[i] > 0) == (bs[i] > 0)));
  }
}

TEST_CASE("top_k: positions in descending order, NaN first, ties to the lower position",
          "[interp]") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = tensor(f32({{"a", 2}, {"b", 5}}), {3, 1, 3, nan, 2, -1, -1, -5, 0, inf});
  checkData(evalOp(OpKind::TopK, {x}, i32({{"a", 2}, {"e", 3}}), {{"from", "b"}, {"to", "e"}}),
            {3, 0, 2, 4, 3, 0});
  // Along the major dim, into a dim placed where it was; i32 input.
  Tensor n = tensor(i32({{"b", 5}, {"a", 2}}), {4, 0, 9, 0, 4, 1, 9, -3, 8, 1});
  checkData(evalOp(OpKind::TopK, {n}, i32({{"e", 3}, {"a", 2}}), {{"from", "b"}, {"to", "e"}}),
            {1, 2, 3, 4, 4, 0});
  CHECK(runError(
            [&] {
              Graph graph;
              ir::ValueId in = graph.input("x", x.type);
              graph.output("y", graph.op(OpKind::TopK, {in}, i32({{"a", 2}, {"f", 6}}),
                                         {{"from", "b"}, {"to", "f"}}));
              return graph.fn;
            }(),
            {{"x", x}})
            .find("selects 6 of 5 elements") != std::string::npos);
}

TEST_CASE("casts round to the target dtype", "[interp]") {
  ir::TensorType n = f32({{"n", 6}});
  SECTION("bf16 rounds to nearest even on 8 significant bits") {
    Tensor x = tensor(n, {1.00390625, 1.01171875, 1.0078125, -3.0, 0x1.FEp127, 3.0e38});
    Tensor out = evalOp(OpKind::Cast, {x}, type(DType::BF16, {{"n", 6}}));
    // 1 + 2^-8 ties to even (1); 1 + 3*2^-8 ties up to 1 + 2^-6; 1 + 2^-7 is exact.
    checkData(out, {1.0, 1.015625, 1.0078125, -3.0, 0x1.FEp127, std::ldexp(226.0, 120)}, 0.0);
  }
  SECTION("bf16 exact values and overflow") {
    ir::TensorType one = f32({{"n", 1}});
    // f32 max rounds past the bf16 max finite value: infinity.
    Tensor out =
        evalOp(OpKind::Cast, {tensor(one, {3.4028234663852886e38})}, type(DType::BF16, {{"n", 1}}));
    CHECK(out.data[0] == std::numeric_limits<double>::infinity());
  }
  SECTION("f16 rounds, overflows to inf and flushes tiny values through subnormals") {
    Tensor x = tensor(n, {65504, 65519, 65520, 1e-8, 3e-8, 1.0 + 1.0 / 2048});
    Tensor out = evalOp(OpKind::Cast, {x}, type(DType::F16, {{"n", 6}}));
    double smallest = std::ldexp(1.0, -24);
    checkData(out, {65504, 65504, std::numeric_limits<double>::infinity(), 0, smallest, 1.0}, 0.0);
  }
  SECTION("to i32 truncates toward zero and saturates to what f32 storage holds; nan gives 0") {
    double inf = std::numeric_limits<double>::infinity();
    Tensor x = tensor(f32({{"n", 10}}), {2.7, -2.7, 0.5, -0.5, 1e10, -1e10, inf, -inf,
                                         std::numeric_limits<double>::quiet_NaN(), 2147483520.0});
    // Exactly (checkData's relative epsilon would accept 2^31 - 1 for 2^31 - 128).
    std::vector<double> expected = {
        2, -2, 0, 0, 2147483520.0, -2147483648.0, 2147483520.0, -2147483648.0, 0, 2147483520.0};
    Tensor out = evalOp(OpKind::Cast, {x}, i32({{"n", 10}}));
    REQUIRE(out.data.size() == expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      INFO("element " << i);
      CHECK(out.data[i] == expected[i]);
    }
  }
  SECTION("from i32 to f32 rounds to 24 bits") {
    Tensor x = tensor(i32({{"n", 2}}), {16777217, -5});
    checkData(evalOp(OpKind::Cast, {x}, f32({{"n", 2}})), {16777216, -5}, 0.0);
  }
  SECTION("f32 values are rounded on input") {
    Tensor x = tensor(f32({{"n", 1}}), {0.1});
    CHECK(evalOp(OpKind::StopGradient, {x}, x.type).data[0] == double(0.1f));
  }
}

TEST_CASE("transpose reorders dims by name", "[interp]") {
  checkData(evalOp(OpKind::Transpose, {x23()}, kBA), {1, 4, 2, 5, 3, 6});
  ir::TensorType abc = f32({{"a", 2}, {"b", 2}, {"c", 2}});
  ir::TensorType cab = f32({{"c", 2}, {"a", 2}, {"b", 2}});
  Tensor x = tensor(abc, {0, 1, 2, 3, 4, 5, 6, 7});
  checkData(evalOp(OpKind::Transpose, {x}, cab), {0, 2, 4, 6, 1, 3, 5, 7});
}

TEST_CASE("einsum contracts every dim absent from the result", "[interp]") {
  SECTION("matmul, with the right operand stored in either order") {
    Tensor a = tensor(f32({{"i", 2}, {"k", 3}}), {1, 2, 3, 4, 5, 6});
    Tensor b = tensor(f32({{"k", 3}, {"j", 2}}), {1, 2, 3, 4, 5, 6});
    Tensor bT = tensor(f32({{"j", 2}, {"k", 3}}), {1, 3, 5, 2, 4, 6});
    ir::TensorType ij = f32({{"i", 2}, {"j", 2}});
    checkData(evalOp(OpKind::Einsum, {a, b}, ij), {22, 28, 49, 64});
    checkData(evalOp(OpKind::Einsum, {a, bT}, ij), {22, 28, 49, 64});
    checkData(evalOp(OpKind::Einsum, {b, a}, f32({{"j", 2}, {"i", 2}})), {22, 49, 28, 64});
  }
  SECTION("batch matmul") {
    Tensor x = tensor(f32({{"b", 2}, {"i", 1}, {"k", 2}}), {1, 2, 5, 6});
    Tensor y = tensor(f32({{"b", 2}, {"k", 2}, {"j", 1}}), {3, 4, 7, 8});
    checkData(evalOp(OpKind::Einsum, {x, y}, f32({{"b", 2}, {"i", 1}, {"j", 1}})), {11, 83});
  }
  SECTION("outer product") {
    Tensor u = tensor(f32({{"i", 2}}), {1, 2});
    Tensor v = tensor(f32({{"j", 3}}), {1, 2, 3});
    checkData(evalOp(OpKind::Einsum, {u, v}, f32({{"i", 2}, {"j", 3}})), {1, 2, 3, 2, 4, 6});
  }
  SECTION("full contraction to a scalar") {
    Tensor u = tensor(f32({{"i", 2}, {"j", 2}}), {1, 2, 3, 4});
    checkData(evalOp(OpKind::Einsum, {u, u}, f32()), {30});
    checkData(evalOp(OpKind::Einsum, {u}, f32({{"j", 2}})), {4, 6}); // one operand: a sum
  }
  SECTION("three operands") {
    Tensor a = tensor(f32({{"i", 2}}), {1, 2});
    Tensor b = tensor(f32({{"i", 2}, {"j", 2}}), {1, 2, 3, 4});
    Tensor c = tensor(f32({{"j", 2}}), {1, 10});
    checkData(evalOp(OpKind::Einsum, {a, b, c}, f32()), {7 + 100});
    checkData(evalOp(OpKind::Einsum, {a, b, c}, f32({{"j", 2}})), {7, 100});
  }
  SECTION("large contractions split into outer and inner loops") {
    ir::TensorType pq = f32({{"p", 300}, {"q", 300}});
    Tensor ones = tensor(pq, std::vector<double>(90000, 1.0));
    checkData(evalOp(OpKind::Einsum, {ones, ones}, f32()), {90000});
  }
  SECTION("mismatched sizes are an error") {
    Graph graph;
    ir::ValueId a = graph.input("a", f32({{"k", 2}}));
    ir::ValueId b = graph.input("b", f32({{"k", 3}}));
    graph.output("out", graph.op(OpKind::Einsum, {a, b}, f32()));
    TensorMap inputs{{"a", tensor(f32({{"k", 2}}), {1, 2})},
                     {"b", tensor(f32({{"k", 3}}), {1, 2, 3})}};
    CHECK_THAT(runError(graph.fn, inputs), Catch::Contains("dim 'k' has size"));
  }
}

TEST_CASE("reductions", "[interp]") {
  Tensor x = x23();
  ir::TensorType a = f32({{"a", 2}}), b = f32({{"b", 3}});
  checkData(evalOp(OpKind::ReduceSum, {x}, a, {{"dims", DimList{"b"}}}), {6, 15});
  checkData(evalOp(OpKind::ReduceSum, {x}, b, {{"dims", DimList{"a"}}}), {5, 7, 9});
  checkData(evalOp(OpKind::ReduceSum, {x}, f32(), {{"dims", DimList{"a", "b"}}}), {21});
  checkData(evalOp(OpKind::ReduceMean, {x}, a, {{"dims", DimList{"b"}}}), {2, 5});
  checkData(evalOp(OpKind::ReduceMax, {x}, b, {{"dims", DimList{"a"}}}), {4, 5, 6});
  checkData(evalOp(OpKind::ReduceMin, {x}, a, {{"dims", DimList{"b"}}}), {1, 4});
  checkData(evalOp(OpKind::LogSumExp, {x}, a, {{"dims", DimList{"b"}}}),
            {3.40760596444438, 6.40760596444438}, 1e-5);
  // Stable for large values: logsumexp(1000, 1001) = 1001 + log(1 + e^-1).
  Tensor large = tensor(f32({{"n", 2}}), {1000, 1001});
  checkData(evalOp(OpKind::LogSumExp, {large}, f32(), {{"dims", DimList{"n"}}}), {1001.31326168751},
            1e-3);
  Tensor negInf = tensor(f32({{"n", 2}}), {-INFINITY, -INFINITY});
  CHECK(evalOp(OpKind::LogSumExp, {negInf}, f32(), {{"dims", DimList{"n"}}}).data[0] == -INFINITY);
  Tensor ints = tensor(i32({{"n", 3}}), {1, -5, 7});
  checkData(evalOp(OpKind::ReduceSum, {ints}, i32(), {{"dims", DimList{"n"}}}), {3});
}

TEST_CASE("softmax and log_softmax are stable", "[interp]") {
  Tensor large = tensor(f32({{"n", 3}}), {1000, 1001, 1002});
  checkData(evalOp(OpKind::Softmax, {large}, large.type, {{"dim", std::string("n")}}),
            {0.09003057, 0.24472847, 0.66524096});
  checkData(evalOp(OpKind::LogSoftmax, {large}, large.type, {{"dim", std::string("n")}}),
            {-2.40760596, -1.40760596, -0.40760596}, 1e-5);
  // Along `a` of x[a, b]: each column is softmax(v, v + 3); the result laid out [b, a].
  double low = 1 / (1 + std::exp(3.0)), high = 1 - low;
  checkData(evalOp(OpKind::Softmax, {x23()}, kBA, {{"dim", std::string("a")}}),
            {low, high, low, high, low, high});
  // -inf entries get probability 0.
  Tensor masked = tensor(f32({{"n", 3}}), {0, -INFINITY, 0});
  checkData(evalOp(OpKind::Softmax, {masked}, masked.type, {{"dim", std::string("n")}}),
            {0.5, 0, 0.5});
}

TEST_CASE("layer_norm normalizes over the listed dims", "[interp]") {
  double eps = 1e-5;
  double scale = 1 / std::sqrt(2.0 / 3 + eps);
  checkData(evalOp(OpKind::LayerNorm, {x23()}, kAB, {{"dims", DimList{"b"}}, {"eps", eps}}),
            {-scale, 0, scale, -scale, 0, scale}, 1e-5);
  // Over both dims: mean 3.5, variance 35/12.
  double all = 1 / std::sqrt(35.0 / 12 + eps);
  std::vector<double> expected;
  for (double v : {1, 4, 2, 5, 3, 6}) // laid out [b, a]
    expected.push_back((v - 3.5) * all);
  checkData(evalOp(OpKind::LayerNorm, {x23()}, kBA, {{"dims", DimList{"a", "b"}}, {"eps", eps}}),
            expected, 1e-5);
  // A large offset does not destroy precision (two-pass variance).
  Tensor shifted = tensor(f32({{"n", 2}}), {10000, 10002});
  checkData(
      evalOp(OpKind::LayerNorm, {shifted}, shifted.type, {{"dims", DimList{"n"}}, {"eps", 0.0}}),
      {-1, 1});
}

TEST_CASE("cumsum along a dim, inclusive and exclusive", "[interp]") {
  Attrs alongB{{"dim", std::string("b")}, {"exclusive", int64_t(0)}};
  checkData(evalOp(OpKind::Cumsum, {x23()}, kAB, alongB), {1, 3, 6, 4, 9, 15});
  Attrs exclusiveB{{"dim", std::string("b")}, {"exclusive", int64_t(1)}};
  checkData(evalOp(OpKind::Cumsum, {x23()}, kAB, exclusiveB), {0, 1, 3, 0, 4, 9});
  Attrs alongA{{"dim", std::string("a")}, {"exclusive", int64_t(0)}};
  checkData(evalOp(OpKind::Cumsum, {x23()}, kAB, alongA), {1, 2, 3, 5, 7, 9});
  checkData(evalOp(OpKind::Cumsum, {x23()}, kBA, alongB), {1, 4, 3, 9, 6, 15});
}

TEST_CASE("rename and reshape", "[interp]") {
  Attrs aToC{{"from", DimList{"a"}}, {"to", DimList{"c"}}};
  checkData(evalOp(OpKind::Rename, {x23()}, f32({{"c", 2}, {"b", 3}}), aToC), {1, 2, 3, 4, 5, 6});
  checkData(evalOp(OpKind::Rename, {x23()}, f32({{"b", 3}, {"c", 2}}), aToC), {1, 4, 2, 5, 3, 6});
  // Swapping two names.
  Attrs swap{{"from", DimList{"a", "b"}}, {"to", DimList{"b", "a"}}};
  Tensor square = tensor(f32({{"a", 2}, {"b", 2}}), {1, 2, 3, 4});
  checkData(evalOp(OpKind::Rename, {square}, square.type, swap), {1, 3, 2, 4});

  SECTION("merge, in listed order") {
    ir::TensorType n = f32({{"n", 6}});
    checkData(
        evalOp(OpKind::Reshape, {x23()}, n, {{"from", DimList{"a", "b"}}, {"to", DimList{"n"}}}),
        {1, 2, 3, 4, 5, 6});
    checkData(
        evalOp(OpKind::Reshape, {x23()}, n, {{"from", DimList{"b", "a"}}, {"to", DimList{"n"}}}),
        {1, 4, 2, 5, 3, 6});
  }
  SECTION("split, with the result laid out either way") {
    Tensor y = tensor(f32({{"n", 6}}), {1, 2, 3, 4, 5, 6});
    Attrs split{{"from", DimList{"n"}}, {"to", DimList{"p", "q"}}};
    checkData(evalOp(OpKind::Reshape, {y}, f32({{"p", 2}, {"q", 3}}), split), {1, 2, 3, 4, 5, 6});
    checkData(evalOp(OpKind::Reshape, {y}, f32({{"q", 3}, {"p", 2}}), split), {1, 4, 2, 5, 3, 6});
  }
  SECTION("untouched dims keep their place by name") {
    Tensor z = tensor(f32({{"c", 2}, {"n", 4}}), {0, 1, 2, 3, 10, 11, 12, 13});
    Attrs split{{"from", DimList{"n"}}, {"to", DimList{"p", "q"}}};
    checkData(evalOp(OpKind::Reshape, {z}, f32({{"c", 2}, {"p", 2}, {"q", 2}}), split),
              {0, 1, 2, 3, 10, 11, 12, 13});
    checkData(evalOp(OpKind::Reshape, {z}, f32({{"p", 2}, {"q", 2}, {"c", 2}}), split),
              {0, 10, 1, 11, 2, 12, 3, 13});
  }
}

TEST_CASE("slice, concat, pad and shift", "[interp]") {
  Attrs slice{{"from", std::string("b")}, {"to", std::string("e")}, {"start", int64_t(1)}};
  checkData(evalOp(OpKind::Slice, {x23()}, f32({{"a", 2}, {"e", 2}}), slice), {2, 3, 5, 6});
  checkData(evalOp(OpKind::Slice, {x23()}, f32({{"e", 2}, {"a", 2}}), slice), {2, 5, 3, 6});

  Tensor y = tensor(f32({{"c", 1}, {"a", 2}}), {10, 20});
  Attrs concat{{"from", DimList{"b", "c"}}, {"to", std::string("e")}};
  checkData(evalOp(OpKind::Concat, {x23(), y}, f32({{"a", 2}, {"e", 4}}), concat),
            {1, 2, 3, 10, 4, 5, 6, 20});
  Attrs reversed{{"from", DimList{"c", "b"}}, {"to", std::string("e")}};
  checkData(evalOp(OpKind::Concat, {y, x23()}, f32({{"e", 4}, {"a", 2}}), reversed),
            {10, 20, 1, 4, 2, 5, 3, 6});

  Attrs pad{{"from", std::string("b")}, {"to", std::string("e")}, {"before", int64_t(1)}};
  checkData(evalOp(OpKind::Pad, {x23()}, f32({{"a", 2}, {"e", 5}}), pad),
            {0, 1, 2, 3, 0, 0, 4, 5, 6, 0});

  auto shift = [](int64_t offset) { return Attrs{{"dim", std::string("b")}, {"offset", offset}}; };
  checkData(evalOp(OpKind::Shift, {x23()}, kAB, shift(1)), {0, 1, 2, 0, 4, 5});
  checkData(evalOp(OpKind::Shift, {x23()}, kAB, shift(-1)), {2, 3, 0, 5, 6, 0});
  checkData(evalOp(OpKind::Shift, {x23()}, kAB, shift(5)), {0, 0, 0, 0, 0, 0});
  checkData(evalOp(OpKind::Shift, {x23()}, kBA, shift(2)), {0, 0, 0, 0, 1, 4});

  SECTION("a slice window outside the dim is an error") {
    Graph graph;
    ir::ValueId x = graph.input("x", kAB);
    Attrs bad{{"from", std::string("b")}, {"to", std::string("e")}, {"start", int64_t(2)}};
    graph.output("out", graph.op(OpKind::Slice, {x}, f32({{"a", 2}, {"e", 2}}), bad));
    CHECK_THAT(runError(graph.fn, {{"x", x23()}}), Catch::Contains("outside dim 'b'"));
  }
}

TEST_CASE("one_hot and gather, out-of-range ids give zeros", "[interp]") {
  Tensor ids = tensor(i32({{"n", 4}}), {0, 2, 5, -1});
  Attrs alongV{{"dim", std::string("v")}};
  checkData(evalOp(OpKind::OneHot, {ids}, f32({{"n", 4}, {"v", 3}}), alongV),
            {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0});
  checkData(evalOp(OpKind::OneHot, {ids}, f32({{"v", 3}, {"n", 4}}), alongV),
            {1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0});

  Tensor table = tensor(f32({{"v", 3}, {"d", 2}}), {1, 2, 3, 4, 5, 6});
  Tensor rows = tensor(i32({{"n", 4}}), {2, 0, 7, -1});
  checkData(evalOp(OpKind::Gather, {table, rows}, f32({{"n", 4}, {"d", 2}}), alongV),
            {5, 6, 1, 2, 0, 0, 0, 0});
  checkData(evalOp(OpKind::Gather, {table, rows}, f32({{"d", 2}, {"n", 4}}), alongV),
            {5, 1, 0, 0, 6, 2, 0, 0});
  // Table stored [d, v]: still by name.
  Tensor tableT = tensor(f32({{"d", 2}, {"v", 3}}), {1, 3, 5, 2, 4, 6});
  checkData(evalOp(OpKind::Gather, {tableT, rows}, f32({{"n", 4}, {"d", 2}}), alongV),
            {5, 6, 1, 2, 0, 0, 0, 0});
  // A dim shared by table and ids is a batch dim: each batch picks from its own table.
  Tensor batched = tensor(f32({{"b", 2}, {"v", 3}}), {1, 2, 3, 10, 20, 30});
  Tensor picks = tensor(i32({{"b", 2}, {"n", 1}}), {2, 0});
  checkData(evalOp(OpKind::Gather, {batched, picks}, f32({{"b", 2}, {"n", 1}}), alongV), {3, 10});
}

TEST_CASE("literal, iota and random sources", "[interp]") {
  Graph graph;
  graph.output("lit", graph.op(OpKind::Literal, {}, f32(), {{"value", 2.5}}));
  graph.output("iota", graph.op(OpKind::Iota, {}, i32({{"n", 4}}), {{"dim", std::string("n")}}));
  graph.output("iota2",
               graph.op(OpKind::Iota, {}, i32({{"a", 2}, {"n", 3}}), {{"dim", std::string("n")}}));
  ir::TensorType big = f32({{"r", 100}, {"c", 1000}});
  graph.output("normal", graph.op(OpKind::RandomNormal, {}, big,
                                  {{"mean", 1.0}, {"stddev", 2.0}, {"stream", std::string("s")}}));
  graph.output("uniform", graph.op(OpKind::RandomUniform, {}, big,
                                   {{"min", -1.0}, {"max", 3.0}, {"stream", std::string("u")}}));
  Options opts;
  opts.seed = 11;
  TensorMap out = runOk(graph.fn, {}, opts);
  checkData(out.at("lit"), {2.5});
  checkData(out.at("iota"), {0, 1, 2, 3});
  checkData(out.at("iota2"), {0, 1, 2, 0, 1, 2});
  const std::vector<double>& normal = out.at("normal").data;
  const std::vector<double>& uniform = out.at("uniform").data;
  uint64_t normalKey = meshrt::streamKey(11, "s"), uniformKey = meshrt::streamKey(11, "u");
  for (uint64_t i : {0, 1, 777, 99999}) {
    CHECK(normal[i] == double(float(1.0 + 2.0 * meshrt::normal(normalKey, i))));
    CHECK(uniform[i] == double(float(-1.0 + 4.0 * meshrt::uniform01(uniformKey, i))));
  }
  double sum = 0, sumSquares = 0, minimum = 10, maximum = -10;
  for (double v : normal) {
    sum += v;
    sumSquares += v * v;
  }
  for (double v : uniform) {
    minimum = std::min(minimum, v);
    maximum = std::max(maximum, v);
  }
  double mean = sum / normal.size();
  CHECK(mean == Approx(1.0).margin(0.03));
  CHECK(sumSquares / normal.size() - mean * mean == Approx(4.0).margin(0.1));
  CHECK(minimum >= -1.0);
  CHECK(maximum <= 3.0);
  CHECK(minimum < -0.99);
  CHECK(maximum > 2.99);
}

TEST_CASE("random_int: uniform in [0, max) keyed by global index, by step in train blocks",
          "[interp]") {
  ir::TensorType ints = i32({{"r", 50}, {"c", 40}});
  Attrs attrs = {{"max", int64_t(7)}, {"stream", std::string("k")}};
  Options opts;
  opts.seed = 11;
  Tensor out = evalOp(OpKind::RandomInt, {}, ints, attrs, opts);
  uint64_t key = meshrt::streamKey(11, "k");
  std::vector<int> histogram(7, 0);
  for (size_t i = 0; i < out.data.size(); ++i) {
    CHECK(out.data[i] == double(meshrt::uniformIndex(key, i, 7)));
    REQUIRE(out.data[i] >= 0);
    REQUIRE(out.data[i] < 7);
    ++histogram[size_t(out.data[i])];
  }
  for (int count : histogram) // 2000 draws: about 286 each
    CHECK(std::abs(count - 286) < 80);
  // In a train block the stream is keyed by step too.
  Graph graph;
  graph.fn.kind = ir::Function::Kind::Train;
  graph.output("n", graph.op(OpKind::RandomInt, {}, ints, attrs));
  opts.step = 3;
  Tensor trained = runOk(graph.fn, {}, opts).at("n");
  uint64_t stepKey = meshrt::streamKey(11, "k#3");
  for (uint64_t i : {0, 5, 1999})
    CHECK(trained.data[i] == double(meshrt::uniformIndex(stepKey, i, 7)));
  Graph bad;
  bad.output("n", bad.op(OpKind::RandomInt, {}, ints,
                         {{"max", int64_t(0)}, {"stream", std::string("k")}}));
  CHECK(runError(bad.fn, {}).find("max 0 is outside [1, 2^24]") != std::string::npos);
}

TEST_CASE("dropout is the identity unless training", "[interp]") {
  ir::TensorType big = f32({{"r", 100}, {"c", 100}});
  Graph graph;
  ir::ValueId x = graph.input("x", big);
  graph.output("out", graph.op(OpKind::Dropout, {x}, big,
                               {{"rate", 0.25}, {"stream", std::string("block/dropout")}}));
  Tensor ones = tensor(big, std::vector<double>(10000, 1.0));
  TensorMap inputs{{"x", ones}};
  Options opts;
  opts.seed = 5;
  checkData(runOk(graph.fn, inputs, opts).at("out"), ones.data, 0.0);

  opts.training = true;
  opts.step = 3;
  Tensor first = runOk(graph.fn, inputs, opts).at("out");
  int kept = 0;
  for (double v : first.data) {
    REQUIRE((v == 0.0 || v == Approx(1 / 0.75)));
    kept += v != 0.0;
  }
  CHECK(kept == Approx(7500).margin(200));
  // The mask is a pure function of (seed, stream, step, element).
  uint64_t key = meshrt::streamKey(5, "block/dropout#3");
  for (uint64_t i = 0; i < 100; ++i)
    CHECK((first.data[i] != 0) == (meshrt::uniform01(key, i) >= 0.25));
  CHECK(runOk(graph.fn, inputs, opts).at("out").data == first.data);
  opts.step = 4;
  CHECK(runOk(graph.fn, inputs, opts).at("out").data != first.data);
}

TEST_CASE("params: initializers, overrides and the layout-invariant keying", "[interp]") {
  uint64_t seed = 9;
  auto make = [](std::string kind, std::vector<std::pair<std::string, double>> args,
                 ir::TensorType paramType) {
    ir::ParamInfo param;
    param.path = "block[0]/w";
    param.type = std::move(paramType);
    param.init = ir::Initializer{std::move(kind), std::move(args)};
    return param;
  };
  ir::TensorType small = f32({{"a", 2}, {"b", 3}});
  checkData(initializeParam(make("zeros", {}, small), seed), std::vector<double>(6, 0.0), 0);
  checkData(initializeParam(make("ones", {}, small), seed), std::vector<double>(6, 1.0), 0);
  checkData(initializeParam(make("constant", {{"value", 0.5}}, small), seed),
            std::vector<double>(6, 0.5), 0);

  ir::TensorType big = f32({{"r", 200}, {"c", 500}});
  uint64_t key = meshrt::streamKey(seed, "param/block[0]/w");
  Tensor normal = initializeParam(make("normal", {{"mean", 1}, {"stddev", 0.5}}, big), seed);
  for (uint64_t i : {0, 5, 99999})
    CHECK(normal.data[i] == double(float(1 + 0.5 * meshrt::normal(key, i))));
  double sum = 0, sumSquares = 0;
  for (double v : normal.data) {
    sum += v;
    sumSquares += v * v;
  }
  double mean = sum / 100000;
  CHECK(mean == Approx(1).margin(0.01));
  CHECK(sumSquares / 100000 - mean * mean == Approx(0.25).margin(0.01));

  Tensor truncated = initializeParam(make("truncated_normal", {{"stddev", 0.1}}, big), seed);
  double largest = 0;
  for (double v : truncated.data)
    largest = std::max(largest, std::fabs(v));
  CHECK(largest <= 0.2 + 1e-6);
  CHECK(largest > 0.19);

  Tensor uniform = initializeParam(make("uniform", {{"min", 2}, {"max", 4}}, big), seed);
  for (double v : uniform.data)
    REQUIRE((v >= 2 && v <= 4));
  CHECK(uniform.data[7] == double(float(2 + 2 * meshrt::uniform01(key, 7))));

  // Another seed or path gives other values; the same ones give the same.
  CHECK(initializeParam(make("normal", {}, small), seed).data ==
        initializeParam(make("normal", {}, small), seed).data);
  CHECK(initializeParam(make("normal", {}, small), seed).data !=
        initializeParam(make("normal", {}, small), seed + 1).data);
}

TEST_CASE("orthogonal initializer: orthogonal rows within a block, chi norms", "[interp]") {
  // 6 rows of 4 columns: blocks of rows {0..3} and {4, 5}.
  ir::ParamInfo param;
  param.path = "features";
  param.type = f32({{"m", 6}, {"d", 2}, {"e", 2}});
  param.init = ir::Initializer{"orthogonal", {{"scale", 2}}};
  Tensor w = initializeParam(param, 1);
  auto row = [&](int r) {
    return std::vector<double>(w.data.begin() + r * 4, w.data.begin() + r * 4 + 4);
  };
  auto dot = [](const std::vector<double>& u, const std::vector<double>& v) {
    double s = 0;
    for (size_t i = 0; i < u.size(); ++i)
      s += u[i] * v[i];
    return s;
  };
  uint64_t key = meshrt::streamKey(1, "param/features");
  for (int r = 0; r < 6; ++r) {
    double chi = 0;
    for (int c = 0; c < 4; ++c) {
      double z = meshrt::normal(key, uint64_t(r * 4 + c), 1);
      chi += z * z;
    }
    CHECK(std::sqrt(dot(row(r), row(r))) == Approx(2 * std::sqrt(chi)).epsilon(1e-5));
  }
  for (auto [first, second] : {std::pair{0, 1}, {0, 3}, {1, 2}, {2, 3}, {4, 5}}) {
    INFO(first << " . " << second);
    double cosine = dot(row(first), row(second)) /
                    std::sqrt(dot(row(first), row(first)) * dot(row(second), row(second)));
    CHECK(cosine == Approx(0).margin(1e-6));
  }
  // Rows of different blocks are independent, not orthogonal.
  double across = dot(row(0), row(4)) / std::sqrt(dot(row(0), row(0)) * dot(row(4), row(4)));
  CHECK(std::fabs(across) > 1e-6);
}

TEST_CASE("input synthesis is deterministic and keyed by global element index", "[interp]") {
  ir::InputInfo input;
  input.name = "tokens_embedded";
  input.type = f32({{"batch", 4}, {"seq", 8}});
  Tensor first = synthesizeInput(input, 3);
  CHECK(first.type == input.type);
  CHECK(first.data == synthesizeInput(input, 3).data);
  CHECK(first.data != synthesizeInput(input, 4).data);
  uint64_t key = meshrt::streamKey(3, "input/tokens_embedded");
  for (uint64_t i = 0; i < 32; ++i)
    CHECK(first.data[i] == double(float(meshrt::normal(key, i))));
  // A bigger batch extends the tensor without changing the elements already there.
  input.type.dims[0].size = 8;
  Tensor bigger = synthesizeInput(input, 3);
  CHECK(std::equal(first.data.begin(), first.data.end(), bigger.data.begin()));

  ir::InputInfo half = input;
  half.type.dtype = DType::BF16;
  Tensor bf16 = synthesizeInput(half, 3);
  CHECK(bf16.data[0] != first.data[0]);
  CHECK(bf16.data[0] == Approx(first.data[0]).epsilon(1.0 / 128));

  ir::InputInfo ids;
  ids.name = "ids";
  ids.type = i32({{"n", 1000}});
  ids.indexBound = 7;
  Tensor idValues = synthesizeInput(ids, 3);
  std::vector<int> counts(7, 0);
  for (double v : idValues.data) {
    REQUIRE((v >= 0 && v < 7 && v == std::trunc(v)));
    ++counts[int(v)];
  }
  for (int count : counts)
    CHECK(count > 80);
  ids.indexBound = 0;
  for (double v : synthesizeInput(ids, 3).data)
    REQUIRE((v == 0 || v == 1));
}

TEST_CASE("a small network end to end, with given params", "[interp]") {
  // logits[b, v] = x[b, d] . w[d, v] + bias[v]; loss = mean(logsumexp(logits, v))
  Graph graph;
  ir::TensorType bd = f32({{"b", 2}, {"d", 2}}), dv = f32({{"d", 2}, {"v", 3}});
  ir::ValueId x = graph.input("x", bd);
  ir::ValueId w = graph.param("w", dv, {"normal", {{"stddev", 0.02}}});
  ir::ValueId bias = graph.param("bias", f32({{"v", 3}}), {"zeros", {}});
  ir::ValueId logits = graph.op(OpKind::Einsum, {x, w}, f32({{"b", 2}, {"v", 3}}));
  ir::ValueId shifted = graph.op(OpKind::Add, {logits, bias}, f32({{"b", 2}, {"v", 3}}));
  ir::ValueId lse =
      graph.op(OpKind::LogSumExp, {shifted}, f32({{"b", 2}}), {{"dims", DimList{"v"}}});
  graph.output("loss", graph.op(OpKind::ReduceMean, {lse}, f32(), {{"dims", DimList{"b"}}}));
  graph.output("w", w);

  TensorMap inputs{{"x", tensor(bd, {1, 0, 0, 1})}};
  TensorMap params{{"w", tensor(dv, {0, 0, 0, 0, 0, 0})}};
  checkData(runOk(graph.fn, inputs, {}, params).at("loss"), {std::log(3.0)});
  // Without overrides, w comes from the initializer keyed by its path.
  Options opts;
  opts.seed = 2;
  TensorMap out = runOk(graph.fn, inputs, opts);
  ir::ParamInfo info = graph.fn.params[0];
  CHECK(out.at("w").data == initializeParam(info, 2).data);
}

TEST_CASE("bad inputs are errors, not crashes", "[interp]") {
  Graph graph;
  ir::ValueId x = graph.input("x", kAB);
  graph.output("out", graph.op(OpKind::Neg, {x}, kAB));
  CHECK_THAT(runError(graph.fn, {}), Catch::Contains("missing input 'x'"));
  CHECK_THAT(runError(graph.fn, {{"x", tensor(kBA, {1, 2, 3, 4, 5, 6})}}),
             Catch::Contains("input 'x' has type f32[b=3, a=2]"));
  CHECK_THAT(runError(graph.fn, {{"x", tensor(kAB, {1, 2})}}), Catch::Contains("holds 2 values"));
  Options tiny;
  tiny.maxElements = 4;
  CHECK_THAT(runError(graph.fn, {{"x", x23()}}, tiny), Catch::Contains("more than 4 elements"));

  Graph unknownInit;
  unknownInit.output("p", unknownInit.param("p", kAB, {"glorot", {}}));
  CHECK_THAT(runError(unknownInit.fn, {}), Catch::Contains("unknown initializer 'glorot'"));

  Graph wrongParam;
  wrongParam.output("p", wrongParam.param("p", kAB, {"zeros", {}}));
  CHECK_THAT(runError(wrongParam.fn, {}, {}, {{"p", tensor(kBA, std::vector<double>(6))}}),
             Catch::Contains("param 'p' is given as"));

  Graph missingAttr;
  ir::ValueId y = missingAttr.input("y", kAB);
  missingAttr.output("out", missingAttr.op(OpKind::Softmax, {y}, kAB));
  CHECK_THAT(runError(missingAttr.fn, {{"y", x23()}}), Catch::Contains("attribute 'dim'"));

  Graph mismatched;
  ir::ValueId small = mismatched.input("s", f32({{"n", 3}}));
  ir::ValueId large = mismatched.input("l", f32({{"n", 4}}));
  mismatched.output("out", mismatched.op(OpKind::Add, {small, large}, f32({{"n", 4}})));
  CHECK_THAT(runError(mismatched.fn, {{"s", tensor(f32({{"n", 3}}), {1, 2, 3})},
                                      {"l", tensor(f32({{"n", 4}}), {1, 2, 3, 4})}}),
             Catch::Contains("dim 'n' has size 3 in operand 0 but 4 in the result"));

  Graph twice;
  ir::ValueId z = twice.input("z", f32({{"n", 2}}));
  twice.output("out", twice.op(OpKind::Neg, {z}, f32({{"n", 2}, {"n", 2}})));
  CHECK_THAT(runError(twice.fn, {{"z", tensor(f32({{"n", 2}}), {1, 2})}}),
             Catch::Contains("dim 'n' appears twice"));

  Graph badRename;
  ir::ValueId r = badRename.input("r", kAB);
  badRename.output("out", badRename.op(OpKind::Rename, {r}, f32({{"c", 5}, {"b", 3}}),
                                       {{"from", DimList{"a"}}, {"to", DimList{"c"}}}));
  CHECK_THAT(runError(badRename.fn, {{"r", x23()}}),
             Catch::Contains("renames dim 'a' of size 2 to 'c' of size 5"));

  Graph badOperand;
  badOperand.output("out", badOperand.op(OpKind::Neg, {42}, kAB));
  CHECK_THAT(runError(badOperand.fn, {}), Catch::Contains("not defined"));
}

TEST_CASE("broadcast repeats x along the result's new dims, by name", "[interp]") {
  Tensor b = tensor(f32({{"b", 3}}), {1, 2, 3});
  checkData(evalOp(OpKind::Broadcast, {b}, kAB), {1, 2, 3, 1, 2, 3});
  checkData(evalOp(OpKind::Broadcast, {b}, kBA), {1, 1, 2, 2, 3, 3});
}

TEST_CASE("step is the train step", "[interp]") {
  Options opts;
  opts.step = 7;
  checkData(evalOp(OpKind::TrainStep, {}, f32(), {}, opts), {7});
}

namespace {
double weightedSum(const double* args) {
  return args[0] + 10 * args[1] + 100 * args[2];
}
} // namespace

TEST_CASE("call: the user's function over operands broadcast by dim name", "[interp]") {
  UserFunctions functions;
  functions.byName["weighted"] = &weightedSum;
  Options opts;
  opts.userFunctions = &functions;
  Attrs attrs = {{"function", std::string("weighted")}, {"header", std::string("k.h")}};
  Tensor x = tensor(kAB, {1, 2, 3, 4, 5, 6});             // [a=2, b=3]
  Tensor w = tensor(f32({{"b", 3}}), {0.5, 0.25, 0.125}); // [b]
  Tensor s = tensor(f32(), {2});                          // scalar
  checkData(evalOp(OpKind::Call, {x, w, s}, kAB, attrs, opts),
            {206, 204.5, 204.25, 209, 207.5, 207.25});
  // The result's dim order decides the iteration order, operands follow by name.
  checkData(evalOp(OpKind::Call, {x, w, s}, kBA, attrs, opts),
            {206, 209, 204.5, 207.5, 204.25, 207.25});
}

TEST_CASE("call: an unknown user function is an error, not a crash", "[interp]") {
  Graph graph;
  ir::ValueId x = graph.input("x", kAB);
  graph.output("out",
               graph.op(OpKind::Call, {x}, kAB,
                        {{"function", std::string("nope")}, {"header", std::string("k.h")}}));
  TensorMap inputs{{"x", tensor(kAB, {1, 2, 3, 4, 5, 6})}};
  CHECK(runError(graph.fn, inputs).find("user function 'nope' is not loaded") != std::string::npos);
}

TEST_CASE("random ops in train blocks key their stream by step; programs by stream alone",
          "[interp]") {
  ir::TensorType big = f32({{"r", 64}});
  Graph graph;
  graph.output("out", graph.op(OpKind::RandomNormal, {}, big,
                               {{"mean", 0.0}, {"stddev", 1.0}, {"stream", std::string("noise")}}));
  Options opts;
  opts.seed = 3;
  opts.step = 2;
  Tensor program = runOk(graph.fn, {}, opts).at("out");
  uint64_t plain = meshrt::streamKey(3, "noise");
  CHECK(program.data[5] == double(float(meshrt::normal(plain, 5))));
  graph.fn.kind = ir::Function::Kind::Train;
  Tensor trained = runOk(graph.fn, {}, opts).at("out");
  uint64_t stepped = meshrt::streamKey(3, "noise#2");
  for (uint64_t i = 0; i < 64; ++i)
    CHECK(trained.data[i] == double(float(meshrt::normal(stepped, i))));
}

TEST_CASE("roundToDtype = false keeps float results in double", "[interp]") {
  Tensor x = tensor(f32(), {0.1});
  Options exact;
  exact.roundToDtype = false;
  CHECK(evalOp(OpKind::Exp, {x}, f32(), {}, exact).data[0] == std::exp(0.1));
  CHECK(evalOp(OpKind::Exp, {x}, f32()).data[0] == double(float(std::exp(0.1))));
}

TEST_CASE("trainStep runs the step, then applies every update together", "[interp]") {
  // loss = sum(w * x); w' = w - 0.5 * x (reads the old w), m' = m + w (the old w too).
  ir::TensorType vec = f32({{"d", 2}});
  Graph graph;
  graph.fn.kind = ir::Function::Kind::Train;
  ir::ValueId x = graph.input("x", vec);
  ir::ValueId w = graph.param("w", vec, {"constant", {{"value", 1.0}}});
  ir::ValueId m = graph.param("w@m", vec, {"zeros", {}});
  graph.fn.params.back().role = ir::ParamRole::OptimizerState;
  graph.fn.params.back().trainable = false;
  ir::ValueId prod = graph.op(OpKind::Mul, {w, x}, vec);
  ir::ValueId loss = graph.op(OpKind::ReduceSum, {prod}, f32(), {{"dims", DimList{"d"}}});
  ir::ValueId half = graph.op(OpKind::Literal, {}, f32(), {{"value", 0.5}});
  ir::ValueId scaled = graph.op(OpKind::Mul, {x, half}, vec);
  ir::ValueId newW = graph.op(OpKind::Sub, {w, scaled}, vec);
  ir::ValueId newM = graph.op(OpKind::Add, {m, w}, vec);
  graph.output("loss", loss);
  graph.fn.updates = {{0, newW}, {1, newM}};
  TensorMap inputs{{"x", tensor(vec, {2, 4})}}, state;
  Options opts;
  auto first = trainStep(graph.fn, inputs, opts, state);
  REQUIRE(static_cast<bool>(first));
  CHECK(*first == 6); // 1*2 + 1*4
  checkData(state.at("w"), {0, -1});
  checkData(state.at("w@m"), {1, 1});
  auto second = trainStep(graph.fn, inputs, opts, state);
  REQUIRE(static_cast<bool>(second));
  CHECK(*second == -4); // 0*2 - 1*4
  checkData(state.at("w"), {-1, -3});
  checkData(state.at("w@m"), {1, 0});
}
