// Point-to-point send / recv on the MPI backend (internal to meshrt_mpi): one rank's sends and
// recvs in flight on one group, over a communicator of their own (a duplicate of the group's, so
// that no other traffic is matched by them).
//
// A send is MPI_Isend of its bytes with the tag kTagBase + dtype. A recv first probes
// (MPI_Iprobe, any tag) for the oldest message from its peer, checks its dtype (the tag) and
// size (MPI_Get_count) against its own, so that a mismatch is a CommError naming both ranks
// instead of MPI's truncation or silent reinterpretation, and then posts MPI_Irecv for exactly
// that message. Recvs from one peer probe in the order they were started. Every wait here polls
// all the rank's operations in flight (a recv only matches once probed, and a peer's send may wait
// for it), against the deadline.
#pragma once

#include "CallRecord.h"

#include <mpi.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace meshrt::detail {

/// Makes the CommError of this rank's `record` with `cause`.
using MpiP2pErrorFn = std::function<CommError(const CallRecord&, const std::string&)>;

class MpiPeerOps {
public:
  /// Over `comm` (owned: freed at destruction), the group's world ranks by group rank.
  MpiPeerOps(MPI_Comm comm, std::vector<int> worldRanks, int groupRank,
             std::chrono::milliseconds timeout, MpiP2pErrorFn error);
  ~MpiPeerOps();
  MpiPeerOps(const MpiPeerOps&) = delete;
  MpiPeerOps& operator=(const MpiPeerOps&) = delete;

  /// Starts a send (record.sendTo) or recv (record.recvFrom) of record.count elements; returns
  /// its id (1, 2, ...). Arguments are checked by the caller.
  uint64_t start(const CallRecord& record, const void* sendData, void* recvData);
  /// Completes operation `id`, progressing the others; throws if it failed.
  void wait(uint64_t id);
  /// Progresses everything without blocking; true once `id` has completed (throws if it failed).
  bool test(uint64_t id);
  /// Progresses everything without blocking; failures are kept for the operations' waits.
  void progress();
  bool idle() const { return ops_.empty(); }

private:
  struct Op {
    CallRecord record;
    const void* sendData = nullptr;
    void* recvData = nullptr;
    bool posted = false; // a recv: probed and its MPI_Irecv posted
    MPI_Request request = MPI_REQUEST_NULL;
    bool done = false;
    std::exception_ptr failure;
  };
  static constexpr int kTagBase = 100;

  bool isSend(const Op& op) const { return op.record.collective() == Collective::Send; }
  int peerOf(const Op& op) const { return int(isSend(op) ? op.record.sendTo : op.record.recvFrom); }
  /// One step without blocking: true when done; throws on failure.
  bool step(uint64_t id, Op& op);
  bool firstRecvFromPeer(uint64_t id) const;
  void check(const Op& op, int code, const char* function) const;
  std::string timeoutCause(const Op& op) const;

  MPI_Comm comm_;
  std::vector<int> worldRanks_;
  int groupRank_;
  std::chrono::milliseconds timeout_;
  MpiP2pErrorFn error_;
  uint64_t nextId_ = 0;
  std::map<uint64_t, Op> ops_; // in flight, by id (std::map: MPI keeps pointers into them)
};

} // namespace meshrt::detail
