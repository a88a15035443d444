#include "planner/LoopNests.h"

#include "ir/OpTraits.h"

#include <algorithm>

namespace meshc::plan {

using ir::OpKind;

bool isLoopOp(const ir::Function& fn, const ir::Op& op) {
  // Codegen's elementwise lowering: the op table's elementwise ops, and the literals and step
  // counter they read (constants of the loop body); dropout is a loop only where it is not the
  // identity.
  if (op.kind == OpKind::Literal || op.kind == OpKind::TrainStep) return true;
  if (op.kind == OpKind::Dropout) return fn.kind == ir::Function::Kind::Train;
  return ir::opTraits(op.kind).isElementwise();
}

bool isTranscendental(OpKind kind) {
  switch (kind) {
  case OpKind::Exp:
  case OpKind::Log:
  case OpKind::Tanh:
  case OpKind::Sigmoid:
  case OpKind::Gelu:
  case OpKind::Sin:
  case OpKind::Cos:
  case OpKind::Pow:
  case OpKind::Call:
    return true;
  default:
    return false;
  }
}

double roundingFlops(ir::DType dtype) {
  switch (dtype) {
  case ir::DType::BF16:
    return 8;
  case ir::DType::F16:
    return 14;
  case ir::DType::F32:
  case ir::DType::I32:
    return 0;
  }
  return 0;
}

namespace {

constexpr size_t kMaxOperands = 28; // operands past it are counted as read from memory

bool sameDims(const ir::TensorType& a, const ir::TensorType& b) {
  if (a.dims.size() != b.dims.size()) return false;
  for (size_t i = 0; i < a.dims.size(); ++i)
    if (a.dims[i].name != b.dims[i].name || a.dims[i].size != b.dims[i].size) return false;
  return true;
}

/// Every dim of `part` is a dim of `whole` (a broadcast of `part` over the others).
bool dimsWithin(const ir::TensorType& part, const ir::TensorType& whole) {
  return std::all_of(part.dims.begin(), part.dims.end(), [&](const ir::Dim& dim) {
    int at = whole.findDim(dim.name);
    return at >= 0 && whole.dims[size_t(at)].size == dim.size;
  });
}

} // namespace

std::vector<std::vector<uint32_t>> valueReaders(const ir::Function& fn) {
  std::vector<std::vector<uint32_t>> readers(fn.values.size());
  for (uint32_t j = 0; j < fn.ops.size(); ++j)
    for (ir::ValueId operand : fn.ops[j].operands)
      if (readers[operand].empty() || readers[operand].back() != j) readers[operand].push_back(j);
  return readers;
}

std::vector<LoopRole> loopRoles(const ir::Function& fn) {
  return loopRoles(fn, valueReaders(fn));
}

std::vector<LoopRole> loopRoles(const ir::Function& fn,
                                const std::vector<std::vector<uint32_t>>& readers) {
  std::vector<LoopRole> roles(fn.ops.size());
  // Per value: whether it leaves the function.
  std::vector<bool> leaves(fn.values.size(), false);
  for (const ir::OutputInfo& output : fn.outputs)
    leaves[output.value] = true;
  for (const ir::ParamUpdate& update : fn.updates)
    leaves[update.value] = true;
  // In op order: a producer's own producers have decided by the time it does, so its nest (and
  // whether the nest is cheap) is complete. fuse-loops moves a producer down to its first
  // reader, which it cannot do past another reader, so only the first reader may take it.
  std::vector<bool> cheapNest(fn.ops.size(), false); // recomputing it per point is cheap
  for (uint32_t i = 0; i < fn.ops.size(); ++i) {
    const ir::Op& op = fn.ops[i];
    LoopRole& role = roles[i];
    role.loop = isLoopOp(fn, op);
    if (!role.loop) continue;
    bool cheap = !isTranscendental(op.kind) && op.kind != OpKind::Dropout;
    for (size_t k = 0; k < op.operands.size() && k < kMaxOperands; ++k)
      if (role.inRegister & (1u << k))
        cheap = cheap && cheapNest[fn.values[op.operands[k]].definingOp];
    cheapNest[i] = cheap;
    ir::ValueId value = op.result;
    if (readers[value].empty()) continue;
    uint32_t first = readers[value].front();
    const ir::Op& consumer = fn.ops[first];
    if (!isLoopOp(fn, consumer)) continue;
    const ir::TensorType& produced = fn.typeOf(value);
    const ir::TensorType& space = fn.typeOf(consumer.result);
    bool others = readers[value].size() > 1 || leaves[value];
    bool fuses = sameDims(produced, space) || (!others && cheap && dimsWithin(produced, space));
    if (!fuses) continue;
    role.fused = true;
    role.stored = others;
    for (size_t k = 0; k < consumer.operands.size() && k < kMaxOperands; ++k)
      if (consumer.operands[k] == value) roles[first].inRegister |= 1u << k;
  }
  return roles;
}

} // namespace meshc::plan
