// The statement printer both targets share (KernelPrinter.h).
#include "codegen/KernelPrinter.h"

#include "codegen/Target.h"
#include "ir/OpTraits.h"

#include "meshrt/Random.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>
#include <llvm/ADT/StringRef.h>

#include <algorithm>
#include <cmath>

namespace meshc::codegen {

using ir::DType;
using ir::OpKind;
using kir::Scalar;

const char* dtypeEnum(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return "support::DType::F32";
  case DType::BF16:
    return "support::DType::BF16";
  case DType::F16:
    return "support::DType::F16";
  case DType::I32:
    return "support::DType::I32";
  }
  return "support::DType::F32";
}

std::string doubleLiteral(double value) {
  if (std::isinf(value)) return value > 0 ? "INFINITY" : "-INFINITY";
  if (std::isnan(value)) return "NAN";
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".eE") == std::string::npos) text += ".0";
  return text;
}

/// An f32 literal holding `value` rounded to f32 (the shortest text that round-trips).
std::string floatLiteral(double value) {
  float f = float(value);
  if (std::isinf(f)) return f > 0 ? "INFINITY" : "-INFINITY";
  if (std::isnan(f)) return "NAN";
  std::string text = fmt::format("{}", f);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text + "f";
}

namespace {

/// The op in f32 (`f32`: the float dtypes, a narrow one rounded once by the caller) or, for the
/// integer dtype, in double as the interpreter computes it (wrapped by the caller).
std::string computeExpr(const Scalar& s, const std::vector<std::string>& a,
                        const std::vector<DType>& types, bool f32) {
  auto d = [&](size_t i) { return f32 ? a[i] : fmt::format("double({})", a[i]); };
  auto fn = [&](const char* f32Name, const char* doubleName) {
    return f32 ? fmt::format("support::{}({})", f32Name, a[0])
               : fmt::format("{}({})", doubleName, d(0));
  };
  bool integer = types.size() >= 2 && types[0] == DType::I32 && types[1] == DType::I32;
  switch (s.op) {
  case OpKind::Neg:
    return fmt::format("-{}", a[0]);
  case OpKind::Abs:
    return fmt::format("std::fabs({})", a[0]);
  case OpKind::Exp:
    return fn("fexp", "std::exp");
  case OpKind::Log:
    return fn("flog", "std::log");
  case OpKind::Sqrt:
    return fn("fsqrt", "std::sqrt");
  case OpKind::Rsqrt:
    return f32 ? fmt::format("1.0f / support::fsqrt({})", a[0])
               : fmt::format("1.0 / std::sqrt({})", d(0));
  case OpKind::Square:
    return fmt::format("{0} * {0}", d(0));
  case OpKind::Tanh:
    return fn("ftanh", "std::tanh");
  case OpKind::Sigmoid:
    return f32 ? fmt::format("support::fsigmoid({})", a[0])
               : fmt::format("support::sigmoid({})", a[0]);
  case OpKind::Relu:
    return fmt::format("support::relu({})", a[0]);
  case OpKind::Gelu:
    return f32 ? fmt::format("support::fgelu({})", a[0]) : fmt::format("support::gelu({})", a[0]);
  case OpKind::Sin:
    return fn("fsin", "std::sin");
  case OpKind::Cos:
    return fn("fcos", "std::cos");
  case OpKind::Floor:
    return fn("ffloor", "std::floor");
  case OpKind::Ceil:
    return fn("fceil", "std::ceil");
  case OpKind::Round: // halves to even, as the interpreter
    return fn("fround", "std::nearbyint");
  case OpKind::Cast:
  case OpKind::StopGradient:
  case OpKind::Transpose:
  case OpKind::Broadcast: // the operand's missing dims have stride 0 in the loop
    return a[0];
  case OpKind::Add:
    return fmt::format("({} + {})", d(0), d(1));
  case OpKind::Sub:
    return fmt::format("({} - {})", d(0), d(1));
  case OpKind::Mul:
    return fmt::format("({} * {})", d(0), d(1));
  case OpKind::Div:
    if (integer) return fmt::format("support::divI32({}, {})", a[0], a[1]);
    return fmt::format("({} / {})", d(0), d(1));
  case OpKind::FloorDiv: // sema admits i32 alone; the float reading matches the interpreter's
    if (integer) return fmt::format("support::floorDivI32({}, {})", a[0], a[1]);
    return fmt::format("std::floor({} / {})", d(0), d(1));
  case OpKind::Mod:
    if (integer) return fmt::format("support::modI32({}, {})", a[0], a[1]);
    return fmt::format("({0} - {1} * std::floor({0} / {1}))", d(0), d(1));
  case OpKind::Pow:
    if (integer) return fmt::format("support::powI32({}, {})", a[0], a[1]);
    return f32 ? fmt::format("support::fpow({}, {})", a[0], a[1])
               : fmt::format("std::pow({}, {})", d(0), d(1));
  case OpKind::Maximum:
    return fmt::format("support::maximum({}, {})", a[0], a[1]);
  case OpKind::Minimum:
    return fmt::format("support::minimum({}, {})", a[0], a[1]);
  case OpKind::Lt:
    return fmt::format("support::flag({} < {})", a[0], a[1]);
  case OpKind::Le:
    return fmt::format("support::flag({} <= {})", a[0], a[1]);
  case OpKind::Gt:
    return fmt::format("support::flag({} > {})", a[0], a[1]);
  case OpKind::Ge:
    return fmt::format("support::flag({} >= {})", a[0], a[1]);
  case OpKind::Eq:
    return fmt::format("support::flag({} == {})", a[0], a[1]);
  case OpKind::Ne:
    return fmt::format("support::flag({} != {})", a[0], a[1]);
  case OpKind::Where:
    return fmt::format("support::where({}, {}, {})", a[0], a[1], a[2]);
  case OpKind::Call: // the user's function (its header is included by the source)
    return fmt::format("::{}({})", s.function, fmt::join(a, ", "));
  case OpKind::Input:
  case OpKind::Param:
  case OpKind::Literal:
  case OpKind::Iota:
  case OpKind::RandomNormal:
  case OpKind::TrainStep:
  case OpKind::RandomUniform:
  case OpKind::RandomInt:
  case OpKind::Einsum:
  case OpKind::ReduceSum:
  case OpKind::ReduceMean:
  case OpKind::ReduceMax:
  case OpKind::ReduceMin:
  case OpKind::LogSumExp:
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::LayerNorm:
  case OpKind::LayerNormGrad:
  case OpKind::Cumsum:
  case OpKind::Rename:
  case OpKind::Reshape:
  case OpKind::Slice:
  case OpKind::Concat:
  case OpKind::Pad:
  case OpKind::Shift:
  case OpKind::OneHot:
  case OpKind::Gather:
  case OpKind::TopK:
  case OpKind::Dropout: // not elementwise: lowerToKernels never puts it in a loop
    return a.empty() ? "0.0f" : a[0];
  }
  return a.empty() ? "0.0f" : a[0]; // an OpKind out of range
}

/// Compares and selects (the op table's result rules): computed on f32 values as they are.
bool isComparison(OpKind kind) {
  ir::ResultRule rule = ir::opTraits(kind).result;
  return rule == ir::ResultRule::Compare || rule == ir::ResultRule::Select;
}

} // namespace

std::vector<std::optional<IntegerRange>> integerRanges(const kir::Loop& loop) {
  std::vector<std::optional<IntegerRange>> ranges(loop.body.size());
  auto of = [&](int arg) -> std::optional<IntegerRange> {
    return arg >= 0 && size_t(arg) < ranges.size() ? ranges[size_t(arg)] : std::nullopt;
  };
  for (size_t k = 0; k < loop.body.size(); ++k) {
    const Scalar& s = loop.body[k];
    std::optional<IntegerRange>& r = ranges[k];
    if (s.kind == Scalar::Kind::Const) {
      // As printed: support::wrapI32 of an integral literal in range is the literal.
      if (s.dtype == DType::I32 && s.value == std::trunc(s.value) && std::fabs(s.value) < 0x1p31)
        r = IntegerRange{s.value, s.value};
      continue;
    }
    if (s.kind != Scalar::Kind::Compute) continue; // loads: any i32; dropout, step: floats
    if (isComparison(s.op) && ir::opTraits(s.op).result == ir::ResultRule::Compare) {
      r = IntegerRange{0, 1};
      continue;
    }
    if (s.dtype != DType::I32) continue;
    std::vector<IntegerRange> a;
    for (int arg : s.args) {
      if (std::optional<IntegerRange> ra = of(arg))
        a.push_back(*ra);
      else
        break;
    }
    auto corners = [](double x0, double x1, double y0, double y1) {
      double c[] = {x0 * y0, x0 * y1, x1 * y0, x1 * y1};
      return IntegerRange{*std::min_element(c, c + 4), *std::max_element(c, c + 4)};
    };
    switch (s.op) {
    case OpKind::Cast: // i32 to i32 (from a float the cast truncates: any i32)
    case OpKind::StopGradient:
    case OpKind::Transpose:
    case OpKind::Broadcast:
      if (a.size() == 1 && loop.body[size_t(s.args[0])].dtype == DType::I32) r = a[0];
      break;
    case OpKind::Neg:
      if (a.size() == 1) r = IntegerRange{-a[0].hi, -a[0].lo};
      break;
    case OpKind::Abs:
      if (a.size() == 1)
        r = IntegerRange{
            a[0].lo <= 0 && a[0].hi >= 0 ? 0 : std::min(std::fabs(a[0].lo), std::fabs(a[0].hi)),
            std::max(std::fabs(a[0].lo), std::fabs(a[0].hi))};
      break;
    case OpKind::Add:
      if (a.size() == 2) r = IntegerRange{a[0].lo + a[1].lo, a[0].hi + a[1].hi};
      break;
    case OpKind::Sub:
      if (a.size() == 2) r = IntegerRange{a[0].lo - a[1].hi, a[0].hi - a[1].lo};
      break;
    case OpKind::Mul:
      if (a.size() == 2) r = corners(a[0].lo, a[0].hi, a[1].lo, a[1].hi);
      break;
    case OpKind::Maximum:
      if (a.size() == 2) r = IntegerRange{std::max(a[0].lo, a[1].lo), std::max(a[0].hi, a[1].hi)};
      break;
    case OpKind::Minimum:
      if (a.size() == 2) r = IntegerRange{std::min(a[0].lo, a[1].lo), std::min(a[0].hi, a[1].hi)};
      break;
    case OpKind::Where: // the condition's range does not matter
      if (s.args.size() == 3 && of(s.args[1]) && of(s.args[2]))
        r = IntegerRange{std::min(of(s.args[1])->lo, of(s.args[2])->lo),
                         std::max(of(s.args[1])->hi, of(s.args[2])->hi)};
      break;
    default:
      break;
    }
    // Only ranges whose every integer a float holds exactly are of use (exactInF32).
    if (r && (r->lo < -0x1p24 || r->hi > 0x1p24)) r.reset();
  }
  return ranges;
}

std::string scalarExpression(const Scalar& s, const std::vector<std::string>& args,
                             const std::vector<DType>& argTypes, bool exactInF32) {
  if (exactInF32 && s.kind == Scalar::Kind::Compute && s.dtype == DType::I32 &&
      !isComparison(s.op)) {
    switch (s.op) {
    case OpKind::Neg:
    case OpKind::Mul:
      // + 0.0f turns f32's -0 (of -0 or 0 * -3) into the 0 an integer is.
      return fmt::format("({} + 0.0f)", computeExpr(s, args, argTypes, true));
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Abs:
    case OpKind::Maximum:
    case OpKind::Minimum:
    case OpKind::Cast:
    case OpKind::StopGradient:
    case OpKind::Transpose:
    case OpKind::Broadcast:
      return computeExpr(s, args, argTypes, true);
    default:
      break;
    }
  }
  switch (s.kind) {
  case Scalar::Kind::Load:
  case Scalar::Kind::Dropout:
    return "0.0f"; // spelled by loopBody
  case Scalar::Kind::Step:
    return "stepValue"; // float(step_), declared before the loop
  case Scalar::Kind::Const:
    if (s.dtype == DType::BF16 || s.dtype == DType::F16)
      return fmt::format("support::roundValue({}, {})", dtypeEnum(s.dtype), doubleLiteral(s.value));
    if (s.dtype == DType::I32) return fmt::format("support::wrapI32({})", doubleLiteral(s.value));
    return floatLiteral(s.value);
  case Scalar::Kind::Compute:
    break;
  }
  if (isComparison(s.op)) return computeExpr(s, args, argTypes, true);
  if (s.op == OpKind::Cast && s.dtype == DType::I32 && !argTypes.empty() &&
      argTypes[0] != DType::I32)
    return fmt::format("support::castToI32({})", args[0]);
  if (s.op == OpKind::Div && s.dtype == DType::I32 && argTypes.size() == 2 &&
      argTypes[0] == DType::I32 && argTypes[1] == DType::I32)
    return computeExpr(s, args, argTypes, false);
  if (s.op == OpKind::Pow && s.dtype == DType::I32) return computeExpr(s, args, argTypes, false);
  if ((s.op == OpKind::FloorDiv || s.op == OpKind::Mod) && s.dtype == DType::I32)
    return computeExpr(s, args, argTypes, false); // already wrapped to i32
  switch (s.dtype) {
  case DType::F32:
    if (s.op == OpKind::Call) return fmt::format("float({})", computeExpr(s, args, argTypes, true));
    return computeExpr(s, args, argTypes, true);
  case DType::BF16: // computed in f32 (vectorized), rounded once to the dtype
    return fmt::format("support::roundBF16({})", computeExpr(s, args, argTypes, true));
  case DType::F16:
    return fmt::format("support::roundF16({})", computeExpr(s, args, argTypes, true));
  case DType::I32:
    return fmt::format("support::wrapI32(double({}))", computeExpr(s, args, argTypes, false));
  }
  return computeExpr(s, args, argTypes, true);
}

std::string stepDeclaration(const kir::Loop& loop) {
  bool readsStep = llvm::any_of(
      loop.body, [](const Scalar& scalar) { return scalar.kind == Scalar::Kind::Step; });
  return readsStep ? "const float stepValue = float(step_);\n" : "";
}

CollapsedLoop collapseLoop(const kir::Loop& loop) {
  CollapsedLoop c;
  std::vector<kir::Shape*> all;
  for (const kir::Access& read : loop.reads)
    c.reads.push_back(read.strides);
  for (const kir::Store& store : loop.stores)
    c.stores.push_back(store.at.strides);
  for (const Scalar& scalar : loop.body)
    c.scalars.push_back(scalar.kind == Scalar::Kind::Dropout && scalar.read >= 0
                            ? scalar.strides // its global index: the points' RNG draws
                            : kir::Shape(loop.extents.size(), 0));
  for (kir::Shape& s : c.reads)
    all.push_back(&s);
  for (kir::Shape& s : c.stores)
    all.push_back(&s);
  for (kir::Shape& s : c.scalars)
    all.push_back(&s);
  c.extents = loop.extents;
  // Size-1 dims first, then adjacent dims every access walks as one.
  for (size_t d = c.extents.size(); d-- > 0;)
    if (c.extents[d] == 1 && c.extents.size() > 1) {
      c.extents.erase(c.extents.begin() + std::ptrdiff_t(d));
      for (kir::Shape* s : all)
        s->erase(s->begin() + std::ptrdiff_t(d));
    }
  for (size_t d = c.extents.size(); d-- > 1;) {
    bool merges = llvm::all_of(
        all, [&](const kir::Shape* s) { return (*s)[d - 1] == (*s)[d] * c.extents[d]; });
    if (!merges) continue;
    c.extents[d - 1] *= c.extents[d];
    c.extents.erase(c.extents.begin() + std::ptrdiff_t(d));
    for (kir::Shape* s : all) {
      (*s)[d - 1] = (*s)[d];
      s->erase(s->begin() + std::ptrdiff_t(d));
    }
  }
  return c;
}

std::string loopDataPointer(const kir::Buffer& buffer, const char* byteType) {
  return buffer.keepMask ? fmt::format("reinterpret_cast<{}*>({}.data())", byteType, buffer.name)
                         : buffer.name + ".data()";
}

std::string offsetExpression(const kir::Shape& strides) {
  std::vector<std::string> terms;
  for (size_t d = 0; d < strides.size(); ++d) {
    if (strides[d] == 0) continue;
    terms.push_back(strides[d] == 1 ? fmt::format("i{}", d)
                                    : fmt::format("i{} * {}", d, strides[d]));
  }
  return terms.empty() ? "0" : fmt::format("{}", fmt::join(terms, " + "));
}

std::string loopBody(const kir::Loop& loop, const CollapsedLoop& collapsed,
                     const ElementText& element, const ElementText& store,
                     const ElementText& keepMask) {
  std::string body;
  std::vector<std::optional<IntegerRange>> ranges = integerRanges(loop);
  for (size_t k = 0; k < loop.body.size(); ++k) {
    const Scalar& s = loop.body[k];
    std::string expr;
    if (s.kind == Scalar::Kind::Load) {
      expr = element(size_t(s.read), offsetExpression(collapsed.reads[size_t(s.read)]));
    } else if (s.kind == Scalar::Kind::Dropout) {
      // As the dropout kernel: keep ? x * (1 / (1 - rate)) in double, rounded once : 0.
      double scale = s.value < 1 ? 1 / (1 - s.value) : 0.0;
      // The keep test in integers (meshrt::dropoutThreshold) and the scaled value computed
      // either way (no floating-point op under a branch): the loop vectorizes. A kept mask's
      // byte (0 or 1) becomes the same all-ones or zero word.
      std::string mask = s.args.size() == 2 ? fmt::format("uint32_t(-int32_t(s{}))", s.args[1])
                         : keepMask         ? keepMask(k, offsetExpression(collapsed.scalars[k]))
                                            : "";
      if (mask.empty())
        mask = fmt::format("meshrt::dropoutKeepMask(inv{}, uint64_t(inv{} + {}), {}u)", s.read,
                           s.read + 1, offsetExpression(collapsed.scalars[k]),
                           meshrt::dropoutThreshold(s.value));
      body += fmt::format("const uint32_t m{} = {};\n", k, mask);
      expr = fmt::format("support::keepOrZero(m{}, float(double(s{}) * {}))", k, s.args[0],
                         doubleLiteral(scale));
    } else {
      std::vector<std::string> args;
      std::vector<DType> types;
      for (int a : s.args) {
        args.push_back(fmt::format("s{}", a));
        types.push_back(loop.body[size_t(a)].dtype);
      }
      expr = scalarExpression(s, args, types, ranges[k].has_value());
    }
    body += fmt::format("const float s{} = {};\n", k, expr);
  }
  for (size_t j = 0; j < loop.stores.size(); ++j)
    body += fmt::format("{} = {}{}{};\n", store(j, offsetExpression(collapsed.stores[j])),
                        loop.stores[j].keepBit ? "uint8_t(m" : "s", loop.stores[j].value,
                        loop.stores[j].keepBit ? " & 1u)" : "");
  return body;
}

namespace {

std::string list(const kir::Shape& values) {
  return fmt::format("{{{}}}", fmt::join(values, ", "));
}

/// Row-major strides of an operand over its own dims (ids into the GEMM's dims).
kir::Shape ownStrides(const kir::Gemm& gemm, const std::vector<int64_t>& dims) {
  kir::Shape strides(dims.size());
  int64_t stride = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= gemm.sizes[size_t(dims[i])];
  }
  return strides;
}

/// Strides of the operand with `dims` over the GEMM dims `group` (0 where it lacks one).
kir::Shape stridesOver(const kir::Gemm& gemm, const std::vector<int64_t>& dims,
                       const std::vector<int64_t>& group) {
  kir::Shape own = ownStrides(gemm, dims), strides;
  for (int64_t g : group) {
    auto it = llvm::find(dims, g);
    strides.push_back(it == dims.end() ? 0 : own[size_t(it - dims.begin())]);
  }
  return strides;
}

} // namespace

std::string gemmDims(const kir::Gemm& gemm) {
  if (gemm.operands.size() != 2) return "";
  const auto& a = gemm.operandDims[0];
  const auto& b = gemm.operandDims[1];
  const auto& out = gemm.outDims;
  std::vector<int64_t> batch, m, n, k;
  for (int64_t dim : out) {
    bool inA = llvm::is_contained(a, dim), inB = llvm::is_contained(b, dim);
    if (inA && inB)
      batch.push_back(dim);
    else if (inA)
      m.push_back(dim);
    else if (inB)
      n.push_back(dim);
    else
      return "";
  }
  for (int64_t dim : a)
    if (!llvm::is_contained(out, dim)) {
      if (!llvm::is_contained(b, dim)) return ""; // a dim summed within one operand
      k.push_back(dim);
    }
  for (int64_t dim : b)
    if (!llvm::is_contained(out, dim) && !llvm::is_contained(a, dim)) return "";
  auto sizes = [&](const std::vector<int64_t>& group) {
    kir::Shape values;
    for (int64_t dim : group)
      values.push_back(gemm.sizes[size_t(dim)]);
    return values;
  };
  std::vector<std::pair<const char*, kir::Shape>> fields = {
      {"batch", sizes(batch)},
      {"m", sizes(m)},
      {"n", sizes(n)},
      {"k", sizes(k)},
      {"aBatch", stridesOver(gemm, a, batch)},
      {"aM", stridesOver(gemm, a, m)},
      {"aK", stridesOver(gemm, a, k)},
      {"bBatch", stridesOver(gemm, b, batch)},
      {"bK", stridesOver(gemm, b, k)},
      {"bN", stridesOver(gemm, b, n)},
      {"outBatch", stridesOver(gemm, out, batch)},
      {"outM", stridesOver(gemm, out, m)},
      {"outN", stridesOver(gemm, out, n)}};
  std::vector<std::string> initializers;
  for (const auto& [field, values] : fields)
    initializers.push_back(fmt::format(".{} = {}", field, list(values)));
  return fmt::format("{{{}}}", fmt::join(initializers, ", "));
}

std::string einsumGenericArgs(const kir::Gemm& gemm, const kir::KernelFunction& fn) {
  std::vector<int64_t> contracted;
  for (const auto& dims : gemm.operandDims)
    for (int64_t dim : dims)
      if (!llvm::is_contained(gemm.outDims, dim) && !llvm::is_contained(contracted, dim))
        contracted.push_back(dim);
  std::vector<std::string> pointers, outer, inner;
  kir::Shape outSizes, contractedSizes;
  for (int64_t dim : gemm.outDims)
    outSizes.push_back(gemm.sizes[size_t(dim)]);
  for (int64_t dim : contracted)
    contractedSizes.push_back(gemm.sizes[size_t(dim)]);
  for (size_t k = 0; k < gemm.operands.size(); ++k) {
    pointers.push_back(fn.buffers[size_t(gemm.operands[k])].name + ".data()");
    outer.push_back(list(stridesOver(gemm, gemm.operandDims[k], gemm.outDims)));
    inner.push_back(list(stridesOver(gemm, gemm.operandDims[k], contracted)));
  }
  return fmt::format("{}, {}, {{{}}}, {{{}}}, {{{}}}", list(outSizes), list(contractedSizes),
                     fmt::join(pointers, ", "), fmt::join(outer, ", "), fmt::join(inner, ", "));
}

std::string groupMember(const std::vector<std::string>& axes) {
  return "group_" + fmt::format("{}", fmt::join(axes, "_"));
}

//===------------------------------------------------------------------------------------------===//
// Statements
//===------------------------------------------------------------------------------------------===//

std::string StatementPrinter::signature(const kir::Subroutine& sub) const {
  std::vector<bool> written(fn.buffers.size(), false);
  for (const kir::Stmt& stmt : sub.body)
    for (kir::BufferId id : kir::writesOf(stmt))
      written[size_t(id)] = true;
  std::vector<std::string> parameters;
  for (kir::BufferId id : sub.parameters)
    parameters.push_back(
        fmt::format("support::{} {}", written[size_t(id)] ? "View" : "ConstView", name(id)));
  for (size_t k = 0; k < sub.textParameters; ++k)
    parameters.push_back(fmt::format("const char* t{}", k));
  return fmt::format("{}({})", sub.name, fmt::join(parameters, ", "));
}

std::string StatementPrinter::print(const std::vector<kir::Stmt>& stmts) {
  if (declared.size() != fn.buffers.size()) newScope();
  std::string out;
  for (size_t k = 0; k < stmts.size(); ++k)
    out += statement(stmts[k], k);
  return out;
}

/// The arguments of arena_.view / slot / copy for `buffer`: its byte offset (and `count`).
/// `microbatches`: the step's count (a buffer with fewer copies reuses them in turn, 1F1B).
static std::string arenaSlot(const kir::Buffer& buffer, int64_t microbatches,
                             const std::string& count = "") {
  std::string offset =
      buffer.copies <= 1 ? fmt::format("{}", buffer.offset)
      // One copy per microbatch (a pipeline schedule's kept activation) ...
      : buffer.copies >= microbatches
          ? fmt::format("{} + size_t(microbatch_) * {}", buffer.offset, kir::copyStride(buffer))
          // ... or per microbatch in flight on the stage (1F1B), reused in turn.
          : fmt::format("{} + size_t(microbatch_ % {}) * {}", buffer.offset, buffer.copies,
                        kir::copyStride(buffer));
  if (buffer.stages == 0) return count.empty() ? offset : offset + ", " + count;
  // Held on some pipeline stages only, in their arenas: elsewhere an empty view.
  std::string held = fmt::format("((uint64_t({:#x}) >> stage_) & 1)", buffer.stages);
  std::string out = fmt::format("{} ? {} : 0", held, offset);
  return count.empty() ? out : fmt::format("{}, {} ? {} : 0", out, held, count);
}

std::string StatementPrinter::declarations(const std::vector<kir::BufferId>& ids) {
  std::string out;
  for (kir::BufferId id : ids)
    out += declare(id, false);
  return out;
}

std::string StatementPrinter::declare(kir::BufferId id, bool zero) {
  if (declared[size_t(id)]) return "";
  declared[size_t(id)] = true;
  const kir::Buffer& buffer = fn.buffers[size_t(id)];
  switch (buffer.storage) {
  case kir::Storage::Input:
    return fmt::format("const support::Buffer& {} = inputs.{}.data;\n", buffer.name,
                       inputFields.at(size_t(buffer.index)));
  case kir::Storage::Param:
    if (writers[size_t(id)] > 0) // an update written in place
      return fmt::format("support::View {}({}); // updated in place\n", buffer.name,
                         paramMembers.at(size_t(buffer.index)));
    return fmt::format("const support::Buffer& {} = {};\n", buffer.name,
                       paramMembers.at(size_t(buffer.index)));
  case kir::Storage::Arena:
    return fmt::format("support::View {} = arena_.{}({});\n", buffer.name, zero ? "slot" : "view",
                       arenaSlot(buffer, fn.microbatches.count, std::to_string(buffer.elements)));
  case kir::Storage::Persistent:
    return fmt::format("support::View {} = persistent_.{}({}, {});\n", buffer.name,
                       zero ? "slot" : "view", buffer.offset, buffer.elements);
  case kir::Storage::Argument:
    break; // a parameter of the subroutine being printed
  }
  return "";
}

std::string StatementPrinter::statement(const kir::Stmt& stmt, size_t index) {
  std::string out = "\n";
  for (const std::string& source : stmt.sources)
    out += fmt::format("// {}\n", source);
  if (traced) out += traceProbe(stmt);
  for (kir::BufferId id : kir::readsOf(stmt))
    out += declare(id, false);
  // Pipeline stages (SplitStages.h): a statement of some stages only runs on their ranks; its
  // buffers are declared outside the guard, for the statements after it.
  std::string guard = stageGuard(stmt);
  if (const kir::Copy* c = std::get_if<kir::Copy>(&stmt.node)) {
    if (guard.empty()) return out + copy(*c);
    out += declare(c->to, false); // first: copy() declares what is not declared yet
    return out + guard + copy(*c) + "}\n";
  }
  for (kir::BufferId id : kir::writesOf(stmt)) {
    if (stmt.zeroFirst && fn.buffers[size_t(id)].storage == kir::Storage::Argument)
      out += fmt::format("support::zero({});\n", name(id)); // the caller's slot, as it was
    out += declare(id, stmt.zeroFirst);
  }
  const auto* started = std::get_if<kir::Collective>(&stmt.node);
  if (!guard.empty() && started && started->phase == kir::Collective::Phase::Start) {
    // The request outlives the guard: its wait is another (equally guarded) statement.
    std::string start = collective(*started);
    if (llvm::StringRef(start).startswith("auto ")) start.erase(0, 5);
    return out + fmt::format("meshrt::Request request{};\n", started->request) + guard + start +
           "}\n";
  }
  out += guard;
  struct Visitor {
    StatementPrinter& p;
    size_t index;
    std::string operator()(const kir::Loop& loop) const {
      std::string invariants;
      for (size_t k = 0; k < loop.invariants.size(); ++k)
        invariants += fmt::format("const auto inv{} = {};\n", k, p.argument(loop.invariants[k]));
      return p.target.loop(loop, p.fn, invariants, p.file);
    }
    std::string operator()(const kir::Gemm& gemm) const {
      return p.target.gemm(gemm, p.fn, p.file);
    }
    std::string operator()(const kir::Call& call) const { return p.call(call); }
    std::string operator()(const kir::Collective& c) const { return p.collective(c); }
    std::string operator()(const kir::Copy& c) const { return p.copy(c); }
    std::string operator()(const kir::Invoke& invoke) const {
      std::vector<std::string> arguments;
      for (kir::BufferId id : invoke.arguments)
        arguments.push_back(p.name(id));
      for (const std::string& text : invoke.texts)
        arguments.push_back(fmt::format("\"{}\"", text));
      return fmt::format("{}({});\n", p.fn.subroutines.at(size_t(invoke.subroutine)).name,
                         fmt::join(arguments, ", "));
    }
  };
  return out + std::visit(Visitor{*this, index}, stmt.node) + (guard.empty() ? "" : "}\n");
}

std::string stageGuard(const kir::KernelFunction& fn, uint64_t mask) {
  uint64_t every = fn.stages.count >= 64 ? ~uint64_t(0) : (uint64_t(1) << fn.stages.count) - 1;
  if (fn.stages.count <= 1 || mask == 0 || (mask & every) == every) return "";
  return fmt::format("if ((uint64_t({:#x}) >> stage_) & 1) {{\n", mask);
}

std::string StatementPrinter::stageGuard(const kir::Stmt& stmt) const {
  return codegen::stageGuard(fn, stmt.stageMask);
}

namespace {

/// "file:line:col" of a source comment ("layers.mesh:24:10 layer_norm -> n"), and its op.
std::pair<std::string, std::string> locationAndOp(const std::string& source) {
  size_t space = source.find(' ');
  if (space == std::string::npos) return {source, ""};
  size_t end = source.find(' ', space + 1);
  return {source.substr(0, space), source.substr(space + 1, end - space - 1)};
}

} // namespace

std::string StatementPrinter::traceProbe(const kir::Stmt& stmt) {
  const kir::Stmt* first = &stmt;
  if (const auto* invoke = std::get_if<kir::Invoke>(&stmt.node)) {
    const kir::Subroutine& sub = fn.subroutines.at(size_t(invoke->subroutine));
    if (!sub.body.empty()) first = &sub.body.front();
  }
  auto [where, op] = first->sources.empty() ? std::pair<std::string, std::string>()
                                            : locationAndOp(first->sources.front());
  // Collectives are recorded by meshrt, named by this site (a wait by its start's); a
  // subroutine's statements by its own probes.
  if (const auto* c = std::get_if<kir::Collective>(&stmt.node)) {
    if (c->phase == kir::Collective::Phase::Start) startLocations[c->request] = where;
    if (c->phase == kir::Collective::Phase::Wait && where.empty())
      where = startLocations[c->request];
  }
  if (std::holds_alternative<kir::Collective>(stmt.node) ||
      std::holds_alternative<kir::Invoke>(stmt.node))
    return fmt::format("MESHRT_TRACE_SITE(\"{}\");\n", where);
  // A stage transfer is communication only: meshrt records its send or recv (named by what it
  // carries, "to the stages that read x"); an op group around it would count the wait twice.
  if (const auto* call = std::get_if<kir::Call>(&stmt.node);
      call && (call->callee == kir::Callee::StageTransfer ||
               call->callee == kir::Callee::StageTransferStarted))
    return fmt::format("MESHRT_TRACE_SITE(\"{}\");\n",
                       stmt.sources.empty() ? "" : stmt.sources.front());
  std::string kind = std::holds_alternative<kir::Loop>(stmt.node)   ? "loop"
                     : std::holds_alternative<kir::Gemm>(stmt.node) ? "gemm"
                     : std::holds_alternative<kir::Copy>(stmt.node) ? "copy"
                     : !op.empty()                                  ? op
                                                                    : "call";
  return fmt::format("MESHRT_TRACE(\"{}\", \"{}\", \"{}\");\n", kind, where,
                     plan::phaseName(stmt.phase));
}

std::string StatementPrinter::copy(const kir::Copy& c) {
  const kir::Buffer& to = fn.buffers[size_t(c.to)];
  if (!declared[size_t(c.to)] && to.storage == kir::Storage::Arena) {
    declared[size_t(c.to)] = true;
    return fmt::format("support::View {} = arena_.copy({}, {});\n", to.name,
                       arenaSlot(to, fn.microbatches.count), name(c.from));
  }
  std::string out = declare(c.to, false);
  return out + fmt::format("support::copyValues({}, {});\n", name(c.to), name(c.from));
}

std::string StatementPrinter::argument(const kir::Arg& arg) {
  auto start = [&](std::vector<std::string> axes, int64_t size) {
    // The microbatch loop splits the dim innermost: this microbatch's rows of the rank's rows.
    std::string microbatch;
    if (!axes.empty() && axes.back() == kir::kMicrobatchAxis) {
      axes.pop_back();
      microbatch = fmt::format("microbatch_ * {}", size);
      size *= fn.microbatches.count;
    }
    std::vector<std::string> quoted;
    for (const std::string& axis : axes)
      quoted.push_back(fmt::format("\"{}\"", axis));
    std::string rank = axes.empty() ? ""
                                    : fmt::format("support::shardStart(world_, {{{}}}, {})",
                                                  fmt::join(quoted, ", "), size);
    if (microbatch.empty()) return rank.empty() ? std::string("0") : rank;
    return rank.empty() ? fmt::format("({})", microbatch)
                        : fmt::format("({} + {})", rank, microbatch);
  };
  switch (arg.kind) {
  case kir::Arg::Kind::Data:
    return name(arg.buffer) + ".data()";
  case kir::Arg::Kind::View:
    return name(arg.buffer);
  case kir::Arg::Kind::Ints: // a constant: nothing is allocated when run() calls the kernel
    return file.shape(arg.ints);
  case kir::Arg::Kind::Int:
    return fmt::format("{}", int64_t(arg.value));
  case kir::Arg::Kind::Real:
    return doubleLiteral(arg.value);
  case kir::Arg::Kind::ShardStart:
    return start(arg.names, int64_t(arg.value));
  case kir::Arg::Kind::BlockIndex: {
    if (arg.names == std::vector<std::string>{kir::kMicrobatchAxis}) return "microbatch_";
    std::vector<std::string> quoted;
    for (const std::string& axis : arg.names)
      quoted.push_back(fmt::format("\"{}\"", axis));
    return fmt::format("support::blockIndex(world_, {{{}}})", fmt::join(quoted, ", "));
  }
  case kir::Arg::Kind::GlobalBase: {
    std::vector<std::string> terms;
    if (arg.value != 0 || arg.starts.empty())
      terms.push_back(fmt::format("{}", int64_t(arg.value)));
    for (size_t d = 0; d < arg.starts.size() && d < arg.ints.size(); ++d)
      if (!arg.starts[d].first.empty() && arg.ints[d] != 0)
        terms.push_back(
            fmt::format("{} * {}", start(arg.starts[d].first, arg.starts[d].second), arg.ints[d]));
    if (terms.empty()) terms.push_back("0");
    return fmt::format("int64_t({})", fmt::join(terms, " + "));
  }
  case kir::Arg::Kind::Shard: {
    std::vector<std::string> starts;
    for (const auto& [axes, size] : arg.starts)
      starts.push_back(start(axes, size));
    return fmt::format("meshrt::kernels::Shard{{meshrt::kernels::Dims{}, "
                       "meshrt::kernels::Dims{{{}}}, meshrt::kernels::Dims{}}}",
                       list(arg.ints), fmt::join(starts, ", "), list(arg.ints2));
  }
  case kir::Arg::Kind::Group:
    groups.insert(arg.names);
    return groupMember(arg.names);
  case kir::Arg::Kind::GroupPointer:
    if (arg.names.empty()) return "nullptr";
    groups.insert(arg.names);
    return "&" + groupMember(arg.names);
  case kir::Arg::Kind::Stream:
  case kir::Arg::Kind::StreamKey: {
    std::string text = arg.textParameter >= 0 ? fmt::format("t{}", arg.textParameter)
                                              : fmt::format("\"{}\"", arg.text);
    bool stepKeyed = arg.value != 0;
    if (arg.kind == kir::Arg::Kind::StreamKey) // no string built per step
      return stepKeyed ? fmt::format("meshrt::stepStreamKey(seed_, {}, uint64_t(step_))", text)
                       : fmt::format("meshrt::streamKey(seed_, {})", text);
    if (stepKeyed) text = fmt::format("std::string({}) + \"#\" + std::to_string(step_)", text);
    return text;
  }
  case kir::Arg::Kind::Enum:
    return "support::" + arg.text;
  case kir::Arg::Kind::Text:
    return arg.text;
  }
  return "";
}

std::string StatementPrinter::call(const kir::Call& c) {
  std::vector<std::string> args;
  for (const kir::Arg& arg : c.args)
    args.push_back(argument(arg));
  return fmt::format("support::{}({});\n", kir::calleeSpelling(c.callee), fmt::join(args, ", "));
}

std::string FileScope::shape(const kir::Shape& values) {
  auto [it, added] = shapeIndex.try_emplace(values, shapes.size());
  if (added) shapes.push_back(values);
  return fmt::format("kShape{}", it->second);
}

std::string FileScope::function(const std::string& parameters, const std::string& body) {
  auto [it, added] = functionIndex.try_emplace({parameters, body}, functions.size());
  if (added) functions.emplace_back(parameters, body);
  return fmt::format("loop{}", it->second);
}

std::string FileScope::einsum(const std::string& spec) {
  auto [it, added] = einsumIndex.try_emplace(spec, einsums.size());
  if (added) einsums.push_back(spec);
  return fmt::format("kEinsum{}", it->second);
}

std::string FileScope::causalEinsum(const std::string& args) {
  auto [it, added] = causalIndex.try_emplace(args, causals.size());
  if (added) causals.push_back(args);
  return fmt::format("kCausal{}", it->second);
}

std::string FileScope::constants(const char* linkage) const {
  std::string out;
  for (size_t k = 0; k < shapes.size(); ++k)
    out += fmt::format("{}const support::Shape kShape{} = {};\n", linkage, k, list(shapes[k]));
  for (size_t k = 0; k < einsums.size(); ++k)
    out += fmt::format("{}const support::SharedEinsum kEinsum{}({});\n", linkage, k, einsums[k]);
  for (size_t k = 0; k < causals.size(); ++k)
    out += fmt::format("{}const support::CausalEinsum kCausal{}({});\n", linkage, k, causals[k]);
  return out;
}

std::string FileScope::definitions() const {
  std::string out = constants("static ");
  if ((!shapes.empty() || !einsums.empty() || !causals.empty()) && !functions.empty()) out += "\n";
  // Not inlined: each copy would be compiled again, which is what outlining saves.
  for (size_t k = 0; k < functions.size(); ++k)
    out += fmt::format("[[gnu::noinline]] static void loop{}({}) {{\n{}}}\n\n", k,
                       functions[k].first, functions[k].second);
  return out;
}

std::string FileScope::declarations() const {
  std::string out;
  for (size_t k = 0; k < shapes.size(); ++k)
    out += fmt::format("extern const support::Shape kShape{};\n", k);
  for (size_t k = 0; k < einsums.size(); ++k)
    out += fmt::format("extern const support::SharedEinsum kEinsum{};\n", k);
  for (size_t k = 0; k < causals.size(); ++k)
    out += fmt::format("extern const support::CausalEinsum kCausal{};\n", k);
  for (size_t k = 0; k < functions.size(); ++k)
    out += fmt::format("void loop{}({});\n", k, functions[k].first);
  return out;
}

std::string FileScope::constantDefinitions() const {
  // The declarations (declarations(), in the parts' header) give these external linkage.
  return constants("");
}

std::string FileScope::functionDefinition(size_t k) const {
  return fmt::format("[[gnu::noinline]] void loop{}({}) {{\n{}}}\n\n", k, functions[k].first,
                     functions[k].second);
}

std::string StatementPrinter::collective(const kir::Collective& c) {
  groups.insert(c.axes);
  std::string group = groupMember(c.axes);
  const char* reduceOp = c.kind == plan::CollectiveKind::AllReduceMax   ? "Max"
                         : c.kind == plan::CollectiveKind::AllReduceMin ? "Min"
                                                                        : "Sum";
  std::vector<std::string> views;
  for (kir::BufferId id : c.buffers)
    views.push_back(name(id));
  switch (c.phase) {
  case kir::Collective::Phase::Start:
    return fmt::format(
        "auto request{} = support::startAllReduce({}, {{{}}}, meshrt::ReduceOp::{});\n", c.request,
        group, fmt::join(views, ", "), reduceOp);
  case kir::Collective::Phase::Wait:
    return fmt::format("{}.wait(request{});\n", group, c.request);
  case kir::Collective::Phase::Blocking:
    break;
  }
  if (views.size() == 1)
    return fmt::format("{0}.allReduce({1}.data(), {1}.size(), meshrt::ReduceOp::{2});\n", group,
                       views[0], reduceOp);
  return fmt::format("support::allReduceBucket({}, {{{}}});\n", group, fmt::join(views, ", "));
}

} // namespace meshc::codegen
