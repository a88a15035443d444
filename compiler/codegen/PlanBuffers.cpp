// Pass plan-buffers (PlanBuffers.h).
#include "codegen/PlanBuffers.h"

#include <llvm/ADT/STLExtras.h>

#include <algorithm>
#include <bit>

namespace meshc::kir {
namespace {

size_t padded(size_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

} // namespace

void planBuffers(KernelFunction& fn) {
  // Live ranges over run()'s statements: first touch to last touch (results: to the end; what
  // the microbatch loop shares with the rest of run(): over the whole loop).
  constexpr size_t kNever = ~size_t(0);
  auto [first, last] = liveRanges(fn, fn.body);
  // Pipeline stages: a buffer only some stages touch takes arena bytes on those only, so two
  // buffers of different stages may share bytes, and each stage's arena is its own buffers'.
  std::vector<uint64_t> stages = bufferStages(fn, fn.body);

  struct Slot {
    BufferId id;
    size_t bytes, start, end;
    uint64_t stages;
    size_t offset = 0;
  };
  std::vector<Slot> slots;
  fn.persistentBytes = fn.temporaryBytes = fn.arenaBytes = 0;
  for (size_t id = 0; id < fn.buffers.size(); ++id) {
    Buffer& buffer = fn.buffers[id];
    size_t bytes = size_t(buffer.elements) * sizeof(float); // every dtype is held as float
    if (buffer.copies > 1) bytes = copyStride(buffer) * size_t(buffer.copies);
    if (buffer.storage == Storage::Persistent) {
      buffer.offset = int64_t(fn.persistentBytes);
      fn.persistentBytes += padded(bytes);
    } else if (buffer.storage == Storage::Arena) {
      buffer.offset = -1;
      if (first[id] == kNever) continue; // fused away: never stored
      slots.push_back(Slot{BufferId(id), bytes, first[id], last[id], stages[id]});
      fn.temporaryBytes += bytes;
    }
  }
  // First fit, largest first, among the slots whose live ranges overlap; under pipeline stages
  // the buffers of more stages first, so that each stage's own pack above the shared ones and a
  // lighter stage ends lower.
  std::vector<size_t> order(slots.size());
  for (size_t k = 0; k < order.size(); ++k)
    order[k] = k;
  llvm::stable_sort(order, [&](size_t a, size_t b) {
    return std::make_pair(std::popcount(slots[a].stages), slots[a].bytes) >
           std::make_pair(std::popcount(slots[b].stages), slots[b].bytes);
  });
  std::vector<size_t> placed;
  for (size_t k : order) {
    Slot& slot = slots[k];
    std::vector<const Slot*> conflicts;
    for (size_t other : placed)
      if (slots[other].start <= slot.end && slot.start <= slots[other].end &&
          (slots[other].stages & slot.stages))
        conflicts.push_back(&slots[other]);
    llvm::sort(conflicts, [](const Slot* a, const Slot* b) { return a->offset < b->offset; });
    size_t offset = 0;
    for (const Slot* other : conflicts) {
      if (offset + padded(slot.bytes) <= other->offset) break;
      offset = std::max(offset, other->offset + padded(other->bytes));
    }
    slot.offset = offset;
    placed.push_back(k);
    fn.arenaBytes = std::max(fn.arenaBytes, offset + padded(slot.bytes));
    fn.buffers[size_t(slot.id)].offset = int64_t(offset);
  }
  fn.stageArenaBytes.assign(fn.stages.count > 1 ? size_t(fn.stages.count) : 0, 0);
  for (size_t id = 0; id < fn.buffers.size(); ++id)
    fn.buffers[id].stages = fn.stages.count > 1 && fn.buffers[id].storage == Storage::Arena &&
                                    std::popcount(stages[id]) < fn.stages.count
                                ? stages[id]
                                : 0;
  for (const Slot& slot : slots)
    for (size_t s = 0; s < fn.stageArenaBytes.size(); ++s)
      if ((slot.stages >> s) & 1)
        fn.stageArenaBytes[s] = std::max(fn.stageArenaBytes[s], slot.offset + padded(slot.bytes));
}

} // namespace meshc::kir
