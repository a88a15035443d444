// Pass write-updates-in-place (WriteUpdatesInPlace.h).
#include "codegen/WriteUpdatesInPlace.h"

namespace meshc::kir {

void writeUpdatesInPlace(KernelFunction& fn) {
  std::vector<int> writers = fn.writerCounts();
  for (KernelFunction::Update& update : fn.updates) {
    BufferId param = fn.params[update.param], value = update.value;
    if (value == param || !update.sameLayout || fn.buffers[size_t(value)].storage != Storage::Arena)
      continue;
    bool output = false;
    for (BufferId id : fn.outputs)
      output = output || id == value || id == param;
    if (writers[size_t(value)] != 1 || writers[size_t(param)] != 0 || output) continue;
    size_t at = fn.body.size();
    for (size_t k = 0; k < fn.body.size(); ++k)
      for (BufferId id : writesOf(fn.body[k]))
        if (id == value) at = k;
    if (at == fn.body.size()) continue;
    Loop* loop = std::get_if<Loop>(&fn.body[at].node);
    if (!loop) continue;
    Store* store = nullptr;
    for (Store& s : loop->stores)
      if (s.at.buffer == value) store = &s;
    // The loop reads the old value at the point it writes (or not at all); nothing after it
    // reads the old value.
    bool safe = true;
    for (const Access& read : loop->reads)
      safe = safe && (read.buffer != param || read.strides == store->at.strides);
    for (size_t k = at + 1; k < fn.body.size(); ++k)
      for (BufferId id : readsOf(fn.body[k]))
        safe = safe && id != param;
    for (const KernelFunction::Update& other : fn.updates)
      safe = safe && (&other == &update || other.value != value);
    if (!safe) continue;
    store->at.buffer = param;
    --writers[size_t(value)];
    ++writers[size_t(param)];
    replaceBufferFrom(fn, at + 1, value, param);
    update.value = param;
  }
}

} // namespace meshc::kir
