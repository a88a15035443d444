// Semantic analysis of one program, train block or def (FunctionLowerer, sema/Lowering.h):
// scopes, statements and expressions lowered to ir ops. Defs are inlined at every call site;
// repeats are unrolled; builtins live in Builtins.cpp; the module level in Sema.cpp.
#include "sema/Lowering.h"

#include <llvm/Support/Casting.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>

#include <algorithm>

namespace meshc {
namespace sema {

using llvm::dyn_cast;
using llvm::SMLoc;

std::string joinNames(const std::vector<std::string>& names, const char* separator) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i ? separator : "") + names[i];
  return out;
}

std::string typeString(const ir::TensorType& type) {
  std::vector<std::string> names;
  for (const ir::Dim& d : type.dims)
    names.push_back(d.name);
  return fmt::format("{}[{}]", ir::dtypeName(type.dtype), joinNames(names));
}

static ir::DType convertDType(ast::DType dtype) {
  switch (dtype) {
  case ast::DType::F32:
    return ir::DType::F32;
  case ast::DType::BF16:
    return ir::DType::BF16;
  case ast::DType::F16:
    return ir::DType::F16;
  case ast::DType::I32:
    return ir::DType::I32;
  }
  return ir::DType::F32;
}

/// Same dtype and the same set of dims (in any order).
static bool sameDimSet(const ir::TensorType& a, const ir::TensorType& b) {
  if (a.dtype != b.dtype || a.dims.size() != b.dims.size()) return false;
  return std::all_of(a.dims.begin(), a.dims.end(),
                     [&](const ir::Dim& d) { return b.hasDim(d.name); });
}

// ------------------------------------------------------------------------- basics

ir::Location FunctionLowerer::location(SMLoc loc) const {
  ir::Location out;
  out.loc = loc;
  if (!loc.isValid()) return out;
  unsigned buffer = sources_.FindBufferContainingLoc(loc);
  if (buffer == 0) return out;
  out.file =
      llvm::sys::path::filename(sources_.getMemoryBuffer(buffer)->getBufferIdentifier()).str();
  auto [line, col] = sources_.getLineAndColumn(loc, buffer);
  out.line = line;
  out.col = col;
  return out;
}

std::optional<int64_t> FunctionLowerer::elementCount(const ir::TensorType& type) const {
  int64_t count = 1;
  for (const ir::Dim& d : type.dims)
    if (__builtin_mul_overflow(count, d.size, &count) || count > kMaxElements) return std::nullopt;
  return count;
}

std::optional<ir::TensorType> FunctionLowerer::convertType(const ast::TypeSpec& spec) {
  ir::TensorType type;
  type.dtype = convertDType(spec.dtype);
  bool ok = true;
  for (const ast::Ident& d : spec.dims) {
    std::optional<std::string> name = resolveDim(d.name); // a dim parameter's binding, ...
    if (!name) {
      unknownDim(d.loc, d.name);
      ok = false;
      continue;
    }
    if (type.hasDim(*name)) {
      error(d.loc, Diag::ErrDimListedTwice, *name,
            *name == d.name ? std::string("a type")
                            : fmt::format("a type (as the binding of '{}')", d.name));
      ok = false;
      continue;
    }
    type.dims.push_back({*name, globals_.dims.at(*name).size});
  }
  if (!ok) return std::nullopt;
  if (!elementCount(type)) {
    error(spec.loc, Diag::ErrTooManyElements, typeString(type));
    return std::nullopt;
  }
  return type;
}

bool FunctionLowerer::tick() {
  if (tooLarge_) return false;
  if (++work_ > kMaxWork || ++totalWork_ > kMaxTotalWork) {
    tooLarge_ = true;
    // Once the budget of the whole compilation is spent, the function that spent it was
    // reported; the others stop silently.
    if (totalWork_ <= kMaxTotalWork + 1) error(fn_.loc.loc, Diag::ErrTooLarge, fn_.name, kMaxWork);
    return false;
  }
  return true;
}

Operand FunctionLowerer::addOp(ir::OpKind kind, std::vector<ir::ValueId> operands,
                               ir::TensorType type, SMLoc loc,
                               std::vector<std::pair<std::string, ir::AttrValue>> attrs,
                               std::string name) {
  if (!tick()) return Operand::poison();
  if (!elementCount(type)) {
    error(loc, Diag::ErrTooManyElements, typeString(type));
    return Operand::poison();
  }
  ir::Op op;
  op.kind = kind;
  op.operands = std::move(operands);
  op.attrs = std::move(attrs);
  op.loc = location(loc);
  op.loc.call = frames_.empty() ? 0 : frames_.back().call;
  return Operand::tensor(fn_.addOp(std::move(op), std::move(type), std::move(name)), loc);
}

std::optional<ir::ValueId> FunctionLowerer::materializeLiteral(const Operand& literal,
                                                               ir::DType dtype) {
  if (dtype == ir::DType::I32 && !literal.isInteger) {
    error(literal.loc, Diag::ErrIntLiteral, fmt::format("{}", literal.number));
    return std::nullopt;
  }
  ir::TensorType type{dtype, {}};
  Operand result = addOp(ir::OpKind::Literal, {}, type, literal.loc, {{"value", literal.number}});
  if (result.isPoison()) return std::nullopt;
  return result.id;
}

template <typename F>
Operand FunctionLowerer::coerce(const Operand& value, const ir::TensorType& want, SMLoc loc,
                                F mismatch) {
  if (value.isPoison()) return value;
  if (value.kind == Operand::Kind::Literal) {
    if (!want.dims.empty()) {
      mismatch(std::string("f32[]"));
      return Operand::poison();
    }
    if (want.dtype == ir::DType::I32 && !value.isInteger) {
      error(value.loc, Diag::ErrIntLiteral, fmt::format("{}", value.number));
      return Operand::poison();
    }
    Operand result = addOp(ir::OpKind::Literal, {}, want, value.loc, {{"value", value.number}});
    return result;
  }
  const ir::TensorType& got = typeOf(value);
  if (got == want) return value;
  if (!sameDimSet(got, want)) {
    mismatch(typeString(got));
    return Operand::poison();
  }
  return addOp(ir::OpKind::Transpose, {value.id}, want, loc);
}

Operand FunctionLowerer::coerceTo(const Operand& value, const ir::TensorType& want, SMLoc loc,
                                  const std::function<void(const std::string&)>& mismatch) {
  return coerce(value, want, loc, mismatch);
}

std::string FunctionLowerer::childPath(const std::string& segment) const {
  const std::string& parent = frames_.back().path;
  return parent.empty() ? segment : parent + "/" + segment;
}

// ------------------------------------------------------------------------- functions

void FunctionLowerer::beginFunction(const std::string& name, SMLoc loc) {
  fn_ = ir::Function();
  fn_.name = name;
  fn_.loc = location(loc);
  frames_.assign(1, CallFrame());
  inlineStack_.clear();
  work_ = 0;
  tooLarge_ = false;
  depth_ = 0;
  exprDepth_ = 0;
  paramIndex_.clear();
  stateWrites_.clear();
}

bool FunctionLowerer::declare(Scope& scope, const ast::Ident& name, Binding binding) {
  if (Binding* previous = scope.find(name.name)) {
    if (error(name.loc, Diag::ErrRedefinition, "value", name.name))
      error(previous->loc, Diag::NotePreviousDefinition, name.name);
    return false;
  }
  binding.loc = name.loc;
  scope.names.emplace(name.name, std::move(binding));
  return true;
}

void FunctionLowerer::bindInputs(const std::vector<ast::TypedName>& inputs, Scope& scope) {
  for (const ast::TypedName& input : inputs) {
    Binding binding;
    binding.kind = Binding::Kind::Input;
    std::optional<ir::TensorType> type = convertType(input.type);
    if (type) {
      int64_t index = static_cast<int64_t>(fn_.inputs.size());
      binding.value = addOp(ir::OpKind::Input, {}, *type, input.name.loc,
                            {{"name", input.name.name}, {"index", index}}, input.name.name);
      binding.type = type;
      if (!binding.value.isPoison()) {
        ir::InputInfo info;
        info.name = input.name.name;
        info.type = *type;
        info.loc = location(input.name.loc);
        info.value = binding.value.id;
        fn_.inputs.push_back(std::move(info));
      }
    }
    declare(scope, input.name, std::move(binding));
  }
}

std::optional<ir::Function> FunctionLowerer::lowerProgram(const ast::ProgramDecl& program) {
  beginFunction(program.name.name, program.name.loc);
  fn_.kind = ir::Function::Kind::Program;
  Scope scope;
  bindInputs(program.inputs, scope);
  bindOutputs(program.outputs, scope);
  lowerBlock(program.body, scope, BlockKind::Program, program.name.loc, program.name.name);
  collectOutputs(program.outputs, scope);
  return std::move(fn_);
}

void FunctionLowerer::bindOutputs(const std::vector<ast::TypedName>& outputs, Scope& scope) {
  for (const ast::TypedName& output : outputs) {
    Binding binding;
    binding.kind = Binding::Kind::Output;
    binding.isSet = false;
    binding.type = convertType(output.type);
    declare(scope, output.name, std::move(binding));
  }
}

void FunctionLowerer::collectOutputs(const std::vector<ast::TypedName>& outputs, Scope& scope) {
  for (const ast::TypedName& output : outputs) {
    auto it = scope.names.find(output.name.name);
    if (it == scope.names.end() || it->second.kind != Binding::Kind::Output ||
        it->second.loc.getPointer() != output.name.loc.getPointer())
      continue; // a duplicate name, already reported
    const Binding& binding = it->second;
    if (!binding.isSet) {
      if (!tooLarge_) error(output.name.loc, Diag::ErrUnsetOutput, output.name.name);
      continue;
    }
    if (binding.value.isPoison()) continue;
    fn_.outputs.push_back({output.name.name, binding.value.id, location(output.name.loc)});
  }
}

std::optional<ir::Function> FunctionLowerer::lowerTrain(const ast::TrainDecl& train) {
  beginFunction(train.name.name, train.name.loc);
  fn_.kind = ir::Function::Kind::Train;
  Scope scope;
  bindInputs(train.inputs, scope);
  bindMetrics(train, scope);
  lowerBlock(train.body, scope, BlockKind::Train, train.name.loc, train.name.name);
  collectMetrics(train, scope);
  checkStatesWritten();
  return std::move(fn_);
}

void FunctionLowerer::checkDef(const ast::DefDecl& def) {
  // A generic def's types need its dim parameters' bindings: it is checked where it is called.
  if (!def.dimParams.empty()) return;
  beginFunction(def.name.name, def.name.loc);
  Scope scope;
  bindInputs(def.args, scope);
  for (auto& [name, binding] : scope.names)
    binding.kind = Binding::Kind::Let; // args may be rebound like lets
  frames_.back().def = &def;
  inlineStack_.push_back(&def);
  lowerBlock(def.body, scope, BlockKind::Def, def.name.loc, def.name.name);
  coerceResults(def, def.name.loc);
  checkStatesWritten();
}

// ------------------------------------------------------------------------- statements

void FunctionLowerer::lowerBlock(const std::vector<ast::StmtPtr>& body, Scope& scope,
                                 BlockKind kind, SMLoc ownerLoc, const std::string& ownerName) {
  for (size_t i = 0; i < body.size(); ++i) {
    if (tooLarge_) return;
    const ast::Stmt& stmt = *body[i];
    bool last = i + 1 == body.size();
    if (stmt.kind == ast::Stmt::Kind::Return) {
      if (kind != BlockKind::Def)
        error(stmt.loc, Diag::ErrReturnOutsideDef);
      else if (!last)
        error(body[i + 1]->loc, Diag::ErrStmtAfter, "return");
    } else if (stmt.kind == ast::Stmt::Kind::Minimize) {
      if (kind != BlockKind::Train)
        error(stmt.loc, Diag::ErrMinimizeOutsideTrain);
      else if (!last)
        error(body[i + 1]->loc, Diag::ErrStmtAfter, "minimize");
    }
    lowerStmt(stmt, scope, kind);
  }
  if (tooLarge_) return;
  // A misplaced return/minimize was reported above; only a missing one is reported here.
  ast::Stmt::Kind needed =
      kind == BlockKind::Def ? ast::Stmt::Kind::Return : ast::Stmt::Kind::Minimize;
  bool endsWith = std::any_of(body.begin(), body.end(),
                              [&](const ast::StmtPtr& s) { return s->kind == needed; });
  if (kind == BlockKind::Def && !endsWith) error(ownerLoc, Diag::ErrMissingReturn, ownerName);
  if (kind == BlockKind::Train && !endsWith) error(ownerLoc, Diag::ErrMissingMinimize, ownerName);
}

void FunctionLowerer::lowerStmt(const ast::Stmt& stmt, Scope& scope, BlockKind kind) {
  if (!tick()) return;
  switch (stmt.kind) {
  case ast::Stmt::Kind::Let:
    lowerLet(static_cast<const ast::LetStmt&>(stmt), scope);
    break;
  case ast::Stmt::Kind::Assign:
    lowerAssign(static_cast<const ast::AssignStmt&>(stmt), scope);
    break;
  case ast::Stmt::Kind::Param:
  case ast::Stmt::Kind::Const:
  case ast::Stmt::Kind::State:
    lowerParam(static_cast<const ast::ParamStmt&>(stmt), scope);
    break;
  case ast::Stmt::Kind::Next:
    lowerNext(static_cast<const ast::NextStmt&>(stmt), scope);
    break;
  case ast::Stmt::Kind::Repeat:
    lowerRepeat(static_cast<const ast::RepeatStmt&>(stmt), scope);
    break;
  case ast::Stmt::Kind::Return:
    lowerReturn(static_cast<const ast::ReturnStmt&>(stmt), scope, kind);
    break;
  case ast::Stmt::Kind::BindResults:
    lowerBindResults(static_cast<const ast::BindResultsStmt&>(stmt), scope);
    break;
  case ast::Stmt::Kind::Minimize:
    lowerMinimize(static_cast<const ast::MinimizeStmt&>(stmt), scope);
    break;
  case ast::Stmt::Kind::Dim:
    lowerDimStmt(static_cast<const ast::DimStmt&>(stmt), kind);
    break;
  }
}

void FunctionLowerer::lowerLet(const ast::LetStmt& let, Scope& scope) {
  Operand value = let.value ? lowerExpr(*let.value, scope) : Operand::poison();
  SMLoc valueLoc = let.value ? let.value->loc : let.loc;
  Binding binding;
  binding.kind = Binding::Kind::Let;
  if (let.type) {
    std::optional<ir::TensorType> declared = convertType(*let.type);
    binding.type = declared;
    if (declared)
      value = coerce(value, *declared, valueLoc, [&](const std::string& got) {
        error(valueLoc, Diag::ErrTypeMismatch, typeString(*declared), got);
      });
    else
      value = Operand::poison();
  } else if (value.kind == Operand::Kind::Literal) {
    value = coerce(value, ir::TensorType{ir::DType::F32, {}}, valueLoc, [](const std::string&) {});
  }
  if (!value.isPoison()) {
    binding.type = typeOf(value);
    if (fn_.values[value.id].name.empty()) fn_.values[value.id].name = let.name.name;
  }
  binding.value = value;
  declare(scope, let.name, std::move(binding));
}

void FunctionLowerer::lowerAssign(const ast::AssignStmt& assign, Scope& scope) {
  Operand value = assign.value ? lowerExpr(*assign.value, scope) : Operand::poison();
  SMLoc valueLoc = assign.value ? assign.value->loc : assign.loc;
  assignValue(assign.name, value, valueLoc, scope);
}

void FunctionLowerer::assignValue(const ast::Ident& name, Operand value, SMLoc valueLoc,
                                  Scope& scope) {
  Binding* binding = scope.find(name.name);
  if (!binding) {
    error(name.loc, Diag::ErrAssignUndeclared, name.name);
    return;
  }
  switch (binding->kind) {
  case Binding::Kind::Input:
    error(name.loc, Diag::ErrAssignReadOnly, "input", name.name);
    return;
  case Binding::Kind::Param:
    error(name.loc, Diag::ErrAssignReadOnly, "param", name.name);
    return;
  case Binding::Kind::Const:
    error(name.loc, Diag::ErrAssignReadOnly, "const", name.name);
    return;
  case Binding::Kind::State:
    error(name.loc, Diag::ErrAssignState, name.name);
    return;
  case Binding::Kind::Let:
  case Binding::Kind::Output:
    break;
  }
  bool isOutput = binding->kind == Binding::Kind::Output;
  binding->isSet = true;
  if (!binding->type) {
    // The declared type had errors, or the let's first value was poison.
    if (!isOutput && !value.isPoison()) {
      if (value.kind == Operand::Kind::Literal)
        value =
            coerce(value, ir::TensorType{ir::DType::F32, {}}, valueLoc, [](const std::string&) {});
      if (!value.isPoison() && !isOutput) binding->type = typeOf(value);
    }
    binding->value = isOutput ? Operand::poison() : value;
    return;
  }
  const ir::TensorType want = *binding->type;
  value = coerce(value, want, valueLoc, [&](const std::string& got) {
    if (isOutput)
      error(valueLoc, Diag::ErrOutputType, name.name, typeString(want), got);
    else
      error(valueLoc, Diag::ErrRebindType, name.name, typeString(want), got);
  });
  if (!value.isPoison() && fn_.values[value.id].name.empty()) fn_.values[value.id].name = name.name;
  binding->value = value;
}

void FunctionLowerer::lowerParam(const ast::ParamStmt& param, Scope& scope) {
  Binding binding;
  binding.kind = param.trainable() ? Binding::Kind::Param
                 : param.isState() ? Binding::Kind::State
                                   : Binding::Kind::Const;
  ir::ParamRole role = param.isState() ? ir::ParamRole::StepState : ir::ParamRole::Weight;
  std::optional<ir::TensorType> type = convertType(param.type);
  std::optional<ir::Initializer> init;
  if (type && param.init) init = lowerInitializer(*param.init, *type);
  if (type && init && checkTiedPath(param) && (!param.isState() || checkStateAllowed(param))) {
    std::string path = paramPathOf(param);
    binding.type = type;
    binding.statePath = param.isState() ? path : "";
    std::optional<Operand> earlier =
        reuseParam(path, *type, *init, param.trainable(), param.name.loc, role);
    binding.value = earlier ? *earlier
                            : addOp(ir::OpKind::Param, {}, *type, param.name.loc, {{"path", path}},
                                    param.name.name);
    if (!earlier && !binding.value.isPoison()) {
      paramIndex_[path] = fn_.params.size();
      ir::ParamInfo info;
      info.path = path;
      info.type = *type;
      info.init = std::move(*init);
      info.trainable = param.trainable();
      info.role = role;
      info.loc = location(param.name.loc);
      info.value = binding.value.id;
      fn_.params.push_back(std::move(info));
    }
  }
  declare(scope, param.name, std::move(binding));
}

void FunctionLowerer::lowerRepeat(const ast::RepeatStmt& repeat, Scope& scope) {
  int64_t count = 0;
  const ast::Expr* countExpr = repeat.count.get();
  std::optional<std::string> countDim;
  if (auto* number = countExpr ? dyn_cast<ast::NumberExpr>(countExpr) : nullptr) {
    if (number->isInteger && number->value >= 1 && number->value <= 1e15)
      count = static_cast<int64_t>(number->value);
  } else if (auto* name = countExpr ? dyn_cast<ast::NameExpr>(countExpr) : nullptr) {
    std::optional<std::string> dim = resolveDim(name->name);
    if (!dim) {
      unknownDim(name->loc, name->name);
      return;
    }
    count = globals_.dims.at(*dim).size;
    countDim = dim;
  }
  if (count < 1) {
    error(countExpr ? countExpr->loc : repeat.loc, Diag::ErrRepeatCount);
    return;
  }
  if (depth_ >= kMaxDepth) {
    if (!reportedDepth_)
      error(repeat.loc, Diag::ErrNestingTooDeepSema, "def calls and repeats", kMaxDepth);
    reportedDepth_ = true;
    return;
  }
  ++depth_;
  CallFrame& frame = frames_.back();
  std::string outerSuffix = frame.repeatSuffix;
  std::string outerParamSuffix = frame.paramSuffix;
  std::map<std::string, int> callsBefore = frame.paramCalls;
  // The values of enclosing blocks before the first iteration: those it rebinds are what one
  // iteration hands to the next (RepeatInfo::carried).
  std::map<Binding*, ir::ValueId> before;
  for (Scope* s = &scope; s; s = s->parent)
    for (auto& [name, binding] : s->names)
      if (binding.value.kind == Operand::Kind::Tensor) before[&binding] = binding.value.id;
  for (int64_t i = 0; i < count && !tooLarge_; ++i) {
    frames_.back().repeatSuffix = outerSuffix + fmt::format("[{}]", i);
    if (repeat.shared) {
      lowerSharedRepeatIteration(repeat, scope, callsBefore);
      continue;
    }
    frames_.back().paramSuffix = outerParamSuffix + fmt::format("[{}]", i);
    Scope inner;
    inner.parent = &scope;
    lowerBlock(repeat.body, inner, BlockKind::Repeat, repeat.loc, "repeat");
    tick();
  }
  frames_.back().repeatSuffix = outerSuffix;
  frames_.back().paramSuffix = outerParamSuffix;
  --depth_;
  if (countDim) {
    ir::RepeatInfo info{*countDim, {}};
    for (const auto& [binding, id] : before)
      if (binding->value.kind == Operand::Kind::Tensor && binding->value.id != id)
        info.carried.push_back(fn_.typeOf(binding->value.id));
    fn_.repeats.push_back(std::move(info));
  }
}

void FunctionLowerer::lowerMinimize(const ast::MinimizeStmt& minimize, Scope& scope) {
  Operand loss = minimize.loss ? lowerExpr(*minimize.loss, scope) : Operand::poison();
  if (loss.kind == Operand::Kind::Literal)
    loss = coerce(loss, ir::TensorType{ir::DType::F32, {}}, loss.loc, [](const std::string&) {});
  std::optional<std::pair<std::string, std::vector<std::pair<std::string, ir::AttrValue>>>>
      optimizer;
  if (minimize.optimizer) optimizer = lowerOptimizer(*minimize.optimizer);
  if (fn_.kind != ir::Function::Kind::Train || fn_.train || frames_.size() != 1) return;
  if (loss.isPoison()) return;
  const ir::TensorType& type = typeOf(loss);
  if (type.dtype != ir::DType::F32 || !type.dims.empty()) {
    error(minimize.loss->loc, Diag::ErrLossType, typeString(type));
    return;
  }
  if (!optimizer) return;
  ir::TrainInfo info;
  info.loss = loss.id;
  info.optimizer = optimizer->first;
  info.options = std::move(optimizer->second);
  info.loc = location(minimize.loc);
  fn_.train = std::move(info);
  fn_.outputs.push_back({"loss", loss.id, location(minimize.loc)});
}

// ------------------------------------------------------------------------- defs

Operand FunctionLowerer::inlineDef(const ast::DefDecl& def, const ast::CallExpr& call,
                                   Scope& scope) {
  if (def.hasSeveralResults()) {
    std::vector<std::string> names;
    for (const ast::TypedName& result : def.results)
      names.push_back(result.name.name);
    error(call.callee.loc, Diag::ErrSeveralResultsInExpr, def.name.name, def.results.size(),
          joinNames(names), def.name.name);
    return Operand::poison();
  }
  std::vector<Operand> results = inlineDefResults(def, call, scope);
  return results.empty() ? Operand::poison() : results.front();
}

std::vector<Operand> FunctionLowerer::inlineDefResults(const ast::DefDecl& def,
                                                       const ast::CallExpr& call, Scope& scope) {
  // Lower the arguments in the caller's scope first.
  std::vector<Operand> args;
  for (const ast::ExprPtr& arg : call.args)
    args.push_back(lowerExpr(*arg, scope));
  if (call.hasArrow) {
    error(call.arrowLoc, Diag::ErrUnexpectedArrow, def.name.name);
    return {};
  }
  if (!call.kwargs.empty()) {
    error(call.kwargs.front().name.loc, Diag::ErrUnknownKeyword, call.kwargs.front().name.name,
          def.name.name);
    return {};
  }
  if (args.size() != def.args.size()) {
    error(call.callee.loc, Diag::ErrArity, def.name.name, def.args.size(), args.size());
    return {};
  }
  auto onStack = std::find(inlineStack_.begin(), inlineStack_.end(), &def);
  if (onStack != inlineStack_.end()) {
    std::vector<std::string> chain;
    for (auto it = onStack; it != inlineStack_.end(); ++it)
      chain.push_back((*it)->name.name);
    chain.push_back(def.name.name);
    // Report each cycle once, whichever def it was entered from.
    std::vector<std::string> members(chain.begin(), chain.end() - 1);
    std::sort(members.begin(), members.end());
    if (!reportedCycles_.insert(joinNames(members)).second) return {};
    error(call.callee.loc, Diag::ErrRecursiveDef, def.name.name, joinNames(chain, " -> "));
    return {};
  }
  if (depth_ >= kMaxDepth) {
    if (!reportedDepth_)
      error(call.callee.loc, Diag::ErrNestingTooDeepSema, "def calls and repeats", kMaxDepth);
    reportedDepth_ = true;
    return {};
  }
  if (tooLarge_) return {};

  // A generic def's dim parameters are bound first: its signature's types are read with them.
  std::optional<FrameDims> dims = bindDimParams(def, call, args);
  if (!dims) return {};
  signatureDims_ = &*dims;
  // Arguments take the declared types (transposed if needed).
  Scope defScope;
  bool ok = true;
  for (size_t i = 0; i < args.size(); ++i) {
    const ast::TypedName& formal = def.args[i];
    Binding binding;
    binding.kind = Binding::Kind::Let;
    std::optional<ir::TensorType> type = convertType(formal.type);
    binding.type = type;
    if (type) {
      SMLoc argLoc = call.args[i]->loc;
      binding.value = coerce(args[i], *type, argLoc, [&](const std::string& got) {
        error(argLoc, Diag::ErrArgType, formal.name.name, def.name.name, typeString(*type), got);
      });
    }
    if (binding.value.isPoison()) ok = false;
    declare(defScope, formal.name, std::move(binding));
  }
  bool signatureOk = ok && resultTypes(def);
  signatureDims_ = nullptr;
  if (!signatureOk) return {};

  CallFrame& caller = frames_.back();
  int& calls = caller.defCalls[def.name.name + caller.repeatSuffix];
  std::string segment = def.name.name;
  if (calls > 0) segment += fmt::format("#{}", calls);
  segment += caller.repeatSuffix;
  ++calls;
  inlinedDefs_.insert(&def);
  CallFrame frame;
  frame.path = childPath(segment);
  {
    const std::string& parent = caller.paramPath;
    std::string paramSegment = paramSegmentOfCall(def);
    frame.paramPath = parent.empty() ? paramSegment : parent + "/" + paramSegment;
  }
  frame.def = &def;
  frame.dims = std::move(*dims);
  fn_.calls.push_back(
      ir::DefCall{def.name.name, frame.path, caller.call,
                  def.isRecompute() || globals_.recomputeOption.count(def.name.name)});
  frame.call = static_cast<uint32_t>(fn_.calls.size());
  frames_.push_back(std::move(frame));
  inlineStack_.push_back(&def);
  ++depth_;
  lowerBlock(def.body, defScope, BlockKind::Def, def.name.loc, def.name.name);
  --depth_;
  inlineStack_.pop_back();
  std::vector<Operand> results = coerceResults(def, call.callee.loc);
  frames_.pop_back();
  return results;
}

// ------------------------------------------------------------------------- expressions

Operand FunctionLowerer::lowerName(const ast::NameExpr& name, Scope& scope) {
  if (Binding* binding = scope.find(name.name)) {
    if (!binding->isSet) {
      error(name.loc, Diag::ErrOutputReadBeforeSet, name.name);
      return Operand::poison();
    }
    Operand value = binding->value;
    value.loc = name.loc;
    return value;
  }
  if (resolveDim(name.name)) {
    error(name.loc, Diag::ErrNotAValue, fmt::format("dim '{}'", name.name));
    return Operand::poison();
  }
  if (globals_.defs.count(name.name)) {
    error(name.loc, Diag::ErrNotAValue, fmt::format("def '{}'", name.name));
    return Operand::poison();
  }
  error(name.loc, Diag::ErrUnknownName, name.name);
  return Operand::poison();
}

Operand FunctionLowerer::lowerBinary(ir::OpKind kind, const char* spelling, Operand lhs,
                                     Operand rhs, SMLoc loc) {
  if (lhs.isPoison() || rhs.isPoison()) return Operand::poison();
  bool lhsLiteral = lhs.kind == Operand::Kind::Literal;
  bool rhsLiteral = rhs.kind == Operand::Kind::Literal;
  std::optional<ir::ValueId> a = lhs.id, b = rhs.id;
  if (lhsLiteral && rhsLiteral) {
    a = materializeLiteral(lhs, ir::DType::F32);
    b = materializeLiteral(rhs, ir::DType::F32);
  } else if (lhsLiteral) {
    a = materializeLiteral(lhs, fn_.typeOf(rhs.id).dtype);
  } else if (rhsLiteral) {
    b = materializeLiteral(rhs, fn_.typeOf(lhs.id).dtype);
  }
  if (!a || !b) return Operand::poison();
  return binaryValues(kind, spelling, *a, *b, loc);
}

Operand FunctionLowerer::binaryValues(ir::OpKind kind, const char* spelling, ir::ValueId a,
                                      ir::ValueId b, SMLoc loc) {
  const ir::TensorType& ta = fn_.typeOf(a);
  const ir::TensorType& tb = fn_.typeOf(b);
  if (ta.dtype != tb.dtype) {
    error(loc, Diag::ErrDTypeMismatch, spelling, typeString(ta), typeString(tb));
    return Operand::poison();
  }
  ir::TensorType result = ta;
  for (const ir::Dim& d : tb.dims)
    if (!result.hasDim(d.name)) result.dims.push_back(d);
  switch (kind) {
  case ir::OpKind::Lt:
  case ir::OpKind::Le:
  case ir::OpKind::Gt:
  case ir::OpKind::Ge:
  case ir::OpKind::Eq:
  case ir::OpKind::Ne:
    result.dtype = ir::DType::I32;
    break;
  default:
    break;
  }
  return addOp(kind, {a, b}, std::move(result), loc);
}

Operand FunctionLowerer::lowerExpr(const ast::Expr& expr, Scope& scope) {
  if (tooLarge_) return Operand::poison();
  // Each inlined def may nest expressions as deeply as the parser allows; bound the sum.
  if (exprDepth_ >= kMaxExprDepth) {
    if (!reportedDepth_)
      error(expr.loc, Diag::ErrNestingTooDeepSema, "expressions of inlined defs", kMaxExprDepth);
    reportedDepth_ = true;
    return Operand::poison();
  }
  ++exprDepth_;
  Operand result = lowerExprInner(expr, scope);
  --exprDepth_;
  return result;
}

Operand FunctionLowerer::lowerExprInner(const ast::Expr& expr, Scope& scope) {
  switch (expr.kind) {
  case ast::Expr::Kind::Number: {
    auto& number = static_cast<const ast::NumberExpr&>(expr);
    Operand literal;
    literal.kind = Operand::Kind::Literal;
    literal.number = number.value;
    literal.isInteger = number.isInteger;
    literal.loc = number.loc;
    return literal;
  }
  case ast::Expr::Kind::Name:
    return lowerName(static_cast<const ast::NameExpr&>(expr), scope);
  case ast::Expr::Kind::Unary: {
    if (Operand folded = foldedLiteral(expr); !folded.isPoison()) return folded;
    auto& unary = static_cast<const ast::UnaryExpr&>(expr);
    Operand operand = unary.operand ? lowerExpr(*unary.operand, scope) : Operand::poison();
    if (operand.kind == Operand::Kind::Literal) {
      operand.number = -operand.number;
      operand.loc = unary.loc;
      return operand;
    }
    if (operand.isPoison()) return operand;
    return addOp(ir::OpKind::Neg, {operand.id}, typeOf(operand), unary.loc);
  }
  case ast::Expr::Kind::Binary: {
    if (Operand folded = foldedLiteral(expr); !folded.isPoison()) return folded;
    auto& binary = static_cast<const ast::BinaryExpr&>(expr);
    Operand lhs = binary.lhs ? lowerExpr(*binary.lhs, scope) : Operand::poison();
    Operand rhs = binary.rhs ? lowerExpr(*binary.rhs, scope) : Operand::poison();
    SMLoc loc = binary.opLoc.isValid() ? binary.opLoc : binary.loc;
    static const std::pair<ir::OpKind, const char*> kOps[] = {
        {ir::OpKind::Add, "+"}, {ir::OpKind::Sub, "-"},  {ir::OpKind::Mul, "*"},
        {ir::OpKind::Div, "/"}, {ir::OpKind::Pow, "**"}, {ir::OpKind::Lt, "<"},
        {ir::OpKind::Le, "<="}, {ir::OpKind::Gt, ">"},   {ir::OpKind::Ge, ">="},
        {ir::OpKind::Eq, "=="}, {ir::OpKind::Ne, "!="},  {ir::OpKind::Mod, "%"}};
    auto [kind, spelling] = kOps[static_cast<int>(binary.op)];
    if (kind == ir::OpKind::Mod) return lowerIntegerBinary(kind, spelling, lhs, rhs, loc);
    return lowerBinary(kind, spelling, lhs, rhs, loc);
  }
  case ast::Expr::Kind::Call: {
    auto& call = static_cast<const ast::CallExpr&>(expr);
    auto def = globals_.defs.find(call.callee.name);
    if (def != globals_.defs.end()) return inlineDef(*def->second, call, scope);
    if (call.hasDimArgs) {
      error(call.callee.loc, Diag::ErrDimArgCount, call.callee.name, 0, call.dimArgs.size());
      return Operand::poison();
    }
    auto ext = globals_.externs.find(call.callee.name);
    if (ext != globals_.externs.end()) return lowerExternCall(ext->second, call, scope);
    if (Operand folded = foldedLiteral(expr); !folded.isPoison()) return folded;
    if (call.callee.name == "size") return lowerSize(call);
    return lowerBuiltin(call, scope);
  }
  case ast::Expr::Kind::List:
    error(expr.loc, Diag::ErrNotAValue, "a list");
    return Operand::poison();
  case ast::Expr::Kind::Type:
    error(expr.loc, Diag::ErrNotAValue, "a type");
    return Operand::poison();
  }
  return Operand::poison();
}

Operand FunctionLowerer::lowerExternCall(const ExternInfo& ext, const ast::CallExpr& call,
                                         Scope& scope) {
  std::vector<Operand> args;
  for (const ast::ExprPtr& arg : call.args)
    args.push_back(lowerExpr(*arg, scope));
  if (!checkArrow(call, false) || !keywords(call, {})) return Operand::poison();
  const ast::ExternDecl& decl = *ext.decl;
  if (args.size() != decl.params.size()) {
    error(call.callee.loc, Diag::ErrExternArity, decl.name.name, decl.params.size(), args.size());
    return Operand::poison();
  }
  std::vector<ir::ValueId> ids;
  ir::TensorType result; // f32, dims: every argument's, in order of first appearance
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].isPoison()) return Operand::poison();
    std::optional<ir::ValueId> id = args[i].id;
    if (args[i].kind == Operand::Kind::Literal) id = materializeLiteral(args[i], ir::DType::F32);
    if (!id) return Operand::poison();
    const ir::TensorType& type = fn_.typeOf(*id);
    if (type.dtype != ir::DType::F32) {
      error(call.args[i]->loc, Diag::ErrArgType, decl.params[i].name.name, decl.name.name, "f32",
            typeString(type));
      return Operand::poison();
    }
    for (const ir::Dim& d : type.dims)
      if (!result.hasDim(d.name)) result.dims.push_back(d);
    ids.push_back(*id);
  }
  return addOp(ir::OpKind::Call, std::move(ids), std::move(result), call.callee.loc,
               {{"function", decl.name.name}, {"header", ext.header}});
}

} // namespace sema

} // namespace meshc
