#include "ir/Verifier.h"

#include "ir/OpTraits.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace meshc::ir {

std::string describeType(const TensorType& type) {
  std::string text = std::string(dtypeName(type.dtype)) + "[";
  for (size_t i = 0; i < type.dims.size(); ++i)
    text += fmt::format("{}{}={}", i ? ", " : "", type.dims[i].name, type.dims[i].size);
  return text + "]";
}

std::string VerifierError::format() const {
  std::string where = loc.line ? fmt::format("{}:{}:{}: ", loc.file, loc.line, loc.col) : "";
  std::string what = op.empty() ? "" : fmt::format(", op {}", op);
  return fmt::format("{}in '{}'{}: {}", where, function, what, message);
}

namespace {

/// Dims as a set by name, with sizes: the IR's dims are a set (their order is storage order).
using DimSet = std::map<std::string, int64_t>;

DimSet dimSet(const TensorType& type) {
  DimSet set;
  for (const Dim& dim : type.dims)
    set.emplace(dim.name, dim.size);
  return set;
}

std::string describeDims(const DimSet& dims) {
  std::string text = "[";
  for (const auto& [name, size] : dims)
    text += fmt::format("{}{}={}", text.size() > 1 ? ", " : "", name, size);
  return text + "]";
}

std::vector<std::string> splitWords(std::string_view text) {
  std::vector<std::string> words;
  std::istringstream in{std::string(text)};
  for (std::string word; in >> word;)
    words.push_back(word);
  return words;
}

class FunctionVerifier {
public:
  explicit FunctionVerifier(const Function& fn) : fn_(fn) {}

  std::vector<VerifierError> run() {
    std::vector<bool> defined(fn_.values.size(), false);
    for (size_t i = 0; i < fn_.ops.size(); ++i) {
      const Op& op = fn_.ops[i];
      current_ = &op;
      if (op.result >= fn_.values.size()) {
        fail(fmt::format("its result %{} is not a value of the function", op.result));
        continue;
      }
      bool operandsOk = true;
      for (ValueId operand : op.operands)
        if (operand >= fn_.values.size() || !defined[operand]) {
          fail(fmt::format("uses %{} before its definition", operand));
          operandsOk = false;
        }
      if (defined[op.result]) fail(fmt::format("defines %{} a second time", op.result));
      if (fn_.values[op.result].definingOp != i)
        fail(fmt::format("its result %{} names op #{} as its definition", op.result,
                         fn_.values[op.result].definingOp));
      defined[op.result] = true;
      checkUniqueDims(type(op.result));
      if (checkArity(op) && operandsOk) {
        checkAttrs(op);
        checkResultType(op);
      }
    }
    current_ = nullptr;
    for (size_t v = 0; v < defined.size(); ++v)
      if (!defined[v]) fail(fmt::format("value %{} is defined by no op", v));
    checkTables(defined);
    return std::move(errors_);
  }

private:
  void fail(std::string message) {
    VerifierError error{fn_.name, "", current_ ? current_->loc : fn_.loc, std::move(message)};
    if (current_) error.op = fmt::format("%{} = {}", current_->result, opSpelling(current_->kind));
    errors_.push_back(std::move(error));
  }

  const TensorType& type(ValueId id) const { return fn_.typeOf(id); }

  /// The index arithmetic of every later phase matches dims by name.
  void checkUniqueDims(const TensorType& result) {
    std::set<std::string> names;
    for (const Dim& dim : result.dims)
      if (!names.insert(dim.name).second)
        fail(
            fmt::format("dim '{}' appears twice in its result {}", dim.name, describeType(result)));
  }

  bool checkArity(const Op& op) {
    const OpTraits& traits = opTraits(op.kind);
    if (traits.acceptsOperandCount(op.operands.size())) return true;
    fail(fmt::format("has {} operands but takes {}", op.operands.size(),
                     traits.isVariadic() ? std::string("one or more")
                                         : std::to_string(traits.arity)));
    return false;
  }

  void checkAttrs(const Op& op) {
    for (const std::string& name : splitWords(opTraits(op.kind).attrs))
      if (!op.attr(name)) fail(fmt::format("lacks its attribute [{}]", name));
  }

  /// The union by name of the operands' dims; a name with two sizes is an error.
  DimSet unionOf(const std::vector<ValueId>& operands) {
    DimSet dims;
    for (ValueId operand : operands)
      for (const Dim& dim : type(operand).dims) {
        auto [it, added] = dims.emplace(dim.name, dim.size);
        if (!added && it->second != dim.size)
          fail(fmt::format("its operands disagree on the size of dim '{}' ({} and {})", dim.name,
                           it->second, dim.size));
      }
    return dims;
  }

  void expectDims(const DimSet& want, const char* rule) {
    DimSet got = dimSet(type(current_->result));
    if (got != want)
      fail(fmt::format("result dims {} differ from {} {}", describeDims(got), rule,
                       describeDims(want)));
  }

  void expectDtype(DType want, const char* what) {
    DType got = type(current_->result).dtype;
    if (got != want)
      fail(
          fmt::format("result dtype {} differs from {} {}", dtypeName(got), what, dtypeName(want)));
  }

  /// Every operand in `operands` has the dtype of the first; returns it.
  DType commonDtype(const std::vector<ValueId>& operands) {
    DType dtype = type(operands.front()).dtype;
    for (ValueId operand : operands)
      if (type(operand).dtype != dtype)
        fail(fmt::format("operands %{} and %{} have dtypes {} and {}", operands.front(), operand,
                         dtypeName(dtype), dtypeName(type(operand).dtype)));
    return dtype;
  }

  void checkResultType(const Op& op) {
    const TensorType& result = type(op.result);
    switch (opTraits(op.kind).result) {
    case ResultRule::Source:
      return checkSource(op);
    case ResultRule::Same:
      // Every operand has the result's type (layer_norm_grad's ct too: its kernels walk x, ct
      // and dx alike).
      for (ValueId operand : op.operands)
        if (result != type(operand))
          fail(fmt::format("result type {} differs from its operand's {}", describeType(result),
                           describeType(type(operand))));
      return;
    case ResultRule::Convert:
      if (result.dims != type(op.operands[0]).dims)
        fail(fmt::format("result dims {} differ from its operand's {}", describeType(result),
                         describeType(type(op.operands[0]))));
      return;
    case ResultRule::Permute:
      expectDtype(type(op.operands[0]).dtype, "its operand's");
      return expectDims(dimSet(type(op.operands[0])), "its operand's");
    case ResultRule::Expand: {
      expectDtype(type(op.operands[0]).dtype, "its operand's");
      DimSet want = dimSet(result);
      for (const Dim& dim : type(op.operands[0]).dims)
        if (!want.count(dim.name) || want.at(dim.name) != dim.size)
          fail(fmt::format("result {} lacks the operand's dim {}={}", describeType(result),
                           dim.name, dim.size));
      return;
    }
    case ResultRule::Broadcast:
      expectDtype(commonDtype(op.operands), "the operands'");
      return expectDims(unionOf(op.operands), "the union of the operands'");
    case ResultRule::Compare:
      commonDtype(op.operands);
      expectDtype(DType::I32, "a comparison's");
      return expectDims(unionOf(op.operands), "the union of the operands'");
    case ResultRule::Select:
      expectDtype(commonDtype({op.operands[1], op.operands[2]}), "the selected operands'");
      return expectDims(unionOf(op.operands), "the union of the operands'");
    case ResultRule::External:
      return expectDims(unionOf(op.operands), "the union of the operands'");
    case ResultRule::Contract: {
      expectDtype(commonDtype(op.operands), "the operands'");
      DimSet all = unionOf(op.operands);
      for (const Dim& dim : result.dims)
        if (!all.count(dim.name) || all.at(dim.name) != dim.size)
          fail(fmt::format("result dim {}={} is not a dim of any operand", dim.name, dim.size));
      return;
    }
    case ResultRule::Reduce: {
      expectDtype(type(op.operands[0]).dtype, "its operand's");
      DimSet want = dimSet(type(op.operands[0]));
      for (const std::string& dim : op.dims("dims"))
        if (!want.erase(dim))
          fail(fmt::format("reduces over dim '{}' that its operand lacks", dim));
      return expectDims(want, "its operand's less [dims]");
    }
    case ResultRule::Remap:
      return checkRemap(op, std::nullopt);
    case ResultRule::Positions:
      return checkRemap(op, DType::I32);
    case ResultRule::OneHot: {
      if (type(op.operands[0]).dtype != DType::I32)
        fail(fmt::format("ids have dtype {}, not i32", dtypeName(type(op.operands[0]).dtype)));
      DimSet want = dimSet(type(op.operands[0]));
      std::string dim = op.string("dim");
      if (int at = result.findDim(dim); at >= 0)
        want.emplace(dim, result.dims[at].size);
      else
        fail(fmt::format("result lacks the one-hot dim '{}'", dim));
      return expectDims(want, "the ids' dims plus [dim]");
    }
    case ResultRule::Gather: {
      const TensorType& table = type(op.operands[0]);
      expectDtype(table.dtype, "the table's");
      std::string dim = op.string("dim");
      if (!table.hasDim(dim)) fail(fmt::format("the table lacks the gathered dim '{}'", dim));
      DimSet want = dimSet(type(op.operands[1]));
      for (const Dim& d : table.dims)
        if (d.name != dim) want.emplace(d.name, d.size);
      return expectDims(want, "the ids' dims plus the table's less [dim]");
    }
    }
  }

  /// Sources whose type a table or attribute fixes; random samples take any (sema-given) type.
  void checkSource(const Op& op) {
    const TensorType& result = type(op.result);
    if (op.kind == OpKind::Input) checkInputOp(op);
    if (op.kind == OpKind::Param) checkParamOp(op);
    if ((op.kind == OpKind::Literal || op.kind == OpKind::TrainStep) && !result.dims.empty())
      fail(fmt::format("is not a scalar: {}", describeType(result)));
    if (op.kind == OpKind::Iota && (result.dtype != DType::I32 || result.dims.size() != 1 ||
                                    result.dims[0].name != op.string("dim")))
      fail(fmt::format("result {} is not i32 along [dim] '{}'", describeType(result),
                       op.string("dim")));
  }

  void checkInputOp(const Op& op) {
    int64_t index = op.integer("index", -1);
    if (index < 0 || static_cast<size_t>(index) >= fn_.inputs.size())
      return fail(fmt::format("names input #{} of {}", index, fn_.inputs.size()));
    const InputInfo& input = fn_.inputs[static_cast<size_t>(index)];
    if (input.value != op.result)
      fail(fmt::format("is not input '{}''s value (%{})", input.name, input.value));
    if (input.type != type(op.result))
      fail(fmt::format("result type {} differs from input '{}''s {}", describeType(type(op.result)),
                       input.name, describeType(input.type)));
  }

  void checkParamOp(const Op& op) {
    std::string path = op.string("path");
    auto param = std::find_if(fn_.params.begin(), fn_.params.end(),
                              [&](const ParamInfo& p) { return p.value == op.result; });
    if (param == fn_.params.end())
      return fail(fmt::format("param '{}' is not in the params table", path));
    if (param->path != path)
      fail(fmt::format("has path '{}' but its params entry is '{}'", path, param->path));
    if (param->type != type(op.result))
      fail(fmt::format("result type {} differs from param '{}''s {}", describeType(type(op.result)),
                       path, describeType(param->type)));
  }

  /// rename, reshape, slice, pad, concat: each operand's dims with [from] (for concat, its own
  /// entry of [from]) replaced by [to] are the result's dims, by name; the result's dtype is
  /// `dtype` if given, else the operands'.
  void checkRemap(const Op& op, std::optional<DType> dtype) {
    const TensorType& result = type(op.result);
    std::vector<std::string> from = op.dims("from"), to = op.dims("to");
    bool perOperand = opTraits(op.kind).isVariadic();
    if (perOperand && from.size() != op.operands.size())
      return fail(
          fmt::format("has {} operands but {} [from] dims", op.operands.size(), from.size()));
    DimSet resultDims = dimSet(result);
    std::set<std::string> toNames(to.begin(), to.end());
    for (size_t k = 0; k < op.operands.size(); ++k) {
      const TensorType& operand = type(op.operands[k]);
      if (dtype && result.dtype != *dtype)
        fail(fmt::format("result dtype {} is not {}", dtypeName(result.dtype), dtypeName(*dtype)));
      else if (!dtype && operand.dtype != result.dtype)
        fail(fmt::format("result dtype {} differs from operand %{}'s {}", dtypeName(result.dtype),
                         op.operands[k], dtypeName(operand.dtype)));
      std::set<std::string> removed;
      if (perOperand)
        removed.insert(from[k]);
      else
        removed.insert(from.begin(), from.end());
      DimSet want;
      for (const Dim& dim : operand.dims) {
        if (removed.count(dim.name)) continue;
        want.emplace(dim.name, dim.size);
      }
      for (const std::string& name : removed)
        if (!operand.hasDim(name))
          fail(fmt::format("operand %{} lacks the [from] dim '{}'", op.operands[k], name));
      for (const std::string& name : toNames) {
        auto it = resultDims.find(name);
        if (it == resultDims.end())
          fail(fmt::format("result lacks the [to] dim '{}'", name));
        else
          want.emplace(name, it->second);
      }
      expectDims(want, "the operand's with [from] replaced by [to]");
    }
  }

  void checkTables(const std::vector<bool>& defined) {
    auto valid = [&](ValueId id) { return id < fn_.values.size() && defined[id]; };
    auto definedBy = [&](ValueId id, OpKind kind) {
      return valid(id) && fn_.definingOp(id).kind == kind;
    };
    for (const InputInfo& input : fn_.inputs)
      if (!definedBy(input.value, OpKind::Input))
        fail(fmt::format("input '{}' is %{}, not an input op's result", input.name, input.value));
    std::set<std::string> paths;
    for (const ParamInfo& param : fn_.params) {
      if (!definedBy(param.value, OpKind::Param))
        fail(fmt::format("param '{}' is %{}, not a param op's result", param.path, param.value));
      if (!paths.insert(param.path).second)
        fail(fmt::format("param path '{}' appears twice in the params table", param.path));
    }
    for (const OutputInfo& output : fn_.outputs)
      if (!valid(output.value))
        fail(fmt::format("output '{}' is %{}, which no op defines", output.name, output.value));
    if (fn_.train) {
      if (!valid(fn_.train->loss))
        fail(fmt::format("the loss %{} is defined by no op", fn_.train->loss));
      else if (!type(fn_.train->loss).dims.empty())
        fail(fmt::format("the loss is not a scalar: {}", describeType(type(fn_.train->loss))));
    }
    std::set<size_t> updated;
    for (const ParamUpdate& update : fn_.updates) {
      if (update.param >= fn_.params.size()) {
        fail(fmt::format("an update writes param #{} of {}", update.param, fn_.params.size()));
        continue;
      }
      const ParamInfo& param = fn_.params[update.param];
      if (!updated.insert(update.param).second)
        fail(fmt::format("param '{}' is updated twice", param.path));
      if (!valid(update.value)) {
        fail(fmt::format("the update of param '{}' is %{}, which no op defines", param.path,
                         update.value));
        continue;
      }
      if (type(update.value) != param.type)
        fail(fmt::format("the update of param '{}' has type {} but the param has type {}",
                         param.path, describeType(type(update.value)), describeType(param.type)));
    }
  }

  const Function& fn_;
  const Op* current_ = nullptr;
  std::vector<VerifierError> errors_;
};

} // namespace

std::vector<VerifierError> verifyFunction(const Function& fn) {
  return FunctionVerifier(fn).run();
}

std::vector<VerifierError> verifyModule(const Module& module) {
  std::vector<VerifierError> errors;
  for (const Function& fn : module.functions) {
    std::vector<VerifierError> found = verifyFunction(fn);
    errors.insert(errors.end(), std::make_move_iterator(found.begin()),
                  std::make_move_iterator(found.end()));
  }
  return errors;
}

} // namespace meshc::ir
