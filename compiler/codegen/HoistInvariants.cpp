// Pass hoist-invariants (HoistInvariants.h).
#include "codegen/HoistInvariants.h"

#include <llvm/ADT/STLExtras.h>

namespace meshc::kir {

void hoistInvariants(KernelFunction& fn) {
  std::vector<int> writers = fn.writerCounts();
  std::vector<Stmt> kept;
  for (Stmt& stmt : fn.body) {
    std::vector<BufferId> writes = writesOf(stmt);
    bool invariant = !stmt.recomputed && isPure(stmt) && writes.size() == 1 &&
                     writers[size_t(writes[0])] == 1 &&
                     fn.buffers[size_t(writes[0])].storage == Storage::Arena;
    // Values computed in the constructor: constants and what is built only from them.
    for (BufferId id : readsOf(stmt))
      invariant = invariant && fn.buffers[size_t(id)].storage == Storage::Persistent;
    if (const Loop* loop = std::get_if<Loop>(&stmt.node))
      invariant = invariant && llvm::none_of(loop->body, [](const Scalar& scalar) {
                    return scalar.kind == Scalar::Kind::Step ||
                           scalar.kind == Scalar::Kind::Dropout; // keyed by seed and step
                  });
    if (!invariant) {
      kept.push_back(std::move(stmt));
      continue;
    }
    fn.buffers[size_t(writes[0])].storage = Storage::Persistent;
    stmt.perMicrobatch = false; // the same for every microbatch: computed once, in the constructor
    fn.init.push_back(std::move(stmt));
  }
  fn.body = std::move(kept);
}

} // namespace meshc::kir
