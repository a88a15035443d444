// Pass schedule-collectives (ScheduleCollectives.h).
#include "codegen/ScheduleCollectives.h"

#include <llvm/ADT/STLExtras.h>

namespace meshc::kir {

void scheduleCollectives(KernelFunction& fn) {
  int requests = 0;
  for (size_t k = 0; k < fn.body.size(); ++k) {
    Collective* c = std::get_if<Collective>(&fn.body[k].node);
    if (!c || c->phase != Collective::Phase::Blocking ||
        (c->kind != plan::CollectiveKind::AllReduceSum &&
         c->kind != plan::CollectiveKind::BucketedAllReduceSum))
      continue;
    // The first later statement that touches one of its buffers waits for it (in the microbatch
    // loop, at the latest its last statement: each microbatch waits for what it started).
    size_t touch = k + 1;
    for (; touch < fn.body.size(); ++touch) {
      if (fn.body[k].perMicrobatch && (!fn.body[touch].perMicrobatch ||
                                       fn.body[touch].microbatchLoop != fn.body[k].microbatchLoop))
        break;
      bool touches = false;
      for (BufferId id : readsOf(fn.body[touch]))
        touches = touches || llvm::is_contained(c->buffers, id);
      for (BufferId id : writesOf(fn.body[touch]))
        touches = touches || llvm::is_contained(c->buffers, id);
      if (touches) break;
    }
    if (touch == k + 1) continue; // nothing to overlap with
    c->phase = Collective::Phase::Start;
    c->request = requests++;
    Stmt wait{.node = Collective{.kind = c->kind,
                                 .axes = c->axes,
                                 .buffers = c->buffers,
                                 .phase = Collective::Phase::Wait,
                                 .request = c->request},
              .perMicrobatch = fn.body[k].perMicrobatch};
    wait.stageMask = fn.body[k].stageMask; // waited for where it was started
    wait.microbatchLoop = fn.body[k].microbatchLoop;
    wait.phase = fn.body[k].phase;
    fn.body.insert(fn.body.begin() + std::ptrdiff_t(touch), std::move(wait));
  }
}

} // namespace meshc::kir
