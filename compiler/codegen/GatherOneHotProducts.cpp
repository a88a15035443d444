// Pass gather-one-hot-products (GatherOneHotProducts.h).
#include "codegen/GatherOneHotProducts.h"

#include "planner/Contraction.h"

#include <llvm/ADT/STLExtras.h>

#include <optional>

namespace meshc::kir {
namespace {

/// The one-hot call `oneHot(out, sizes, ids, idStrides, position, start)` that writes `id`.
const Call* oneHotWriting(const KernelFunction& fn, BufferId id) {
  for (const std::vector<Stmt>* stmts : {&fn.init, &fn.body})
    for (const Stmt& stmt : *stmts)
      if (const Call* call = std::get_if<Call>(&stmt.node);
          call && call->callee == Callee::OneHot && call->out == id)
        return call;
  return nullptr;
}

Arg ints(Shape values) {
  return Arg{.kind = Arg::Kind::Ints, .ints = std::move(values)};
}
Arg integer(int64_t value) {
  return Arg{.kind = Arg::Kind::Int, .value = double(value)};
}
Arg data(BufferId id) {
  return Arg{.kind = Arg::Kind::Data, .buffer = id};
}

/// The product as a gather or a scatter-add, when it is one (plan::oneHotProduct, which the cost
/// model reads too): `gemm` = einsum(one-hot X, T) with X written by `oneHot`.
std::optional<Call> rewrite(const Gemm& gemm, size_t x, const Call& oneHot) {
  size_t t = 1 - x;
  const std::vector<int64_t>& xDims = gemm.operandDims[x];
  const std::vector<int64_t>& tDims = gemm.operandDims[t];
  const Shape& xSizes = oneHot.args[1].ints;
  const Shape& idStridesOfX = oneHot.args[3].ints;
  const Shape& position = oneHot.args[4].ints;
  if (xSizes.size() != xDims.size()) return std::nullopt;
  size_t at = xDims.size();
  for (size_t i = 0; i < xDims.size(); ++i) {
    if (gemm.sizes[size_t(xDims[i])] != xSizes[i]) return std::nullopt;
    if (position[i] == 1) at = i;
  }
  if (at == xDims.size()) return std::nullopt;
  int64_t vDim = xDims[at];
  plan::OneHotProduct kind = plan::oneHotProduct(xDims, vDim, tDims, gemm.outDims);
  if (kind == plan::OneHotProduct::None) return std::nullopt;
  // T's dense row-major strides by gemm dim; ids' strides by gemm dim (0 where ids lack it).
  std::vector<int64_t> tStride(gemm.sizes.size(), 0), idStride(gemm.sizes.size(), 0);
  int64_t stride = 1;
  for (size_t i = tDims.size(); i-- > 0;) {
    tStride[size_t(tDims[i])] = stride;
    stride *= gemm.sizes[size_t(tDims[i])];
  }
  for (size_t i = 0; i < xDims.size(); ++i)
    idStride[size_t(xDims[i])] = idStridesOfX[i];
  Shape outSizes, tOverOut, idsOverOut;
  for (int64_t d : gemm.outDims) {
    outSizes.push_back(gemm.sizes[size_t(d)]);
    tOverOut.push_back(tStride[size_t(d)]);
    idsOverOut.push_back(idStride[size_t(d)]);
  }
  BufferId ids = oneHot.args[2].buffer;
  const Arg& start = oneHot.args[5];
  int64_t rows = gemm.sizes[size_t(vDim)];
  if (kind == plan::OneHotProduct::Gather) // out = T's rows at the ids
    return Call{.callee = Callee::Gather,
                .args = {data(gemm.out), ints(outSizes), data(gemm.operands[t]), ints(tOverOut),
                         data(ids), ints(idsOverOut), integer(rows), integer(tStride[size_t(vDim)]),
                         start},
                .out = gemm.out,
                .reads = {gemm.operands[t], ids}};
  // out's row at each id += T at that point, over the dims X and T share and sum.
  Shape points, tOverPoints, idsOverPoints;
  for (int64_t d : xDims) {
    if (d == vDim || llvm::is_contained(gemm.outDims, d)) continue;
    points.push_back(gemm.sizes[size_t(d)]);
    tOverPoints.push_back(tStride[size_t(d)]);
    idsOverPoints.push_back(idStride[size_t(d)]);
  }
  int64_t outAt = llvm::find(gemm.outDims, vDim) - gemm.outDims.begin();
  return Call{.callee = Callee::ScatterAdd,
              .args = {data(gemm.out), ints(outSizes), data(gemm.operands[t]), ints(tOverOut),
                       data(ids), ints(idsOverOut), ints(points), ints(tOverPoints),
                       ints(idsOverPoints), integer(outAt), start},
              .out = gemm.out,
              .reads = {gemm.operands[t], ids}};
}

} // namespace

void gatherOneHotProducts(KernelFunction& fn) {
  for (Stmt& stmt : fn.body) {
    const Gemm* gemm = std::get_if<Gemm>(&stmt.node);
    if (!gemm || gemm->dtype != DType::F32 || gemm->operands.size() != 2 || gemm->alpha != 1 ||
        gemm->beta != 0 || gemm->operands[0] == gemm->operands[1])
      continue;
    for (size_t x = 0; x < 2; ++x) {
      const Call* oneHot = oneHotWriting(fn, gemm->operands[x]);
      if (!oneHot) continue;
      if (std::optional<Call> call = rewrite(*gemm, x, *oneHot)) {
        stmt.node = std::move(*call);
        break;
      }
    }
  }
}

} // namespace meshc::kir
