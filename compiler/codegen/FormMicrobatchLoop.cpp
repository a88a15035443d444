// The microbatch loop (FormMicrobatchLoop.h).
#include "codegen/FormMicrobatchLoop.h"

#include "planner/Microbatching.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>

#include <map>
#include <set>

namespace meshc::kir {
namespace {

llvm::Error internal(const plan::SpmdFunction& spmd, const std::string& what) {
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(), "%s",
      fmt::format("internal error: the microbatch loop of '{}': {}", spmd.name, what).c_str());
}

/// A loop over `type`'s points storing `body`'s last scalar into `to` (reads: row-major).
Stmt pointwise(const ir::TensorType& type, std::vector<BufferId> reads, std::vector<Scalar> body,
               BufferId to) {
  Loop loop;
  for (const ir::Dim& dim : type.dims) {
    loop.dims.push_back(dim.name);
    loop.extents.push_back(dim.size);
  }
  if (loop.dims.empty()) { // a scalar: one point
    loop.dims.push_back("i");
    loop.extents.push_back(1);
  }
  Shape strides = type.dims.empty() ? Shape{1} : rowMajorStrides(type);
  for (BufferId id : reads)
    loop.reads.push_back(Access{id, strides});
  loop.body = std::move(body);
  loop.stores.push_back(Store{Access{to, strides}, int(loop.body.size() - 1)});
  return Stmt{.node = std::move(loop)};
}

bool touches(const Stmt& stmt, const std::set<BufferId>& buffers, bool reads, bool writes) {
  if (reads)
    for (BufferId id : readsOf(stmt))
      if (buffers.count(id)) return true;
  if (writes)
    for (BufferId id : writesOf(stmt))
      if (buffers.count(id)) return true;
  return false;
}

} // namespace

llvm::Error formMicrobatchLoop(KernelFunction& fn, const plan::SpmdFunction& spmd,
                               const std::vector<size_t>& opOf,
                               const std::vector<BufferId>& bufferOf) {
  const plan::Microbatching& m = spmd.microbatching;
  llvm::Expected<plan::MicrobatchSchedule> schedule = plan::scheduleMicrobatches(spmd);
  if (!schedule) return schedule.takeError();
  if (opOf.size() != fn.body.size()) return internal(spmd, "statements without their op");

  // The loop's statements, what runs before it (nothing of the batch) and after it (the update,
  // and the all-reduces that only feed it), each side in its order. A statement deferred past
  // later statements of the loop must not share a buffer they write.
  std::vector<Stmt> before, loop, after;
  std::set<BufferId> deferredReads, deferredWrites;
  for (size_t k = 0; k < fn.body.size(); ++k) {
    Stmt& stmt = fn.body[k];
    size_t op = opOf[k];
    bool collective = std::holds_alternative<Collective>(stmt.node);
    if (schedule->perMicrobatch[op] && !(collective && schedule->afterLoop[op])) {
      if (touches(stmt, deferredWrites, true, true) || touches(stmt, deferredReads, false, true))
        return internal(spmd, "a statement of the update shares a buffer with a later statement "
                              "of the loop: " +
                                  (stmt.sources.empty() ? "" : stmt.sources.front()));
      stmt.perMicrobatch = true;
      loop.push_back(std::move(stmt));
    } else if (loop.empty() && !collective) {
      before.push_back(std::move(stmt));
    } else {
      for (BufferId id : readsOf(stmt))
        deferredReads.insert(id);
      for (BufferId id : writesOf(stmt))
        deferredWrites.insert(id);
      after.push_back(std::move(stmt));
    }
  }
  if (loop.empty()) return internal(spmd, "nothing runs per microbatch");

  // Accumulators: zeroed before the loop, acc += value / K after the value's last write in it.
  double share = 1.0 / double(m.count);
  std::map<BufferId, BufferId> accumulatorOf;
  std::vector<std::pair<size_t, Stmt>> accumulations; // (after loop[position], statement)
  for (plan::SpmdValueId value : schedule->accumulated) {
    BufferId from = bufferOf[value];
    if (from == kNoBuffer || accumulatorOf.count(from)) continue;
    const ir::TensorType& type = spmd.values[value].localType;
    const Buffer buffer = fn.buffers[size_t(from)]; // a copy: addBuffer below may move them
    if (buffer.elements != type.numElements())
      return internal(spmd, "an accumulated value whose buffer is not its size");
    std::string what = buffer.what.empty() ? buffer.name : buffer.what;
    BufferId acc = fn.addBuffer(Buffer{.name = "acc_" + buffer.name,
                                       .what = "mean over microbatches of " + what,
                                       .elements = buffer.elements,
                                       .dtype = DType::F32});
    accumulatorOf[from] = acc;
    plan::Phase phase = spmd.values[value].name.rfind("grad/", 0) == 0 ? plan::Phase::Backward
                                                                       : plan::Phase::Forward;
    Stmt zero = pointwise(type, {}, {Scalar{.kind = Scalar::Kind::Const, .value = 0}}, acc);
    zero.sources = {"zero the accumulator of " + what};
    zero.phase = phase;
    before.push_back(std::move(zero));
    size_t last = loop.size();
    for (size_t k = 0; k < loop.size(); ++k)
      if (llvm::is_contained(writesOf(loop[k]), from)) last = k;
    if (last == loop.size()) return internal(spmd, what + " is not computed in the loop");
    Stmt add =
        pointwise(type, {acc, from},
                  {Scalar{.kind = Scalar::Kind::Load, .read = 0},
                   Scalar{.kind = Scalar::Kind::Load, .read = 1, .dtype = buffer.dtype},
                   Scalar{.kind = Scalar::Kind::Const, .value = share},
                   Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Mul, .args = {1, 2}},
                   Scalar{.kind = Scalar::Kind::Compute, .op = ir::OpKind::Add, .args = {0, 3}}},
                  acc);
    add.sources = {fmt::format("accumulate {} / {}", what, m.count)};
    add.phase = phase;
    add.perMicrobatch = true;
    accumulations.emplace_back(last, std::move(add));
  }
  // Back to front, so that earlier positions stay put (stable for one position).
  llvm::stable_sort(accumulations, [](const auto& a, const auto& b) { return a.first > b.first; });
  for (auto& [position, stmt] : accumulations)
    loop.insert(loop.begin() + std::ptrdiff_t(position + 1), std::move(stmt));

  // Microbatch m reads the m-th slice of each input along the dim (a copy the loop reads).
  std::vector<Stmt> slices;
  for (size_t k = 0; k < spmd.inputs.size(); ++k) {
    const ir::TensorType& type = spmd.values[spmd.inputs[k]].localType;
    int position = type.findDim(m.dim);
    BufferId input = bufferOf[spmd.inputs[k]];
    if (position < 0 || input == kNoBuffer) continue;
    Buffer& whole = fn.buffers[size_t(input)];
    BufferId slice = fn.addBuffer(Buffer{.name = whole.name + "_mb",
                                         .what = "microbatch of " + whole.what,
                                         .elements = whole.elements,
                                         .dtype = whole.dtype});
    fn.buffers[size_t(input)].elements *= m.count;
    for (Stmt& stmt : loop)
      replaceBuffer(stmt, input, slice);
    Shape sizes = sizesOf(type);
    sizes[size_t(position)] *= m.count;
    Stmt copy{.node = Call{.callee = Callee::SliceDim,
                           .args = {Arg{.kind = Arg::Kind::View, .buffer = slice},
                                    Arg{.kind = Arg::Kind::View, .buffer = input},
                                    Arg{.kind = Arg::Kind::Ints, .ints = sizes},
                                    Arg{.kind = Arg::Kind::Int, .value = double(position)},
                                    Arg{.kind = Arg::Kind::BlockIndex, .names = {kMicrobatchAxis}},
                                    Arg{.kind = Arg::Kind::Int, .value = double(m.count)}},
                           .out = slice,
                           .reads = {input}},
              .sources = {fmt::format("microbatch of input {} along {}",
                                      fn.buffers[size_t(input)].what, m.dim)},
              .perMicrobatch = true};
    slices.push_back(std::move(copy));
  }
  if (slices.empty())
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(), "%s",
        fmt::format("cannot microbatch train block '{}': none of its inputs has the dim '{}'",
                    spmd.name, m.dim)
            .c_str());
  loop.insert(loop.begin(), std::make_move_iterator(slices.begin()),
              std::make_move_iterator(slices.end()));

  // After the loop, the accumulators stand for the values.
  for (Stmt& stmt : after)
    for (const auto& [from, acc] : accumulatorOf)
      replaceBuffer(stmt, from, acc);
  for (BufferId& id : fn.outputs)
    if (accumulatorOf.count(id)) id = accumulatorOf[id];
  for (KernelFunction::Update& update : fn.updates)
    if (accumulatorOf.count(update.value)) update.value = accumulatorOf[update.value];

  fn.body = std::move(before);
  for (std::vector<Stmt>* part : {&loop, &after})
    fn.body.insert(fn.body.end(), std::make_move_iterator(part->begin()),
                   std::make_move_iterator(part->end()));
  fn.microbatches = KernelFunction::Microbatches{m.count, m.dim};
  return llvm::Error::success();
}

void widenInputsToStep(ir::Function& irFn, plan::SpmdFunction& spmd) {
  const plan::Microbatching& m = spmd.microbatching;
  auto widen = [&](ir::TensorType& type) {
    for (ir::Dim& dim : type.dims)
      if (dim.name == m.dim) dim.size *= m.count;
  };
  for (ir::InputInfo& input : irFn.inputs) {
    widen(input.type);
    widen(irFn.values[input.value].type);
  }
  for (plan::SpmdValueId id : spmd.inputs) {
    widen(spmd.values[id].globalType);
    widen(spmd.values[id].localType);
  }
}

} // namespace meshc::kir
