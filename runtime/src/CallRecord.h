// One rank's collective call as the CPU backends check it (internal to meshrt): the threads
// backend publishes it to its peers, the MPI backend exchanges it (plain int64 fields, sent as
// MPI_INT64_T). Every rank of a group must make the same call; a disagreement is a CommError
// on every rank instead of undefined behaviour.
#pragma once

#include "meshrt/Comm.h"

#include <cstdint>
#include <exception>
#include <functional>
#include <string>

namespace meshrt::detail {

enum class Collective : int64_t {
  Barrier,
  AllReduce,
  ReduceScatter,
  AllGather,
  AllToAll,
  Permute,
  Broadcast,
  Subgroup, // MPI: creating a subgroup (count: the world axes, encoded)
  Send,     // point-to-point (sendTo: the peer)
  Recv,     // point-to-point (recvFrom: the peer)
  SendRecv
};

const char* collectiveName(Collective kind);

struct CallRecord {
  int64_t kind = int64_t(Collective::Barrier);
  int64_t dtype = int64_t(DType::Bytes);
  int64_t op = int64_t(ReduceOp::Sum);
  int64_t count = 0;
  int64_t root = 0;
  int64_t sendTo = Communicator::kNoPeer;
  int64_t recvFrom = Communicator::kNoPeer;
  /// 1 for a started collective (startAllReduce, ...): it never matches a blocking call.
  int64_t started = 0;
  /// A started all-reduce over a bucket: the number of buffers (0: one plain buffer); count is
  /// their total. The backends compare the buffers' counts themselves.
  int64_t buffers = 0;
  /// A bucket on MPI: a hash of the buffers' counts (the threads backend compares them itself).
  int64_t layout = 0;

  static CallRecord of(Collective kind, DType dtype = DType::Bytes, ReduceOp op = ReduceOp::Sum,
                       size_t count = 0, int root = 0, int sendTo = Communicator::kNoPeer,
                       int recvFrom = Communicator::kNoPeer) {
    return {int64_t(kind),
            int64_t(dtype),
            int64_t(op),
            int64_t(count),
            root,
            sendTo,
            recvFrom,
            0,
            0,
            0};
  }
  /// The record of a started collective (of `buffers` buffers for a bucket).
  static CallRecord startOf(Collective kind, DType dtype, ReduceOp op, size_t count,
                            size_t buffers = 0) {
    CallRecord record = of(kind, dtype, op, count);
    record.started = 1;
    record.buffers = int64_t(buffers);
    return record;
  }
  Collective collective() const { return Collective(kind); }
  DType type() const { return DType(dtype); }
  const char* name() const { return collectiveName(collective()); }
  /// The part every rank must agree on (peers differ in sendTo/recvFrom).
  bool sameCollective(const CallRecord& other) const {
    return kind == other.kind && dtype == other.dtype && op == other.op && count == other.count &&
           root == other.root && started == other.started && buffers == other.buffers &&
           layout == other.layout;
  }
  /// "allReduce of 16 f32 (sum)", "broadcast of 1 i32 from root 0", "started allReduce of 3
  /// buffers, 96 f32 (sum)", ...
  std::string describe() const;
};

/// What is wrong with the arguments of `call` on group rank `rank` of `ranks` (a bytes
/// reduction, a null buffer, a root or peer outside the group, buffers that overlap other than
/// in the in-place forms), or "". `in` and `out` as the collective takes them (broadcast: both
/// its buffer).
std::string argumentError(const CallRecord& call, const void* in, const void* out, int ranks,
                          int rank);

/// The record of a point-to-point call: a send to `sendTo` or a recv from `recvFrom` (started or
/// not); the count and dtype are what the two ranks must agree on.
CallRecord pointToPoint(Collective kind, DType dtype, size_t count, int sendTo, int recvFrom,
                        bool started);

/// What is wrong with a send (`sendTo`, `sendData`) and/or recv (`recvFrom`, `recvData`) of
/// `count` / `recvCount` elements on group rank `rank` of `ranks`: a peer outside the group or this
/// rank itself, a null buffer, overlapping buffers; or "". kNoPeer skips that half.
std::string pointToPointError(const CallRecord& call, const void* sendData, size_t sendCount,
                              int sendTo, const void* recvData, size_t recvCount, int recvFrom,
                              int ranks, int rank);

/// sendRecv through a backend's point-to-point queue (`start(record, sendData, recvData)` -> id,
/// `wait(id)`): both halves are started before either is waited for (a wait progresses the
/// other half, so neighbours exchanging with each other cannot deadlock); waits for both and
/// throws the first failure. kNoPeer skips a half.
template <class Queue>
void sendRecvThrough(Queue& queue, const void* sendData, size_t sendCount, int sendTo,
                     void* recvData, size_t recvCount, int recvFrom, DType dtype) {
  uint64_t sent = 0, received = 0;
  if (sendTo != Communicator::kNoPeer)
    sent = queue.start(
        pointToPoint(Collective::Send, dtype, sendCount, sendTo, Communicator::kNoPeer, false),
        sendData, nullptr);
  if (recvFrom != Communicator::kNoPeer)
    received = queue.start(
        pointToPoint(Collective::Recv, dtype, recvCount, Communicator::kNoPeer, recvFrom, false),
        nullptr, recvData);
  std::exception_ptr failure;
  for (uint64_t id : {received, sent}) {
    if (!id) continue;
    try {
      queue.wait(id);
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

/// "group rank 1 sent 8 f32 but group rank 2 expects 16 f32" (a send and its recv disagree).
std::string pointToPointMismatch(int sender, DType sentType, size_t sentCount, int receiver,
                                 DType expectedType, size_t expectedCount);

/// Checks a permute's pairs: every rank's sendTo receives from it and its recvFrom sends to it.
/// `callOf(q)` is group rank q's call; returns "" when they agree, else what is wrong (every
/// rank checks every pair, so all agree on the outcome).
std::string permuteMismatch(int ranks, const std::function<const CallRecord&(int)>& callOf);

} // namespace meshrt::detail
