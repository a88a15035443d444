#include "ir/IR.h"

namespace meshc::ir {

const char* dtypeName(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return "f32";
  case DType::BF16:
    return "bf16";
  case DType::F16:
    return "f16";
  case DType::I32:
    return "i32";
  }
  return "?";
}

bool isFloat(DType dtype) {
  return dtype != DType::I32;
}

int64_t TensorType::numElements() const {
  int64_t n = 1;
  for (const Dim& d : dims)
    n *= d.size;
  return n;
}

int TensorType::findDim(const std::string& name) const {
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i].name == name) return static_cast<int>(i);
  return -1;
}

static const char* const kOpSpellings[] = {
#define OP(Name, Spelling, Arity, Result, Linear, Gradient, Traits, Attrs, Description) Spelling,
#include "ir/OpKinds.def"
#undef OP
};
static const char* const kOpDescriptions[] = {
#define OP(Name, Spelling, Arity, Result, Linear, Gradient, Traits, Attrs, Description) Description,
#include "ir/OpKinds.def"
#undef OP
};

const char* opSpelling(OpKind kind) {
  return kOpSpellings[static_cast<size_t>(kind)];
}
const char* opDescription(OpKind kind) {
  return kOpDescriptions[static_cast<size_t>(kind)];
}

const AttrValue* Op::attr(const std::string& name) const {
  for (const auto& [key, value] : attrs)
    if (key == name) return &value;
  return nullptr;
}

double Op::number(const std::string& name, double fallback) const {
  const AttrValue* v = attr(name);
  if (!v) return fallback;
  if (const double* d = std::get_if<double>(v)) return *d;
  if (const int64_t* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
  return fallback;
}

int64_t Op::integer(const std::string& name, int64_t fallback) const {
  const AttrValue* v = attr(name);
  if (!v) return fallback;
  if (const int64_t* i = std::get_if<int64_t>(v)) return *i;
  if (const double* d = std::get_if<double>(v)) return static_cast<int64_t>(*d);
  return fallback;
}

std::string Op::string(const std::string& name) const {
  const AttrValue* v = attr(name);
  if (const std::string* s = v ? std::get_if<std::string>(v) : nullptr) return *s;
  return {};
}

std::vector<std::string> Op::dims(const std::string& name) const {
  const AttrValue* v = attr(name);
  if (!v) return {};
  if (const auto* list = std::get_if<std::vector<std::string>>(v)) return *list;
  if (const std::string* s = std::get_if<std::string>(v)) return {*s};
  return {};
}

void Op::setAttr(const std::string& name, AttrValue value) {
  for (auto& [key, existing] : attrs)
    if (key == name) {
      existing = std::move(value);
      return;
    }
  attrs.emplace_back(name, std::move(value));
}

double Initializer::arg(const std::string& name, double fallback) const {
  for (const auto& [key, value] : args)
    if (key == name) return value;
  return fallback;
}

std::string defOfCallPath(const std::string& callPath) {
  std::string segment = callPath.substr(callPath.rfind('/') + 1);
  return segment.substr(0, segment.find_first_of("#["));
}

ValueId Function::addOp(Op op, TensorType type, std::string valueName) {
  ValueId id = static_cast<ValueId>(values.size());
  values.push_back(Value{std::move(type), std::move(valueName), static_cast<uint32_t>(ops.size())});
  op.result = id;
  ops.push_back(std::move(op));
  return id;
}

bool hasOptimizerUpdates(const Function& fn) {
  for (const ParamUpdate& update : fn.updates)
    if (update.param < fn.params.size() && fn.params[update.param].role != ParamRole::StepState)
      return true;
  return false;
}

const Function* Module::findFunction(const std::string& name) const {
  for (const Function& fn : functions)
    if (fn.name == name) return &fn;
  return nullptr;
}

} // namespace meshc::ir
