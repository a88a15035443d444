// Pass eliminate-dead-code (EliminateDeadCode.h).
#include "codegen/EliminateDeadCode.h"

namespace meshc::kir {

namespace {

/// The statements of `stmts` that write something `live` (backwards, marking their reads).
std::vector<Stmt> keepLive(std::vector<Stmt>& stmts, std::vector<bool>& live) {
  std::vector<Stmt> kept;
  for (size_t k = stmts.size(); k-- > 0;) {
    Stmt& stmt = stmts[k];
    if (Loop* loop = std::get_if<Loop>(&stmt.node)) {
      std::vector<Store> stores;
      for (const Store& store : loop->stores)
        if (live[size_t(store.at.buffer)]) stores.push_back(store);
      loop->stores = std::move(stores);
      if (loop->stores.empty()) continue;
    } else if (isPure(stmt)) {
      bool needed = false;
      for (BufferId id : writesOf(stmt))
        needed = needed || live[size_t(id)];
      if (!needed) continue;
    }
    for (BufferId id : readsOf(stmt))
      live[size_t(id)] = true;
    kept.push_back(std::move(stmt));
  }
  return std::vector<Stmt>(std::make_move_iterator(kept.rbegin()),
                           std::make_move_iterator(kept.rend()));
}

} // namespace

void eliminateDeadCode(KernelFunction& fn) {
  // Backwards: a buffer is live when a later statement (or the caller) reads it.
  std::vector<bool> live(fn.buffers.size(), false);
  for (BufferId id : fn.outputs)
    live[size_t(id)] = true;
  for (const KernelFunction::Update& update : fn.updates)
    live[size_t(update.value)] = true;
  for (const Buffer& buffer : fn.buffers)
    if (buffer.storage == Storage::Param) live[&buffer - fn.buffers.data()] = true;
  fn.body = keepLive(fn.body, live);
  fn.init = keepLive(fn.init, live); // what run() reads, after run()'s own liveness
}

} // namespace meshc::kir
