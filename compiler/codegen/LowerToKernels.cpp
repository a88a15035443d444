// SPMD IR -> kernel IR (LowerToKernels.h).
//
// Local semantics the generated code relies on (docs/planner.md, "Rules per op"): every compute
// op of the SPMD IR runs on local shards in their local layout; ops that see global positions
// (iota, one_hot, gather, slice/pad/concat, RNG fills, dropout) add this rank's shard start;
// mean divides by the GLOBAL count (its partial sums are resolved later); softmax, log_softmax,
// layer_norm, logsumexp, cumsum and shift along a split dim communicate inside the op, over the
// subgroup of that dim's axes (the in-place collectives the lowering lists right after such an
// op describe exactly that communication and are absorbed into it).
#include "codegen/LowerToKernels.h"

#include "codegen/FormMicrobatchLoop.h"
#include "codegen/SplitStages.h"
#include "interp/ScalarMath.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>

#include <map>

namespace meshc::kir {
namespace {

using ir::OpKind;
using ir::TensorType;
using plan::CollectiveKind;
using plan::SpmdOp;
using plan::SpmdValueId;

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

double numberAttr(const SpmdOp& op, const std::string& name, double fallback) {
  const ir::AttrValue* value = op.attr(name);
  if (value && std::holds_alternative<double>(*value)) return std::get<double>(*value);
  if (value && std::holds_alternative<int64_t>(*value)) return double(std::get<int64_t>(*value));
  return fallback;
}

std::string stringAttr(const SpmdOp& op, const std::string& name) {
  const ir::AttrValue* value = op.attr(name);
  if (value && std::holds_alternative<std::string>(*value)) return std::get<std::string>(*value);
  if (value && std::holds_alternative<std::vector<std::string>>(*value)) {
    const auto& names = std::get<std::vector<std::string>>(*value);
    if (names.size() == 1) return names.front();
  }
  return "";
}

std::vector<std::string> namesAttr(const SpmdOp& op, const std::string& name) {
  const ir::AttrValue* value = op.attr(name);
  if (value && std::holds_alternative<std::vector<std::string>>(*value))
    return std::get<std::vector<std::string>>(*value);
  if (value && std::holds_alternative<std::string>(*value)) return {std::get<std::string>(*value)};
  return {};
}

/// How an SPMD compute op is lowered: one switch over every op kind (no default, so that a new
/// op is a compile-time warning here).
enum class Lowering { Source, Elementwise, Einsum, Reduce, Along, Other };

Lowering loweringOf(OpKind kind) {
  switch (kind) {
  case OpKind::Input:
  case OpKind::Param:
    return Lowering::Source;
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
  case OpKind::Broadcast:
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
  case OpKind::Where:
  case OpKind::Call:
  case OpKind::Literal:
  case OpKind::TrainStep:
    return Lowering::Elementwise;
  case OpKind::Einsum:
    return Lowering::Einsum;
  case OpKind::ReduceSum:
  case OpKind::ReduceMean:
  case OpKind::ReduceMax:
  case OpKind::ReduceMin:
  case OpKind::LogSumExp:
    return Lowering::Reduce;
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::LayerNorm:
  case OpKind::LayerNormGrad:
  case OpKind::Cumsum:
  case OpKind::Shift:
    return Lowering::Along;
  case OpKind::Iota:
  case OpKind::RandomNormal:
  case OpKind::RandomUniform:
  case OpKind::RandomInt:
  case OpKind::Rename:
  case OpKind::Reshape:
  case OpKind::Slice:
  case OpKind::Concat:
  case OpKind::Pad:
  case OpKind::OneHot:
  case OpKind::Gather:
  case OpKind::TopK:
  case OpKind::Dropout:
    return Lowering::Other;
  }
  return Lowering::Other;
}

class Lowerer {
public:
  Lowerer(const ir::Function& irFn, const plan::SpmdFunction& fn) : irFn(irFn), fn(fn) {}

  llvm::Expected<KernelFunction> lower();

private:
  const TensorType& local(SpmdValueId id) const { return fn.values[id].localType; }
  const TensorType& global(SpmdValueId id) const { return fn.values[id].globalType; }
  const plan::TensorLayout& layout(SpmdValueId id) const { return fn.values[id].layout; }

  llvm::Error unsupported(const SpmdOp& op, const std::string& what) const {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "%s",
                                   fmt::format("{}:{}:{}: code generation does not support {}",
                                               op.loc.file, op.loc.line, op.loc.col, what)
                                       .c_str());
  }

  // Arguments.
  Arg data(SpmdValueId id) const { return Arg{.kind = Arg::Kind::Data, .buffer = bufferOf[id]}; }
  Arg view(SpmdValueId id) const { return Arg{.kind = Arg::Kind::View, .buffer = bufferOf[id]}; }
  static Arg ints(Shape values) { return Arg{.kind = Arg::Kind::Ints, .ints = std::move(values)}; }
  static Arg integer(int64_t value) { return Arg{.kind = Arg::Kind::Int, .value = double(value)}; }
  static Arg real(double value) { return Arg{.kind = Arg::Kind::Real, .value = value}; }
  static Arg enumerator(std::string text) {
    return Arg{.kind = Arg::Kind::Enum, .text = std::move(text)};
  }
  static Arg text(std::string text) {
    return Arg{.kind = Arg::Kind::Text, .text = std::move(text)};
  }
  static Arg group(const plan::AxisList& axes) {
    return Arg{.kind = Arg::Kind::Group, .names = axes};
  }
  static Arg groupPointer(const plan::AxisList& axes) {
    return Arg{.kind = Arg::Kind::GroupPointer, .names = axes};
  }
  /// The axes `id`'s dim `d` is split over, for positions in the whole step: under
  /// microbatching, the microbatched dim is split by the loop too, innermost (kMicrobatchAxis).
  plan::AxisList positionAxes(SpmdValueId id, size_t d) const {
    plan::AxisList axes = layout(id).dimAxes[d];
    if (fn.microbatching.count > 1 && local(id).dims[d].name == fn.microbatching.dim)
      axes.push_back(kMicrobatchAxis);
    return axes;
  }
  /// `id`'s global type in the whole step (the microbatched dim at its full size): what global
  /// indices, and so the RNG's draws, are counted in.
  TensorType stepGlobal(SpmdValueId id) const {
    TensorType type = global(id);
    for (ir::Dim& dim : type.dims)
      if (fn.microbatching.count > 1 && dim.name == fn.microbatching.dim)
        dim.size *= fn.microbatching.count;
    return type;
  }
  /// This rank's shard start of `id` along `dim` (an Int 0 when the dim is not split).
  Arg shardStart(SpmdValueId id, const std::string& dim) const {
    int position = local(id).findDim(dim);
    if (position < 0) return integer(0);
    plan::AxisList axes = positionAxes(id, size_t(position));
    if (axes.empty()) return integer(0);
    return Arg{.kind = Arg::Kind::ShardStart,
               .value = double(local(id).dims[size_t(position)].size),
               .names = axes};
  }
  std::vector<std::pair<std::vector<std::string>, int64_t>> starts(SpmdValueId id) const {
    std::vector<std::pair<std::vector<std::string>, int64_t>> result;
    for (size_t d = 0; d < local(id).dims.size(); ++d)
      result.emplace_back(positionAxes(id, d), local(id).dims[d].size);
    return result;
  }
  Arg shard(SpmdValueId id) const {
    return Arg{.kind = Arg::Kind::Shard,
               .ints = sizesOf(stepGlobal(id).dims),
               .ints2 = sizesOf(local(id).dims),
               .starts = starts(id)};
  }
  Arg globalBase(SpmdValueId id) const {
    return Arg{.kind = Arg::Kind::GlobalBase,
               .ints = rowMajorStrides(stepGlobal(id)),
               .starts = starts(id)};
  }
  Arg streamKey(const SpmdOp& op) const {
    Arg key = stream(op);
    key.kind = Arg::Kind::StreamKey;
    return key;
  }
  Arg stream(const SpmdOp& op) const {
    return Arg{.kind = Arg::Kind::Stream,
               .value = fn.kind == ir::Function::Kind::Train ? 1.0 : 0.0,
               .text = stringAttr(op, "stream")};
  }

  std::string source(const SpmdOp& op) const {
    const std::string& valueName = fn.values[op.result].name;
    const char* what = op.kind == SpmdOp::Kind::Collective
                           ? plan::collectiveName(op.collective.kind)
                           : ir::opSpelling(op.computeKind);
    return fmt::format("{}:{}:{} {}{}{}{}", op.loc.file, op.loc.line, op.loc.col, what,
                       valueName.empty() ? "" : " -> ", valueName,
                       op.note.empty() ? "" : " (" + op.note + ")");
  }

  /// A fresh arena buffer for `id`.
  BufferId allocate(SpmdValueId id) {
    Buffer buffer;
    buffer.name = fmt::format("v{}", id);
    buffer.what = fn.values[id].name;
    buffer.elements = local(id).numElements();
    buffer.dtype = local(id).dtype;
    bufferOf[id] = out.addBuffer(std::move(buffer));
    return bufferOf[id];
  }
  void emit(Stmt stmt) {
    stmt.sources.push_back(source(fn.ops[current]));
    stmt.phase = fn.ops[current].phase;
    stmt.recomputed = fn.ops[current].attr(ir::kRecomputeAttr) != nullptr;
    if (!opStages.empty()) stmt.stage = opStages[current];
    out.body.push_back(std::move(stmt));
    opOf.push_back(current);
  }
  void call(Callee callee, std::vector<Arg> args, BufferId result,
            std::vector<SpmdValueId> operands) {
    Call c{.callee = callee, .args = std::move(args), .out = result};
    for (SpmdValueId operand : operands)
      c.reads.push_back(bufferOf[operand]);
    Stmt stmt{.node = std::move(c)};
    stmt.zeroFirst = calleeTraits(callee) & kNeedsZero;
    emit(std::move(stmt));
  }
  /// `result` holds `operand`'s value: `operand`'s slot itself when op `index` is its last use
  /// and it owns an arena slot (the slot moves on), else a copy in a fresh slot.
  void bindCopy(SpmdValueId result, SpmdValueId operand, size_t index) {
    BufferId from = bufferOf[operand];
    if (out.buffers[size_t(from)].storage == Storage::Arena && lastUse[operand] == index) {
      bufferOf[result] = from;
      return;
    }
    BufferId to = allocate(result);
    emit(Stmt{.node = Copy{.to = to, .from = from}});
  }
  void rounding(SpmdValueId id) {
    DType dtype = local(id).dtype;
    if (dtype == DType::BF16) call(Callee::RoundBufferBF16, {view(id)}, kNoBuffer, {id});
    if (dtype == DType::F16) call(Callee::RoundBufferF16, {view(id)}, kNoBuffer, {id});
  }

  size_t inPlaceFollowers(size_t index) const;
  llvm::Error absorbFollowers(size_t index, const plan::AxisList& axes);

  void lowerElementwise(const SpmdOp& op);
  void lowerEinsum(const SpmdOp& op);
  llvm::Error lowerReduce(size_t index);
  llvm::Error lowerAlong(size_t index);
  llvm::Error lowerOther(size_t index);
  llvm::Error lowerCollective(size_t index);

  const ir::Function& irFn;
  const plan::SpmdFunction& fn;
  KernelFunction out;
  std::vector<BufferId> bufferOf; // per SPMD value
  std::vector<size_t> lastUse;
  std::vector<bool> absorbed;
  std::vector<size_t> opOf;  // per statement of out.body: the op it lowers
  std::vector<int> opStages; // per op: its pipeline stage (SplitStages.h), empty without stages
  size_t current = 0;
};

void Lowerer::lowerElementwise(const SpmdOp& op) {
  const TensorType& space = local(op.result);
  Loop loop;
  for (const ir::Dim& dim : space.dims) {
    loop.dims.push_back(dim.name);
    loop.extents.push_back(dim.size);
  }
  std::vector<int> args;
  for (SpmdValueId operand : op.operands) {
    int read = int(loop.reads.size());
    loop.reads.push_back(Access{bufferOf[operand], stridesOver(local(operand), space.dims)});
    args.push_back(int(loop.body.size()));
    loop.body.push_back(
        Scalar{.kind = Scalar::Kind::Load, .read = read, .dtype = local(operand).dtype});
  }
  Scalar result{
      .kind = Scalar::Kind::Compute, .op = op.computeKind, .args = args, .dtype = space.dtype};
  if (op.computeKind == OpKind::Literal) {
    // The literal's value in its dtype, as the interpreter holds it.
    double value = numberAttr(op, "value", 0);
    result = Scalar{.kind = Scalar::Kind::Const,
                    .value = interp::evaluateElementwise(OpKind::StopGradient, {value},
                                                         {space.dtype}, space.dtype)
                                 .value_or(value),
                    .dtype = space.dtype};
  }
  if (op.computeKind == OpKind::TrainStep)
    result = Scalar{.kind = Scalar::Kind::Step, .dtype = space.dtype};
  if (op.computeKind == OpKind::Call) result.function = stringAttr(op, "function");
  loop.body.push_back(result);
  BufferId written = allocate(op.result);
  loop.stores.push_back(Store{Access{written, rowMajorStrides(space)}, int(loop.body.size() - 1)});
  emit(Stmt{.node = std::move(loop)});
}

void Lowerer::lowerEinsum(const SpmdOp& op) {
  Gemm gemm;
  gemm.dtype = local(op.result).dtype;
  auto idOf = [&](const ir::Dim& dim) {
    auto it = llvm::find(gemm.dims, dim.name);
    if (it != gemm.dims.end()) return int64_t(it - gemm.dims.begin());
    gemm.dims.push_back(dim.name);
    gemm.sizes.push_back(dim.size);
    return int64_t(gemm.dims.size() - 1);
  };
  auto idsOf = [&](const TensorType& type) {
    std::vector<int64_t> ids;
    for (const ir::Dim& dim : type.dims)
      ids.push_back(idOf(dim));
    return ids;
  };
  for (SpmdValueId operand : op.operands) {
    gemm.operands.push_back(bufferOf[operand]);
    gemm.operandDims.push_back(idsOf(local(operand)));
  }
  gemm.outDims = idsOf(local(op.result));
  gemm.out = allocate(op.result);
  emit(Stmt{.node = std::move(gemm)});
  rounding(op.result);
}

size_t Lowerer::inPlaceFollowers(size_t index) const {
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

llvm::Error Lowerer::absorbFollowers(size_t index, const plan::AxisList& axes) {
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

llvm::Error Lowerer::lowerReduce(size_t index) {
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
  const char* kind = "Reduce::Sum";
  if (op.computeKind == OpKind::ReduceMax) kind = "Reduce::Max";
  if (op.computeKind == OpKind::ReduceMin) kind = "Reduce::Min";
  if (op.computeKind == OpKind::LogSumExp) kind = "Reduce::LogSumExp";
  BufferId written = allocate(op.result);
  call(Callee::Reduce,
       {data(op.result), ints(sizesOf(result.dims)), data(operand),
        ints(stridesOver(in, result.dims)), ints(sizesOf(lane)), ints(stridesOver(in, lane)),
        enumerator(kind), real(scale)},
       written, {operand});
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
      call(Callee::CombineLogSumExp, {view(op.result), group(axes)}, kNoBuffer, {op.result});
  }
  rounding(op.result);
  return llvm::Error::success();
}

llvm::Error Lowerer::lowerAlong(size_t index) {
  const SpmdOp& op = fn.ops[index];
  SpmdValueId operand = op.operands[0];
  const TensorType& in = local(operand);
  const TensorType& result = local(op.result);
  std::vector<std::string> laneDims;
  if (op.computeKind == OpKind::LayerNorm || op.computeKind == OpKind::LayerNormGrad)
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
  if (auto error = absorbFollowers(index, axes)) return error;
  BufferId written = allocate(op.result);
  if (op.computeKind == OpKind::Shift) {
    if (!(in == result)) return unsupported(op, "shift between different local shapes");
    call(Callee::Shift,
         {view(op.result), view(operand), ints(sizesOf(result.dims)),
          integer(result.findDim(laneDims[0])), integer(int64_t(numberAttr(op, "offset", 0))),
          groupPointer(axes)},
         written, {operand});
    rounding(op.result);
    return llvm::Error::success();
  }
  std::vector<ir::Dim> outer = dimsExcept(result, laneDims);
  if (op.computeKind == OpKind::LayerNormGrad) {
    // One row kernel over x and ct (the planner gives both the result's layout).
    SpmdValueId ct = op.operands[1];
    if (!(local(ct) == in))
      return unsupported(op, "layer_norm_grad's x and ct in different shapes");
    call(Callee::LayerNormGrad,
         {data(op.result), data(operand), data(ct), ints(sizesOf(outer)),
          ints(stridesOver(in, outer)), ints(stridesOver(in, outer)),
          ints(stridesOver(result, outer)), ints(sizesOf(lane)), ints(stridesOver(in, lane)),
          ints(stridesOver(in, lane)), ints(stridesOver(result, lane)),
          real(numberAttr(op, "eps", 1e-5)), integer(globalCount), groupPointer(axes)},
         written, {operand, ct});
    rounding(op.result);
    return llvm::Error::success();
  }
  const char* kind = "Along::Softmax";
  if (op.computeKind == OpKind::LogSoftmax) kind = "Along::LogSoftmax";
  if (op.computeKind == OpKind::LayerNorm) kind = "Along::LayerNorm";
  if (op.computeKind == OpKind::Cumsum)
    kind = numberAttr(op, "exclusive", 0) != 0 ? "Along::CumsumExclusive" : "Along::Cumsum";
  call(Callee::Along,
       {data(op.result), data(operand), ints(sizesOf(outer)), ints(stridesOver(in, outer)),
        ints(stridesOver(result, outer)), ints(sizesOf(lane)), ints(stridesOver(in, lane)),
        ints(stridesOver(result, lane)), enumerator(kind), real(numberAttr(op, "eps", 1e-5)),
        integer(globalCount), groupPointer(axes)},
       written, {operand});
  rounding(op.result);
  return llvm::Error::success();
}

llvm::Error Lowerer::lowerOther(size_t index) {
  const SpmdOp& op = fn.ops[index];
  const TensorType& result = local(op.result);
  switch (op.computeKind) {
  case OpKind::Iota: {
    std::string dim = stringAttr(op, "dim");
    Shape position(result.dims.size(), 0);
    int at = result.findDim(dim);
    if (at < 0) return unsupported(op, "iota over a dim its result lacks");
    position[size_t(at)] = 1;
    BufferId written = allocate(op.result);
    call(Callee::Iota,
         {data(op.result), ints(sizesOf(result.dims)), ints(position), shardStart(op.result, dim)},
         written, {});
    return llvm::Error::success();
  }
  case OpKind::RandomNormal:
  case OpKind::RandomUniform: {
    bool normal = op.computeKind == OpKind::RandomNormal;
    BufferId written = allocate(op.result);
    call(normal ? Callee::FillRandomNormal : Callee::FillRandomUniform,
         {data(op.result), shard(op.result), text("seed_"), stream(op),
          real(numberAttr(op, normal ? "mean" : "min", 0)),
          real(numberAttr(op, normal ? "stddev" : "max", 1)), text(valueTypeEnum(result.dtype))},
         written, {});
    return llvm::Error::success();
  }
  case OpKind::RandomInt: {
    BufferId written = allocate(op.result);
    call(Callee::FillRandomInt,
         {data(op.result), shard(op.result), text("seed_"), stream(op),
          real(numberAttr(op, "max", 1))},
         written, {});
    return llvm::Error::success();
  }
  case OpKind::Dropout: {
    SpmdValueId operand = op.operands[0];
    if (fn.kind == ir::Function::Kind::Train) {
      // A loop (fused with its neighbours; backward redraws the mask in its own loop): keep
      // element i iff uniform01(key, global index of i) >= rate, as meshrt::dropoutKeep.
      Loop loop;
      for (const ir::Dim& dim : result.dims) {
        loop.dims.push_back(dim.name);
        loop.extents.push_back(dim.size);
      }
      loop.reads.push_back(Access{bufferOf[operand], stridesOver(local(operand), result.dims)});
      loop.invariants = {streamKey(op), globalBase(op.result)};
      loop.body.push_back(
          Scalar{.kind = Scalar::Kind::Load, .read = 0, .dtype = local(operand).dtype});
      loop.body.push_back(Scalar{.kind = Scalar::Kind::Dropout,
                                 .args = {0},
                                 .read = 0,
                                 .value = numberAttr(op, "rate", 0),
                                 .dtype = result.dtype,
                                 .strides = rowMajorStrides(stepGlobal(op.result))});
      BufferId written = allocate(op.result);
      loop.stores.push_back(Store{Access{written, rowMajorStrides(result)}, 1});
      emit(Stmt{.node = std::move(loop)});
      rounding(op.result);
    } else if (local(operand).dims == result.dims) {
      bindCopy(op.result, operand, index); // dropout is the identity outside training
    } else {
      BufferId written = allocate(op.result);
      call(Callee::CopyStrided,
           {data(op.result), ints(sizesOf(result.dims)), ints(rowMajorStrides(result)),
            data(operand), ints(stridesOver(local(operand), result.dims))},
           written, {operand});
    }
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
      bindCopy(op.result, operand, index); // same storage order: only the names change
      return llvm::Error::success();
    }
    BufferId written = allocate(op.result);
    call(Callee::CopyStrided,
         {data(op.result), ints(sizesOf(result.dims)), ints(rowMajorStrides(result)), data(operand),
          ints(inStrides)},
         written, {operand});
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
    Arg base{.kind = Arg::Kind::GlobalBase};
    int64_t stride = 1;
    for (size_t i = toDims.size(); i-- > 0;) {
      int at = result.findDim(toDims[i].name);
      linear[size_t(at)] = stride;
      const plan::AxisList& axes = layout(op.result).dimAxes[size_t(at)];
      if (operandWhole && !axes.empty()) {
        base.starts.emplace_back(axes, toDims[i].size);
        base.ints.push_back(stride);
      }
      stride *= operandWhole ? global(op.result).dims[size_t(at)].size : toDims[i].size;
    }
    Shape other = stridesOver(in, result.dims);
    for (size_t i = 0; i < result.dims.size(); ++i)
      if (llvm::is_contained(to, result.dims[i].name)) other[i] = 0;
    BufferId written = allocate(op.result);
    call(Callee::Reshape,
         {data(op.result), ints(sizesOf(result.dims)), data(operand), ints(other), ints(linear),
          ints(sizesOf(fromDims)), ints(stridesOver(in, fromDims)), base},
         written, {operand});
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
    BufferId written = allocate(op.result);
    // Window offsets are global along `to`; this rank's result starts at its shard start.
    const plan::AxisList& resultAxes = layout(op.result).dimAxes[size_t(outAt)];
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
      Arg shifted{.kind = Arg::Kind::GlobalBase, .value = double(offset)}; // offset - start
      if (!resultAxes.empty()) {
        shifted.starts.emplace_back(resultAxes, result.dims[size_t(outAt)].size);
        shifted.ints.push_back(-1);
      }
      Stmt stmt{.node =
                    Call{.callee = Callee::CopyWindow,
                         .args = {data(op.result), data(operand), ints(sizesOf(outer)),
                                  ints(stridesOver(result, outer)), ints(stridesOver(in, outer)),
                                  integer(rowMajorStrides(result)[size_t(outAt)]),
                                  integer(rowMajorStrides(in)[size_t(inAt)]),
                                  integer(result.dims[size_t(outAt)].size),
                                  integer(in.dims[size_t(inAt)].size), shifted},
                         .out = written,
                         .reads = {bufferOf[operand]}}};
      // The first window writes into zeros; the later ones add their windows to it.
      stmt.zeroFirst = k == 0;
      if (k > 0) std::get<Call>(stmt.node).reads.push_back(written);
      emit(std::move(stmt));
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
    BufferId written = allocate(op.result);
    call(Callee::OneHot,
         {data(op.result), ints(sizesOf(result.dims)), data(ids), ints(idStrides), ints(position),
          shardStart(op.result, dim)},
         written, {ids});
    rounding(op.result);
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
    BufferId written = allocate(op.result);
    call(Callee::Gather,
         {data(op.result), ints(sizesOf(result.dims)), data(table), ints(tableStrides), data(ids),
          ints(stridesOver(local(ids), result.dims)), integer(tableType.dims[size_t(at)].size),
          integer(rowMajorStrides(tableType)[size_t(at)]), shardStart(table, dim)},
         written, {table, ids});
    return llvm::Error::success();
  }
  case OpKind::TopK: {
    std::string dim = stringAttr(op, "from"), to = stringAttr(op, "to");
    SpmdValueId x = op.operands[0];
    const TensorType& in = local(x);
    int inAt = in.findDim(dim), outAt = result.findDim(to);
    if (inAt < 0 || outAt < 0) return unsupported(op, "top_k over a missing dim");
    if (!layout(x).dimAxes[size_t(inAt)].empty() ||
        !layout(op.result).dimAxes[size_t(outAt)].empty())
      return unsupported(op, "top_k with its row split (the planner gathers it)");
    Shape inStrides = stridesOver(in, result.dims);
    inStrides[size_t(outAt)] = 0; // random_permutation selects along the dim it writes
    BufferId written = allocate(op.result);
    call(Callee::TopK,
         {data(op.result), ints(sizesOf(result.dims)), data(x), ints(inStrides), integer(outAt),
          integer(in.dims[size_t(inAt)].size), integer(rowMajorStrides(in)[size_t(inAt)])},
         written, {x});
    return llvm::Error::success();
  }
  default:
    return unsupported(op, std::string("op '") + ir::opSpelling(op.computeKind) + "'");
  }
}

llvm::Error Lowerer::lowerCollective(size_t index) {
  const SpmdOp& op = fn.ops[index];
  const plan::Collective& c = op.collective;
  SpmdValueId operand = op.operands[0];
  bool inPlace = operand == op.result;
  auto dimIndex = [&](SpmdValueId id, const std::string& dim) { return local(id).findDim(dim); };
  switch (c.kind) {
  case CollectiveKind::AllReduceSum:
  case CollectiveKind::AllReduceMax:
  case CollectiveKind::AllReduceMin:
    if (!inPlace) bindCopy(op.result, operand, index);
    if (!c.axes.empty())
      emit(Stmt{.node =
                    Collective{.kind = c.kind, .axes = c.axes, .buffers = {bufferOf[op.result]}}});
    return llvm::Error::success();
  case CollectiveKind::AllGather:
  case CollectiveKind::ReduceScatter:
  case CollectiveKind::LocalSlice: {
    if (inPlace) return unsupported(op, "an in-place all-gather outside cumsum");
    int at = dimIndex(operand, c.dim);
    if (at < 0) return unsupported(op, "a collective over a missing dim");
    BufferId written = allocate(op.result);
    if (c.kind == CollectiveKind::LocalSlice) {
      int64_t blocks = 1;
      for (const std::string& axis : c.axes)
        blocks *= fn.mesh.axisSize(axis);
      Arg block{.kind = Arg::Kind::BlockIndex, .names = c.axes};
      call(Callee::SliceDim,
           {view(op.result), view(operand), ints(sizesOf(local(operand).dims)), integer(at), block,
            integer(blocks)},
           written, {operand});
      return llvm::Error::success();
    }
    call(c.kind == CollectiveKind::AllGather ? Callee::AllGatherDim : Callee::ReduceScatterDim,
         {view(op.result), view(operand), ints(sizesOf(local(operand).dims)), integer(at),
          group(c.axes)},
         written, {operand});
    return llvm::Error::success();
  }
  case CollectiveKind::AllToAll: {
    int from = dimIndex(operand, c.dim), to = dimIndex(operand, c.toDim);
    if (from < 0 || to < 0 || inPlace) return unsupported(op, "a malformed all-to-all");
    BufferId written = allocate(op.result);
    call(Callee::AllToAllDims,
         {view(op.result), view(operand), ints(sizesOf(local(operand).dims)), integer(from),
          integer(to), group(c.axes)},
         written, {operand});
    return llvm::Error::success();
  }
  case CollectiveKind::Permute:
    return unsupported(op, "a collective permute outside shift");
  case CollectiveKind::BucketedAllReduceSum: {
    if (op.results.size() != op.operands.size())
      return unsupported(op, "a bucketed all-reduce without one result per operand");
    Collective bucket{.kind = c.kind, .axes = c.axes};
    for (size_t k = 0; k < op.operands.size(); ++k) {
      bindCopy(op.results[k], op.operands[k], index);
      bucket.buffers.push_back(bufferOf[op.results[k]]);
    }
    if (!c.axes.empty()) emit(Stmt{.node = std::move(bucket)});
    return llvm::Error::success();
  }
  }
  return unsupported(op, "this collective");
}

llvm::Expected<KernelFunction> Lowerer::lower() {
  out.name = fn.name;
  if (fn.stages.count > 1) {
    out.stages = {fn.stages.axis, fn.stages.count, fn.stages.oneFOneB};
    opStages = stagesOfOps(irFn, fn);
  }
  bufferOf.assign(fn.values.size(), kNoBuffer);
  absorbed.assign(fn.ops.size(), false);
  lastUse.assign(fn.values.size(), 0);
  for (size_t i = 0; i < fn.ops.size(); ++i)
    for (SpmdValueId operand : fn.ops[i].operands)
      lastUse[operand] = std::max(lastUse[operand], i);
  for (const auto& output : fn.outputs)
    lastUse[output.second] = fn.ops.size();
  for (const auto& update : fn.updates)
    lastUse[update.second] = fn.ops.size();

  for (size_t k = 0; k < fn.inputs.size(); ++k) {
    SpmdValueId id = fn.inputs[k];
    bufferOf[id] = out.addBuffer(Buffer{.name = fmt::format("v{}", id),
                                        .what = irFn.inputs[k].name,
                                        .elements = local(id).numElements(),
                                        .dtype = local(id).dtype,
                                        .storage = Storage::Input,
                                        .index = int64_t(k)});
  }
  for (size_t k = 0; k < fn.params.size(); ++k) {
    SpmdValueId id = fn.params[k];
    bufferOf[id] = out.addBuffer(Buffer{.name = fmt::format("v{}", id),
                                        .what = irFn.params[k].path,
                                        .elements = local(id).numElements(),
                                        .dtype = local(id).dtype,
                                        .storage = Storage::Param,
                                        .index = int64_t(k)});
    out.params.push_back(bufferOf[id]);
  }

  for (current = 0; current < fn.ops.size(); ++current) {
    if (absorbed[current]) continue;
    const SpmdOp& op = fn.ops[current];
    if (op.kind == SpmdOp::Kind::Collective) {
      if (auto error = lowerCollective(current)) return error;
      continue;
    }
    switch (loweringOf(op.computeKind)) {
    case Lowering::Source:
      if (bufferOf[op.result] == kNoBuffer)
        return unsupported(
            op, fmt::format("a {} without its declaration", ir::opSpelling(op.computeKind)));
      break;
    case Lowering::Elementwise:
      lowerElementwise(op);
      break;
    case Lowering::Einsum:
      lowerEinsum(op);
      break;
    case Lowering::Reduce:
      if (auto error = lowerReduce(current)) return error;
      break;
    case Lowering::Along:
      if (auto error = lowerAlong(current)) return error;
      break;
    case Lowering::Other:
      if (auto error = lowerOther(current)) return error;
      break;
    }
  }
  for (const auto& output : fn.outputs)
    out.outputs.push_back(bufferOf[output.second]);
  for (const auto& [param, id] : fn.updates)
    out.updates.push_back({param, bufferOf[id],
                           local(fn.params[param]).dims == local(id).dims &&
                               local(fn.params[param]).dtype == local(id).dtype});
  if (fn.microbatching.count > 1)
    if (auto error = formMicrobatchLoop(out, fn, opOf, bufferOf)) return error;
  return std::move(out);
}

} // namespace

llvm::Expected<KernelFunction> lowerToKernels(const ir::Function& irFunction,
                                              const plan::SpmdFunction& spmd) {
  return Lowerer(irFunction, spmd).lower();
}

} // namespace meshc::kir
