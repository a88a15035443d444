// The bookkeeping both backends' point-to-point queues share (ThreadsP2p.h, MpiP2p.h): the
// operations in flight by id, polled by the backend's step, a failure kept for the operation's
// wait and thrown there.
#pragma once

#include <cstdint>
#include <exception>
#include <map>

namespace meshrt::detail {

/// Polls every operation not done yet with `step(id, op)` (true: done); a step that throws fails
/// its operation.
template <typename Ops, typename Step> void progressPeerOps(Ops& ops, Step&& step) {
  for (auto& [id, op] : ops) {
    if (op.done) continue;
    try {
      op.done = step(id, op);
    } catch (...) {
      op.done = true;
      op.failure = std::current_exception();
    }
  }
}

/// Removes the completed operation at `found`, throwing its failure.
template <typename Ops> void finishPeerOp(Ops& ops, typename Ops::iterator found) {
  std::exception_ptr failure = found->second.failure;
  ops.erase(found);
  if (failure) std::rethrow_exception(failure);
}

/// True once operation `id` has completed (removing it, throwing its failure); an unknown id has.
template <typename Ops> bool finishIfDone(Ops& ops, uint64_t id) {
  auto found = ops.find(id);
  if (found == ops.end()) return true;
  if (!found->second.done) return false;
  finishPeerOp(ops, found);
  return true;
}

} // namespace meshrt::detail
