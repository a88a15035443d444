// The named-dim IR's data structures and its printed form.
#include "ir/IR.h"
#include "ir/IRParser.h"
#include "ir/IRPrinter.h"

#include <catch2/catch.hpp>

using namespace meshc::ir;

namespace {

TensorType f32(std::vector<Dim> dims) {
  return TensorType{DType::F32, std::move(dims)};
}

const Dim batch{"batch", 4}, dModel{"d_model", 8}, dFf{"d_ff", 16};

} // namespace

TEST_CASE("TensorType counts elements and finds dims by name", "[ir]") {
  TensorType t = f32({batch, dModel});
  CHECK(t.numElements() == 32);
  CHECK(t.findDim("d_model") == 1);
  CHECK(t.findDim("d_ff") == -1);
  CHECK(t.hasDim("batch"));
  CHECK(TensorType{DType::I32, {}}.numElements() == 1);
  CHECK(t != f32({dModel, batch})); // order is part of the storage type
}

TEST_CASE("Op attributes convert between numbers and keep their order", "[ir]") {
  Op op{OpKind::LayerNorm, {}, 0, {}, {}};
  op.setAttr("dims", std::vector<std::string>{"d_model"});
  op.setAttr("eps", 1e-5);
  op.setAttr("start", int64_t{3});
  CHECK(op.number("eps") == 1e-5);
  CHECK(op.integer("start") == 3);
  CHECK(op.number("start") == 3.0);
  CHECK(op.number("missing", 7.0) == 7.0);
  CHECK(op.dims("dims") == std::vector<std::string>{"d_model"});
  op.setAttr("eps", 1e-6); // overwrites in place
  CHECK(op.attrs.size() == 3);
  CHECK(op.attrs[1].first == "eps");
  CHECK(op.number("eps") == 1e-6);
  op.setAttr("dim", std::string("seq"));
  CHECK(op.string("dim") == "seq");
  CHECK(op.dims("dim") == std::vector<std::string>{"seq"}); // a single dim reads as a list
}

TEST_CASE("Every op kind has a spelling and a description", "[ir]") {
  CHECK(std::string(opSpelling(OpKind::Einsum)) == "einsum");
  CHECK(std::string(opSpelling(OpKind::LogSoftmax)) == "log_softmax");
  for (int k = 0; k <= static_cast<int>(OpKind::Dropout); ++k) {
    CHECK(std::string(opSpelling(static_cast<OpKind>(k))).size() > 0);
    CHECK(std::string(opDescription(static_cast<OpKind>(k))).size() > 0);
  }
}

TEST_CASE("A hand-built function prints in the --emit=ir form", "[ir]") {
  Module module;
  module.meshName = "grid";
  module.mesh = {{"data", 2}, {"model", 2}};
  module.dims = {{"batch", 4}, {"d_model", 8}, {"d_ff", 16}};
  module.layout = {DimLayout{"batch", {"data"}, false, {}}, DimLayout{"d_ff", {}, true, {}}};
  Function& fn = module.functions.emplace_back();
  fn.name = "mlp";
  Location loc{{}, "mlp.mesh", 3, 5};
  Op input{OpKind::Input, {}, 0, {{"name", std::string("x")}, {"index", int64_t{0}}}, loc};
  ValueId x = fn.addOp(input, f32({batch, dModel}), "x");
  fn.inputs.push_back(InputInfo{"x", f32({batch, dModel}), 0, loc, x});
  ParamInfo w{"ffn/w_in",
              f32({dModel, dFf}),
              Initializer{"normal", {{"mean", 0}, {"stddev", 0.02}}},
              true,
              loc,
              0};
  w.value = fn.addOp(Op{OpKind::Param, {}, 0, {{"path", std::string("ffn/w_in")}}, loc}, w.type);
  fn.params.push_back(w);
  ValueId h = fn.addOp(Op{OpKind::Einsum, {x, w.value}, 0, {}, loc}, f32({batch, dFf}), "h");
  ValueId r = fn.addOp(Op{OpKind::Relu, {h}, 0, {}, loc}, f32({batch, dFf}));
  fn.outputs.push_back(OutputInfo{"y", r, loc});
  CHECK(fn.definingOp(h).kind == OpKind::Einsum);
  CHECK(fn.typeOf(r).dims.back().name == "d_ff");

  std::string text;
  llvm::raw_string_ostream os(text);
  printModule(module, os);
  const char* expected = R"(mesh grid[data = 2, model = 2]
dim batch = 4
dim d_ff = 16
dim d_model = 8
layout batch: [data], d_ff: auto

program mlp(x: f32[batch, d_model]) -> (y: f32[batch, d_ff]) {
  param ffn/w_in: f32[d_model, d_ff] = normal(mean = 0.0, stddev = 0.02)  // mlp.mesh:3:5
  %0 = input {name = "x", index = 0} : f32[batch, d_model]              // x mlp.mesh:3:5
  %1 = param {path = "ffn/w_in"} : f32[d_model, d_ff]                   // mlp.mesh:3:5
  %2 = einsum %0, %1 : f32[batch, d_ff]                                 // h mlp.mesh:3:5
  %3 = relu %2 : f32[batch, d_ff]                                       // mlp.mesh:3:5
  return y = %3
}
)";
  CHECK(os.str() == expected);
}

TEST_CASE("Printed IR parses back to the same text", "[ir][parser]") {
  const char* text = R"(mesh grid[data = 2, model = 2]
dim batch = 4
dim d_ff = 16
dim d_model = 8
dim vocab = 10
layout batch: [data], d_ff: [model, data], d_model: [], vocab: auto, auto

program mlp(x: f32[batch, d_model], ids: i32[batch] < 10) -> (y: f32[batch, d_ff]) {
  param block[1]/ffn#1/w_in: f32[d_model, d_ff] = normal(mean = 0.0, stddev = 0.02)  // mlp.mesh:3:5
  const w: f32[d_ff] = orthogonal(scale = 1.0)  // mlp.mesh:4:5
  %0 = input {name = "x", index = 0} : f32[batch, d_model]              // x mlp.mesh:3:5
  %1 = input {name = "ids", index = 1} : i32[batch]                     // ids mlp.mesh:3:5
  %2 = param {path = "block[1]/ffn#1/w_in"} : f32[d_model, d_ff]        // mlp.mesh:3:5
  %3 = einsum %0, %2 : f32[batch, d_ff]                                 // h mlp.mesh:3:5
  %4 = layer_norm %3 {dims = [d_ff], eps = 1e-05} : f32[batch, d_ff]    // mlp.mesh:6:7
  %5 = slice %4 {from = "d_ff", to = "d_ff", start = 0} : f32[batch, d_ff] // mlp.mesh:6:7
  %6 = literal {value = -inf} : f32[]                                   // mlp.mesh:6:7
  return y = %5
}

train t(x: f32[batch]) {
  %0 = input {name = "x", index = 0} : f32[batch]                       // x t.mesh:1:1
  %1 = sum %0 {dims = [batch]} : f32[]                                  // t.mesh:1:2
  minimize %1 with adamw {lr = 0.001, schedule = "cosine"}  // t.mesh:2:3
  return loss = %1
}
)";
  llvm::Expected<Module> module = parseModule(text, "test.ir");
  REQUIRE(static_cast<bool>(module));
  std::string printed;
  llvm::raw_string_ostream os(printed);
  printModule(*module, os);
  CHECK(os.str() == text);
  const Function& fn = module->functions[0];
  CHECK(fn.inputs[1].indexBound == 10);
  CHECK(fn.params[0].value == 2);
  CHECK(fn.ops[4].number("eps") == 1e-5);
  CHECK(fn.ops[5].integer("start") == 0);
  CHECK(std::holds_alternative<double>(*fn.ops[4].attr("eps")));
  CHECK(module->functions[1].train->optimizer == "adamw");
}

TEST_CASE("Malformed IR is an error with its line and column", "[ir][parser]") {
  auto message = [](const char* text) {
    llvm::Expected<Module> module = parseModule(text, "bad.ir");
    REQUIRE(!module);
    return llvm::toString(module.takeError());
  };
  CHECK(message("dim a = x\n") == "bad.ir:1:9: expected an integer, found 'x'");
  CHECK(message("dim a = 2\nprogram p(x: f32[b]) -> () {\n}\n") ==
        "bad.ir:2:20: undeclared dim 'b'");
  CHECK(message("dim a = 2\nprogram p() -> (y: f32[a]) {\n  %0 = frob : f32[a]\n}\n") ==
        "bad.ir:3:8: unknown op 'frob'");
  CHECK(message("dim a = 2\nprogram p() {\n  %0 = neg %3 : f32[a]\n}\n") ==
        "bad.ir:3:12: use of undefined value %3");
  CHECK(message("banana\n") == "bad.ir:1:1: expected mesh, dim, layout, program or train");
}

TEST_CASE("Trained IR round-trips: state params, step, broadcast, call and updates",
          "[ir][parser]") {
  const char* text = R"(dim batch = 4
dim d = 3

train t(x: f32[batch, d]) {
  param w: f32[d] = normal(stddev = 0.1)  // t.mesh:2:3
  state w@m: f32[d] = zeros()  // t.mesh:2:3
  %0 = input {name = "x", index = 0} : f32[batch, d]                    // x t.mesh:1:1
  %1 = param {path = "w"} : f32[d]                                      // w t.mesh:2:3
  %2 = param {path = "w@m"} : f32[d]                                    // t.mesh:2:3
  %3 = broadcast %1 : f32[batch, d]                                     // t.mesh:3:3
  %4 = call %0, %3 {function = "my_fn", header = "my.h"} : f32[batch, d] // t.mesh:3:3
  %5 = sum %4 {dims = [batch, d]} : f32[]                               // t.mesh:3:3
  %6 = step : f32[]                                                     // t.mesh:4:3
  %7 = add %2, %6 : f32[d]                                              // t.mesh:4:3
  %8 = sub %1, %7 : f32[d]                                              // t.mesh:4:3
  minimize %5 with sgd {lr = 0.1}  // t.mesh:4:3
  update w = %8
  update w@m = %7
  return loss = %5
}
)";
  llvm::Expected<Module> module = parseModule(text, "trained.ir");
  if (!module) FAIL(llvm::toString(module.takeError()));
  std::string printed;
  llvm::raw_string_ostream os(printed);
  printModule(*module, os);
  CHECK(os.str() == text);
  const Function& fn = module->functions[0];
  REQUIRE(fn.params.size() == 2);
  CHECK(fn.params[0].role == ParamRole::Weight);
  CHECK(fn.params[1].role == ParamRole::OptimizerState);
  CHECK_FALSE(fn.params[1].trainable);
  CHECK(fn.params[1].value == 2);
  REQUIRE(fn.updates.size() == 2);
  CHECK(fn.updates[0].param == 0);
  CHECK(fn.updates[0].value == 8);
  CHECK(fn.updates[1].param == 1);
  CHECK(fn.ops[6].kind == OpKind::TrainStep);
  CHECK(fn.ops[3].kind == OpKind::Broadcast);
  CHECK(fn.ops[4].kind == OpKind::Call);

  for (const char* bad : {"update nope = %8", "update w = %99", "update w = %5"}) {
    std::string source = text;
    source.replace(source.find("update w = %8"), 13, bad);
    llvm::Expected<Module> broken = parseModule(source, "bad.ir");
    INFO(bad);
    CHECK_FALSE(static_cast<bool>(broken));
    if (!broken) llvm::consumeError(broken.takeError());
  }
}
