// The parser: every declaration, statement and expression form of docs/language.md, operator
// precedence, locations, and error recovery (several errors per run, no endless loops).
#include "frontend/Parser.h"
#include "frontend/ASTPrinter.h"
#include "frontend/SourceLoader.h"

#include <catch2/catch.hpp>
#include <llvm/Support/Casting.h>
#include <llvm/Support/MemoryBuffer.h>

using namespace meshc;
using namespace meshc::ast;
using llvm::cast;
using llvm::isa;

namespace {

struct Parsed {
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream errorStream{errors};
  DiagEngine diag{sources, errorStream};
  std::unique_ptr<File> file;

  explicit Parsed(llvm::StringRef text) {
    unsigned id =
        sources.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy(text, "p.mesh"), {});
    file = parseFile(id, diag);
    errorStream.flush();
  }
  std::string at(Loc loc) const {
    auto [line, col] = sources.getLineAndColumn(loc);
    return std::to_string(line) + ":" + std::to_string(col);
  }
  bool reported(llvm::StringRef message) const {
    return errors.find(message.str()) != std::string::npos;
  }
  template <typename T> const T& decl(size_t i) const {
    REQUIRE(i < file->decls.size());
    REQUIRE(isa<T>(*file->decls[i]));
    return cast<T>(*file->decls[i]);
  }
};

/// Parses `program p() -> (y: f32[]) { y = <expr> }` and returns the expression.
struct ParsedExpr : Parsed {
  explicit ParsedExpr(const std::string& expr)
      : Parsed("program p() -> (y: f32[]) {\n  y = " + expr + "\n}") {}
  const Expr& expr() const {
    const auto& program = decl<ProgramDecl>(0);
    REQUIRE(program.body.size() == 1);
    return *cast<AssignStmt>(*program.body[0]).value;
  }
};

/// A compact rendering of an expression for precedence checks: (a + (b * c)).
std::string render(const Expr& expr) {
  switch (expr.kind) {
  case Expr::Kind::Number: {
    const auto& number = cast<NumberExpr>(expr);
    return number.isInteger ? std::to_string(static_cast<int64_t>(number.value))
                            : fmt::format("{}", number.value);
  }
  case Expr::Kind::Name:
    return cast<NameExpr>(expr).name;
  case Expr::Kind::Unary:
    return "(-" + render(*cast<UnaryExpr>(expr).operand) + ")";
  case Expr::Kind::Binary: {
    const auto& binary = cast<BinaryExpr>(expr);
    static const char* ops[] = {"+", "-", "*", "/", "**", "<", "<=", ">", ">=", "==", "!=", "%"};
    return "(" + render(*binary.lhs) + " " + ops[static_cast<int>(binary.op)] + " " +
           render(*binary.rhs) + ")";
  }
  case Expr::Kind::Call: {
    const auto& call = cast<CallExpr>(expr);
    std::string text = call.callee.name;
    if (call.hasDimArgs) {
      text += "[";
      for (size_t i = 0; i < call.dimArgs.size(); ++i)
        text += (i ? "," : "") + call.dimArgs[i].name;
      text += "]";
    }
    text += "(";
    const char* sep = "";
    for (const ExprPtr& arg : call.args) {
      text += sep + render(*arg);
      sep = ", ";
    }
    if (call.hasArrow) {
      text += " ->";
      for (const Ident& dim : call.arrowDims)
        text += " " + dim.name;
      sep = ", ";
    }
    for (const KeywordArg& kwarg : call.kwargs) {
      text += sep + kwarg.name.name + "=" + render(*kwarg.value);
      sep = ", ";
    }
    return text + ")";
  }
  case Expr::Kind::List: {
    std::string text = "[";
    const char* sep = "";
    for (const ExprPtr& element : cast<ListExpr>(expr).elements) {
      text += sep + render(*element);
      sep = ", ";
    }
    return text + "]";
  }
  case Expr::Kind::Type: {
    const TypeSpec& type = cast<TypeExpr>(expr).type;
    std::string text = dtypeName(type.dtype);
    if (type.hasShape) {
      text += "[";
      const char* sep = "";
      for (const Ident& dim : type.dims) {
        text += sep + dim.name;
        sep = ",";
      }
      text += "]";
    }
    return text;
  }
  }
  return "?";
}

std::string renderExpr(const std::string& text) {
  ParsedExpr parsed(text);
  INFO(parsed.errors);
  REQUIRE(parsed.errors.empty());
  return render(parsed.expr());
}

} // namespace

TEST_CASE("import, mesh and dim declarations", "[parser]") {
  Parsed parsed("import \"lib/common.mesh\"\nmesh m[data = 2, model = 4]\ndim batch = 8");
  REQUIRE(parsed.errors.empty());
  REQUIRE(parsed.file->decls.size() == 3);
  const auto& import = parsed.decl<ImportDecl>(0);
  CHECK(import.path == "lib/common.mesh");
  CHECK(parsed.at(import.loc) == "1:1");
  CHECK(parsed.at(import.pathLoc) == "1:8");
  const auto& mesh = parsed.decl<MeshDecl>(1);
  CHECK(mesh.name.name == "m");
  REQUIRE(mesh.axes.size() == 2);
  CHECK(mesh.axes[0].name.name == "data");
  CHECK(mesh.axes[0].size == 2);
  CHECK(mesh.axes[1].name.name == "model");
  CHECK(mesh.axes[1].size == 4);
  CHECK(parsed.at(mesh.axes[1].sizeLoc) == "2:26");
  const auto& dim = parsed.decl<DimDecl>(2);
  CHECK(dim.name.name == "batch");
  CHECK(dim.size == 8);
  CHECK(parsed.at(dim.loc) == "3:1");
  CHECK(parsed.at(dim.name.loc) == "3:5");
}

TEST_CASE("layout items", "[parser]") {
  Parsed parsed("layout batch: data, heads: [data, model], d: [], e: auto, auto");
  REQUIRE(parsed.errors.empty());
  const auto& layout = parsed.decl<LayoutDecl>(0);
  REQUIRE(layout.entries.size() == 4);
  CHECK(layout.entries[0].dim.name == "batch");
  REQUIRE(layout.entries[0].axes.size() == 1);
  CHECK(layout.entries[0].axes[0].name == "data");
  REQUIRE(layout.entries[1].axes.size() == 2);
  CHECK(layout.entries[1].axes[1].name == "model");
  CHECK(layout.entries[2].axes.empty());
  CHECK_FALSE(layout.entries[2].isAuto);
  CHECK(layout.entries[3].isAuto);
  CHECK(layout.autoRest);
  CHECK(parsed.at(layout.autoLoc) == "1:59");
}

TEST_CASE("def, program and train declarations", "[parser]") {
  Parsed parsed(R"(
def ffn(x: f32[batch, d_model], y: bf16[]) -> f32[batch, d_model] {
  return x
}
program infer(x: f32[batch]) -> (y: f32[batch], z: i32[]) {
  y = x; z = 0
}
train fit(x: f16[batch]) {
  minimize mean(x) with adamw(lr = 0.001)
}
program empty() -> (y: f32[]) { y = 1 }
)");
  INFO(parsed.errors);
  REQUIRE(parsed.errors.empty());
  REQUIRE(parsed.file->decls.size() == 4);
  const auto& def = parsed.decl<DefDecl>(0);
  CHECK(def.name.name == "ffn");
  REQUIRE(def.args.size() == 2);
  CHECK(def.args[0].name.name == "x");
  CHECK(def.args[0].type.dtype == DType::F32);
  REQUIRE(def.args[0].type.dims.size() == 2);
  CHECK(def.args[0].type.dims[1].name == "d_model");
  CHECK(def.args[1].type.dtype == DType::BF16);
  CHECK(def.args[1].type.dims.empty());
  CHECK(def.args[1].type.hasShape);
  CHECK(def.result.dims.size() == 2);
  REQUIRE(def.body.size() == 1);
  CHECK(isa<ReturnStmt>(*def.body[0]));
  const auto& program = parsed.decl<ProgramDecl>(1);
  CHECK(program.inputs.size() == 1);
  REQUIRE(program.outputs.size() == 2);
  CHECK(program.outputs[1].name.name == "z");
  CHECK(program.outputs[1].type.dtype == DType::I32);
  CHECK(program.body.size() == 2);
  const auto& train = parsed.decl<TrainDecl>(2);
  CHECK(train.inputs[0].type.dtype == DType::F16);
  REQUIRE(train.body.size() == 1);
  const auto& minimize = cast<MinimizeStmt>(*train.body[0]);
  CHECK(render(*minimize.loss) == "mean(x)");
  CHECK(render(*minimize.optimizer) == "adamw(lr=0.001)");
  CHECK(parsed.decl<ProgramDecl>(3).inputs.empty());
}

TEST_CASE("recompute def: an annotation, and an identifier elsewhere", "[parser]") {
  Parsed parsed(R"(
recompute def layer(x: f32[batch]) -> f32[batch] {
  let recompute = x
  return recompute
}
def plain(x: f32[batch]) -> f32[batch] { return x }
recompute program p() -> (y: f32[]) { y = 1 }
recompute def after_error(x: f32[batch]) -> f32[batch] { return x }
)");
  CHECK(parsed.reported("7:11: error: expected 'def' after 'recompute' but found 'program'"));
  REQUIRE(parsed.file->decls.size() == 4);
  const auto& layer = parsed.decl<DefDecl>(0);
  CHECK(layer.isRecompute());
  CHECK(parsed.at(layer.recomputeLoc) == "2:1");
  CHECK(parsed.at(layer.loc) == "2:11");
  CHECK(cast<LetStmt>(*layer.body[0]).name.name == "recompute");
  CHECK_FALSE(parsed.decl<DefDecl>(1).isRecompute());
  // Recovery resumes at the program (its declaration parses) and at the next annotation.
  CHECK(parsed.decl<ProgramDecl>(2).name.name == "p");
  CHECK(parsed.decl<DefDecl>(3).isRecompute());
  std::string printed;
  llvm::raw_string_ostream os(printed);
  printAST(*parsed.file, parsed.sources, os);
  // Both annotated defs print the annotation; the plain one does not.
  llvm::SmallVector<llvm::StringRef, 32> lines;
  llvm::StringRef(os.str()).split(lines, '\n');
  size_t annotated = 0, defs = 0;
  for (llvm::StringRef line : lines)
    if (line.contains("DefDecl")) {
      ++defs;
      annotated += line.endswith(" recompute");
    }
  CHECK(defs == 3);
  CHECK(annotated == 2);
}

TEST_CASE("statements", "[parser]") {
  Parsed parsed(R"(
def f(x: f32[a]) -> f32[a] {
  let h = x;
  let g: f32[a] = h * 2
  param w: f32[a, b] = normal(stddev = 0.02)
  const r: f32[a] = orthogonal()
  g = g + 1
  repeat 3 { g = g }
  repeat layers { let k = g }
  return g
}
)");
  INFO(parsed.errors);
  REQUIRE(parsed.errors.empty());
  const auto& body = parsed.decl<DefDecl>(0).body;
  REQUIRE(body.size() == 8);
  const auto& let = cast<LetStmt>(*body[0]);
  CHECK(let.name.name == "h");
  CHECK_FALSE(let.type);
  CHECK(parsed.at(let.loc) == "3:3");
  const auto& typedLet = cast<LetStmt>(*body[1]);
  REQUIRE(typedLet.type);
  CHECK(typedLet.type->dims[0].name == "a");
  CHECK(render(*typedLet.value) == "(h * 2)");
  const auto& param = cast<ParamStmt>(*body[2]);
  CHECK(param.kind == Stmt::Kind::Param);
  CHECK(param.trainable());
  CHECK(param.name.name == "w");
  CHECK(param.type.dims.size() == 2);
  CHECK(render(*param.init) == "normal(stddev=0.02)");
  const auto& constant = cast<ParamStmt>(*body[3]);
  CHECK(constant.kind == Stmt::Kind::Const);
  CHECK_FALSE(constant.trainable());
  CHECK(render(*constant.init) == "orthogonal()");
  const auto& assign = cast<AssignStmt>(*body[4]);
  CHECK(assign.name.name == "g");
  CHECK(parsed.at(assign.loc) == "7:3");
  const auto& repeat = cast<RepeatStmt>(*body[5]);
  REQUIRE(isa<NumberExpr>(*repeat.count));
  CHECK(cast<NumberExpr>(*repeat.count).value == 3);
  CHECK(repeat.body.size() == 1);
  const auto& repeatDim = cast<RepeatStmt>(*body[6]);
  REQUIRE(isa<NameExpr>(*repeatDim.count));
  CHECK(cast<NameExpr>(*repeatDim.count).name == "layers");
  CHECK(isa<ReturnStmt>(*body[7]));
}

TEST_CASE("several results, shared repeats, tied params and metrics", "[parser]") {
  Parsed parsed(R"(
def heads(h: f32[a]) -> (mlm: f32[a, v], sop: f32[c]) {
  param table: f32[v, a] = normal(stddev = 0.02) as "embedding"
  let x, _ = split(h)
  x, y = split(h)
  repeat 3 shared { x = x }
  repeat layers { x = x }
  return x, y * 2
}
train t(x: f32[a]) -> (accuracy: f32[], recall: f32[]) { minimize x with sgd(lr = 1) }
)");
  INFO(parsed.errors);
  REQUIRE(parsed.errors.empty());
  const auto& def = parsed.decl<DefDecl>(0);
  REQUIRE(def.hasSeveralResults());
  REQUIRE(def.results.size() == 2);
  CHECK(def.results[0].name.name == "mlm");
  CHECK(def.results[1].type.dims[0].name == "c");
  const auto& body = def.body;
  REQUIRE(body.size() == 6);
  const auto& param = cast<ParamStmt>(*body[0]);
  REQUIRE(param.tiedPath);
  CHECK(*param.tiedPath == "embedding");
  CHECK(parsed.at(param.tiedPathLoc) == "3:53");
  const auto& let = cast<BindResultsStmt>(*body[1]);
  CHECK(let.isLet);
  REQUIRE(let.names.size() == 2);
  CHECK(let.names[1].name == "_");
  CHECK(render(*let.value) == "split(h)");
  const auto& assign = cast<BindResultsStmt>(*body[2]);
  CHECK_FALSE(assign.isLet);
  CHECK(parsed.at(assign.loc) == "5:3");
  CHECK(cast<RepeatStmt>(*body[3]).shared);
  CHECK_FALSE(cast<RepeatStmt>(*body[4]).shared);
  const auto& ret = cast<ReturnStmt>(*body[5]);
  REQUIRE(ret.rest.size() == 1);
  CHECK(render(*ret.rest[0]) == "(y * 2)");
  const auto& train = parsed.decl<TrainDecl>(1);
  REQUIRE(train.metrics.size() == 2);
  CHECK(train.metrics[1].name.name == "recall");
  // `shared` and `as` stay ordinary names elsewhere, even right after a param.
  Parsed names("program p(shared: f32[a]) -> (as: f32[a]) {\n  param w: f32[a] = ones()\n"
               "  as = shared * w\n}");
  INFO(names.errors);
  CHECK(names.errors.empty());
  CHECK(names.decl<ProgramDecl>(0).body.size() == 2);
}

TEST_CASE("errors in the forms of several results and tied params", "[parser]") {
  SECTION("'as' without a path string") {
    Parsed parsed("def f() -> f32[] { param w: f32[] = ones() as w\n return w }");
    CHECK(parsed.reported("p.mesh:1:47: error: expected a param path string after 'as'"));
  }
  SECTION("a bound name list without '='") {
    Parsed parsed("def f() -> f32[] { let a, b + 1\n return a }");
    CHECK(parsed.reported("p.mesh:1:29: error: expected ',' or '=' but found '+'"));
  }
  SECTION("an empty result list") {
    Parsed parsed("def f() -> () { return 1 }");
    CHECK(parsed.reported("p.mesh:1:13: error: expected a name"));
  }
}

TEST_CASE("precedence and associativity", "[parser]") {
  CHECK(renderExpr("a + b * c") == "(a + (b * c))");
  CHECK(renderExpr("a - b - c") == "((a - b) - c)");
  CHECK(renderExpr("a / b * c") == "((a / b) * c)");
  CHECK(renderExpr("a + b < c * d") == "((a + b) < (c * d))");
  CHECK(renderExpr("a <= b") == "(a <= b)");
  CHECK(renderExpr("a >= b") == "(a >= b)");
  CHECK(renderExpr("a > b") == "(a > b)");
  CHECK(renderExpr("a == b") == "(a == b)");
  CHECK(renderExpr("a != b") == "(a != b)");
  CHECK(renderExpr("-a ** 2") == "(-(a ** 2))");
  CHECK(renderExpr("a ** -b") == "(a ** (-b))");
  CHECK(renderExpr("a ** b ** c") == "(a ** (b ** c))");
  CHECK(renderExpr("2 * a ** 3") == "(2 * (a ** 3))");
  CHECK(renderExpr("(a + b) * c") == "((a + b) * c)");
  CHECK(renderExpr("- - a") == "(-(-a))");
  CHECK(renderExpr("a * -b") == "(a * (-b))");
  CHECK(renderExpr("a + b % c * d") == "(a + ((b % c) * d))");
  CHECK(renderExpr("-a % b") == "((-a) % b)");
}

TEST_CASE("primary expressions", "[parser]") {
  CHECK(renderExpr("1e-9") == "1e-09");
  CHECK(renderExpr("[a, b, 1]") == "[a, b, 1]");
  CHECK(renderExpr("[]") == "[]");
  CHECK(renderExpr("f32[a, b]") == "f32[a,b]");
  CHECK(renderExpr("i32[]") == "i32[]");
  CHECK(renderExpr("bf16") == "bf16");
  CHECK(renderExpr("zeros()") == "zeros()");
  ParsedExpr number("0.5");
  REQUIRE(isa<NumberExpr>(number.expr()));
  CHECK_FALSE(cast<NumberExpr>(number.expr()).isInteger);
  ParsedExpr integer("7");
  CHECK(cast<NumberExpr>(integer.expr()).isInteger);
  ParsedExpr bare("f16");
  REQUIRE(isa<TypeExpr>(bare.expr()));
  CHECK_FALSE(cast<TypeExpr>(bare.expr()).type.hasShape);
  CHECK(cast<TypeExpr>(bare.expr()).type.dtype == DType::F16);
}

TEST_CASE("call argument forms", "[parser]") {
  CHECK(renderExpr("einsum(x, w -> batch, d_ff)") == "einsum(x, w -> batch d_ff)");
  CHECK(renderExpr("normal(stddev = 0.02)") == "normal(stddev=0.02)");
  CHECK(renderExpr("normal(f32[a], mean = 0, stddev = 1)") == "normal(f32[a], mean=0, stddev=1)");
  CHECK(renderExpr("slice(x, d -> e, start = 2)") == "slice(x, d -> e, start=2)");
  CHECK(renderExpr("reshape(x, a, b -> c)") == "reshape(x, a, b -> c)");
  CHECK(renderExpr("transpose(x -> d1, d2, d3)") == "transpose(x -> d1 d2 d3)");
  CHECK(renderExpr("layer_norm(x, d, eps = 1e-5)") == "layer_norm(x, d, eps=1e-05)");
  CHECK(renderExpr("one_hot(ids, d, dtype = f32)") == "one_hot(ids, d, dtype=f32)");
  CHECK(renderExpr("cast(x, bf16)") == "cast(x, bf16)");
  CHECK(renderExpr("concat(x, y, along = [dx, dy] -> e)") == "concat(x, y -> e, along=[dx, dy])");
  CHECK(renderExpr("sum(relu(x) * 2, a, b)") == "sum((relu(x) * 2), a, b)");
  CHECK(renderExpr("sgd(0.1, momentum = 0.9)") == "sgd(0.1, momentum=0.9)");
}

TEST_CASE("binary and call locations", "[parser]") {
  ParsedExpr parsed("a +  b");
  const auto& binary = cast<BinaryExpr>(parsed.expr());
  CHECK(parsed.at(binary.loc) == "2:7");
  CHECK(parsed.at(binary.opLoc) == "2:9");
  CHECK(parsed.at(binary.rhs->loc) == "2:12");
  ParsedExpr call("f(x -> y, k = 1)");
  const auto& callExpr = cast<CallExpr>(call.expr());
  CHECK(call.at(callExpr.loc) == "2:7");
  CHECK(call.at(callExpr.arrowLoc) == "2:11");
  CHECK(call.at(callExpr.kwargs[0].name.loc) == "2:17");
}

TEST_CASE("syntax errors: message and location", "[parser]") {
  SECTION("missing ']'") {
    Parsed parsed("mesh m[data = 2 x");
    CHECK(parsed.reported("p.mesh:1:17: error: expected ',' or ']' but found identifier 'x'"));
  }
  SECTION("missing '->' in def") {
    Parsed parsed("def f(x: f32[a]) f32[a] { return x }");
    CHECK(parsed.reported("p.mesh:1:18: error: expected '->' but found 'f32'"));
  }
  SECTION("non-integer and zero sizes") {
    Parsed parsed("dim a = 2.5\ndim b = 0\nmesh m[x = -2]");
    CHECK(parsed.reported(
        "p.mesh:1:9: error: size of dim 'a' must be a positive integer, not '2.5'"));
    CHECK(
        parsed.reported("p.mesh:2:9: error: size of dim 'b' must be a positive integer, not '0'"));
    CHECK(parsed.reported(
        "p.mesh:3:12: error: size of axis 'x' must be a positive integer, not '-2'"));
    CHECK(parsed.diag.errorCount() == 3);
  }
  SECTION("param initializer must be a call") {
    Parsed parsed("def f() -> f32[] { param w: f32[] = 3\n return w }");
    CHECK(parsed.reported(
        "p.mesh:1:37: error: expected an initializer call such as 'normal(stddev = 0.02)' but "
        "found number '3'"));
    CHECK(parsed.diag.errorCount() == 1);
  }
  SECTION("stray token at top level") {
    Parsed parsed("dim a = 1\n}\ndim b = 2");
    CHECK(parsed.reported("p.mesh:2:1: error: expected a declaration"));
    CHECK(parsed.diag.errorCount() == 1);
    CHECK(parsed.file->decls.size() == 2);
  }
  SECTION("missing '}' before the next declaration") {
    Parsed parsed("def f() -> f32[] { return 1\nprogram p() -> (y: f32[]) { y = 1 }");
    CHECK(parsed.reported("p.mesh:2:1: error: expected '}' but found 'program'"));
    CHECK(parsed.diag.errorCount() == 1);
  }
  SECTION("'dim' inside a block is a local dim, so a missing '}' shows at the end") {
    Parsed parsed("def f() -> f32[] { return 1\ndim a = 1");
    CHECK(parsed.reported("p.mesh:2:10: error: expected '}' but found end of file"));
    CHECK(parsed.diag.errorCount() == 1);
  }
}

TEST_CASE("recovery reports several errors in one run", "[parser]") {
  Parsed parsed(R"(
dim a = x
def f(x: f32[a]) -> f32[a] {
  let y = (x + 1
  let z = x * * 2
  y = ]
  return y
}
mesh m[data]
program p() -> (o: f32[]) { o = 1 }
)");
  CHECK(parsed.reported("p.mesh:2:9: error: expected an integer size but found identifier 'x'"));
  CHECK(parsed.reported("p.mesh:5:3: error: expected ')' but found 'let'"));
  CHECK(parsed.reported("p.mesh:5:15: error: expected an expression but found '*'"));
  CHECK(parsed.reported("p.mesh:6:7: error: expected an expression but found ']'"));
  CHECK(parsed.reported("p.mesh:9:12: error: expected '=' but found ']'"));
  CHECK(parsed.diag.errorCount() == 5);
  // What parsed survives: the def (with its return) and the program.
  REQUIRE(parsed.file->decls.size() == 2);
  const auto& def = parsed.decl<DefDecl>(0);
  REQUIRE(def.body.size() == 1);
  CHECK(isa<ReturnStmt>(*def.body[0]));
  CHECK(isa<ProgramDecl>(*parsed.file->decls[1]));
}

TEST_CASE("deep nesting is an error, not a crash", "[parser]") {
  SECTION("parentheses") {
    ParsedExpr parsed(std::string(5000, '(') + "x" + std::string(5000, ')'));
    CHECK(parsed.reported("error: expression nested too deeply (limit 256)"));
    CHECK(parsed.diag.errorCount() == 1);
  }
  SECTION("unary minus") {
    ParsedExpr parsed(std::string(5000, '-') + "x");
    CHECK(parsed.diag.errorCount() == 1);
  }
  SECTION("long operator chains") {
    std::string chain = "x";
    for (int i = 0; i < 5000; ++i)
      chain += " + x";
    ParsedExpr parsed(chain);
    CHECK(parsed.reported("error: expression nested too deeply (limit 256)"));
    CHECK(parsed.diag.errorCount() == 1);
  }
  SECTION("blocks") {
    std::string text = "def f() -> f32[] {\n";
    for (int i = 0; i < 1000; ++i)
      text += "repeat 2 { ";
    for (int i = 0; i < 1000; ++i)
      text += "} ";
    text += "\nreturn 1 }\ndim a = 1";
    Parsed parsed(text);
    CHECK(parsed.reported("error: blocks nested too deeply (limit 256)"));
    CHECK(parsed.diag.errorCount() == 1);
    CHECK(parsed.file->decls.size() == 2);
  }
}

TEST_CASE("garbage input terminates", "[parser]") {
  Parsed parsed("} ) ] { ( [ -> , ; = let = param ( repeat { minimize with def ( program train "
                "layout : mesh [ dim = import 3 \"x");
  CHECK(parsed.diag.errorCount() > 0);
  Parsed braces(std::string(10000, '{'));
  CHECK(braces.diag.errorCount() > 0);
}

TEST_CASE("the AST printer shows every node with line:col", "[parser]") {
  Parsed parsed("dim a = 4\nprogram p(x: f32[a]) -> (y: f32[a]) {\n  y = -x * 2.5\n}");
  REQUIRE(parsed.errors.empty());
  std::string out;
  llvm::raw_string_ostream os(out);
  printAST(*parsed.file, parsed.sources, os);
  os.flush();
  CHECK(out == "File p.mesh\n"
               "  DimDecl 1:1 a = 4\n"
               "  ProgramDecl 2:1 p\n"
               "    Input 2:11 x: f32[a]\n"
               "    Output 2:26 y: f32[a]\n"
               "    AssignStmt 3:3 y\n"
               "      BinaryExpr 3:7 * (op at 3:10)\n"
               "        UnaryExpr 3:7 -\n"
               "          NameExpr 3:8 x\n"
               "        NumberExpr 3:12 2.5\n");
}

TEST_CASE("the AST printer shows results, bound names, shared repeats and tied paths", "[parser]") {
  Parsed parsed("def f(x: f32[a]) -> (u: f32[a], v: f32[]) {\n"
                "  param w: f32[a] = ones() as \"t/w\"\n"
                "  repeat 2 shared { x = x }\n"
                "  return x, sum(w)\n}\n"
                "train t(x: f32[a]) -> (m: f32[]) {\n"
                "  let p, _ = f(x)\n"
                "  m, q = f(p)\n"
                "  minimize m with sgd(lr = 1)\n}");
  REQUIRE(parsed.errors.empty());
  std::string out;
  llvm::raw_string_ostream os(out);
  printAST(*parsed.file, parsed.sources, os);
  os.flush();
  CHECK(out == "File p.mesh\n"
               "  DefDecl 1:1 f\n"
               "    Arg 1:7 x: f32[a]\n"
               "    Result 1:22 u: f32[a]\n"
               "    Result 1:33 v: f32[]\n"
               "    ParamStmt 2:3 w: f32[a] as \"t/w\"\n"
               "      CallExpr 2:21 ones\n"
               "    RepeatStmt 3:3 shared\n"
               "      NumberExpr 3:10 2\n"
               "      AssignStmt 3:21 x\n"
               "        NameExpr 3:25 x\n"
               "    ReturnStmt 4:3\n"
               "      NameExpr 4:10 x\n"
               "      CallExpr 4:13 sum\n"
               "        NameExpr 4:17 w\n"
               "  TrainDecl 6:1 t\n"
               "    Input 6:9 x: f32[a]\n"
               "    Metric 6:24 m: f32[]\n"
               "    BindResultsStmt 7:3 let p, _\n"
               "      CallExpr 7:14 f\n"
               "        NameExpr 7:16 x\n"
               "    BindResultsStmt 8:3 m, q\n"
               "      CallExpr 8:10 f\n"
               "        NameExpr 8:12 p\n"
               "    MinimizeStmt 9:3\n"
               "      NameExpr 9:12 m\n"
               "      CallExpr 9:19 sgd\n"
               "        KeywordArg 9:23 lr\n"
               "          NumberExpr 9:28 1\n");
}

TEST_CASE("the parser reads step state; 'state' and 'next' stay ordinary names", "[parser]") {
  Parsed parsed("train t(x: f32[a]) {\n"
                "  state mem: f32[a] = zeros() as \"m\"\n"
                "  let state = x\n"
                "  let next = mem\n"
                "  next mem = next + state\n"
                "  minimize sum(x) with sgd(lr = 1)\n}");
  REQUIRE(parsed.errors.empty());
  std::string out;
  llvm::raw_string_ostream os(out);
  printAST(*parsed.file, parsed.sources, os);
  os.flush();
  CHECK(out == "File p.mesh\n"
               "  TrainDecl 1:1 t\n"
               "    Input 1:9 x: f32[a]\n"
               "    StateStmt 2:3 mem: f32[a] as \"m\"\n"
               "      CallExpr 2:23 zeros\n"
               "    LetStmt 3:3 state\n"
               "      NameExpr 3:15 x\n"
               "    LetStmt 4:3 next\n"
               "      NameExpr 4:14 mem\n"
               "    NextStmt 5:3 mem\n"
               "      BinaryExpr 5:14 + (op at 5:19)\n"
               "        NameExpr 5:14 next\n"
               "        NameExpr 5:21 state\n"
               "    MinimizeStmt 6:3\n"
               "      CallExpr 6:12 sum\n"
               "        NameExpr 6:16 x\n"
               "      CallExpr 6:24 sgd\n"
               "        KeywordArg 6:28 lr\n"
               "          NumberExpr 6:33 1\n");
}

TEST_CASE("loadSourcesFromBuffer parses the main buffer and its imports", "[parser]") {
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream stream(errors);
  DiagEngine diag(sources, stream);
  SECTION("no imports") {
    std::optional<SourceSet> set = loadSourcesFromBuffer("dim a = 2", "/nonexistent/m.mesh", diag);
    REQUIRE(set);
    REQUIRE(set->files.size() == 1);
    CHECK(set->mainFile().decls.size() == 1);
    CHECK(set->mainFile().path == "/nonexistent/m.mesh");
  }
  SECTION("an import cycle through the error inputs") {
    std::string dir = MESHC_SOURCE_DIR "/tests/errors/";
    std::optional<SourceSet> set = loadSources(dir + "parse_import_cycle.mesh", diag);
    stream.flush();
    CHECK_FALSE(set);
    CHECK(errors.find("error: import cycle: parse_import_cycle.mesh -> cycle_b.mesh -> "
                      "parse_import_cycle.mesh") != std::string::npos);
    CHECK(diag.errorCount() == 1);
  }
  SECTION("a missing import") {
    std::optional<SourceSet> set =
        loadSourcesFromBuffer("import \"nope.mesh\"", "/nonexistent/m.mesh", diag);
    stream.flush();
    CHECK_FALSE(set);
    CHECK(errors.find("m.mesh:1:8: error: cannot open imported file 'nope.mesh'") !=
          std::string::npos);
  }
  SECTION("a missing main file") {
    CHECK_FALSE(loadSources("/nonexistent/main.mesh", diag));
    stream.flush();
    CHECK(errors.find("error: cannot open '/nonexistent/main.mesh'") != std::string::npos);
    CHECK(diag.errorCount() == 1);
  }
  SECTION("imports come before importers, each file once") {
    std::string dir = MESHC_SOURCE_DIR "/tests/errors/inputs/";
    std::optional<SourceSet> set = loadSourcesFromBuffer(
        "import \"diamond_b.mesh\"\nimport \"diamond_c.mesh\"\nimport \"./diamond_b.mesh\"",
        dir + "main.mesh", diag);
    stream.flush();
    INFO(errors);
    REQUIRE(set);
    REQUIRE(set->files.size() == 4);
    CHECK(llvm::StringRef(set->files[0]->path).endswith("diamond_d.mesh"));
    CHECK(llvm::StringRef(set->files[1]->path).endswith("diamond_b.mesh"));
    CHECK(llvm::StringRef(set->files[2]->path).endswith("diamond_c.mesh"));
    CHECK(llvm::StringRef(set->files[3]->path).endswith("main.mesh"));
  }
}

TEST_CASE("generic defs: dim parameters, local dims and explicit dim arguments", "[parser]") {
  Parsed parsed(R"(
def attention[S, M](x: f32[batch, S, d], m: f32[batch, M, d]) -> f32[batch, S, d] {
  dim half = size(S) / 2
  let y = attention[M, S](m, x)
  return x * size(d) + f[](x)
}
def plain() -> f32[] { return 1 }
)");
  INFO(parsed.errors);
  REQUIRE(parsed.errors.empty());
  const auto& def = parsed.decl<DefDecl>(0);
  REQUIRE(def.dimParams.size() == 2);
  CHECK(def.dimParams[0].name == "S");
  CHECK(def.dimParams[1].name == "M");
  CHECK(parsed.at(def.dimParams[1].loc) == "2:18");
  REQUIRE(def.args.size() == 2);
  CHECK(def.args[1].type.dims[1].name == "M");
  REQUIRE(def.body.size() == 3);
  const auto& dim = cast<DimStmt>(*def.body[0]);
  CHECK(dim.kind == Stmt::Kind::Dim);
  CHECK(dim.name.name == "half");
  CHECK(parsed.at(dim.loc) == "3:3");
  CHECK(render(*dim.size) == "(size(S) / 2)");
  const auto& call = cast<CallExpr>(*cast<LetStmt>(*def.body[1]).value);
  CHECK(call.hasDimArgs);
  CHECK(render(call) == "attention[M,S](m, x)");
  CHECK(render(*cast<ReturnStmt>(*def.body[2]).value) == "((x * size(d)) + f[](x))");
  CHECK(parsed.decl<DefDecl>(1).dimParams.empty());
  const auto& sum = cast<BinaryExpr>(*cast<ReturnStmt>(*def.body[2]).value);
  const auto& noDims = cast<CallExpr>(*sum.rhs);
  CHECK(noDims.hasDimArgs);
  CHECK(noDims.dimArgs.empty());
  CHECK_FALSE(cast<CallExpr>(*cast<BinaryExpr>(*sum.lhs).rhs).hasDimArgs);
}

TEST_CASE("generic defs: syntax errors", "[parser]") {
  SECTION("empty dim parameter list") {
    Parsed parsed("def f[](x: f32[a]) -> f32[a] { return x }");
    CHECK(parsed.reported("p.mesh:1:7: error: expected a dim parameter name but found ']'"));
  }
  SECTION("unclosed dim parameter list") {
    Parsed parsed("def f[S(x: f32[S]) -> f32[S] { return x }");
    CHECK(parsed.reported("p.mesh:1:8: error: expected ',' or ']' but found '('"));
  }
  SECTION("dim arguments must be names") {
    Parsed parsed("def g() -> f32[] { return f[2](x) }");
    CHECK(parsed.reported("p.mesh:1:29: error: expected a dim name but found number '2'"));
  }
  SECTION("dim arguments without a call") {
    Parsed parsed("def g() -> f32[] { return f[a] }");
    CHECK(parsed.reported("p.mesh:1:32: error: expected '(' but found '}'"));
  }
  SECTION("local dim without '='") {
    Parsed parsed("def g() -> f32[] {\n  dim h 4\n  return 1\n}");
    CHECK(parsed.reported("p.mesh:2:9: error: expected '=' but found number '4'"));
    CHECK(parsed.diag.errorCount() == 1);
  }
}

TEST_CASE("the AST printer shows dim parameters, local dims and dim arguments", "[parser]") {
  Parsed parsed("def f[S](x: f32[S]) -> f32[S] {\n  dim h = size(S)\n  return g[S](x)\n}");
  REQUIRE(parsed.errors.empty());
  std::string out;
  llvm::raw_string_ostream os(out);
  printAST(*parsed.file, parsed.sources, os);
  os.flush();
  CHECK(out == "File p.mesh\n"
               "  DefDecl 1:1 f[S] -> f32[S]\n"
               "    Arg 1:10 x: f32[S]\n"
               "    DimStmt 2:3 h\n"
               "      CallExpr 2:11 size\n"
               "        NameExpr 2:16 S\n"
               "    ReturnStmt 3:3\n"
               "      CallExpr 3:10 g[S]\n"
               "        NameExpr 3:15 x\n");
}
