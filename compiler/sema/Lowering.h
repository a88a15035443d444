// Internal to sema: the global symbol tables and the worker that lowers one program, train
// block or def (for checking) to an ir::Function. FunctionLowerer.cpp holds scopes, statements
// and expressions; Builtins.cpp the per-builtin checks and lowering; Sema.cpp the module level.
#pragma once

#include "diag/Diagnostics.h"
#include "frontend/AST.h"
#include "ir/IR.h"

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace meshc::sema {

/// Reports each (location, kind, message) once: inlined defs and unrolled repeats lower the
/// same source many times.
class Reporter {
public:
  explicit Reporter(DiagEngine& diag) : diag_(diag) {}
  /// Returns whether the diagnostic was printed (so that its notes can follow it).
  template <typename... Args> bool report(llvm::SMLoc loc, Diag kind, Args&&... args) {
    std::string message = fmt::vformat(diagInfo(kind).format, fmt::make_format_args(args...));
    if (!seen_.insert({loc.getPointer(), static_cast<int>(kind), message}).second) return false;
    diag_.report(loc, kind, args...);
    return true;
  }
  DiagEngine& engine() { return diag_; }

private:
  DiagEngine& diag_;
  std::set<std::tuple<const char*, int, std::string>> seen_;
};

struct DimInfo {
  int64_t size = 0;
  llvm::SMLoc loc;
  /// A dim declared in a def body (`dim half = size(S) / 2`): only its own body names it, by
  /// `sourceName`; the map's key is its IR name (see FunctionLowerer::localDimName).
  bool local = false;
  std::string sourceName;
};

struct LayoutInfo {
  std::vector<std::string> axes;
  bool isAuto = false;
  llvm::SMLoc loc;
};

/// An `extern def`: its declaration and its header as `call` ops name it (relative to the main
/// file's directory, or absolute when outside it).
struct ExternInfo {
  const ast::ExternDecl* decl = nullptr;
  std::string header;
};

/// The top-level names of every file of the compilation.
struct Globals {
  const ast::MeshDecl* mesh = nullptr; // the declaration, if any
  bool hasMesh = false;                // declared or given on the command line
  std::string meshName;
  llvm::SMLoc meshLoc;
  std::map<std::string, int64_t> axes;
  std::map<std::string, DimInfo> dims;
  std::map<std::string, const ast::DefDecl*> defs;
  std::map<std::string, ExternInfo> externs;
  std::map<std::string, LayoutInfo> layout;
  std::set<std::string> recomputeOption; // defs named by --recompute
};

std::string typeString(const ir::TensorType& type);
std::string joinNames(const std::vector<std::string>& names, const char* separator = ", ");

/// A lowered expression: a tensor value, a number literal whose dtype is decided by its use,
/// or poison (an error was reported; users stay silent).
struct Operand {
  enum class Kind { Poison, Tensor, Literal };
  Kind kind = Kind::Poison;
  ir::ValueId id = 0;
  double number = 0;
  bool isInteger = false;
  llvm::SMLoc loc;
  static Operand poison() { return {}; }
  static Operand tensor(ir::ValueId id, llvm::SMLoc loc) {
    return {Kind::Tensor, id, 0, false, loc};
  }
  bool isPoison() const { return kind == Kind::Poison; }
};

/// A name bound in a block.
struct Binding {
  enum class Kind { Let, Input, Param, Const, State, Output };
  Kind kind = Kind::Let;
  llvm::SMLoc loc;
  Operand value;                      // poison while an output is unset or after an error
  bool isSet = true;                  // outputs start unset
  std::optional<ir::TensorType> type; // the type every (re)binding must have; none after errors
  std::string statePath;              // Kind::State: the state's param path, which `next` writes
};

struct Scope {
  Scope* parent = nullptr;
  std::map<std::string, Binding> names;
  Binding* find(const std::string& name) {
    for (Scope* s = this; s; s = s->parent)
      if (auto it = s->names.find(name); it != s->names.end()) return &it->second;
    return nullptr;
  }
};

/// A compile-time constant: keyword arguments, local dim sizes, `size(d)`.
struct Constant {
  double value = 0;
  bool isInteger = false;
};

/// The dims a call frame names beyond the global ones: a generic def's dim parameters and the
/// local dims of its body, each mapped to the IR dim it stands for in this call.
struct FrameDims {
  std::map<std::string, std::string> names; // as written -> IR dim name
  std::map<std::string, llvm::SMLoc> locs;  // where each was declared
  std::set<std::string> failed;             // local dims whose declaration was an error
};

/// One inlined call site (or the function body itself): names its params and random streams.
struct CallFrame {
  std::string path; // "" for the function body, else `block[2]/attn`
  const ast::DefDecl* def = nullptr;
  uint32_t call = 0; // this call in fn_.calls (index + 1); 0 for the function body
  FrameDims dims;
  std::string repeatSuffix;            // `[i]` per enclosing repeat of this frame, outermost first
  std::map<std::string, int> defCalls; // by def name + repeatSuffix
  std::map<std::string, int> randomCount; // by repeatSuffix
  std::optional<Operand> returned;
  std::vector<Operand> returnedRest; // a def with several results: the second and later
  // Params are named like `path` except inside `repeat N shared`, whose iterations share one
  // set: there `paramPath`/`paramSuffix` leave out the iteration (`layer/w`, not `layer[2]/w`).
  std::string paramPath;
  std::string paramSuffix;
  std::map<std::string, int> paramCalls; // by def name + paramSuffix
};

enum class BlockKind { Def, Program, Train, Repeat };

class FunctionLowerer {
public:
  FunctionLowerer(Globals& globals, Reporter& reporter, llvm::SourceMgr& sources)
      : globals_(globals), reporter_(reporter), sources_(sources) {}

  std::optional<ir::Function> lowerProgram(const ast::ProgramDecl& program);
  std::optional<ir::Function> lowerTrain(const ast::TrainDecl& train);
  /// Lowers a def alone (its arguments as inputs) so that defs nobody calls are checked too.
  void checkDef(const ast::DefDecl& def);
  /// Whether a def was inlined (and so checked) by an earlier lowering.
  bool wasInlined(const ast::DefDecl& def) const { return inlinedDefs_.count(&def) != 0; }

  static constexpr size_t kMaxWork = 2000000;      // ops, statements and repeat iterations
  static constexpr size_t kMaxTotalWork = 4000000; // the same, over the whole compilation
  static constexpr int kMaxDepth = 100;
  static constexpr int kMaxExprDepth = 2000;
  static constexpr int64_t kMaxElements = int64_t(1) << 44; // 2^44 x 8 B fits int64 with room

private:
  // ---- Sema.cpp: statements, names, types
  template <typename... Args> bool error(llvm::SMLoc loc, Diag kind, Args&&... args) {
    return reporter_.report(loc, kind, std::forward<Args>(args)...);
  }
  ir::Location location(llvm::SMLoc loc) const;
  std::optional<ir::TensorType> convertType(const ast::TypeSpec& spec);
  std::optional<int64_t> elementCount(const ir::TensorType& type) const;
  bool tick(); // counts work; false once the function is too large
  Operand addOp(ir::OpKind kind, std::vector<ir::ValueId> operands, ir::TensorType type,
                llvm::SMLoc loc, std::vector<std::pair<std::string, ir::AttrValue>> attrs = {},
                std::string name = {});
  const ir::TensorType& typeOf(const Operand& operand) const { return fn_.typeOf(operand.id); }
  /// A Literal op of `dtype` (nullopt after an error, e.g. 0.5 as an i32).
  std::optional<ir::ValueId> materializeLiteral(const Operand& literal, ir::DType dtype);
  /// Converts `value` to `want` (a literal to a scalar, a transpose for another dim order);
  /// on mismatch calls `mismatch(got)` and returns poison.
  template <typename F>
  Operand coerce(const Operand& value, const ir::TensorType& want, llvm::SMLoc loc, F mismatch);
  Operand coerceTo(const Operand& value, const ir::TensorType& want, llvm::SMLoc loc,
                   const std::function<void(const std::string&)>& mismatch);
  void beginFunction(const std::string& name, llvm::SMLoc loc);
  void bindInputs(const std::vector<ast::TypedName>& inputs, Scope& scope);
  /// Declares a program's outputs (or a train block's metrics) unset; collectOutputs then
  /// appends each to fn_.outputs, reporting those never set.
  void bindOutputs(const std::vector<ast::TypedName>& outputs, Scope& scope);
  void collectOutputs(const std::vector<ast::TypedName>& outputs, Scope& scope);
  bool declare(Scope& scope, const ast::Ident& name, Binding binding);
  void lowerBlock(const std::vector<ast::StmtPtr>& body, Scope& scope, BlockKind kind,
                  llvm::SMLoc ownerLoc, const std::string& ownerName);
  void lowerStmt(const ast::Stmt& stmt, Scope& scope, BlockKind kind);
  void lowerLet(const ast::LetStmt& let, Scope& scope);
  void lowerAssign(const ast::AssignStmt& assign, Scope& scope);
  void lowerParam(const ast::ParamStmt& param, Scope& scope);
  void lowerRepeat(const ast::RepeatStmt& repeat, Scope& scope);
  void lowerMinimize(const ast::MinimizeStmt& minimize, Scope& scope);
  std::optional<ir::Initializer> lowerInitializer(const ast::CallExpr& init,
                                                  const ir::TensorType& type);
  std::optional<std::pair<std::string, std::vector<std::pair<std::string, ir::AttrValue>>>>
  lowerOptimizer(const ast::CallExpr& call);
  Operand inlineDef(const ast::DefDecl& def, const ast::CallExpr& call, Scope& scope);
  /// Inlines a call and returns every result (one for a def with one result); empty on errors.
  std::vector<Operand> inlineDefResults(const ast::DefDecl& def, const ast::CallExpr& call,
                                        Scope& scope);
  /// A call of an `extern def`: elementwise over f32 arguments broadcast by dim name.
  Operand lowerExternCall(const ExternInfo& ext, const ast::CallExpr& call, Scope& scope);
  std::string childPath(const std::string& segment) const;

  // ---- Generic.cpp: dim parameters, local dims, constants
  /// The IR dim that `name` stands for here (a dim parameter, a local dim or a global dim).
  std::optional<std::string> resolveDim(const std::string& name) const;
  /// Reports an unknown dim, unless it names a local dim whose declaration failed.
  void unknownDim(llvm::SMLoc loc, const std::string& name);
  /// Binds the dim parameters of a generic def at one call: explicitly from `callee[dims]`,
  /// then from the argument types. nullopt after an error (reported).
  std::optional<FrameDims> bindDimParams(const ast::DefDecl& def, const ast::CallExpr& call,
                                         const std::vector<Operand>& args);
  void lowerDimStmt(const ast::DimStmt& stmt, BlockKind kind);
  /// The IR name of a local dim of this size: its own name unless another size took it.
  std::string localDimName(const ast::Ident& name, int64_t size);
  /// Evaluates a constant expression; reports `what` must be constant when it is not.
  std::optional<Constant> constantValue(const ast::Expr& expr, const std::string& what);
  /// The same without reporting: tensor expressions fold their constant parts with it.
  std::optional<Constant> foldConstant(const ast::Expr& expr);
  std::optional<Constant> evalConstant(const ast::Expr& expr, const std::string* what);
  /// `size(d)` in a tensor expression: an integer literal.
  Operand lowerSize(const ast::CallExpr& call);
  /// A constant (sub)expression of a tensor expression as a literal, else poison.
  Operand foldedLiteral(const ast::Expr& expr);
  // ---- ParamsAndResults.cpp: shared and tied params, defs with several results, metrics
  /// The path of a param declared in the current frame (`as "path"` or its call path).
  std::string paramPathOf(const ast::ParamStmt& param);
  /// The param segment of a call of `def` from the current frame (`ffn#1`, `block[2]`); counts it.
  std::string paramSegmentOfCall(const ast::DefDecl& def);
  /// An earlier declaration of `path` in this function: its value (transposed to `type` if the
  /// dims are in another order), or poison after reporting a conflict. nullopt: a new path.
  std::optional<Operand> reuseParam(const std::string& path, const ir::TensorType& type,
                                    const ir::Initializer& init, bool trainable, llvm::SMLoc loc,
                                    ir::ParamRole role = ir::ParamRole::Weight);
  bool checkTiedPath(const ast::ParamStmt& param);
  void lowerSharedRepeatIteration(const ast::RepeatStmt& repeat, Scope& scope,
                                  const std::map<std::string, int>& callsBefore);
  void lowerReturn(const ast::ReturnStmt& ret, Scope& scope, BlockKind kind);
  std::optional<std::vector<ir::TensorType>> resultTypes(const ast::DefDecl& def);
  /// Checks the returned values of the def in the top frame against its result types.
  std::vector<Operand> coerceResults(const ast::DefDecl& def, llvm::SMLoc callLoc);
  void lowerBindResults(const ast::BindResultsStmt& bind, Scope& scope);
  /// Sets a let or an output to `value` (the checks of `name = value`).
  void assignValue(const ast::Ident& name, Operand value, llvm::SMLoc valueLoc, Scope& scope);
  /// Removes the ops appended from `opStart` on that neither `kept` nor a param needs (the ops
  /// of a discarded result), renumbering the values after them.
  void dropUnusedOps(size_t opStart, std::vector<Operand*> kept);
  void bindMetrics(const ast::TrainDecl& train, Scope& scope);
  void collectMetrics(const ast::TrainDecl& train, Scope& scope);

  // ---- StepState.cpp: `state name: type = init()` and `next name = expr`
  /// Whether a `state` may be declared here (in a train block or a def it calls, or a def
  /// checked alone); reports the error otherwise.
  bool checkStateAllowed(const ast::ParamStmt& state);
  void lowerNext(const ast::NextStmt& next, Scope& scope);
  /// Reports the step states of fn_ that no `next` wrote.
  void checkStatesWritten();

  // ---- expressions
  Operand lowerExpr(const ast::Expr& expr, Scope& scope);
  Operand lowerExprInner(const ast::Expr& expr, Scope& scope);
  Operand lowerName(const ast::NameExpr& name, Scope& scope);
  Operand lowerBinary(ir::OpKind kind, const char* spelling, Operand lhs, Operand rhs,
                      llvm::SMLoc loc);
  Operand binaryValues(ir::OpKind kind, const char* spelling, ir::ValueId a, ir::ValueId b,
                       llvm::SMLoc loc);

  // ---- Builtins.cpp
  Operand lowerBuiltin(const ast::CallExpr& call, Scope& scope);
  bool checkPositional(const ast::CallExpr& call, size_t min, size_t max);
  bool checkArrow(const ast::CallExpr& call, bool required);
  using KwMap = std::map<std::string, const ast::KeywordArg*>;
  std::optional<KwMap> keywords(const ast::CallExpr& call,
                                std::initializer_list<const char*> allowed);
  std::optional<double> numberArg(const KwMap& kw, const std::string& name, double fallback,
                                  bool integer, const std::string& callee);
  std::optional<std::string> dimArg(const ast::Expr& expr, const std::string& callee, size_t index);
  std::optional<std::string> declaredDim(const ast::Ident& ident);
  std::optional<std::vector<std::string>> arrowDims(const ast::CallExpr& call);
  std::optional<ir::ValueId> tensorArg(const ast::Expr& expr, Scope& scope);
  /// The first argument as a tensor type (`f32[batch, d]`) for the random builtins.
  std::optional<ir::TensorType> shapeArg(const ast::CallExpr& call, const char* example);
  bool checkFloat(const std::string& callee, ir::ValueId value, llvm::SMLoc loc);
  bool checkHasDim(const ir::TensorType& type, const std::string& dim, llvm::SMLoc loc);
  ir::Dim dim(const std::string& name) const;
  std::string randomStream(const std::string& opName);
  void noteIndexUse(ir::ValueId ids, int64_t bound);

  Operand lowerEinsum(const ast::CallExpr& call, Scope& scope);
  Operand lowerUnary(ir::OpKind kind, bool floatOnly, const ast::CallExpr& call, Scope& scope);
  Operand lowerWhere(const ast::CallExpr& call, Scope& scope);
  Operand lowerReduce(ir::OpKind kind, bool floatOnly, const ast::CallExpr& call, Scope& scope);
  Operand lowerAlongDim(ir::OpKind kind, const ast::CallExpr& call, Scope& scope);
  Operand lowerLayerNorm(const ast::CallExpr& call, Scope& scope);
  Operand lowerCumsum(const ast::CallExpr& call, Scope& scope);
  Operand lowerRename(const ast::CallExpr& call, Scope& scope);
  Operand lowerReshape(const ast::CallExpr& call, Scope& scope);
  Operand lowerTranspose(const ast::CallExpr& call, Scope& scope);
  /// slice(x, d -> e, start = k) and pad(x, d -> e, before = k), checked up to their own rules.
  struct WindowArgs {
    ir::ValueId x;
    std::string from, target;
    int64_t number;
    KwMap kw;
  };
  std::optional<WindowArgs> windowArgs(const ast::CallExpr& call, Scope& scope, const char* op,
                                       const char* key);
  Operand lowerSlice(const ast::CallExpr& call, Scope& scope);
  Operand lowerConcat(const ast::CallExpr& call, Scope& scope);
  Operand lowerPad(const ast::CallExpr& call, Scope& scope);
  Operand lowerShift(const ast::CallExpr& call, Scope& scope);
  Operand lowerOneHot(const ast::CallExpr& call, Scope& scope);
  Operand lowerGather(const ast::CallExpr& call, Scope& scope);
  Operand lowerIota(const ast::CallExpr& call, Scope& scope);
  Operand lowerRandom(ir::OpKind kind, const ast::CallExpr& call, Scope& scope);
  Operand lowerDropout(const ast::CallExpr& call, Scope& scope);
  Operand lowerCast(const ast::CallExpr& call, Scope& scope);
  Operand lowerClip(const ast::CallExpr& call, Scope& scope);
  /// mod, floordiv and '%': i32 operands (a literal is taken as i32).
  Operand lowerIntegerBinary(ir::OpKind kind, const char* spelling, Operand lhs, Operand rhs,
                             llvm::SMLoc loc);
  Operand lowerArgExtreme(bool isMax, const ast::CallExpr& call, Scope& scope);
  Operand lowerTopK(bool values, const ast::CallExpr& call, Scope& scope);
  Operand lowerScatterAdd(const ast::CallExpr& call, Scope& scope);
  Operand lowerRandomInt(const ast::CallExpr& call, Scope& scope);
  Operand lowerRandomPermutation(const ast::CallExpr& call, Scope& scope);

  Globals& globals_;
  Reporter& reporter_;
  llvm::SourceMgr& sources_;
  ir::Function fn_;
  std::vector<CallFrame> frames_;
  std::vector<const ast::DefDecl*> inlineStack_;
  size_t work_ = 0;
  size_t totalWork_ = 0; // never reset
  std::set<const ast::DefDecl*> inlinedDefs_;
  bool tooLarge_ = false;
  int depth_ = 0;                            // inlined defs and repeats
  int exprDepth_ = 0;                        // nested expressions, across inlined defs
  bool reportedDepth_ = false;               // the nesting limit is reported once
  std::set<std::string> reportedCycles_;     // recursive def cycles, across functions
  std::map<std::string, size_t> paramIndex_; // path -> index in fn_.params
  /// state path -> the `next` that wrote it in this function
  std::map<std::string, llvm::SMLoc> stateWrites_;
  /// While a generic def's signature is converted: its dim parameters' bindings.
  const FrameDims* signatureDims_ = nullptr;
};

/// Reports params of one path declared differently by two functions (a program and a train
/// block): they name one tensor in checkpoints, so type and initializer must agree.
void checkParamsAcrossFunctions(const std::vector<ir::Function>& functions, Reporter& reporter);
/// `f32[vocab, d_model] = normal(stddev = 0.02)` (a trainable param) or `const ...`.
std::string describeParam(const ir::TensorType& type, const ir::Initializer& init, bool trainable,
                          ir::ParamRole role = ir::ParamRole::Weight);

} // namespace meshc::sema
