// Sema: lowering of programs, train blocks and defs to the named-dim IR (op kinds, types,
// attributes, param paths, transposes, broadcasting, index bounds, layouts, train info) and
// the rejection of bad programs without crashing.
#include "sema/Sema.h"

#include "interp/Interpreter.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>

using namespace meshc;
using ir::OpKind;

namespace {

struct Analyzed {
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream errorStream{errors};
  DiagEngine diag{sources, errorStream};
  std::optional<ir::Module> module;

  explicit Analyzed(llvm::StringRef text, const SemaOptions& options = {}) {
    std::optional<SourceSet> set = loadSourcesFromBuffer(text, "t.mesh", diag);
    if (set) module = analyze(*set, diag, options);
    errorStream.flush();
  }
  bool reported(llvm::StringRef message) const {
    return errors.find(message.str()) != std::string::npos;
  }
  const ir::Function& fn(const std::string& name) const {
    REQUIRE(module);
    const ir::Function* f = module->findFunction(name);
    REQUIRE(f);
    return *f;
  }
};

const char* kHeader = R"(
mesh m[data = 2, model = 4]
dim batch = 8
dim seq = 4
dim d_model = 16
dim d_ff = 32
dim vocab = 10
dim heads = 4
dim d_head = 4
)";

std::string withHeader(const std::string& body) {
  return kHeader + body;
}

std::vector<OpKind> kinds(const ir::Function& fn) {
  std::vector<OpKind> out;
  for (const ir::Op& op : fn.ops)
    out.push_back(op.kind);
  return out;
}

std::vector<std::string> dimNames(const ir::TensorType& type) {
  std::vector<std::string> out;
  for (const ir::Dim& d : type.dims)
    out.push_back(d.name);
  return out;
}

std::vector<std::string> paramPaths(const ir::Function& fn) {
  std::vector<std::string> out;
  for (const ir::ParamInfo& p : fn.params)
    out.push_back(p.path);
  return out;
}

const ir::Op& firstOp(const ir::Function& fn, OpKind kind) {
  auto it =
      std::find_if(fn.ops.begin(), fn.ops.end(), [&](const ir::Op& op) { return op.kind == kind; });
  REQUIRE(it != fn.ops.end());
  return *it;
}

using Strings = std::vector<std::string>;

} // namespace

TEST_CASE("sema lowers a program with inputs, einsum and outputs") {
  Analyzed a(withHeader(R"(
program p(x: f32[batch, d_model]) -> (y: f32[batch, d_ff]) {
  param w: f32[d_model, d_ff] = normal(stddev = 0.02)
  y = relu(einsum(x, w -> batch, d_ff))
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("p");
  CHECK(fn.kind == ir::Function::Kind::Program);
  CHECK(kinds(fn) == std::vector{OpKind::Input, OpKind::Param, OpKind::Einsum, OpKind::Relu});
  REQUIRE(fn.inputs.size() == 1);
  CHECK(fn.inputs[0].name == "x");
  CHECK(fn.ops[0].string("name") == "x");
  CHECK(fn.ops[0].integer("index", -1) == 0);
  REQUIRE(fn.params.size() == 1);
  CHECK(fn.params[0].path == "w");
  CHECK(fn.params[0].trainable);
  CHECK(fn.params[0].init.kind == "normal");
  CHECK(fn.params[0].init.arg("stddev", 0) == 0.02);
  CHECK(fn.params[0].init.arg("mean", 9) == 0);
  CHECK(dimNames(fn.typeOf(fn.ops[2].result)) == Strings{"batch", "d_ff"});
  REQUIRE(fn.outputs.size() == 1);
  CHECK(fn.outputs[0].name == "y");
  CHECK(fn.outputs[0].value == fn.ops[3].result);
  CHECK(fn.ops[2].loc.line == 13);
  CHECK(fn.ops[2].loc.file == "t.mesh");
  CHECK(fn.values[fn.ops[0].result].name == "x");
}

TEST_CASE("sema records the module: mesh, dims and layout") {
  Analyzed a(withHeader(R"(
layout batch: data, heads: [model], d_ff: auto, seq: []
layout auto
program p(x: f32[batch]) -> (y: f32[batch]) { y = x }
)"));
  INFO(a.errors);
  REQUIRE(a.module);
  CHECK(a.module->meshName == "m");
  REQUIRE(a.module->mesh.size() == 2);
  CHECK(a.module->mesh[1].name == "model");
  CHECK(a.module->mesh[1].size == 4);
  CHECK(a.module->dims.at("d_ff") == 32);
  CHECK(a.module->dims.size() == 7);
  CHECK(a.module->autoLayout);
  REQUIRE(a.module->layout.size() == 4);
  CHECK(a.module->layout[0].dim == "batch");
  CHECK(a.module->layout[0].axes == Strings{"data"});
  CHECK(a.module->layout[2].isAuto);
  CHECK(a.module->layout[3].axes.empty());
  CHECK_FALSE(a.module->layout[3].isAuto);
}

TEST_CASE("sema names params by call path: defs, repeats and second calls") {
  Analyzed a(withHeader(R"(
def attn(x: f32[batch, d_model]) -> f32[batch, d_model] {
  param w_q: f32[d_model] = ones()
  return dropout(x * w_q, rate = 0.5)
}
def block(x: f32[batch, d_model]) -> f32[batch, d_model] {
  return attn(x) + attn(x)
}
program p(x: f32[batch, d_model]) -> (y: f32[batch, d_model]) {
  let h = x
  repeat 2 { h = block(h) }
  h = attn(h)
  param w: f32[d_model] = zeros()
  repeat 2 { param b: f32[d_model] = zeros() h = h + b }
  y = h * w
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("p");
  CHECK(paramPaths(fn) == Strings{"block[0]/attn/w_q", "block[0]/attn#1/w_q", "block[1]/attn/w_q",
                                  "block[1]/attn#1/w_q", "attn/w_q", "w", "b[0]", "b[1]"});
  std::vector<std::string> streams;
  for (const ir::Op& op : fn.ops)
    if (op.kind == OpKind::Dropout) streams.push_back(op.string("stream"));
  CHECK(streams == Strings{"block[0]/attn/dropout#0", "block[0]/attn#1/dropout#0",
                           "block[1]/attn/dropout#0", "block[1]/attn#1/dropout#0",
                           "attn/dropout#0"});
  for (const ir::ParamInfo& p : fn.params)
    CHECK(fn.definingOp(p.value).string("path") == p.path);
}

TEST_CASE("sema repeats a dim's size and rebinds outer lets") {
  Analyzed a(withHeader(R"(
program p(x: f32[batch]) -> (y: f32[batch]) {
  let h = x
  repeat seq { h = h * 2 }
  y = h
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("p");
  size_t muls = std::count_if(fn.ops.begin(), fn.ops.end(),
                              [](const ir::Op& op) { return op.kind == OpKind::Mul; });
  CHECK(muls == 4);
  CHECK(fn.definingOp(fn.outputs[0].value).kind == OpKind::Mul);
}

TEST_CASE("sema inserts transposes for declared dim orders") {
  Analyzed a(withHeader(R"(
def f(x: f32[d_model, batch]) -> f32[batch, d_model] { return x }
program p(x: f32[batch, d_model]) -> (y: f32[d_model, batch]) {
  let t: f32[d_model, batch] = x
  let u = f(x)
  y = u
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("p");
  // let t, the def argument, the def result and the output each transpose once.
  CHECK(kinds(fn) == std::vector{OpKind::Input, OpKind::Transpose, OpKind::Transpose,
                                 OpKind::Transpose, OpKind::Transpose});
  CHECK(dimNames(fn.typeOf(fn.ops[1].result)) == Strings{"d_model", "batch"});
  CHECK(dimNames(fn.typeOf(fn.outputs[0].value)) == Strings{"d_model", "batch"});
}

TEST_CASE("sema broadcasts by name and types literals by their partner") {
  Analyzed a(withHeader(R"(
program p(a: f32[batch, seq], b: f32[d_model, batch], n: i32[seq]) -> (y: f32[batch, seq, d_model], m: i32[seq], c: i32[batch, seq]) {
  y = a + b
  m = n * 2 + 1
  c = a < 0.5
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("p");
  CHECK(dimNames(fn.typeOf(fn.outputs[0].value)) == Strings{"batch", "seq", "d_model"});
  const ir::Op& literal = firstOp(fn, OpKind::Literal);
  CHECK(fn.typeOf(literal.result).dtype == ir::DType::I32);
  CHECK(literal.number("value") == 2);
  CHECK(fn.typeOf(fn.outputs[2].value).dtype == ir::DType::I32);
  CHECK(fn.definingOp(fn.outputs[2].value).kind == OpKind::Lt);
}

TEST_CASE("sema lowers reshape, slice, concat, pad, rename, cumsum, shift") {
  Analyzed a(withHeader(R"(
dim pos = 8
dim half = 2
dim d_all = 16
dim other = 4
program p(x: f32[batch, heads, d_head], s: f32[batch, seq]) -> (r: f32[batch, d_all], t: f32[batch, seq], sl: f32[batch, half], cc: f32[batch, pos], pd: f32[batch, pos], rn: f32[batch, other], sp: f32[d_head, batch, heads]) {
  r = reshape(x, heads, d_head -> d_all)
  t = shift(cumsum(s, seq, exclusive = 1), seq, by = -1)
  sl = slice(s, seq -> half, start = 2)
  cc = concat(s, s, along = [seq, seq] -> pos)
  pd = pad(s, seq -> pos, before = 1)
  rn = rename(s, seq -> other)
  sp = reshape(r, d_all -> d_head, heads)
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("p");
  const ir::Op& reshape = firstOp(fn, OpKind::Reshape);
  CHECK(reshape.dims("from") == Strings{"heads", "d_head"});
  CHECK(reshape.dims("to") == Strings{"d_all"});
  const ir::Op& cumsum = firstOp(fn, OpKind::Cumsum);
  CHECK(cumsum.string("dim") == "seq");
  CHECK(cumsum.integer("exclusive") == 1);
  CHECK(firstOp(fn, OpKind::Shift).integer("offset") == -1);
  const ir::Op& slice = firstOp(fn, OpKind::Slice);
  CHECK(slice.string("from") == "seq");
  CHECK(slice.string("to") == "half");
  CHECK(slice.integer("start") == 2);
  const ir::Op& concat = firstOp(fn, OpKind::Concat);
  CHECK(concat.dims("from") == Strings{"seq", "seq"});
  CHECK(concat.string("to") == "pos");
  CHECK(concat.operands.size() == 2);
  CHECK(firstOp(fn, OpKind::Pad).integer("before") == 1);
  const ir::Op& rename = firstOp(fn, OpKind::Rename);
  CHECK(rename.dims("from") == Strings{"seq"});
  CHECK(rename.dims("to") == Strings{"other"});
  // reshape places the new dims where the first regrouped dim was
  CHECK(dimNames(fn.typeOf(fn.outputs[6].value)) == Strings{"d_head", "batch", "heads"});
  ir::ValueId sp = fn.definingOp(fn.outputs[6].value).operands[0];
  CHECK(dimNames(fn.typeOf(sp)) == Strings{"batch", "d_head", "heads"});
}

TEST_CASE("sema lowers reductions, normalizations and random ops") {
  Analyzed a(withHeader(R"(
train t(x: f32[batch, seq, d_model], labels: i32[batch, seq], pos: i32[seq]) {
  param emb: f32[vocab, d_model] = truncated_normal(stddev = 0.5)
  const proj: f32[d_ff, d_model] = orthogonal(scale = 2)
  let h = layer_norm(x, d_model, eps = 1e-6) + normal(f32[d_model], stddev = 0.1)
  let u = uniform(f32[seq], min = -1, max = 1)
  let sm = softmax(h, d_model) * cast(pos, f32)
  let logits = einsum(sm, emb -> batch, seq, vocab)
  let nll = logsumexp(logits, vocab) - sum(logits * one_hot(labels, vocab), vocab)
  let g = gather(emb, pos, vocab)
  let w = where(iota(seq) > 1, u, 0)
  minimize mean(nll) + sum(g) * 0 + sum(w) with sgd(0.5, momentum = 0.9, clip_norm = 1, schedule = linear, warmup_steps = 10)
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("t");
  CHECK(fn.kind == ir::Function::Kind::Train);
  CHECK(firstOp(fn, OpKind::LayerNorm).dims("dims") == Strings{"d_model"});
  CHECK(firstOp(fn, OpKind::LayerNorm).number("eps") == 1e-6);
  CHECK(firstOp(fn, OpKind::RandomNormal).number("stddev") == 0.1);
  CHECK(firstOp(fn, OpKind::RandomNormal).string("stream") == "normal#0");
  CHECK(firstOp(fn, OpKind::RandomUniform).number("min") == -1);
  CHECK(firstOp(fn, OpKind::RandomUniform).string("stream") == "uniform#1");
  CHECK(firstOp(fn, OpKind::Softmax).string("dim") == "d_model");
  CHECK(firstOp(fn, OpKind::LogSumExp).dims("dims") == Strings{"vocab"});
  CHECK(firstOp(fn, OpKind::ReduceMean).dims("dims") == Strings{"batch", "seq"});
  CHECK(firstOp(fn, OpKind::Iota).string("dim") == "seq");
  const ir::Op& gather = firstOp(fn, OpKind::Gather);
  CHECK(dimNames(fn.typeOf(gather.result)) == Strings{"seq", "d_model"});
  const ir::Op& where = firstOp(fn, OpKind::Where);
  CHECK(fn.typeOf(where.operands[0]).dtype == ir::DType::I32);
  CHECK(fn.typeOf(where.result).dtype == ir::DType::F32);
  // index bounds: labels indexes vocab through one_hot, pos through gather
  CHECK(fn.inputs[0].indexBound == 0);
  CHECK(fn.inputs[1].indexBound == 10);
  CHECK(fn.inputs[2].indexBound == 10);
  REQUIRE(fn.params.size() == 2);
  CHECK(fn.params[0].init.kind == "truncated_normal");
  CHECK_FALSE(fn.params[1].trainable);
  CHECK(fn.params[1].init.arg("scale", 0) == 2);
  REQUIRE(fn.train);
  CHECK(fn.train->optimizer == "sgd");
  auto option = [&](const std::string& key) -> const ir::AttrValue& {
    auto it = std::find_if(fn.train->options.begin(), fn.train->options.end(),
                           [&](const auto& o) { return o.first == key; });
    REQUIRE(it != fn.train->options.end());
    return it->second;
  };
  CHECK(std::get<double>(option("lr")) == 0.5);
  CHECK(std::get<double>(option("momentum")) == 0.9);
  CHECK(std::get<int64_t>(option("nesterov")) == 0);
  CHECK(std::get<int64_t>(option("warmup_steps")) == 10);
  CHECK(std::get<std::string>(option("schedule")) == "linear");
  CHECK(std::get<double>(option("clip_norm")) == 1);
  REQUIRE(fn.outputs.size() == 1);
  CHECK(fn.outputs[0].name == "loss");
  CHECK(fn.outputs[0].value == fn.train->loss);
}

TEST_CASE("sema traces index bounds through renames and takes the smallest") {
  Analyzed a(withHeader(R"(
dim ids_dim = 8
program p(ids: i32[batch]) -> (y: f32[ids_dim, d_model], z: f32[ids_dim, seq]) {
  param emb: f32[vocab, d_model] = zeros()
  y = gather(emb, rename(ids, batch -> ids_dim), vocab)
  z = one_hot(rename(ids, batch -> ids_dim), seq)
}
)"));
  INFO(a.errors);
  CHECK(a.fn("p").inputs[0].indexBound == 4);
}

TEST_CASE("sema checks the mesh axes a tensor uses") {
  Analyzed a(withHeader(R"(
layout batch: data, d_model: [model, data], seq: auto, heads: data
program p(x: f32[batch, seq], w: f32[d_model]) -> (y: f32[batch, seq, d_model]) {
  y = x * w
}
)"));
  REQUIRE_FALSE(a.module);
  CHECK(a.reported("tensor f32[batch, seq, d_model] maps both 'batch' and 'd_model' to mesh axis "
                   "'data'"));
  CHECK(a.diag.errorCount() == 1);
}

TEST_CASE("sema rejects bad layouts") {
  Analyzed a(withHeader(R"(
dim odd = 6
layout odd: model, batch: [data, data], nope: data, seq: other
layout batch: []
)"));
  REQUIRE_FALSE(a.module);
  CHECK(a.reported("dim 'odd' of size 6 is not divisible by 4 (axes model)"));
  CHECK(a.reported("mesh axis 'data' is listed twice for dim 'batch'"));
  CHECK(a.reported("unknown dim 'nope'"));
  CHECK(a.reported("unknown mesh axis 'other'"));
  CHECK(a.diag.errorCount() == 4); // batch's second entry is skipped: its first had errors
}

TEST_CASE("sema reports many errors in one run and keeps going") {
  Analyzed a(withHeader(R"(
def f(x: f32[batch]) -> f32[batch] { return g(x) }
def g(x: f32[batch]) -> f32[batch] { return f(x) }
program p(x: f32[batch], n: i32[batch]) -> (y: f32[batch], z: f32[batch]) {
  let a = x + n
  let b = a * 2
  let c = exp(n)
  let d: f32[seq] = x
  q = x
  y = f(x)
}
)"));
  REQUIRE_FALSE(a.module);
  CHECK(a.reported("recursive call of def 'f' (f -> g -> f)"));
  CHECK(a.reported("operands of '+' have different dtypes: f32[batch] and i32[batch]"));
  CHECK(a.reported("'exp' requires a float tensor but got i32[batch]"));
  CHECK(a.reported("type mismatch: expected f32[seq] but got f32[batch]"));
  CHECK(a.reported("assignment to undeclared name 'q'"));
  CHECK(a.reported("output 'z' is never set"));
  CHECK(a.diag.errorCount() == 6);
}

TEST_CASE("sema checks defs nobody calls") {
  Analyzed a(withHeader(R"(
def unused(x: f32[batch]) -> f32[batch] { return x + y }
program p(x: f32[batch]) -> (y: f32[batch]) { y = x }
)"));
  REQUIRE_FALSE(a.module);
  CHECK(a.reported("unknown name 'y'"));
  CHECK(a.diag.errorCount() == 1);
}

TEST_CASE("sema reports an error inside an inlined def once") {
  Analyzed a(withHeader(R"(
def f(x: f32[batch]) -> f32[batch] { return exp(x < 1) }
program p(x: f32[batch]) -> (y: f32[batch]) {
  repeat 3 { x = f(x) }
  y = f(f(x))
}
)"));
  REQUIRE_FALSE(a.module);
  CHECK(a.diag.errorCount() == 2); // exp of i32, and assigning to the input x
}

TEST_CASE("sema stops expanding huge programs") {
  Analyzed a(withHeader(R"(
dim big = 1000000
def f(x: f32[batch]) -> f32[batch] { return x * 2 + 1 }
program p(x: f32[batch]) -> (y: f32[batch]) {
  let h = x
  repeat big { repeat big { h = f(h) } }
  y = h
}
)"));
  REQUIRE_FALSE(a.module);
  CHECK(a.reported("'p' expands to more than 2000000 ops and statements"));
  CHECK(a.diag.errorCount() == 1);
}

TEST_CASE("sema survives odd inputs") {
  const char* cases[] = {
      "program p() -> (y: f32[]) { y = 1 }",
      "program p() -> (y: f32[]) { y = y }",
      "program p(x: f32[]) -> (x: f32[]) { x = x }",
      "def f() -> f32[] { return 1 } program p() -> (y: f32[]) { y = f() + f(1) }",
      "train t() { minimize 1 with sgd(lr = 1) }",
      "train t() { minimize 1 with sgd(lr = 1) minimize 2 with sgd(lr = 1) }",
      "dim a = 4 program p() -> (y: f32[a]) { y = einsum(-> a) }",
      "dim a = 4 program p() -> (y: i32[a]) { y = iota(a) + iota(a, a) + iota(1) }",
      "dim a = 4 program p() -> (y: f32[a]) { y = normal(f32) + uniform(i32[a]) + cast(1, 2) }",
      "dim a = 4 program p(x: f32[a]) -> (y: f32[a]) { y = concat(along = [a] -> a) }",
      "dim a = 4 program p(x: f32[a]) -> (y: f32[a]) { y = [x] + f32[a] + a + p }",
      "dim a = 4 def f(x: f32[a]) -> f32[a] { repeat 2 { return x } }",
      "dim a = 4 program p(x: f32[a]) -> (y: f32[a]) { repeat 2 { let z = x } y = z }",
      "dim a = 4 program p(x: f32[a]) -> (y: f32[a]) { repeat x { } y = x }",
      "dim a = 4 program p(x: f32[a]) -> (y: f32[a]) { y = transpose(x -> a, a) }",
      "dim a = 4 program p(x: f32[a]) -> (y: f32[a]) { y = reshape(x, a ->) }",
  };
  for (const char* text : cases) {
    Analyzed a(text);
    INFO(text << "\n" << a.errors);
    CHECK(a.diag.hadError() == !a.module.has_value());
  }
}

TEST_CASE("sema broadcasts where by name: a's dims, then b's, then the condition's") {
  Analyzed a(withHeader(R"(
def scale(x: f32[batch], s: f32[]) -> f32[batch] { return x * s }
program p(c: i32[seq, batch], x: f32[batch], w: f32[d_model]) -> (y: f32[batch, d_model, seq], z: f32[batch]) {
  y = where(c, x, w)
  z = scale(x, 2)
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("p");
  const ir::Op& where = firstOp(fn, OpKind::Where);
  CHECK(dimNames(fn.typeOf(where.result)) == Strings{"batch", "d_model", "seq"});
  CHECK(where.operands.size() == 3);
  // the literal argument of a def becomes a scalar of the declared dtype
  const ir::Op& literal = firstOp(fn, OpKind::Literal);
  CHECK(literal.number("value") == 2);
  CHECK(fn.typeOf(literal.result) == ir::TensorType{ir::DType::F32, {}});
}

TEST_CASE("sema does not check mesh axes of auto dims") {
  Analyzed a(withHeader(R"(
layout batch: data, d_model: auto
program p(x: f32[batch, d_model]) -> (y: f32[batch, d_model]) { y = x }
)"));
  INFO(a.errors);
  REQUIRE(a.module);
  REQUIRE(a.module->layout.size() == 2);
  CHECK(a.module->layout[1].isAuto);
}

TEST_CASE("sema rejects a second mesh, duplicate dims and duplicate functions") {
  Analyzed a(R"(
mesh a[x = 2]
mesh b[y = 2]
dim d = 4
dim d = 4
def f() -> f32[] { return 1 }
program f() -> (y: f32[]) { y = 1 }
train f() { minimize 1 with sgd(lr = 1) }
)");
  REQUIRE_FALSE(a.module);
  CHECK(a.reported("a second mesh 'b' is declared"));
  CHECK(a.reported("redefinition of dim 'd'"));
  CHECK(a.reported("redefinition of program 'f'"));
  CHECK(a.reported("redefinition of train 'f'"));
  CHECK(a.reported("note: previous definition of 'f' is here"));
  CHECK(a.diag.errorCount() == 4);
}

TEST_CASE("sema applies command-line dim sizes, mesh and layout") {
  SemaOptions options;
  options.dimSizes = {{"batch", 64}, {"d_ff", 48}};
  options.mesh = std::vector<ir::MeshAxis>{{"data", 8}, {"model", 2}};
  options.layout = "batch: data; d_ff: [model], heads: auto, seq: []; auto";
  Analyzed a(withHeader(R"(
layout batch: model
program p(x: f32[batch, d_ff]) -> (y: f32[batch]) { y = sum(x, d_ff) }
)"),
             options);
  INFO(a.errors);
  REQUIRE(a.module);
  CHECK(a.module->dims.at("batch") == 64);
  CHECK(a.module->dims.at("d_ff") == 48);
  CHECK(a.module->meshName == "m");
  REQUIRE(a.module->mesh.size() == 2);
  CHECK(a.module->mesh[0].size == 8);
  CHECK(a.module->autoLayout);
  REQUIRE(a.module->layout.size() == 4);
  CHECK(a.module->layout[0].axes == Strings{"data"});
  CHECK(a.module->layout[1].axes == Strings{"model"});
  CHECK(a.module->layout[2].isAuto);
  CHECK(a.module->layout[3].axes.empty());
  CHECK(a.fn("p").inputs[0].type.dims[0].size == 64);
}

TEST_CASE("sema reports bad command-line overrides") {
  SemaOptions options;
  options.dimSizes = {{"nope", 4}};
  options.mesh = std::vector<ir::MeshAxis>{{"data", 2}, {"data", 2}};
  options.layout = "batch: [data model]";
  Analyzed a(withHeader("program p(x: f32[batch]) -> (y: f32[batch]) { y = x }"), options);
  REQUIRE_FALSE(a.module);
  CHECK(a.reported("--dim sets the size of unknown dim 'nope'"));
  CHECK(a.reported("--mesh lists axis 'data' twice"));
  CHECK(a.reported("--layout:1:14: error: expected ',' or ']' but found 'model'"));
  CHECK(a.diag.errorCount() == 3);
  INFO(a.errors);

  SemaOptions layoutOnly;
  layoutOnly.layout = "heads: [data, model]";
  Analyzed b(withHeader("program p(x: f32[batch]) -> (y: f32[batch]) { y = x }"), layoutOnly);
  REQUIRE_FALSE(b.module);
  CHECK(b.reported("--layout:1:1: error: dim 'heads' of size 4 is not divisible by 8 (axes data "
                   "x model = 8)"));
  // a pinned stage split whose counts are not numbers: located in the option's text
  SemaOptions splitTypo;
  splitTypo.layout = "batch: data(1, x)";
  Analyzed d(withHeader("program p(x: f32[batch]) -> (y: f32[batch]) { y = x }"), splitTypo);
  REQUIRE_FALSE(d.module);
  CHECK(d.reported("--layout:1:16: error: expected a layer count but found 'x'"));
  // no mesh at all: a layout that uses axes is an error, a bare auto is fine
  SemaOptions autoOnly;
  autoOnly.layout = "auto";
  Analyzed c("dim d = 3 program p(x: f32[d]) -> (y: f32[d]) { y = x }", autoOnly);
  CHECK(c.module);
}

// ------------------------------------------------------------------------- generic defs

namespace {

const char* kGenericHeader = R"(
dim batch = 2
dim enc = 8
dim dec = 6
dim d_model = 4
)";

std::string generic(const std::string& body) {
  return kGenericHeader + body;
}

const ir::Value& outputValue(const ir::Function& fn, const std::string& name) {
  auto it = std::find_if(fn.outputs.begin(), fn.outputs.end(),
                         [&](const ir::OutputInfo& out) { return out.name == name; });
  REQUIRE(it != fn.outputs.end());
  return fn.values[it->value];
}

} // namespace

TEST_CASE("sema binds dim parameters from the argument types, per call") {
  Analyzed a(generic(R"(
def rms[S](x: f32[batch, S, d_model]) -> f32[batch, S, d_model] {
  param gain: f32[d_model] = ones()
  let sq: f32[batch, S] = sum(square(x), d_model)
  return x * rsqrt(sq / size(d_model) + 1e-6) * gain
}
program p(a: f32[batch, enc, d_model], b: f32[d_model, dec, batch])
    -> (y: f32[batch, enc, d_model], z: f32[batch, dec, d_model]) {
  y = rms(a)
  z = rms(b)
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("p");
  CHECK(dimNames(outputValue(fn, "y").type) == Strings{"batch", "enc", "d_model"});
  CHECK(dimNames(outputValue(fn, "z").type) == Strings{"batch", "dec", "d_model"});
  CHECK(paramPaths(fn) == Strings{"rms/gain", "rms#1/gain"});
  // The let's declared type and the reduction see the bound dim.
  std::vector<Strings> sums;
  for (const ir::Op& op : fn.ops)
    if (op.kind == OpKind::ReduceSum) sums.push_back(dimNames(fn.typeOf(op.result)));
  CHECK(sums == std::vector<Strings>{{"batch", "enc"}, {"batch", "dec"}});
  // size(d_model) is the integer literal 4.
  bool dividesBy4 = false;
  for (const ir::Op& op : fn.ops)
    if (op.kind == OpKind::Div && fn.definingOp(op.operands[1]).kind == OpKind::Literal)
      dividesBy4 = fn.definingOp(op.operands[1]).number("value", 0) == 4;
  CHECK(dividesBy4);
}

TEST_CASE("sema binds several dim parameters by name and order, and explicitly") {
  Analyzed a(generic(R"(
def scores[S, M](q: f32[batch, S, d_model], k: f32[batch, M, d_model]) -> f32[batch, S, M] {
  return einsum(q, k -> batch, S, M)
}
def make[S]() -> f32[S] { return cast(iota(S), f32) }
program p(x: f32[batch, dec, d_model], m: f32[batch, enc, d_model])
    -> (cross: f32[batch, dec, enc], back: f32[batch, enc, dec], e: f32[enc], d: f32[dec]) {
  cross = scores(x, m)
  back = scores[enc, dec](m, x)
  e = make[enc]()
  d = make[dec]()
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("p");
  CHECK(dimNames(outputValue(fn, "cross").type) == Strings{"batch", "dec", "enc"});
  CHECK(dimNames(outputValue(fn, "back").type) == Strings{"batch", "enc", "dec"});
  CHECK(outputValue(fn, "e").type.dims[0].size == 8);
  CHECK(outputValue(fn, "d").type.dims[0].size == 6);
}

TEST_CASE("sema reports conflicting, missing and miscounted dim parameters") {
  Analyzed a(generic(R"(
def add[S](x: f32[batch, S], y: f32[batch, S]) -> f32[batch, S] { return x + y }
def make[S]() -> f32[S] { return cast(iota(S), f32) }
program p(x: f32[batch, enc], y: f32[batch, dec]) -> (z: f32[batch, enc]) {
  let a = add(x, y)
  let b = add[dec](x, x)
  let c = make()
  let d = make[enc, dec]()
  let e = exp[enc](x)
  let f = add(x, 1.0)
  z = x
}
)"));
  CHECK(a.reported("dim parameter 'S' of def 'add' is bound to 'enc' by argument 'x' and to "
                   "'dec' by argument 'y'"));
  CHECK(a.reported("dim parameter 'S' of def 'add' is bound to 'dec' explicitly and to 'enc' "
                   "by argument 'x'"));
  CHECK(a.reported("dim parameter 'S' of def 'make' is not bound by the argument types (bind it "
                   "explicitly: make[dims](...))"));
  CHECK(a.reported("'make' takes 1 dims in '[...]' but 2 are given"));
  CHECK(a.reported("'exp' takes 0 dims in '[...]' but 1 are given"));
  CHECK(a.reported("argument 'y' of def 'add' has type f32[batch, enc] but got f32[]"));
  INFO(a.errors);
  CHECK(a.diag.errorCount() == 6);
}

TEST_CASE("sema names local dims by their size: one name per size") {
  Analyzed a(generic(R"(
def halves[S](x: f32[batch, S]) -> f32[batch] {
  dim half = size(S) / 2
  let first = slice(x, S -> half, start = 0)
  let second = slice(x, S -> half, start = size(half))
  return sum(first * second, half)
}
def also_half(x: f32[batch, enc]) -> f32[batch, enc] {
  dim half = size(enc) / 2
  return pad(slice(x, enc -> half, start = size(half)), half -> enc, before = size(enc) - size(half))
}
program p(a: f32[batch, enc], b: f32[batch, dec]) -> (y: f32[batch], z: f32[batch]) {
  y = halves(a) + sum(also_half(a), enc) * 0
  z = halves(b) + halves(b)
}
)"));
  INFO(a.errors);
  REQUIRE(a.module);
  // enc / 2 = 4 takes the plain name (first met); dec / 2 = 3 a suffixed one. also_half's own
  // `half` has size 4 too and shares the IR dim.
  CHECK(a.module->dims.at("half") == 4);
  CHECK(a.module->dims.at("half_3") == 3);
  CHECK(a.module->dims.size() == 6);
  const ir::Function& fn = a.fn("p");
  std::vector<int64_t> starts;
  for (const ir::Op& op : fn.ops)
    if (op.kind == OpKind::Slice) starts.push_back(op.integer("start", -1));
  CHECK(starts == std::vector<int64_t>{0, 4, 4, 0, 3, 0, 3});
  const ir::Op& pad = firstOp(fn, OpKind::Pad);
  CHECK(pad.integer("before", -1) == 4);
}

TEST_CASE("sema reports bad local dims") {
  Analyzed a(generic(R"(
def f[S](x: f32[S]) -> f32[S] {
  dim third = size(S) / 4
  dim zero = size(S) - size(S)
  dim batch = 2
  dim S = 4
  dim from_value = x
  repeat 2 { dim inner = 2 }
  return x
}
program p(x: f32[dec]) -> (y: f32[dec]) { y = f(x) }
)"));
  CHECK(a.reported("dim 'third' must have a positive integer size, not 1.5"));
  CHECK(a.reported("dim 'zero' must have a positive integer size, not 0"));
  CHECK(a.reported("redefinition of dim 'batch'"));
  CHECK(a.reported("redefinition of dim 'S'"));
  CHECK(a.reported("the size of dim 'from_value' must be a constant, and 'x' is not"));
  CHECK(a.reported("a dim may be declared at the top level of a def, program or train body, not "
                   "inside 'repeat'"));
  INFO(a.errors);
}

TEST_CASE("sema evaluates constant keyword arguments") {
  Analyzed a(generic(R"(
program p(x: f32[batch, enc]) -> (y: f32[batch, enc], z: f32[batch, enc]) {
  param w: f32[enc] = normal(stddev = rsqrt(size(enc)) * 2, mean = -(1 + 2 ** 2))
  y = layer_norm(shift(x, enc, by = size(enc) / 4 - 1), enc, eps = exp(log(1e-6)))
  z = x * size(dec) + w
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("p");
  REQUIRE(fn.params.size() == 1);
  CHECK(fn.params[0].init.arg("stddev", 0) == Approx(2 / std::sqrt(8.0)));
  CHECK(fn.params[0].init.arg("mean", 0) == -5);
  CHECK(firstOp(fn, OpKind::Shift).integer("offset", 0) == 1);
  CHECK(firstOp(fn, OpKind::LayerNorm).number("eps", 0) == Approx(1e-6));
  const ir::Op& mul = firstOp(fn, OpKind::Mul);
  CHECK(fn.definingOp(mul.operands[1]).number("value", 0) == 6);

  Analyzed bad(generic(R"(
program p(x: f32[batch, enc]) -> (y: f32[batch, enc]) {
  y = shift(x, enc, by = size(enc) / 3)
  y = layer_norm(x, enc, eps = sum(x))
  y = layer_norm(x, enc, eps = log(0))
  y = layer_norm(x, enc, eps = size(nope))
}
)"));
  CHECK(bad.reported("keyword argument 'by' of 'shift' must be an integer constant"));
  CHECK(bad.reported(
      "keyword argument 'eps' of 'layer_norm' must be a constant, and the call of 'sum' "
      "is not"));
  CHECK(bad.reported("keyword argument 'eps' of 'layer_norm' must be a finite constant"));
  CHECK(bad.reported("unknown dim 'nope'"));
  CHECK(bad.diag.errorCount() == 4);
  INFO(bad.errors);
}

TEST_CASE("a generic encoder-decoder computes what its hand-duplicated twin computes") {
  auto load = [](const std::string& path, Analyzed& into) {
    std::optional<SourceSet> set = loadSources(path, into.diag);
    if (set) into.module = analyze(*set, into.diag, {});
    into.errorStream.flush();
  };
  Analyzed genericModel(""), duplicated("");
  load(MESHC_SOURCE_DIR "/tests/golden/generic.mesh", genericModel);
  load(MESHC_SOURCE_DIR "/tests/golden/inputs/generic_duplicated.mesh", duplicated);
  INFO(genericModel.errors << duplicated.errors);
  const ir::Function& g = genericModel.fn("t5");
  const ir::Function& d = duplicated.fn("t5");
  // The same params in the same order (paths differ: rms#2 vs rms_enc#1); the twin reads the
  // generic model's values.
  REQUIRE(g.params.size() == d.params.size());
  interp::TensorMap gParams, dParams;
  for (size_t i = 0; i < g.params.size(); ++i) {
    REQUIRE(g.params[i].type == d.params[i].type);
    interp::Tensor value = interp::initializeParam(g.params[i], 7);
    gParams[g.params[i].path] = value;
    dParams[d.params[i].path] = value;
  }
  interp::TensorMap inputs;
  for (const ir::InputInfo& input : g.inputs)
    inputs[input.name] = interp::synthesizeInput(input, 7);
  interp::Options options;
  options.seed = 7;
  auto gOut = interp::run(g, inputs, options, gParams);
  auto dOut = interp::run(d, inputs, options, dParams);
  if (!gOut) FAIL(llvm::toString(gOut.takeError()));
  if (!dOut) FAIL(llvm::toString(dOut.takeError()));
  const interp::Tensor& gy = gOut->at("y");
  const interp::Tensor& dy = dOut->at("y");
  REQUIRE(gy.type == dy.type);
  REQUIRE(gy.data.size() == 2 * 4 * 8);
  double largest = 0;
  for (size_t i = 0; i < gy.data.size(); ++i) {
    CHECK(gy.data[i] == Approx(dy.data[i]).margin(1e-6));
    largest = std::max(largest, std::fabs(gy.data[i]));
  }
  CHECK(largest > 0.1); // not a trivially zero output
}

TEST_CASE("sema passes dim bindings through nested generic calls and keeps local dims local") {
  Analyzed a(generic(R"(
def scale[S](x: f32[batch, S]) -> f32[batch, S] { return x * size(S) }
def twice[L](x: f32[batch, L]) -> f32[batch, L] {
  dim pair = 2
  let h = x
  repeat L { h = scale(h) }
  let two = concat(x, x, along = [L, L] -> wide)
  return h
}
dim wide = 16
program p(x: f32[batch, enc]) -> (y: f32[batch, enc]) { y = twice(x) }
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("p");
  size_t muls = std::count_if(fn.ops.begin(), fn.ops.end(),
                              [](const ir::Op& op) { return op.kind == OpKind::Mul; });
  CHECK(muls == 8); // repeat L: size(enc) = 8 inlined calls of scale, each scaling by 8
  CHECK(firstOp(fn, OpKind::Concat).dims("from") == Strings{"enc", "enc"});
  CHECK(a.module->dims.at("pair") == 2);

  Analyzed b(generic(R"(
def f[S, S](x: f32[S]) -> f32[S] { return x }
def g[L](x: f32[L]) -> f32[L] {
  dim half = size(L) / 2
  return x
}
def h(x: f32[half]) -> f32[half] { return x }
program p(x: f32[enc]) -> (y: f32[enc]) {
  y = g(f(x))
  let n = size(L)
  dim quarter = 2
  let q = cast(iota(quarter), f32)
  let r = k(q)
}
def k(x: f32[quarter]) -> f32[quarter] { return x }
)"));
  INFO(b.errors);
  CHECK(b.reported("redefinition of dim parameter 'S'"));
  CHECK(b.reported("t.mesh:12:14: error: unknown dim 'half'"));
  CHECK(b.reported("t.mesh:15:16: error: unknown dim 'L'"));
  CHECK_FALSE(b.reported("not bound by the argument types")); // f(x) failed: no cascade
  // The caller's local dim is not visible in the signature of the def it calls.
  CHECK(b.reported("t.mesh:20:14: error: unknown dim 'quarter'"));
  CHECK(b.diag.errorCount() == 6);
}

TEST_CASE("sema shares the params of a shared repeat across its iterations") {
  Analyzed a(withHeader(R"(
def layer(x: f32[batch, d_model]) -> f32[batch, d_model] {
  param w: f32[d_model] = ones()
  return dropout(x * w, rate = 0.5)
}
program p(x: f32[batch, d_model]) -> (y: f32[batch, d_model]) {
  let h = layer(x)
  repeat 3 shared {
    h = layer(h)
    param b: f32[d_model] = zeros()
    h = h + b
  }
  repeat 2 shared { repeat 2 { h = layer(h) } }
  y = layer(h)
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("p");
  // One param per call site: the shared repeat's iterations are one call site (`layer#1`); a
  // repeat nested in a shared one still has per-iteration params, named as any repeat's.
  CHECK(paramPaths(fn) ==
        Strings{"layer/w", "layer#1/w", "b", "layer[0]/w", "layer[1]/w", "layer#2/w"});
  size_t paramOps = 0;
  for (const ir::Op& op : fn.ops)
    paramOps += op.kind == OpKind::Param;
  CHECK(paramOps == fn.params.size());
  // Random streams still differ per iteration.
  std::set<std::string> streams;
  size_t dropouts = 0;
  for (const ir::Op& op : fn.ops)
    if (op.kind == OpKind::Dropout) {
      streams.insert(op.string("stream"));
      ++dropouts;
    }
  CHECK(dropouts == 1 + 3 + 4 + 1);
  CHECK(streams.size() == dropouts);
  // Every iteration reads the one param op.
  const ir::ParamInfo& shared = fn.params[1];
  size_t reads = 0;
  for (const ir::Op& op : fn.ops)
    reads += std::count(op.operands.begin(), op.operands.end(), shared.value);
  CHECK(reads == 3);
}

TEST_CASE("sema ties params named by 'as' and reads a reordered declaration transposed") {
  Analyzed a(withHeader(R"(
def embed(ids: i32[batch, seq]) -> f32[batch, seq, d_model] {
  param table: f32[vocab, d_model] = normal(stddev = 0.02) as "shared/embedding"
  return gather(table, ids, vocab)
}
def unembed(h: f32[batch, seq, d_model]) -> f32[batch, seq, vocab] {
  param table: f32[d_model, vocab] = normal(stddev = 0.02) as "shared/embedding"
  return einsum(h, table -> batch, seq, vocab)
}
program p(ids: i32[batch, seq]) -> (y: f32[batch, seq, vocab]) { y = unembed(embed(ids)) }
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("p");
  REQUIRE(paramPaths(fn) == Strings{"shared/embedding"});
  CHECK(dimNames(fn.params[0].type) == Strings{"vocab", "d_model"});
  const ir::Op* transpose = nullptr;
  for (const ir::Op& op : fn.ops)
    if (op.kind == OpKind::Transpose && op.operands == std::vector<ir::ValueId>{fn.params[0].value})
      transpose = &op;
  REQUIRE(transpose);
  CHECK(dimNames(fn.typeOf(transpose->result)) == Strings{"d_model", "vocab"});
}

TEST_CASE("sema reports conflicting declarations of one param path at both places") {
  SECTION("two tied declarations") {
    Analyzed a(withHeader(R"(
def f(x: f32[d_model]) -> f32[d_model] {
  param w: f32[d_model] = ones() as "w"
  return x * w
}
program p(x: f32[d_model]) -> (y: f32[d_model]) {
  param v: f32[d_ff] = ones() as "w"
  y = f(x) + sum(v)
}
)"));
    CHECK_FALSE(a.module);
    // The program's own declaration comes first; the def's, inlined after it, is the conflict.
    CHECK(a.reported("t.mesh:12:9: error: param 'w' is declared as f32[d_model] = ones() here but "
                     "as f32[d_ff] = ones() elsewhere"));
    CHECK(a.reported("t.mesh:16:9: note: param 'w' is declared here as f32[d_ff] = ones()"));
  }
  SECTION("a program and a train block") {
    Analyzed a(withHeader(R"(
program p(x: f32[d_model]) -> (y: f32[d_model]) {
  param w: f32[d_model] = normal(stddev = 0.1)
  y = x * w
}
train t(x: f32[d_model]) {
  param w: f32[d_model] = normal(stddev = 0.2)
  minimize mean(x * w) with sgd(lr = 0.1)
}
)"));
    CHECK_FALSE(a.module);
    CHECK(a.reported("t.mesh:16:9: error: param 'w' is declared as f32[d_model] = normal(mean = "
                     "0, stddev = 0.2) here but as f32[d_model] = normal(mean = 0, stddev = 0.1) "
                     "elsewhere"));
    CHECK(a.reported("t.mesh:12:9: note: param 'w' is declared here as"));
  }
  SECTION("the same param in another dim order across functions") {
    Analyzed a(withHeader(R"(
program p(x: f32[d_model, d_ff]) -> (y: f32[d_model, d_ff]) {
  param w: f32[d_model, d_ff] = ones()
  y = x * w
}
train t(x: f32[d_model, d_ff]) {
  param w: f32[d_ff, d_model] = ones()
  minimize mean(x * w) with sgd(lr = 0.1)
}
)"));
    CHECK(a.reported("param 'w' is declared as f32[d_ff, d_model] = ones() here but as "
                     "f32[d_model, d_ff] = ones() elsewhere"));
  }
  SECTION("agreeing declarations are one param") {
    Analyzed a(withHeader(R"(
program p(x: f32[d_model]) -> (y: f32[d_model]) {
  param w: f32[d_model] = ones()
  y = x * w
}
train t(x: f32[d_model]) {
  param w: f32[d_model] = ones()
  minimize mean(x * w) with sgd(lr = 0.1)
}
)"));
    INFO(a.errors);
    CHECK(a.module);
  }
}

TEST_CASE("sema binds several results and drops the ops of discarded ones") {
  const char* defs = R"(
def two(x: f32[batch, d_model]) -> (a: f32[batch, d_model], b: f32[batch]) {
  param w: f32[d_model] = ones()
  let scaled = x * w
  return tanh(scaled), sum(exp(scaled), d_model)
}
def one(x: f32[batch, d_model]) -> f32[batch, d_model] {
  param w: f32[d_model] = ones()
  let scaled = x * w
  return tanh(scaled)
}
)";
  Analyzed both(withHeader(std::string(defs) + R"(
program p(x: f32[batch, d_model]) -> (y: f32[batch, d_model], s: f32[batch]) {
  y, s = two(x)
}
)"));
  INFO(both.errors);
  const ir::Function& fn = both.fn("p");
  REQUIRE(fn.outputs.size() == 2);
  CHECK(fn.definingOp(fn.outputs[0].value).kind == OpKind::Tanh);
  CHECK(fn.definingOp(fn.outputs[1].value).kind == OpKind::ReduceSum);

  Analyzed discarded(withHeader(std::string(defs) + R"(
program p(x: f32[batch, d_model]) -> (y: f32[batch, d_model]) {
  let t, _ = two(x)
  y = t
}
)"));
  Analyzed single(withHeader(std::string(defs) + R"(
program p(x: f32[batch, d_model]) -> (y: f32[batch, d_model]) {
  let t = one(x)
  y = t
}
)"));
  INFO(discarded.errors);
  const ir::Function& kept = discarded.fn("p");
  CHECK(kinds(kept) == kinds(single.fn("p")));
  CHECK(paramPaths(kept) == Strings{"two/w"});
  CHECK(kept.params[0].value < kept.values.size());
  CHECK(kept.definingOp(kept.params[0].value).kind == OpKind::Param);
  for (size_t i = 0; i < kept.values.size(); ++i)
    CHECK(kept.ops[kept.values[i].definingOp].result == i);
}

TEST_CASE("sema checks the count and types of several results") {
  Analyzed a(withHeader(R"(
def two(x: f32[batch]) -> (a: f32[batch], b: f32[]) {
  return x, x
}
def short(x: f32[batch]) -> (a: f32[batch], b: f32[]) {
  return x
}
program p(x: f32[batch]) -> (y: f32[batch]) {
  let a, b, c = two(x)
  let d = two(x) * 2.0
  let e, f = short(x)
  let g, h = exp(x)
  let i, j = two(x)
  y = x
}
)"));
  CHECK(a.reported("t.mesh:12:13: error: def 'two' returns f32[] but the returned value has type "
                   "f32[batch]"));
  CHECK(a.reported("t.mesh:15:3: error: def 'short' has 2 results but 'return' gives 1"));
  CHECK(a.reported("t.mesh:18:17: error: def 'two' returns 2 results but 3 names are bound"));
  CHECK(a.reported("t.mesh:19:11: error: def 'two' returns 2 results: bind them with 'let a, b "
                   "= two(...)'"));
  CHECK(a.reported("t.mesh:21:14: error: 'exp' returns 1 value but 2 names are bound"));
}

TEST_CASE("sema returns a train block's metrics after the loss") {
  Analyzed a(withHeader(R"(
train t(x: f32[batch, d_model]) -> (accuracy: f32[], mean_x: f32[]) {
  param w: f32[d_model] = ones()
  accuracy = mean(cast(x * w > 0.0, f32))
  mean_x = mean(x)
  minimize mean(square(x * w)) with sgd(lr = 0.1)
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("t");
  REQUIRE(fn.outputs.size() == 3);
  CHECK(fn.outputs[0].name == "loss");
  CHECK(fn.outputs[1].name == "accuracy");
  CHECK(fn.outputs[2].name == "mean_x");
  CHECK(fn.definingOp(fn.outputs[2].value).kind == OpKind::ReduceMean);

  Analyzed bad(withHeader(R"(
train t(x: f32[batch, d_model]) -> (per_row: f32[batch], loss: f32[], unset: f32[]) {
  param w: f32[d_model] = ones()
  per_row = mean(x, d_model)
  loss = mean(x)
  minimize mean(square(x * w)) with sgd(lr = 0.1)
}
)"));
  CHECK(bad.reported("t.mesh:11:46: error: metric 'per_row' must be an f32 scalar (f32[]), not "
                     "f32[batch]"));
  CHECK(bad.reported("t.mesh:11:58: error: a metric cannot be named 'loss'"));
  CHECK(bad.reported("t.mesh:11:71: error: output 'unset' is never set"));
}

TEST_CASE("sema lowers step state: call-path names, old values on reads, one update per write") {
  Analyzed a(withHeader(R"(
def cell(x: f32[batch, d_model]) -> f32[batch, d_model] {
  state memory: f32[batch, d_model] = zeros()
  next memory = x
  return x + memory
}
def probe(x: f32[batch, d_model]) -> (y: f32[batch, d_model], s: f32[]) {
  state calls: f32[] = zeros()
  next calls = calls + 1.0
  return x, calls
}
train t(x: f32[batch, d_model]) {
  param w: f32[d_model] = ones()
  let h = x * w
  repeat 2 {
    h = cell(h)
  }
  let g, _ = probe(h)
  minimize mean(square(g)) with sgd(lr = 0.1)
}
)"));
  INFO(a.errors);
  const ir::Function& fn = a.fn("t");
  std::vector<std::string> states;
  for (const ir::ParamInfo& param : fn.params)
    if (param.role == ir::ParamRole::StepState) {
      states.push_back(param.path);
      CHECK_FALSE(param.trainable);
    }
  CHECK(states == std::vector<std::string>{"cell[0]/memory", "cell[1]/memory", "probe/calls"});
  // Sema adds one update per write; each is the value written (the discarded result `s` does
  // not drop the counter's write).
  REQUIRE(fn.updates.size() == 3);
  for (const ir::ParamUpdate& update : fn.updates) {
    const ir::ParamInfo& param = fn.params[update.param];
    CHECK(param.role == ir::ParamRole::StepState);
    CHECK(fn.typeOf(update.value) == param.type);
  }
  // cell[1]'s memory is written with cell[0]'s result, which read cell[0]'s memory.
  const ir::Op& written = fn.definingOp(fn.updates[1].value);
  CHECK(written.kind == OpKind::Add);
  CHECK(fn.definingOp(fn.updates[2].value).kind == OpKind::Add); // calls + 1.0
  CHECK_FALSE(ir::hasOptimizerUpdates(fn));
}

TEST_CASE("sema reports misuse of step state") {
  SECTION("in a program") {
    Analyzed a(withHeader(R"(
program p(x: f32[batch, d_model]) -> (y: f32[batch, d_model]) {
  state cache: f32[batch, d_model] = zeros()
  next cache = x
  y = x + cache
}
)"));
    CHECK_FALSE(a.module);
    CHECK(a.reported("t.mesh:12:9: error: state 'cache' is declared outside a train block"));
  }
  SECTION("written twice, with a wrong type, never, or assigned") {
    Analyzed a(withHeader(R"(
train t(x: f32[batch, d_model]) {
  param w: f32[d_model] = ones()
  state a: f32[d_model] = zeros()
  state b: f32[d_model] = zeros()
  state c: f32[d_model] = zeros()
  state e: f32[d_model] = zeros()
  next a = w
  next a = w * 2.0
  next b = x
  e = w
  let z = w
  next z = w
  next e = e
  minimize mean(x * w) with sgd(lr = 0.1)
}
)"));
    CHECK_FALSE(a.module);
    CHECK(a.reported("t.mesh:18:8: error: state 'a' is written twice in one step"));
    CHECK(a.reported("t.mesh:17:8: note: state 'a' is first written here"));
    CHECK(a.reported("t.mesh:19:12: error: the next value of state 'b' must have type "
                     "f32[d_model] but has type f32[batch, d_model]"));
    CHECK(a.reported("t.mesh:15:9: error: state 'c' is never written"));
    CHECK(a.reported("t.mesh:20:3: error: cannot assign to state 'e'"));
    CHECK(a.reported("t.mesh:22:8: error: 'next' sets a step state, but 'z' is a let"));
  }
  SECTION("a state and a param of one path") {
    Analyzed a(withHeader(R"(
def f(x: f32[d_model]) -> f32[d_model] {
  param w: f32[d_model] = zeros() as "shared"
  return x * w
}
train t(x: f32[d_model]) {
  state s: f32[d_model] = zeros() as "shared"
  next s = x
  minimize mean(f(x) + s) with sgd(lr = 0.1)
}
)"));
    CHECK_FALSE(a.module);
    CHECK(a.reported("error: param 'shared' is declared as f32[d_model] = zeros() here but as "
                     "state f32[d_model] = zeros() elsewhere"));
  }
  SECTION("a shared repeat has one state, so its iterations write it twice") {
    Analyzed a(withHeader(R"(
def cell(x: f32[d_model]) -> f32[d_model] {
  state m: f32[d_model] = zeros()
  next m = x
  return x + m
}
train t(x: f32[d_model]) {
  param w: f32[d_model] = ones()
  let h = x * w
  repeat 2 shared {
    h = cell(h)
  }
  minimize mean(h) with sgd(lr = 0.1)
}
)"));
    CHECK_FALSE(a.module);
    CHECK(a.reported("t.mesh:13:8: error: state 'm' is written twice in one step"));
  }
}
