// Generic defs over dims: dim parameters bound at each call (explicitly or from the argument
// types), local dims whose sizes derive from other dims, `size(d)` and the compile-time constant
// expressions that keyword arguments and local dim sizes take.
#include "sema/Lowering.h"

#include <llvm/Support/Casting.h>

#include <cmath>

namespace meshc::sema {

using llvm::dyn_cast;
using llvm::SMLoc;

namespace {

/// Integers stay exact in a double up to 2^53; beyond that a constant is no longer an integer.
constexpr double kMaxExactInteger = 9007199254740992.0;

bool isWhole(double value) {
  return std::isfinite(value) && std::fabs(value) <= kMaxExactInteger && value == std::trunc(value);
}

std::string numberText(double value) {
  return isWhole(value) ? fmt::format("{}", static_cast<int64_t>(value)) : fmt::format("{}", value);
}

} // namespace

// ------------------------------------------------------------------------- dims in scope

std::optional<std::string> FunctionLowerer::resolveDim(const std::string& name) const {
  if (signatureDims_) {
    // A def's signature sees its dim parameters and the global dims, not the caller's dims.
    if (auto it = signatureDims_->names.find(name); it != signatureDims_->names.end())
      return it->second;
  } else if (!frames_.empty()) {
    if (auto it = frames_.back().dims.names.find(name); it != frames_.back().dims.names.end())
      return it->second;
  }
  auto global = globals_.dims.find(name);
  if (global == globals_.dims.end() || global->second.local) return std::nullopt;
  return name;
}

void FunctionLowerer::unknownDim(SMLoc loc, const std::string& name) {
  // A local dim whose declaration failed was reported there; its uses stay silent.
  if (!frames_.empty() && frames_.back().dims.failed.count(name)) return;
  error(loc, Diag::ErrUnknownDim, name);
}

// ------------------------------------------------------------------------- dim parameters

std::optional<FrameDims> FunctionLowerer::bindDimParams(const ast::DefDecl& def,
                                                        const ast::CallExpr& call,
                                                        const std::vector<Operand>& args) {
  FrameDims out;
  std::map<std::string, std::string> boundBy; // parameter -> how it was bound, for conflicts
  auto isParam = [&](const std::string& name) {
    return std::any_of(def.dimParams.begin(), def.dimParams.end(),
                       [&](const ast::Ident& p) { return p.name == name; });
  };
  for (const ast::Ident& param : def.dimParams) {
    if (out.locs.count(param.name)) {
      if (error(param.loc, Diag::ErrRedefinition, "dim parameter", param.name))
        error(out.locs[param.name], Diag::NotePreviousDefinition, param.name);
      return std::nullopt;
    }
    out.locs[param.name] = param.loc;
  }
  if (call.hasDimArgs) {
    if (call.dimArgs.size() != def.dimParams.size()) {
      error(call.callee.loc, Diag::ErrDimArgCount, def.name.name, def.dimParams.size(),
            call.dimArgs.size());
      return std::nullopt;
    }
    bool ok = true;
    for (size_t i = 0; i < call.dimArgs.size(); ++i) {
      std::optional<std::string> actual = resolveDim(call.dimArgs[i].name);
      if (!actual) {
        unknownDim(call.dimArgs[i].loc, call.dimArgs[i].name);
        ok = false;
        continue;
      }
      out.names[def.dimParams[i].name] = *actual;
      boundBy[def.dimParams[i].name] = "explicitly";
    }
    if (!ok) return std::nullopt;
  }
  // Unification, one argument at a time: the argument's dims that the formal type names as
  // global dims are matched by name; the rest bind the formal type's dim parameters, first those
  // already bound to one of them, then the others in the order both types list them.
  bool ok = true;
  for (size_t i = 0; i < args.size() && i < def.args.size(); ++i) {
    if (args[i].kind != Operand::Kind::Tensor) continue; // poison, or a literal for a scalar
    const ast::TypedName& formal = def.args[i];
    const ir::TensorType& actual = typeOf(args[i]);
    std::vector<std::string> params;
    std::vector<std::string> concrete;
    for (const ast::Ident& d : formal.type.dims)
      (isParam(d.name) ? params : concrete).push_back(d.name);
    if (params.empty()) continue;
    std::vector<std::string> rest;
    for (const ir::Dim& d : actual.dims)
      if (std::find(concrete.begin(), concrete.end(), d.name) == concrete.end())
        rest.push_back(d.name);
    if (rest.size() != params.size() || formal.type.dims.size() != actual.dims.size()) {
      std::vector<std::string> written;
      for (const ast::Ident& d : formal.type.dims)
        written.push_back(d.name);
      error(call.args[i]->loc, Diag::ErrArgType, formal.name.name, def.name.name,
            fmt::format("{}[{}]", ast::dtypeName(formal.type.dtype), joinNames(written)),
            typeString(actual));
      ok = false;
      continue;
    }
    std::vector<std::string> unmatched;
    for (const std::string& param : params) {
      auto bound = out.names.find(param);
      auto at = bound == out.names.end() ? rest.end()
                                         : std::find(rest.begin(), rest.end(), bound->second);
      if (at != rest.end())
        rest.erase(at);
      else
        unmatched.push_back(param);
    }
    for (size_t k = 0; k < unmatched.size(); ++k) {
      const std::string& param = unmatched[k];
      std::string by = fmt::format("by argument '{}'", formal.name.name);
      if (auto bound = out.names.find(param); bound != out.names.end()) {
        // One conflict per call: later arguments would mostly repeat it.
        error(call.args[i]->loc, Diag::ErrDimParamConflict, param, def.name.name, bound->second,
              boundBy[param], rest[k], by);
        return std::nullopt;
      }
      out.names[param] = rest[k];
      boundBy[param] = by;
    }
  }
  if (!ok) return std::nullopt;
  // A poisoned argument (its error reported) may be the one that would have bound a parameter.
  bool poisoned =
      std::any_of(args.begin(), args.end(), [](const Operand& a) { return a.isPoison(); });
  for (const ast::Ident& param : def.dimParams)
    if (!out.names.count(param.name)) {
      if (poisoned) return std::nullopt;
      error(call.callee.loc, Diag::ErrDimParamUnbound, param.name, def.name.name, def.name.name);
      return std::nullopt;
    }
  return out;
}

// ------------------------------------------------------------------------- local dims

std::string FunctionLowerer::localDimName(const ast::Ident& name, int64_t size) {
  for (const auto& [irName, info] : globals_.dims)
    if (info.local && info.sourceName == name.name && info.size == size) return irName;
  std::string candidate = name.name;
  if (globals_.dims.count(candidate)) candidate = fmt::format("{}_{}", name.name, size);
  for (int n = 2; globals_.dims.count(candidate); ++n)
    candidate = fmt::format("{}_{}_{}", name.name, size, n);
  DimInfo info;
  info.size = size;
  info.loc = name.loc;
  info.local = true;
  info.sourceName = name.name;
  globals_.dims.emplace(candidate, std::move(info));
  return candidate;
}

void FunctionLowerer::lowerDimStmt(const ast::DimStmt& stmt, BlockKind kind) {
  if (kind == BlockKind::Repeat) {
    error(stmt.loc, Diag::ErrLocalDimPlace);
    return;
  }
  FrameDims& dims = frames_.back().dims;
  const ast::Ident& name = stmt.name;
  if (auto previous = dims.locs.find(name.name); previous != dims.locs.end()) {
    if (error(name.loc, Diag::ErrRedefinition, "dim", name.name))
      error(previous->second, Diag::NotePreviousDefinition, name.name);
    return;
  }
  if (auto global = globals_.dims.find(name.name);
      global != globals_.dims.end() && !global->second.local) {
    if (error(name.loc, Diag::ErrRedefinition, "dim", name.name))
      error(global->second.loc, Diag::NotePreviousDefinition, name.name);
    return;
  }
  dims.failed.insert(name.name); // until its size is known to be good
  if (!stmt.size) return;
  std::optional<Constant> size =
      constantValue(*stmt.size, fmt::format("the size of dim '{}'", name.name));
  if (!size) return;
  if (!size->isInteger || size->value < 1 || size->value > 1e15) {
    error(stmt.size->loc, Diag::ErrLocalDimSize, name.name, numberText(size->value));
    return;
  }
  dims.failed.erase(name.name);
  dims.locs[name.name] = name.loc;
  dims.names[name.name] = localDimName(name, static_cast<int64_t>(size->value));
}

// ------------------------------------------------------------------------- constants

std::optional<Constant> FunctionLowerer::constantValue(const ast::Expr& expr,
                                                       const std::string& what) {
  return evalConstant(expr, &what);
}

std::optional<Constant> FunctionLowerer::foldConstant(const ast::Expr& expr) {
  return evalConstant(expr, nullptr);
}

std::optional<Constant> FunctionLowerer::evalConstant(const ast::Expr& expr,
                                                      const std::string* what) {
  auto notConstant = [&](const ast::Expr& at, const std::string& offender) {
    if (what) error(at.loc, Diag::ErrNotConstant, *what, offender);
    return std::optional<Constant>();
  };
  switch (expr.kind) {
  case ast::Expr::Kind::Number: {
    auto& number = static_cast<const ast::NumberExpr&>(expr);
    return Constant{number.value, number.isInteger};
  }
  case ast::Expr::Kind::Unary: {
    auto& unary = static_cast<const ast::UnaryExpr&>(expr);
    if (!unary.operand) return std::nullopt;
    std::optional<Constant> operand = evalConstant(*unary.operand, what);
    if (!operand) return std::nullopt;
    return Constant{-operand->value, operand->isInteger};
  }
  case ast::Expr::Kind::Binary: {
    auto& binary = static_cast<const ast::BinaryExpr&>(expr);
    if (binary.op != ast::BinaryOp::Add && binary.op != ast::BinaryOp::Sub &&
        binary.op != ast::BinaryOp::Mul && binary.op != ast::BinaryOp::Div &&
        binary.op != ast::BinaryOp::Pow)
      return notConstant(expr, "a comparison");
    if (!binary.lhs || !binary.rhs) return std::nullopt;
    std::optional<Constant> lhs = evalConstant(*binary.lhs, what);
    if (!lhs) return std::nullopt;
    std::optional<Constant> rhs = evalConstant(*binary.rhs, what);
    if (!rhs) return std::nullopt;
    double value = 0;
    switch (binary.op) {
    case ast::BinaryOp::Add:
      value = lhs->value + rhs->value;
      break;
    case ast::BinaryOp::Sub:
      value = lhs->value - rhs->value;
      break;
    case ast::BinaryOp::Mul:
      value = lhs->value * rhs->value;
      break;
    case ast::BinaryOp::Div:
      value = lhs->value / rhs->value;
      break;
    default:
      value = std::pow(lhs->value, rhs->value);
      break;
    }
    // Integer operands give an integer when the result is whole: size(S) / 2 for an even S.
    return Constant{value, lhs->isInteger && rhs->isInteger && isWhole(value)};
  }
  case ast::Expr::Kind::Call: {
    auto& call = static_cast<const ast::CallExpr&>(expr);
    const std::string& callee = call.callee.name;
    bool isMath = callee == "sqrt" || callee == "rsqrt" || callee == "exp" || callee == "log";
    if (globals_.defs.count(callee) || globals_.externs.count(callee) ||
        (callee != "size" && !isMath))
      return notConstant(expr, fmt::format("the call of '{}'", callee));
    if (call.args.size() != 1 || call.hasArrow || call.hasDimArgs || !call.kwargs.empty())
      return notConstant(expr, fmt::format("this call of '{}'", callee));
    if (callee == "size") {
      auto* dimName = dyn_cast<ast::NameExpr>(call.args[0].get());
      if (!dimName) return notConstant(*call.args[0], "the argument of 'size', not a dim name,");
      std::optional<std::string> dim = resolveDim(dimName->name);
      if (!dim) {
        if (what) unknownDim(dimName->loc, dimName->name);
        return std::nullopt;
      }
      return Constant{static_cast<double>(globals_.dims.at(*dim).size), true};
    }
    std::optional<Constant> arg = evalConstant(*call.args[0], what);
    if (!arg) return std::nullopt;
    double x = arg->value;
    double value = callee == "sqrt"    ? std::sqrt(x)
                   : callee == "rsqrt" ? 1.0 / std::sqrt(x)
                   : callee == "exp"   ? std::exp(x)
                                       : std::log(x);
    return Constant{value, false};
  }
  case ast::Expr::Kind::Name:
    return notConstant(expr, fmt::format("'{}'", static_cast<const ast::NameExpr&>(expr).name));
  case ast::Expr::Kind::List:
    return notConstant(expr, "a list");
  case ast::Expr::Kind::Type:
    return notConstant(expr, "a type");
  }
  return std::nullopt;
}

Operand FunctionLowerer::foldedLiteral(const ast::Expr& expr) {
  std::optional<Constant> constant = foldConstant(expr);
  if (!constant) return Operand::poison();
  Operand literal;
  literal.kind = Operand::Kind::Literal;
  literal.number = constant->value;
  literal.isInteger = constant->isInteger;
  literal.loc = expr.loc;
  return literal;
}

Operand FunctionLowerer::lowerSize(const ast::CallExpr& call) {
  if (!checkPositional(call, 1, 1) || !checkArrow(call, false) || !keywords(call, {}))
    return Operand::poison();
  std::optional<std::string> dim = dimArg(*call.args[0], "size", 0);
  if (!dim) return Operand::poison();
  Operand literal;
  literal.kind = Operand::Kind::Literal;
  literal.number = static_cast<double>(globals_.dims.at(*dim).size);
  literal.isInteger = true;
  literal.loc = call.callee.loc;
  return literal;
}

} // namespace meshc::sema
