// The abstract syntax tree of a .mesh file. Every node carries the location of its first token.
// The grammar each node comes from is documented on the parser function that builds it
// (frontend/Parser.cpp) and in docs/language.md.
#pragma once

#include <llvm/Support/SMLoc.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshc::ast {

using Loc = llvm::SMLoc;

/// A name as written, with its location.
struct Ident {
  std::string name;
  Loc loc;
};

enum class DType { F32, BF16, F16, I32 };

// ---------------------------------------------------------------- expressions

struct Expr {
  enum class Kind { Number, Name, Unary, Binary, Call, List, Type };
  Expr(Kind kind, Loc loc) : kind(kind), loc(loc) {}
  virtual ~Expr() = default;
  const Kind kind;
  Loc loc;
};
using ExprPtr = std::unique_ptr<Expr>;

/// `3`, `0.02`, `1e-9`. `isInteger` when written without '.', exponent or suffix.
struct NumberExpr : Expr {
  NumberExpr(Loc loc, double value, bool isInteger)
      : Expr(Kind::Number, loc), value(value), isInteger(isInteger) {}
  double value;
  bool isInteger;
  static bool classof(const Expr* e) { return e->kind == Kind::Number; }
};

/// A reference to a value, a dim, a def, a builtin or a dtype-less identifier.
struct NameExpr : Expr {
  NameExpr(Loc loc, std::string name) : Expr(Kind::Name, loc), name(std::move(name)) {}
  std::string name;
  static bool classof(const Expr* e) { return e->kind == Kind::Name; }
};

enum class UnaryOp { Neg };

struct UnaryExpr : Expr {
  UnaryExpr(Loc loc, UnaryOp op, ExprPtr operand)
      : Expr(Kind::Unary, loc), op(op), operand(std::move(operand)) {}
  UnaryOp op;
  ExprPtr operand;
  static bool classof(const Expr* e) { return e->kind == Kind::Unary; }
};

enum class BinaryOp { Add, Sub, Mul, Div, Pow, Lt, Le, Gt, Ge, Eq, Ne, Mod };

struct BinaryExpr : Expr {
  BinaryExpr(Loc loc, BinaryOp op, ExprPtr lhs, ExprPtr rhs)
      : Expr(Kind::Binary, loc), op(op), lhs(std::move(lhs)), rhs(std::move(rhs)) {}
  BinaryOp op;
  Loc opLoc; // location of the operator token
  ExprPtr lhs, rhs;
  static bool classof(const Expr* e) { return e->kind == Kind::Binary; }
};

/// `name = value` inside a call.
struct KeywordArg {
  Ident name;
  ExprPtr value;
};

/// `callee[dim, ...](pos, pos, ... [-> out, out, ...] [, key = value, ...])`.
/// Builtins and defs share this form; sema decides what the positional arguments mean
/// (tensors, dim names, dtypes) and what the arrow list names (output dims). The bracketed
/// dims bind a generic def's dim parameters explicitly.
struct CallExpr : Expr {
  CallExpr(Loc loc, Ident callee) : Expr(Kind::Call, loc), callee(std::move(callee)) {}
  Ident callee;
  bool hasDimArgs = false;
  std::vector<Ident> dimArgs;
  std::vector<ExprPtr> args;
  bool hasArrow = false;
  Loc arrowLoc;
  std::vector<Ident> arrowDims;
  std::vector<KeywordArg> kwargs;
  static bool classof(const Expr* e) { return e->kind == Kind::Call; }
};

/// `[a, b, c]`: a list of expressions (used for dim lists in keyword arguments).
struct ListExpr : Expr {
  ListExpr(Loc loc) : Expr(Kind::List, loc) {}
  std::vector<ExprPtr> elements;
  static bool classof(const Expr* e) { return e->kind == Kind::List; }
};

/// A tensor type in expression position: `f32[batch, d]` (hasShape) or a bare dtype `bf16`.
struct TypeSpec {
  DType dtype = DType::F32;
  Loc loc;
  bool hasShape = false;
  std::vector<Ident> dims;
};

struct TypeExpr : Expr {
  TypeExpr(Loc loc, TypeSpec type) : Expr(Kind::Type, loc), type(std::move(type)) {}
  TypeSpec type;
  static bool classof(const Expr* e) { return e->kind == Kind::Type; }
};

// ---------------------------------------------------------------- statements

struct Stmt {
  enum class Kind {
    Let,
    Assign,
    Param,
    Const,
    State,
    Next,
    Return,
    Repeat,
    Minimize,
    BindResults,
    Dim
  };
  Stmt(Kind kind, Loc loc) : kind(kind), loc(loc) {}
  virtual ~Stmt() = default;
  const Kind kind;
  Loc loc;
};
using StmtPtr = std::unique_ptr<Stmt>;

/// `let name [: type] = expr`
struct LetStmt : Stmt {
  LetStmt(Loc loc) : Stmt(Kind::Let, loc) {}
  Ident name;
  std::optional<TypeSpec> type;
  ExprPtr value;
  static bool classof(const Stmt* s) { return s->kind == Kind::Let; }
};

/// `name = expr`: rebinds a let variable (same type) or sets a program output.
struct AssignStmt : Stmt {
  AssignStmt(Loc loc) : Stmt(Kind::Assign, loc) {}
  Ident name;
  ExprPtr value;
  static bool classof(const Stmt* s) { return s->kind == Kind::Assign; }
};

/// `param name: type = init(...)` (trainable), `const name: type = init(...)` (not trained) and
/// `state name: type = init(...)` (step state: not trained, written each step by `next`).
struct ParamStmt : Stmt {
  ParamStmt(Kind kind, Loc loc) : Stmt(kind, loc) {}
  Ident name;
  TypeSpec type;
  std::unique_ptr<CallExpr> init; // normal(stddev = 0.02), zeros(), ...
  /// `... as "path"`: the param's absolute path, tying every declaration that names it.
  std::optional<std::string> tiedPath;
  Loc tiedPathLoc;
  bool trainable() const { return kind == Kind::Param; }
  bool isState() const { return kind == Kind::State; }
  static bool classof(const Stmt* s) {
    return s->kind == Kind::Param || s->kind == Kind::Const || s->kind == Kind::State;
  }
};

/// `next name = expr`: the value the step state `name` takes for the next step.
struct NextStmt : Stmt {
  NextStmt(Loc loc) : Stmt(Kind::Next, loc) {}
  Ident name;
  ExprPtr value;
  static bool classof(const Stmt* s) { return s->kind == Kind::Next; }
};

/// `return expr` or, in a def with several results, `return expr, expr, ...`
struct ReturnStmt : Stmt {
  ReturnStmt(Loc loc) : Stmt(Kind::Return, loc) {}
  ExprPtr value;
  std::vector<ExprPtr> rest; // the second and later results
  static bool classof(const Stmt* s) { return s->kind == Kind::Return; }
};

/// `repeat count { body }`: the body runs `count` times; each iteration owns its parameters.
struct RepeatStmt : Stmt {
  RepeatStmt(Loc loc) : Stmt(Kind::Repeat, loc) {}
  ExprPtr count;       // integer literal or a dim name (its size)
  bool shared = false; // `repeat N shared { ... }`: every iteration uses the same params
  std::vector<StmtPtr> body;
  static bool classof(const Stmt* s) { return s->kind == Kind::Repeat; }
};

/// `minimize loss with optimizer(key = value, ...)`
struct MinimizeStmt : Stmt {
  MinimizeStmt(Loc loc) : Stmt(Kind::Minimize, loc) {}
  ExprPtr loss;
  std::unique_ptr<CallExpr> optimizer;
  static bool classof(const Stmt* s) { return s->kind == Kind::Minimize; }
};

/// `let a, b = f(...)` (fresh names) or `a, b = f(...)` (rebinding lets or setting outputs):
/// binds the results of a def with several results; `_` discards one.
struct BindResultsStmt : Stmt {
  BindResultsStmt(Loc loc) : Stmt(Kind::BindResults, loc) {}
  bool isLet = false;
  std::vector<Ident> names;
  ExprPtr value;
  static bool classof(const Stmt* s) { return s->kind == Kind::BindResults; }
};

/// `dim name = expr`: a dim local to a def (or program, train) body whose size is a constant
/// expression over `size(...)` of the dims in scope and numbers.
struct DimStmt : Stmt {
  DimStmt(Loc loc) : Stmt(Kind::Dim, loc) {}
  Ident name;
  ExprPtr size;
  static bool classof(const Stmt* s) { return s->kind == Kind::Dim; }
};

// ---------------------------------------------------------------- declarations

/// `name: type` in a signature.
struct TypedName {
  Ident name;
  TypeSpec type;
};

struct Decl {
  enum class Kind { Import, Mesh, Dim, Layout, Def, Program, Train, Extern };
  Decl(Kind kind, Loc loc) : kind(kind), loc(loc) {}
  virtual ~Decl() = default;
  const Kind kind;
  Loc loc;
};
using DeclPtr = std::unique_ptr<Decl>;

/// `import "path.mesh"` (relative to the importing file)
struct ImportDecl : Decl {
  ImportDecl(Loc loc) : Decl(Kind::Import, loc) {}
  std::string path;
  Loc pathLoc;
  static bool classof(const Decl* d) { return d->kind == Kind::Import; }
};

/// `mesh name[axis = size, ...]`
struct MeshDecl : Decl {
  MeshDecl(Loc loc) : Decl(Kind::Mesh, loc) {}
  Ident name;
  struct Axis {
    Ident name;
    int64_t size = 0;
    Loc sizeLoc;
  };
  std::vector<Axis> axes;
  static bool classof(const Decl* d) { return d->kind == Kind::Mesh; }
};

/// `dim name = size`
struct DimDecl : Decl {
  DimDecl(Loc loc) : Decl(Kind::Dim, loc) {}
  Ident name;
  int64_t size = 0;
  Loc sizeLoc;
  static bool classof(const Decl* d) { return d->kind == Kind::Dim; }
};

/// `layout item, item, ...` with item `dim: axis`, `dim: [a, b]`, `dim: []`, `dim: auto`
/// or the bare `auto` (every dim not pinned is chosen by the planner).
struct LayoutDecl : Decl {
  LayoutDecl(Loc loc) : Decl(Kind::Layout, loc) {}
  struct Entry {
    Ident dim;
    bool isAuto = false;     // `dim: auto`
    std::vector<Ident> axes; // empty and !isAuto: pinned replicated
    /// `layers: stage(3, 1)`: a repeat's layers pinned to the stages, each stage's count.
    std::vector<int64_t> split;
    Loc splitLoc; // the '('
  };
  std::vector<Entry> entries;
  bool autoRest = false; // the bare `auto` item
  Loc autoLoc;
  static bool classof(const Decl* d) { return d->kind == Kind::Layout; }
};

/// `def name[dims](args) -> type { body }`: a reusable block; each call site owns its params.
/// `dimParams` (possibly none) are bound at each call to the caller's dims.
struct DefDecl : Decl {
  DefDecl(Loc loc) : Decl(Kind::Def, loc) {}
  Ident name;
  std::vector<Ident> dimParams;
  std::vector<TypedName> args;
  TypeSpec result;
  /// `-> (a: type, b: type)`: several named results (then `result` is unused).
  std::vector<TypedName> results;
  bool hasSeveralResults() const { return !results.empty(); }
  std::vector<StmtPtr> body;
  /// `recompute def ...`: where the annotation is written (invalid without one).
  Loc recomputeLoc;
  bool isRecompute() const { return recomputeLoc.isValid(); }
  static bool classof(const Decl* d) { return d->kind == Kind::Def; }
};

/// `program name(inputs) -> (out: type, ...) { body }`
struct ProgramDecl : Decl {
  ProgramDecl(Loc loc) : Decl(Kind::Program, loc) {}
  Ident name;
  std::vector<TypedName> inputs;
  std::vector<TypedName> outputs;
  std::vector<StmtPtr> body;
  static bool classof(const Decl* d) { return d->kind == Kind::Program; }
};

/// `train name(inputs) [-> (metric: f32[], ...)] { body; minimize loss with opt(...) }`
struct TrainDecl : Decl {
  TrainDecl(Loc loc) : Decl(Kind::Train, loc) {}
  Ident name;
  std::vector<TypedName> inputs;
  std::vector<TypedName> metrics; // set in the body like a program's outputs
  std::vector<StmtPtr> body;
  static bool classof(const Decl* d) { return d->kind == Kind::Train; }
};

/// `extern def name(x: f32, ...) -> f32 from "header.h"`: an elementwise function implemented
/// in the user's C++ header (path relative to the declaring file). Calls lower to the `call` op.
struct ExternDecl : Decl {
  ExternDecl(Loc loc) : Decl(Kind::Extern, loc) {}
  Ident name;
  struct Param {
    Ident name;
    DType dtype = DType::F32;
    Loc dtypeLoc;
  };
  std::vector<Param> params;
  DType result = DType::F32;
  Loc resultLoc;
  std::string header;
  Loc headerLoc;
  static bool classof(const Decl* d) { return d->kind == Kind::Extern; }
};

/// One parsed file.
struct File {
  std::string path;
  unsigned bufferId = 0; // in the SourceMgr
  std::vector<DeclPtr> decls;
};

const char* dtypeName(DType dtype);

} // namespace meshc::ast
