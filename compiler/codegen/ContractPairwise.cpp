// Pass contract-pairwise (ContractPairwise.h).
#include "codegen/ContractPairwise.h"

#include "planner/Contraction.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>

namespace meshc::kir {
namespace {

/// A GEMM over `dims` (ids of `whole`) renumbered to only the dims it uses.
Gemm compact(const Gemm& whole, const std::vector<std::vector<int64_t>>& operandDims,
             const std::vector<int64_t>& outDims) {
  Gemm gemm{.dtype = whole.dtype};
  std::vector<int64_t> idOf(whole.dims.size(), -1);
  auto renumber = [&](const std::vector<int64_t>& dims) {
    std::vector<int64_t> ids;
    for (int64_t d : dims) {
      if (idOf[size_t(d)] < 0) {
        idOf[size_t(d)] = int64_t(gemm.dims.size());
        gemm.dims.push_back(whole.dims[size_t(d)]);
        gemm.sizes.push_back(whole.sizes[size_t(d)]);
      }
      ids.push_back(idOf[size_t(d)]);
    }
    return ids;
  };
  for (const std::vector<int64_t>& dims : operandDims)
    gemm.operandDims.push_back(renumber(dims));
  gemm.outDims = renumber(outDims);
  return gemm;
}

/// The statements that compute `gemm` as planned, in place of `stmt` (its metadata kept).
std::vector<Stmt> rewrite(KernelFunction& fn, const Stmt& stmt, const Gemm& gemm,
                          const plan::Contraction& contraction) {
  std::vector<Stmt> out;
  auto emit = [&](auto node) {
    Stmt next = stmt;
    next.node = std::move(node);
    out.push_back(std::move(next));
  };
  const std::string name = fn.buffers[size_t(gemm.out)].name; // addBuffer moves the buffers
  const std::string held = fn.buffers[size_t(gemm.out)].what;
  std::vector<BufferId> terms = gemm.operands;
  std::vector<std::vector<int64_t>> termDims = gemm.operandDims;
  for (size_t s = 0; s < contraction.steps.size(); ++s) {
    const plan::ContractionStep& step = contraction.steps[s];
    bool last = s + 1 == contraction.steps.size();
    Gemm pair = compact(gemm, {termDims[step.left], termDims[step.right]}, step.dims);
    pair.operands = {terms[step.left], terms[step.right]};
    if (last && contraction.broadcast.empty()) {
      pair.out = gemm.out;
      pair.alpha = gemm.alpha;
      pair.beta = gemm.beta;
    } else {
      std::string what;
      for (int64_t d : step.dims)
        what += (what.empty() ? "" : ",") + gemm.dims[size_t(d)];
      // GEMMs write f32 scratch whatever the einsum's dtype (the einsum rounds once, at its end).
      pair.out = fn.addBuffer(Buffer{.name = fmt::format("{}_c{}", name, s),
                                     .what = fmt::format("{}[{}]", held, what),
                                     .elements = step.elements});
      if (last) pair.alpha = gemm.alpha;
    }
    terms.push_back(pair.out);
    termDims.push_back(step.dims);
    emit(std::move(pair));
  }
  if (contraction.broadcast.empty()) return out;
  // out = product (+ beta * out) over the output's dims, the product repeated along the
  // broadcast dims (stride 0).
  BufferId product = terms.back();
  const std::vector<int64_t>& productDims = termDims.back();
  Loop loop;
  Shape outStrides(gemm.outDims.size()), productStrides(gemm.outDims.size(), 0);
  int64_t stride = 1;
  for (size_t i = gemm.outDims.size(); i-- > 0;) {
    outStrides[i] = stride;
    stride *= gemm.sizes[size_t(gemm.outDims[i])];
  }
  stride = 1;
  for (size_t i = productDims.size(); i-- > 0;) {
    auto at = llvm::find(gemm.outDims, productDims[i]) - gemm.outDims.begin();
    productStrides[size_t(at)] = stride;
    stride *= gemm.sizes[size_t(productDims[i])];
  }
  for (int64_t d : gemm.outDims) {
    loop.dims.push_back(gemm.dims[size_t(d)]);
    loop.extents.push_back(gemm.sizes[size_t(d)]);
  }
  loop.reads.push_back(Access{product, productStrides});
  loop.body.push_back(Scalar{.kind = Scalar::Kind::Load, .read = 0, .dtype = DType::F32});
  int value = 0;
  if (gemm.beta != 0) {
    loop.reads.push_back(Access{gemm.out, outStrides});
    loop.body.push_back(Scalar{.kind = Scalar::Kind::Load, .read = 1, .dtype = DType::F32});
    loop.body.push_back(Scalar{.kind = Scalar::Kind::Const, .value = gemm.beta});
    loop.body.push_back(Scalar{
        .kind = Scalar::Kind::Compute, .op = ir::OpKind::Mul, .args = {1, 2}, .dtype = DType::F32});
    loop.body.push_back(Scalar{
        .kind = Scalar::Kind::Compute, .op = ir::OpKind::Add, .args = {0, 3}, .dtype = DType::F32});
    value = 4;
  }
  loop.stores.push_back(Store{Access{gemm.out, outStrides}, value});
  emit(std::move(loop));
  return out;
}

void rewriteAll(KernelFunction& fn, std::vector<Stmt>& stmts) {
  std::vector<Stmt> next;
  next.reserve(stmts.size());
  for (Stmt& stmt : stmts) {
    const Gemm* gemm = std::get_if<Gemm>(&stmt.node);
    if (!gemm || gemm->operands.size() < 2) {
      next.push_back(std::move(stmt));
      continue;
    }
    plan::Contraction contraction =
        plan::planContraction(gemm->operandDims, gemm->outDims, gemm->sizes);
    if (!contraction.rewritten()) {
      next.push_back(std::move(stmt));
      continue;
    }
    for (Stmt& part : rewrite(fn, stmt, *gemm, contraction))
      next.push_back(std::move(part));
  }
  stmts = std::move(next);
}

} // namespace

void contractPairwise(KernelFunction& function) {
  rewriteAll(function, function.init);
  rewriteAll(function, function.body);
}

} // namespace meshc::kir
