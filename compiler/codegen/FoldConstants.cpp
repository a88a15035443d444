// Pass fold-constants (FoldConstants.h).
#include "codegen/FoldConstants.h"

#include "interp/ScalarMath.h"

#include <llvm/ADT/STLExtras.h>

#include <optional>

namespace meshc::kir {
namespace {

using Constants = std::vector<std::optional<double>>;

/// Per buffer: the value every element holds, when its only writer is a loop storing a
/// constant (a literal broadcast).
Constants constantBuffers(const KernelFunction& fn) {
  std::vector<int> writers = fn.writerCounts();
  Constants constants(fn.buffers.size());
  for (const Stmt& stmt : fn.body)
    if (const Loop* loop = std::get_if<Loop>(&stmt.node))
      for (const Store& store : loop->stores) {
        const Scalar& value = loop->body[size_t(store.value)];
        BufferId id = store.at.buffer;
        if (value.kind == Scalar::Kind::Const && writers[size_t(id)] == 1 &&
            fn.buffers[size_t(id)].storage == Storage::Arena)
          constants[size_t(id)] = value.value;
      }
  return constants;
}

/// Drops the scalars no store needs (folded arithmetic leaves its constants behind).
void removeDeadScalars(Loop& loop) {
  std::vector<bool> used(loop.body.size(), false);
  for (const Store& store : loop.stores)
    used[size_t(store.value)] = true;
  for (size_t k = loop.body.size(); k-- > 0;)
    if (used[k])
      for (int arg : loop.body[k].args)
        used[size_t(arg)] = true;
  std::vector<int> newIndex(loop.body.size(), -1);
  std::vector<Scalar> kept;
  for (size_t k = 0; k < loop.body.size(); ++k) {
    if (!used[k]) continue;
    Scalar scalar = loop.body[k];
    for (int& arg : scalar.args)
      arg = newIndex[size_t(arg)];
    newIndex[k] = int(kept.size());
    kept.push_back(std::move(scalar));
  }
  for (Store& store : loop.stores)
    store.value = newIndex[size_t(store.value)];
  loop.body = std::move(kept);
}

/// Replaces loads of constant buffers by constants and evaluates constant arithmetic.
void foldLoop(Loop& loop, const Constants& constants) {
  for (Scalar& scalar : loop.body) {
    if (scalar.kind == Scalar::Kind::Load) {
      if (const std::optional<double>& value =
              constants[size_t(loop.reads[size_t(scalar.read)].buffer)]) {
        scalar = Scalar{.kind = Scalar::Kind::Const, .value = *value, .dtype = scalar.dtype};
      }
      continue;
    }
    if (scalar.kind != Scalar::Kind::Compute || scalar.op == ir::OpKind::Call) continue;
    std::vector<double> args;
    std::vector<DType> types;
    for (int a : scalar.args) {
      const Scalar& arg = loop.body[size_t(a)];
      if (arg.kind != Scalar::Kind::Const) break;
      args.push_back(arg.value);
      types.push_back(arg.dtype);
    }
    if (args.size() != scalar.args.size()) continue;
    if (std::optional<double> value =
            interp::evaluateElementwise(scalar.op, args, types, scalar.dtype))
      scalar = Scalar{.kind = Scalar::Kind::Const, .value = *value, .dtype = scalar.dtype};
  }
  removeDeadScalars(loop);
  // Reads no load uses any more go away (later indices shift down).
  std::vector<int> newIndex(loop.reads.size(), -1);
  std::vector<Access> kept;
  for (const Scalar& scalar : loop.body)
    if (scalar.kind == Scalar::Kind::Load && newIndex[size_t(scalar.read)] < 0) {
      newIndex[size_t(scalar.read)] = int(kept.size());
      kept.push_back(loop.reads[size_t(scalar.read)]);
    }
  for (Scalar& scalar : loop.body)
    if (scalar.kind == Scalar::Kind::Load) scalar.read = newIndex[size_t(scalar.read)];
  loop.reads = std::move(kept);
}

/// How many statements read each buffer.
std::vector<int> readerCounts(const KernelFunction& fn) {
  std::vector<int> counts(fn.buffers.size(), 0);
  for (const std::vector<Stmt>* list : {&fn.init, &fn.body}) {
    std::vector<std::vector<size_t>> lists = readerLists(*list, fn.buffers.size());
    for (size_t id = 0; id < lists.size(); ++id)
      counts[id] += int(lists[id].size());
  }
  return counts;
}

/// gemm G; loop L = G * c (or G / c), L the only reader of G in the same element order: G
/// takes alpha *= c and L goes away (its buffer's readers read G's).
void foldScalesIntoGemms(KernelFunction& fn) {
  std::vector<int> readers = readerCounts(fn), writers = fn.writerCounts();
  for (size_t g = 0; g < fn.body.size(); ++g) {
    Gemm* gemm = std::get_if<Gemm>(&fn.body[g].node);
    if (!gemm || gemm->dtype != DType::F32 || gemm->beta != 0) continue;
    BufferId product = gemm->out;
    if (readers[size_t(product)] != 1 || writers[size_t(product)] != 1 || fn.isResult(product))
      continue;
    for (size_t l = g + 1; l < fn.body.size(); ++l) {
      const Stmt& stmt = fn.body[l];
      if (!llvm::is_contained(readsOf(stmt), product)) continue;
      const Loop* loop = std::get_if<Loop>(&stmt.node);
      // body: %0 = load G, %1 = const c, %2 = mul %0 %1 (either order) or div %0 %1.
      if (!loop || loop->body.size() != 3 || loop->stores.size() != 1 || loop->reads.size() != 1 ||
          loop->reads[0].strides != loop->stores[0].at.strides ||
          fn.buffers[size_t(loop->stores[0].at.buffer)].elements !=
              fn.buffers[size_t(product)].elements ||
          fn.buffers[size_t(loop->stores[0].at.buffer)].dtype != DType::F32)
        break;
      const Scalar& op = loop->body[2];
      int load = -1, constant = -1;
      for (int k = 0; k < 2; ++k) {
        if (loop->body[size_t(k)].kind == Scalar::Kind::Load) load = k;
        if (loop->body[size_t(k)].kind == Scalar::Kind::Const) constant = k;
      }
      if (load < 0 || constant < 0 || op.kind != Scalar::Kind::Compute ||
          loop->stores[0].value != 2)
        break;
      double c = loop->body[size_t(constant)].value;
      bool isMul = op.op == ir::OpKind::Mul;
      bool isDiv =
          op.op == ir::OpKind::Div && op.args == std::vector<int>{load, constant} && c != 0;
      if (!isMul && !isDiv) break;
      gemm->alpha *= isMul ? c : 1 / c;
      BufferId scaled = loop->stores[0].at.buffer;
      fn.body[g].sources.insert(fn.body[g].sources.end(), stmt.sources.begin(), stmt.sources.end());
      fn.body.erase(fn.body.begin() + std::ptrdiff_t(l));
      replaceBufferFrom(fn, l, scaled, product);
      readers = readerCounts(fn);
      writers = fn.writerCounts();
      break;
    }
  }
}

} // namespace

void foldConstants(KernelFunction& fn) {
  // Until nothing changes: a folded loop may make its result a constant for its readers.
  for (size_t known = 0;;) {
    Constants constants = constantBuffers(fn);
    size_t count = size_t(llvm::count_if(constants, [](const auto& c) { return c.has_value(); }));
    if (known > 0 && count == known) break;
    known = count;
    for (Stmt& stmt : fn.body)
      if (Loop* loop = std::get_if<Loop>(&stmt.node)) foldLoop(*loop, constants);
    if (count == 0) break;
  }
  foldScalesIntoGemms(fn);
}

} // namespace meshc::kir
