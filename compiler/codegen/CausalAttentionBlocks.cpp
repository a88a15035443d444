// Pass causal-attention-blocks (CausalAttentionBlocks.h).
#include "codegen/CausalAttentionBlocks.h"

#include <llvm/ADT/STLExtras.h>

#include <cmath>
#include <map>
#include <optional>
#include <set>

namespace meshc::kir {
namespace {

/// A buffer one dense loop store wrote, zero wherever its `col` coordinate exceeds its `row`
/// coordinate. The coordinates are those of the storing loop's dims (extent > 1 only), each
/// with its stride in the buffer: the store being dense, an element's offset decomposes into
/// them one way only.
struct Triangle {
  Shape strides, extents;
  size_t row = 0, col = 0;
  bool finite = false; // every element finite (so x * element is zero where it is)
};

/// What is known of a loop scalar at every point.
struct Value {
  enum class Kind { Unknown, Index, ZeroAbove, Const };
  Kind kind = Kind::Unknown;
  int dim = -1;           // Index: the value is this loop dim's index
  int row = -1, col = -1; // ZeroAbove: zero wherever index[col] > index[row]
  double value = 0;       // Const
  bool finite = false;
};

Value zeroAbove(int row, int col) {
  return Value{.kind = Value::Kind::ZeroAbove, .row = row, .col = col, .finite = true};
}

/// The loop dims that an access over `extents` with `strides` walks as `triangle`'s row and
/// col: every walked dim (stride != 0, extent > 1) must be one of the triangle's dims, one to
/// one, with its stride and extent (then each index is that coordinate of the element read).
std::optional<std::pair<int, int>> matchTriangle(const Triangle& triangle, const Shape& extents,
                                                 const Shape& strides) {
  if (extents.size() != strides.size()) return std::nullopt;
  std::vector<bool> used(triangle.strides.size(), false);
  int row = -1, col = -1;
  for (size_t d = 0; d < extents.size(); ++d) {
    if (strides[d] == 0 || extents[d] == 1) continue;
    size_t t = 0;
    while (t < triangle.strides.size() && triangle.strides[t] != strides[d])
      ++t;
    if (t == triangle.strides.size() || used[t] || triangle.extents[t] != extents[d])
      return std::nullopt;
    used[t] = true;
    if (t == triangle.row) row = int(d);
    if (t == triangle.col) col = int(d);
  }
  if (row < 0 || col < 0) return std::nullopt;
  return std::pair{row, col};
}

/// Which buffers hold an iota of their index or a causal triangle, from their only writer.
class Facts {
public:
  explicit Facts(const KernelFunction& fn) : fn(fn), writers(fn.writerCounts()) {}

  void visit(const std::vector<Stmt>& stmts) {
    for (const Stmt& stmt : stmts) {
      if (const Call* call = std::get_if<Call>(&stmt.node)) visitCall(*call);
      if (const Loop* loop = std::get_if<Loop>(&stmt.node)) visitLoop(*loop);
    }
  }

  const Triangle* triangle(BufferId id) const {
    auto it = triangles.find(id);
    return it == triangles.end() ? nullptr : &it->second;
  }

private:
  bool onlyWriter(BufferId id) const {
    return id >= 0 && size_t(id) < writers.size() && writers[size_t(id)] == 1;
  }

  /// A one-dim iota from position 0 (the dim not split): element i holds i.
  void visitCall(const Call& call) {
    if (call.callee != Callee::Iota || call.args.size() != 4 || !onlyWriter(call.out)) return;
    if (call.args[1].ints.size() == 1 && call.args[2].ints == Shape{1} &&
        call.args[3].kind == Arg::Kind::Int && call.args[3].value == 0)
      iotas[call.out] = call.args[1].ints[0];
  }

  Value load(const Loop& loop, const Scalar& scalar) const {
    const Access& access = loop.reads[size_t(scalar.read)];
    Value result;
    // i32 values are exact integers; a buffer of finite values (cast(tokens >= 0) of a train
    // step, stored once for two readers) reads back finite.
    result.finite = scalar.dtype == DType::I32 || finite.count(access.buffer);
    if (const Triangle* t = triangle(access.buffer)) {
      if (auto dims = matchTriangle(*t, loop.extents, access.strides)) {
        result = zeroAbove(dims->first, dims->second);
        result.finite = t->finite;
      }
      return result;
    }
    auto iota = iotas.find(access.buffer);
    if (iota == iotas.end()) return result;
    int walked = -1;
    for (size_t d = 0; d < access.strides.size(); ++d) {
      if (access.strides[d] == 0 || loop.extents[d] == 1) continue;
      if (walked >= 0 || access.strides[d] != 1 || loop.extents[d] != iota->second) return result;
      walked = int(d);
    }
    if (walked >= 0) result = Value{.kind = Value::Kind::Index, .dim = walked, .finite = true};
    return result;
  }

  /// A comparison's value where it is known to be zero above the diagonal.
  static Value compare(ir::OpKind op, const Value& a, const Value& b) {
    using ir::OpKind;
    Value result;
    result.finite = true; // 0 or 1
    bool indices = a.kind == Value::Kind::Index && b.kind == Value::Kind::Index && a.dim != b.dim;
    // i >= j and i > j are false wherever j > i: rows i, cols j; i <= j and i < j the mirror.
    if (indices && (op == OpKind::Ge || op == OpKind::Gt)) return zeroAbove(a.dim, b.dim);
    if (indices && (op == OpKind::Le || op == OpKind::Lt)) return zeroAbove(b.dim, a.dim);
    // A zero compared with a threshold it does not pass stays zero.
    auto threshold = [](const Value& x, const Value& c, bool strict) {
      return x.kind == Value::Kind::ZeroAbove && c.kind == Value::Kind::Const &&
             (strict ? c.value >= 0 : c.value > 0);
    };
    if ((op == OpKind::Gt && threshold(a, b, true)) || (op == OpKind::Ge && threshold(a, b, false)))
      return zeroAbove(a.row, a.col);
    if ((op == OpKind::Lt && threshold(b, a, true)) || (op == OpKind::Le && threshold(b, a, false)))
      return zeroAbove(b.row, b.col);
    if (op == OpKind::Ne && a.kind == Value::Kind::ZeroAbove && b.kind == Value::Kind::Const &&
        b.value == 0)
      return zeroAbove(a.row, a.col);
    return result;
  }

  static Value compute(const Scalar& scalar, const std::vector<Value>& values) {
    using ir::OpKind;
    std::vector<Value> args;
    for (int arg : scalar.args)
      args.push_back(values[size_t(arg)]);
    switch (scalar.op) {
    case OpKind::Ge:
    case OpKind::Gt:
    case OpKind::Le:
    case OpKind::Lt:
    case OpKind::Ne:
      return args.size() == 2 ? compare(scalar.op, args[0], args[1]) : Value{};
    case OpKind::Where:
      // where(c, x, 0) is zero wherever c is, whatever x is (d_scores of causal attention).
      if (args.size() != 3) return Value{};
      if (args[0].kind == Value::Kind::ZeroAbove && args[2].kind == Value::Kind::Const &&
          args[2].value == 0) {
        Value result = zeroAbove(args[0].row, args[0].col);
        result.finite = args[1].finite;
        return result;
      }
      return Value{.finite = args[1].finite && args[2].finite};
    case OpKind::Cast: // 0 stays 0 in every dtype, an index is exact below 2^24
      return args.size() == 1 ? args[0] : Value{};
    case OpKind::Mul:
      // zero times a finite value is zero.
      if (args.size() != 2) return Value{};
      for (int k = 0; k < 2; ++k)
        if (args[size_t(k)].kind == Value::Kind::ZeroAbove && args[size_t(1 - k)].finite) {
          Value result = args[size_t(k)];
          result.finite = args[0].finite && args[1].finite;
          return result;
        }
      return Value{.finite = args[0].finite && args[1].finite};
    default:
      return Value{};
    }
  }

  void visitLoop(const Loop& loop) {
    std::vector<Value> values;
    for (const Scalar& scalar : loop.body) {
      Value value;
      if (scalar.kind == Scalar::Kind::Load)
        value = load(loop, scalar);
      else if (scalar.kind == Scalar::Kind::Const)
        value = Value{.kind = Value::Kind::Const,
                      .value = scalar.value,
                      .finite = std::isfinite(scalar.value)};
      else if (scalar.kind == Scalar::Kind::Compute)
        value = compute(scalar, values);
      values.push_back(value);
    }
    Shape dense = rowMajorStrides(loop.extents);
    for (const Store& store : loop.stores) {
      const Value& value = values[size_t(store.value)];
      // Only a buffer this loop writes whole, alone, point for point, holds what it stores.
      // (A dim of extent 1 has no stride to speak of.)
      bool denseStore = store.at.strides.size() == dense.size();
      for (size_t d = 0; denseStore && d < dense.size(); ++d)
        denseStore = loop.extents[d] == 1 || store.at.strides[d] == dense[d];
      if (!denseStore || !onlyWriter(store.at.buffer) ||
          fn.buffers[size_t(store.at.buffer)].elements != pointCount(loop.extents))
        continue;
      if (value.finite) finite.insert(store.at.buffer);
      if (value.kind != Value::Kind::ZeroAbove) continue;
      Triangle triangle;
      for (size_t d = 0; d < loop.extents.size(); ++d) {
        if (loop.extents[d] == 1) continue;
        if (int(d) == value.row) triangle.row = triangle.strides.size();
        if (int(d) == value.col) triangle.col = triangle.strides.size();
        triangle.strides.push_back(dense[d]);
        triangle.extents.push_back(loop.extents[d]);
      }
      if (loop.extents[size_t(value.row)] == 1 || loop.extents[size_t(value.col)] == 1) continue;
      triangle.finite = value.finite;
      triangles[store.at.buffer] = triangle;
    }
  }

  const KernelFunction& fn;
  std::vector<int> writers;
  std::map<BufferId, int64_t> iotas; // buffer -> its length
  std::map<BufferId, Triangle> triangles;
  std::set<BufferId> finite; // every element finite
};

/// A GEMM the pass may take in blocks: f32, two operands, beta 0, no epilogue, not yet marked.
bool plainGemm(const Gemm& gemm) {
  return gemm.dtype == DType::F32 && gemm.operands.size() == 2 && gemm.beta == 0 &&
         gemm.bias == kNoBuffer && !gemm.gelu && gemm.causal.kind == Gemm::Causal::Kind::None;
}

/// Whether `dims` of `gemm` have exactly the sizes `extents`, in order.
bool sizesAre(const Gemm& gemm, const std::vector<int64_t>& dims, const Shape& extents) {
  if (dims.size() != extents.size()) return false;
  for (size_t d = 0; d < dims.size(); ++d)
    if (gemm.sizes[size_t(dims[d])] != extents[d]) return false;
  return true;
}

/// Marks `gemm`, whose operand p is zero above the diagonal of its dims `row` (the query
/// positions) and `col` (the key positions), when it contracts one of them with the other
/// operand and keeps the other: Context (the keys contracted: probs . v, d_scores . k) or
/// KeyGradient (the queries: probs^T . d_context, d_scores^T . q).
bool markContraction(Gemm& gemm, size_t p, int64_t row, int64_t col, bool uniformTails,
                     bool knownZeros) {
  const std::vector<int64_t>& other = gemm.operandDims[1 - p];
  auto out = [&](int64_t d) { return llvm::is_contained(gemm.outDims, d); };
  auto contracted = [&](int64_t d) { return !out(d) && llvm::is_contained(other, d); };
  int64_t size = gemm.sizes[size_t(row)];
  if (!plainGemm(gemm) || gemm.operands[1 - p] == gemm.operands[p] ||
      gemm.sizes[size_t(col)] != size || size % kCausalBlock != 0 || size < 2 * kCausalBlock)
    return false;
  Gemm::Causal::Kind kind;
  if (out(row) && contracted(col))
    kind = Gemm::Causal::Kind::Context;
  else if (contracted(row) && out(col))
    kind = Gemm::Causal::Kind::KeyGradient;
  else
    return false;
  gemm.causal = Gemm::Causal{.kind = kind,
                             .row = row,
                             .col = col,
                             .block = kCausalBlock,
                             .weights = int64_t(p),
                             .uniformTails = uniformTails,
                             .knownZeros = knownZeros};
  return true;
}

} // namespace

void causalAttentionBlocks(KernelFunction& fn) {
  if (!fn.subroutines.empty()) return; // runs before outlining: every statement is in the body
  Facts facts(fn);
  facts.visit(fn.init);
  facts.visit(fn.body);
  std::vector<std::vector<size_t>> readers = readerLists(fn.body, fn.buffers.size());
  std::vector<int> writers = fn.writerCounts();
  for (size_t k = 0; k < fn.body.size(); ++k) {
    Call* softmax = std::get_if<Call>(&fn.body[k].node);
    if (!softmax || softmax->callee != Callee::MaskedSoftmax || softmax->args.size() != 8) continue;
    // maskedSoftmax(out, in, mask, outer, maskOuter, size, maskLane, fill): the mask as an
    // access over [outer..., size].
    const Triangle* mask = facts.triangle(softmax->args[2].buffer);
    if (!mask) continue;
    Shape extents = softmax->args[3].ints, strides = softmax->args[4].ints;
    int64_t size = int64_t(softmax->args[5].value);
    extents.push_back(size);
    strides.push_back(int64_t(softmax->args[6].value));
    auto dims = matchTriangle(*mask, extents, strides);
    // The mask's rows along one outer dim of the softmax, its cols along the softmax's lane
    // (the key positions), both of the same extent, a multiple of the block at least twice.
    if (!dims || size_t(dims->second) + 1 != extents.size() ||
        extents[size_t(dims->first)] != size || size % kCausalBlock != 0 || size < 2 * kCausalBlock)
      continue;
    size_t row = size_t(dims->first);
    BufferId scores = softmax->args[1].buffer, weights = softmax->out;
    // The softmax over the keys each row sees: where(mask, x, fill) is the fill past the query
    // position whatever the scores there, so they are never read.
    softmax->callee = Callee::CausalMaskedSoftmax;
    softmax->args.push_back(Arg{.kind = Arg::Kind::Int, .value = double(row)});

    // The scores: written by a GEMM for this softmax alone, densely over [outer..., size].
    if (writers[size_t(scores)] == 1 && readers[size_t(scores)] == std::vector<size_t>{k} &&
        !fn.isResult(scores))
      for (size_t j = k; j-- > 0;) {
        Gemm* gemm = std::get_if<Gemm>(&fn.body[j].node);
        if (!gemm || gemm->out != scores) continue;
        if (plainGemm(*gemm) && samePlace(fn.body[j], fn.body[k]) &&
            sizesAre(*gemm, gemm->outDims, extents))
          gemm->causal = Gemm::Causal{.kind = Gemm::Causal::Kind::Scores,
                                      .row = gemm->outDims[row],
                                      .col = gemm->outDims.back(),
                                      .block = kCausalBlock,
                                      .fill = softmax->args[7].value,
                                      .fillAbove = false};
        break;
      }

    // The weights: contracted along the key positions (probs . v) or, in backward, along the
    // query positions (probs^T . d_context) with another operand.
    if (writers[size_t(weights)] != 1) continue;
    for (size_t reader : readers[size_t(weights)]) {
      Gemm* gemm = std::get_if<Gemm>(&fn.body[reader].node);
      if (!gemm || reader < k || !samePlace(fn.body[reader], fn.body[k]) || gemm->out == weights)
        continue;
      for (size_t p = 0; p < 2; ++p) {
        const std::vector<int64_t>& operand = gemm->operandDims[p];
        if (gemm->operands[p] == weights && sizesAre(*gemm, operand, extents) &&
            markContraction(*gemm, p, operand[row], operand.back(), /*uniformTails=*/true,
                            /*knownZeros=*/false))
          break;
      }
    }
  }

  // GEMMs of a buffer that is exactly zero above the diagonal (d_scores: where(causal mask, x,
  // 0) scaled), contracting one of its positions: d_scores . k, d_scores^T . q.
  for (Stmt& stmt : fn.body) {
    Gemm* gemm = std::get_if<Gemm>(&stmt.node);
    if (!gemm || !plainGemm(*gemm)) continue;
    for (size_t p = 0; p < 2; ++p) {
      const Triangle* triangle = facts.triangle(gemm->operands[p]);
      if (!triangle) continue;
      const std::vector<int64_t>& operand = gemm->operandDims[p];
      Shape extents;
      for (int64_t d : operand)
        extents.push_back(gemm->sizes[size_t(d)]);
      auto dims = matchTriangle(*triangle, extents, rowMajorStrides(extents));
      if (dims &&
          markContraction(*gemm, p, operand[size_t(dims->first)], operand[size_t(dims->second)],
                          /*uniformTails=*/false, /*knownZeros=*/true))
        break;
    }
  }
}

} // namespace meshc::kir
