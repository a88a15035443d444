// Checking and lowering of builtin calls, param initializers and optimizers. Each builtin
// checks its arity, its '->' list, its keyword arguments and its dims, then emits one op.
#include "sema/Lowering.h"

#include <llvm/ADT/StringSwitch.h>
#include <llvm/Support/Casting.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace meshc::sema {

using llvm::dyn_cast;
using llvm::SMLoc;

namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string arityText(size_t min, size_t max) {
  if (min == max) return fmt::format("{}", min);
  if (max == std::numeric_limits<size_t>::max()) return fmt::format("at least {}", min);
  return fmt::format("{} to {}", min, max);
}

constexpr size_t kMany = std::numeric_limits<size_t>::max();

} // namespace

// ------------------------------------------------------------------------- argument helpers

bool FunctionLowerer::checkPositional(const ast::CallExpr& call, size_t min, size_t max) {
  size_t count = call.args.size();
  if (count >= min && count <= max) return true;
  error(call.callee.loc, Diag::ErrArity, call.callee.name, arityText(min, max), count);
  return false;
}

bool FunctionLowerer::checkArrow(const ast::CallExpr& call, bool required) {
  if (required && !call.hasArrow) {
    error(call.callee.loc, Diag::ErrMissingArrow, call.callee.name);
    return false;
  }
  if (!required && call.hasArrow) {
    error(call.arrowLoc, Diag::ErrUnexpectedArrow, call.callee.name);
    return false;
  }
  return true;
}

std::optional<FunctionLowerer::KwMap>
FunctionLowerer::keywords(const ast::CallExpr& call, std::initializer_list<const char*> allowed) {
  KwMap out;
  bool ok = true;
  for (const ast::KeywordArg& kw : call.kwargs) {
    bool known = std::any_of(allowed.begin(), allowed.end(),
                             [&](const char* name) { return kw.name.name == name; });
    if (!known) {
      error(kw.name.loc, Diag::ErrUnknownKeyword, kw.name.name, call.callee.name);
      ok = false;
    } else if (!out.emplace(kw.name.name, &kw).second) {
      error(kw.name.loc, Diag::ErrDuplicateKeyword, kw.name.name);
      ok = false;
    }
  }
  if (!ok) return std::nullopt;
  return out;
}

std::optional<double> FunctionLowerer::numberArg(const KwMap& kw, const std::string& name,
                                                 double fallback, bool integer,
                                                 const std::string& callee) {
  auto it = kw.find(name);
  if (it == kw.end()) return fallback;
  const ast::KeywordArg& arg = *it->second;
  std::optional<Constant> literal =
      arg.value
          ? constantValue(*arg.value, fmt::format("keyword argument '{}' of '{}'", name, callee))
          : std::nullopt;
  if (!literal) return std::nullopt; // reported
  if ((integer && (!literal->isInteger || std::fabs(literal->value) > 1e15)) ||
      !std::isfinite(literal->value)) {
    error(arg.value ? arg.value->loc : arg.name.loc, Diag::ErrExpectedLiteral, name, callee,
          integer ? "an integer" : "a finite");
    return std::nullopt;
  }
  return literal->value;
}

std::optional<std::string> FunctionLowerer::declaredDim(const ast::Ident& ident) {
  std::optional<std::string> dim = resolveDim(ident.name); // a dim parameter's binding, ...
  if (!dim) unknownDim(ident.loc, ident.name);
  return dim;
}

std::optional<std::string> FunctionLowerer::dimArg(const ast::Expr& expr, const std::string& callee,
                                                   size_t index) {
  auto* name = dyn_cast<ast::NameExpr>(&expr);
  if (!name) {
    error(expr.loc, Diag::ErrExpectedDimArg, index + 1, callee);
    return std::nullopt;
  }
  return declaredDim(ast::Ident{name->name, name->loc});
}

std::optional<std::vector<std::string>> FunctionLowerer::arrowDims(const ast::CallExpr& call) {
  std::vector<std::string> out;
  bool ok = true;
  for (const ast::Ident& ident : call.arrowDims) {
    std::optional<std::string> dim = declaredDim(ident);
    if (!dim) {
      ok = false;
      continue;
    }
    if (contains(out, *dim)) {
      error(ident.loc, Diag::ErrDimListedTwice, *dim,
            fmt::format("the output of '{}'", call.callee.name));
      ok = false;
      continue;
    }
    out.push_back(*dim);
  }
  if (!ok) return std::nullopt;
  return out;
}

std::optional<ir::ValueId> FunctionLowerer::tensorArg(const ast::Expr& expr, Scope& scope) {
  Operand value = lowerExpr(expr, scope);
  if (value.kind == Operand::Kind::Literal) return materializeLiteral(value, ir::DType::F32);
  if (value.isPoison()) return std::nullopt;
  return value.id;
}

std::optional<ir::TensorType> FunctionLowerer::shapeArg(const ast::CallExpr& call,
                                                        const char* example) {
  auto* spec = dyn_cast<ast::TypeExpr>(call.args[0].get());
  if (!spec || !spec->type.hasShape) {
    error(call.args[0]->loc, Diag::ErrExpectedType, 1, call.callee.name, example);
    return std::nullopt;
  }
  return convertType(spec->type);
}

bool FunctionLowerer::checkFloat(const std::string& callee, ir::ValueId value, SMLoc loc) {
  const ir::TensorType& type = fn_.typeOf(value);
  if (ir::isFloat(type.dtype)) return true;
  error(loc, Diag::ErrFloatOnly, callee, typeString(type));
  return false;
}

bool FunctionLowerer::checkHasDim(const ir::TensorType& type, const std::string& name, SMLoc loc) {
  if (type.hasDim(name)) return true;
  error(loc, Diag::ErrNotDimOf, name, typeString(type));
  return false;
}

ir::Dim FunctionLowerer::dim(const std::string& name) const {
  auto it = globals_.dims.find(name);
  return {name, it == globals_.dims.end() ? 1 : it->second.size};
}

std::string FunctionLowerer::randomStream(const std::string& opName) {
  CallFrame& frame = frames_.back();
  int& count = frame.randomCount[frame.repeatSuffix];
  return fmt::format("{}#{}", childPath(opName + frame.repeatSuffix), count++);
}

void FunctionLowerer::noteIndexUse(ir::ValueId ids, int64_t bound) {
  ir::ValueId value = ids;
  for (int steps = 0; steps < 64 && value < fn_.values.size(); ++steps) {
    const ir::Op& op = fn_.definingOp(value);
    switch (op.kind) {
    case ir::OpKind::Input: {
      int64_t index = op.integer("index", -1);
      if (index < 0 || static_cast<size_t>(index) >= fn_.inputs.size()) return;
      int64_t& current = fn_.inputs[index].indexBound;
      current = current == 0 ? bound : std::min(current, bound);
      return;
    }
    case ir::OpKind::Rename:
    case ir::OpKind::Reshape:
    case ir::OpKind::Transpose:
    case ir::OpKind::Slice:
      if (op.operands.empty()) return;
      value = op.operands[0];
      break;
    default:
      return;
    }
  }
}

// ------------------------------------------------------------------------- dispatch

Operand FunctionLowerer::lowerBuiltin(const ast::CallExpr& call, Scope& scope) {
  using K = ir::OpKind;
  const std::string& name = call.callee.name;
  struct Unary {
    const char* name;
    K kind;
  };
  static const Unary kUnary[] = {{"exp", K::Exp},     {"log", K::Log},         {"sqrt", K::Sqrt},
                                 {"rsqrt", K::Rsqrt}, {"square", K::Square},   {"floor", K::Floor},
                                 {"tanh", K::Tanh},   {"sigmoid", K::Sigmoid}, {"relu", K::Relu},
                                 {"gelu", K::Gelu},   {"sin", K::Sin},         {"cos", K::Cos},
                                 {"ceil", K::Ceil},   {"round", K::Round}};
  for (const Unary& unary : kUnary)
    if (name == unary.name) return lowerUnary(unary.kind, true, call, scope);
  if (name == "stop_gradient") return lowerUnary(K::StopGradient, false, call, scope);
  if (name == "abs") return lowerUnary(K::Abs, false, call, scope); // i32 too
  if (name == "clip") return lowerClip(call, scope);
  if (name == "argmax" || name == "argmin") return lowerArgExtreme(name == "argmax", call, scope);
  if (name == "scatter_add") return lowerScatterAdd(call, scope);
  if (name == "random_int") return lowerRandomInt(call, scope);
  if (name == "random_permutation") return lowerRandomPermutation(call, scope);
  if (name == "top_k_indices" || name == "top_k_values")
    return lowerTopK(name == "top_k_values", call, scope);
  if (name == "mod" || name == "floordiv") {
    std::vector<Operand> args;
    for (const ast::ExprPtr& arg : call.args)
      args.push_back(lowerExpr(*arg, scope));
    if (!checkPositional(call, 2, 2) || !checkArrow(call, false) || !keywords(call, {}))
      return Operand::poison();
    return lowerIntegerBinary(name == "mod" ? K::Mod : K::FloorDiv, name.c_str(), args[0], args[1],
                              call.callee.loc);
  }
  if (name == "maximum" || name == "minimum" || name == "pow") {
    K kind = name == "maximum" ? K::Maximum : name == "minimum" ? K::Minimum : K::Pow;
    std::vector<Operand> args;
    for (const ast::ExprPtr& arg : call.args)
      args.push_back(lowerExpr(*arg, scope));
    if (!checkPositional(call, 2, 2) || !checkArrow(call, false) || !keywords(call, {}))
      return Operand::poison();
    return lowerBinary(kind, name.c_str(), args[0], args[1], call.callee.loc);
  }
  if (name == "einsum") return lowerEinsum(call, scope);
  if (name == "where") return lowerWhere(call, scope);
  if (name == "sum") return lowerReduce(K::ReduceSum, false, call, scope);
  if (name == "mean") return lowerReduce(K::ReduceMean, true, call, scope);
  if (name == "max") return lowerReduce(K::ReduceMax, false, call, scope);
  if (name == "min") return lowerReduce(K::ReduceMin, false, call, scope);
  if (name == "logsumexp") return lowerReduce(K::LogSumExp, true, call, scope);
  if (name == "softmax") return lowerAlongDim(K::Softmax, call, scope);
  if (name == "log_softmax") return lowerAlongDim(K::LogSoftmax, call, scope);
  if (name == "layer_norm") return lowerLayerNorm(call, scope);
  if (name == "cumsum") return lowerCumsum(call, scope);
  if (name == "rename") return lowerRename(call, scope);
  if (name == "reshape") return lowerReshape(call, scope);
  if (name == "transpose") return lowerTranspose(call, scope);
  if (name == "slice") return lowerSlice(call, scope);
  if (name == "concat") return lowerConcat(call, scope);
  if (name == "pad") return lowerPad(call, scope);
  if (name == "shift") return lowerShift(call, scope);
  if (name == "one_hot") return lowerOneHot(call, scope);
  if (name == "gather") return lowerGather(call, scope);
  if (name == "iota") return lowerIota(call, scope);
  if (name == "normal") return lowerRandom(K::RandomNormal, call, scope);
  if (name == "uniform") return lowerRandom(K::RandomUniform, call, scope);
  if (name == "dropout") return lowerDropout(call, scope);
  if (name == "cast") return lowerCast(call, scope);
  error(call.callee.loc, Diag::ErrUnknownFunction, name);
  return Operand::poison();
}

// ------------------------------------------------------------------------- builtins

Operand FunctionLowerer::lowerUnary(ir::OpKind kind, bool floatOnly, const ast::CallExpr& call,
                                    Scope& scope) {
  if (!checkPositional(call, 1, 1) || !checkArrow(call, false) || !keywords(call, {}))
    return Operand::poison();
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  if (!x || (floatOnly && !checkFloat(call.callee.name, *x, call.callee.loc)))
    return Operand::poison();
  return addOp(kind, {*x}, fn_.typeOf(*x), call.callee.loc);
}

Operand FunctionLowerer::lowerEinsum(const ast::CallExpr& call, Scope& scope) {
  std::vector<std::optional<ir::ValueId>> inputs;
  for (const ast::ExprPtr& arg : call.args)
    inputs.push_back(tensorArg(*arg, scope));
  if (!checkPositional(call, 1, kMany) || !checkArrow(call, true) || !keywords(call, {}))
    return Operand::poison();
  std::optional<std::vector<std::string>> out = arrowDims(call);
  std::vector<ir::ValueId> ids;
  for (const auto& input : inputs) {
    if (!input) return Operand::poison();
    ids.push_back(*input);
  }
  if (!checkFloat("einsum", ids[0], call.args[0]->loc)) return Operand::poison();
  for (size_t i = 1; i < ids.size(); ++i) {
    if (fn_.typeOf(ids[i]).dtype != fn_.typeOf(ids[0]).dtype) {
      error(call.args[i]->loc, Diag::ErrDTypeMismatch, "einsum", typeString(fn_.typeOf(ids[0])),
            typeString(fn_.typeOf(ids[i])));
      return Operand::poison();
    }
  }
  if (!out) return Operand::poison();
  ir::TensorType result{fn_.typeOf(ids[0]).dtype, {}};
  bool ok = true;
  for (size_t i = 0; i < out->size(); ++i) {
    const std::string& name = (*out)[i];
    bool found = std::any_of(ids.begin(), ids.end(),
                             [&](ir::ValueId id) { return fn_.typeOf(id).hasDim(name); });
    if (!found) {
      error(call.arrowDims[i].loc, Diag::ErrEinsumOutputDim, name);
      ok = false;
    }
    result.dims.push_back(dim(name));
  }
  if (!ok) return Operand::poison();
  return addOp(ir::OpKind::Einsum, std::move(ids), std::move(result), call.callee.loc);
}

Operand FunctionLowerer::lowerWhere(const ast::CallExpr& call, Scope& scope) {
  std::vector<Operand> args;
  for (const ast::ExprPtr& arg : call.args)
    args.push_back(lowerExpr(*arg, scope));
  if (!checkPositional(call, 3, 3) || !checkArrow(call, false) || !keywords(call, {}))
    return Operand::poison();
  for (const Operand& arg : args)
    if (arg.isPoison()) return Operand::poison();
  std::optional<ir::ValueId> cond = args[0].id;
  if (args[0].kind == Operand::Kind::Literal) cond = materializeLiteral(args[0], ir::DType::I32);
  bool aLiteral = args[1].kind == Operand::Kind::Literal;
  bool bLiteral = args[2].kind == Operand::Kind::Literal;
  std::optional<ir::ValueId> a = args[1].id, b = args[2].id;
  if (aLiteral && bLiteral) {
    a = materializeLiteral(args[1], ir::DType::F32);
    b = materializeLiteral(args[2], ir::DType::F32);
  } else if (aLiteral) {
    a = materializeLiteral(args[1], fn_.typeOf(*b).dtype);
  } else if (bLiteral) {
    b = materializeLiteral(args[2], fn_.typeOf(*a).dtype);
  }
  if (!cond || !a || !b) return Operand::poison();
  const ir::TensorType& tc = fn_.typeOf(*cond);
  const ir::TensorType& ta = fn_.typeOf(*a);
  const ir::TensorType& tb = fn_.typeOf(*b);
  if (tc.dtype != ir::DType::I32) {
    error(call.args[0]->loc, Diag::ErrWhereCondition, typeString(tc));
    return Operand::poison();
  }
  if (ta.dtype != tb.dtype) {
    error(call.callee.loc, Diag::ErrDTypeMismatch, "where", typeString(ta), typeString(tb));
    return Operand::poison();
  }
  ir::TensorType result = ta;
  for (const ir::TensorType* t : {&tb, &tc})
    for (const ir::Dim& d : t->dims)
      if (!result.hasDim(d.name)) result.dims.push_back(d);
  return addOp(ir::OpKind::Where, {*cond, *a, *b}, std::move(result), call.callee.loc);
}

Operand FunctionLowerer::lowerReduce(ir::OpKind kind, bool floatOnly, const ast::CallExpr& call,
                                     Scope& scope) {
  if (!checkPositional(call, 1, kMany) || !checkArrow(call, false) || !keywords(call, {}))
    return Operand::poison();
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  if (!x || (floatOnly && !checkFloat(call.callee.name, *x, call.callee.loc)))
    return Operand::poison();
  const ir::TensorType& type = fn_.typeOf(*x);
  std::vector<std::string> dims;
  bool ok = true;
  for (size_t i = 1; i < call.args.size(); ++i) {
    std::optional<std::string> d = dimArg(*call.args[i], call.callee.name, i);
    if (!d || !checkHasDim(type, *d, call.args[i]->loc)) {
      ok = false;
      continue;
    }
    if (contains(dims, *d)) {
      error(call.args[i]->loc, Diag::ErrDimListedTwice, *d, fmt::format("'{}'", call.callee.name));
      ok = false;
      continue;
    }
    dims.push_back(*d);
  }
  if (!ok) return Operand::poison();
  if (call.args.size() == 1)
    for (const ir::Dim& d : type.dims)
      dims.push_back(d.name);
  ir::TensorType result{type.dtype, {}};
  for (const ir::Dim& d : type.dims)
    if (!contains(dims, d.name)) result.dims.push_back(d);
  return addOp(kind, {*x}, std::move(result), call.callee.loc, {{"dims", dims}});
}

Operand FunctionLowerer::lowerAlongDim(ir::OpKind kind, const ast::CallExpr& call, Scope& scope) {
  if (!checkPositional(call, 2, 2) || !checkArrow(call, false) || !keywords(call, {}))
    return Operand::poison();
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  std::optional<std::string> d = dimArg(*call.args[1], call.callee.name, 1);
  if (!x || !d || !checkFloat(call.callee.name, *x, call.callee.loc) ||
      !checkHasDim(fn_.typeOf(*x), *d, call.args[1]->loc))
    return Operand::poison();
  return addOp(kind, {*x}, fn_.typeOf(*x), call.callee.loc, {{"dim", *d}});
}

Operand FunctionLowerer::lowerLayerNorm(const ast::CallExpr& call, Scope& scope) {
  std::optional<KwMap> kw = keywords(call, {"eps"});
  if (!checkPositional(call, 2, kMany) || !checkArrow(call, false) || !kw) return Operand::poison();
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  if (!x || !checkFloat("layer_norm", *x, call.callee.loc)) return Operand::poison();
  std::vector<std::string> dims;
  bool ok = true;
  for (size_t i = 1; i < call.args.size(); ++i) {
    std::optional<std::string> d = dimArg(*call.args[i], "layer_norm", i);
    if (!d || !checkHasDim(fn_.typeOf(*x), *d, call.args[i]->loc)) {
      ok = false;
    } else if (contains(dims, *d)) {
      error(call.args[i]->loc, Diag::ErrDimListedTwice, *d, "'layer_norm'");
      ok = false;
    } else {
      dims.push_back(*d);
    }
  }
  std::optional<double> eps = numberArg(*kw, "eps", 1e-5, false, "layer_norm");
  if (eps && *eps <= 0) {
    error(kw->at("eps")->value->loc, Diag::ErrArgRange, "'eps'", "layer_norm", "> 0", *eps);
    return Operand::poison();
  }
  if (!ok || !eps) return Operand::poison();
  return addOp(ir::OpKind::LayerNorm, {*x}, fn_.typeOf(*x), call.callee.loc,
               {{"dims", dims}, {"eps", *eps}});
}

Operand FunctionLowerer::lowerCumsum(const ast::CallExpr& call, Scope& scope) {
  std::optional<KwMap> kw = keywords(call, {"exclusive"});
  if (!checkPositional(call, 2, 2) || !checkArrow(call, false) || !kw) return Operand::poison();
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  std::optional<std::string> d = dimArg(*call.args[1], "cumsum", 1);
  std::optional<double> exclusive = numberArg(*kw, "exclusive", 0, true, "cumsum");
  if (exclusive && *exclusive != 0 && *exclusive != 1) {
    error(kw->at("exclusive")->value->loc, Diag::ErrArgRange, "'exclusive'", "cumsum", "0 or 1",
          *exclusive);
    return Operand::poison();
  }
  if (!x || !d || !exclusive || !checkHasDim(fn_.typeOf(*x), *d, call.args[1]->loc))
    return Operand::poison();
  return addOp(ir::OpKind::Cumsum, {*x}, fn_.typeOf(*x), call.callee.loc,
               {{"dim", *d}, {"exclusive", static_cast<int64_t>(*exclusive)}});
}

Operand FunctionLowerer::lowerRename(const ast::CallExpr& call, Scope& scope) {
  if (!checkPositional(call, 2, kMany) || !checkArrow(call, true) || !keywords(call, {}))
    return Operand::poison();
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  std::optional<std::vector<std::string>> to = arrowDims(call);
  if (!x || !to) return Operand::poison();
  const ir::TensorType& type = fn_.typeOf(*x);
  std::vector<std::string> from;
  for (size_t i = 1; i < call.args.size(); ++i) {
    std::optional<std::string> d = dimArg(*call.args[i], "rename", i);
    if (!d || !checkHasDim(type, *d, call.args[i]->loc)) return Operand::poison();
    if (contains(from, *d)) {
      error(call.args[i]->loc, Diag::ErrDimListedTwice, *d, "'rename'");
      return Operand::poison();
    }
    from.push_back(*d);
  }
  if (from.size() != to->size()) {
    error(call.arrowLoc, Diag::ErrDimCountMismatch, "rename", from.size(), to->size());
    return Operand::poison();
  }
  for (size_t i = 0; i < to->size(); ++i) {
    const std::string& target = (*to)[i];
    int64_t fromSize = dim(from[i]).size, toSize = dim(target).size;
    if (fromSize != toSize) {
      error(call.arrowDims[i].loc, Diag::ErrRenameSize, from[i], fromSize, target, toSize);
      return Operand::poison();
    }
    if (type.hasDim(target) && !contains(from, target)) {
      error(call.arrowDims[i].loc, Diag::ErrDimAlreadyPresent, target, typeString(type));
      return Operand::poison();
    }
  }
  ir::TensorType result = type;
  for (ir::Dim& d : result.dims)
    for (size_t i = 0; i < from.size(); ++i)
      if (d.name == from[i]) {
        d = dim((*to)[i]);
        break;
      }
  return addOp(ir::OpKind::Rename, {*x}, std::move(result), call.callee.loc,
               {{"from", from}, {"to", *to}});
}

Operand FunctionLowerer::lowerReshape(const ast::CallExpr& call, Scope& scope) {
  if (!checkPositional(call, 2, kMany) || !checkArrow(call, true) || !keywords(call, {}))
    return Operand::poison();
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  std::optional<std::vector<std::string>> to = arrowDims(call);
  if (!x || !to) return Operand::poison();
  if (to->empty()) {
    error(call.arrowLoc, Diag::ErrMissingArrow, "reshape");
    return Operand::poison();
  }
  const ir::TensorType type = fn_.typeOf(*x);
  std::vector<std::string> from;
  int64_t fromCount = 1;
  for (size_t i = 1; i < call.args.size(); ++i) {
    std::optional<std::string> d = dimArg(*call.args[i], "reshape", i);
    if (!d || !checkHasDim(type, *d, call.args[i]->loc)) return Operand::poison();
    if (contains(from, *d)) {
      error(call.args[i]->loc, Diag::ErrDimListedTwice, *d, "'reshape'");
      return Operand::poison();
    }
    from.push_back(*d);
    fromCount *= dim(*d).size; // bounded by x's element count
  }
  int64_t toCount = 1;
  bool overflow = false;
  for (size_t i = 0; i < to->size(); ++i) {
    const std::string& target = (*to)[i];
    if (type.hasDim(target) && !contains(from, target)) {
      error(call.arrowDims[i].loc, Diag::ErrDimAlreadyPresent, target, typeString(type));
      return Operand::poison();
    }
    overflow = overflow || __builtin_mul_overflow(toCount, dim(target).size, &toCount);
  }
  if (overflow || fromCount != toCount) {
    error(call.callee.loc, Diag::ErrReshapeCount, joinNames(from), fromCount, joinNames(*to),
          overflow ? std::string("more than 2^63") : fmt::format("{}", toCount));
    return Operand::poison();
  }
  ir::TensorType result{type.dtype, {}};
  for (const ir::Dim& d : type.dims) {
    if (d.name == from[0])
      for (const std::string& target : *to)
        result.dims.push_back(dim(target));
    else if (!contains(from, d.name))
      result.dims.push_back(d);
  }
  return addOp(ir::OpKind::Reshape, {*x}, std::move(result), call.callee.loc,
               {{"from", from}, {"to", *to}});
}

Operand FunctionLowerer::lowerTranspose(const ast::CallExpr& call, Scope& scope) {
  if (!checkPositional(call, 1, 1) || !checkArrow(call, true) || !keywords(call, {}))
    return Operand::poison();
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  std::optional<std::vector<std::string>> order = arrowDims(call);
  if (!x || !order) return Operand::poison();
  const ir::TensorType& type = fn_.typeOf(*x);
  bool permutation =
      order->size() == type.dims.size() &&
      std::all_of(order->begin(), order->end(), [&](const auto& d) { return type.hasDim(d); });
  if (!permutation) {
    error(call.callee.loc, Diag::ErrNotPermutation, typeString(type), joinNames(*order));
    return Operand::poison();
  }
  ir::TensorType result{type.dtype, {}};
  for (const std::string& d : *order)
    result.dims.push_back(dim(d));
  if (result == type) return Operand::tensor(*x, call.callee.loc);
  return addOp(ir::OpKind::Transpose, {*x}, std::move(result), call.callee.loc);
}

/// The shared front of slice and pad: `op(x, d -> e, <key> = k)` with d a dim of x and e
/// not already one (unless it is d). Reports and returns nullopt on any error.
std::optional<FunctionLowerer::WindowArgs> FunctionLowerer::windowArgs(const ast::CallExpr& call,
                                                                       Scope& scope, const char* op,
                                                                       const char* key) {
  std::optional<KwMap> kw = keywords(call, {key});
  if (!checkPositional(call, 2, 2) || !checkArrow(call, true) || !kw) return std::nullopt;
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  std::optional<std::string> from = dimArg(*call.args[1], op, 1);
  std::optional<std::vector<std::string>> to = arrowDims(call);
  std::optional<double> number = numberArg(*kw, key, 0, true, op);
  if (!x || !from || !to || !number) return std::nullopt;
  if (to->size() != 1) {
    error(call.arrowLoc, Diag::ErrDimCountMismatch, op, 1, to->size());
    return std::nullopt;
  }
  const ir::TensorType& type = fn_.typeOf(*x);
  if (!checkHasDim(type, *from, call.args[1]->loc)) return std::nullopt;
  const std::string& target = (*to)[0];
  if (type.hasDim(target) && target != *from) {
    error(call.arrowDims[0].loc, Diag::ErrDimAlreadyPresent, target, typeString(type));
    return std::nullopt;
  }
  return WindowArgs{*x, *from, target, static_cast<int64_t>(*number), std::move(*kw)};
}

Operand FunctionLowerer::lowerSlice(const ast::CallExpr& call, Scope& scope) {
  std::optional<WindowArgs> args = windowArgs(call, scope, "slice", "start");
  if (!args) return Operand::poison();
  const std::string &from = args->from, &target = args->target;
  int64_t first = args->number;
  int64_t end = 0;
  bool overflow = __builtin_add_overflow(first, dim(target).size, &end);
  if (first < 0 || overflow || end > dim(from).size) {
    error(call.callee.loc, Diag::ErrSliceRange, first, end, from, dim(from).size);
    return Operand::poison();
  }
  ir::TensorType result = fn_.typeOf(args->x);
  result.dims[result.findDim(from)] = dim(target);
  return addOp(ir::OpKind::Slice, {args->x}, std::move(result), call.callee.loc,
               {{"from", from}, {"to", target}, {"start", first}});
}

Operand FunctionLowerer::lowerConcat(const ast::CallExpr& call, Scope& scope) {
  std::vector<std::optional<ir::ValueId>> inputs;
  for (const ast::ExprPtr& arg : call.args)
    inputs.push_back(tensorArg(*arg, scope));
  std::optional<KwMap> kw = keywords(call, {"along"});
  if (!checkPositional(call, 1, kMany) || !checkArrow(call, true) || !kw) return Operand::poison();
  auto alongArg = kw->find("along");
  if (alongArg == kw->end()) {
    error(call.callee.loc, Diag::ErrMissingKeyword, "concat", "along");
    return Operand::poison();
  }
  std::vector<const ast::Expr*> alongExprs;
  const ast::Expr* alongValue = alongArg->second->value.get();
  if (auto* list = alongValue ? dyn_cast<ast::ListExpr>(alongValue) : nullptr) {
    for (const ast::ExprPtr& e : list->elements)
      alongExprs.push_back(e.get());
  } else if (alongValue) {
    alongExprs.push_back(alongValue);
  }
  std::vector<std::string> along;
  for (const ast::Expr* e : alongExprs) {
    std::optional<std::string> d = dimArg(*e, "concat", along.size());
    if (!d) return Operand::poison();
    along.push_back(*d);
  }
  std::optional<std::vector<std::string>> to = arrowDims(call);
  if (!to) return Operand::poison();
  if (to->size() != 1) {
    error(call.arrowLoc, Diag::ErrDimCountMismatch, "concat", 1, to->size());
    return Operand::poison();
  }
  if (along.size() != inputs.size()) {
    error(alongArg->second->name.loc, Diag::ErrConcatAlong, inputs.size(), along.size());
    return Operand::poison();
  }
  std::vector<ir::ValueId> ids;
  for (const auto& input : inputs) {
    if (!input) return Operand::poison();
    ids.push_back(*input);
  }
  // The dims besides `along`, as a set, must be equal for all inputs.
  auto rest = [&](size_t i) {
    ir::TensorType t = fn_.typeOf(ids[i]);
    t.dims.erase(t.dims.begin() + t.findDim(along[i]));
    return t;
  };
  int64_t total = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const ir::TensorType& t = fn_.typeOf(ids[i]);
    if (!checkHasDim(t, along[i], alongExprs[i]->loc)) return Operand::poison();
    if (t.dtype != fn_.typeOf(ids[0]).dtype) {
      error(call.args[i]->loc, Diag::ErrDTypeMismatch, "concat", typeString(fn_.typeOf(ids[0])),
            typeString(t));
      return Operand::poison();
    }
    ir::TensorType mine = rest(i), first = rest(0);
    bool same = mine.dims.size() == first.dims.size() &&
                std::all_of(mine.dims.begin(), mine.dims.end(),
                            [&](const ir::Dim& d) { return first.hasDim(d.name); });
    if (!same) {
      error(call.args[i]->loc, Diag::ErrConcatDims, typeString(fn_.typeOf(ids[0])), typeString(t));
      return Operand::poison();
    }
    total += dim(along[i]).size; // each <= 2^44, inputs bounded by the op limit
  }
  const std::string& target = (*to)[0];
  ir::TensorType first = rest(0);
  if (first.hasDim(target)) {
    error(call.arrowDims[0].loc, Diag::ErrDimAlreadyPresent, target,
          typeString(fn_.typeOf(ids[0])));
    return Operand::poison();
  }
  if (total != dim(target).size) {
    error(call.arrowDims[0].loc, Diag::ErrConcatSize, total, target, dim(target).size);
    return Operand::poison();
  }
  ir::TensorType result = fn_.typeOf(ids[0]);
  result.dims[result.findDim(along[0])] = dim(target);
  return addOp(ir::OpKind::Concat, std::move(ids), std::move(result), call.callee.loc,
               {{"from", along}, {"to", target}});
}

Operand FunctionLowerer::lowerPad(const ast::CallExpr& call, Scope& scope) {
  std::optional<WindowArgs> args = windowArgs(call, scope, "pad", "before");
  if (!args) return Operand::poison();
  const std::string &from = args->from, &target = args->target;
  int64_t k = args->number;
  if (k < 0) {
    error(args->kw.at("before")->value->loc, Diag::ErrArgRange, "'before'", "pad", ">= 0", k);
    return Operand::poison();
  }
  if (dim(target).size - k < dim(from).size) { // sizes are positive: no overflow
    error(call.callee.loc, Diag::ErrPadSize, from, dim(from).size, k, target, dim(target).size);
    return Operand::poison();
  }
  ir::TensorType result = fn_.typeOf(args->x);
  result.dims[result.findDim(from)] = dim(target);
  return addOp(ir::OpKind::Pad, {args->x}, std::move(result), call.callee.loc,
               {{"from", from}, {"to", target}, {"before", k}});
}

Operand FunctionLowerer::lowerShift(const ast::CallExpr& call, Scope& scope) {
  std::optional<KwMap> kw = keywords(call, {"by"});
  if (!checkPositional(call, 2, 2) || !checkArrow(call, false) || !kw) return Operand::poison();
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  std::optional<std::string> d = dimArg(*call.args[1], "shift", 1);
  std::optional<double> by = numberArg(*kw, "by", 0, true, "shift");
  if (!x || !d || !by || !checkHasDim(fn_.typeOf(*x), *d, call.args[1]->loc))
    return Operand::poison();
  return addOp(ir::OpKind::Shift, {*x}, fn_.typeOf(*x), call.callee.loc,
               {{"dim", *d}, {"offset", static_cast<int64_t>(*by)}});
}

Operand FunctionLowerer::lowerOneHot(const ast::CallExpr& call, Scope& scope) {
  std::optional<KwMap> kw = keywords(call, {"dtype"});
  if (!checkPositional(call, 2, 2) || !checkArrow(call, false) || !kw) return Operand::poison();
  std::optional<ir::ValueId> ids = tensorArg(*call.args[0], scope);
  std::optional<std::string> d = dimArg(*call.args[1], "one_hot", 1);
  ir::DType dtype = ir::DType::F32;
  if (auto it = kw->find("dtype"); it != kw->end()) {
    auto* type = it->second->value ? dyn_cast<ast::TypeExpr>(it->second->value.get()) : nullptr;
    if (!type || type->type.hasShape) {
      error(it->second->value ? it->second->value->loc : it->second->name.loc,
            Diag::ErrExpectedType, "'dtype'", "one_hot", "a dtype like bf16");
      return Operand::poison();
    }
    static const ir::DType kDTypes[] = {ir::DType::F32, ir::DType::BF16, ir::DType::F16,
                                        ir::DType::I32};
    dtype = kDTypes[static_cast<int>(type->type.dtype)];
  }
  if (!ids || !d) return Operand::poison();
  const ir::TensorType& type = fn_.typeOf(*ids);
  if (type.dtype != ir::DType::I32) {
    error(call.args[0]->loc, Diag::ErrIndexDType, "one_hot", typeString(type));
    return Operand::poison();
  }
  if (type.hasDim(*d)) {
    error(call.args[1]->loc, Diag::ErrDimAlreadyPresent, *d, typeString(type));
    return Operand::poison();
  }
  ir::TensorType result{dtype, type.dims};
  result.dims.push_back(dim(*d));
  noteIndexUse(*ids, dim(*d).size);
  return addOp(ir::OpKind::OneHot, {*ids}, std::move(result), call.callee.loc, {{"dim", *d}});
}

Operand FunctionLowerer::lowerGather(const ast::CallExpr& call, Scope& scope) {
  if (!checkPositional(call, 3, 3) || !checkArrow(call, false) || !keywords(call, {}))
    return Operand::poison();
  std::optional<ir::ValueId> table = tensorArg(*call.args[0], scope);
  std::optional<ir::ValueId> ids = tensorArg(*call.args[1], scope);
  std::optional<std::string> d = dimArg(*call.args[2], "gather", 2);
  if (!table || !ids || !d) return Operand::poison();
  const ir::TensorType& tableType = fn_.typeOf(*table);
  const ir::TensorType& idsType = fn_.typeOf(*ids);
  if (idsType.dtype != ir::DType::I32) {
    error(call.args[1]->loc, Diag::ErrIndexDType, "gather", typeString(idsType));
    return Operand::poison();
  }
  if (!checkHasDim(tableType, *d, call.args[2]->loc)) return Operand::poison();
  ir::TensorType result{tableType.dtype, idsType.dims};
  for (const ir::Dim& t : tableType.dims) {
    if (t.name == *d) continue;
    if (result.hasDim(t.name)) {
      error(call.callee.loc, Diag::ErrGatherDims, t.name);
      return Operand::poison();
    }
    result.dims.push_back(t);
  }
  noteIndexUse(*ids, dim(*d).size);
  return addOp(ir::OpKind::Gather, {*table, *ids}, std::move(result), call.callee.loc,
               {{"dim", *d}});
}

Operand FunctionLowerer::lowerIota(const ast::CallExpr& call, Scope& scope) {
  if (!checkPositional(call, 1, 1) || !checkArrow(call, false) || !keywords(call, {}))
    return Operand::poison();
  std::optional<std::string> d = dimArg(*call.args[0], "iota", 0);
  if (!d) return Operand::poison();
  return addOp(ir::OpKind::Iota, {}, ir::TensorType{ir::DType::I32, {dim(*d)}}, call.callee.loc,
               {{"dim", *d}});
}

Operand FunctionLowerer::lowerRandom(ir::OpKind kind, const ast::CallExpr& call, Scope& scope) {
  bool isNormal = kind == ir::OpKind::RandomNormal;
  std::optional<KwMap> kw =
      isNormal ? keywords(call, {"mean", "stddev"}) : keywords(call, {"min", "max"});
  if (!checkPositional(call, 1, 1) || !checkArrow(call, false) || !kw) return Operand::poison();
  std::optional<ir::TensorType> type = shapeArg(call, "a tensor type like f32[batch, d]");
  if (!type) return Operand::poison();
  if (!ir::isFloat(type->dtype)) {
    error(call.args[0]->loc, Diag::ErrFloatOnly, call.callee.name, typeString(*type));
    return Operand::poison();
  }
  std::vector<std::pair<std::string, ir::AttrValue>> attrs;
  if (isNormal) {
    std::optional<double> mean = numberArg(*kw, "mean", 0, false, "normal");
    std::optional<double> stddev = numberArg(*kw, "stddev", 1, false, "normal");
    if (!mean || !stddev) return Operand::poison();
    if (*stddev < 0) {
      error(kw->at("stddev")->value->loc, Diag::ErrArgRange, "'stddev'", "normal", ">= 0", *stddev);
      return Operand::poison();
    }
    attrs = {{"mean", *mean}, {"stddev", *stddev}};
  } else {
    std::optional<double> lo = numberArg(*kw, "min", 0, false, "uniform");
    std::optional<double> hi = numberArg(*kw, "max", 1, false, "uniform");
    if (!lo || !hi) return Operand::poison();
    if (*hi < *lo) {
      error(call.callee.loc, Diag::ErrArgRange, "'max'", "uniform", fmt::format(">= {}", *lo), *hi);
      return Operand::poison();
    }
    attrs = {{"min", *lo}, {"max", *hi}};
  }
  attrs.emplace_back("stream", randomStream(call.callee.name));
  return addOp(kind, {}, std::move(*type), call.callee.loc, std::move(attrs));
}

Operand FunctionLowerer::lowerDropout(const ast::CallExpr& call, Scope& scope) {
  std::optional<KwMap> kw = keywords(call, {"rate"});
  if (!checkPositional(call, 1, 1) || !checkArrow(call, false) || !kw) return Operand::poison();
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  std::optional<double> rate = numberArg(*kw, "rate", 0.1, false, "dropout");
  if (rate && (*rate < 0 || *rate >= 1)) {
    error(kw->at("rate")->value->loc, Diag::ErrArgRange, "'rate'", "dropout", "in [0, 1)", *rate);
    return Operand::poison();
  }
  if (!x || !rate || !checkFloat("dropout", *x, call.callee.loc)) return Operand::poison();
  return addOp(ir::OpKind::Dropout, {*x}, fn_.typeOf(*x), call.callee.loc,
               {{"rate", *rate}, {"stream", randomStream("dropout")}});
}

Operand FunctionLowerer::lowerCast(const ast::CallExpr& call, Scope& scope) {
  if (!checkPositional(call, 2, 2) || !checkArrow(call, false) || !keywords(call, {}))
    return Operand::poison();
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  auto* spec = dyn_cast<ast::TypeExpr>(call.args[1].get());
  if (!spec || spec->type.hasShape) {
    error(call.args[1]->loc, Diag::ErrExpectedType, 2, "cast", "a dtype like bf16");
    return Operand::poison();
  }
  if (!x) return Operand::poison();
  static const ir::DType kDTypes[] = {ir::DType::F32, ir::DType::BF16, ir::DType::F16,
                                      ir::DType::I32};
  ir::TensorType result = fn_.typeOf(*x);
  result.dtype = kDTypes[static_cast<int>(spec->type.dtype)];
  return addOp(ir::OpKind::Cast, {*x}, std::move(result), call.callee.loc);
}

// ------------------------------------------------------------------------- rounding, integers,
// argmax

Operand FunctionLowerer::lowerClip(const ast::CallExpr& call, Scope& scope) {
  std::vector<Operand> args;
  for (const ast::ExprPtr& arg : call.args)
    args.push_back(lowerExpr(*arg, scope));
  if (!checkPositional(call, 3, 3) || !checkArrow(call, false) || !keywords(call, {}))
    return Operand::poison();
  const Operand &lo = args[1], &hi = args[2];
  if (lo.kind == Operand::Kind::Literal && hi.kind == Operand::Kind::Literal &&
      hi.number < lo.number) {
    error(call.args[2]->loc, Diag::ErrArgRange, "'hi'", "clip", fmt::format(">= {}", lo.number),
          hi.number);
    return Operand::poison();
  }
  // minimum(maximum(x, lo), hi): both give a tie to x, so the gradient passes through on the
  // closed interval [lo, hi] and is zero outside, with no op of its own to plan or generate.
  Operand floored = lowerBinary(ir::OpKind::Maximum, "clip", args[0], lo, call.callee.loc);
  return lowerBinary(ir::OpKind::Minimum, "clip", floored, hi, call.callee.loc);
}

Operand FunctionLowerer::lowerIntegerBinary(ir::OpKind kind, const char* spelling, Operand lhs,
                                            Operand rhs, SMLoc loc) {
  if (lhs.isPoison() || rhs.isPoison()) return Operand::poison();
  for (const Operand* operand : {&lhs, &rhs}) {
    if (operand->kind != Operand::Kind::Tensor) continue;
    const ir::TensorType& type = typeOf(*operand);
    if (type.dtype != ir::DType::I32) {
      error(loc, Diag::ErrIntOnly, spelling, typeString(type));
      return Operand::poison();
    }
  }
  // Literals are i32 here: the ops are defined on i32 alone.
  auto valueOf = [&](const Operand& x) -> std::optional<ir::ValueId> {
    if (x.kind == Operand::Kind::Literal) return materializeLiteral(x, ir::DType::I32);
    return x.id;
  };
  std::optional<ir::ValueId> a = valueOf(lhs), b = valueOf(rhs);
  if (!a || !b) return Operand::poison();
  return binaryValues(kind, spelling, *a, *b, loc);
}

Operand FunctionLowerer::lowerArgExtreme(bool isMax, const ast::CallExpr& call, Scope& scope) {
  const std::string& name = call.callee.name;
  if (!checkPositional(call, 2, 2) || !checkArrow(call, false) || !keywords(call, {}))
    return Operand::poison();
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  std::optional<std::string> d = dimArg(*call.args[1], name, 1);
  if (!x || !d || !checkHasDim(fn_.typeOf(*x), *d, call.args[1]->loc)) return Operand::poison();
  // The first position along d where x equals its extreme (NaN counts as the extreme, as in
  // NumPy): min over d of where(x == extreme, iota(d), size(d)). Written with existing ops, a
  // split d costs two all-reduces of the result (the extremes, then the positions), not an
  // all-gather of x.
  const SMLoc loc = call.callee.loc;
  const ir::TensorType type = fn_.typeOf(*x); // a copy: addOp grows the value table
  ir::TensorType reduced{type.dtype, {}};
  for (const ir::Dim& each : type.dims)
    if (each.name != *d) reduced.dims.push_back(each);
  const std::vector<std::string> dims{*d};
  Operand extreme = addOp(isMax ? ir::OpKind::ReduceMax : ir::OpKind::ReduceMin, {*x}, reduced, loc,
                          {{"dims", dims}});
  if (extreme.isPoison()) return extreme;
  Operand hit = binaryValues(ir::OpKind::Eq, name.c_str(), *x, extreme.id, loc);
  if (hit.isPoison()) return hit;
  if (ir::isFloat(type.dtype)) {
    Operand isNaN = binaryValues(ir::OpKind::Ne, name.c_str(), *x, *x, loc);
    if (isNaN.isPoison()) return isNaN;
    hit = binaryValues(ir::OpKind::Maximum, name.c_str(), hit.id, isNaN.id, loc);
    if (hit.isPoison()) return hit;
  }
  Operand position =
      addOp(ir::OpKind::Iota, {}, ir::TensorType{ir::DType::I32, {dim(*d)}}, loc, {{"dim", *d}});
  Operand past = addOp(ir::OpKind::Literal, {}, ir::TensorType{ir::DType::I32, {}}, loc,
                       {{"value", double(dim(*d).size)}});
  if (position.isPoison() || past.isPoison()) return Operand::poison();
  ir::TensorType candidates = fn_.typeOf(hit.id); // x's dims, in x's order
  Operand candidate = addOp(ir::OpKind::Where, {hit.id, position.id, past.id}, candidates, loc);
  if (candidate.isPoison()) return candidate;
  reduced.dtype = ir::DType::I32;
  return addOp(ir::OpKind::ReduceMin, {candidate.id}, std::move(reduced), loc, {{"dims", dims}});
}

Operand FunctionLowerer::lowerRandomInt(const ast::CallExpr& call, Scope& scope) {
  std::optional<KwMap> kw = keywords(call, {"max"});
  if (!checkPositional(call, 1, 1) || !checkArrow(call, false) || !kw) return Operand::poison();
  std::optional<ir::TensorType> type = shapeArg(call, "a tensor type like i32[batch]");
  if (!type) return Operand::poison();
  if (type->dtype != ir::DType::I32) {
    error(call.args[0]->loc, Diag::ErrIntOnly, "random_int", typeString(*type));
    return Operand::poison();
  }
  if (!kw->count("max")) {
    error(call.callee.loc, Diag::ErrMissingKeyword, "random_int", "max");
    return Operand::poison();
  }
  std::optional<double> bound = numberArg(*kw, "max", 1, true, "random_int");
  if (!bound) return Operand::poison();
  // Generated code holds i32 values in f32, exact up to 2^24.
  if (*bound < 1 || *bound > double(1 << 24)) {
    error(kw->at("max")->value->loc, Diag::ErrArgRange, "'max'", "random_int", "in [1, 2^24]",
          *bound);
    return Operand::poison();
  }
  return addOp(ir::OpKind::RandomInt, {}, std::move(*type), call.callee.loc,
               {{"max", static_cast<int64_t>(*bound)}, {"stream", randomStream("random_int")}});
}

Operand FunctionLowerer::lowerRandomPermutation(const ast::CallExpr& call, Scope& scope) {
  if (!checkPositional(call, 1, 1) || !checkArrow(call, false) || !keywords(call, {}))
    return Operand::poison();
  std::optional<std::string> d = dimArg(*call.args[0], "random_permutation", 0);
  if (!d) return Operand::poison();
  // The positions of uniform keys (one per element of d, keyed by global index and, in train
  // blocks, by step) in sorted order: top_k over the whole dim. Equal keys (23 random bits)
  // keep their index order, so the result is always a permutation.
  ir::TensorType keysType{ir::DType::F32, {dim(*d)}};
  Operand keys =
      addOp(ir::OpKind::RandomUniform, {}, keysType, call.callee.loc,
            {{"min", 0.0}, {"max", 1.0}, {"stream", randomStream("random_permutation")}});
  if (keys.isPoison()) return keys;
  return addOp(ir::OpKind::TopK, {keys.id}, ir::TensorType{ir::DType::I32, {dim(*d)}},
               call.callee.loc, {{"from", *d}, {"to", *d}});
}

Operand FunctionLowerer::lowerScatterAdd(const ast::CallExpr& call, Scope& scope) {
  if (!checkPositional(call, 3, 3) || !checkArrow(call, false) || !keywords(call, {}))
    return Operand::poison();
  std::optional<ir::ValueId> updates = tensorArg(*call.args[0], scope);
  std::optional<ir::ValueId> ids = tensorArg(*call.args[1], scope);
  std::optional<std::string> d = dimArg(*call.args[2], "scatter_add", 2);
  if (!updates || !ids || !d || !checkFloat("scatter_add", *updates, call.args[0]->loc))
    return Operand::poison();
  const ir::TensorType updatesType = fn_.typeOf(*updates); // copies: addOp grows the table
  const ir::TensorType idsType = fn_.typeOf(*ids);
  if (idsType.dtype != ir::DType::I32) {
    error(call.args[1]->loc, Diag::ErrIndexDType, "scatter_add", typeString(idsType));
    return Operand::poison();
  }
  if (updatesType.hasDim(*d)) {
    error(call.args[2]->loc, Diag::ErrDimAlreadyPresent, *d, typeString(updatesType));
    return Operand::poison();
  }
  for (const ir::Dim& each : idsType.dims)
    if (!checkHasDim(updatesType, each.name, call.args[1]->loc)) return Operand::poison();
  // The transpose of gather, written as gather's gradient is: einsum(one_hot(ids, d), updates)
  // onto d and the updates' other dims, summing over the ids' dims. Ids out of range add
  // nothing; the gradient (einsum's) gathers the cotangent at ids.
  ir::TensorType hotType{updatesType.dtype, idsType.dims};
  hotType.dims.push_back(dim(*d));
  noteIndexUse(*ids, dim(*d).size);
  Operand hot = addOp(ir::OpKind::OneHot, {*ids}, hotType, call.callee.loc, {{"dim", *d}});
  if (hot.isPoison()) return hot;
  ir::TensorType result{updatesType.dtype, {dim(*d)}};
  for (const ir::Dim& each : updatesType.dims)
    if (!idsType.hasDim(each.name)) result.dims.push_back(each);
  return addOp(ir::OpKind::Einsum, {hot.id, *updates}, std::move(result), call.callee.loc);
}

Operand FunctionLowerer::lowerTopK(bool values, const ast::CallExpr& call, Scope& scope) {
  const std::string& name = call.callee.name;
  if (!checkPositional(call, 2, 2) || !checkArrow(call, true) || !keywords(call, {}))
    return Operand::poison();
  std::optional<ir::ValueId> x = tensorArg(*call.args[0], scope);
  std::optional<std::string> d = dimArg(*call.args[1], name, 1);
  std::optional<std::vector<std::string>> to = arrowDims(call);
  if (!x || !d || !to || !checkHasDim(fn_.typeOf(*x), *d, call.args[1]->loc))
    return Operand::poison();
  const ir::TensorType type = fn_.typeOf(*x); // a copy: addOp grows the value table
  if (to->size() != 1) {
    error(call.arrowLoc, Diag::ErrDimCountMismatch, name, 1, to->size());
    return Operand::poison();
  }
  const std::string& k = to->front();
  if (type.hasDim(k)) {
    error(call.arrowDims[0].loc, Diag::ErrDimAlreadyPresent, k, typeString(type));
    return Operand::poison();
  }
  if (dim(k).size > dim(*d).size) {
    error(call.arrowDims[0].loc, Diag::ErrTopKSize, name, k, dim(k).size, *d, dim(*d).size);
    return Operand::poison();
  }
  ir::TensorType positions{ir::DType::I32, type.dims};
  positions.dims[size_t(type.findDim(*d))] = dim(k);
  Operand indices =
      addOp(ir::OpKind::TopK, {*x}, positions, call.callee.loc, {{"from", *d}, {"to", k}});
  if (!values || indices.isPoison()) return indices;
  // The values: x summed over d where one_hot(indices, d) picks it. `where` rather than a
  // product keeps an inf or NaN in x from spreading to the other picks; the gradient of the
  // `where` and the sum scatters into the selected positions.
  ir::TensorType hotType{ir::DType::I32, positions.dims};
  hotType.dims.push_back(dim(*d));
  Operand hot = addOp(ir::OpKind::OneHot, {indices.id}, hotType, call.callee.loc, {{"dim", *d}});
  Operand zero = addOp(ir::OpKind::Literal, {}, ir::TensorType{type.dtype, {}}, call.callee.loc,
                       {{"value", 0.0}});
  if (hot.isPoison() || zero.isPoison()) return Operand::poison();
  ir::TensorType pickedType{type.dtype, hotType.dims};
  Operand picked = addOp(ir::OpKind::Where, {hot.id, *x, zero.id}, pickedType, call.callee.loc);
  if (picked.isPoison()) return picked;
  ir::TensorType valueType{type.dtype, positions.dims};
  return addOp(ir::OpKind::ReduceSum, {picked.id}, std::move(valueType), call.callee.loc,
               {{"dims", std::vector<std::string>{*d}}});
}

// ------------------------------------------------------------------------- initializers

std::optional<ir::Initializer> FunctionLowerer::lowerInitializer(const ast::CallExpr& init,
                                                                 const ir::TensorType& type) {
  const std::string& kind = init.callee.name;
  struct Spec {
    const char* name;
    std::vector<std::pair<const char*, double>> args; // keyword and default
  };
  static const Spec kSpecs[] = {
      {"zeros", {}},
      {"ones", {}},
      {"constant", {{"value", 0}}},
      {"normal", {{"mean", 0}, {"stddev", 1}}},
      {"truncated_normal", {{"mean", 0}, {"stddev", 1}}},
      {"uniform", {{"min", 0}, {"max", 1}}},
      {"orthogonal", {{"scale", 1}}},
  };
  const Spec* spec = nullptr;
  for (const Spec& s : kSpecs)
    if (kind == s.name) spec = &s;
  if (!spec) {
    error(init.callee.loc, Diag::ErrUnknownInitializer, kind);
    return std::nullopt;
  }
  if (!init.args.empty()) {
    error(init.args[0]->loc, Diag::ErrKeywordOnly, kind);
    return std::nullopt;
  }
  if (!checkArrow(init, false)) return std::nullopt;
  // keywords() takes an initializer_list; match by hand against the spec instead.
  KwMap kw;
  for (const ast::KeywordArg& arg : init.kwargs) {
    bool known = std::any_of(spec->args.begin(), spec->args.end(),
                             [&](const auto& a) { return arg.name.name == a.first; });
    if (!known) {
      error(arg.name.loc, Diag::ErrUnknownKeyword, arg.name.name, kind);
      return std::nullopt;
    }
    if (!kw.emplace(arg.name.name, &arg).second) {
      error(arg.name.loc, Diag::ErrDuplicateKeyword, arg.name.name);
      return std::nullopt;
    }
  }
  ir::Initializer out;
  out.kind = kind;
  for (const auto& [name, fallback] : spec->args) {
    std::optional<double> value = numberArg(kw, name, fallback, false, kind);
    if (!value) return std::nullopt;
    out.args.emplace_back(name, *value);
  }
  bool random = kind != "zeros" && kind != "ones" && kind != "constant";
  if (random && !ir::isFloat(type.dtype)) {
    error(init.callee.loc, Diag::ErrFloatOnly, kind, typeString(type));
    return std::nullopt;
  }
  if (kind == "normal" || kind == "truncated_normal") {
    if (out.arg("stddev", 1) < 0) {
      error(kw.at("stddev")->value->loc, Diag::ErrArgRange, "'stddev'", kind, ">= 0",
            out.arg("stddev", 1));
      return std::nullopt;
    }
  }
  if (kind == "uniform" && out.arg("max", 1) < out.arg("min", 0)) {
    error(init.callee.loc, Diag::ErrArgRange, "'max'", kind,
          fmt::format(">= {}", out.arg("min", 0)), out.arg("max", 1));
    return std::nullopt;
  }
  if (kind == "orthogonal" && type.dims.size() < 2) {
    error(init.callee.loc, Diag::ErrOrthogonalRank, type.dims.size());
    return std::nullopt;
  }
  return out;
}

// ------------------------------------------------------------------------- optimizers

std::optional<std::pair<std::string, std::vector<std::pair<std::string, ir::AttrValue>>>>
FunctionLowerer::lowerOptimizer(const ast::CallExpr& call) {
  const std::string& name = call.callee.name;
  std::vector<std::pair<const char*, double>> specific;
  if (name == "sgd")
    specific = {{"momentum", 0}, {"nesterov", 0}};
  else if (name == "adamw")
    specific = {{"beta1", 0.9},
                {"beta2", 0.999},
                {"eps", 1e-8},
                {"weight_decay", 0.01},
                {"decay_min_rank", 0}};
  else if (name == "adafactor")
    specific = {
        {"decay_rate", 0.8}, {"beta1", 0}, {"clip_threshold", 1}, {"eps1", 1e-30}, {"eps2", 1e-3}};
  else {
    error(call.callee.loc, Diag::ErrUnknownOptimizer, name);
    return std::nullopt;
  }
  if (!checkPositional(call, 0, 1) || !checkArrow(call, false)) return std::nullopt;
  KwMap kw;
  for (const ast::KeywordArg& arg : call.kwargs) {
    const std::string& key = arg.name.name;
    bool known = key == "lr" || key == "warmup_steps" || key == "decay_steps" ||
                 key == "schedule" || key == "clip_norm" ||
                 std::any_of(specific.begin(), specific.end(),
                             [&](const auto& s) { return key == s.first; });
    if (!known) {
      error(arg.name.loc, Diag::ErrUnknownKeyword, key, name);
      return std::nullopt;
    }
    if (!kw.emplace(key, &arg).second || (key == "lr" && !call.args.empty())) {
      error(arg.name.loc, Diag::ErrDuplicateKeyword, key);
      return std::nullopt;
    }
  }
  std::optional<double> lr;
  SMLoc lrLoc = call.callee.loc;
  if (!call.args.empty()) {
    lrLoc = call.args[0]->loc;
    std::optional<Constant> literal = constantValue(*call.args[0], "the learning rate");
    if (!literal) return std::nullopt;
    lr = literal->value;
  } else if (kw.count("lr")) {
    lrLoc = kw.at("lr")->value ? kw.at("lr")->value->loc : kw.at("lr")->name.loc;
    lr = numberArg(kw, "lr", 0, false, name);
    if (!lr) return std::nullopt;
  } else {
    error(call.callee.loc, Diag::ErrMissingKeyword, name, "lr");
    return std::nullopt;
  }
  if (!(*lr > 0) || !std::isfinite(*lr)) {
    error(lrLoc, Diag::ErrArgRange, "'lr'", name, "> 0", *lr);
    return std::nullopt;
  }
  std::vector<std::pair<std::string, ir::AttrValue>> options;
  options.emplace_back("lr", *lr);
  for (const auto& [key, fallback] : specific) {
    bool integer = std::string(key) == "nesterov" || std::string(key) == "decay_min_rank";
    std::optional<double> value = numberArg(kw, key, fallback, integer, name);
    if (!value) return std::nullopt;
    if (std::string(key) == "decay_min_rank" && *value < 0) {
      error(kw.at(key)->value->loc, Diag::ErrArgRange, "'decay_min_rank'", name, ">= 0", *value);
      return std::nullopt;
    }
    if (integer)
      options.emplace_back(key, static_cast<int64_t>(*value));
    else
      options.emplace_back(key, *value);
  }
  for (const char* key : {"warmup_steps", "decay_steps"}) {
    std::optional<double> value = numberArg(kw, key, 0, true, name);
    if (!value) return std::nullopt;
    if (*value < 0) {
      error(kw.at(key)->value->loc, Diag::ErrArgRange, fmt::format("'{}'", key), name, ">= 0",
            *value);
      return std::nullopt;
    }
    options.emplace_back(key, static_cast<int64_t>(*value));
  }
  std::string schedule = "constant";
  if (auto it = kw.find("schedule"); it != kw.end()) {
    auto* value = it->second->value ? dyn_cast<ast::NameExpr>(it->second->value.get()) : nullptr;
    if (!value || (value->name != "constant" && value->name != "linear" &&
                   value->name != "cosine" && value->name != "rsqrt")) {
      error(it->second->value ? it->second->value->loc : it->second->name.loc,
            Diag::ErrUnknownSchedule);
      return std::nullopt;
    }
    schedule = value->name;
  }
  options.emplace_back("schedule", schedule);
  std::optional<double> clip = numberArg(kw, "clip_norm", 0, false, name);
  if (!clip) return std::nullopt;
  if (*clip < 0) {
    error(kw.at("clip_norm")->value->loc, Diag::ErrArgRange, "'clip_norm'", name, ">= 0", *clip);
    return std::nullopt;
  }
  options.emplace_back("clip_norm", *clip);
  return std::make_pair(name, std::move(options));
}

} // namespace meshc::sema
