// The C++ emitter. One FunctionEmitter per planned function writes its class declaration (into
// the header) and definitions (into the source); the module emitter wraps them, adds the runner
// main when asked, and formats everything with clang-format.
//
// Local semantics the generated code relies on (docs/planner.md, "Rules per op"): every compute
// op of the SPMD IR runs on local shards in their local layout; ops that see global positions
// (iota, one_hot, gather, slice/pad/concat, RNG fills, dropout) add this rank's shard start;
// mean divides by the GLOBAL count (its partial sums are resolved later); softmax, log_softmax,
// layer_norm, logsumexp, cumsum and shift along a split dim communicate inside the op, over the
// subgroup of that dim's axes (the in-place collectives the lowering lists right after such an
// op describe exactly that communication and are absorbed into it).
#include "codegen/CppEmitter.h"
#include "codegen/Target.h"

#include <clang/Format/Format.h>
#include <clang/Tooling/Core/Replacement.h>
#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>

#include <cassert>
#include <map>
#include <set>
#include <sstream>

namespace meshc::codegen {
namespace {

using ir::DType;
using ir::OpKind;
using ir::TensorType;
using plan::CollectiveKind;
using plan::SpmdOp;
using plan::SpmdValueId;
using Shape = std::vector<int64_t>;

std::string list(const Shape& values) {
  return fmt::format("{{{}}}", fmt::join(values, ", "));
}

std::string stringList(const std::vector<std::string>& values) {
  std::vector<std::string> quoted;
  for (const std::string& v : values)
    quoted.push_back(fmt::format("\"{}\"", v));
  return fmt::format("{{{}}}", fmt::join(quoted, ", "));
}

std::string quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

/// A C++ identifier from a name or path ("block[2]/attn/w_q" -> "block_2_attn_w_q").
std::string identifier(const std::string& name) {
  std::string out;
  for (char c : name) {
    char mapped = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    // No "__": identifiers containing it are reserved in C++.
    if (mapped == '_' && !out.empty() && out.back() == '_') continue;
    out += mapped;
  }
  while (!out.empty() && out.back() == '_')
    out.pop_back();
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "_" + out;
  // .mesh names may be C++ keywords (an input called `new` or `default`): suffix them.
  static const std::set<std::string> keywords = {
      "alignas",   "alignof",   "and",       "asm",      "auto",     "bool",     "break",
      "case",      "catch",     "char",      "class",    "concept",  "const",    "consteval",
      "constexpr", "continue",  "decltype",  "default",  "delete",   "do",       "double",
      "else",      "enum",      "explicit",  "export",   "extern",   "false",    "float",
      "for",       "friend",    "goto",      "if",       "inline",   "int",      "long",
      "mutable",   "namespace", "new",       "noexcept", "not",      "nullptr",  "operator",
      "or",        "private",   "protected", "public",   "register", "requires", "return",
      "short",     "signed",    "sizeof",    "static",   "struct",   "switch",   "template",
      "this",      "throw",     "true",      "try",      "typedef",  "typeid",   "typename",
      "union",     "unsigned",  "using",     "virtual",  "void",     "volatile", "while",
      "xor",       "inputs",    "outputs"};
  if (keywords.count(out)) out += "_";
  return out;
}

/// "mlp_train" -> "MlpTrain".
std::string className(const std::string& name) {
  std::string out;
  bool upper = true;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) {
      upper = true;
      continue;
    }
    out += upper ? char(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "P" + out;
  return out;
}

Shape sizesOf(const TensorType& type) {
  Shape sizes;
  for (const ir::Dim& dim : type.dims)
    sizes.push_back(dim.size);
  return sizes;
}

Shape rowMajorStrides(const TensorType& type) {
  Shape strides(type.dims.size());
  int64_t stride = 1;
  for (size_t i = type.dims.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= type.dims[i].size;
  }
  return strides;
}

/// Strides of `operand` over the dims `space` (matched by name, through `rename`: space name
/// -> operand name); 0 where the operand lacks the dim.
Shape stridesOver(const TensorType& operand, const std::vector<ir::Dim>& space,
                  const std::map<std::string, std::string>* rename = nullptr) {
  Shape own = rowMajorStrides(operand);
  Shape strides(space.size(), 0);
  for (size_t i = 0; i < space.size(); ++i) {
    std::string name = space[i].name;
    if (rename) {
      auto it = rename->find(name);
      if (it != rename->end()) name = it->second;
    }
    int position = operand.findDim(name);
    if (position >= 0) strides[i] = own[size_t(position)];
  }
  return strides;
}

std::vector<ir::Dim> dimsExcept(const TensorType& type, const std::vector<std::string>& names) {
  std::vector<ir::Dim> kept;
  for (const ir::Dim& dim : type.dims)
    if (!llvm::is_contained(names, dim.name)) kept.push_back(dim);
  return kept;
}

Shape sizesOf(const std::vector<ir::Dim>& dims) {
  Shape sizes;
  for (const ir::Dim& dim : dims)
    sizes.push_back(dim.size);
  return sizes;
}

const char* dtypeEnum(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return "meshc::gen::DType::F32";
  case DType::BF16:
    return "meshc::gen::DType::BF16";
  case DType::F16:
    return "meshc::gen::DType::F16";
  case DType::I32:
    return "meshc::gen::DType::I32";
  }
  return "meshc::gen::DType::F32";
}

/// The kernels' name of a dtype (meshrt::kernels::ValueType), for the RNG fills.
const char* valueTypeEnum(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return "meshrt::kernels::ValueType::F32";
  case DType::BF16:
    return "meshrt::kernels::ValueType::BF16";
  case DType::F16:
    return "meshrt::kernels::ValueType::F16";
  case DType::I32:
    return "meshrt::kernels::ValueType::I32";
  }
  return "meshrt::kernels::ValueType::F32";
}

const ir::AttrValue* findAttr(const SpmdOp& op, const std::string& name) {
  for (const auto& [key, value] : op.attrs)
    if (key == name) return &value;
  return nullptr;
}

double numberAttr(const SpmdOp& op, const std::string& name, double fallback) {
  const ir::AttrValue* value = findAttr(op, name);
  if (value && std::holds_alternative<double>(*value)) return std::get<double>(*value);
  if (value && std::holds_alternative<int64_t>(*value)) return double(std::get<int64_t>(*value));
  return fallback;
}

std::string stringAttr(const SpmdOp& op, const std::string& name) {
  const ir::AttrValue* value = findAttr(op, name);
  if (value && std::holds_alternative<std::string>(*value)) return std::get<std::string>(*value);
  if (value && std::holds_alternative<std::vector<std::string>>(*value)) {
    const auto& names = std::get<std::vector<std::string>>(*value);
    if (names.size() == 1) return names.front();
  }
  return "";
}

std::vector<std::string> namesAttr(const SpmdOp& op, const std::string& name) {
  const ir::AttrValue* value = findAttr(op, name);
  if (value && std::holds_alternative<std::vector<std::string>>(*value))
    return std::get<std::vector<std::string>>(*value);
  if (value && std::holds_alternative<std::string>(*value)) return {std::get<std::string>(*value)};
  return {};
}

/// A number as a C++ double literal that round-trips.
std::string doubleLiteral(double value) {
  if (std::isinf(value)) return value > 0 ? "INFINITY" : "-INFINITY";
  if (std::isnan(value)) return "NAN";
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".eE") == std::string::npos) text += ".0";
  return text;
}

bool isElementwise(OpKind kind) {
  switch (kind) {
  case OpKind::Neg:
  case OpKind::Abs:
  case OpKind::Exp:
  case OpKind::Log:
  case OpKind::Sqrt:
  case OpKind::Rsqrt:
  case OpKind::Square:
  case OpKind::Tanh:
  case OpKind::Sigmoid:
  case OpKind::Relu:
  case OpKind::Gelu:
  case OpKind::Sin:
  case OpKind::Cos:
  case OpKind::StopGradient:
  case OpKind::Cast:
  case OpKind::Transpose:
  case OpKind::Broadcast:
  case OpKind::Add:
  case OpKind::Sub:
  case OpKind::Mul:
  case OpKind::Div:
  case OpKind::Pow:
  case OpKind::Maximum:
  case OpKind::Minimum:
  case OpKind::Lt:
  case OpKind::Le:
  case OpKind::Gt:
  case OpKind::Ge:
  case OpKind::Eq:
  case OpKind::Ne:
  case OpKind::Where:
  case OpKind::Call:
    return true;
  default:
    return false;
  }
}

/// The scalar expression of an elementwise op over its operand expressions, computed as the
/// interpreter does (transcendentals in double, then rounded once to the result dtype).
std::string scalarExpr(OpKind kind, const std::vector<std::string>& args,
                       const std::vector<DType>& argTypes, DType result,
                       const std::string& userFunction = {}) {
  auto d = [&](size_t i) { return fmt::format("double({})", args[i]); };
  bool integer = argTypes.size() >= 2 && argTypes[0] == DType::I32 && argTypes[1] == DType::I32;
  std::string expr;
  switch (kind) {
  case OpKind::Neg:
    expr = fmt::format("-{}", args[0]);
    break;
  case OpKind::Abs:
    expr = fmt::format("std::fabs({})", args[0]);
    break;
  case OpKind::Exp:
    expr = fmt::format("std::exp({})", d(0));
    break;
  case OpKind::Log:
    expr = fmt::format("std::log({})", d(0));
    break;
  case OpKind::Sqrt:
    expr = fmt::format("std::sqrt({})", d(0));
    break;
  case OpKind::Rsqrt:
    expr = fmt::format("1.0 / std::sqrt({})", d(0));
    break;
  case OpKind::Square:
    expr = fmt::format("{0} * {0}", d(0));
    break;
  case OpKind::Tanh:
    expr = fmt::format("std::tanh({})", d(0));
    break;
  case OpKind::Sigmoid:
    expr = fmt::format("meshc::gen::sigmoid({})", args[0]);
    break;
  case OpKind::Relu:
    expr = fmt::format("({0} > 0 ? {0} : 0.0f)", args[0]);
    break;
  case OpKind::Gelu:
    expr = fmt::format("meshc::gen::gelu({})", args[0]);
    break;
  case OpKind::Sin:
    expr = fmt::format("std::sin({})", d(0));
    break;
  case OpKind::Cos:
    expr = fmt::format("std::cos({})", d(0));
    break;
  case OpKind::Cast:
    if (result == DType::I32 && argTypes[0] != DType::I32)
      return fmt::format("meshc::gen::castToI32({})", args[0]);
    expr = args[0];
    break;
  case OpKind::StopGradient:
  case OpKind::Transpose:
  case OpKind::Broadcast: // the operand's missing dims have stride 0 in the loop
    expr = args[0];
    break;
  case OpKind::Add:
    expr = fmt::format("{} + {}", d(0), d(1));
    break;
  case OpKind::Sub:
    expr = fmt::format("{} - {}", d(0), d(1));
    break;
  case OpKind::Mul:
    expr = fmt::format("{} * {}", d(0), d(1));
    break;
  case OpKind::Div:
    if (integer) return fmt::format("meshc::gen::divI32({}, {})", args[0], args[1]);
    expr = fmt::format("{} / {}", d(0), d(1));
    break;
  case OpKind::Pow:
    if (integer) return fmt::format("meshc::gen::powI32({}, {})", args[0], args[1]);
    expr = fmt::format("std::pow({}, {})", d(0), d(1));
    break;
  case OpKind::Maximum:
    expr = fmt::format("meshc::gen::maximum({}, {})", args[0], args[1]);
    break;
  case OpKind::Minimum:
    expr = fmt::format("meshc::gen::minimum({}, {})", args[0], args[1]);
    break;
  case OpKind::Lt:
    return fmt::format("({} < {} ? 1.0f : 0.0f)", args[0], args[1]);
  case OpKind::Le:
    return fmt::format("({} <= {} ? 1.0f : 0.0f)", args[0], args[1]);
  case OpKind::Gt:
    return fmt::format("({} > {} ? 1.0f : 0.0f)", args[0], args[1]);
  case OpKind::Ge:
    return fmt::format("({} >= {} ? 1.0f : 0.0f)", args[0], args[1]);
  case OpKind::Eq:
    return fmt::format("({} == {} ? 1.0f : 0.0f)", args[0], args[1]);
  case OpKind::Ne:
    return fmt::format("({} != {} ? 1.0f : 0.0f)", args[0], args[1]);
  case OpKind::Where:
    expr = fmt::format("({} != 0 ? {} : {})", args[0], args[1], args[2]);
    break;
  case OpKind::Call: // the user's function (its header is included by the source)
    expr = fmt::format("::{}({})", userFunction, fmt::join(args, ", "));
    break;
  default:
    expr = args[0];
    break;
  }
  switch (result) {
  case DType::F32:
    return fmt::format("float({})", expr);
  case DType::BF16:
  case DType::F16:
    // Rounded once, from double, as the interpreter does.
    return fmt::format("meshc::gen::roundValue({}, double({}))", dtypeEnum(result), expr);
  case DType::I32:
    return fmt::format("meshc::gen::wrapI32(double({}))", expr);
  }
  return expr;
}

std::string axesName(const plan::AxisList& axes) {
  return "group_" + fmt::format("{}", fmt::join(axes, "_"));
}

//===------------------------------------------------------------------------------------------===//
// One function
//===------------------------------------------------------------------------------------------===//

class FunctionEmitter {
public:
  FunctionEmitter(const ir::Module& module, const ir::Function& irFunction,
                  const plan::SpmdFunction& spmd)
      : name(className(spmd.name)), module(module), irFn(irFunction), fn(spmd) {}

  llvm::Error emit();

  std::string declaration; // into the header
  std::string definition;  // into the source
  const std::string name;
  /// Where the target's generated code differs (CPU loops vs device kernels): codegen/Target.h.
  const Target* target = nullptr;

  /// The runner's part for this function: runs it through meshrt::launch and records outputs.
  std::string runnerBody() const;
  /// The runner's `inputs` of the step `step` (a C++ expression): each input from the inputs
  /// file when it holds `<function>.<input>` (batch `step` mod k of its k batches), else
  /// synthesized from seed + step.
  std::string inputsOfStep(const std::string& step) const;

private:
  const TensorType& local(SpmdValueId id) const { return fn.values[id].localType; }
  const TensorType& global(SpmdValueId id) const { return fn.values[id].globalType; }
  const plan::TensorLayout& layout(SpmdValueId id) const { return fn.values[id].layout; }
  std::string var(SpmdValueId id) const { return fmt::format("v{}", id); }
  std::string where(const SpmdOp& op) const {
    return fmt::format("{}:{}", op.loc.file, op.loc.line);
  }

  /// The group member for `axes` (registering it for the constructor).
  std::string group(const plan::AxisList& axes) {
    groups.insert(axes);
    return axesName(axes);
  }
  /// Per dim of `id`'s local type: the expression of this rank's shard start.
  std::vector<std::string> shardStarts(SpmdValueId id) const;
  std::string shardStart(SpmdValueId id, const std::string& dim) const;
  /// The global base index of `id`'s shard and its global strides over the local dims.
  std::string globalBaseExpr(SpmdValueId id) const;
  /// This rank's shard of `id` as meshrt::kernels::Shard (global shape, offsets, local shape),
  /// for the kernels' RNG fills, which key every element by its global index.
  std::string shardExpr(SpmdValueId id) const;

  llvm::Error unsupported(const SpmdOp& op, const std::string& what) const {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "%s",
                                   fmt::format("{}:{}:{}: code generation does not support {}",
                                               op.loc.file, op.loc.line, op.loc.col, what)
                                       .c_str());
  }

  void comment(const SpmdOp& op, std::string& out) const;
  /// Declares `id` as a fresh (zeroed) slot of the arena, live from the op being emitted.
  void allocate(SpmdValueId id, std::string& out);
  /// Declares `result` as `operand`'s value: `operand`'s slot itself when op `index` is its
  /// last use (the slot moves on, as an in-place op), else a copy in a fresh slot.
  void bindCopy(SpmdValueId result, SpmdValueId operand, size_t index, std::string& out);
  /// A new slot for `id`; its offset goes at the end of `out` (run()'s body) once placed.
  void newSlot(SpmdValueId id, std::string& out);
  /// Places the slots in the arena (first fit, largest first, among slots whose live ranges
  /// overlap) and writes their offsets into `body`.
  void assignSlotOffsets(std::string& body);
  llvm::Error emitCompute(size_t index, std::string& out);
  llvm::Error emitCollective(size_t index, std::string& out);
  void emitElementwiseGroup(const std::vector<size_t>& group, std::string& out);
  void emitEinsum(const SpmdOp& op, std::string& out);
  llvm::Error emitAlong(size_t index, std::string& out);
  llvm::Error emitReduce(size_t index, std::string& out);
  /// Marks the in-place collectives after op `index` as part of it (checking their axes).
  llvm::Error absorbFollowers(size_t index, const plan::AxisList& axes);
  std::string paramMember(size_t k) const {
    return fmt::format("param{}_{}", k, identifier(irFn.params[k].path));
  }
  void emitConstructor(std::string& out);
  void emitHelpers(std::string& out);
  /// step(), paramNames(), isOptimizerState(), paramShards(), getParam() and setParam().
  void emitParamAccess(std::string& out);
  /// save(dir) / load(dir) through meshrt's checkpoints: declarations into `h`, definitions
  /// into `s`.
  void emitCheckpointApi(std::string& h, std::string& s) const;
  /// The in-place collectives right after op `index` on its result (absorbed by the op).
  size_t inPlaceFollowers(size_t index) const;
  /// The param whose update the elementwise `group` computes, when the group can write it into
  /// the param's storage: the group reads the param's old value last, index for index.
  std::optional<size_t> inPlaceUpdate(const std::vector<size_t>& group);
  bool hasUpdates() const { return !fn.updates.empty(); }

  const ir::Module& module;
  const ir::Function& irFn;
  const plan::SpmdFunction& fn;

  std::set<plan::AxisList> groups;
  std::vector<int> uses;
  std::vector<size_t> lastUse;
  std::vector<bool> released;
  std::vector<bool> owned; // the value has its own buffer (not an input/param reference)
  std::vector<bool> absorbed;
  std::vector<bool> updatedInPlace; // per param: its update was written into its storage

  /// A piece of the arena: live from op `start` (the first op of the emitted group that
  /// defines it) through the last use of every value it holds.
  struct Slot {
    size_t bytes = 0, start = 0, end = 0, offset = 0;
    size_t at = 0; // where its offset goes in run()'s body (which only grows meanwhile)
    const std::string* body = nullptr;
  };
  std::vector<Slot> slots;
  std::vector<int> slotOf; // per value: its slot, or -1 (input, param, fused scalar)
  size_t emitting = 0;     // the first op of the group being emitted
  size_t arenaBytes = 0, temporaryBytes = 0;
};

std::string FunctionEmitter::shardStart(SpmdValueId id, const std::string& dim) const {
  const TensorType& type = local(id);
  int position = type.findDim(dim);
  if (position < 0) return "0";
  const plan::AxisList& axes = layout(id).dimAxes[size_t(position)];
  if (axes.empty()) return "0";
  return fmt::format("meshc::gen::shardStart(world_, {}, {})", stringList(axes),
                     type.dims[size_t(position)].size);
}

std::vector<std::string> FunctionEmitter::shardStarts(SpmdValueId id) const {
  std::vector<std::string> starts;
  for (const ir::Dim& dim : local(id).dims)
    starts.push_back(shardStart(id, dim.name));
  return starts;
}

std::string FunctionEmitter::globalBaseExpr(SpmdValueId id) const {
  return fmt::format("meshc::gen::globalBase({{{}}}, {})", fmt::join(shardStarts(id), ", "),
                     list(rowMajorStrides(global(id))));
}

std::string FunctionEmitter::shardExpr(SpmdValueId id) const {
  auto sizes = [](const TensorType& type) {
    std::vector<int64_t> out;
    for (const ir::Dim& dim : type.dims)
      out.push_back(dim.size);
    return fmt::format("meshrt::kernels::Dims{{{}}}", fmt::join(out, ", "));
  };
  return fmt::format("meshrt::kernels::Shard{{{}, meshrt::kernels::Dims{{{}}}, {}}}",
                     sizes(global(id)), fmt::join(shardStarts(id), ", "), sizes(local(id)));
}

void FunctionEmitter::comment(const SpmdOp& op, std::string& out) const {
  const std::string& valueName = fn.values[op.result].name;
  const char* what = op.kind == SpmdOp::Kind::Collective ? plan::collectiveName(op.collective.kind)
                                                         : ir::opSpelling(op.computeKind);
  out += fmt::format("// {}:{}:{} {}{}{}{}\n", op.loc.file, op.loc.line, op.loc.col, what,
                     valueName.empty() ? "" : " -> ", valueName,
                     op.note.empty() ? "" : " (" + op.note + ")");
}

void FunctionEmitter::newSlot(SpmdValueId id, std::string& out) {
  Slot slot;
  slot.bytes = size_t(local(id).numElements()) * sizeof(float);
  slot.start = slot.end = emitting;
  slot.at = out.size();
  slot.body = &out;
  slotOf[id] = int(slots.size());
  slots.push_back(slot);
}

void FunctionEmitter::allocate(SpmdValueId id, std::string& out) {
  out += fmt::format("meshc::gen::View {} = arena_.slot(", var(id));
  newSlot(id, out);
  out += fmt::format(", {});\n", local(id).numElements());
}

void FunctionEmitter::bindCopy(SpmdValueId result, SpmdValueId operand, size_t index,
                               std::string& out) {
  if (owned[operand] && !released[operand] && lastUse[operand] == index) {
    released[operand] = true; // dies here: its slot moves on
    slotOf[result] = slotOf[operand];
    out += fmt::format("meshc::gen::View {} = {};\n", var(result), var(operand));
    return;
  }
  out += fmt::format("meshc::gen::View {} = arena_.copy(", var(result));
  newSlot(result, out);
  out += fmt::format(", {});\n", var(operand));
}

void FunctionEmitter::assignSlotOffsets(std::string& body) {
  constexpr size_t kAlignment = 64; // meshc::gen::Arena::kAlignment
  for (size_t id = 0; id < slotOf.size(); ++id)
    if (slotOf[id] >= 0) {
      Slot& slot = slots[size_t(slotOf[id])];
      slot.end = std::max(slot.end, lastUse[id]);
    }
  std::vector<size_t> order(slots.size());
  for (size_t k = 0; k < order.size(); ++k)
    order[k] = k;
  llvm::stable_sort(order, [&](size_t a, size_t b) { return slots[a].bytes > slots[b].bytes; });
  std::vector<size_t> placed;
  arenaBytes = temporaryBytes = 0;
  for (size_t k : order) {
    Slot& slot = slots[k];
    size_t padded = (slot.bytes + kAlignment - 1) / kAlignment * kAlignment;
    // The placed slots live at the same time, by offset: take the lowest gap that fits.
    std::vector<const Slot*> conflicts;
    for (size_t other : placed)
      if (slots[other].start <= slot.end && slot.start <= slots[other].end)
        conflicts.push_back(&slots[other]);
    llvm::sort(conflicts, [](const Slot* a, const Slot* b) { return a->offset < b->offset; });
    size_t offset = 0;
    for (const Slot* other : conflicts) {
      if (offset + padded <= other->offset) break;
      size_t otherPadded = (other->bytes + kAlignment - 1) / kAlignment * kAlignment;
      offset = std::max(offset, other->offset + otherPadded);
    }
    slot.offset = offset;
    placed.push_back(k);
    arenaBytes = std::max(arenaBytes, offset + padded);
    temporaryBytes += slot.bytes;
  }
  // Later positions first, so that earlier ones stay valid.
  for (size_t k = slots.size(); k-- > 0;) {
    assert(slots[k].body == &body && "a slot declared outside run()'s body");
    body.insert(slots[k].at, std::to_string(slots[k].offset));
  }
}

size_t FunctionEmitter::inPlaceFollowers(size_t index) const {
  SpmdValueId result = fn.ops[index].result;
  size_t count = 0;
  for (size_t j = index + 1; j < fn.ops.size(); ++j) {
    const SpmdOp& next = fn.ops[j];
    if (next.kind != SpmdOp::Kind::Collective || next.result != result ||
        next.operands.size() != 1 || next.operands[0] != result)
      break;
    ++count;
  }
  return count;
}

std::optional<size_t> FunctionEmitter::inPlaceUpdate(const std::vector<size_t>& group) {
  SpmdValueId result = fn.ops[group.back()].result;
  for (const auto& [param, value] : fn.updates) {
    if (value != result) continue;
    SpmdValueId old = fn.params[param];
    if (updatedInPlace[param] || local(old).dims != local(result).dims ||
        local(old).dtype != local(result).dtype || lastUse[old] > group.back())
      return std::nullopt;
    // No read of the old value after the group (lastUse); in the group, the loop reads it at
    // the element it writes (same local dims), before writing.
    updatedInPlace[param] = true;
    owned[result] = false;
    return param;
  }
  return std::nullopt;
}

void FunctionEmitter::emitElementwiseGroup(const std::vector<size_t>& group, std::string& out) {
  const SpmdOp& last = fn.ops[group.back()];
  const TensorType& space = local(last.result);
  std::set<SpmdValueId> inGroup;
  for (size_t index : group)
    inGroup.insert(fn.ops[index].result);
  // Operands read from buffers: their strides over the space.
  std::vector<SpmdValueId> loaded;
  std::map<SpmdValueId, size_t> slot;
  for (size_t index : group)
    for (SpmdValueId operand : fn.ops[index].operands)
      if (!inGroup.count(operand) && !slot.count(operand)) {
        slot[operand] = loaded.size() + 1;
        loaded.push_back(operand);
      }
  Shape outStrides = rowMajorStrides(space);
  bool contiguous = true;
  std::vector<Shape> strides;
  for (SpmdValueId operand : loaded) {
    strides.push_back(stridesOver(local(operand), space.dims));
    if (local(operand).dims != space.dims || strides.back() != outStrides) contiguous = false;
  }
  out += "\n";
  for (size_t index : group)
    comment(fn.ops[index], out);
  if (std::optional<size_t> param = inPlaceUpdate(group))
    out += fmt::format("meshc::gen::View {}({}); // the param's new value, in its own storage\n",
                       var(last.result), paramMember(*param));
  else
    allocate(last.result, out);
  std::string body;
  auto load = [&](SpmdValueId id) {
    if (inGroup.count(id)) return fmt::format("t{}", id);
    return contiguous ? fmt::format("{}[i]", var(id))
                      : fmt::format("{}[at[{}]]", var(id), slot[id]);
  };
  for (size_t index : group) {
    const SpmdOp& op = fn.ops[index];
    std::vector<std::string> args;
    std::vector<DType> types;
    for (SpmdValueId operand : op.operands) {
      args.push_back(load(operand));
      types.push_back(local(operand).dtype);
    }
    std::string expr =
        scalarExpr(op.computeKind, args, types, local(op.result).dtype,
                   op.computeKind == OpKind::Call ? stringAttr(op, "function") : std::string());
    if (index == group.back())
      body += fmt::format("{}[{}] = {};\n", var(op.result), contiguous ? "i" : "at[0]", expr);
    else
      body += fmt::format("float t{} = {};\n", op.result, expr);
  }
  std::vector<std::string> views = {var(last.result)};
  for (SpmdValueId operand : loaded)
    views.push_back(var(operand));
  if (contiguous) {
    out += target->contiguousLoop(var(last.result), views, body);
    return;
  }
  std::vector<std::string> strideLists = {list(outStrides)};
  for (const Shape& s : strides)
    strideLists.push_back(list(s));
  out += target->stridedLoop(loaded.size() + 1, list(sizesOf(space)), strideLists, views, body);
}

void FunctionEmitter::emitEinsum(const SpmdOp& op, std::string& out) {
  const TensorType& result = local(op.result);
  allocate(op.result, out);
  if (result.dtype == DType::F32 && target->einsumPlans()) {
    // meshrt's kernels: classified once (a function-local static, shared by the ranks: every
    // rank of this class has the same local shapes), then sgemm with transposes folded in.
    std::vector<std::string> names;
    Shape sizes;
    auto idOf = [&](const ir::Dim& dim) {
      auto it = llvm::find(names, dim.name);
      if (it != names.end()) return int64_t(it - names.begin());
      names.push_back(dim.name);
      sizes.push_back(dim.size);
      return int64_t(names.size() - 1);
    };
    auto idsOf = [&](const TensorType& type) {
      Shape ids;
      for (const ir::Dim& dim : type.dims)
        ids.push_back(idOf(dim));
      return fmt::format("{{{}, {{}}}}", list(ids)); // dense row-major: no strides
    };
    std::vector<std::string> operands, pointers;
    for (SpmdValueId operand : op.operands) {
      operands.push_back(idsOf(local(operand)));
      pointers.push_back(var(operand) + ".data()");
    }
    std::string outIds = idsOf(result);
    std::string plan = fmt::format("einsum{}", op.result);
    out += fmt::format("// dims: {}\n", fmt::join(names, ", "));
    out += fmt::format("static const meshrt::kernels::EinsumPlan {}({{{}, {{{}}}, {}}});\n", plan,
                       list(sizes), fmt::join(operands, ", "), outIds);
    if (op.operands.size() == 2) {
      out += fmt::format("{}.run({}, {}, {}.data());\n", plan, pointers[0], pointers[1],
                         var(op.result));
    } else {
      out += fmt::format("const float* {}Operands[] = {{{}}};\n{}.run({}Operands, {}.data());\n",
                         plan, fmt::join(pointers, ", "), plan, plan, var(op.result));
    }
    return;
  }
  // Classify dims for a two-operand GEMM: batch (a, b, out), m (a, out), n (b, out), k (a, b).
  bool gemm = op.operands.size() == 2;
  std::vector<ir::Dim> batch, m, n, k;
  if (gemm) {
    const TensorType& a = local(op.operands[0]);
    const TensorType& b = local(op.operands[1]);
    for (const ir::Dim& dim : result.dims) {
      bool inA = a.hasDim(dim.name), inB = b.hasDim(dim.name);
      if (inA && inB)
        batch.push_back(dim);
      else if (inA)
        m.push_back(dim);
      else if (inB)
        n.push_back(dim);
      else
        gemm = false;
    }
    for (const ir::Dim& dim : a.dims)
      if (!result.hasDim(dim.name)) {
        if (b.hasDim(dim.name))
          k.push_back(dim);
        else
          gemm = false; // a dim summed within one operand
      }
    for (const ir::Dim& dim : b.dims)
      if (!result.hasDim(dim.name) && !a.hasDim(dim.name)) gemm = false;
  }
  if (gemm) {
    const TensorType& a = local(op.operands[0]);
    const TensorType& b = local(op.operands[1]);
    // Designated fields, so that the call reads as the einsum it is.
    std::vector<std::pair<const char*, Shape>> fields = {{"batch", sizesOf(batch)},
                                                         {"m", sizesOf(m)},
                                                         {"n", sizesOf(n)},
                                                         {"k", sizesOf(k)},
                                                         {"aBatch", stridesOver(a, batch)},
                                                         {"aM", stridesOver(a, m)},
                                                         {"aK", stridesOver(a, k)},
                                                         {"bBatch", stridesOver(b, batch)},
                                                         {"bK", stridesOver(b, k)},
                                                         {"bN", stridesOver(b, n)},
                                                         {"outBatch", stridesOver(result, batch)},
                                                         {"outM", stridesOver(result, m)},
                                                         {"outN", stridesOver(result, n)}};
    std::vector<std::string> initializers;
    for (const auto& [field, values] : fields)
      initializers.push_back(fmt::format(".{} = {}", field, list(values)));
    out += fmt::format("meshc::gen::{}({}.data(), {}.data(), {}.data(), {{{}}});\n",
                       result.dtype == DType::F32 ? "einsum2" : "einsum2Double", var(op.result),
                       var(op.operands[0]), var(op.operands[1]), fmt::join(initializers, ", "));
  } else {
    std::vector<ir::Dim> contracted;
    for (SpmdValueId operand : op.operands)
      for (const ir::Dim& dim : local(operand).dims)
        if (!result.hasDim(dim.name) &&
            llvm::none_of(contracted, [&](const ir::Dim& d) { return d.name == dim.name; }))
          contracted.push_back(dim);
    std::vector<std::string> pointers, outer, inner;
    for (SpmdValueId operand : op.operands) {
      pointers.push_back(var(operand) + ".data()");
      outer.push_back(list(stridesOver(local(operand), result.dims)));
      inner.push_back(list(stridesOver(local(operand), contracted)));
    }
    out += fmt::format("meshc::gen::einsumGeneric({}.data(), {}, {}, {{{}}}, {{{}}}, {{{}}});\n",
                       var(op.result), list(sizesOf(result)), list(sizesOf(contracted)),
                       fmt::join(pointers, ", "), fmt::join(outer, ", "), fmt::join(inner, ", "));
  }
  if (result.dtype == DType::BF16)
    out += fmt::format("meshc::gen::roundBufferBF16({});\n", var(op.result));
  if (result.dtype == DType::F16)
    out += fmt::format("meshc::gen::roundBufferF16({});\n", var(op.result));
}

llvm::Error FunctionEmitter::absorbFollowers(size_t index, const plan::AxisList& axes) {
  std::set<std::string> expected(axes.begin(), axes.end());
  for (size_t j = 1, n = inPlaceFollowers(index); j <= n; ++j) {
    const SpmdOp& follower = fn.ops[index + j];
    std::set<std::string> listed(follower.collective.axes.begin(), follower.collective.axes.end());
    // The lowering's in-place collectives describe the op's own communication, which the
    // generated op derives from its lane's layout: they must agree.
    if (listed != expected)
      return unsupported(follower, fmt::format("an in-place {} over [{}] after an op whose lane "
                                               "is split over [{}]",
                                               plan::collectiveName(follower.collective.kind),
                                               fmt::join(listed, ", "), fmt::join(axes, ", ")));
    absorbed[index + j] = true;
  }
  return llvm::Error::success();
}

llvm::Error FunctionEmitter::emitReduce(size_t index, std::string& out) {
  const SpmdOp& op = fn.ops[index];
  SpmdValueId operand = op.operands[0];
  const TensorType& in = local(operand);
  const TensorType& result = local(op.result);
  std::vector<std::string> kept;
  for (const ir::Dim& dim : result.dims)
    kept.push_back(dim.name);
  std::vector<ir::Dim> lane = dimsExcept(in, kept);
  double scale = 1;
  if (op.computeKind == OpKind::ReduceMean) {
    // The GLOBAL count: the partial sums over split reduced dims are resolved later.
    for (const ir::Dim& dim : dimsExcept(global(operand), kept))
      scale /= double(dim.size);
  }
  const char* kind = "Sum";
  if (op.computeKind == OpKind::ReduceMax) kind = "Max";
  if (op.computeKind == OpKind::ReduceMin) kind = "Min";
  if (op.computeKind == OpKind::LogSumExp) kind = "LogSumExp";
  allocate(op.result, out);
  out += fmt::format("meshc::gen::reduce({}.data(), {}, {}.data(), {}, {}, {}, "
                     "meshc::gen::Reduce::{}, {});\n",
                     var(op.result), list(sizesOf(result)), var(operand),
                     list(stridesOver(in, result.dims)), list(sizesOf(lane)),
                     list(stridesOver(in, lane)), kind, doubleLiteral(scale));
  if (op.computeKind == OpKind::LogSumExp) {
    // Split reduced dims: combine the local logsumexps over their axes.
    plan::AxisList axes;
    for (const ir::Dim& dim : lane) {
      int position = in.findDim(dim.name);
      for (const std::string& axis : layout(operand).dimAxes[size_t(position)])
        axes.push_back(axis);
    }
    if (auto error = absorbFollowers(index, axes)) return error;
    if (!axes.empty())
      out += fmt::format("meshc::gen::combineLogSumExp({}, {});\n", var(op.result), group(axes));
  }
  if (result.dtype == DType::BF16)
    out += fmt::format("meshc::gen::roundBufferBF16({});\n", var(op.result));
  if (result.dtype == DType::F16)
    out += fmt::format("meshc::gen::roundBufferF16({});\n", var(op.result));
  return llvm::Error::success();
}

llvm::Error FunctionEmitter::emitAlong(size_t index, std::string& out) {
  const SpmdOp& op = fn.ops[index];
  SpmdValueId operand = op.operands[0];
  const TensorType& in = local(operand);
  const TensorType& result = local(op.result);
  std::vector<std::string> laneDims;
  if (op.computeKind == OpKind::LayerNorm)
    laneDims = namesAttr(op, "dims");
  else
    laneDims = {stringAttr(op, "dim")};
  plan::AxisList axes;
  std::vector<ir::Dim> lane;
  int64_t globalCount = 1;
  for (const std::string& dimName : laneDims) {
    int position = result.findDim(dimName);
    if (position < 0 || !in.hasDim(dimName)) return unsupported(op, "a missing lane dim");
    lane.push_back(result.dims[size_t(position)]);
    for (const std::string& axis : layout(op.result).dimAxes[size_t(position)])
      axes.push_back(axis);
    int globalPosition = global(op.result).findDim(dimName);
    globalCount *= global(op.result).dims[size_t(globalPosition)].size;
  }
  std::string groupPtr = axes.empty() ? "nullptr" : "&" + group(axes);
  if (auto error = absorbFollowers(index, axes)) return error;
  allocate(op.result, out);
  if (op.computeKind == OpKind::Shift) {
    if (!(in == result)) return unsupported(op, "shift between different local shapes");
    out += fmt::format("meshc::gen::shift({}, {}, {}, {}, {}, {});\n", var(op.result), var(operand),
                       list(sizesOf(result)), result.findDim(laneDims[0]),
                       int64_t(numberAttr(op, "offset", 0)), groupPtr);
    return llvm::Error::success();
  }
  std::vector<ir::Dim> outer = dimsExcept(result, laneDims);
  const char* kind = "Softmax";
  if (op.computeKind == OpKind::LogSoftmax) kind = "LogSoftmax";
  if (op.computeKind == OpKind::LayerNorm) kind = "LayerNorm";
  if (op.computeKind == OpKind::Cumsum)
    kind = numberAttr(op, "exclusive", 0) != 0 ? "CumsumExclusive" : "Cumsum";
  out +=
      fmt::format("meshc::gen::along({}.data(), {}.data(), {}, {}, {}, {}, {}, {}, "
                  "meshc::gen::Along::{}, {}, {}, {});\n",
                  var(op.result), var(operand), list(sizesOf(outer)), list(stridesOver(in, outer)),
                  list(stridesOver(result, outer)), list(sizesOf(lane)),
                  list(stridesOver(in, lane)), list(stridesOver(result, lane)), kind,
                  doubleLiteral(numberAttr(op, "eps", 1e-5)), globalCount, groupPtr);
  return llvm::Error::success();
}

llvm::Error FunctionEmitter::emitCompute(size_t index, std::string& out) {
  const SpmdOp& op = fn.ops[index];
  const TensorType& result = local(op.result);
  std::string v = var(op.result);
  auto rounding = [&]() {
    if (result.dtype == DType::BF16) out += fmt::format("meshc::gen::roundBufferBF16({});\n", v);
    if (result.dtype == DType::F16) out += fmt::format("meshc::gen::roundBufferF16({});\n", v);
  };
  switch (op.computeKind) {
  case OpKind::Input: {
    auto it = llvm::find(fn.inputs, op.result);
    size_t k = size_t(it - fn.inputs.begin());
    out += fmt::format("const meshc::gen::Buffer& {} = inputs.{}.data;\n", v,
                       identifier(irFn.inputs[k].name));
    return llvm::Error::success();
  }
  case OpKind::Param: {
    auto it = llvm::find(fn.params, op.result);
    if (it == fn.params.end()) return unsupported(op, "a param without ParamInfo");
    out += fmt::format("const meshc::gen::Buffer& {} = {};\n", v,
                       paramMember(size_t(it - fn.params.begin())));
    return llvm::Error::success();
  }
  case OpKind::Literal: {
    double value = numberAttr(op, "value", 0);
    out += fmt::format("meshc::gen::View {} = arena_.fill(", v);
    newSlot(op.result, out);
    out += fmt::format(", {}, meshc::gen::roundValue({}, {}));\n", result.numElements(),
                       dtypeEnum(result.dtype), doubleLiteral(value));
    return llvm::Error::success();
  }
  case OpKind::TrainStep: {
    out += fmt::format("meshc::gen::View {} = arena_.fill(", v);
    newSlot(op.result, out);
    out += fmt::format(", 1, float(step_));\n");
    return llvm::Error::success();
  }
  case OpKind::Iota: {
    std::string dim = stringAttr(op, "dim");
    Shape position(result.dims.size(), 0);
    int at = result.findDim(dim);
    if (at < 0) return unsupported(op, "iota over a dim its result lacks");
    position[size_t(at)] = 1;
    allocate(op.result, out);
    out += fmt::format("meshc::gen::iota({}.data(), {}, {}, {});\n", v, list(sizesOf(result)),
                       list(position), shardStart(op.result, dim));
    return llvm::Error::success();
  }
  case OpKind::RandomNormal:
  case OpKind::RandomUniform: {
    allocate(op.result, out);
    bool normal = op.computeKind == OpKind::RandomNormal;
    // Train steps draw fresh values each step: the stream is keyed "<stream>#<step>".
    std::string stream = quote(stringAttr(op, "stream"));
    if (fn.kind == ir::Function::Kind::Train)
      stream = fmt::format("std::string({}) + \"#\" + std::to_string(step_)", stream);
    out += fmt::format("meshrt::kernels::fillRandom{}({}.data(), {}, seed_, {}, {}, {}, {});\n",
                       normal ? "Normal" : "Uniform", v, shardExpr(op.result), stream,
                       doubleLiteral(numberAttr(op, normal ? "mean" : "min", 0)),
                       doubleLiteral(numberAttr(op, normal ? "stddev" : "max", 1)),
                       valueTypeEnum(result.dtype));
    return llvm::Error::success();
  }
  case OpKind::Dropout: {
    SpmdValueId operand = op.operands[0];
    if (fn.kind == ir::Function::Kind::Train) {
      allocate(op.result, out);
      out += fmt::format(
          "meshc::gen::dropout({}.data(), {}, {}.data(), {}, {}, {}, meshrt::streamKey(seed_, "
          "std::string({}) + \"#\" + std::to_string(step_)), {});\n",
          v, list(sizesOf(result)), var(operand), list(stridesOver(local(operand), result.dims)),
          list(rowMajorStrides(global(op.result))), globalBaseExpr(op.result),
          quote(stringAttr(op, "stream")), doubleLiteral(numberAttr(op, "rate", 0)));
      rounding();
    } else if (local(operand).dims == result.dims) {
      out += "// dropout is the identity outside training\n";
      bindCopy(op.result, operand, index, out);
    } else {
      allocate(op.result, out);
      out += "// dropout is the identity outside training\n";
      out += fmt::format("meshc::gen::copyStrided({}.data(), {}, {}, {}.data(), {});\n", v,
                         list(sizesOf(result)), list(rowMajorStrides(result)), var(operand),
                         list(stridesOver(local(operand), result.dims)));
    }
    return llvm::Error::success();
  }
  case OpKind::Einsum:
    emitEinsum(op, out);
    return llvm::Error::success();
  case OpKind::ReduceSum:
  case OpKind::ReduceMean:
  case OpKind::ReduceMax:
  case OpKind::ReduceMin:
  case OpKind::LogSumExp:
    return emitReduce(index, out);
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::LayerNorm:
  case OpKind::Cumsum:
  case OpKind::Shift: {
    if (auto error = emitAlong(index, out)) return error;
    rounding();
    return llvm::Error::success();
  }
  case OpKind::Rename: {
    std::vector<std::string> from = namesAttr(op, "from"), to = namesAttr(op, "to");
    std::map<std::string, std::string> resultToOperand;
    for (size_t i = 0; i < from.size() && i < to.size(); ++i)
      resultToOperand[to[i]] = from[i];
    SpmdValueId operand = op.operands[0];
    Shape inStrides = stridesOver(local(operand), result.dims, &resultToOperand);
    if (inStrides == rowMajorStrides(result)) {
      // Same storage order: only the names change.
      bindCopy(op.result, operand, index, out);
      return llvm::Error::success();
    }
    allocate(op.result, out);
    out += fmt::format("meshc::gen::copyStrided({}.data(), {}, {}, {}.data(), {});\n", v,
                       list(sizesOf(result)), list(rowMajorStrides(result)), var(operand),
                       list(inStrides));
    return llvm::Error::success();
  }
  case OpKind::Reshape: {
    SpmdValueId operand = op.operands[0];
    const TensorType& in = local(operand);
    std::vector<std::string> from = namesAttr(op, "from"), to = namesAttr(op, "to");
    std::vector<ir::Dim> fromDims, toDims;
    for (const std::string& dim : from) {
      int at = in.findDim(dim);
      if (at < 0) return unsupported(op, "reshape of a missing dim");
      fromDims.push_back(in.dims[size_t(at)]);
    }
    for (const std::string& dim : to) {
      int at = result.findDim(dim);
      if (at < 0) return unsupported(op, "reshape into a missing dim");
      toDims.push_back(result.dims[size_t(at)]);
    }
    // Either the split of the major-most regrouped dim carries over (a local regroup of the
    // local sizes), or the operand holds the regrouped dims whole and this rank's result is a
    // window of the global regroup (row-major over the GLOBAL `to` sizes, from its shard start).
    bool operandWhole = true;
    for (const std::string& dim : from)
      operandWhole = operandWhole && layout(operand).dimAxes[size_t(in.findDim(dim))].empty();
    Shape linear(result.dims.size(), 0);
    std::vector<std::string> base;
    int64_t stride = 1;
    for (size_t i = toDims.size(); i-- > 0;) {
      int at = result.findDim(toDims[i].name);
      linear[size_t(at)] = stride;
      std::string start = shardStart(op.result, toDims[i].name);
      if (operandWhole && start != "0") base.push_back(fmt::format("{} * {}", start, stride));
      stride *= operandWhole ? global(op.result).dims[size_t(at)].size : toDims[i].size;
    }
    Shape other = stridesOver(in, result.dims);
    for (size_t i = 0; i < result.dims.size(); ++i)
      if (llvm::is_contained(to, result.dims[i].name)) other[i] = 0;
    allocate(op.result, out);
    out += fmt::format("meshc::gen::reshape({}.data(), {}, {}.data(), {}, {}, {}, {}, {});\n", v,
                       list(sizesOf(result)), var(operand), list(other), list(linear),
                       list(sizesOf(fromDims)), list(stridesOver(in, fromDims)),
                       base.empty() ? "0" : fmt::format("{}", fmt::join(base, " + ")));
    return llvm::Error::success();
  }
  case OpKind::Slice:
  case OpKind::Pad:
  case OpKind::Concat: {
    std::string to = stringAttr(op, "to");
    std::vector<std::string> from = namesAttr(op, "from");
    int outAt = result.findDim(to);
    if (outAt < 0 || from.size() != op.operands.size())
      return unsupported(op, "a malformed window op");
    std::vector<ir::Dim> outer = dimsExcept(result, {to});
    allocate(op.result, out);
    // Window offsets are global along `to`; this rank's result starts at its shard start.
    std::string resultStart = shardStart(op.result, to);
    int64_t offset = 0;
    if (op.computeKind == OpKind::Slice) offset = -int64_t(numberAttr(op, "start", 0));
    if (op.computeKind == OpKind::Pad) offset = int64_t(numberAttr(op, "before", 0));
    for (size_t k = 0; k < op.operands.size(); ++k) {
      SpmdValueId operand = op.operands[k];
      const TensorType& in = local(operand);
      int inAt = in.findDim(from[k]);
      if (inAt < 0) return unsupported(op, "a window over a missing dim");
      if (!layout(operand).dimAxes[size_t(inAt)].empty())
        return unsupported(op, "a window over a split operand dim");
      out += fmt::format("meshc::gen::copyWindow({}.data(), {}.data(), {}, {}, {}, {}, {}, {}, "
                         "{}, {} - {});\n",
                         v, var(operand), list(sizesOf(outer)), list(stridesOver(result, outer)),
                         list(stridesOver(in, outer)), rowMajorStrides(result)[size_t(outAt)],
                         rowMajorStrides(in)[size_t(inAt)], result.dims[size_t(outAt)].size,
                         in.dims[size_t(inAt)].size, offset, resultStart);
      offset += global(operand).dims[size_t(global(operand).findDim(from[k]))].size;
    }
    return llvm::Error::success();
  }
  case OpKind::OneHot: {
    std::string dim = stringAttr(op, "dim");
    int at = result.findDim(dim);
    if (at < 0) return unsupported(op, "one_hot over a missing dim");
    SpmdValueId ids = op.operands[0];
    Shape idStrides = stridesOver(local(ids), result.dims);
    idStrides[size_t(at)] = 0;
    Shape position(result.dims.size(), 0);
    position[size_t(at)] = 1;
    allocate(op.result, out);
    out += fmt::format("meshc::gen::oneHot({}.data(), {}, {}.data(), {}, {}, {});\n", v,
                       list(sizesOf(result)), var(ids), list(idStrides), list(position),
                       shardStart(op.result, dim));
    rounding();
    return llvm::Error::success();
  }
  case OpKind::Gather: {
    std::string dim = stringAttr(op, "dim");
    SpmdValueId table = op.operands[0], ids = op.operands[1];
    const TensorType& tableType = local(table);
    int at = tableType.findDim(dim);
    if (at < 0) return unsupported(op, "gather over a missing dim");
    Shape tableStrides = stridesOver(tableType, result.dims);
    if (int reused = result.findDim(dim); reused >= 0) tableStrides[size_t(reused)] = 0;
    allocate(op.result, out);
    out += fmt::format("meshc::gen::gather({}.data(), {}, {}.data(), {}, {}.data(), {}, {}, {}, "
                       "{});\n",
                       v, list(sizesOf(result)), var(table), list(tableStrides), var(ids),
                       list(stridesOver(local(ids), result.dims)), tableType.dims[size_t(at)].size,
                       rowMajorStrides(tableType)[size_t(at)], shardStart(table, dim));
    return llvm::Error::success();
  }
  default:
    return unsupported(op, std::string("op '") + ir::opSpelling(op.computeKind) + "'");
  }
}

llvm::Error FunctionEmitter::emitCollective(size_t index, std::string& out) {
  const SpmdOp& op = fn.ops[index];
  const plan::Collective& c = op.collective;
  SpmdValueId operand = op.operands[0];
  std::string v = var(op.result), in = var(operand);
  bool inPlace = operand == op.result;
  auto dimIndex = [&](SpmdValueId id, const std::string& dim) { return local(id).findDim(dim); };
  switch (c.kind) {
  case CollectiveKind::AllReduceSum:
  case CollectiveKind::AllReduceMax:
  case CollectiveKind::AllReduceMin: {
    const char* reduceOp = c.kind == CollectiveKind::AllReduceSum   ? "Sum"
                           : c.kind == CollectiveKind::AllReduceMax ? "Max"
                                                                    : "Min";
    if (!inPlace) bindCopy(op.result, operand, index, out);
    if (!c.axes.empty())
      out += fmt::format("{}.allReduce({}.data(), {}.size(), meshrt::ReduceOp::{});\n",
                         group(c.axes), v, v, reduceOp);
    return llvm::Error::success();
  }
  case CollectiveKind::AllGather:
  case CollectiveKind::ReduceScatter:
  case CollectiveKind::LocalSlice: {
    if (inPlace) return unsupported(op, "an in-place all-gather outside cumsum");
    int at = dimIndex(operand, c.dim);
    if (at < 0) return unsupported(op, "a collective over a missing dim");
    allocate(op.result, out);
    if (c.kind == CollectiveKind::LocalSlice) {
      int64_t blocks = 1;
      for (const std::string& axis : c.axes)
        blocks *= fn.mesh.axisSize(axis);
      out += fmt::format("meshc::gen::sliceDim({}, {}, {}, {}, meshc::gen::blockIndex(world_, {}), "
                         "{});\n",
                         v, in, list(sizesOf(local(operand))), at, stringList(c.axes), blocks);
      return llvm::Error::success();
    }
    out += fmt::format("meshc::gen::{}({}, {}, {}, {}, {});\n",
                       c.kind == CollectiveKind::AllGather ? "allGatherDim" : "reduceScatterDim", v,
                       in, list(sizesOf(local(operand))), at, group(c.axes));
    return llvm::Error::success();
  }
  case CollectiveKind::AllToAll: {
    int from = dimIndex(operand, c.dim), to = dimIndex(operand, c.toDim);
    if (from < 0 || to < 0 || inPlace) return unsupported(op, "a malformed all-to-all");
    allocate(op.result, out);
    out += fmt::format("meshc::gen::allToAllDims({}, {}, {}, {}, {}, {});\n", v, in,
                       list(sizesOf(local(operand))), from, to, group(c.axes));
    return llvm::Error::success();
  }
  case CollectiveKind::Permute:
    return unsupported(op, "a collective permute outside shift");
  case CollectiveKind::BucketedAllReduceSum: {
    if (op.results.size() != op.operands.size())
      return unsupported(op, "a bucketed all-reduce without one result per operand");
    std::vector<std::string> views;
    for (size_t k = 0; k < op.operands.size(); ++k) {
      bindCopy(op.results[k], op.operands[k], index, out);
      views.push_back(var(op.results[k]));
    }
    if (!c.axes.empty())
      out += fmt::format("meshc::gen::allReduceBucket({}, {{{}}});\n", group(c.axes),
                         fmt::join(views, ", "));
    return llvm::Error::success();
  }
  }
  return unsupported(op, "this collective");
}

llvm::Error FunctionEmitter::emit() {
  uses.assign(fn.values.size(), 0);
  absorbed.assign(fn.ops.size(), false);
  for (const SpmdOp& op : fn.ops)
    for (SpmdValueId operand : op.operands)
      if (operand != op.result) ++uses[operand];
  for (const auto& output : fn.outputs)
    uses[output.second] += 2; // never fused away
  for (const auto& update : fn.updates)
    uses[update.second] += 2;
  updatedInPlace.assign(irFn.params.size(), false);
  lastUse.assign(fn.values.size(), 0);
  released.assign(fn.values.size(), false);
  slotOf.assign(fn.values.size(), -1);
  slots.clear();
  owned.assign(fn.values.size(), true);
  for (size_t i = 0; i < fn.ops.size(); ++i) {
    for (SpmdValueId operand : fn.ops[i].operands)
      lastUse[operand] = std::max(lastUse[operand], i);
    if (fn.ops[i].kind == SpmdOp::Kind::Compute &&
        (fn.ops[i].computeKind == OpKind::Input || fn.ops[i].computeKind == OpKind::Param))
      owned[fn.ops[i].result] = false;
  }
  for (const auto& output : fn.outputs)
    lastUse[output.second] = fn.ops.size();
  for (const auto& update : fn.updates)
    lastUse[update.second] = fn.ops.size();

  // The body of run(), op by op; elementwise chains become one loop.
  std::string body;
  std::vector<size_t> chain;
  auto flush = [&]() {
    if (chain.empty()) return;
    emitting = chain.front();
    emitElementwiseGroup(chain, body);
    for (size_t k = 0; k + 1 < chain.size(); ++k)
      owned[fn.ops[chain[k]].result] = false; // a scalar temporary of the fused loop
    chain.clear();
  };
  for (size_t i = 0; i < fn.ops.size(); ++i) {
    if (absorbed[i]) continue;
    const SpmdOp& op = fn.ops[i];
    bool elementwise = op.kind == SpmdOp::Kind::Compute && isElementwise(op.computeKind);
    if (elementwise) {
      // Fuse into the running chain when the chain's last value is used only here and the
      // loop spaces agree (same local dims in the same order).
      if (!chain.empty()) {
        const SpmdOp& previous = fn.ops[chain.back()];
        bool feeds = uses[previous.result] == 1 &&
                     llvm::is_contained(op.operands, previous.result) &&
                     local(previous.result).dims == local(op.result).dims &&
                     inPlaceFollowers(chain.back()) == 0;
        if (!feeds) flush();
      }
      chain.push_back(i);
      continue;
    }
    flush();
    emitting = i;
    body += "\n";
    if (op.kind == SpmdOp::Kind::Collective) {
      comment(op, body);
      if (auto error = emitCollective(i, body)) return error;
    } else {
      comment(op, body);
      if (auto error = emitCompute(i, body)) return error;
    }
  }
  flush();
  assignSlotOffsets(body);

  // Declaration.
  std::string& h = declaration;
  std::string kindWord = fn.kind == ir::Function::Kind::Train ? "train block" : "program";
  h += fmt::format(
      "/// The {} `{}` of {}, planned for the mesh {} with layout {}.\n", kindWord, fn.name,
      irFn.loc.file,
      "[" +
          [&] {
            std::vector<std::string> axes;
            for (const ir::MeshAxis& axis : fn.mesh.axes)
              axes.push_back(fmt::format("{}={}", axis.name, axis.size));
            return fmt::format("{}", fmt::join(axes, ", "));
          }() +
          "]",
      plan::layoutString(fn.layout));
  h += fmt::format("class {} {{\npublic:\n", name);
  h += "/// This rank's local shards of the inputs (row-major over the local shape).\n";
  h += "struct Inputs {\n";
  for (size_t k = 0; k < irFn.inputs.size(); ++k) {
    SpmdValueId id = fn.inputs[k];
    h += fmt::format("meshc::gen::Tensor {}; // {} local {}\n", identifier(irFn.inputs[k].name),
                     plan::tensorLayoutString(global(id), layout(id)), list(sizesOf(local(id))));
  }
  h += "};\n/// This rank's local shards of the outputs.\nstruct Outputs {\n";
  for (const auto& [outName, id] : fn.outputs)
    h += fmt::format("meshc::gen::Tensor {}; // {} local {}\n", identifier(outName),
                     plan::tensorLayoutString(global(id), layout(id)), list(sizesOf(local(id))));
  h += "};\n\n";
  h += "/// The mesh the plan was made for; the communicator must be over it.\n"
       "static meshrt::Mesh mesh();\n";
  h += "/// The names of the inputs and outputs, in declaration order.\n"
       "static std::vector<std::string> inputNames();\n"
       "static std::vector<std::string> outputNames();\n"
       "/// The global shape of the input `name` (what scatterInput takes).\n"
       "static meshc::gen::Shape inputShape(const std::string& name);\n\n";
  h += fmt::format("/// Creates the subgroups this program uses and initializes this rank's "
                   "parameter shards from `seed` (the same global values on every mesh).\n"
                   "explicit {}(meshrt::Communicator& world, uint64_t seed = 0);\n\n",
                   name);
  h += "/// Runs on this rank's shards (a collective call: every rank of the mesh calls it).\n"
       "/// Throws std::invalid_argument when an input's local shape is wrong.\n"
       "Outputs run(const Inputs& inputs);\n\n";
  h += fmt::format("/// The bytes of this object's arena: run()'s temporaries share it, placed by "
                   "liveness.\nstatic constexpr size_t kArenaBytes = {};\n"
                   "/// The bytes of all of run()'s temporaries together (one buffer each).\n"
                   "static constexpr size_t kTemporaryBytes = {};\n\n",
                   arenaBytes, temporaryBytes);
  if (fn.kind == ir::Function::Kind::Train) {
    if (hasUpdates())
      h += "/// One training step on this rank's shards (collective): forward, backward and the "
           "optimizer's update, applied to the params; increments the step counter. Returns "
           "the global loss (every rank gets it). run() is the same step, returning the "
           "outputs.\nfloat step(const Inputs& inputs);\n";
    h += "/// The number of steps taken: keys this step's random ops and dropout masks (and, "
         "with an optimizer, its learning-rate schedule).\n"
         "int64_t stepCount() const { return step_; }\n"
         "void setStepCount(int64_t step) { step_ = step; }\n\n";
  }
  h += "/// Every param's path: weights, consts and optimizer state (`<weight>@<slot>`), in "
       "declaration order.\nstatic std::vector<std::string> paramNames();\n"
       "/// Whether `path` is a slot of optimizer state (not a weight of the model).\n"
       "static bool isOptimizerState(const std::string& path);\n"
       "/// This rank's param shards with their global shapes and layouts (for checkpoints).\n"
       "std::vector<meshc::gen::ParamShard> paramShards();\n"
       "/// The global value of param `path` (collective: every rank calls it and gets the "
       "whole tensor).\nmeshc::gen::Tensor getParam(const std::string& path);\n"
       "/// Sets param `path` from its global value (no communication: each rank keeps its "
       "shard). Throws std::invalid_argument on an unknown path or a wrong shape.\n"
       "void setParam(const std::string& path, const meshc::gen::Tensor& global);\n\n";
  h += "/// This rank's local shards of the inputs the reference interpreter synthesizes for "
       "`seed` (keyed by global element index).\n"
       "Inputs synthesizeInputs(uint64_t seed) const;\n\n"
       "/// This rank's shard of the global input `name` (no communication).\n"
       "static meshc::gen::Tensor scatterInput(meshrt::Communicator& world, const std::string& "
       "name, const meshc::gen::Tensor& global);\n"
       "/// The global output `name` from every rank's shard (collective: every rank calls it "
       "and gets the whole tensor).\n"
       "static meshc::gen::Tensor gatherOutput(meshrt::Communicator& world, const std::string& "
       "name, const meshc::gen::Tensor& local);\n\n";
  std::string checkpointDefinitions;
  emitCheckpointApi(h, checkpointDefinitions);
  h += "private:\nmeshrt::Communicator& world_;\nuint64_t seed_;\n";
  if (fn.kind == ir::Function::Kind::Train) h += "int64_t step_ = 0;\n";
  for (const plan::AxisList& axes : groups)
    h += fmt::format("meshrt::Communicator& {}; // the ranks along {}\n", axesName(axes),
                     fmt::join(axes, ", "));
  for (size_t k = 0; k < irFn.params.size(); ++k) {
    SpmdValueId id = fn.params[k];
    h += fmt::format("meshc::gen::Buffer {}; // {}: {} local {}\n", paramMember(k),
                     irFn.params[k].path, plan::tensorLayoutString(global(id), layout(id)),
                     list(sizesOf(local(id))));
  }
  h += "meshc::gen::Arena arena_{kArenaBytes}; // run()'s temporaries\n";
  h += "};\n\n";

  // Definitions.
  std::string& s = definition;
  s += fmt::format("//===--- {} `{}` ---===//\n\n", kindWord, fn.name);
  {
    std::vector<std::string> axes;
    for (const ir::MeshAxis& axis : fn.mesh.axes)
      axes.push_back(fmt::format("{{\"{}\", {}}}", axis.name, axis.size));
    s += fmt::format("meshrt::Mesh {}::mesh() {{ return meshrt::Mesh({{{}}}); }}\n\n", name,
                     fmt::join(axes, ", "));
    std::vector<std::string> inputs, outputs;
    for (const ir::InputInfo& input : irFn.inputs)
      inputs.push_back(quote(input.name));
    for (const auto& output : fn.outputs)
      outputs.push_back(quote(output.first));
    s += fmt::format("std::vector<std::string> {}::inputNames() {{ return {{{}}}; }}\n", name,
                     fmt::join(inputs, ", "));
    s += fmt::format("std::vector<std::string> {}::outputNames() {{ return {{{}}}; }}\n\n", name,
                     fmt::join(outputs, ", "));
    s += fmt::format("meshc::gen::Shape {}::inputShape(const std::string& name) {{\n", name);
    for (size_t k = 0; k < irFn.inputs.size(); ++k)
      s += fmt::format("if (name == {}) return {};\n", quote(irFn.inputs[k].name),
                       list(sizesOf(irFn.inputs[k].type)));
    s += fmt::format(
        "throw std::invalid_argument(\"{}: no input named '\" + name + \"'\");\n}}\n\n", fn.name);
  }
  emitConstructor(s);
  s += fmt::format("{0}::Outputs {0}::run(const Inputs& inputs) {{\n", name);
  s += target->prologue();
  s += fmt::format("// Arena: {} bytes for {} bytes of temporaries ({} slots, placed by "
                   "liveness).\n",
                   arenaBytes, temporaryBytes, slots.size());
  for (size_t k = 0; k < irFn.inputs.size(); ++k)
    s += fmt::format("meshc::gen::checkShape(\"input\", {}, inputs.{}, {});\n",
                     quote(irFn.inputs[k].name), identifier(irFn.inputs[k].name),
                     list(sizesOf(local(fn.inputs[k]))));
  s += body;
  if (hasUpdates()) {
    // Every update read the step's old values; the new ones replace them now (those computed
    // in their param's storage already did).
    s += "\n// The step's updates.\n";
    for (const auto& [param, id] : fn.updates)
      if (!updatedInPlace[param] && id != fn.params[param])
        s += fmt::format("meshc::gen::copyValues({1}, {0}); // {2}\n", var(id), paramMember(param),
                         irFn.params[param].path);
    s += "++step_;\n";
  }
  s += "\nOutputs outputs;\n";
  // Outputs leave the arena: the caller keeps them past the next run().
  for (const auto& [outName, id] : fn.outputs)
    s += fmt::format("outputs.{0} = meshc::gen::Tensor{{{1}, meshc::gen::Buffer({2}.begin(), "
                     "{2}.end())}};\n",
                     identifier(outName), list(sizesOf(local(id))), var(id));
  s += "return outputs;\n}\n\n";
  emitHelpers(s);
  s += checkpointDefinitions;
  return llvm::Error::success();
}

void FunctionEmitter::emitConstructor(std::string& s) {
  // The mesh is checked first; subgroups are created up front, in a fixed order, on every rank.
  s += fmt::format("{0}::{0}(meshrt::Communicator& world, uint64_t seed)\n: "
                   "world_(meshc::gen::checkedWorld(world, mesh(), {1})), seed_(seed)",
                   name, quote(fn.name));
  for (const plan::AxisList& axes : groups)
    s += fmt::format(",\n{}(world_.subgroup(std::vector<std::string>{}))", axesName(axes),
                     stringList(axes));
  s += " {\n";
  s += target->prologue();
  for (size_t k = 0; k < irFn.params.size(); ++k) {
    const ir::ParamInfo& param = irFn.params[k];
    SpmdValueId id = fn.params[k];
    const TensorType& type = local(id);
    std::string member = paramMember(k);
    s += fmt::format("// {}: {} ({}:{})\n", param.path, param.init.kind, param.loc.file,
                     param.loc.line);
    const ir::Initializer& init = param.init;
    DType dtype = type.dtype;
    if (init.kind == "zeros" || init.kind == "ones" || init.kind == "constant") {
      double value = init.kind == "zeros" ? 0 : init.kind == "ones" ? 1 : init.arg("value", 0);
      s += fmt::format("{}.assign({}, meshc::gen::roundValue({}, {}));\n", member,
                       type.numElements(), dtypeEnum(dtype), doubleLiteral(value));
    } else {
      // Random initializers come from the kernels' fills, keyed like the interpreter's.
      std::vector<std::string> args;
      for (const auto& [key, value] : init.args)
        args.push_back(fmt::format("{{{}, {}}}", quote(key), doubleLiteral(value)));
      s += fmt::format("{}.resize({});\nmeshrt::kernels::fillParam({}.data(), {}, seed, {}, "
                       "meshrt::kernels::makeInit({}, {{{}}}), {});\n",
                       member, type.numElements(), member, shardExpr(id), quote(param.path),
                       quote(init.kind), fmt::join(args, ", "), valueTypeEnum(dtype));
    }
  }
  s += "}\n\n";
}

void FunctionEmitter::emitHelpers(std::string& s) {
  // synthesizeInputs
  s += fmt::format("{0}::Inputs {0}::synthesizeInputs(uint64_t seed) const {{\nInputs inputs;\n",
                   name);
  for (size_t k = 0; k < irFn.inputs.size(); ++k) {
    const ir::InputInfo& input = irFn.inputs[k];
    SpmdValueId id = fn.inputs[k];
    std::string member = "inputs." + identifier(input.name);
    s += fmt::format("{}.shape = {};\n{}.data.resize({});\n", member, list(sizesOf(local(id))),
                     member, local(id).numElements());
    if (input.type.dtype == DType::I32) // i32 values are held in float buffers (exact to 2^24)
      s += fmt::format("{{\nstd::vector<int32_t> ids({0}.data.size());\n"
                       "meshrt::kernels::fillInput(ids.data(), {1}, seed, {2}, {3});\n"
                       "std::copy(ids.begin(), ids.end(), {0}.data.begin());\n}}\n",
                       member, shardExpr(id), quote(input.name), input.indexBound);
    else
      s += fmt::format("meshrt::kernels::fillInput({}.data.data(), {}, seed, {}, {});\n", member,
                       shardExpr(id), quote(input.name), valueTypeEnum(input.type.dtype));
  }
  s += "return inputs;\n}\n\n";

  // scatterInput / gatherOutput: the same shard geometry, from any rank's coordinates.
  auto startsOfRank = [&](SpmdValueId id, const std::string& meshExpr, const std::string& rank) {
    std::vector<std::string> starts;
    const TensorType& type = local(id);
    for (size_t d = 0; d < type.dims.size(); ++d) {
      const plan::AxisList& axes = layout(id).dimAxes[d];
      starts.push_back(axes.empty()
                           ? "0"
                           : fmt::format("meshc::gen::shardStartOf({}, {}, {}, {})", meshExpr, rank,
                                         stringList(axes), type.dims[d].size));
    }
    return fmt::format("meshc::gen::Shape{{{}}}", fmt::join(starts, ", "));
  };
  s += fmt::format("meshc::gen::Tensor {}::scatterInput(meshrt::Communicator& world, const "
                   "std::string& name, const meshc::gen::Tensor& global) {{\n",
                   name);
  for (size_t k = 0; k < irFn.inputs.size(); ++k) {
    SpmdValueId id = fn.inputs[k];
    s += fmt::format("if (name == {0}) {{\nmeshc::gen::checkShape(\"global input\", name, global, "
                     "{1});\nreturn meshc::gen::Tensor{{{2}, meshc::gen::sliceShard(global.data, "
                     "{2}, {3}, {4})}};\n}}\n",
                     quote(irFn.inputs[k].name), list(sizesOf(global(id))),
                     list(sizesOf(local(id))), list(rowMajorStrides(global(id))),
                     startsOfRank(id, "world.mesh()", "world.rank()"));
  }
  s += fmt::format("throw std::invalid_argument(\"{}: no input named '\" + name + \"'\");\n}}\n\n",
                   fn.name);
  s += fmt::format("meshc::gen::Tensor {}::gatherOutput(meshrt::Communicator& world, const "
                   "std::string& name, const meshc::gen::Tensor& local) {{\n",
                   name);
  for (const auto& [outName, id] : fn.outputs) {
    s += fmt::format("if (name == {0}) {{\nmeshc::gen::checkShape(\"local output\", name, local, "
                     "{1});\nreturn meshc::gen::Tensor{{{2}, meshc::gen::gatherShards(world, "
                     "local.data, {1}, {2}, [&](int rank) {{ return {3}; }})}};\n}}\n",
                     quote(outName), list(sizesOf(local(id))), list(sizesOf(global(id))),
                     startsOfRank(id, "world.mesh()", "rank"));
  }
  s += fmt::format("throw std::invalid_argument(\"{}: no output named '\" + name + \"'\");\n}}\n\n",
                   fn.name);
  emitParamAccess(s);
}

void FunctionEmitter::emitParamAccess(std::string& s) {
  if (hasUpdates()) {
    // The loss output is a scalar, resolved (replicated): every rank holds the global value.
    auto loss =
        llvm::find_if(fn.outputs, [](const auto& output) { return output.first == "loss"; });
    std::string lossField =
        loss == fn.outputs.end() ? identifier(fn.outputs.front().first) : identifier(loss->first);
    s += fmt::format("float {0}::step(const Inputs& inputs) {{\nreturn run(inputs).{1}.data.at(0);"
                     "\n}}\n\n",
                     name, lossField);
  }
  std::vector<std::string> paths, states;
  for (const ir::ParamInfo& param : irFn.params) {
    paths.push_back(quote(param.path));
    if (param.role == ir::ParamRole::OptimizerState) states.push_back(quote(param.path));
  }
  s += fmt::format("std::vector<std::string> {}::paramNames() {{ return {{{}}}; }}\n\n", name,
                   fmt::join(paths, ", "));
  s += fmt::format("bool {}::isOptimizerState(const std::string& path) {{\n", name);
  if (states.empty())
    s += "(void)path;\nreturn false;\n}\n\n";
  else
    s += fmt::format("static const std::vector<std::string> states = {{{}}};\nreturn "
                     "std::find(states.begin(), states.end(), path) != states.end();\n}}\n\n",
                     fmt::join(states, ", "));
  s += fmt::format("std::vector<meshc::gen::ParamShard> {}::paramShards() {{\nreturn {{\n", name);
  for (size_t k = 0; k < irFn.params.size(); ++k) {
    const ir::ParamInfo& param = irFn.params[k];
    SpmdValueId id = fn.params[k];
    std::vector<std::string> dims, axes;
    for (size_t d = 0; d < global(id).dims.size(); ++d) {
      dims.push_back(quote(global(id).dims[d].name));
      axes.push_back(stringList(layout(id).dimAxes[d]));
    }
    s += fmt::format("{{{}, {}, {}, {}, {}, {{{}}}, {{{}}}, &{}}},\n", quote(param.path),
                     param.role == ir::ParamRole::OptimizerState ? "true" : "false",
                     quote(ir::dtypeName(param.type.dtype)), list(sizesOf(global(id))),
                     list(sizesOf(local(id))), fmt::join(dims, ", "), fmt::join(axes, ", "),
                     paramMember(k));
  }
  s += "};\n}\n\n";
  s += fmt::format("meshc::gen::Tensor {0}::getParam(const std::string& path) {{\nauto shards = "
                   "paramShards();\nreturn meshc::gen::gatherParam(world_, "
                   "meshc::gen::findParamShard(shards, path, {1}));\n}}\n\n",
                   name, quote(fn.name));
  s += fmt::format("void {0}::setParam(const std::string& path, const meshc::gen::Tensor& global) "
                   "{{\nauto shards = paramShards();\nmeshc::gen::scatterParam(world_, "
                   "meshc::gen::findParamShard(shards, path, {1}), global);\n}}\n\n",
                   name, quote(fn.name));
}

void FunctionEmitter::emitCheckpointApi(std::string& h, std::string& s) const {
  bool train = fn.kind == ir::Function::Kind::Train;
  h += "/// Saves every param (optimizer state included), the step count and the seed as a new "
       "checkpoint under `dir` (collective: every rank calls it). Atomic: a crash during the "
       "save leaves the previous checkpoint the one that loads.\n"
       "void save(const std::string& dir);\n"
       "/// Loads the latest complete checkpoint under `dir` into the params, the step count and "
       "the seed (collective). It may have been saved on any mesh and layout: each rank reads "
       "what covers its shards. Throws meshrt::CheckpointError on a missing param, a shape or "
       "dtype mismatch or a checksum error.\n"
       "void load(const std::string& dir);\n\n";
  // The params come from paramShards() (paths, global dims, layouts, this rank's buffers).
  s += fmt::format("void {}::save(const std::string& dir) {{\nauto shards = paramShards();\n"
                   "meshc::gen::saveParams(world_, dir, shards, "
                   "{{{}, {{{{\"program\", {}}}, {{\"seed\", std::to_string(seed_)}}, {{\"mesh\", "
                   "mesh().str()}}}}}});\n}}\n\n",
                   name, train ? "step_" : "0", quote(fn.name));
  s += fmt::format("void {}::load(const std::string& dir) {{\nauto shards = paramShards();\n"
                   "meshrt::CheckpointInfo info = meshc::gen::loadParams(world_, dir, shards);\n",
                   name);
  s += train ? "step_ = info.step;\n" : "(void)info.step; // a program keeps no step count\n";
  s += "if (auto seed = info.metadata.find(\"seed\"); seed != info.metadata.end()) seed_ = "
       "std::stoull(seed->second);\n}\n\n";
}

std::string FunctionEmitter::inputsOfStep(const std::string& step) const {
  std::string s =
      fmt::format("auto inputs = program.synthesizeInputs(seed + uint64_t({}));\n", step);
  for (const ir::InputInfo& input : irFn.inputs)
    s += fmt::format("if (auto given = givenInputs.find({0}); given != givenInputs.end())\n"
                     "inputs.{1} = {2}::scatterInput(world, {3}, meshc::gen::batchOfStep({0}, "
                     "given->second, {2}::inputShape({3}), {4}));\n",
                     quote(fn.name + "." + input.name), identifier(input.name), name,
                     quote(input.name), step);
  return s;
}

std::string FunctionEmitter::runnerBody() const {
  std::string s;
  std::string kindWord = fn.kind == ir::Function::Kind::Train ? "train" : "program";
  // One warm-up run, then kTimedRuns timed ones; the time of a run is its slowest rank's (a max
  // all-reduce, so that it also holds when the ranks are processes).
  s += fmt::format("{{\n// {} {}\nstd::vector<double> milliseconds;\nconst char* backend = "
                   "\"\";\n",
                   kindWord, fn.name);
  s += fmt::format("lead = meshrt::launch({}::mesh(), launchOptions, [&](meshrt::Communicator& "
                   "world) {{\n",
                   name);
  s += fmt::format("{} program(world, seed);\n", name);
  // --load DIR / --save DIR: this function's checkpoints are DIR/<function name>.
  std::string checkpointDir = quote("/" + fn.name);
  s += fmt::format("if (!loadDir.empty()) program.load(loadDir + {});\n", checkpointDir);
  if (hasUpdates()) {
    // --steps N: N training steps on the inputs of steps 0..N-1 (inputsOfStep), the loss of each
    // printed as the interpreter prints it; then the last loss and every final param, named as
    // `meshc --emit=run --steps N --dump-outputs` names them (<fn>.loss, <fn>.param.<path>).
    s += fmt::format(
        "if (steps > 0) {{\nfloat loss = 0;\nfor (int64_t first = program.stepCount(), s = first; "
        "s < "
        "first + steps; ++s) {{\n{3}loss = program.step(inputs);\nif (world.rank() == 0) "
        "std::printf(\"step %lld loss %.9g\\n\", (long long)s, double(loss));\n}}\n"
        "if (world.rank() == 0) results.push_back({{{0}, \"f32\", {{}}, {{loss}}}});\n"
        "for (const auto& shard : program.paramShards()) {{\n"
        "auto global = program.getParam(shard.path);\nif (world.rank() == 0) "
        "results.push_back({{{1} + shard.path, shard.dtype, std::move(global.shape), "
        "std::move(global.data)}});\n}}\nif (!saveDir.empty()) program.save(saveDir + {2});\n"
        "return;\n}}\n",
        quote(fn.name + ".loss"), quote(fn.name + ".param."), checkpointDir, inputsOfStep("s"));
  }
  // A train step's outputs are step 0's (the first run); later runs are timed only.
  s += inputsOfStep("0") + "auto outputs = program.run(inputs);\n";
  s += fmt::format(
      "std::vector<double> runs(kTimedRuns);\nfor (int i = 0; i < kTimedRuns; ++i) "
      "{{\nworld.barrier();\nauto start = std::chrono::steady_clock::now();\n"
      "{}program.run(inputs);\nruns[size_t(i)] = std::chrono::duration<double, "
      "std::milli>(std::chrono::steady_clock::now() - start).count();\n}}\n"
      "world.allReduce(runs.data(), runs.size(), meshrt::ReduceOp::Max);\n"
      "if (world.rank() == 0) {{\nmilliseconds = runs;\nbackend = world.backend();\n}}\n",
      hasUpdates() ? "" : "outputs = ");
  for (const auto& [outName, id] : fn.outputs) {
    std::string field = identifier(outName), gathered = "gathered_" + field;
    s += fmt::format("auto {} = {}::gatherOutput(world, {}, outputs.{});\n", gathered, name,
                     quote(outName), field);
    s += fmt::format("if (world.rank() == 0) results.push_back({{{}, {}, std::move({}.shape), "
                     "std::move({}.data)}});\n",
                     quote(fn.name + "." + outName), quote(ir::dtypeName(global(id).dtype)),
                     gathered, gathered);
  }
  s += fmt::format("if (!saveDir.empty()) program.save(saveDir + {});\n", checkpointDir);
  s += "});\n";
  s += fmt::format("if (lead{}) report({}, {}::mesh().size(), backend, milliseconds);\n}}\n",
                   hasUpdates() ? " && steps == 0" : "", quote(kindWord + " " + fn.name), name);
  return s;
}

std::string formatCpp(const std::string& code, const std::string& fileName) {
  clang::format::FormatStyle style = clang::format::getLLVMStyle();
  style.ColumnLimit = 100;
  std::vector<clang::tooling::Range> ranges{clang::tooling::Range(0, unsigned(code.size()))};
  clang::tooling::Replacements replacements =
      clang::format::reformat(style, code, ranges, fileName);
  llvm::Expected<std::string> formatted = clang::tooling::applyAllReplacements(code, replacements);
  if (!formatted) {
    llvm::consumeError(formatted.takeError());
    return code;
  }
  return *formatted;
}

} // namespace

llvm::Expected<CppOutput> emitCpp(const ir::Module& module,
                                  const std::vector<plan::PlannedFunction>& plans,
                                  const CppOptions& options) {
  return emitWithTarget(module, plans, options, *makeCpuTarget());
}

llvm::Expected<CppOutput> emitWithTarget(const ir::Module& module,
                                         const std::vector<plan::PlannedFunction>& plans,
                                         const CppOptions& options, const Target& target) {
  std::vector<std::unique_ptr<FunctionEmitter>> emitters;
  for (const plan::PlannedFunction& planned : plans) {
    const ir::Function* irFn = module.findFunction(planned.spmd.name);
    if (!irFn)
      return llvm::createStringError(llvm::inconvertibleErrorCode(), "no function named '%s'",
                                     planned.spmd.name.c_str());
    auto emitter = std::make_unique<FunctionEmitter>(module, *irFn, planned.spmd);
    emitter->target = &target;
    if (auto error = emitter->emit()) return error;
    emitters.push_back(std::move(emitter));
  }
  std::string file = module.functions.empty() ? std::string() : module.functions.front().loc.file;
  CppOutput output;
  std::string& h = output.header;
  h += fmt::format("// Generated by meshc from {}: SPMD C++ over meshrt. Do not edit.\n", file);
  h += "#pragma once\n\n#include \"meshc/GeneratedSupport.h\"\n\n#include <cstdint>\n"
       "#include <string>\n#include <vector>\n\n";
  h += fmt::format("namespace {} {{\n\n", options.cppNamespace);
  for (const auto& emitter : emitters)
    h += emitter->declaration;
  h += fmt::format("}} // namespace {}\n", options.cppNamespace);

  std::string& s = output.source;
  s += fmt::format("// Generated by meshc from {}: SPMD C++ over meshrt. Do not edit.\n", file);
  s += fmt::format("#include \"{}\"\n\n", options.headerInclude);
  // The headers of the user's functions (`call` ops), relative to the main .mesh file's directory.
  std::set<std::string> userHeaders;
  for (const ir::Function& irFn : module.functions)
    for (const ir::Op& op : irFn.ops)
      if (op.kind == OpKind::Call && userHeaders.insert(op.string("header")).second)
        s += fmt::format("#include \"{}\"\n", op.string("header"));
  s += "#include <cmath>\n\n";
  s += fmt::format("namespace {} {{\n\n", options.cppNamespace);
  for (const auto& emitter : emitters)
    s += emitter->definition;
  s += fmt::format("}} // namespace {}\n", options.cppNamespace);

  if (options.runner) {
    std::string& r = output.runner;
    r += fmt::format(
        "// Generated by meshc from {}: runs every program and train block with the inputs the "
        "reference interpreter synthesizes, and writes the gathered outputs. The backend is "
        "chosen at run time: threads, or MPI under mpirun (meshrt/Launch.h).\n// Usage: <binary> "
        "[--backend threads|mpi] <outputs-file> [seed] [inputs-file] [--steps N] [--load DIR] "
        "[--save DIR]\n"
        "// --steps N: train blocks take N training steps instead, printing each step's loss, and "
        "write their final params.\n// --load DIR / --save DIR: each program and train block "
        "loads its checkpoint from DIR/<name> first / saves one there at the end (on any mesh).\n",
        file);
    r += fmt::format("#include \"{}\"\n\n#include \"meshrt/Launch.h\"\n\n#include <algorithm>\n"
                     "#include <chrono>\n#include <cstdio>\n#include <cstdlib>\n#include "
                     "<exception>\n\n",
                     options.headerInclude);
    r += fmt::format("using namespace {};\n\n", options.cppNamespace);
    r += "struct Result {\nstd::string name, dtype;\nmeshc::gen::Shape shape;\nmeshc::gen::Buffer "
         "data;\n};\n\n";
    r += "constexpr int kTimedRuns = 5;\n\n"
         "/// Prints the median and best of the timed runs (each: its slowest rank).\n"
         "void report(const char* what, int ranks, const char* backend, std::vector<double> runs) "
         "{\nstd::sort(runs.begin(), runs.end());\n"
         "std::printf(\"%s: %d ranks, run %.3f ms median, %.3f ms best of %d (slowest rank; "
         "after a warm-up run; %s backend)\\n\", what, ranks, runs[runs.size() / 2], "
         "runs.front(), kTimedRuns, backend);\n}\n\n";
    // Under MPI every process runs main; only the one holding world rank 0 (`lead`) reports and
    // writes the outputs.
    r +=
        "int main(int argc, char** argv) {\nstd::vector<Result> results;\nbool lead = true;\n"
        "std::vector<std::string> positional;\nint64_t steps = 0;\nstd::string loadDir, "
        "saveDir;\ntry {\nmeshrt::LaunchOptions launchOptions = "
        "meshrt::LaunchOptions::fromArgs(argc, argv);\nfor (int i = 1; i < argc; ++i) {\n"
        "if (std::string(argv[i]) == \"--steps\" && i + 1 < argc)\n"
        "steps = std::strtoll(argv[++i], nullptr, 10);\n"
        "else if (std::string(argv[i]) == \"--load\" && i + 1 < argc)\nloadDir = argv[++i];\n"
        "else if (std::string(argv[i]) == \"--save\" && i + 1 < argc)\nsaveDir = argv[++i];\n"
        "else\npositional.push_back(argv[i]);\n}\n"
        "if (positional.empty()) {\nstd::fprintf(stderr, \"usage: %s [--backend threads|mpi] "
        "<outputs-file> [seed] [inputs-file] [--steps N] [--load DIR] [--save DIR]\\n\", "
        "argv[0]);\nreturn "
        "2;\n}\n"
        "uint64_t seed = positional.size() > 1 ? std::strtoull(positional[1].c_str(), nullptr, 10) "
        ": 0;\n(void)steps;\nmeshc::gen::useSingleThreadedBlas();\n"
        "// Inputs from a file (`meshc run --data`) replace the synthesized ones, by name.\n"
        "const std::map<std::string, meshc::gen::Tensor> givenInputs = positional.size() > 2 ? "
        "meshc::gen::readTensors(positional[2]) : std::map<std::string, meshc::gen::Tensor>();\n";
    for (const auto& emitter : emitters)
      r += emitter->runnerBody();
    r += "} catch (const std::exception& error) {\nstd::fprintf(stderr, \"error: %s\\n\", "
         "error.what());\nreturn 1;\n}\n";
    r += "if (!lead) return 0;\n";
    r += "std::FILE* file = std::fopen(positional[0].c_str(), \"wb\");\nif (!file) {\n"
         "std::fprintf(stderr, \"error: cannot open '%s'\\n\", positional[0].c_str());\nreturn "
         "2;\n}\n"
         "for (const Result& result : results)\nmeshc::gen::writeTensor(file, result.name, "
         "result.dtype.c_str(), result.shape, result.data);\nstd::fclose(file);\nreturn 0;\n}\n";
  }
  target.finish(output);
  if (options.runner) output.runner = formatCpp(output.runner, "runner.cpp");
  output.header = formatCpp(output.header, "generated.h");
  output.source = formatCpp(output.source, "generated.cpp");
  return output;
}

} // namespace meshc::codegen
