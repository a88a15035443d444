// Step state: `state name: type = init()` declares a tensor that persists across the steps of a
// train block (a Param of role StepState), and `next name = expr` gives its value for the next
// step (a ParamUpdate that sema adds; the training phase adds the optimizer's after it).
// docs/language.md ("Step state") describes the construct.
#include "sema/Lowering.h"

namespace meshc {
namespace sema {

using llvm::SMLoc;

bool FunctionLowerer::checkStateAllowed(const ast::ParamStmt& state) {
  // A def checked alone (nobody inlined it) may be called from a train block later.
  bool checkingDefAlone = !frames_.empty() && frames_.front().def != nullptr;
  if (fn_.kind == ir::Function::Kind::Train || checkingDefAlone) return true;
  error(state.name.loc, Diag::ErrStateOutsideTrain, state.name.name);
  return false;
}

static const char* bindingDescription(Binding::Kind kind) {
  switch (kind) {
  case Binding::Kind::Let:
    return "a let";
  case Binding::Kind::Input:
    return "an input";
  case Binding::Kind::Param:
    return "a param";
  case Binding::Kind::Const:
    return "a const";
  case Binding::Kind::State:
    return "a state";
  case Binding::Kind::Output:
    return "an output";
  }
  return "a value";
}

void FunctionLowerer::lowerNext(const ast::NextStmt& next, Scope& scope) {
  Operand value = next.value ? lowerExpr(*next.value, scope) : Operand::poison();
  SMLoc valueLoc = next.value ? next.value->loc : next.loc;
  const std::string& name = next.name.name;
  Binding* binding = scope.find(name);
  if (!binding) {
    error(next.name.loc, Diag::ErrAssignUndeclared, name);
    return;
  }
  if (binding->kind != Binding::Kind::State) {
    error(next.name.loc, Diag::ErrNextNotState, name, bindingDescription(binding->kind));
    return;
  }
  if (binding->statePath.empty()) return; // its declaration had errors, already reported
  // One write per step: every update is applied once the step ends, so a second write would
  // silently win over the first.
  auto [first, inserted] = stateWrites_.emplace(binding->statePath, next.name.loc);
  if (!inserted) {
    if (error(next.name.loc, Diag::ErrStateWrittenTwice, name))
      error(first->second, Diag::NoteStateWritten, name);
    return;
  }
  auto index = paramIndex_.find(binding->statePath);
  if (index == paramIndex_.end()) return;
  const ir::TensorType want = fn_.params[index->second].type; // the stored order
  value = coerceTo(value, want, valueLoc, [&](const std::string& got) {
    error(valueLoc, Diag::ErrStateWriteType, name, typeString(want), got);
  });
  if (value.isPoison()) return;
  fn_.updates.push_back(ir::ParamUpdate{index->second, value.id});
}

void FunctionLowerer::checkStatesWritten() {
  if (tooLarge_) return;
  for (const ir::ParamInfo& param : fn_.params)
    if (param.role == ir::ParamRole::StepState && !stateWrites_.count(param.path))
      error(param.loc.loc, Diag::ErrStateNotWritten, fn_.values[param.value].name);
}

} // namespace sema
} // namespace meshc
