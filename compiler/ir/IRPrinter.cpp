#include "ir/IRPrinter.h"

#include <fmt/format.h>

namespace meshc::ir {

namespace {

std::string typeString(const TensorType& type) {
  std::string out = fmt::format("{}[", dtypeName(type.dtype));
  for (size_t i = 0; i < type.dims.size(); ++i)
    out += (i ? ", " : "") + type.dims[i].name;
  return out + "]";
}

/// Doubles always print with a '.', an exponent or as inf/nan, so that the IR parser can tell
/// them from integers.
std::string numberString(double d) {
  std::string s = fmt::format("{}", d);
  if (s.find_first_of(".eEna") == std::string::npos) s += ".0";
  return s;
}

std::string attrValueString(const AttrValue& value) {
  if (const double* d = std::get_if<double>(&value)) return numberString(*d);
  if (const int64_t* i = std::get_if<int64_t>(&value)) return fmt::format("{}", *i);
  if (const std::string* s = std::get_if<std::string>(&value)) return fmt::format("\"{}\"", *s);
  const auto& list = std::get<std::vector<std::string>>(value);
  return fmt::format("[{}]", fmt::join(list, ", "));
}

std::string attrsString(const std::vector<std::pair<std::string, AttrValue>>& attrs) {
  if (attrs.empty()) return "";
  std::vector<std::string> parts;
  for (const auto& [key, value] : attrs)
    parts.push_back(fmt::format("{} = {}", key, attrValueString(value)));
  return fmt::format(" {{{}}}", fmt::join(parts, ", "));
}

std::string locString(const Location& loc) {
  return fmt::format("{}:{}:{}", loc.file, loc.line, loc.col);
}

void printFunction(const Function& fn, llvm::raw_ostream& os) {
  std::vector<std::string> inputs;
  for (const InputInfo& in : fn.inputs)
    inputs.push_back(fmt::format("{}: {}{}", in.name, typeString(in.type),
                                 in.indexBound ? fmt::format(" < {}", in.indexBound) : ""));
  os << fmt::format("{} {}({})", fn.kind == Function::Kind::Train ? "train" : "program", fn.name,
                    fmt::join(inputs, ", "));
  if (fn.kind == Function::Kind::Program) {
    std::vector<std::string> outputs;
    for (const OutputInfo& out : fn.outputs)
      outputs.push_back(fmt::format("{}: {}", out.name, typeString(fn.typeOf(out.value))));
    os << fmt::format(" -> ({})", fmt::join(outputs, ", "));
  }
  os << " {\n";
  for (const ParamInfo& p : fn.params) {
    std::vector<std::string> args;
    for (const auto& [key, value] : p.init.args)
      args.push_back(fmt::format("{} = {}", key, numberString(value)));
    const char* keyword = p.role == ParamRole::OptimizerState ? "state"
                          : p.role == ParamRole::StepState    ? "step_state"
                          : p.trainable                       ? "param"
                                                              : "const";
    os << fmt::format("  {} {}: {} = {}({})  // {}\n", keyword, p.path, typeString(p.type),
                      p.init.kind, fmt::join(args, ", "), locString(p.loc));
  }
  for (const Op& op : fn.ops) {
    std::vector<std::string> operands;
    for (ValueId v : op.operands)
      operands.push_back(fmt::format("%{}", v));
    const Value& result = fn.value(op.result);
    std::string line = fmt::format("  %{} = {}{}{}{} : {}", op.result, opSpelling(op.kind),
                                   operands.empty() ? "" : " ", fmt::join(operands, ", "),
                                   attrsString(op.attrs), typeString(result.type));
    std::string comment =
        result.name.empty() ? locString(op.loc) : result.name + " " + locString(op.loc);
    os << fmt::format("{:<71} // {}\n", line, comment);
  }
  if (fn.train)
    os << fmt::format("  minimize %{} with {}{}  // {}\n", fn.train->loss, fn.train->optimizer,
                      attrsString(fn.train->options), locString(fn.train->loc));
  for (const ParamUpdate& update : fn.updates)
    os << fmt::format("  update {} = %{}\n",
                      update.param < fn.params.size() ? fn.params[update.param].path : "?",
                      update.value);
  for (const OutputInfo& out : fn.outputs)
    os << fmt::format("  return {} = %{}\n", out.name, out.value);
  os << "}\n";
}

} // namespace

void printType(const TensorType& type, llvm::raw_ostream& os) {
  os << typeString(type);
}

void printModule(const Module& module, llvm::raw_ostream& os) {
  if (!module.meshName.empty()) {
    std::vector<std::string> axes;
    for (const MeshAxis& axis : module.mesh)
      axes.push_back(fmt::format("{} = {}", axis.name, axis.size));
    os << fmt::format("mesh {}[{}]\n", module.meshName, fmt::join(axes, ", "));
  }
  for (const auto& [name, size] : module.dims)
    os << fmt::format("dim {} = {}\n", name, size);
  if (!module.layout.empty() || module.autoLayout) {
    std::vector<std::string> items;
    for (const DimLayout& entry : module.layout)
      items.push_back(entry.isAuto
                          ? fmt::format("{}: auto", entry.dim)
                          : fmt::format("{}: [{}]{}", entry.dim, fmt::join(entry.axes, ", "),
                                        entry.split.empty()
                                            ? ""
                                            : fmt::format("({})", fmt::join(entry.split, ", "))));
    if (module.autoLayout) items.push_back("auto");
    os << fmt::format("layout {}\n", fmt::join(items, ", "));
  }
  for (const Function& fn : module.functions) {
    os << "\n";
    printFunction(fn, os);
  }
}

} // namespace meshc::ir
