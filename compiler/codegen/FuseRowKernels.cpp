// Pass fuse-row-kernels (FuseRowKernels.h).
#include "codegen/FuseRowKernels.h"

#include <optional>

namespace meshc::kir {
namespace {

Arg data(BufferId id) {
  return Arg{.kind = Arg::Kind::Data, .buffer = id};
}
Arg integer(int64_t value) {
  return Arg{.kind = Arg::Kind::Int, .value = double(value)};
}

/// An `along` call's rows when they are dense: one whole lane of stride 1 in `in` and `out`, the
/// rows one lane apart in both (along's arguments: out, in, outer, inOuter, outOuter, lane,
/// inLane, outLane, kind, eps, global lane count, group). Returns the loop extents that walk the
/// same elements (outer, then the lane).
std::optional<Shape> denseRows(const Call& along, const char* kind) {
  if (along.callee != Callee::Along || along.args.size() != 12) return std::nullopt;
  const Shape &outer = along.args[2].ints, &lane = along.args[5].ints;
  if (along.args[8].text != kind || !along.args[11].names.empty() || lane.size() != 1 ||
      along.args[6].ints != Shape{1} || along.args[7].ints != Shape{1})
    return std::nullopt;
  Shape extents = outer;
  extents.push_back(lane[0]);
  Shape strides = rowMajorStrides(extents);
  strides.pop_back();
  if (along.args[3].ints != strides || along.args[4].ints != strides) return std::nullopt;
  return extents;
}

const Scalar* loadOf(const Loop& loop, int index) {
  const Scalar& scalar = loop.body[size_t(index)];
  return scalar.kind == Scalar::Kind::Load ? &scalar : nullptr;
}

/// The read of a load scalar `index` of `loop`.
const Access& readOf(const Loop& loop, int index) {
  return loop.reads[size_t(loop.body[size_t(index)].read)];
}

bool allF32(const KernelFunction& fn, const Loop& loop) {
  for (const Scalar& scalar : loop.body)
    if (scalar.dtype != DType::F32) return false;
  return fn.buffers[size_t(loop.stores[0].at.buffer)].dtype == DType::F32;
}

/// layer_norm into `normalized`, then `loop` = normalized * gain + bias along the row, storing
/// only that: one layerNormAffine call.
std::optional<Call> layerNormAffine(const KernelFunction& fn, const Call& along, const Loop& loop) {
  std::optional<Shape> extents = denseRows(along, "Along::LayerNorm");
  if (!extents || loop.extents != *extents || loop.stores.size() != 1 || loop.body.size() != 5 ||
      !allF32(fn, loop))
    return std::nullopt;
  const Store& store = loop.stores[0];
  Shape dense = rowMajorStrides(*extents);
  const Scalar& add = loop.body[size_t(store.value)];
  if (store.at.strides != dense || add.kind != Scalar::Kind::Compute || add.op != ir::OpKind::Add)
    return std::nullopt;
  // add(mul(x, gain), bias), the operands of each in either order.
  for (int product : add.args) {
    int bias = add.args[0] == product ? add.args[1] : add.args[0];
    const Scalar& mul = loop.body[size_t(product)];
    if (mul.kind != Scalar::Kind::Compute || mul.op != ir::OpKind::Mul || !loadOf(loop, bias) ||
        !alongRow(readOf(loop, bias)))
      continue;
    for (int x : mul.args) {
      int gain = mul.args[0] == x ? mul.args[1] : mul.args[0];
      if (!loadOf(loop, x) || !loadOf(loop, gain) || !alongRow(readOf(loop, gain))) continue;
      const Access& normalized = readOf(loop, x);
      if (normalized.buffer != along.out || normalized.strides != dense) continue;
      BufferId out = store.at.buffer;
      BufferId gainBuffer = readOf(loop, gain).buffer, biasBuffer = readOf(loop, bias).buffer;
      int64_t size = extents->back();
      return Call{.callee = Callee::LayerNormAffine,
                  .args = {data(out), along.args[1],
                           integer(fn.buffers[size_t(out)].elements / size), integer(size),
                           data(gainBuffer), data(biasBuffer), along.args[9], along.args[10]},
                  .out = out,
                  .reads = {along.args[1].buffer, gainBuffer, biasBuffer}};
    }
  }
  return std::nullopt;
}

/// `loop` = where(mask, x, fill) into the buffer `along` then takes the softmax of: one
/// maskedSoftmax call.
std::optional<Call> maskedSoftmax(const KernelFunction& fn, const Loop& loop, const Call& along) {
  std::optional<Shape> extents = denseRows(along, "Along::Softmax");
  if (!extents || loop.extents != *extents || loop.stores.size() != 1 || loop.body.size() != 4 ||
      fn.buffers[size_t(loop.stores[0].at.buffer)].dtype != DType::F32)
    return std::nullopt;
  const Store& store = loop.stores[0];
  Shape dense = rowMajorStrides(*extents);
  const Scalar& where = loop.body[size_t(store.value)];
  if (store.at.buffer != along.args[1].buffer || store.at.strides != dense ||
      where.kind != Scalar::Kind::Compute || where.op != ir::OpKind::Where ||
      where.dtype != DType::F32 || where.args.size() != 3)
    return std::nullopt;
  const Scalar& fill = loop.body[size_t(where.args[2])];
  if (!loadOf(loop, where.args[0]) || !loadOf(loop, where.args[1]) ||
      fill.kind != Scalar::Kind::Const || loop.body[size_t(where.args[1])].dtype != DType::F32)
    return std::nullopt;
  const Access &mask = readOf(loop, where.args[0]), &x = readOf(loop, where.args[1]);
  if (x.strides != dense) return std::nullopt;
  Shape maskOuter = mask.strides;
  maskOuter.pop_back();
  Shape outer = *extents;
  outer.pop_back();
  return Call{.callee = Callee::MaskedSoftmax,
              .args = {along.args[0], data(x.buffer), data(mask.buffer),
                       Arg{.kind = Arg::Kind::Ints, .ints = outer},
                       Arg{.kind = Arg::Kind::Ints, .ints = maskOuter}, integer(extents->back()),
                       integer(mask.strides.back()),
                       Arg{.kind = Arg::Kind::Real, .value = fill.value}},
              .out = along.out,
              .reads = {x.buffer, mask.buffer}};
}

/// `loop` = a * b of two f32 loads whose rows are contiguous, stored densely into the buffer that
/// `reduce` then sums along its last dim (a dense run of each row): one reduceProduct call.
std::optional<Call> reduceProduct(const KernelFunction& fn, const Loop& loop, const Call& reduce) {
  // reduce's arguments: out, out sizes, in, in's outer strides, lane, lane strides, kind, scale.
  if (reduce.callee != Callee::Reduce || reduce.args.size() != 8 ||
      reduce.args[6].text != "Reduce::Sum" || loop.stores.size() != 1 || loop.body.size() != 3 ||
      loop.extents.empty() || !allF32(fn, loop))
    return std::nullopt;
  const Store& store = loop.stores[0];
  Shape outer = loop.extents;
  int64_t size = outer.back();
  outer.pop_back();
  Shape dense = rowMajorStrides(loop.extents), denseOuter = dense;
  denseOuter.pop_back();
  if (reduce.args[2].buffer != store.at.buffer || store.at.strides != dense ||
      reduce.args[1].ints != outer || reduce.args[3].ints != denseOuter ||
      reduce.args[4].ints != Shape{size} || reduce.args[5].ints != Shape{1})
    return std::nullopt;
  const Scalar& mul = loop.body[size_t(store.value)];
  if (mul.kind != Scalar::Kind::Compute || mul.op != ir::OpKind::Mul || mul.args.size() != 2 ||
      !loadOf(loop, mul.args[0]) || !loadOf(loop, mul.args[1]))
    return std::nullopt;
  const Access &a = readOf(loop, mul.args[0]), &b = readOf(loop, mul.args[1]);
  if (a.strides.back() != 1 || b.strides.back() != 1) return std::nullopt;
  Shape aOuter = a.strides, bOuter = b.strides;
  aOuter.pop_back();
  bOuter.pop_back();
  return Call{.callee = Callee::ReduceProduct,
              .args = {reduce.args[0], Arg{.kind = Arg::Kind::Ints, .ints = outer}, integer(size),
                       data(a.buffer), Arg{.kind = Arg::Kind::Ints, .ints = aOuter}, data(b.buffer),
                       Arg{.kind = Arg::Kind::Ints, .ints = bOuter}, reduce.args[7]},
              .out = reduce.out,
              .reads = {a.buffer, b.buffer}};
}

/// `loop` = a sum of two or three loads (t0 + t1, or t0 + (t1 + t2) with the operands of each
/// add in either order), every term's row contiguous, stored densely into the buffer `norm` (a
/// layerNormAffine) then normalizes: one addLayerNormAffine call that stores the sum too.
std::optional<Call> addLayerNormAffine(const KernelFunction& fn, const Loop& loop,
                                       const Call& norm) {
  if (norm.callee != Callee::LayerNormAffine || norm.args.size() != 8 || loop.stores.size() != 1 ||
      loop.extents.empty() || !allF32(fn, loop))
    return std::nullopt;
  const Store& store = loop.stores[0];
  BufferId sum = store.at.buffer, out = norm.out;
  Shape outer = loop.extents;
  int64_t size = outer.back();
  outer.pop_back();
  int64_t rows = 1;
  for (int64_t extent : outer)
    rows *= extent;
  if (norm.args[1].buffer != sum || store.at.strides != rowMajorStrides(loop.extents) ||
      int64_t(norm.args[3].value) != size || int64_t(norm.args[2].value) != rows)
    return std::nullopt;
  // The add tree: every scalar of the body is one of its loads or adds.
  auto isAdd = [&](int index) {
    const Scalar& scalar = loop.body[size_t(index)];
    return scalar.kind == Scalar::Kind::Compute && scalar.op == ir::OpKind::Add &&
           scalar.args.size() == 2;
  };
  if (!isAdd(store.value)) return std::nullopt;
  const Scalar& root = loop.body[size_t(store.value)];
  std::vector<int> terms; // loads, in the kernel's order: t0 + t1, or t0 + (t1 + t2)
  for (int first : root.args) {
    int second = root.args[0] == first ? root.args[1] : root.args[0];
    if (!loadOf(loop, first)) continue;
    if (loadOf(loop, second)) {
      terms = {first, second};
      break;
    }
    const Scalar& inner = loop.body[size_t(second)];
    if (isAdd(second) && loadOf(loop, inner.args[0]) && loadOf(loop, inner.args[1])) {
      terms = {first, inner.args[0], inner.args[1]};
      break;
    }
  }
  if (terms.empty() || loop.body.size() != 2 * terms.size() - 1) return std::nullopt;
  std::vector<Arg> args = {data(out),     data(sum),    Arg{.kind = Arg::Kind::Ints, .ints = outer},
                           integer(size), norm.args[4], norm.args[5],
                           norm.args[6],  norm.args[7]};
  std::vector<BufferId> reads;
  for (int term : terms) {
    const Access& access = readOf(loop, term);
    // Each term's row walks its buffer contiguously, and no term is a buffer the kernel
    // writes: it computes a row's sum and normalizes it before the next row's.
    if (access.strides.back() != 1 || access.buffer == sum || access.buffer == out)
      return std::nullopt;
    Shape termOuter = access.strides;
    termOuter.pop_back();
    args.push_back(data(access.buffer));
    args.push_back(Arg{.kind = Arg::Kind::Ints, .ints = termOuter});
    reads.push_back(access.buffer);
  }
  if (terms.size() == 2) { // no third term
    args.push_back(Arg{.kind = Arg::Kind::Text, .text = "nullptr"});
    args.push_back(Arg{.kind = Arg::Kind::Ints, .ints = {}});
  }
  reads.push_back(norm.args[4].buffer);
  reads.push_back(norm.args[5].buffer);
  return Call{.callee = Callee::AddLayerNormAffine,
              .args = std::move(args),
              .out = out,
              .reads = std::move(reads),
              .alsoWrites = {sum}};
}

} // namespace

void fuseRowKernels(KernelFunction& fn) {
  std::vector<std::vector<size_t>> readers = readerLists(fn.body, fn.buffers.size());
  std::vector<int> writers = fn.writerCounts();
  fuseAdjacent(fn, [&](size_t k, Stmt& first, Stmt& second) {
    const Call* call = std::get_if<Call>(&first.node);
    const Loop* loop = std::get_if<Loop>(&first.node);
    const Call* nextCall = std::get_if<Call>(&second.node);
    const Loop* nextLoop = std::get_if<Loop>(&second.node);
    std::optional<Call> fused;
    if (call && nextLoop && passedOnly(fn, readers, writers, call->out, k + 1))
      fused = layerNormAffine(fn, *call, *nextLoop);
    else if (loop && nextCall && loop->stores.size() == 1 &&
             passedOnly(fn, readers, writers, loop->stores[0].at.buffer, k + 1)) {
      fused = maskedSoftmax(fn, *loop, *nextCall);
      if (!fused) fused = reduceProduct(fn, *loop, *nextCall);
    }
    if (!fused) return false;
    // The row kernel's sources first: traces name the statement by its op.
    if (loop) std::swap(first.sources, second.sources);
    first.node = std::move(*fused);
    return true;
  });
  // Then the sum before a layerNormAffine formed above (the residual add before a pre-norm
  // layer's norm), which stays stored: the next residual add reads it.
  fuseAdjacent(fn, [&](size_t, Stmt& first, Stmt& second) {
    const Loop* loop = std::get_if<Loop>(&first.node);
    const Call* norm = std::get_if<Call>(&second.node);
    if (!loop || !norm) return false;
    std::optional<Call> fused = addLayerNormAffine(fn, *loop, *norm);
    if (!fused) return false;
    std::swap(first.sources, second.sources);
    first.node = std::move(*fused);
    return true;
  });
}

} // namespace meshc::kir
