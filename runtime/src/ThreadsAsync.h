// Started collectives on the threads backend (internal to meshrt): one rank's requests in flight
// on one group.
//
// No progress thread: the cores are usually fewer than the ranks, and a thread per rank that
// waits for peers would take a core from the ranks it waits for. Instead every rank does its own
// share of each started collective whenever it enters meshrt (a later start, a blocking call,
// test, wait), without blocking, and blocks only in wait. Ranks meet through per-request flags
// rather than barriers, so a rank that starts early keeps computing while a slow peer catches up,
// and a fast rank does its part as soon as the peers have arrived.
//
// A request of sequence s (the s-th started on the group by every rank) goes through:
//  arrival   the rank publishes its call in its slot s % kRing and counts itself in the group's
//            gate for s; once all have arrived each rank checks that all made the same call;
//  phase A   the rank's own work on the peers' buffers: an all-reduce reduces its chunk from
//            every input into its output and writes it into every peer's output, a
//            reduce-scatter reduces its chunk from every input, an all-gather writes its input
//            into every output; then it stamps `reduced` and counts itself in the group's done
//            gate for s;
//  drain     it is complete once every peer has done phase A (nobody reads its inputs or
//            writes its outputs any more).
// Two meetings, as a blocking collective's two barriers: peers write into one another's outputs
// rather than read from them, so no third one waits for the readers. Only the last rank of a
// gate wakes the sleepers: an arrival or a stamp before it lets none of them go on, and with
// several ranks on a core every needless wake-up is a hand-over of that core.
// Only arrival can fail (a peer missing past the timeout, exited, or the world failed): a rank
// withdraws from the gate unless everyone has arrived, so either all ranks go on to the data
// phases or none does. After arrival every rank completes them, at its wait or when its Request
// is destroyed (also while unwinding), so nobody is left reading freed buffers.
#pragma once

#include "ThreadsState.h"

#include <functional>
#include <string>

namespace meshrt::detail {

/// Makes the CommError of this rank's `record` with `cause` (failing the world).
using AsyncErrorFn = std::function<CommError(const CallRecord&, const std::string&)>;

class AsyncQueue {
public:
  /// `whileWaiting` runs between yields and sleeps while this queue waits for its peers (the rank's
  /// other work in flight, which those peers may be waiting for: its started recvs); it must not
  /// progress this queue.
  AsyncQueue(WorldState& world, GroupState& group, int groupRank, AsyncErrorFn error,
             std::function<void()> whileWaiting = {});
  /// Completes what is still in flight (errors are the world's failure already).
  ~AsyncQueue();
  AsyncQueue(const AsyncQueue&) = delete;
  AsyncQueue& operator=(const AsyncQueue&) = delete;

  /// Starts `record` over the logical buffers `inputs` / `outputs` (pieces in element counts, in
  /// order); returns its ticket, or 0 when it completed at once (a group of one). Arguments are
  /// checked by the caller.
  uint64_t start(const CallRecord& record, const Segment<void>* inputs, size_t numInputs,
                 const Segment<void>* outputs, size_t numOutputs);
  /// Completes the requests up to `ticket` in order; throws the first failure among them (after
  /// completing the rest, so that no peer reads a buffer its owner has given up).
  void wait(uint64_t ticket);
  /// Progresses without blocking; true once the requests up to `ticket` have completed.
  bool test(uint64_t ticket);
  void waitAll() { wait(started_); }
  /// Does what the requests in flight allow without blocking. Never throws: a failure is kept
  /// for the request's wait.
  void progress();
  bool idle() const { return completed_ == started_; }
  uint64_t completed() const { return completed_; }

private:
  enum class Phase { Arriving, Reducing, Draining, Done };
  struct Local {
    uint64_t sequence = 0;
    Phase phase = Phase::Done;
    std::exception_ptr failure;
  };

  AsyncSlot& slot(int groupRank, uint64_t sequence) const {
    return group_.asyncSlots[size_t(groupRank) * kRing + sequence % kRing];
  }
  Local& local(uint64_t sequence) { return locals_[sequence % kRing]; }
  int size() const { return int(group_.worldRanks.size()); }

  /// Advances `request` as far as it can go (blocking: to the end). True when done; throws if it
  /// failed.
  bool advance(Local& request, bool block);
  /// advance, with a failure recorded in the request (and rethrown when `block`).
  bool advanceRecorded(Local& request, bool block);
  void awaitArrival(Local& request);
  void checkAgreement(const Local& request) const;
  void phaseA(uint64_t sequence);
  /// Counts this rank in `gate` for `sequence`; true when it was the last of the group.
  bool count(std::atomic<uint64_t>& gate, uint64_t sequence);
  bool withdraw(uint64_t sequence);
  bool allArrived(uint64_t sequence) const;
  std::string whyGiveUp(uint64_t sequence, Clock::time_point deadline) const;
  void notify();
  /// Spins, yields, then sleeps on the group's event word until `done()`; `check()` runs between
  /// sleeps (and may throw or return true to stop waiting).
  template <class Done, class Check> void sleepUntil(Done done, Check check);

  WorldState& world_;
  GroupState& group_;
  int groupRank_;
  AsyncErrorFn error_;
  std::function<void()> whileWaiting_;
  uint64_t started_ = 0, completed_ = 0;
  Local locals_[kRing];
  std::vector<const void*> inputs_; // a reduction's inputs, reused
};

} // namespace meshrt::detail
