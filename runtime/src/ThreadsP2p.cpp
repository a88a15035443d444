// Point-to-point on the threads backend: the protocol is described in ThreadsP2p.h.
#include "ThreadsP2p.h"
#include "PeerOps.h"

#include <cstring>

namespace meshrt::detail {

PeerQueue::PeerQueue(WorldState& world, GroupState& group, int groupRank, P2pErrorFn error,
                     std::function<void()> whileWaiting)
    : world_(world), group_(group), groupRank_(groupRank), error_(std::move(error)),
      whileWaiting_(std::move(whileWaiting)) {}

PeerQueue::~PeerQueue() {
  while (!ops_.empty()) {
    try {
      wait(ops_.begin()->first);
    } catch (...) {
      // Recorded as the world's failure by error_.
    }
  }
}

uint64_t PeerQueue::start(const CallRecord& record, const void* sendData, void* recvData) {
  if (world_.failed.load(std::memory_order_acquire)) throw error_(record, world_.failure());
  uint64_t id = ++nextId_;
  Op& op = ops_.try_emplace(id).first->second;
  op.record = record;
  op.recvData = recvData;
  if (isSend(op)) {
    op.message.from = groupRank_;
    op.message.record = record;
    op.message.data = sendData;
    Mailbox& mailbox = group_.mailboxes[size_t(record.sendTo)];
    {
      std::lock_guard<std::mutex> lock(mailbox.mutex);
      mailbox.posted.push_back(&op.message);
    }
    notify();
  }
  progress();
  return id;
}

void PeerQueue::wait(uint64_t id) {
  auto found = ops_.find(id);
  if (found == ops_.end()) return;
  Op& op = found->second;
  // Published while waiting, so that a peer timing out blames the rank this one waits for.
  Waiting where;
  where.group = &group_;
  where.peer = worldRankOf(peerOf(op));
  WaitingScope waiting(world_, worldRankOf(groupRank_), where);
  Clock::time_point deadline = Clock::now() + world_.timeout, yielding;
  for (int round = 0;; ++round) {
    progress();
    if (op.done) break;
    if (round < world_.spins) {
      cpuRelax();
      continue;
    }
    if (whileWaiting_) whileWaiting_();
    if (round == world_.spins) yielding = Clock::now();
    if (world_.keepYielding(round - world_.spins, yielding)) {
      sched_yield();
      continue;
    }
    std::string cause = whyGiveUp(op, deadline);
    if (!cause.empty() && (!isSend(op) || withdraw(op))) {
      op.done = true;
      try {
        throw error_(op.record, cause);
      } catch (...) {
        op.failure = std::current_exception();
      }
      break;
    }
    group_.p2pSleepers.fetch_add(1);
    uint32_t events = group_.p2pEvents.load();
    if (!op.done) {
      progress();
      if (!op.done) futexWait(group_.p2pEvents, events, std::chrono::milliseconds(50));
    }
    group_.p2pSleepers.fetch_sub(1);
  }
  finishPeerOp(ops_, found);
}

bool PeerQueue::test(uint64_t id) {
  progress();
  return finishIfDone(ops_, id);
}

void PeerQueue::progress() {
  progressPeerOps(ops_, [this](uint64_t id, Op& op) { return step(id, op); });
}

bool PeerQueue::firstRecvFromPeer(uint64_t id) const {
  for (const auto& [other, op] : ops_) {
    if (other >= id) return true;
    if (!op.done && !isSend(op) && peerOf(op) == peerOf(ops_.at(id))) return false;
  }
  return true;
}

bool PeerQueue::step(uint64_t id, Op& op) {
  if (!isSend(op)) return firstRecvFromPeer(id) && take(op);
  switch (op.message.state.load(std::memory_order_acquire)) {
  case P2pMessage::Posted:
    return false;
  case P2pMessage::Rejected:
    throw error_(op.record, op.message.rejection);
  default:
    return true;
  }
}

bool PeerQueue::take(Op& op) {
  Mailbox& mailbox = group_.mailboxes[size_t(groupRank_)];
  int peer = peerOf(op);
  P2pMessage* message = nullptr;
  {
    std::lock_guard<std::mutex> lock(mailbox.mutex);
    for (auto at = mailbox.posted.begin(); at != mailbox.posted.end(); ++at)
      if ((*at)->from == peer) {
        message = *at;
        mailbox.posted.erase(at);
        break;
      }
  }
  if (!message) return false;
  // Taken out of the mailbox: the sender waits for the state, its buffer stays valid until then.
  const CallRecord& sent = message->record;
  if (sent.dtype != op.record.dtype || sent.count != op.record.count) {
    std::string cause = pointToPointMismatch(peer, sent.type(), size_t(sent.count), groupRank_,
                                             op.record.type(), size_t(op.record.count));
    message->rejection = cause;
    message->state.store(P2pMessage::Rejected, std::memory_order_release);
    notify();
    throw error_(op.record, cause);
  }
  size_t bytes = size_t(op.record.count) * dtypeSize(op.record.type());
  if (bytes) std::memcpy(op.recvData, message->data, bytes);
  message->state.store(P2pMessage::Done, std::memory_order_release);
  notify();
  return true;
}

std::string PeerQueue::whyGiveUp(const Op& op, Clock::time_point deadline) const {
  if (world_.failed.load(std::memory_order_acquire)) return world_.failure();
  int peer = peerOf(op), peerWorld = worldRankOf(peer);
  std::string what = isSend(op) ? "receiving it" : "sending to it";
  std::string pair =
      "group rank " + std::to_string(peer) + " (world rank " + std::to_string(peerWorld) + ")";
  std::string call = op.record.describe() + ": ";
  if (world_.exited[peerWorld].load(std::memory_order_acquire))
    return call + pair + " finished the program without " + what;
  if (Clock::now() < deadline) return "";
  std::string cause = timeoutCause(world_, {peerWorld});
  if (cause.empty()) return world_.failure();
  return call + (isSend(op) ? "nobody received it: " : "nothing was sent: ") + cause +
         " to post the " + (isSend(op) ? "matching recv" : "matching send") +
         " (MESHRT_TIMEOUT_S sets the limit)";
}

bool PeerQueue::withdraw(Op& op) {
  Mailbox& mailbox = group_.mailboxes[size_t(op.record.sendTo)];
  std::lock_guard<std::mutex> lock(mailbox.mutex);
  for (auto at = mailbox.posted.begin(); at != mailbox.posted.end(); ++at)
    if (*at == &op.message) {
      mailbox.posted.erase(at);
      return true;
    }
  return false; // taken: the receiver is copying, and sets the state when done
}

void PeerQueue::notify() {
  group_.p2pEvents.fetch_add(1);
  if (group_.p2pSleepers.load() > 0) futexWakeAll(group_.p2pEvents);
}

} // namespace meshrt::detail
