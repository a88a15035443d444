// Reverse-mode autodiff against central finite differences, in pure double (the interpreter with
// roundToDtype off): every differentiable op in a small train block built from .mesh source
// (loss = sum(op(...) * k) with k a fixed random input), and the loss of every example's train
// block at a few random elements of a few params. Plus what autodiff must refuse or skip.
#include "train/Autodiff.h"
#include "CompiledSource.h"
#include "train/Optimizer.h"

#include "interp/Interpreter.h"
#include "ir/IRParser.h"
#include "sema/Sema.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <random>

using namespace meshc;

namespace {

struct Compiled : testing::CompiledSource {
  using CompiledSource::CompiledSource;
  ir::Function trainFunction() {
    INFO(errors);
    REQUIRE(module);
    for (const ir::Function& fn : module->functions)
      if (fn.kind == ir::Function::Kind::Train) return fn;
    FAIL("no train block");
    return {};
  }
};

interp::Options exactOptions() {
  interp::Options opts;
  opts.seed = 11;
  opts.training = true;
  opts.roundToDtype = false;
  return opts;
}

double lossOf(const ir::Function& forward, const interp::TensorMap& inputs,
              const interp::TensorMap& params) {
  auto outputs = interp::run(forward, inputs, exactOptions(), params);
  if (!outputs) FAIL(llvm::toString(outputs.takeError()));
  return outputs->at("loss").data.at(0);
}

/// Differentiates `forward`'s loss and checks `samples` elements of every param with a gradient
/// (all elements when samples <= 0) against central differences with step `h`.
void checkAgainstFiniteDifferences(const ir::Function& forward, int samples = 0, double h = 1e-6,
                                   double tolerance = 1e-6) {
  ir::Function fn = forward;
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream errorStream(errors);
  DiagEngine diag(sources, errorStream);
  std::optional<train::Gradients> grads = train::differentiate(fn, diag);
  errorStream.flush();
  INFO(errors);
  REQUIRE(grads);
  REQUIRE_FALSE(grads->empty());
  for (const auto& [param, value] : *grads) {
    CHECK(fn.typeOf(value) == fn.params[param].type);
    fn.outputs.push_back(ir::OutputInfo{"grad " + fn.params[param].path, value, {}});
  }
  interp::TensorMap inputs, params;
  for (const ir::InputInfo& input : fn.inputs)
    inputs[input.name] = interp::synthesizeInput(input, 5);
  for (const ir::ParamInfo& param : fn.params)
    params[param.path] = interp::initializeParam(param, exactOptions().seed);
  auto outputs = interp::run(fn, inputs, exactOptions(), params);
  if (!outputs) FAIL(llvm::toString(outputs.takeError()));
  std::mt19937 pick(3);
  for (const auto& [param, value] : *grads) {
    const std::string& path = fn.params[param].path;
    const interp::Tensor& grad = outputs->at("grad " + path);
    size_t count = grad.data.size();
    std::vector<size_t> elements;
    if (samples <= 0 || size_t(samples) >= count)
      for (size_t i = 0; i < count; ++i)
        elements.push_back(i);
    else
      for (int i = 0; i < samples; ++i)
        elements.push_back(std::uniform_int_distribution<size_t>(0, count - 1)(pick));
    for (size_t i : elements) {
      interp::TensorMap shifted = params;
      double original = shifted[path].data[i];
      shifted[path].data[i] = original + h;
      double up = lossOf(forward, inputs, shifted);
      shifted[path].data[i] = original - h;
      double down = lossOf(forward, inputs, shifted);
      double numeric = (up - down) / (2 * h);
      INFO("param " << path << " element " << i << ": autodiff " << grad.data[i]
                    << ", finite differences " << numeric);
      CHECK(std::fabs(grad.data[i] - numeric) <=
            tolerance * std::max({1.0, std::fabs(numeric), std::fabs(grad.data[i])}));
    }
  }
}

const char* kDims = R"(
dim a = 3
dim b = 4
dim c = 5
dim a2 = 3
dim e = 2
dim l = 6
dim l2 = 8
dim ab = 12
dim v = 5
)";

struct OpCase {
  const char* name;
  const char* params; // declarations inside the train block
  const char* expr;   // the value y
  const char* type;   // y's type, for the fixed weights k
};

const char* kW = "param w: f32[a, b] = normal(stddev = 1)";
const char* kWV = "param w: f32[a, b] = normal(stddev = 1)\n  param q: f32[b] = normal(stddev = 1)";
const char* kWU =
    "param w: f32[a, b] = normal(stddev = 1)\n  param u: f32[b, c] = normal(stddev = 1)";

const OpCase kOpCases[] = {
    {"neg", kW, "-w", "f32[a, b]"},
    {"abs", kW, "abs(w)", "f32[a, b]"},
    {"exp", kW, "exp(w)", "f32[a, b]"},
    {"log", kW, "log(square(w) + 0.5)", "f32[a, b]"},
    {"sqrt", kW, "sqrt(square(w) + 0.5)", "f32[a, b]"},
    {"rsqrt", kW, "rsqrt(square(w) + 0.5)", "f32[a, b]"},
    {"square", kW, "square(w)", "f32[a, b]"},
    {"tanh", kW, "tanh(w)", "f32[a, b]"},
    {"sigmoid", kW, "sigmoid(w)", "f32[a, b]"},
    {"relu", kW, "relu(w)", "f32[a, b]"},
    {"gelu", kW, "gelu(w)", "f32[a, b]"},
    {"sin", kW, "sin(w)", "f32[a, b]"},
    {"cos", kW, "cos(w)", "f32[a, b]"},
    {"floor, ceil and round (zero gradient)", kW,
     "w * floor(w * 3.0) + w * ceil(w) + round(w * 2.0) * w", "f32[a, b]"},
    {"clip (literal and tensor bounds)", kWV, "clip(w, -0.5, 0.5) + clip(w, q, 1.0)", "f32[a, b]"},
    {"top_k_values (the gradient scatters into the picks)", kW, "top_k_values(w, b -> e)",
     "f32[a, e]"},
    {"top_k_values along the major dim", kW, "top_k_values(w * 2.0, a -> e)", "f32[e, b]"},
    {"scatter_add (the gradient gathers)", "param p: f32[a, c, b] = normal(stddev = 1)",
     "scatter_add(p, ids, v)", "f32[v, b]"},
    {"argmax and argmin (no gradient through the index)", kW,
     "w * cast(argmax(w, b) + argmin(w, a), f32)", "f32[a, b]"},
    {"add (broadcast)", kWV, "w + q", "f32[a, b]"},
    {"sub (broadcast)", kWV, "q - w", "f32[b, a]"},
    {"mul (broadcast)", kWV, "w * q", "f32[a, b]"},
    {"div (broadcast)", kWV, "w / (square(q) + 0.5) + q / (square(w) + 0.5)", "f32[a, b]"},
    {"pow", kWV, "pow(square(w) + 0.5, q) + w ** 3.0", "f32[a, b]"},
    {"maximum", kWV, "maximum(w, q)", "f32[a, b]"},
    {"minimum", kWV, "minimum(q, w)", "f32[b, a]"},
    {"where", kWV, "where(w > 0.0, w * q, square(w))", "f32[a, b]"},
    {"cast", kW, "cast(cast(w, bf16) * 2.0, f32)", "f32[a, b]"},
    {"transpose", kW, "transpose(w -> b, a)", "f32[b, a]"},
    {"einsum (matmul)", kWU, "einsum(w, u -> a, c)", "f32[a, c]"},
    {"einsum (same operand twice)", kW, "einsum(w, w -> a)", "f32[a]"},
    {"einsum (three operands, a dim only one has)", kWU, "einsum(w, u, w -> c)", "f32[c]"},
    {"einsum (operand dims summed away)", kWU, "einsum(w, u -> a)", "f32[a]"},
    {"sum", kW, "sum(w, b) + sum(w)", "f32[a]"},
    {"mean", kW, "mean(w, a)", "f32[b]"},
    {"max", kW, "max(w, b)", "f32[a]"},
    {"min", kW, "min(w, a)", "f32[b]"},
    {"logsumexp", kW, "logsumexp(w, b)", "f32[a]"},
    {"softmax", kW, "softmax(w, b)", "f32[a, b]"},
    {"log_softmax", kW, "log_softmax(w, a)", "f32[a, b]"},
    {"layer_norm", kW, "layer_norm(w, b)", "f32[a, b]"},
    {"layer_norm (two dims)", kW, "layer_norm(w, a, b, eps = 1e-3)", "f32[a, b]"},
    {"layer_norm (used transposed, over the outer dim)", kW,
     "transpose(layer_norm(w, a) -> b, a) * 3.0", "f32[b, a]"},
    {"cumsum", kW, "cumsum(w, b)", "f32[a, b]"},
    {"cumsum (exclusive)", kW, "cumsum(w, b, exclusive = 1)", "f32[a, b]"},
    {"rename", kW, "rename(w, a -> a2)", "f32[a2, b]"},
    {"reshape (merge)", kW, "reshape(w, a, b -> ab)", "f32[ab]"},
    {"reshape (split)", "param p: f32[ab] = normal(stddev = 1)", "reshape(p, ab -> a, b)",
     "f32[a, b]"},
    {"slice", kW, "slice(w, b -> e, start = 1)", "f32[a, e]"},
    {"pad", kW, "pad(w, b -> l, before = 1)", "f32[a, l]"},
    {"concat", kW, "concat(w, square(w), along = [b, b] -> l2)", "f32[a, l2]"},
    {"shift", kW, "shift(w, b, by = 1) + shift(w, b, by = -2)", "f32[a, b]"},
    {"gather", "param table: f32[v, b] = normal(stddev = 1)", "gather(table, ids, v)",
     "f32[a, c, b]"},
    {"dropout", kW, "dropout(w, rate = 0.5)", "f32[a, b]"},
    {"random op (a constant)", kW, "w * normal(f32[a, b])", "f32[a, b]"},
    {"bf16 weight", "param w: bf16[a, b] = normal(stddev = 1)", "cast(square(w) * w, f32)",
     "f32[a, b]"},
    {"one_hot and iota (no gradient through ids)", kW,
     "einsum(one_hot(ids, b), w -> a, c) + cast(iota(c), f32)", "f32[a, c]"},
};

std::string opProgram(const OpCase& c) {
  return fmt::format(R"({}
train t(k: {}, ids: i32[a, c]) {{
  {}
  let y = {}
  let loss = sum(y * k)
  minimize loss with sgd(lr = 0.1)
}}
)",
                     kDims, c.type, c.params, c.expr);
}

} // namespace

TEST_CASE("Every differentiable op's gradient matches finite differences", "[autodiff]") {
  for (const OpCase& c : kOpCases) {
    SECTION(c.name) {
      std::string source = opProgram(c);
      INFO(source);
      Compiled compiled{llvm::StringRef(source)};
      checkAgainstFiniteDifferences(compiled.trainFunction());
    }
  }
}

TEST_CASE("max and min give every tied element the whole cotangent", "[autodiff]") {
  std::string source = std::string(kDims) + R"(
train t(k: f32[a]) {
  param w: f32[a, b] = constant(value = 2)
  let loss = sum(max(w, b) * k) + sum(min(w, a, b))
  minimize loss with sgd(lr = 0.1)
}
)";
  Compiled compiled{llvm::StringRef(source)};
  ir::Function fn = compiled.trainFunction();
  std::optional<train::Gradients> grads = train::differentiate(fn, compiled.diag);
  REQUIRE(grads);
  REQUIRE(grads->size() == 1);
  fn.outputs.push_back(ir::OutputInfo{"dw", grads->begin()->second, {}});
  interp::TensorMap inputs{{"k", interp::synthesizeInput(fn.inputs[0], 5)}};
  auto outputs = interp::run(fn, inputs, exactOptions());
  REQUIRE(static_cast<bool>(outputs));
  const std::vector<double>& dw = outputs->at("dw").data;
  REQUIRE(dw.size() == 12);
  for (size_t i = 0; i < 3; ++i)
    for (size_t j = 0; j < 4; ++j)
      CHECK(dw[i * 4 + j] == Approx(inputs.at("k").data[i] + 1.0));
}

TEST_CASE("layer_norm's gradient is one layer_norm_grad op of x and the cotangent", "[autodiff]") {
  std::string source = std::string(kDims) + R"(
train t(k: f32[a, b]) {
  param w: f32[a, b] = normal(stddev = 1)
  let loss = sum(layer_norm(w, b, eps = 1e-3) * k)
  minimize loss with sgd(lr = 0.1)
}
)";
  Compiled compiled{llvm::StringRef(source)};
  ir::Function fn = compiled.trainFunction();
  size_t forwardOps = fn.ops.size();
  REQUIRE(train::differentiate(fn, compiled.diag));
  int grads = 0;
  for (size_t i = forwardOps; i < fn.ops.size(); ++i) {
    const ir::Op& op = fn.ops[i];
    CHECK(op.kind != ir::OpKind::ReduceMean); // no decomposition left
    if (op.kind != ir::OpKind::LayerNormGrad) continue;
    ++grads;
    CHECK(op.dims("dims") == std::vector<std::string>{"b"});
    CHECK(op.number("eps") == 1e-3);
    CHECK(fn.typeOf(op.operands[1]) == fn.typeOf(op.operands[0]));
  }
  CHECK(grads == 1);
}

TEST_CASE("broadcast (added by autodiff itself) differentiates by summing", "[autodiff]") {
  const char* text = R"(dim a = 3
dim b = 4

train t(k: f32[b, a]) {
  param w: f32[a] = normal(mean = 0.0, stddev = 1.0)  // t.mesh:1:1
  %0 = input {name = "k", index = 0} : f32[b, a]                        // k t.mesh:1:1
  %1 = param {path = "w"} : f32[a]                                      // w t.mesh:1:1
  %2 = broadcast %1 : f32[b, a]                                         // t.mesh:1:1
  %3 = square %2 : f32[b, a]                                            // t.mesh:1:1
  %4 = mul %3, %0 : f32[b, a]                                           // t.mesh:1:1
  %5 = sum %4 {dims = [b, a]} : f32[]                                   // t.mesh:1:1
  minimize %5 with sgd {lr = 0.1}  // t.mesh:1:1
  return loss = %5
}
)";
  auto module = ir::parseModule(text, "t.ir");
  if (!module) FAIL(llvm::toString(module.takeError()));
  checkAgainstFiniteDifferences(module->functions[0]);
}

TEST_CASE("A shared and a tied param's gradient is the sum over its uses", "[autodiff]") {
  // `layer/w` is read by each of three shared iterations, and `table` by a gather and (tied,
  // transposed) by an einsum: one param each, whose gradient must sum every use.
  std::string source = std::string(kDims) + R"(
def layer(x: f32[a, b]) -> f32[a, b] {
  param w: f32[b] = normal(stddev = 0.5)
  return tanh(x * w) + x
}
def embed(ids: i32[a]) -> f32[a, b] {
  param table: f32[v, b] = normal(stddev = 1) as "table"
  return gather(table, ids, v)
}
def unembed(h: f32[a, b]) -> f32[a, v] {
  param table: f32[b, v] = normal(stddev = 1) as "table"
  return einsum(h, table -> a, v)
}
train t(ids: i32[a], k: f32[a, v]) {
  let h = embed(ids)
  repeat 3 shared { h = layer(h) }
  let loss = sum(unembed(h) * k)
  minimize loss with sgd(lr = 0.1)
}
)";
  Compiled compiled(source);
  ir::Function fn = compiled.trainFunction();
  std::vector<std::string> paths;
  for (const ir::ParamInfo& param : fn.params)
    paths.push_back(param.path);
  CHECK(paths == std::vector<std::string>{"table", "layer/w"});
  checkAgainstFiniteDifferences(fn);
  // One update per param: the optimizer sees each shared or tied param once.
  REQUIRE(train::lowerTraining(fn, compiled.diag));
  std::vector<size_t> updated;
  for (const ir::ParamUpdate& update : fn.updates)
    updated.push_back(update.param);
  CHECK(std::count(updated.begin(), updated.end(), size_t(0)) == 1);
  CHECK(std::count(updated.begin(), updated.end(), size_t(1)) == 1);
}

TEST_CASE("stop_gradient blocks the gradient; a weight reaching the loss only through "
          "comparisons or ids gets none and is left unchanged",
          "[autodiff]") {
  std::string source = std::string(kDims) + R"(
train t(k: f32[a, b]) {
  param w: f32[a, b] = normal(stddev = 1)
  param gate: f32[a, b] = normal(stddev = 1)
  let y = w * stop_gradient(w) + where(gate > 0.0, k, 0.0)
  let loss = sum(y * k)
  minimize loss with adamw(lr = 0.1)
}
)";
  Compiled compiled{llvm::StringRef(source)};
  ir::Function fn = compiled.trainFunction();
  std::optional<train::Gradients> grads = train::differentiate(fn, compiled.diag);
  REQUIRE(grads);
  REQUIRE(grads->size() == 1); // w only: gate reaches the loss only through `>`
  CHECK(fn.params[grads->begin()->first].path == "w");
  fn.outputs.push_back(ir::OutputInfo{"dw", grads->begin()->second, {}});
  interp::TensorMap inputs{{"k", interp::synthesizeInput(fn.inputs[0], 5)}};
  auto outputs = interp::run(fn, inputs, exactOptions());
  REQUIRE(static_cast<bool>(outputs));
  interp::Tensor w = interp::initializeParam(fn.params[0], exactOptions().seed);
  for (size_t i = 0; i < w.data.size(); ++i) // d/dw (w * sg(w) * k) = sg(w) * k
    CHECK(outputs->at("dw").data[i] == Approx(w.data[i] * inputs.at("k").data[i]));

  ir::Function lowered = compiled.trainFunction();
  REQUIRE(train::lowerTraining(lowered, compiled.diag));
  for (const ir::ParamUpdate& update : lowered.updates)
    CHECK(lowered.params[update.param].path.rfind("gate", 0) == std::string::npos);
}

TEST_CASE("A user function on a weight's path to the loss is a located error", "[autodiff]") {
  const char* text = R"(dim a = 3

train t(x: f32[a]) {
  param w: f32[a] = normal(mean = 0.0, stddev = 1.0)  // t.mesh:2:3
  %0 = input {name = "x", index = 0} : f32[a]                           // x t.mesh:1:9
  %1 = param {path = "w"} : f32[a]                                      // w t.mesh:2:3
  %2 = call %0, %1 {function = "my_act", header = "act.h"} : f32[a]    // t.mesh:3:11
  %3 = sum %2 {dims = [a]} : f32[]                                      // t.mesh:4:14
  minimize %3 with sgd {lr = 0.1}  // t.mesh:5:3
  return loss = %3
}
)";
  auto module = ir::parseModule(text, "t.ir");
  if (!module) FAIL(llvm::toString(module.takeError()));
  // Locations from IR text carry no SMLoc: attach one in a buffer so the error shows its line.
  llvm::SourceMgr sources;
  std::string source =
      "train t(x: f32[a]) {\n  param w: f32[a] = normal()\n  let y = my_act(x, w)\n";
  sources.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy(source, "t.mesh"), llvm::SMLoc());
  ir::Function fn = module->functions[0];
  fn.ops[2].loc.loc = llvm::SMLoc::getFromPointer(sources.getMemoryBuffer(1)->getBufferStart() +
                                                  source.find("my_act"));
  std::string errors;
  llvm::raw_string_ostream errorStream(errors);
  DiagEngine diag(sources, errorStream);
  CHECK_FALSE(train::lowerTraining(fn, diag));
  errorStream.flush();
  CHECK(errors.find("t.mesh:3:11: error: cannot differentiate the user function 'my_act': it lies "
                    "on the path from param 'w' to the loss of train block 't'") !=
        std::string::npos);

  // A call off every weight's path is not differentiated, and training compiles:
  // loss = sum(my_act(x, x)) + sum(w).
  ir::Function offPath = module->functions[0];
  offPath.ops[2].operands = {0, 0};
  ir::Op sumW{ir::OpKind::ReduceSum, {1}, 0, {{"dims", std::vector<std::string>{"a"}}}, {}};
  ir::ValueId sum = offPath.addOp(sumW, offPath.typeOf(3));
  ir::ValueId total =
      offPath.addOp(ir::Op{ir::OpKind::Add, {3, sum}, 0, {}, {}}, offPath.typeOf(3));
  offPath.train->loss = total;
  offPath.outputs[0].value = total;
  CHECK(train::lowerTraining(offPath, diag));
  CHECK(offPath.updates.size() == 1);
}

TEST_CASE("Each example's train-block loss has gradients that match finite differences",
          "[autodiff][examples]") {
  struct Example {
    const char* file;
    std::map<std::string, int64_t> dims;
  };
  const Example examples[] = {
      {"mlp", {{"batch", 4}, {"d_model", 8}, {"d_ff", 16}}},
      {"transformer", {{"batch", 2}, {"seq", 8}, {"mem", 8}, {"d_ff", 32}}},
      {"bert", {{"batch", 4}, {"seq", 8}, {"mem", 8}, {"d_ff", 32}}},
      {"performer", {{"seq", 16}, {"features", 16}, {"d_ff", 32}}},
      {"moe", {}},
      {"vit", {}},
  };
  for (const Example& example : examples) {
    SECTION(example.file) {
      SemaOptions options;
      options.dimSizes = example.dims;
      Compiled compiled(std::string(MESHC_SOURCE_DIR) + "/dsl-examples/" + example.file + ".mesh",
                        options);
      // Kinks (relu, max, top-k routing) make a few elements noisy at any step: a looser
      // tolerance than the single-op cases, on a handful of elements per param.
      checkAgainstFiniteDifferences(compiled.trainFunction(), 3, 1e-5, 1e-4);
    }
  }
}
