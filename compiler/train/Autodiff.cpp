// Reverse-mode autodiff: one backward sweep over the forward ops in reverse order. The table of
// rules is the switch in `backward`, one case per op (no default: a new op must say); every rule is
// composed from existing IR ops, with `broadcast`, `sum` and `transpose` (OpBuilder::fitTo)
// matching a contribution's dims to its operand's by name.
#include "train/Autodiff.h"

#include "train/OpBuilder.h"

#include "ir/OpTraits.h"

#include <algorithm>
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

  // ---- gradient rules: the switch in `backward`, with these for the longer ones
  /// Adds rule(x) to operand k's cotangent when it wants one (the rule builds ops lazily).
  template <typename Rule> void toOperand(const Op& op, size_t k, Rule rule) {
    if (wants(op.operands[k])) accumulate(op.operands[k], rule(op.operands[k]));
  }
  void extremumGrad(const Op& op, ValueId ct);
  void whereGrad(const Op& op, ValueId ct);
  void einsumGrad(const Op& op, ValueId ct);
  void concatGrad(const Op& op, ValueId ct);
  void gatherGrad(const Op& op, ValueId ct);
  void dropoutGrad(const Op& op, ValueId ct);
  /// sum_d(ct), where a one-hot pick of a value constant along d needs no reduction.
  ValueId sumAlong(ValueId ct, const std::string& dim);

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
  // An op that rejects differentiation still propagates activity, so that the sweep can report
  // it when the loss depends on it.
  const ir::OpTraits& traits = ir::opTraits(op.kind);
  return traits.hasGradientFor(k) || traits.rejectsGradient();
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
    if (ir::opTraits(op.kind).rejectsGradient() && wants(op.result)) {
      bool call = op.kind == OpKind::Call;
      diag.report(op.loc.loc, Diag::ErrNoGradient, call ? "the user function" : "the op",
                  call ? op.string("function") : std::string(ir::opSpelling(op.kind)),
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

/// The gradient rules, one case per op: each adds the cotangent `ct` of `op`'s result, pulled
/// back through the op, to the operands that want it. Rules are composed from existing IR ops;
/// accumulate's fitTo sums a contribution over the dims its operand lacks (broadcasting by name)
/// and casts or transposes it back.
void Differentiator::backward(const Op& op, ValueId ct) {
  // IR read from text is not checked for arity: an op with the wrong operand count gets no
  // gradient here (the interpreter, planner and verifier report it) rather than an out-of-range
  // read.
  if (!ir::opTraits(op.kind).acceptsOperandCount(op.operands.size())) return;
  const ValueId y = op.result;
  const std::string dim = op.string("dim");
  auto same = [&](ValueId) { return ct; };
  switch (op.kind) {
  // ---- elementwise unary: dx = ct * f'(x), with f' written in terms of x or y
  case OpKind::Neg:
    return toOperand(op, 0, [&](ValueId) { return b.neg(ct); });
  case OpKind::Abs: // sign(x) * ct; 0 at x = 0
    return toOperand(op, 0, [&](ValueId x) {
      return b.where(
          b.binary(OpKind::Gt, x, zeroLike(x)), ct,
          b.where(b.binary(OpKind::Lt, x, zeroLike(x)), b.neg(ct), zeroLike(ct), b.type(ct)),
          b.type(ct));
    });
  case OpKind::Exp:
    return toOperand(op, 0, [&](ValueId) { return b.mul(ct, y); });
  case OpKind::Log:
    return toOperand(op, 0, [&](ValueId x) { return b.div(ct, x); });
  case OpKind::Sqrt:
    return toOperand(op, 0, [&](ValueId) { return b.div(ct, b.mul(y, 2.0)); });
  case OpKind::Rsqrt: // -x^-3/2 / 2 = -y^3 / 2
    return toOperand(op, 0, [&](ValueId) {
      return b.mul(ct, b.mul(b.mul(y, b.unary(OpKind::Square, y)), -0.5));
    });
  case OpKind::Square:
    return toOperand(op, 0, [&](ValueId x) { return b.mul(ct, b.mul(x, 2.0)); });
  case OpKind::Tanh:
    return toOperand(op, 0,
                     [&](ValueId) { return b.mul(ct, rsub(1, b.unary(OpKind::Square, y))); });
  case OpKind::Sigmoid:
    return toOperand(op, 0, [&](ValueId) { return b.mul(ct, b.mul(y, rsub(1, y))); });
  case OpKind::Relu: // 0 at x = 0
    return toOperand(op, 0, [&](ValueId x) {
      return b.where(b.binary(OpKind::Gt, x, zeroLike(x)), ct, zeroLike(ct), b.type(ct));
    });
  case OpKind::Gelu:
    return toOperand(op, 0, [&](ValueId x) {
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
      return b.mul(ct, b.add(left, right));
    });
  case OpKind::Sin:
    return toOperand(op, 0, [&](ValueId x) { return b.mul(ct, b.unary(OpKind::Cos, x)); });
  case OpKind::Cos:
    return toOperand(op, 0, [&](ValueId x) { return b.neg(b.mul(ct, b.unary(OpKind::Sin, x))); });

  // ---- elementwise binary y = a (op) c, broadcasting by name
  case OpKind::Add:
    toOperand(op, 0, same);
    return toOperand(op, 1, same);
  case OpKind::Sub:
    toOperand(op, 0, same);
    return toOperand(op, 1, [&](ValueId) { return b.neg(ct); });
  case OpKind::Mul:
    toOperand(op, 0, [&](ValueId) { return b.mul(ct, op.operands[1]); });
    return toOperand(op, 1, [&](ValueId) { return b.mul(ct, op.operands[0]); });
  case OpKind::Div: // d/dc (a/c) = -y/c
    toOperand(op, 0, [&](ValueId) { return b.div(ct, op.operands[1]); });
    return toOperand(op, 1, [&](ValueId c) { return b.neg(b.mul(ct, b.div(y, c))); });
  case OpKind::Pow: // d/da a^c = c a^(c-1); d/dc a^c = y log a
    toOperand(op, 0, [&](ValueId a) {
      ValueId c = op.operands[1];
      return b.mul(ct, b.mul(c, b.binary(OpKind::Pow, a, b.add(c, -1.0))));
    });
    return toOperand(
        op, 1, [&](ValueId) { return b.mul(ct, b.mul(y, b.unary(OpKind::Log, op.operands[0]))); });
  case OpKind::Maximum:
  case OpKind::Minimum:
    return extremumGrad(op, ct);
  case OpKind::Where:
    return whereGrad(op, ct);

  // ---- contractions and reductions
  case OpKind::Einsum:
    return einsumGrad(op, ct);
  case OpKind::ReduceSum: // the cotangent broadcast back
    return toOperand(op, 0, same);
  case OpKind::ReduceMean: // ... divided by the count
    return toOperand(op, 0, [&](ValueId x) {
      const TensorType xType = b.type(x);
      double count = 1;
      for (const std::string& reduced : op.dims("dims"))
        if (int d = xType.findDim(reduced); d >= 0) count *= double(xType.dims[d].size);
      return b.mul(ct, 1.0 / count);
    });
  case OpKind::ReduceMax: // every element equal to the extreme gets the whole cotangent
  case OpKind::ReduceMin:
    return toOperand(op, 0, [&](ValueId x) {
      const TensorType xType = b.type(x);
      ValueId extreme = b.binary(OpKind::Eq, x, y);
      return b.where(extreme, b.broadcastTo(ct, xType), zeroLike(ct), xType);
    });
  case OpKind::LogSumExp: // ct * exp(x - y), the softmax
    return toOperand(op, 0, [&](ValueId x) {
      return b.mul(b.broadcastTo(ct, b.type(x)), b.unary(OpKind::Exp, b.sub(x, y)));
    });
  case OpKind::Softmax: // y (ct - sum_d(ct y))
    return toOperand(op, 0, [&](ValueId) {
      return b.mul(y, b.sub(ct, b.reduce(OpKind::ReduceSum, b.mul(ct, y), {dim})));
    });
  case OpKind::LogSoftmax: // ct - exp(y) sum_d(ct)
    return toOperand(op, 0, [&](ValueId) {
      return b.sub(ct, b.mul(b.unary(OpKind::Exp, y), sumAlong(ct, dim)));
    });
  case OpKind::LayerNorm:
    return toOperand(op, 0, [&](ValueId x) {
      // y = (x - mean) r, r = (var + eps)^-1/2:  dx = r (ct - mean(ct) - y mean(ct y)), as one
      // op: the kernels compute it in one row kernel (mean and variance of x, then the row
      // sums of ct and ct y), where the same formula in mean, sub, mul and rsqrt ops took
      // about ten passes over the rows.
      return b.op(OpKind::LayerNormGrad, {x, b.fitTo(ct, b.type(x))}, b.type(x),
                  {{"dims", op.dims("dims")}, {"eps", op.number("eps", 1e-5)}});
    });
  case OpKind::Cumsum:
    return toOperand(op, 0, [&](ValueId) {
      // Inclusive: dx_j = sum_{i >= j} ct_i = total - exclusive_cumsum(ct)_j; exclusive: total
      // minus the inclusive cumsum.
      bool exclusive = op.number("exclusive", 0) != 0;
      ValueId total = b.broadcastTo(b.reduce(OpKind::ReduceSum, ct, {dim}), b.type(ct));
      ValueId partial = b.op(OpKind::Cumsum, {ct}, b.type(ct),
                             {{"dim", dim}, {"exclusive", int64_t(exclusive ? 0 : 1)}});
      return b.sub(total, partial);
    });

  // ---- ops that only move elements: the cotangent moves back. cast, transpose and broadcast
  // need only accumulate's fitTo (cast back, transpose back, sum over the broadcast dims).
  case OpKind::Cast:
  case OpKind::Transpose:
  case OpKind::Broadcast:
    return toOperand(op, 0, same);
  case OpKind::Shift:
    return toOperand(op, 0, [&](ValueId) {
      return b.op(OpKind::Shift, {ct}, b.type(ct),
                  {{"dim", dim}, {"offset", -op.integer("offset")}});
    });
  case OpKind::Rename:
    return toOperand(op, 0, [&](ValueId x) {
      std::vector<std::string> from = op.dims("from"), to = op.dims("to");
      TensorType back = b.type(ct); // ct's dims renamed `to` -> `from`, with x's sizes
      for (ir::Dim& d : back.dims)
        for (size_t i = 0; i < from.size() && i < to.size(); ++i)
          if (d.name == to[i]) {
            d.name = from[i];
            if (int at = b.type(x).findDim(from[i]); at >= 0) d.size = b.type(x).dims[at].size;
            break;
          }
      return b.op(OpKind::Rename, {ct}, back, {{"from", to}, {"to", from}});
    });
  case OpKind::Reshape:
    return toOperand(op, 0, [&](ValueId x) {
      return b.op(OpKind::Reshape, {ct}, b.type(x),
                  {{"from", op.dims("to")}, {"to", op.dims("from")}});
    });
  case OpKind::Slice: // zero-pad back into the window
    return toOperand(op, 0, [&](ValueId x) {
      return b.op(
          OpKind::Pad, {ct}, b.type(x),
          {{"from", op.string("to")}, {"to", op.string("from")}, {"before", op.integer("start")}});
    });
  case OpKind::Pad: // the window that holds x
    return toOperand(op, 0, [&](ValueId x) {
      return b.op(
          OpKind::Slice, {ct}, b.type(x),
          {{"from", op.string("to")}, {"to", op.string("from")}, {"start", op.integer("before")}});
    });
  case OpKind::Concat:
    return concatGrad(op, ct);
  case OpKind::Gather:
    return gatherGrad(op, ct);
  case OpKind::Dropout:
    return dropoutGrad(op, ct);

  // No gradient rule (the table's gradient column is empty): nothing flows to operands.
  case OpKind::Input:
  case OpKind::Param:
  case OpKind::Literal:
  case OpKind::Iota:
  case OpKind::RandomNormal:
  case OpKind::TrainStep:
  case OpKind::RandomUniform:
  case OpKind::RandomInt:
  case OpKind::StopGradient:
  case OpKind::Floor: // piecewise constant: zero almost everywhere
  case OpKind::Ceil:
  case OpKind::Round:
  case OpKind::FloorDiv: // i32
  case OpKind::Mod:
  case OpKind::TopK: // i32 indices; top_k_values differentiates through its one_hot pick
  case OpKind::Lt:
  case OpKind::Le:
  case OpKind::Gt:
  case OpKind::Ge:
  case OpKind::Eq:
  case OpKind::Ne:
  case OpKind::OneHot:
  case OpKind::Call:          // rejected before the sweep
  case OpKind::LayerNormGrad: // the same (only autodiff emits it, after the sweep's ops)
    return;
  }
}

/// maximum/minimum give a tie to `a`.
void Differentiator::extremumGrad(const Op& op, ValueId ct) {
  ValueId a = op.operands[0], c = op.operands[1];
  ValueId aWins = b.binary(op.kind == OpKind::Maximum ? OpKind::Ge : OpKind::Le, a, c);
  toOperand(op, 0, [&](ValueId) { return b.where(aWins, ct, zeroLike(ct), b.type(ct)); });
  toOperand(op, 1, [&](ValueId) { return b.where(aWins, zeroLike(ct), ct, b.type(ct)); });
}

void Differentiator::whereGrad(const Op& op, ValueId ct) {
  ValueId cond = op.operands[0];
  toOperand(op, 1, [&](ValueId) { return b.where(cond, ct, zeroLike(ct), b.type(ct)); });
  toOperand(op, 2, [&](ValueId) { return b.where(cond, zeroLike(ct), ct, b.type(ct)); });
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

/// Each part's window of the cotangent.
void Differentiator::concatGrad(const Op& op, ValueId ct) {
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

ValueId Differentiator::sumAlong(ValueId ct, const std::string& dim) {
  // ct = broadcast(c) * one_hot(ids, d) (a cross-entropy's cotangent of log_softmax): the sum
  // over d is c where 0 <= ids < |d|, else 0 (one term c, the rest +-0: the same value, no
  // reduction), so a d split over mesh axes needs no all-reduce of it (Megatron's
  // vocab-parallel cross-entropy backward).
  auto reduced = [&] { return b.reduce(OpKind::ReduceSum, ct, {dim}); };
  const Op& pick = fn.definingOp(ct);
  if (pick.kind != OpKind::Mul || pick.operands.size() != 2) return reduced();
  for (size_t k = 0; k < 2; ++k) {
    const Op& spread = fn.definingOp(pick.operands[k]);
    const Op& hot = fn.definingOp(pick.operands[1 - k]);
    if (spread.kind != OpKind::Broadcast || hot.kind != OpKind::OneHot || hot.string("dim") != dim)
      continue;
    ValueId c = spread.operands[0], ids = hot.operands[0];
    TensorType result = b.type(ct);
    std::erase_if(result.dims, [&](const ir::Dim& d) { return d.name == dim; });
    bool idsWithinC = std::all_of(b.type(ids).dims.begin(), b.type(ids).dims.end(),
                                  [&](const ir::Dim& d) { return b.type(c).hasDim(d.name); });
    if (b.type(c) != result || !idsWithinC) continue;
    int index = b.type(ct).findDim(dim);
    ValueId inside = b.mul(
        b.binary(OpKind::Ge, ids, b.literal(0, ir::DType::I32)),
        b.binary(OpKind::Lt, ids, b.literal(double(b.type(ct).dims[index].size), ir::DType::I32)));
    return b.mul(c, b.cast(inside, result.dtype));
  }
  return reduced();
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
