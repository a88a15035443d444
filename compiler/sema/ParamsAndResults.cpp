// Weight sharing and tying (`repeat N shared`, `param ... as "path"`), defs with several results
// (`-> (a: T, b: U)`, `return a, b`, `let a, b = f(x)`) and the metrics of a train block.
// docs/language.md describes each construct and the param paths it gives.
#include "sema/Lowering.h"

#include <llvm/Support/Casting.h>

#include <algorithm>
#include <cctype>

namespace meshc {
namespace sema {

using llvm::dyn_cast;
using llvm::SMLoc;

std::string describeParam(const ir::TensorType& type, const ir::Initializer& init, bool trainable,
                          ir::ParamRole role) {
  std::vector<std::string> args;
  for (const auto& [key, value] : init.args)
    args.push_back(fmt::format("{} = {}", key, value));
  const char* keyword = role == ir::ParamRole::StepState ? "state " : trainable ? "" : "const ";
  return fmt::format("{}{} = {}({})", keyword, typeString(type), init.kind, joinNames(args));
}

static bool sameDims(const ir::TensorType& a, const ir::TensorType& b) {
  return a.dtype == b.dtype && a.dims.size() == b.dims.size() &&
         std::all_of(a.dims.begin(), a.dims.end(),
                     [&](const ir::Dim& d) { return b.hasDim(d.name); });
}

static bool sameInit(const ir::Initializer& a, const ir::Initializer& b) {
  return a.kind == b.kind && a.args == b.args;
}

void checkParamsAcrossFunctions(const std::vector<ir::Function>& functions, Reporter& reporter) {
  std::map<std::string, const ir::ParamInfo*> first;
  for (const ir::Function& fn : functions)
    for (const ir::ParamInfo& param : fn.params) {
      if (param.role == ir::ParamRole::OptimizerState) continue;
      auto [it, inserted] = first.emplace(param.path, &param);
      if (inserted) continue;
      const ir::ParamInfo& earlier = *it->second;
      // One tensor in checkpoints: the storage order must agree too, not only the dim set.
      if (earlier.type == param.type && earlier.trainable == param.trainable &&
          earlier.role == param.role && sameInit(earlier.init, param.init))
        continue;
      std::string earlierText =
          describeParam(earlier.type, earlier.init, earlier.trainable, earlier.role);
      if (reporter.report(param.loc.loc, Diag::ErrParamConflict, param.path,
                          describeParam(param.type, param.init, param.trainable, param.role),
                          earlierText))
        reporter.report(earlier.loc.loc, Diag::NoteParamDeclared, param.path, earlierText);
    }
}

// ------------------------------------------------------------------------- shared and tied

std::string FunctionLowerer::paramPathOf(const ast::ParamStmt& param) {
  if (param.tiedPath) return *param.tiedPath;
  const CallFrame& frame = frames_.back();
  std::string segment = param.name.name + frame.paramSuffix;
  return frame.paramPath.empty() ? segment : frame.paramPath + "/" + segment;
}

std::string FunctionLowerer::paramSegmentOfCall(const ast::DefDecl& def) {
  CallFrame& caller = frames_.back();
  int& calls = caller.paramCalls[def.name.name + caller.paramSuffix];
  std::string segment = def.name.name;
  if (calls > 0) segment += fmt::format("#{}", calls);
  ++calls;
  return segment + caller.paramSuffix;
}

bool FunctionLowerer::checkTiedPath(const ast::ParamStmt& param) {
  if (!param.tiedPath) return true;
  const std::string& path = *param.tiedPath;
  const char* problem = nullptr;
  if (path.empty())
    problem = "it is empty";
  else if (path.find('@') != std::string::npos)
    problem = "'@' is reserved for optimizer state (`<weight>@<slot>`)";
  else if (std::any_of(path.begin(), path.end(),
                       [](char c) { return std::isspace(static_cast<unsigned char>(c)); }))
    problem = "it contains white space";
  else if (path.front() == '/' || path.back() == '/' || path.find("//") != std::string::npos)
    problem = "it has an empty segment";
  if (!problem) return true;
  error(param.tiedPathLoc, Diag::ErrParamPath, path, problem);
  return false;
}

std::optional<Operand> FunctionLowerer::reuseParam(const std::string& path,
                                                   const ir::TensorType& type,
                                                   const ir::Initializer& init, bool trainable,
                                                   SMLoc loc, ir::ParamRole role) {
  auto it = paramIndex_.find(path);
  if (it == paramIndex_.end()) return std::nullopt;
  const ir::ParamInfo& earlier = fn_.params[it->second];
  if (!sameDims(earlier.type, type) || earlier.trainable != trainable || earlier.role != role ||
      !sameInit(earlier.init, init)) {
    std::string earlierText =
        describeParam(earlier.type, earlier.init, earlier.trainable, earlier.role);
    if (error(loc, Diag::ErrParamConflict, path, describeParam(type, init, trainable, role),
              earlierText))
      error(earlier.loc.loc, Diag::NoteParamDeclared, path, earlierText);
    return Operand::poison();
  }
  // One Param op per path: every use reads it, so autodiff sums the gradients of all uses.
  return coerceTo(Operand::tensor(earlier.value, loc), type, loc, [](const std::string&) {});
}

void FunctionLowerer::lowerSharedRepeatIteration(const ast::RepeatStmt& repeat, Scope& scope,
                                                 const std::map<std::string, int>& callsBefore) {
  // Each iteration numbers its calls as the first did, so they name the same params (random
  // streams still differ per iteration: they follow repeatSuffix, which counts iterations).
  frames_.back().paramCalls = callsBefore;
  Scope inner;
  inner.parent = &scope;
  lowerBlock(repeat.body, inner, BlockKind::Repeat, repeat.loc, "repeat");
  tick();
}

// ------------------------------------------------------------------------- several results

std::optional<std::vector<ir::TensorType>> FunctionLowerer::resultTypes(const ast::DefDecl& def) {
  std::vector<ir::TensorType> types;
  if (!def.hasSeveralResults()) {
    std::optional<ir::TensorType> type = convertType(def.result);
    if (!type) return std::nullopt;
    types.push_back(std::move(*type));
    return types;
  }
  bool ok = true;
  for (const ast::TypedName& result : def.results) {
    std::optional<ir::TensorType> type = convertType(result.type);
    if (type)
      types.push_back(std::move(*type));
    else
      ok = false;
  }
  if (!ok) return std::nullopt;
  return types;
}

void FunctionLowerer::lowerReturn(const ast::ReturnStmt& ret, Scope& scope, BlockKind kind) {
  Operand value = ret.value ? lowerExpr(*ret.value, scope) : Operand::poison();
  std::vector<Operand> rest;
  for (const ast::ExprPtr& expr : ret.rest)
    rest.push_back(lowerExpr(*expr, scope));
  CallFrame& frame = frames_.back();
  if (kind != BlockKind::Def || frame.returned) return;
  if (frame.def) {
    size_t want = frame.def->hasSeveralResults() ? frame.def->results.size() : 1;
    if (want != 1 + rest.size()) {
      error(ret.loc, Diag::ErrReturnCount, frame.def->name.name, want, 1 + rest.size());
      frame.returned = Operand::poison();
      return;
    }
  }
  frame.returned = value;
  frame.returnedRest = std::move(rest);
}

std::vector<Operand> FunctionLowerer::coerceResults(const ast::DefDecl& def, SMLoc callLoc) {
  const CallFrame& frame = frames_.back();
  std::optional<std::vector<ir::TensorType>> types = resultTypes(def);
  if (!types || !frame.returned) return {};
  std::vector<Operand> returned{*frame.returned};
  returned.insert(returned.end(), frame.returnedRest.begin(), frame.returnedRest.end());
  if (returned.size() != types->size()) return {}; // reported at the return
  std::vector<Operand> results;
  for (size_t i = 0; i < returned.size(); ++i) {
    if (returned[i].isPoison()) return {};
    SMLoc returnLoc = returned[i].loc;
    const ir::TensorType& type = (*types)[i];
    Operand result = coerceTo(returned[i], type, returnLoc, [&](const std::string& got) {
      error(returnLoc, Diag::ErrReturnType, def.name.name, typeString(type), got);
    });
    if (result.isPoison()) return {};
    result.loc = callLoc;
    results.push_back(result);
  }
  return results;
}

void FunctionLowerer::lowerBindResults(const ast::BindResultsStmt& bind, Scope& scope) {
  auto* call = dyn_cast<ast::CallExpr>(bind.value.get());
  const ast::DefDecl* def = nullptr;
  if (call)
    if (auto it = globals_.defs.find(call->callee.name); it != globals_.defs.end())
      def = it->second;
  std::vector<Operand> values;
  if (!def || !def->hasSeveralResults()) {
    Operand single = lowerExpr(*bind.value, scope);
    std::string what = def    ? fmt::format("def '{}'", def->name.name)
                       : call ? fmt::format("'{}'", call->callee.name)
                              : std::string("the expression");
    if (!single.isPoison())
      error(bind.value->loc, Diag::ErrResultCount, what, "1 value", bind.names.size());
  } else if (def->results.size() != bind.names.size()) {
    error(bind.value->loc, Diag::ErrResultCount, fmt::format("def '{}'", def->name.name),
          fmt::format("{} results", def->results.size()), bind.names.size());
  } else {
    size_t opStart = fn_.ops.size();
    values = inlineDefResults(*def, *call, scope);
    std::vector<Operand*> kept;
    for (size_t i = 0; i < values.size(); ++i)
      if (bind.names[i].name != "_") kept.push_back(&values[i]);
    if (!values.empty() && kept.size() < values.size()) dropUnusedOps(opStart, kept);
  }
  values.resize(bind.names.size(), Operand::poison());
  for (size_t i = 0; i < bind.names.size(); ++i) {
    const ast::Ident& name = bind.names[i];
    if (name.name == "_") continue;
    if (!bind.isLet) {
      assignValue(name, values[i], bind.value->loc, scope);
      continue;
    }
    Binding binding;
    binding.kind = Binding::Kind::Let;
    binding.value = values[i];
    if (!values[i].isPoison()) {
      binding.type = typeOf(values[i]);
      if (fn_.values[values[i].id].name.empty()) fn_.values[values[i].id].name = name.name;
    }
    declare(scope, name, std::move(binding));
  }
}

void FunctionLowerer::dropUnusedOps(size_t opStart, std::vector<Operand*> kept) {
  if (opStart >= fn_.ops.size()) return;
  // addOp appends one value per op, so the values from the first dropped op's on are the tail.
  const ir::ValueId valueStart = fn_.ops[opStart].result;
  const size_t count = fn_.ops.size() - opStart;
  std::vector<bool> live(count, false);
  auto mark = [&](ir::ValueId id) {
    if (id >= valueStart) live[fn_.values[id].definingOp - opStart] = true;
  };
  for (const Operand* operand : kept)
    if (!operand->isPoison()) mark(operand->id);
  for (const ir::ParamUpdate& update : fn_.updates)
    mark(update.value); // a step state's `next` value, written inside the call
  for (size_t i = 0; i < count; ++i)
    if (fn_.ops[opStart + i].kind == ir::OpKind::Param) live[i] = true; // state, even if unread
  for (size_t i = count; i-- > 0;)
    if (live[i])
      for (ir::ValueId operand : fn_.ops[opStart + i].operands)
        mark(operand);
  std::vector<ir::Op> ops(std::make_move_iterator(fn_.ops.begin() + long(opStart)),
                          std::make_move_iterator(fn_.ops.end()));
  std::vector<ir::Value> values(std::make_move_iterator(fn_.values.begin() + valueStart),
                                std::make_move_iterator(fn_.values.end()));
  fn_.ops.resize(opStart);
  fn_.values.resize(valueStart);
  std::map<ir::ValueId, ir::ValueId> renamed;
  for (size_t i = 0; i < count; ++i) {
    if (!live[i]) continue;
    ir::Op op = std::move(ops[i]);
    for (ir::ValueId& operand : op.operands)
      if (operand >= valueStart) operand = renamed.at(operand);
    ir::ValueId old = op.result;
    ir::Value& value = values[old - valueStart];
    renamed[old] = fn_.addOp(std::move(op), std::move(value.type), std::move(value.name));
  }
  for (Operand* operand : kept)
    if (!operand->isPoison() && operand->id >= valueStart) operand->id = renamed.at(operand->id);
  for (ir::ParamInfo& param : fn_.params)
    if (param.value >= valueStart) param.value = renamed.at(param.value);
  for (ir::ParamUpdate& update : fn_.updates)
    if (update.value >= valueStart) update.value = renamed.at(update.value);
}

// ------------------------------------------------------------------------- metrics

void FunctionLowerer::bindMetrics(const ast::TrainDecl& train, Scope& scope) {
  bindOutputs(train.metrics, scope);
  for (const ast::TypedName& metric : train.metrics) {
    if (metric.name.name == "loss") error(metric.name.loc, Diag::ErrMetricNamedLoss);
    auto it = scope.names.find(metric.name.name);
    if (it == scope.names.end() || it->second.kind != Binding::Kind::Output) continue;
    std::optional<ir::TensorType>& type = it->second.type;
    if (type && (type->dtype != ir::DType::F32 || !type->dims.empty())) {
      error(metric.type.loc, Diag::ErrMetricType, metric.name.name, typeString(*type));
      type.reset(); // setting it then poisons it, quietly
    }
  }
}

void FunctionLowerer::collectMetrics(const ast::TrainDecl& train, Scope& scope) {
  // After the loss, which lowerMinimize appended (without it, an error was reported).
  collectOutputs(train.metrics, scope);
}

} // namespace sema
} // namespace meshc
