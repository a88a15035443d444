// Point-to-point send / recv on the threads backend (internal to meshrt): one rank's sends and
// recvs in flight on one group.
//
// A send posts a message (its record and buffer pointer, owned by the sender) in the receiver's
// mailbox and waits until the receiver has copied the data straight from the sender's buffer (or
// rejected it: another count or dtype). A recv takes the oldest message of its peer from its own
// mailbox. No copy into an intermediate buffer, and no progress thread: a started recv is
// matched whenever its rank enters meshrt on the group (a later call, test, wait), and every
// rank that waits here also matches its started recvs, so that a ring of ranks that each start a
// send and then wait cannot deadlock.
//
// Failure: a rank that waits past the timeout, or whose peer has exited or the world failed,
// withdraws its posted message (unless the receiver has already taken it, in which case the copy
// completes) and throws; its error fails the world, as a collective's does.
#pragma once

#include "ThreadsState.h"

#include <functional>
#include <map>
#include <string>

namespace meshrt::detail {

/// Makes the CommError of this rank's `record` with `cause` (failing the world).
using P2pErrorFn = std::function<CommError(const CallRecord&, const std::string&)>;

class PeerQueue {
public:
  /// `whileWaiting` runs while a wait here blocks (the rank's started collectives, whose peers
  /// may be the ones this wait needs).
  PeerQueue(WorldState& world, GroupState& group, int groupRank, P2pErrorFn error,
            std::function<void()> whileWaiting = {});
  /// Completes what is still in flight (errors are the world's failure already).
  ~PeerQueue();
  PeerQueue(const PeerQueue&) = delete;
  PeerQueue& operator=(const PeerQueue&) = delete;

  /// Starts a send (record.sendTo) or recv (record.recvFrom) of `record.count` elements;
  /// returns its id (1, 2, ...). Arguments are checked by the caller.
  uint64_t start(const CallRecord& record, const void* sendData, void* recvData);
  /// Completes the operation `id` (blocking); throws if it failed.
  void wait(uint64_t id);
  /// Progresses everything in flight without blocking; true once `id` has completed (throws if
  /// it failed).
  bool test(uint64_t id);
  /// Matches the started recvs whose messages have arrived, without blocking. Never throws: a
  /// failure is kept for the operation's wait.
  void progress();
  bool idle() const { return ops_.empty(); }

private:
  struct Op {
    CallRecord record;
    void* recvData = nullptr;
    P2pMessage message; // a send's, posted in the peer's mailbox
    bool done = false;
    std::exception_ptr failure;
  };

  int peerOf(const Op& op) const {
    return int(op.record.collective() == Collective::Send ? op.record.sendTo : op.record.recvFrom);
  }
  bool isSend(const Op& op) const { return op.record.collective() == Collective::Send; }
  /// A recv may match only once the recvs started before it from the same peer have.
  bool firstRecvFromPeer(uint64_t id) const;
  /// One step of `op` without blocking: true when done; throws on failure.
  bool step(uint64_t id, Op& op);
  /// Takes the oldest message from `peer` in this rank's mailbox into `op` (false if none).
  bool take(Op& op);
  /// Why a wait for `op` should stop ("" to go on): the world failed, the peer exited, or the
  /// deadline passed.
  std::string whyGiveUp(const Op& op, Clock::time_point deadline) const;
  /// Removes a send's message from the peer's mailbox unless the receiver has taken it.
  bool withdraw(Op& op);
  int worldRankOf(int groupRank) const { return group_.worldRanks[size_t(groupRank)]; }
  void notify();

  WorldState& world_;
  GroupState& group_;
  int groupRank_;
  P2pErrorFn error_;
  std::function<void()> whileWaiting_;
  uint64_t nextId_ = 0;
  std::map<uint64_t, Op> ops_; // in flight, by id (std::map: the messages stay in place)
};

} // namespace meshrt::detail
