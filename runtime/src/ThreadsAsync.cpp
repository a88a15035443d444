// Started collectives on the threads backend: the protocol is described in ThreadsAsync.h.
#include "ThreadsAsync.h"

#include "Reduce.h"

#include <cstring>
#include <sstream>

namespace meshrt::detail {
namespace {

// A gate: the sequence in the high bits, the ranks arrived at it in the low kCountBits.
constexpr int kCountBits = 24;
constexpr uint64_t kCountMask = (uint64_t(1) << kCountBits) - 1;

/// Calls visit(piece index, offset in the piece, length) for the elements [first, last) of the
/// concatenation of `pieces`.
template <class Visit>
void forPieces(const std::vector<Segment<void>>& pieces, size_t first, size_t last, Visit visit) {
  size_t base = 0;
  for (size_t k = 0; k < pieces.size() && base < last; ++k) {
    size_t begin = std::max(first, base), end = std::min(last, base + pieces[k].count);
    if (begin < end) visit(k, begin - base, end - begin);
    base += pieces[k].count;
  }
}

char* at(const Segment<void>& piece, size_t offset, size_t elementSize) {
  return static_cast<char*>(piece.data) + offset * elementSize;
}

} // namespace

AsyncQueue::AsyncQueue(WorldState& world, GroupState& group, int groupRank, AsyncErrorFn error,
                       std::function<void()> whileWaiting)
    : world_(world), group_(group), groupRank_(groupRank), error_(std::move(error)),
      whileWaiting_(std::move(whileWaiting)) {
  if (size_t(size()) > kCountMask)
    throw std::invalid_argument("meshrt: a group of more than 2^24 ranks");
}

AsyncQueue::~AsyncQueue() {
  try {
    waitAll();
  } catch (...) {
    // Recorded as the world's failure by error_.
  }
}

uint64_t AsyncQueue::start(const CallRecord& record, const Segment<void>* inputs, size_t numInputs,
                           const Segment<void>* outputs, size_t numOutputs) {
  if (world_.failed.load(std::memory_order_acquire)) throw error_(record, world_.failure());
  size_t elementSize = dtypeSize(record.type());
  if (size() == 1) {
    // Nobody to wait for: the result is the input. Inputs and outputs have the same pieces here
    // (one each, or the bucket in place; size() * n is n).
    for (size_t k = 0; k < std::min(numInputs, numOutputs); ++k)
      if (inputs[k].data != outputs[k].data && inputs[k].count)
        std::memmove(outputs[k].data, inputs[k].data, inputs[k].count * elementSize);
    return 0;
  }
  if (started_ - completed_ >= kRing) wait(completed_ + 1);
  uint64_t sequence = ++started_;
  AsyncSlot& mine = slot(groupRank_, sequence);
  mine.record = record;
  mine.inputs.assign(inputs, inputs + numInputs);
  mine.outputs.assign(outputs, outputs + numOutputs);
  mine.published.store(sequence, std::memory_order_release);
  Local& request = local(sequence);
  request.sequence = sequence;
  request.phase = Phase::Arriving;
  request.failure = nullptr;
  // Only the last arrival lets the waiters go on: the earlier ones wake nobody.
  if (count(group_.gates[sequence % kRing], sequence)) notify();
  progress();
  return sequence;
}

void AsyncQueue::wait(uint64_t ticket) {
  std::exception_ptr first;
  while (completed_ < ticket) {
    Local& request = local(completed_ + 1);
    try {
      advanceRecorded(request, /*block=*/true);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    ++completed_;
  }
  if (first) std::rethrow_exception(first);
}

bool AsyncQueue::test(uint64_t ticket) {
  progress();
  while (completed_ < ticket && local(completed_ + 1).phase == Phase::Done) {
    Local& request = local(completed_ + 1);
    ++completed_;
    if (request.failure) std::rethrow_exception(request.failure);
  }
  return completed_ >= ticket;
}

void AsyncQueue::progress() {
  for (uint64_t sequence = completed_ + 1; sequence <= started_; ++sequence) {
    try {
      advanceRecorded(local(sequence), /*block=*/false);
    } catch (...) {
      // Kept in the request for its wait.
    }
  }
}

bool AsyncQueue::advanceRecorded(Local& request, bool block) {
  if (request.phase == Phase::Done) {
    if (request.failure) std::rethrow_exception(request.failure);
    return true;
  }
  try {
    return advance(request, block);
  } catch (...) {
    request.phase = Phase::Done;
    request.failure = std::current_exception();
    throw;
  }
}

bool AsyncQueue::advance(Local& request, bool block) {
  uint64_t sequence = request.sequence;
  AsyncSlot& mine = slot(groupRank_, sequence);
  int p = size();
  if (request.phase == Phase::Arriving) {
    if (!allArrived(sequence)) {
      if (!block) return false;
      awaitArrival(request);
    }
    checkAgreement(request);
    request.phase = Phase::Reducing;
  }
  if (request.phase == Phase::Reducing) {
    phaseA(sequence);
    mine.reduced.store(sequence, std::memory_order_release);
    // Only the last rank's stamp lets the drains go on: the earlier ones wake nobody.
    if (count(group_.doneGates[sequence % kRing], sequence)) notify();
    request.phase = Phase::Draining;
  }
  if (request.phase == Phase::Draining) {
    // Every peer has read this rank's inputs and written its chunks into this rank's outputs.
    auto drained = [&] {
      for (int q = 0; q < p; ++q)
        if (slot(q, sequence).reduced.load(std::memory_order_acquire) < sequence) return false;
      return true;
    };
    if (!drained()) {
      if (!block) return false;
      sleepUntil(drained, [] { return false; });
    }
    request.phase = Phase::Done;
  }
  return true;
}

void AsyncQueue::awaitArrival(Local& request) {
  uint64_t sequence = request.sequence;
  Clock::time_point deadline = Clock::now() + world_.timeout;
  // As in ThreadsComm's entry barrier: peers that time out blame the ranks this one waits for.
  int worldRank = group_.worldRanks[size_t(groupRank_)];
  world_.setWaiting(worldRank, {&group_, true, sequence});
  struct WaitRecord {
    WorldState& world;
    int rank;
    ~WaitRecord() { world.clearWaiting(rank); }
  } record{world_, worldRank};
  bool gaveUp = false;
  std::string cause;
  sleepUntil([&] { return allArrived(sequence); },
             [&] {
               cause = whyGiveUp(sequence, deadline);
               if (cause.empty()) return false;
               // Everyone arrived meanwhile: go on to the data phases.
               gaveUp = withdraw(sequence);
               return true;
             });
  if (gaveUp) throw error_(slot(groupRank_, sequence).record, cause);
}

void AsyncQueue::checkAgreement(const Local& request) const {
  const AsyncSlot& mine = slot(groupRank_, request.sequence);
  auto disagree = [&](int q, const std::string& what) {
    return error_(mine.record, "ranks disagree: group rank " + std::to_string(groupRank_) + " " +
                                   what + " but group rank " + std::to_string(q) + " called " +
                                   slot(q, request.sequence).record.describe());
  };
  for (int q = 0; q < size(); ++q) {
    const AsyncSlot& peer = slot(q, request.sequence);
    if (!peer.record.sameCollective(mine.record))
      throw disagree(q, "called " + mine.record.describe());
    if (mine.record.buffers == 0) continue;
    for (size_t k = 0; k < mine.inputs.size(); ++k)
      if (peer.inputs[k].count != mine.inputs[k].count)
        throw disagree(q, "called " + mine.record.describe() + " with buffer " + std::to_string(k) +
                              " of " + std::to_string(mine.inputs[k].count) + " elements (" +
                              std::to_string(peer.inputs[k].count) + " on group rank " +
                              std::to_string(q) + ")");
  }
}

void AsyncQueue::phaseA(uint64_t sequence) {
  const AsyncSlot& mine = slot(groupRank_, sequence);
  const CallRecord& record = mine.record;
  size_t elementSize = dtypeSize(record.type()), count = size_t(record.count);
  int p = size();
  inputs_.resize(size_t(p));
  switch (record.collective()) {
  case Collective::AllReduce: {
    // This rank's chunk, reduced from every input into its output, then written into every
    // peer's output (in place is safe: only this rank reads or writes that chunk anywhere).
    auto [first, last] = chunkOf(count, elementSize, p, groupRank_);
    bool streaming = (last - first) * elementSize >= kStreamingBytes;
    forPieces(mine.outputs, first, last, [&](size_t k, size_t offset, size_t length) {
      for (int q = 0; q < p; ++q)
        inputs_[size_t(q)] = at(slot(q, sequence).inputs[k], offset, elementSize);
      char* reduced = at(mine.outputs[k], offset, elementSize);
      detail::reduce(record.type(), ReduceOp(record.op), reduced, inputs_.data(), p, length,
                     streaming);
      for (int q = 0; q < p; ++q)
        if (q != groupRank_)
          detail::copy(at(slot(q, sequence).outputs[k], offset, elementSize), reduced,
                       length * elementSize, streaming);
    });
    break;
  }
  case Collective::ReduceScatter:
    for (int q = 0; q < p; ++q)
      inputs_[size_t(q)] = at(slot(q, sequence).inputs[0], size_t(groupRank_) * count, elementSize);
    detail::reduce(record.type(), ReduceOp(record.op), mine.outputs[0].data, inputs_.data(), p,
                   count, count * elementSize >= kStreamingBytes);
    break;
  case Collective::AllGather:
    // This rank's input, written into its place in every output (its own included).
    for (int q = 0; q < p && count; ++q) {
      char* place = at(slot(q, sequence).outputs[0], size_t(groupRank_) * count, elementSize);
      if (place != mine.inputs[0].data)
        std::memcpy(place, mine.inputs[0].data, count * elementSize);
    }
    break;
  default:
    break;
  }
}

bool AsyncQueue::count(std::atomic<uint64_t>& gate, uint64_t sequence) {
  uint64_t current = gate.load(std::memory_order_acquire);
  for (;;) {
    // The gate still holds the slot's previous sequence (all counted, or none yet): start anew.
    uint64_t next = current >> kCountBits == sequence ? current + 1 : sequence << kCountBits | 1;
    if (gate.compare_exchange_weak(current, next, std::memory_order_acq_rel,
                                   std::memory_order_acquire))
      return next == (sequence << kCountBits | uint64_t(size()));
  }
}

bool AsyncQueue::withdraw(uint64_t sequence) {
  std::atomic<uint64_t>& gate = group_.gates[sequence % kRing];
  uint64_t current = gate.load(std::memory_order_acquire);
  while (current >> kCountBits == sequence && (current & kCountMask) < uint64_t(size()))
    if (gate.compare_exchange_weak(current, current - 1, std::memory_order_acq_rel,
                                   std::memory_order_acquire))
      return true;
  return false;
}

bool AsyncQueue::allArrived(uint64_t sequence) const {
  return group_.gates[sequence % kRing].load(std::memory_order_acquire) ==
         (sequence << kCountBits | uint64_t(size()));
}

std::string AsyncQueue::whyGiveUp(uint64_t sequence, Clock::time_point deadline) const {
  if (world_.failed.load(std::memory_order_acquire)) return world_.failure();
  std::vector<int> missing;
  std::string exited;
  for (int q = 0; q < size(); ++q) {
    if (slot(q, sequence).published.load(std::memory_order_acquire) >= sequence) continue;
    int worldRank = group_.worldRanks[size_t(q)];
    missing.push_back(worldRank);
    if (world_.exited[worldRank].load(std::memory_order_acquire))
      exited += (exited.empty() ? "" : ", ") + std::to_string(worldRank);
  }
  if (!exited.empty())
    return "world rank(s) " + exited + " finished the program without starting this collective";
  if (Clock::now() < deadline) return "";
  std::string cause = timeoutCause(world_, missing);
  if (cause.empty()) return world_.failure();
  return cause + " to start it (MESHRT_TIMEOUT_S sets the limit)";
}

void AsyncQueue::notify() {
  group_.asyncEvents.fetch_add(1);
  if (group_.asyncSleepers.load() > 0) futexWakeAll(group_.asyncEvents);
}

template <class Done, class Check> void AsyncQueue::sleepUntil(Done done, Check check) {
  for (int spin = 0; spin < world_.spins; ++spin) {
    if (done()) return;
    cpuRelax();
  }
  Clock::time_point yielding = Clock::now();
  for (int yield = 0; world_.keepYielding(yield, yielding); ++yield) {
    if (done()) return;
    // Yielding may last a pipeline slot (WorldState::yieldFor): the work the peers may be
    // waiting for progresses meanwhile, as between sleeps.
    if (whileWaiting_) whileWaiting_();
    sched_yield();
  }
  for (;;) {
    if (whileWaiting_) whileWaiting_();
    group_.asyncSleepers.fetch_add(1);
    uint32_t events = group_.asyncEvents.load();
    if (done()) {
      group_.asyncSleepers.fetch_sub(1);
      return;
    }
    futexWait(group_.asyncEvents, events, std::chrono::milliseconds(50));
    group_.asyncSleepers.fetch_sub(1);
    if (done()) return;
    if (check()) return;
  }
}

} // namespace meshrt::detail
