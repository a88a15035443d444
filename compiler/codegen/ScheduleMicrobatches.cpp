// Pass schedule-microbatches (ScheduleMicrobatches.h).
#include "codegen/ScheduleMicrobatches.h"

#include <llvm/ADT/STLExtras.h>

#include <algorithm>
#include <bit>

namespace meshc::kir {

namespace {

/// The loops' sends are started (from a copy of the value: its buffer moves on) and waited for
/// once both loops are done. 1F1B needs it: a stage alternates its microbatches' forwards and
/// backwards, so a blocking send could wait for a neighbour that itself waits to send (stage s
/// sends microbatch m + 1's activation while stage s + 1 sends microbatch m's gradient). GPipe
/// gains by it: a blocking send waits until the neighbour has taken the message, which it does
/// only once done with its previous microbatch, and then for the sender's wake-up (on the threads
/// backend a sleeping rank's futex wake-up: median 96 us, 1.3 ms under load, for the sender of
/// bench/pipeline_bubble.py's step), so each microbatch paid it on both loops; started, the
/// sender goes on at once and only a stage that has nothing to compute waits.
void startSends(KernelFunction& fn, std::vector<Stmt>& forward, std::vector<Stmt>& backward,
                std::vector<Stmt>& after) {
  bool started = false;
  for (std::vector<Stmt>* loop : {&forward, &backward})
    for (Stmt& stmt : *loop) {
      Call* call = std::get_if<Call>(&stmt.node);
      if (!call || call->callee != Callee::StageTransfer) continue;
      call->callee = Callee::StageTransferStarted;
      call->args.push_back(Arg{.kind = Arg::Kind::Text, .text = "stageSends_"});
      started = true;
    }
  if (!started) return;
  Stmt wait{.node = Call{.callee = Callee::WaitStageSends,
                         .args = {Arg{.kind = Arg::Kind::Group, .names = {fn.stages.axis}},
                                  Arg{.kind = Arg::Kind::Text, .text = "stageSends_"}}},
            .sources = {"the step's started stage sends"},
            .phase = plan::Phase::Backward};
  after.insert(after.begin(), std::move(wait));
}

} // namespace

void scheduleMicrobatches(KernelFunction& fn) {
  if (fn.stages.count <= 1 || fn.microbatches.count <= 1) return;
  // Under 1F1B stage s holds at most p - s microbatches at once (run() starts microbatch
  // m + p - s's forward after m's backward), so a kept value needs that many copies on its
  // lowest stage, reused in turn; under GPipe every microbatch's.
  std::vector<uint64_t> stagesOf = bufferStages(fn, fn.body);
  auto copiesOf = [&](BufferId id) {
    if (!fn.stages.oneFOneB) return fn.microbatches.count;
    uint64_t mask = stagesOf[size_t(id)];
    int64_t lowest = mask == 0 ? 0 : std::countr_zero(mask);
    return std::min(fn.microbatches.count, fn.stages.count - lowest);
  };
  std::vector<Stmt> before, forward, backward, after;
  // A statement of the loop is the backward's when autodiff or the update made it, or when it
  // reads what the backward wrote (nothing forward does).
  std::vector<bool> backwardWrote(fn.buffers.size(), false), outside(fn.buffers.size(), false);
  for (Stmt& stmt : fn.body) {
    if (!stmt.perMicrobatch) {
      for (BufferId id : readsOf(stmt))
        outside[size_t(id)] = true;
      for (BufferId id : writesOf(stmt))
        outside[size_t(id)] = true;
      (forward.empty() && backward.empty() ? before : after).push_back(std::move(stmt));
      continue;
    }
    bool isBackward = stmt.phase != plan::Phase::Forward;
    for (BufferId id : readsOf(stmt))
      isBackward = isBackward || backwardWrote[size_t(id)];
    if (isBackward)
      for (BufferId id : writesOf(stmt))
        backwardWrote[size_t(id)] = true;
    stmt.microbatchLoop = isBackward ? 1 : 0;
    (isBackward ? backward : forward).push_back(std::move(stmt));
  }
  // Kept per microbatch: the forward loop's values that the backward loop reads (not the
  // accumulators and other values the loops share with the rest of run()).
  std::vector<bool> forwardWrote(fn.buffers.size(), false);
  for (const Stmt& stmt : forward)
    for (BufferId id : writesOf(stmt))
      forwardWrote[size_t(id)] = true;
  for (const Stmt& stmt : backward)
    for (BufferId id : readsOf(stmt)) {
      Buffer& buffer = fn.buffers[size_t(id)];
      if (forwardWrote[size_t(id)] && !outside[size_t(id)] && buffer.storage == Storage::Arena)
        buffer.copies = copiesOf(id);
    }
  startSends(fn, forward, backward, after);
  fn.body = std::move(before);
  for (std::vector<Stmt>* part : {&forward, &backward, &after})
    fn.body.insert(fn.body.end(), std::make_move_iterator(part->begin()),
                   std::make_move_iterator(part->end()));
}

} // namespace meshc::kir
