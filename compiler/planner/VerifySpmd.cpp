#include "planner/VerifySpmd.h"

#include "ir/OpTraits.h"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

namespace meshc::plan {

std::vector<ir::VerifierError> verifySpmdFunction(const SpmdFunction& fn) {
  std::vector<ir::VerifierError> errors;
  const SpmdOp* current = nullptr;
  auto fail = [&](std::string message) {
    ir::VerifierError error{fn.name, "", current ? current->loc : ir::Location{},
                            std::move(message)};
    if (current)
      error.op = fmt::format("%{} = {}", current->result,
                             current->kind == SpmdOp::Kind::Collective
                                 ? collectiveName(current->collective.kind)
                                 : ir::opSpelling(current->computeKind));
    errors.push_back(std::move(error));
  };
  std::vector<bool> defined(fn.values.size(), false);
  auto define = [&](SpmdValueId id) {
    if (id >= fn.values.size()) return fail(fmt::format("defines %{}, not a value", id));
    // A collective may resolve a value in place (its result is its operand).
    if (defined[id] && !(current->kind == SpmdOp::Kind::Collective &&
                         std::find(current->operands.begin(), current->operands.end(), id) !=
                             current->operands.end()))
      fail(fmt::format("defines %{} a second time", id));
    defined[id] = true;
  };
  for (const SpmdOp& op : fn.ops) {
    current = &op;
    for (SpmdValueId operand : op.operands)
      if (operand >= fn.values.size() || !defined[operand])
        fail(fmt::format("uses %{} before its definition", operand));
    if (op.kind == SpmdOp::Kind::Compute) {
      const ir::OpTraits& traits = ir::opTraits(op.computeKind);
      if (!traits.acceptsOperandCount(op.operands.size()))
        fail(fmt::format("has {} operands but takes {}", op.operands.size(),
                         traits.isVariadic() ? std::string("one or more")
                                             : std::to_string(traits.arity)));
      std::istringstream attrs{std::string(traits.attrs)};
      for (std::string name; attrs >> name;)
        if (std::none_of(op.attrs.begin(), op.attrs.end(),
                         [&](const auto& attr) { return attr.first == name; }))
          fail(fmt::format("lacks its attribute [{}]", name));
    } else if (op.operands.empty()) {
      fail("is a collective without operands");
    }
    define(op.result);
    for (SpmdValueId result : op.results)
      if (result != op.result) define(result);
  }
  current = nullptr;
  auto check = [&](SpmdValueId id, const std::string& what) {
    if (id >= fn.values.size() || !defined[id])
      fail(fmt::format("{} is %{}, which no op defines", what, id));
  };
  for (SpmdValueId id : fn.inputs)
    check(id, "an input");
  for (SpmdValueId id : fn.params)
    check(id, "a param");
  for (const auto& [name, id] : fn.outputs)
    check(id, fmt::format("output '{}'", name));
  for (const auto& [param, id] : fn.updates) {
    if (param >= fn.params.size()) {
      fail(fmt::format("an update writes param #{} of {}", param, fn.params.size()));
      continue;
    }
    check(id, fmt::format("the update of param #{}", param));
    SpmdValueId paramValue = fn.params[param];
    if (id < fn.values.size() && paramValue < fn.values.size() &&
        fn.values[id].localType != fn.values[paramValue].localType)
      fail(fmt::format("the update of param #{} has local type {} but the param has {}", param,
                       ir::describeType(fn.values[id].localType),
                       ir::describeType(fn.values[paramValue].localType)));
  }
  return errors;
}

} // namespace meshc::plan
