// Reverse-mode autodiff: one backward sweep over the forward ops in reverse order. Each op family
// has one gradient function below (the table of rules is the switch in `backward`); every rule is
// composed from existing IR ops, with `broadcast`, `sum` and `transpose` (OpBuilder::fitTo)
// matching a contribution's dims to its operand's by name.
#include "train/Autodiff.h"

#include "train/OpBuilder.h"

#include <cmath>

namespace meshc::train {
namespace {

using ir::Op;
using ir::OpKind;
using ir::TensorType;
using ir::ValueId;

class Differentiator {
public:
  Differentiator(ir::Function& fn, DiagEngine& diag) : fn(fn), diag(diag), b(fn, fn.loc) {}

  std::optional<Gradients> run();

private:
  // ---- which values are differentiated
  /// Whether the gradient flows from operand `k` of `op` to its result.
  static bool propagates(const Op& op, size_t k);
  void findActiveValues();
  bool wants(ValueId v) const { return v < active.size() && active[v] && needed[v]; }

  /// Adds `contribution` (any dims; fitted to v's type) to v's cotangent.
  void accumulate(ValueId v, ValueId contribution);
  void backward(const Op& op, ValueId ct);

  // ---- gradient rules, one function per op family
  void unaryGrad(const Op& op, ValueId ct);
  void binaryGrad(const Op& op, ValueId ct);
  void whereGrad(const Op& op, ValueId ct);
  void einsumGrad(const Op& op, ValueId ct);
  void reduceGrad(const Op& op, ValueId ct);
  void alongDimsGrad(const Op& op, ValueId ct);
  void dimsGrad(const Op& op, ValueId ct);
  void gatherGrad(const Op& op, ValueId ct);
  void dropoutGrad(const Op& op, ValueId ct);

  ValueId zeroLike(ValueId v) { return b.literal(0, b.type(v).dtype); }
  /// c - v, with v's dims.
  ValueId rsub(double c, ValueId v) {
    return b.binary(OpKind::Sub, b.literal(c, b.type(v).dtype), v);
  }

  ir::Function& fn;
  DiagEngine& diag;
  OpBuilder b;
  std::vector<bool> active;         // float, and depends on a trainable weight differentiably
  std::vector<bool> needed;         // the loss depends on it differentiably
  std::vector<size_t> sourceWeight; // for active values: one weight they depend on
  std::vector<std::optional<ValueId>> adjoint;
};

bool Differentiator::propagates(const Op& op, size_t k) {
  switch (op.kind) {
  case OpKind::StopGradient:
  case OpKind::Floor: // piecewise constant: zero almost everywhere
  case OpKind::Ceil:
  case OpKind::Round:
  case OpKind::OneHot:
    return false;
  case OpKind::Gather:
    return k == 0; // the table; ids are integers
  case OpKind::Where:
    return k != 0; // the condition is an i32 mask
  default:
    return true;
  }
}

void Differentiator::findActiveValues() {
  active.assign(fn.values.size(), false);
  needed.assign(fn.values.size(), false);
  sourceWeight.assign(fn.values.size(), 0);
  for (size_t i = 0; i < fn.params.size(); ++i) {
    const ir::ParamInfo& param = fn.params[i];
    if (param.trainable && param.role == ir::ParamRole::Weight && ir::isFloat(param.type.dtype) &&
        param.value < active.size()) {
      active[param.value] = true;
      sourceWeight[param.value] = i;
    }
  }
  for (const Op& op : fn.ops) {
    if (!ir::isFloat(fn.typeOf(op.result).dtype)) continue;
    for (size_t k = 0; k < op.operands.size(); ++k)
      if (active[op.operands[k]] && propagates(op, k)) {
        active[op.result] = true;
        sourceWeight[op.result] = sourceWeight[op.operands[k]];
        break;
      }
  }
  needed[fn.train->loss] = true;
  for (size_t i = fn.ops.size(); i-- > 0;) {
    const Op& op = fn.ops[i];
    if (!needed[op.result] || !active[op.result]) continue;
    for (size_t k = 0; k < op.operands.size(); ++k)
      if (propagates(op, k)) needed[op.operands[k]] = true;
  }
}

void Differentiator::accumulate(ValueId v, ValueId contribution) {
  contribution = b.fitTo(contribution, fn.typeOf(v));
  adjoint[v] = adjoint[v] ? b.add(*adjoint[v], contribution) : contribution;
}

std::optional<Gradients> Differentiator::run() {
  const ValueId loss = fn.train->loss;
  findActiveValues();
  if (!active[loss]) {
    diag.report(fn.train->loc.loc, Diag::ErrNothingToTrain, fn.name);
    return std::nullopt;
  }
  for (const Op& op : fn.ops) {
    if (op.kind == OpKind::Call && wants(op.result)) {
      diag.report(op.loc.loc, Diag::ErrNoGradient, "the user function", op.string("function"),
                  fn.params[sourceWeight[op.result]].path, fn.name);
      return std::nullopt;
    }
    // The gradient's one_hot(ids, d) would have d twice.
    if (op.kind == OpKind::Gather && op.operands.size() == 2 && wants(op.result) &&
        wants(op.operands[0]) && fn.typeOf(op.operands[1]).hasDim(op.string("dim"))) {
      const std::string dim = op.string("dim");
      diag.report(op.loc.loc, Diag::ErrGatherGradientDims, dim,
                  fn.params[sourceWeight[op.result]].path, fn.name, dim);
      return std::nullopt;
    }
  }
  adjoint.assign(fn.values.size(), std::nullopt);
  size_t forwardOps = fn.ops.size();
  b.setLocation(fn.train->loc);
  adjoint[loss] = b.literal(1, fn.typeOf(loss).dtype);
  for (size_t i = forwardOps; i-- > 0;) {
    Op op = fn.ops[i]; // a copy: the rules append to fn.ops
    if (!wants(op.result) || !adjoint[op.result]) continue;
    b.setLocation(op.loc);
    backward(op, *adjoint[op.result]);
  }
  Gradients gradients;
  for (size_t i = 0; i < fn.params.size(); ++i) {
    ValueId value = fn.params[i].value;
    if (wants(value) && adjoint[value]) {
      gradients[i] = *adjoint[value];
      fn.values[*adjoint[value]].name = "grad/" + fn.params[i].path;
    }
  }
  return gradients;
}

void Differentiator::backward(const Op& op, ValueId ct) {
  // IR read from text is not checked for arity: an op short of the operands its rule reads gets
  // no gradient here (the interpreter and planner report it) rather than an out-of-range read.
  size_t needs = op.kind == OpKind::Where                               ? 3
                 : OpKind::Add <= op.kind && op.kind <= OpKind::Minimum ? 2
                 : op.kind == OpKind::Gather                            ? 2
                                                                        : 1;
  if (op.operands.size() < needs) return;
  switch (op.kind) {
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
    return unaryGrad(op, ct);
  case OpKind::Add:
  case OpKind::Sub:
  case OpKind::Mul:
  case OpKind::Div:
  case OpKind::Pow:
  case OpKind::Maximum:
  case OpKind::Minimum:
    return binaryGrad(op, ct);
  case OpKind::Where:
    return whereGrad(op, ct);
  case OpKind::Einsum:
    return einsumGrad(op, ct);
  case OpKind::ReduceSum:
  case OpKind::ReduceMean:
  case OpKind::ReduceMax:
  case OpKind::ReduceMin:
  case OpKind::LogSumExp:
    return reduceGrad(op, ct);
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::LayerNorm:
  case OpKind::Cumsum:
  case OpKind::Shift:
    return alongDimsGrad(op, ct);
  case OpKind::Cast:
  case OpKind::Transpose:
  case OpKind::Broadcast:
  case OpKind::Rename:
  case OpKind::Reshape:
  case OpKind::Slice:
  case OpKind::Pad:
  case OpKind::Concat:
    return dimsGrad(op, ct);
  case OpKind::Gather:
    return gatherGrad(op, ct);
  case OpKind::Dropout:
    return dropoutGrad(op, ct);
  default:
    // Sources (param, input, literal, iota, random, step), stop_gradient, one_hot and
    // comparisons: nothing flows to operands. `call` was rejected before the sweep.
    return;
  }
}

/// y = f(x): dx = ct * f'(x), with f' written in terms of x or y.
void Differentiator::unaryGrad(const Op& op, ValueId ct) {
  ValueId x = op.operands[0], y = op.result;
  if (!wants(x)) return;
  ValueId dx = 0;
  switch (op.kind) {
  case OpKind::Neg:
    dx = b.neg(ct);
    break;
  case OpKind::Abs: // sign(x) * ct; 0 at x = 0
    dx = b.where(b.binary(OpKind::Gt, x, zeroLike(x)), ct,
                 b.where(b.binary(OpKind::Lt, x, zeroLike(x)), b.neg(ct), zeroLike(ct), b.type(ct)),
                 b.type(ct));
    break;
  case OpKind::Exp:
    dx = b.mul(ct, y);
    break;
  case OpKind::Log:
    dx = b.div(ct, x);
    break;
  case OpKind::Sqrt:
    dx = b.div(ct, b.mul(y, 2.0));
    break;
  case OpKind::Rsqrt: // -x^-3/2 / 2 = -y^3 / 2
    dx = b.mul(ct, b.mul(b.mul(y, b.unary(OpKind::Square, y)), -0.5));
    break;
  case OpKind::Square:
    dx = b.mul(ct, b.mul(x, 2.0));
    break;
  case OpKind::Tanh:
    dx = b.mul(ct, rsub(1, b.unary(OpKind::Square, y)));
    break;
  case OpKind::Sigmoid:
    dx = b.mul(ct, b.mul(y, rsub(1, y)));
    break;
  case OpKind::Relu: // 0 at x = 0
    dx = b.where(b.binary(OpKind::Gt, x, zeroLike(x)), ct, zeroLike(ct), b.type(ct));
    break;
  case OpKind::Gelu: {
    // y = x/2 (1 + tanh(u)), u = k (x + c x^3):
    // y' = (1 + t)/2 + x/2 (1 - t^2) k (1 + 3 c x^2), t = tanh(u).
    constexpr double k = 0.79788456080286535588, c = 0.044715;
    ValueId x2 = b.unary(OpKind::Square, x);
    ValueId u = b.mul(b.add(x, b.mul(b.mul(x, x2), c)), k);
    ValueId t = b.unary(OpKind::Tanh, u);
    ValueId left = b.mul(b.add(t, 1.0), 0.5);
    ValueId right =
        b.mul(b.mul(b.mul(x, rsub(1, b.unary(OpKind::Square, t))), b.add(b.mul(x2, 3 * c), 1.0)),
              0.5 * k);
    dx = b.mul(ct, b.add(left, right));
    break;
  }
  case OpKind::Sin:
    dx = b.mul(ct, b.unary(OpKind::Cos, x));
    break;
  case OpKind::Cos:
    dx = b.neg(b.mul(ct, b.unary(OpKind::Sin, x)));
    break;
  default:
    return;
  }
  accumulate(x, dx);
}

/// y = a (op) b, broadcasting by name; each contribution is summed back over the dims its
/// operand lacks (accumulate's fitTo). maximum/minimum give a tie to `a`.
void Differentiator::binaryGrad(const Op& op, ValueId ct) {
  ValueId a = op.operands[0], c = op.operands[1], y = op.result;
  bool wantA = wants(a), wantB = wants(c);
  switch (op.kind) {
  case OpKind::Add:
    if (wantA) accumulate(a, ct);
    if (wantB) accumulate(c, ct);
    break;
  case OpKind::Sub:
    if (wantA) accumulate(a, ct);
    if (wantB) accumulate(c, b.neg(ct));
    break;
  case OpKind::Mul:
    if (wantA) accumulate(a, b.mul(ct, c));
    if (wantB) accumulate(c, b.mul(ct, a));
    break;
  case OpKind::Div: // d/db (a/b) = -y/b
    if (wantA) accumulate(a, b.div(ct, c));
    if (wantB) accumulate(c, b.neg(b.mul(ct, b.div(y, c))));
    break;
  case OpKind::Pow: // d/da a^b = b a^(b-1); d/db a^b = y log a
    if (wantA) accumulate(a, b.mul(ct, b.mul(c, b.binary(OpKind::Pow, a, b.add(c, -1.0)))));
    if (wantB) accumulate(c, b.mul(ct, b.mul(y, b.unary(OpKind::Log, a))));
    break;
  case OpKind::Maximum:
  case OpKind::Minimum: {
    ValueId aWins = b.binary(op.kind == OpKind::Maximum ? OpKind::Ge : OpKind::Le, a, c);
    if (wantA) accumulate(a, b.where(aWins, ct, zeroLike(ct), b.type(ct)));
    if (wantB) accumulate(c, b.where(aWins, zeroLike(ct), ct, b.type(ct)));
    break;
  }
  default:
    break;
  }
}

void Differentiator::whereGrad(const Op& op, ValueId ct) {
  ValueId cond = op.operands[0], a = op.operands[1], c = op.operands[2];
  if (wants(a)) accumulate(a, b.where(cond, ct, zeroLike(ct), b.type(ct)));
  if (wants(c)) accumulate(c, b.where(cond, zeroLike(ct), ct, b.type(ct)));
}

/// The gradient of operand k is the einsum of the cotangent with the other operands onto k's
/// dims (those that appear among them); dims only operand k has are broadcast (fitTo).
void Differentiator::einsumGrad(const Op& op, ValueId ct) {
  for (size_t k = 0; k < op.operands.size(); ++k) {
    ValueId x = op.operands[k];
    if (!wants(x)) continue;
    std::vector<ValueId> factors = {ct};
    for (size_t j = 0; j < op.operands.size(); ++j)
      if (j != k) factors.push_back(op.operands[j]);
    TensorType result{b.type(x).dtype, {}};
    for (const ir::Dim& dim : b.type(x).dims)
      for (ValueId f : factors)
        if (b.type(f).hasDim(dim.name)) {
          result.dims.push_back(dim);
          break;
        }
    accumulate(x, b.op(OpKind::Einsum, factors, result));
  }
}

/// sum/mean: the cotangent broadcast back (divided by the count for mean). max/min: every
/// element equal to the extreme gets the whole cotangent (ties are not split). logsumexp:
/// ct * exp(x - y), the softmax.
void Differentiator::reduceGrad(const Op& op, ValueId ct) {
  ValueId x = op.operands[0], y = op.result;
  if (!wants(x)) return;
  const TensorType xType = b.type(x);
  switch (op.kind) {
  case OpKind::ReduceSum:
    accumulate(x, ct);
    break;
  case OpKind::ReduceMean: {
    double count = 1;
    for (const std::string& dim : op.dims("dims"))
      if (int d = xType.findDim(dim); d >= 0) count *= double(xType.dims[d].size);
    accumulate(x, b.mul(ct, 1.0 / count));
    break;
  }
  case OpKind::ReduceMax:
  case OpKind::ReduceMin: {
    ValueId extreme = b.binary(OpKind::Eq, x, y);
    accumulate(x, b.where(extreme, b.broadcastTo(ct, xType), zeroLike(ct), xType));
    break;
  }
  case OpKind::LogSumExp:
    accumulate(x, b.mul(b.broadcastTo(ct, xType), b.unary(OpKind::Exp, b.sub(x, y))));
    break;
  default:
    break;
  }
}

void Differentiator::alongDimsGrad(const Op& op, ValueId ct) {
  ValueId x = op.operands[0], y = op.result;
  if (!wants(x)) return;
  std::string dim = op.string("dim");
  switch (op.kind) {
  case OpKind::Softmax: // y (ct - sum_d(ct y))
    accumulate(x, b.mul(y, b.sub(ct, b.reduce(OpKind::ReduceSum, b.mul(ct, y), {dim}))));
    break;
  case OpKind::LogSoftmax: // ct - exp(y) sum_d(ct)
    accumulate(x,
               b.sub(ct, b.mul(b.unary(OpKind::Exp, y), b.reduce(OpKind::ReduceSum, ct, {dim}))));
    break;
  case OpKind::LayerNorm: {
    // y = (x - mean) r, r = (var + eps)^-1/2:  dx = r (ct - mean(ct) - y mean(ct y)).
    std::vector<std::string> dims = op.dims("dims");
    ValueId centered = b.sub(x, b.reduce(OpKind::ReduceMean, x, dims));
    ValueId variance = b.reduce(OpKind::ReduceMean, b.unary(OpKind::Square, centered), dims);
    ValueId r = b.unary(OpKind::Rsqrt, b.add(variance, op.number("eps", 1e-5)));
    ValueId inner = b.sub(b.sub(ct, b.reduce(OpKind::ReduceMean, ct, dims)),
                          b.mul(y, b.reduce(OpKind::ReduceMean, b.mul(ct, y), dims)));
    accumulate(x, b.mul(inner, r));
    break;
  }
  case OpKind::Cumsum: {
    // Inclusive: dx_j = sum_{i >= j} ct_i = total - exclusive_cumsum(ct)_j; exclusive: total
    // minus the inclusive cumsum.
    bool exclusive = op.number("exclusive", 0) != 0;
    ValueId total = b.broadcastTo(b.reduce(OpKind::ReduceSum, ct, {dim}), b.type(ct));
    ValueId partial = b.op(OpKind::Cumsum, {ct}, b.type(ct),
                           {{"dim", dim}, {"exclusive", int64_t(exclusive ? 0 : 1)}});
    accumulate(x, b.sub(total, partial));
    break;
  }
  case OpKind::Shift:
    accumulate(x, b.op(OpKind::Shift, {ct}, b.type(ct),
                       {{"dim", dim}, {"offset", -op.integer("offset")}}));
    break;
  default:
    break;
  }
}

/// Ops that only move elements: the cotangent moves back. cast, transpose and broadcast need
/// only accumulate's fitTo (cast back, transpose back, sum over the broadcast dims).
void Differentiator::dimsGrad(const Op& op, ValueId ct) {
  auto renamed = [](const TensorType& type, const std::vector<std::string>& from,
                    const std::vector<std::string>& to, const TensorType& sizes) {
    TensorType result = type;
    for (ir::Dim& dim : result.dims)
      for (size_t i = 0; i < from.size() && i < to.size(); ++i)
        if (dim.name == from[i]) {
          dim.name = to[i];
          if (int d = sizes.findDim(to[i]); d >= 0) dim.size = sizes.dims[d].size;
          break;
        }
    return result;
  };
  ValueId x = op.operands[0];
  switch (op.kind) {
  case OpKind::Cast:
  case OpKind::Transpose:
  case OpKind::Broadcast:
    if (wants(x)) accumulate(x, ct);
    break;
  case OpKind::Rename:
    if (wants(x)) {
      std::vector<std::string> from = op.dims("from"), to = op.dims("to");
      TensorType back = renamed(b.type(ct), to, from, b.type(x));
      accumulate(x, b.op(OpKind::Rename, {ct}, back, {{"from", to}, {"to", from}}));
    }
    break;
  case OpKind::Reshape:
    if (wants(x))
      accumulate(x, b.op(OpKind::Reshape, {ct}, b.type(x),
                         {{"from", op.dims("to")}, {"to", op.dims("from")}}));
    break;
  case OpKind::Slice: // zero-pad back into the window
    if (wants(x))
      accumulate(x, b.op(OpKind::Pad, {ct}, b.type(x),
                         {{"from", op.string("to")},
                          {"to", op.string("from")},
                          {"before", op.integer("start")}}));
    break;
  case OpKind::Pad: // the window that holds x
    if (wants(x))
      accumulate(x, b.op(OpKind::Slice, {ct}, b.type(x),
                         {{"from", op.string("to")},
                          {"to", op.string("from")},
                          {"start", op.integer("before")}}));
    break;
  case OpKind::Concat: {
    std::vector<std::string> from = op.dims("from");
    std::string to = op.string("to");
    int64_t offset = 0;
    for (size_t k = 0; k < op.operands.size() && k < from.size(); ++k) {
      ValueId part = op.operands[k];
      const TensorType partType = b.type(part);
      int d = partType.findDim(from[k]);
      if (wants(part))
        accumulate(part, b.op(OpKind::Slice, {ct}, partType,
                              {{"from", to}, {"to", from[k]}, {"start", offset}}));
      offset += d >= 0 ? partType.dims[d].size : 0;
    }
    break;
  }
  default:
    break;
  }
}

/// y = table[ids] along `dim`: d table = einsum(one_hot(ids), ct) onto the table's dims; ids
/// out of range select nothing, as in the forward op.
void Differentiator::gatherGrad(const Op& op, ValueId ct) {
  ValueId table = op.operands[0], ids = op.operands[1];
  if (!wants(table)) return;
  std::string dim = op.string("dim");
  const TensorType tableType = b.type(table);
  TensorType hotType{b.type(ct).dtype, b.type(ids).dims};
  if (int d = tableType.findDim(dim); d >= 0) hotType.dims.push_back(tableType.dims[d]);
  ValueId hot = b.op(OpKind::OneHot, {ids}, hotType, {{"dim", dim}});
  accumulate(table, b.op(OpKind::Einsum, {hot, ct}, tableType));
}

/// The same mask (same stream, rate and element order: ct has y's type) and scale.
void Differentiator::dropoutGrad(const Op& op, ValueId ct) {
  ValueId x = op.operands[0];
  if (wants(x)) accumulate(x, b.op(OpKind::Dropout, {ct}, b.type(ct), op.attrs));
}

} // namespace

std::optional<Gradients> differentiate(ir::Function& fn, DiagEngine& diag) {
  if (!fn.train) return Gradients{};
  return Differentiator(fn, diag).run();
}

} // namespace meshc::train
