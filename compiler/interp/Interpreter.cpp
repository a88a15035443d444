// The reference interpreter. Every op computes by dim NAME: an operand is indexed through the
// strides of its dims matched by name against an iteration space (usually the result's dims),
// never by position. Values live in double and are rounded to their dtype after every op.
#include "interp/Interpreter.h"

#include "interp/ScalarMath.h"
#include "interp/UserFunctions.h"
#include "ir/OpTraits.h"

#include "meshrt/Random.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>
#include <llvm/Support/MathExtras.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

namespace meshc::interp {
namespace {

using ir::Dim;
using ir::DType;
using ir::Op;
using ir::OpKind;
using ir::TensorType;
using Strides = std::vector<int64_t>;

constexpr double kInf = std::numeric_limits<double>::infinity();

void roundToType(Tensor& tensor) {
  DType dtype = tensor.type.dtype;
  if (dtype == DType::F32) {
    for (double& x : tensor.data)
      x = double(float(x));
    return;
  }
  for (double& x : tensor.data)
    x = roundTo(dtype, x);
}

//===------------------------------------------------------------------------------------------===//
// Types and attributes
//===------------------------------------------------------------------------------------------===//

std::string formatType(const TensorType& type) {
  std::vector<std::string> dims;
  for (const Dim& dim : type.dims)
    dims.push_back(fmt::format("{}={}", dim.name, dim.size));
  return fmt::format("{}[{}]", ir::dtypeName(type.dtype), fmt::join(dims, ", "));
}

/// The element count, or -1 when a size is negative or the count overflows int64.
int64_t checkedElementCount(const TensorType& type) {
  int64_t count = 1;
  for (const Dim& dim : type.dims) {
    if (dim.size < 0 || llvm::MulOverflow(count, dim.size, count)) return -1;
  }
  return count;
}

int64_t elementCount(const TensorType& type) {
  int64_t count = 1;
  for (const Dim& dim : type.dims)
    count *= dim.size;
  return count;
}

int findDim(const TensorType& type, const std::string& name) {
  for (size_t i = 0; i < type.dims.size(); ++i)
    if (type.dims[i].name == name) return int(i);
  return -1;
}

Strides rowMajorStrides(const TensorType& type) {
  Strides strides(type.dims.size());
  int64_t stride = 1;
  for (size_t i = type.dims.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= type.dims[i].size;
  }
  return strides;
}

/// The strides of `operand` over the iteration `space`, matching dims by name (after mapping a
/// space dim's name through `rename` when given); 0 where the operand lacks the dim.
Strides stridesOver(const TensorType& operand, const std::vector<Dim>& space,
                    const std::map<std::string, std::string>* rename = nullptr) {
  Strides own = rowMajorStrides(operand);
  Strides strides(space.size(), 0);
  for (size_t i = 0; i < space.size(); ++i) {
    std::string name = space[i].name;
    if (rename) {
      auto renamed = rename->find(name);
      if (renamed != rename->end()) name = renamed->second;
    }
    int position = findDim(operand, name);
    if (position >= 0) strides[i] = own[position];
  }
  return strides;
}

/// Calls fn(offsets) for every point of `space` in row-major order, where offsets[k] is the
/// running sum of index * strides[k] (plus base[k]).
template <size_t N, typename Fn>
void forEachIndex(const std::vector<Dim>& space, const std::array<const Strides*, N>& strides,
                  std::array<int64_t, N> offsets, Fn fn) {
  int64_t total = 1;
  for (const Dim& dim : space)
    total *= dim.size;
  if (total <= 0) return;
  size_t rank = space.size();
  std::vector<int64_t> counter(rank, 0);
  for (int64_t n = 0; n < total; ++n) {
    fn(offsets);
    for (size_t d = rank; d-- > 0;) {
      for (size_t k = 0; k < N; ++k)
        offsets[k] += (*strides[k])[d];
      if (++counter[d] < space[d].size) break;
      for (size_t k = 0; k < N; ++k)
        offsets[k] -= (*strides[k])[d] * space[d].size;
      counter[d] = 0;
    }
  }
}

/// Every offset of the iteration `space` through `strides`, in row-major order.
std::vector<int64_t> offsetsOf(const std::vector<Dim>& space, const Strides& strides) {
  std::vector<int64_t> offsets;
  forEachIndex<1>(space, {&strides}, {0},
                  [&](const std::array<int64_t, 1>& offset) { offsets.push_back(offset[0]); });
  return offsets;
}

std::vector<Dim> dimsExcept(const TensorType& type, const std::vector<std::string>& names) {
  std::vector<Dim> kept;
  for (const Dim& dim : type.dims)
    if (!llvm::is_contained(names, dim.name)) kept.push_back(dim);
  return kept;
}

const ir::AttrValue* findAttr(const Op& op, const std::string& name) {
  for (const auto& [key, value] : op.attrs)
    if (key == name) return &value;
  return nullptr;
}

/// An optional numeric attribute (double or integer).
double numberOr(const Op& op, const std::string& name, double fallback) {
  const ir::AttrValue* value = findAttr(op, name);
  if (value && std::holds_alternative<double>(*value)) return std::get<double>(*value);
  if (value && std::holds_alternative<int64_t>(*value)) return double(std::get<int64_t>(*value));
  return fallback;
}

template <typename... Args>
llvm::Error opError(const Op& op, fmt::format_string<Args...> format, Args&&... args) {
  std::string where;
  if (!op.loc.file.empty()) where = fmt::format("{}:{}:{}: ", op.loc.file, op.loc.line, op.loc.col);
  return llvm::createStringError(llvm::inconvertibleErrorCode(), "%s",
                                 fmt::format("{}{}: {}", where, ir::opSpelling(op.kind),
                                             fmt::format(format, std::forward<Args>(args)...))
                                     .c_str());
}

//===------------------------------------------------------------------------------------------===//
// Random sources
//===------------------------------------------------------------------------------------------===//

/// Performer's positive orthogonal random features: rows in blocks of `cols` are orthonormalized
/// Gaussian rows (modified Gram-Schmidt, two passes), each scaled to the norm of an independent
/// Gaussian vector (draw 1), so rows are marginally Gaussian yet orthogonal within a block.
void fillOrthogonal(std::vector<double>& data, int64_t rows, int64_t cols, uint64_t key,
                    double scale) {
  if (rows <= 0 || cols <= 0) return;
  std::vector<std::vector<double>> block;
  for (int64_t blockStart = 0; blockStart < rows; blockStart += cols) {
    int64_t blockRows = std::min(cols, rows - blockStart);
    block.assign(blockRows, std::vector<double>(cols));
    for (int64_t r = 0; r < blockRows; ++r) {
      std::vector<double>& row = block[r];
      int64_t base = (blockStart + r) * cols;
      meshrt::forEachNormal(key, uint64_t(base), uint64_t(cols),
                            [&](uint64_t c, double z) { row[c] = z; });
      for (int pass = 0; pass < 2; ++pass) {
        for (int64_t prev = 0; prev < r; ++prev) {
          double dot = 0;
          for (int64_t c = 0; c < cols; ++c)
            dot += row[c] * block[prev][c];
          for (int64_t c = 0; c < cols; ++c)
            row[c] -= dot * block[prev][c];
        }
      }
      double norm = 0;
      for (double x : row)
        norm += x * x;
      norm = std::sqrt(norm);
      if (norm > 0)
        for (double& x : row)
          x /= norm;
      double chi = 0;
      meshrt::forEachNormal(
          key, uint64_t(base), uint64_t(cols), [&](uint64_t, double z) { chi += z * z; }, 1);
      chi = std::sqrt(chi);
      for (int64_t c = 0; c < cols; ++c)
        data[base + c] = row[c] * chi * scale;
    }
  }
}

llvm::Expected<Tensor> initialize(const ir::ParamInfo& param, uint64_t seed) {
  Tensor tensor{param.type, std::vector<double>(size_t(elementCount(param.type)), 0.0)};
  const ir::Initializer& init = param.init;
  auto arg = [&](const char* name, double fallback) {
    for (const auto& [key, value] : init.args)
      if (key == name) return value;
    return fallback;
  };
  uint64_t key = meshrt::streamKey(seed, "param/" + param.path);
  std::vector<double>& data = tensor.data;
  int64_t count = int64_t(data.size());
  if (init.kind == "zeros") {
  } else if (init.kind == "ones") {
    std::fill(data.begin(), data.end(), 1.0);
  } else if (init.kind == "constant") {
    std::fill(data.begin(), data.end(), arg("value", 0));
  } else if (init.kind == "normal") {
    double mean = arg("mean", 0), stddev = arg("stddev", 1);
    meshrt::forEachNormal(key, 0, uint64_t(count),
                          [&](uint64_t i, double z) { data[i] = mean + stddev * z; });
  } else if (init.kind == "truncated_normal") {
    double mean = arg("mean", 0), stddev = arg("stddev", 1);
    meshrt::forEachTruncatedNormal(key, 0, uint64_t(count),
                                   [&](uint64_t i, double z) { data[i] = mean + stddev * z; });
  } else if (init.kind == "uniform") {
    double low = arg("min", 0), high = arg("max", 1);
    meshrt::forEachUniform01(key, 0, uint64_t(count),
                             [&](uint64_t i, double u) { data[i] = low + (high - low) * u; });
  } else if (init.kind == "orthogonal") {
    int64_t rows = param.type.dims.empty() ? 1 : param.type.dims.front().size;
    int64_t cols = rows > 0 ? count / rows : 0;
    fillOrthogonal(data, rows, cols, key, arg("scale", 1));
  } else {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "param '%s': unknown initializer '%s'", param.path.c_str(),
                                   init.kind.c_str());
  }
  roundToType(tensor);
  return tensor;
}

//===------------------------------------------------------------------------------------------===//
// The interpreter
//===------------------------------------------------------------------------------------------===//

class Interpreter {
public:
  Interpreter(const ir::Function& fn, const TensorMap& inputs, const Options& opts,
              const TensorMap& params)
      : fn(fn), inputs(inputs), opts(opts), params(params) {}

  /// The outputs by name, plus each `extra` value (kept alive to the end) by its given name.
  llvm::Expected<TensorMap> run(const std::vector<std::pair<std::string, ir::ValueId>>& extra = {});

private:
  llvm::Error execute(const Op& op);
  llvm::Error checkOperands(const Op& op);

  // Attribute readers: a missing or mistyped attribute is an error, not a crash.
  llvm::Expected<double> number(const Op& op, const char* name);
  llvm::Expected<int64_t> integer(const Op& op, const char* name);
  llvm::Expected<std::string> string(const Op& op, const char* name);
  llvm::Expected<std::vector<std::string>> names(const Op& op, const char* name);
  llvm::Error requireDim(const Op& op, const TensorType& type, const std::string& name);

  // Op families.
  llvm::Error input(const Op& op, Tensor& out);
  llvm::Error param(const Op& op, Tensor& out);
  llvm::Error iota(const Op& op, Tensor& out);
  llvm::Error random(const Op& op, Tensor& out);
  void unary(const Op& op, Tensor& out);
  void binary(const Op& op, Tensor& out);
  void where(const Op& op, Tensor& out);
  llvm::Error call(const Op& op, Tensor& out);
  llvm::Error einsum(const Op& op, Tensor& out);
  llvm::Error reduce(const Op& op, Tensor& out);
  llvm::Error alongDims(const Op& op, Tensor& out);
  llvm::Error rename(const Op& op, Tensor& out);
  llvm::Error reshape(const Op& op, Tensor& out);
  llvm::Error window(const Op& op, Tensor& out);
  llvm::Error concat(const Op& op, Tensor& out);
  llvm::Error oneHot(const Op& op, Tensor& out);
  llvm::Error gather(const Op& op, Tensor& out);
  llvm::Error topK(const Op& op, Tensor& out);
  llvm::Error dropout(const Op& op, Tensor& out);

  /// Copies `in` into `out` by dim name (out[j] = in[j - offset] along `outAxis`/`inAxis`,
  /// skipping positions outside `in`); other dims match by name.
  void copyWindow(const Tensor& in, Tensor& out, const std::string& inAxis,
                  const std::string& outAxis, int64_t offset);

  const Tensor& operand(const Op& op, size_t i) const { return values[op.operands[i]]; }

  const ir::Function& fn;
  const TensorMap& inputs;
  const Options& opts;
  const TensorMap& params;
  std::vector<Tensor> values;
  std::vector<bool> computed;
};

llvm::Expected<double> Interpreter::number(const Op& op, const char* name) {
  const ir::AttrValue* value = findAttr(op, name);
  if (value) {
    if (auto* d = std::get_if<double>(value)) return *d;
    if (auto* i = std::get_if<int64_t>(value)) return double(*i);
  }
  return opError(op, "missing number attribute '{}'", name);
}

llvm::Expected<int64_t> Interpreter::integer(const Op& op, const char* name) {
  const ir::AttrValue* value = findAttr(op, name);
  if (value) {
    if (auto* i = std::get_if<int64_t>(value)) return *i;
    if (auto* d = std::get_if<double>(value); d && *d == std::trunc(*d) && std::fabs(*d) < 0x1p62)
      return int64_t(*d);
  }
  return opError(op, "missing integer attribute '{}'", name);
}

llvm::Expected<std::string> Interpreter::string(const Op& op, const char* name) {
  const ir::AttrValue* value = findAttr(op, name);
  if (value) {
    if (auto* s = std::get_if<std::string>(value)) return *s;
    if (auto* list = std::get_if<std::vector<std::string>>(value); list && list->size() == 1)
      return list->front();
  }
  return opError(op, "missing string attribute '{}'", name);
}

llvm::Expected<std::vector<std::string>> Interpreter::names(const Op& op, const char* name) {
  const ir::AttrValue* value = findAttr(op, name);
  if (value) {
    if (auto* list = std::get_if<std::vector<std::string>>(value)) return *list;
    if (auto* s = std::get_if<std::string>(value)) return std::vector<std::string>{*s};
  }
  return opError(op, "missing dim list attribute '{}'", name);
}

llvm::Error Interpreter::requireDim(const Op& op, const TensorType& type, const std::string& name) {
  if (findDim(type, name) < 0) return opError(op, "dim '{}' is not in {}", name, formatType(type));
  return llvm::Error::success();
}

llvm::Error Interpreter::checkOperands(const Op& op) {
  size_t count = op.operands.size();
  if (!ir::opTraits(op.kind).acceptsOperandCount(count))
    return opError(op, "has {} operands", count);
  for (ir::ValueId id : op.operands)
    if (id >= values.size() || !computed[id])
      return opError(op, "operand %{} is not defined before its use", id);
  if (op.result >= values.size()) return opError(op, "result %{} is out of range", op.result);
  return llvm::Error::success();
}

/// The names of `attr` (a string or list), or none.
std::vector<std::string> namesOrNone(const Op& op, const char* attr) {
  const ir::AttrValue* value = findAttr(op, attr);
  if (value && std::holds_alternative<std::vector<std::string>>(*value))
    return std::get<std::vector<std::string>>(*value);
  if (value && std::holds_alternative<std::string>(*value)) return {std::get<std::string>(*value)};
  return {};
}

/// Checks what the index arithmetic relies on, so malformed IR is an error rather than an
/// out-of-bounds access: dim names are unique within a type, and a dim an operand shares (by
/// name) with the result has the same size, except the dims the op renames or resizes.
llvm::Error checkDims(const ir::Function& fn, const Op& op) {
  auto unique = [&](const TensorType& type) -> llvm::Error {
    for (size_t i = 0; i < type.dims.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (type.dims[i].name == type.dims[j].name)
          return opError(op, "dim '{}' appears twice in {}", type.dims[i].name, formatType(type));
    return llvm::Error::success();
  };
  const TensorType& result = fn.typeOf(op.result);
  if (auto error = unique(result)) return error;
  std::vector<std::string> resized;
  switch (op.kind) {
  case OpKind::Slice:
  case OpKind::Pad:
  case OpKind::Concat:
    resized = namesOrNone(op, "to");
    break;
  case OpKind::Rename:
  case OpKind::Reshape: {
    std::vector<std::string> from = namesOrNone(op, "from"), to = namesOrNone(op, "to");
    for (const std::string& name : from)
      if (!llvm::is_contained(to, name) && findDim(result, name) >= 0)
        return opError(op, "dim '{}' is both regrouped and kept", name);
    resized = to;
    resized.insert(resized.end(), from.begin(), from.end());
    if (op.kind == OpKind::Rename && from.size() == to.size() && !op.operands.empty()) {
      const TensorType& in = fn.typeOf(op.operands[0]);
      for (size_t i = 0; i < from.size(); ++i) {
        int source = findDim(in, from[i]), target = findDim(result, to[i]);
        if (source >= 0 && target >= 0 && in.dims[source].size != result.dims[target].size)
          return opError(op, "renames dim '{}' of size {} to '{}' of size {}", from[i],
                         in.dims[source].size, to[i], result.dims[target].size);
      }
    }
    break;
  }
  default:
    break;
  }
  for (size_t k = 0; k < op.operands.size(); ++k) {
    const TensorType& in = fn.typeOf(op.operands[k]);
    if (auto error = unique(in)) return error;
    for (const Dim& dim : result.dims) {
      int shared = findDim(in, dim.name);
      if (shared >= 0 && !llvm::is_contained(resized, dim.name) && in.dims[shared].size != dim.size)
        return opError(op, "dim '{}' has size {} in operand {} but {} in the result", dim.name,
                       in.dims[shared].size, k, dim.size);
    }
  }
  return llvm::Error::success();
}

llvm::Expected<TensorMap>
Interpreter::run(const std::vector<std::pair<std::string, ir::ValueId>>& extra) {
  values.assign(fn.values.size(), Tensor{});
  computed.assign(fn.values.size(), false);
  // Free each value after its last use (outputs live to the end) to bound peak memory.
  std::vector<size_t> lastUse(fn.values.size(), 0);
  for (size_t i = 0; i < fn.ops.size(); ++i) {
    if (fn.ops[i].result < lastUse.size()) lastUse[fn.ops[i].result] = i;
    for (ir::ValueId id : fn.ops[i].operands)
      if (id < lastUse.size()) lastUse[id] = i;
  }
  std::vector<std::pair<std::string, ir::ValueId>> results;
  for (const ir::OutputInfo& output : fn.outputs)
    results.emplace_back(output.name, output.value);
  results.insert(results.end(), extra.begin(), extra.end());
  for (const auto& [name, value] : results)
    if (value < lastUse.size()) lastUse[value] = fn.ops.size();
  for (size_t i = 0; i < fn.ops.size(); ++i) {
    const Op& op = fn.ops[i];
    if (auto error = checkOperands(op)) return error;
    if (auto error = checkDims(fn, op)) return error;
    const TensorType& type = fn.typeOf(op.result);
    int64_t count = checkedElementCount(type);
    if (count < 0 || count > opts.maxElements)
      return opError(op, "result {} has more than {} elements", formatType(type), opts.maxElements);
    Tensor& out = values[op.result];
    out.type = type;
    out.data.assign(size_t(count), 0.0);
    if (auto error = execute(op)) return error;
    if (opts.roundToDtype || out.type.dtype == DType::I32) roundToType(out);
    computed[op.result] = true;
    for (ir::ValueId id : op.operands)
      if (lastUse[id] == i) values[id].data = std::vector<double>();
    if (lastUse[op.result] == i) values[op.result].data = std::vector<double>();
  }
  TensorMap outputs;
  for (const auto& [name, value] : results) {
    if (value >= values.size() || !computed[value])
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "output '%s' is never computed", name.c_str());
    outputs[name] = values[value];
  }
  return outputs;
}

llvm::Error Interpreter::execute(const Op& op) {
  Tensor& out = values[op.result];
  switch (op.kind) {
  case OpKind::Input:
    return input(op, out);
  case OpKind::Param:
    return param(op, out);
  case OpKind::Literal: {
    auto value = number(op, "value");
    if (!value) return value.takeError();
    std::fill(out.data.begin(), out.data.end(), *value);
    return llvm::Error::success();
  }
  case OpKind::Iota:
    return iota(op, out);
  case OpKind::RandomNormal:
  case OpKind::RandomUniform:
  case OpKind::RandomInt:
    return random(op, out);
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
  case OpKind::Floor:
  case OpKind::Ceil:
  case OpKind::Round:
  case OpKind::StopGradient:
  case OpKind::Cast:
  case OpKind::Transpose:
  case OpKind::Broadcast: // unary() indexes the operand by name: stride 0 along the new dims
    unary(op, out);
    return llvm::Error::success();
  case OpKind::Add:
  case OpKind::Sub:
  case OpKind::Mul:
  case OpKind::Div:
  case OpKind::FloorDiv:
  case OpKind::Mod:
  case OpKind::Pow:
  case OpKind::Maximum:
  case OpKind::Minimum:
  case OpKind::Lt:
  case OpKind::Le:
  case OpKind::Gt:
  case OpKind::Ge:
  case OpKind::Eq:
  case OpKind::Ne:
    binary(op, out);
    return llvm::Error::success();
  case OpKind::Where:
    where(op, out);
    return llvm::Error::success();
  case OpKind::Call:
    return call(op, out);
  case OpKind::Einsum:
    return einsum(op, out);
  case OpKind::ReduceSum:
  case OpKind::ReduceMean:
  case OpKind::ReduceMax:
  case OpKind::ReduceMin:
  case OpKind::LogSumExp:
    return reduce(op, out);
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::LayerNorm:
  case OpKind::LayerNormGrad:
  case OpKind::Cumsum:
  case OpKind::Shift:
    return alongDims(op, out);
  case OpKind::Rename:
    return rename(op, out);
  case OpKind::Reshape:
    return reshape(op, out);
  case OpKind::Slice:
  case OpKind::Pad:
    return window(op, out);
  case OpKind::Concat:
    return concat(op, out);
  case OpKind::OneHot:
    return oneHot(op, out);
  case OpKind::Gather:
    return gather(op, out);
  case OpKind::TopK:
    return topK(op, out);
  case OpKind::Dropout:
    return dropout(op, out);
  case OpKind::TrainStep:
    std::fill(out.data.begin(), out.data.end(), double(opts.step));
    return llvm::Error::success();
  }
  return opError(op, "is not supported by the interpreter");
}

llvm::Error Interpreter::input(const Op& op, Tensor& out) {
  const ir::InputInfo* info = nullptr;
  std::string name;
  if (const auto* attr = findAttr(op, "name"); attr && std::holds_alternative<std::string>(*attr))
    name = std::get<std::string>(*attr);
  for (const ir::InputInfo& candidate : fn.inputs)
    if ((!name.empty() && candidate.name == name) || (name.empty() && candidate.value == op.result))
      info = &candidate;
  if (!info && name.empty()) return opError(op, "has no input name");
  if (info) name = info->name;
  auto given = inputs.find(name);
  if (given == inputs.end()) return opError(op, "missing input '{}'", name);
  if (!(given->second.type == out.type))
    return opError(op, "input '{}' has type {} but the program expects {}", name,
                   formatType(given->second.type), formatType(out.type));
  if (given->second.data.size() != out.data.size())
    return opError(op, "input '{}' holds {} values but its type has {} elements", name,
                   given->second.data.size(), out.data.size());
  out.data = given->second.data;
  return llvm::Error::success();
}

llvm::Error Interpreter::param(const Op& op, Tensor& out) {
  const ir::ParamInfo* info = nullptr;
  std::string path;
  if (const auto* attr = findAttr(op, "path"); attr && std::holds_alternative<std::string>(*attr))
    path = std::get<std::string>(*attr);
  for (const ir::ParamInfo& candidate : fn.params)
    if ((!path.empty() && candidate.path == path) || (path.empty() && candidate.value == op.result))
      info = &candidate;
  if (!info) return opError(op, "unknown param '{}'", path);
  auto given = params.find(info->path);
  if (given != params.end()) {
    if (!(given->second.type == out.type) || given->second.data.size() != out.data.size())
      return opError(op, "param '{}' is given as {} but the program declares {}", info->path,
                     formatType(given->second.type), formatType(out.type));
    out.data = given->second.data;
    return llvm::Error::success();
  }
  ir::ParamInfo typed = *info;
  typed.type = out.type;
  auto initialized = initialize(typed, opts.seed);
  if (!initialized) return initialized.takeError();
  out.data = std::move(initialized->data);
  return llvm::Error::success();
}

llvm::Error Interpreter::iota(const Op& op, Tensor& out) {
  auto dim = string(op, "dim");
  if (!dim) return dim.takeError();
  if (auto error = requireDim(op, out.type, *dim)) return error;
  Strides position(out.type.dims.size(), 0), outStrides = rowMajorStrides(out.type);
  position[findDim(out.type, *dim)] = 1;
  forEachIndex<2>(out.type.dims, {&outStrides, &position}, {0, 0},
                  [&](const std::array<int64_t, 2>& at) { out.data[at[0]] = double(at[1]); });
  return llvm::Error::success();
}

llvm::Error Interpreter::random(const Op& op, Tensor& out) {
  auto stream = string(op, "stream");
  if (!stream) return stream.takeError();
  // Train blocks draw fresh values every step; programs key by the stream alone.
  std::string keyName =
      fn.kind == ir::Function::Kind::Train ? *stream + "#" + std::to_string(opts.step) : *stream;
  uint64_t key = meshrt::streamKey(opts.seed, keyName);
  int64_t count = int64_t(out.data.size());
  if (op.kind == OpKind::RandomNormal) {
    auto mean = number(op, "mean"), stddev = number(op, "stddev");
    if (!mean) return mean.takeError();
    if (!stddev) return stddev.takeError();
    meshrt::forEachNormal(key, 0, uint64_t(count),
                          [&](uint64_t i, double z) { out.data[i] = *mean + *stddev * z; });
  } else if (op.kind == OpKind::RandomInt) {
    auto bound = integer(op, "max");
    if (!bound) return bound.takeError();
    if (*bound < 1 || *bound > (int64_t(1) << 24))
      return opError(op, "max {} is outside [1, 2^24]", *bound);
    meshrt::forEachUniformIndex(key, 0, uint64_t(count), uint64_t(*bound),
                                [&](uint64_t i, uint32_t value) { out.data[i] = value; });
  } else {
    auto low = number(op, "min"), high = number(op, "max");
    if (!low) return low.takeError();
    if (!high) return high.takeError();
    meshrt::forEachUniform01(key, 0, uint64_t(count), [&](uint64_t i, double u) {
      out.data[i] = *low + (*high - *low) * u;
    });
  }
  return llvm::Error::success();
}

void Interpreter::unary(const Op& op, Tensor& out) {
  const Tensor& in = operand(op, 0);
  Strides inStrides = stridesOver(in.type, out.type.dims);
  Strides outStrides = rowMajorStrides(out.type);
  forEachIndex<2>(out.type.dims, {&outStrides, &inStrides}, {0, 0},
                  [&](const std::array<int64_t, 2>& at) {
                    out.data[at[0]] = unaryScalar(op.kind, in.data[at[1]], out.type.dtype);
                  });
}

void Interpreter::binary(const Op& op, Tensor& out) {
  const Tensor& a = operand(op, 0);
  const Tensor& b = operand(op, 1);
  Strides aStrides = stridesOver(a.type, out.type.dims);
  Strides bStrides = stridesOver(b.type, out.type.dims);
  Strides outStrides = rowMajorStrides(out.type);
  bool integer = a.type.dtype == DType::I32 && b.type.dtype == DType::I32;
  forEachIndex<3>(out.type.dims, {&outStrides, &aStrides, &bStrides}, {0, 0, 0},
                  [&](const std::array<int64_t, 3>& at) {
                    out.data[at[0]] = binaryScalar(op.kind, a.data[at[1]], b.data[at[2]], integer);
                  });
}

void Interpreter::where(const Op& op, Tensor& out) {
  const Tensor& cond = operand(op, 0);
  const Tensor& a = operand(op, 1);
  const Tensor& b = operand(op, 2);
  Strides condStrides = stridesOver(cond.type, out.type.dims);
  Strides aStrides = stridesOver(a.type, out.type.dims);
  Strides bStrides = stridesOver(b.type, out.type.dims);
  Strides outStrides = rowMajorStrides(out.type);
  forEachIndex<4>(out.type.dims, {&outStrides, &condStrides, &aStrides, &bStrides}, {0, 0, 0, 0},
                  [&](const std::array<int64_t, 4>& at) {
                    out.data[at[0]] = cond.data[at[1]] != 0 ? a.data[at[2]] : b.data[at[3]];
                  });
}

/// The user's elementwise function over operands broadcast by dim name (an odometer over the
/// result's index space, one offset per operand).
llvm::Error Interpreter::call(const Op& op, Tensor& out) {
  llvm::Expected<std::string> function = string(op, "function");
  if (!function) return function.takeError();
  const UserFunctions* user = opts.userFunctions;
  if (!user || !user->byName.count(*function))
    return opError(op, "the user function '{}' is not loaded", *function);
  UserFunction userFunction = user->byName.at(*function);
  size_t n = op.operands.size();
  std::vector<Strides> strides;
  for (size_t k = 0; k < n; ++k)
    strides.push_back(stridesOver(operand(op, k).type, out.type.dims));
  const std::vector<Dim>& dims = out.type.dims;
  std::vector<int64_t> index(dims.size(), 0), offset(n, 0);
  std::vector<double> args(n);
  for (double& result : out.data) {
    for (size_t k = 0; k < n; ++k)
      args[k] = operand(op, k).data[size_t(offset[k])];
    result = userFunction(args.data());
    for (size_t d = dims.size(); d-- > 0;) { // advance the odometer, innermost dim first
      for (size_t k = 0; k < n; ++k)
        offset[k] += strides[k][d];
      if (++index[d] < dims[d].size) break;
      for (size_t k = 0; k < n; ++k)
        offset[k] -= strides[k][d] * dims[d].size;
      index[d] = 0;
    }
  }
  return llvm::Error::success();
}

llvm::Error Interpreter::einsum(const Op& op, Tensor& out) {
  // Contracted dims: every operand dim absent from the result, with one size across operands.
  std::vector<Dim> contracted;
  for (size_t k = 0; k < op.operands.size(); ++k) {
    for (const Dim& dim : operand(op, k).type.dims) {
      int inResult = findDim(out.type, dim.name);
      int64_t known = inResult >= 0 ? out.type.dims[inResult].size : -1;
      if (inResult < 0) {
        auto seen = llvm::find_if(contracted, [&](const Dim& d) { return d.name == dim.name; });
        if (seen == contracted.end())
          contracted.push_back(dim);
        else
          known = seen->size;
      }
      if (known >= 0 && known != dim.size)
        return opError(op, "dim '{}' has size {} in operand {} but {} elsewhere", dim.name,
                       dim.size, k, known);
    }
  }
  // The innermost contracted dims (up to 64Ki points) become precomputed offset lists; the rest
  // join the outer iteration and accumulate into the same output element.
  size_t split = contracted.size();
  int64_t innerCount = 1;
  while (split > 0 && (innerCount * contracted[split - 1].size <= (int64_t(1) << 16) ||
                       split == contracted.size())) {
    innerCount *= contracted[split - 1].size;
    --split;
  }
  std::vector<Dim> outer = out.type.dims;
  outer.insert(outer.end(), contracted.begin(), contracted.begin() + split);
  std::vector<Dim> inner(contracted.begin() + split, contracted.end());

  size_t operandCount = op.operands.size();
  std::vector<Strides> outerStrides(operandCount + 1);
  std::vector<std::vector<int64_t>> innerOffsets(operandCount);
  std::vector<const double*> data(operandCount);
  for (size_t k = 0; k < operandCount; ++k) {
    const TensorType& type = operand(op, k).type;
    outerStrides[k + 1] = stridesOver(type, outer);
    innerOffsets[k] = offsetsOf(inner, stridesOver(type, inner));
    data[k] = operand(op, k).data.data();
  }
  outerStrides[0] = stridesOver(out.type, outer);

  double* result = out.data.data();
  std::vector<int64_t> base(operandCount + 1, 0), counter(outer.size(), 0);
  int64_t outerCount = 1;
  for (const Dim& dim : outer)
    outerCount *= dim.size;
  for (int64_t n = 0; n < outerCount && innerCount > 0; ++n) {
    double sum = 0;
    if (operandCount == 2) {
      const double* a = data[0] + base[1];
      const double* b = data[1] + base[2];
      const int64_t* aOffsets = innerOffsets[0].data();
      const int64_t* bOffsets = innerOffsets[1].data();
      for (int64_t i = 0; i < innerCount; ++i)
        sum += a[aOffsets[i]] * b[bOffsets[i]];
    } else {
      for (int64_t i = 0; i < innerCount; ++i) {
        double product = 1;
        for (size_t k = 0; k < operandCount; ++k)
          product *= data[k][base[k + 1] + innerOffsets[k][i]];
        sum += product;
      }
    }
    result[base[0]] += sum;
    for (size_t d = outer.size(); d-- > 0;) {
      for (size_t k = 0; k <= operandCount; ++k)
        base[k] += outerStrides[k][d];
      if (++counter[d] < outer[d].size) break;
      for (size_t k = 0; k <= operandCount; ++k)
        base[k] -= outerStrides[k][d] * outer[d].size;
      counter[d] = 0;
    }
  }
  return llvm::Error::success();
}

llvm::Error Interpreter::reduce(const Op& op, Tensor& out) {
  const Tensor& in = operand(op, 0);
  // The reduced dims are the operand's dims absent from the result (the `dims` attribute
  // names them; it is checked, not needed).
  if (auto listed = names(op, "dims")) {
    for (const std::string& dim : *listed)
      if (auto error = requireDim(op, in.type, dim)) return error;
  } else {
    llvm::consumeError(listed.takeError());
  }
  std::vector<std::string> kept;
  for (const Dim& dim : out.type.dims)
    kept.push_back(dim.name);
  std::vector<Dim> reduced = dimsExcept(in.type, kept);
  int64_t reducedCount = 1;
  for (const Dim& dim : reduced)
    reducedCount *= dim.size;
  Strides inOuter = stridesOver(in.type, out.type.dims), outStrides = rowMajorStrides(out.type);
  std::vector<int64_t> lane = offsetsOf(reduced, stridesOver(in.type, reduced));
  forEachIndex<2>(out.type.dims, {&outStrides, &inOuter}, {0, 0},
                  [&](const std::array<int64_t, 2>& at) {
                    const double* x = in.data.data() + at[1];
                    double result = 0;
                    switch (op.kind) {
                    case OpKind::ReduceSum:
                    case OpKind::ReduceMean:
                      for (int64_t offset : lane)
                        result += x[offset];
                      if (op.kind == OpKind::ReduceMean) result /= double(reducedCount);
                      break;
                    case OpKind::ReduceMax:
                    case OpKind::ReduceMin:
                    case OpKind::LogSumExp: {
                      bool isMin = op.kind == OpKind::ReduceMin;
                      result = isMin ? kInf : -kInf;
                      for (int64_t offset : lane) {
                        double v = x[offset];
                        if (std::isnan(v) || (isMin ? v < result : v > result)) result = v;
                        if (std::isnan(v)) break;
                      }
                      if (op.kind == OpKind::LogSumExp && std::isfinite(result)) {
                        double sum = 0;
                        for (int64_t offset : lane)
                          sum += std::exp(x[offset] - result);
                        result += std::log(sum);
                      }
                      break;
                    }
                    default:
                      break;
                    }
                    out.data[at[0]] = result;
                  });
  return llvm::Error::success();
}

llvm::Error Interpreter::alongDims(const Op& op, Tensor& out) {
  const Tensor& in = operand(op, 0);
  // layer_norm_grad's cotangent has x's type (the IR verifier): x's offsets walk it.
  const Tensor* ct = op.kind == OpKind::LayerNormGrad ? &operand(op, 1) : nullptr;
  std::vector<std::string> laneDims;
  double eps = 0;
  int64_t offset = 0;
  bool exclusive = false;
  if (op.kind == OpKind::LayerNorm || op.kind == OpKind::LayerNormGrad) {
    auto dims = names(op, "dims");
    if (!dims) return dims.takeError();
    laneDims = *dims;
    eps = numberOr(op, "eps", 1e-5);
  } else {
    auto dim = string(op, "dim");
    if (!dim) return dim.takeError();
    laneDims = {*dim};
  }
  if (op.kind == OpKind::Shift) {
    auto by = integer(op, "offset");
    if (!by) return by.takeError();
    offset = *by;
  }
  if (op.kind == OpKind::Cumsum) {
    exclusive = numberOr(op, "exclusive", 0) != 0;
  }
  std::vector<Dim> lane;
  for (const std::string& name : laneDims) {
    if (auto error = requireDim(op, in.type, name)) return error;
    if (auto error = requireDim(op, out.type, name)) return error;
    lane.push_back(out.type.dims[findDim(out.type, name)]);
  }
  std::vector<Dim> outer = dimsExcept(out.type, laneDims);
  Strides inOuter = stridesOver(in.type, outer), outOuter = stridesOver(out.type, outer);
  std::vector<int64_t> inLane = offsetsOf(lane, stridesOver(in.type, lane));
  std::vector<int64_t> outLane = offsetsOf(lane, stridesOver(out.type, lane));
  int64_t size = int64_t(inLane.size());
  forEachIndex<2>(outer, {&outOuter, &inOuter}, {0, 0}, [&](const std::array<int64_t, 2>& at) {
    const double* x = in.data.data() + at[1];
    double* y = out.data.data() + at[0];
    switch (op.kind) {
    case OpKind::Softmax:
    case OpKind::LogSoftmax: {
      double max = -kInf;
      for (int64_t i = 0; i < size; ++i)
        max = std::max(max, x[inLane[i]]);
      if (!std::isfinite(max))
        max = 0; // all -inf (or an inf): let the arithmetic below produce nan/inf honestly
      double sum = 0;
      for (int64_t i = 0; i < size; ++i)
        sum += std::exp(x[inLane[i]] - max);
      for (int64_t i = 0; i < size; ++i)
        y[outLane[i]] = op.kind == OpKind::Softmax ? std::exp(x[inLane[i]] - max) / sum
                                                   : x[inLane[i]] - max - std::log(sum);
      break;
    }
    case OpKind::LayerNorm:
    case OpKind::LayerNormGrad: {
      double mean = 0, variance = 0;
      for (int64_t i = 0; i < size; ++i)
        mean += x[inLane[i]];
      mean /= double(size);
      for (int64_t i = 0; i < size; ++i)
        variance += (x[inLane[i]] - mean) * (x[inLane[i]] - mean);
      variance /= double(size);
      double scale = 1 / std::sqrt(variance + eps);
      if (op.kind == OpKind::LayerNorm) {
        for (int64_t i = 0; i < size; ++i)
          y[outLane[i]] = (x[inLane[i]] - mean) * scale;
        break;
      }
      // The gradient, with layer_norm's y = (x - mean) r and r = scale:
      // dx = r (ct - mean(ct) - y mean(ct y)).
      const double* g = ct->data.data() + at[1];
      double meanCt = 0, meanCtY = 0;
      for (int64_t i = 0; i < size; ++i) {
        meanCt += g[inLane[i]];
        meanCtY += g[inLane[i]] * (x[inLane[i]] - mean) * scale;
      }
      meanCt /= double(size);
      meanCtY /= double(size);
      for (int64_t i = 0; i < size; ++i)
        y[outLane[i]] = scale * (g[inLane[i]] - meanCt - (x[inLane[i]] - mean) * scale * meanCtY);
      break;
    }
    case OpKind::Cumsum: {
      double sum = 0;
      for (int64_t i = 0; i < size; ++i) {
        if (exclusive) {
          y[outLane[i]] = sum;
          sum += x[inLane[i]];
        } else {
          sum += x[inLane[i]];
          y[outLane[i]] = sum;
        }
      }
      break;
    }
    case OpKind::Shift:
      for (int64_t i = 0; i < size; ++i) {
        int64_t from = i - offset;
        y[outLane[i]] = from >= 0 && from < size ? x[inLane[from]] : 0.0;
      }
      break;
    default:
      break;
    }
  });
  return llvm::Error::success();
}

llvm::Error Interpreter::rename(const Op& op, Tensor& out) {
  const Tensor& in = operand(op, 0);
  auto from = names(op, "from"), to = names(op, "to");
  if (!from) return from.takeError();
  if (!to) return to.takeError();
  if (from->size() != to->size())
    return opError(op, "renames {} dims to {}", from->size(), to->size());
  std::map<std::string, std::string> resultToOperand;
  for (size_t i = 0; i < from->size(); ++i) {
    if (auto error = requireDim(op, in.type, (*from)[i])) return error;
    if (auto error = requireDim(op, out.type, (*to)[i])) return error;
    resultToOperand[(*to)[i]] = (*from)[i];
  }
  // A result dim keeping an operand dim's name that is itself renamed away must not map to it.
  for (const Dim& dim : out.type.dims)
    if (!resultToOperand.count(dim.name) && llvm::is_contained(*from, dim.name))
      return opError(op, "dim '{}' is both renamed and kept", dim.name);
  Strides inStrides = stridesOver(in.type, out.type.dims, &resultToOperand);
  Strides outStrides = rowMajorStrides(out.type);
  forEachIndex<2>(out.type.dims, {&outStrides, &inStrides}, {0, 0},
                  [&](const std::array<int64_t, 2>& at) { out.data[at[0]] = in.data[at[1]]; });
  return llvm::Error::success();
}

llvm::Error Interpreter::reshape(const Op& op, Tensor& out) {
  const Tensor& in = operand(op, 0);
  auto from = names(op, "from"), to = names(op, "to");
  if (!from) return from.takeError();
  if (!to) return to.takeError();
  std::vector<Dim> fromDims, toDims;
  for (const std::string& name : *from) {
    if (auto error = requireDim(op, in.type, name)) return error;
    fromDims.push_back(in.type.dims[findDim(in.type, name)]);
  }
  for (const std::string& name : *to) {
    if (auto error = requireDim(op, out.type, name)) return error;
    toDims.push_back(out.type.dims[findDim(out.type, name)]);
  }
  int64_t fromCount = 1, toCount = 1;
  for (const Dim& dim : fromDims)
    fromCount *= dim.size;
  for (const Dim& dim : toDims)
    toCount *= dim.size;
  if (fromCount != toCount) return opError(op, "regroups {} elements into {}", fromCount, toCount);
  // Linear position within the regrouped block: row-major over `to` in listed order. Each
  // linear position maps to an operand offset through `from`, row-major in listed order.
  Strides linear(out.type.dims.size(), 0);
  int64_t stride = 1;
  for (size_t i = toDims.size(); i-- > 0;) {
    linear[findDim(out.type, toDims[i].name)] = stride;
    stride *= toDims[i].size;
  }
  std::vector<int64_t> fromOffsets = offsetsOf(fromDims, stridesOver(in.type, fromDims));
  // Untouched dims: by name, except names reused between `from` and `to`.
  Strides other = stridesOver(in.type, out.type.dims);
  for (size_t i = 0; i < out.type.dims.size(); ++i)
    if (llvm::is_contained(*to, out.type.dims[i].name)) other[i] = 0;
  Strides outStrides = rowMajorStrides(out.type);
  forEachIndex<3>(out.type.dims, {&outStrides, &other, &linear}, {0, 0, 0},
                  [&](const std::array<int64_t, 3>& at) {
                    out.data[at[0]] = in.data[at[1] + fromOffsets[at[2]]];
                  });
  return llvm::Error::success();
}

void Interpreter::copyWindow(const Tensor& in, Tensor& out, const std::string& inAxis,
                             const std::string& outAxis, int64_t offset) {
  std::vector<Dim> outer = dimsExcept(out.type, {outAxis});
  Strides inOuter = stridesOver(in.type, outer), outOuter = stridesOver(out.type, outer);
  int64_t inStride = rowMajorStrides(in.type)[findDim(in.type, inAxis)];
  int64_t outStride = rowMajorStrides(out.type)[findDim(out.type, outAxis)];
  int64_t inSize = in.type.dims[findDim(in.type, inAxis)].size;
  int64_t outSize = out.type.dims[findDim(out.type, outAxis)].size;
  int64_t begin = std::max<int64_t>(0, offset), end = std::min(outSize, inSize + offset);
  forEachIndex<2>(outer, {&outOuter, &inOuter}, {0, 0}, [&](const std::array<int64_t, 2>& at) {
    for (int64_t j = begin; j < end; ++j)
      out.data[at[0] + j * outStride] = in.data[at[1] + (j - offset) * inStride];
  });
}

llvm::Error Interpreter::window(const Op& op, Tensor& out) {
  const Tensor& in = operand(op, 0);
  auto from = string(op, "from"), to = string(op, "to");
  if (!from) return from.takeError();
  if (!to) return to.takeError();
  if (auto error = requireDim(op, in.type, *from)) return error;
  if (auto error = requireDim(op, out.type, *to)) return error;
  auto position = integer(op, op.kind == OpKind::Slice ? "start" : "before");
  if (!position) return position.takeError();
  int64_t inSize = in.type.dims[findDim(in.type, *from)].size;
  int64_t outSize = out.type.dims[findDim(out.type, *to)].size;
  if (op.kind == OpKind::Slice) {
    if (*position < 0 || *position + outSize > inSize)
      return opError(op, "window [{}, {}) is outside dim '{}' of size {}", *position,
                     *position + outSize, *from, inSize);
    copyWindow(in, out, *from, *to, -*position);
  } else {
    if (*position < 0 || *position + inSize > outSize)
      return opError(op, "padding {} elements of '{}' with {} before does not fit '{}' of size {}",
                     inSize, *from, *position, *to, outSize);
    copyWindow(in, out, *from, *to, *position);
  }
  return llvm::Error::success();
}

llvm::Error Interpreter::concat(const Op& op, Tensor& out) {
  auto from = names(op, "from");
  auto to = string(op, "to");
  if (!from) return from.takeError();
  if (!to) return to.takeError();
  if (from->size() != op.operands.size())
    return opError(op, "lists {} dims for {} operands", from->size(), op.operands.size());
  if (auto error = requireDim(op, out.type, *to)) return error;
  int64_t offset = 0;
  for (size_t k = 0; k < op.operands.size(); ++k) {
    const Tensor& in = operand(op, k);
    if (auto error = requireDim(op, in.type, (*from)[k])) return error;
    copyWindow(in, out, (*from)[k], *to, offset);
    offset += in.type.dims[findDim(in.type, (*from)[k])].size;
  }
  if (offset != out.type.dims[findDim(out.type, *to)].size)
    return opError(op, "concatenates {} elements into dim '{}' of size {}", offset, *to,
                   out.type.dims[findDim(out.type, *to)].size);
  return llvm::Error::success();
}

llvm::Error Interpreter::oneHot(const Op& op, Tensor& out) {
  const Tensor& ids = operand(op, 0);
  auto dim = string(op, "dim");
  if (!dim) return dim.takeError();
  if (auto error = requireDim(op, out.type, *dim)) return error;
  Strides idStrides = stridesOver(ids.type, out.type.dims), outStrides = rowMajorStrides(out.type);
  Strides position(out.type.dims.size(), 0);
  position[findDim(out.type, *dim)] = 1;
  idStrides[findDim(out.type, *dim)] = 0;
  forEachIndex<3>(out.type.dims, {&outStrides, &idStrides, &position}, {0, 0, 0},
                  [&](const std::array<int64_t, 3>& at) {
                    out.data[at[0]] = ids.data[at[1]] == double(at[2]) ? 1.0 : 0.0;
                  });
  return llvm::Error::success();
}

llvm::Error Interpreter::gather(const Op& op, Tensor& out) {
  const Tensor& table = operand(op, 0);
  const Tensor& ids = operand(op, 1);
  auto dim = string(op, "dim");
  if (!dim) return dim.takeError();
  if (auto error = requireDim(op, table.type, *dim)) return error;
  int position = findDim(table.type, *dim);
  int64_t rows = table.type.dims[position].size;
  int64_t rowStride = rowMajorStrides(table.type)[position];
  Strides tableStrides = stridesOver(table.type, out.type.dims);
  Strides idStrides = stridesOver(ids.type, out.type.dims);
  Strides outStrides = rowMajorStrides(out.type);
  if (int reused = findDim(out.type, *dim); reused >= 0)
    tableStrides[reused] = 0; // an ids dim that happens to share the gathered dim's name
  forEachIndex<3>(out.type.dims, {&outStrides, &tableStrides, &idStrides}, {0, 0, 0},
                  [&](const std::array<int64_t, 3>& at) {
                    double id = ids.data[at[2]];
                    out.data[at[0]] = id >= 0 && id < double(rows)
                                          ? table.data[at[1] + int64_t(id) * rowStride]
                                          : 0.0;
                  });
  return llvm::Error::success();
}

/// Per point of the other dims: the positions of a stable sort of the row, NaN first and then
/// descending, so that ties keep the lower position first.
llvm::Error Interpreter::topK(const Op& op, Tensor& out) {
  const Tensor& in = operand(op, 0);
  auto dim = string(op, "from"), to = string(op, "to");
  if (!dim) return dim.takeError();
  if (!to) return to.takeError();
  if (auto error = requireDim(op, in.type, *dim)) return error;
  if (auto error = requireDim(op, out.type, *to)) return error;
  int inAt = findDim(in.type, *dim), outAt = findDim(out.type, *to);
  int64_t rowSize = in.type.dims[size_t(inAt)].size, count = out.type.dims[size_t(outAt)].size;
  if (count > rowSize) return opError(op, "selects {} of {} elements", count, rowSize);
  std::vector<Dim> outer = dimsExcept(out.type, {*to});
  Strides inOuter = stridesOver(in.type, outer), outOuter = stridesOver(out.type, outer);
  int64_t inStride = rowMajorStrides(in.type)[size_t(inAt)];
  int64_t outStride = rowMajorStrides(out.type)[size_t(outAt)];
  std::vector<int64_t> order(size_t(rowSize), 0);
  forEachIndex<2>(outer, {&outOuter, &inOuter}, {0, 0}, [&](const std::array<int64_t, 2>& at) {
    const double* x = in.data.data() + at[1];
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      double u = x[a * inStride], v = x[b * inStride];
      return std::isnan(u) != std::isnan(v) ? std::isnan(u) : u > v;
    });
    for (int64_t j = 0; j < count; ++j)
      out.data[size_t(at[0] + j * outStride)] = double(order[size_t(j)]);
  });
  return llvm::Error::success();
}

llvm::Error Interpreter::dropout(const Op& op, Tensor& out) {
  const Tensor& in = operand(op, 0);
  Strides inStrides = stridesOver(in.type, out.type.dims), outStrides = rowMajorStrides(out.type);
  if (!opts.training) {
    forEachIndex<2>(out.type.dims, {&outStrides, &inStrides}, {0, 0},
                    [&](const std::array<int64_t, 2>& at) { out.data[at[0]] = in.data[at[1]]; });
    return llvm::Error::success();
  }
  auto rate = number(op, "rate");
  auto stream = string(op, "stream");
  if (!rate) return rate.takeError();
  if (!stream) return stream.takeError();
  uint64_t key = meshrt::streamKey(opts.seed, *stream + "#" + std::to_string(opts.step));
  double scale = *rate < 1 ? 1 / (1 - *rate) : 0.0;
  forEachIndex<2>(out.type.dims, {&outStrides, &inStrides}, {0, 0},
                  [&](const std::array<int64_t, 2>& at) {
                    bool keep = meshrt::dropoutKeep(key, uint64_t(at[0]), *rate);
                    out.data[at[0]] = keep ? in.data[at[1]] * scale : 0.0;
                  });
  return llvm::Error::success();
}

} // namespace

Tensor synthesizeInput(const ir::InputInfo& input, uint64_t seed) {
  Tensor tensor{input.type, std::vector<double>(size_t(elementCount(input.type)), 0.0)};
  uint64_t key = meshrt::streamKey(seed, "input/" + input.name);
  int64_t count = int64_t(tensor.data.size());
  if (input.type.dtype == DType::I32) {
    uint64_t bound = input.indexBound > 0 ? uint64_t(input.indexBound) : 2;
    bound = std::min<uint64_t>(bound, uint64_t(1) << 31);
    meshrt::forEachUniformIndex(key, 0, uint64_t(count), bound,
                                [&](uint64_t i, uint32_t value) { tensor.data[i] = value; });
  } else {
    meshrt::forEachNormal(key, 0, uint64_t(count),
                          [&](uint64_t i, double z) { tensor.data[i] = z; });
  }
  roundToType(tensor);
  return tensor;
}

Tensor initializeParam(const ir::ParamInfo& param, uint64_t seed) {
  auto tensor = initialize(param, seed);
  if (tensor) return std::move(*tensor);
  llvm::consumeError(tensor.takeError());
  return Tensor{param.type, std::vector<double>(size_t(elementCount(param.type)), 0.0)};
}

llvm::Expected<TensorMap> run(const ir::Function& fn, const TensorMap& inputs, const Options& opts,
                              const TensorMap& params) {
  return Interpreter(fn, inputs, opts, params).run();
}

llvm::Expected<double> trainStep(const ir::Function& fn, const TensorMap& inputs,
                                 const Options& opts, TensorMap& state, TensorMap* outputs) {
  if (fn.kind != ir::Function::Kind::Train || fn.outputs.empty())
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "'%s' is not a train block",
                                   fn.name.c_str());
  for (const ir::ParamInfo& param : fn.params)
    if (!state.count(param.path)) {
      auto initial = initialize(param, opts.seed);
      if (!initial) return initial.takeError();
      state[param.path] = std::move(*initial);
    }
  std::vector<std::pair<std::string, ir::ValueId>> updated;
  for (const ir::ParamUpdate& update : fn.updates) {
    if (update.param >= fn.params.size() || update.value >= fn.values.size() ||
        !(fn.typeOf(update.value) == fn.params[update.param].type))
      return llvm::createStringError(llvm::inconvertibleErrorCode(), "'%s': malformed param update",
                                     fn.name.c_str());
    updated.emplace_back("update " + fn.params[update.param].path, update.value);
  }
  Options stepOpts = opts;
  stepOpts.training = true;
  auto results = Interpreter(fn, inputs, stepOpts, state).run(updated);
  if (!results) return results.takeError();
  // All updates read the step's old values: apply them only once the step is done.
  for (const ir::ParamUpdate& update : fn.updates) {
    const std::string& path = fn.params[update.param].path;
    state[path] = std::move(results->at("update " + path));
  }
  if (outputs)
    for (const ir::OutputInfo& output : fn.outputs)
      (*outputs)[output.name] = results->at(output.name);
  const Tensor& loss = results->at(fn.outputs.front().name);
  if (loss.data.size() != 1)
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "'%s': the loss is not a scalar",
                                   fn.name.c_str());
  return loss.data.front();
}

} // namespace meshc::interp
