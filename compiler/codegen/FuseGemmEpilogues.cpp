// Pass fuse-gemm-epilogues (FuseGemmEpilogues.h).
#include "codegen/FuseGemmEpilogues.h"

#include <llvm/ADT/STLExtras.h>

#include <optional>

namespace meshc::kir {
namespace {

struct Epilogue {
  BufferId bias = kNoBuffer, out = kNoBuffer;
  bool gelu = false;
};

bool isLoad(const Loop& loop, int index) {
  return loop.body[size_t(index)].kind == Scalar::Kind::Load;
}

/// What `loop` does to `gemm`'s result, when it is only `[gelu](product + bias)` stored densely
/// over the result's dims: the bias along the last dim, where it stores, and whether GELU.
std::optional<Epilogue> epilogueOf(const KernelFunction& fn, const Gemm& gemm, const Loop& loop) {
  Shape sizes;
  for (int64_t d : gemm.outDims)
    sizes.push_back(gemm.sizes[size_t(d)]);
  if (gemm.dtype != DType::F32 || gemm.operands.size() != 2 || gemm.alpha != 1 || gemm.beta != 0 ||
      gemm.bias != kNoBuffer || sizes.empty() || loop.extents != sizes || loop.stores.size() != 1 ||
      !loop.invariants.empty())
    return std::nullopt;
  for (const Scalar& scalar : loop.body)
    if (scalar.dtype != DType::F32) return std::nullopt;
  const Store& store = loop.stores[0];
  Shape dense = rowMajorStrides(sizes);
  const Buffer& out = fn.buffers[size_t(store.at.buffer)];
  if (store.at.strides != dense || out.dtype != DType::F32 ||
      out.elements != fn.buffers[size_t(gemm.out)].elements ||
      llvm::is_contained(gemm.operands, store.at.buffer))
    return std::nullopt;
  int value = store.value;
  const Scalar& top = loop.body[size_t(value)];
  bool gelu = top.kind == Scalar::Kind::Compute && top.op == ir::OpKind::Gelu;
  if (gelu) value = top.args[0];
  // Nothing but the two loads, the add and GELU.
  if (loop.body.size() != (gelu ? 4u : 3u)) return std::nullopt;
  const Scalar& add = loop.body[size_t(value)];
  if (add.kind != Scalar::Kind::Compute || add.op != ir::OpKind::Add || add.args.size() != 2)
    return std::nullopt;
  for (int product : add.args) {
    int bias = add.args[0] == product ? add.args[1] : add.args[0];
    if (!isLoad(loop, product) || !isLoad(loop, bias)) continue;
    const Access& productRead = loop.reads[size_t(loop.body[size_t(product)].read)];
    const Access& biasRead = loop.reads[size_t(loop.body[size_t(bias)].read)];
    if (productRead != Access{gemm.out, dense} || !alongRow(biasRead) ||
        biasRead.buffer == store.at.buffer ||
        fn.buffers[size_t(biasRead.buffer)].elements != sizes.back() ||
        fn.buffers[size_t(biasRead.buffer)].dtype != DType::F32)
      continue;
    return Epilogue{biasRead.buffer, store.at.buffer, gelu};
  }
  return std::nullopt;
}

} // namespace

void fuseGemmEpilogues(KernelFunction& fn) {
  std::vector<std::vector<size_t>> readers = readerLists(fn.body, fn.buffers.size());
  std::vector<int> writers = fn.writerCounts();
  fuseAdjacent(fn, [&](size_t k, Stmt& first, Stmt& second) {
    Gemm* gemm = std::get_if<Gemm>(&first.node);
    const Loop* loop = std::get_if<Loop>(&second.node);
    if (!gemm || !loop || !passedOnly(fn, readers, writers, gemm->out, k + 1)) return false;
    std::optional<Epilogue> epilogue = epilogueOf(fn, *gemm, *loop);
    if (!epilogue) return false;
    gemm->out = epilogue->out;
    gemm->bias = epilogue->bias;
    gemm->gelu = epilogue->gelu;
    return true;
  });
}

} // namespace meshc::kir
