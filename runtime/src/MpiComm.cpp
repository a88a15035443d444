// The MPI backend: every rank is an MPI process, and each collective is the MPI collective of the
// same meaning on a communicator of the group (the world: a duplicate of MPI_COMM_WORLD; a
// subgroup: MPI_Comm_split of the world).
//
// Each collective is started nonblocking (MPI_Iallreduce, ...) and completed by polling MPI_Test
// against the deadline, so that a rank that never arrives gives a CommError instead of a hang.
// Before it, unless turned off, the ranks allgather a small record of the call (collective,
// count, dtype, op, root, permute peers) and each checks all of them, so that ranks that
// disagree get a CommError on every rank instead of MPI's undefined behaviour. Every MPI call
// returns its error (MPI_ERRORS_RETURN on our communicators), which becomes a CommError with
// MPI_Error_string's text.
//
// Started collectives (startAllReduce, ...) are MPI's nonblocking collectives. With the agreement
// check, a start first allgathers its record nonblockingly on a second communicator (a duplicate
// of the group's, so that the records always match each other whatever the calls), and the data
// collective is started only once the records agree: a disagreement is a CommError at wait, and
// the mismatched data collective never reaches MPI (whose behaviour would be undefined). Data
// collectives start in the order the requests were started, at the first entry into meshrt
// (a later start, test, wait, or blocking call) after their agreement has completed. (OpenMPI
// progresses nonblocking collectives inside MPI calls only: test() is the way to progress them
// between kernels.) Waits poll MPI_Test against the deadline, as blocking calls do.
#include "meshrt/Mpi.h"

#include "CallRecord.h"
#include "MpiP2p.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <sstream>

#include <sched.h>

namespace meshrt {
namespace {

using Clock = std::chrono::steady_clock;

using detail::Collective;
/// One rank's call, as the ranks exchange it to check that they agree: kFields MPI_INT64_T.
using Call = detail::CallRecord;
constexpr int kFields = sizeof(Call) / sizeof(int64_t);
static_assert(sizeof(Call) == kFields * sizeof(int64_t));

MPI_Datatype mpiType(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return MPI_FLOAT;
  case DType::F64:
    return MPI_DOUBLE;
  case DType::I32:
    return MPI_INT32_T;
  case DType::Bytes:
    return MPI_BYTE;
  }
  return MPI_BYTE;
}

MPI_Op mpiOp(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
    return MPI_SUM;
  case ReduceOp::Max:
    return MPI_MAX;
  case ReduceOp::Min:
    return MPI_MIN;
  }
  return MPI_SUM;
}

std::string mpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, size_t(length));
}

void copyBytes(void* to, const void* from, size_t bytes) {
  if (bytes && to != from) std::memmove(to, from, bytes);
}

/// The subgroup's world axes as one number (digits base numAxes + 1), to compare across ranks.
int64_t encodeAxes(const std::vector<int>& axes, int numAxes) {
  int64_t code = 0;
  for (int axis : axes)
    code = code * (numAxes + 1) + axis + 1;
  return code;
}

/// How many MPI_Test polls a waiting rank makes before it yields its core between polls (ranks
/// may outnumber cores: mpirun --oversubscribe).
constexpr int kSpinPolls = 100;

/// A started collective in flight: its agreement (with the check), then its data collective.
struct Started {
  enum class Stage { Agreeing, Ready, Running, Done };
  uint64_t ticket = 0;
  Call call;
  Stage stage = Stage::Ready;
  MPI_Request agreement = MPI_REQUEST_NULL, data = MPI_REQUEST_NULL;
  std::vector<Call> calls; // the group's records
  // The data collective: MPI_Iallreduce(send, receive, count), MPI_Ireduce_scatter_block, or
  // MPI_Iallgather.
  const void* send = nullptr;
  void* receive = nullptr;
  int count = 0;
  uint64_t pointToPoint = 0;         // a send or recv: its id in MpiPeerOps (not a collective)
  std::vector<Segment<void>> bucket; // a bucket's buffers, packed into `packed` at launch
  std::vector<char> packed;          // the bucket, or an in-place reduceScatter's result
  void* copyTo = nullptr;            // in-place reduceScatter: where `packed` goes
  std::exception_ptr failure;
};

/// A hash of a bucket's buffer counts (FNV-1a), for the agreement check.
int64_t layoutHash(const Segment<void>* buffers, size_t numBuffers) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t k = 0; k < numBuffers; ++k) {
    hash ^= uint64_t(buffers[k].count);
    hash *= 1099511628211ull;
  }
  return int64_t(hash >> 1);
}

void finalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

class MpiComm final : public Communicator {
public:
  /// The world communicator over `comm` (which it owns).
  MpiComm(const Mesh& mesh, const MpiOptions& options, MPI_Comm comm)
      : worldMesh_(mesh), mesh_(mesh), options_(options), comm_(comm), worldComm_(nullptr) {
    for (int axis = 0; axis < mesh.numAxes(); ++axis)
      axes_.push_back(axis);
    MPI_Comm_rank(comm_, &groupRank_);
    worldRank_ = groupRank_;
    worldRanks_.resize(size_t(mesh.size()));
    for (int rank = 0; rank < mesh.size(); ++rank)
      worldRanks_[size_t(rank)] = rank;
    makeAgreementComm();
    makePointToPoint();
  }

  ~MpiComm() override {
    try {
      if (!broken_) waitAll();
    } catch (...) {
      // The communicator is going away: nobody is left to report to.
    }
    subgroups_.clear();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    if (agreementComm_ != MPI_COMM_NULL) MPI_Comm_free(&agreementComm_);
  }

  int rank() const override { return groupRank_; }
  const Mesh& mesh() const override { return mesh_; }
  const Mesh& worldMesh() const override { return worldMesh_; }
  int worldRank() const override { return worldRank_; }
  int worldRankOf(int groupRank) const override {
    if (groupRank < 0 || groupRank >= size())
      throw std::out_of_range("meshrt: rank " + std::to_string(groupRank) + " is not in group " +
                              mesh_.str());
    return worldRanks_[size_t(groupRank)];
  }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }
  const char* backend() const override { return "mpi"; }

  Communicator& subgroup(const std::vector<std::string>& axes) override {
    std::vector<int> worldAxes;
    for (const std::string& name : axes) {
      int index = mesh_.axisIndex(name);
      if (index < 0)
        throw std::invalid_argument("meshrt: subgroup: group mesh " + mesh_.str() +
                                    " has no axis '" + name + "'");
      int worldAxis = axes_[size_t(index)];
      if (std::find(worldAxes.begin(), worldAxes.end(), worldAxis) != worldAxes.end())
        throw std::invalid_argument("meshrt: subgroup: axis '" + name + "' named twice");
      worldAxes.push_back(worldAxis);
    }
    MpiComm& world = worldComm_ ? *worldComm_ : *this;
    if (worldAxes == world.axes_) return world;
    std::unique_ptr<MpiComm>& cached = world.subgroups_[worldAxes];
    if (!cached) cached = world.split(worldAxes);
    return *cached;
  }

  void barrier() override {
    Call call = Call::of(Collective::Barrier);
    finishStarted();
    if (size() == 1) return checkAlive(call);
    // The agreement check is itself a barrier: nobody's allgather completes before all have
    // joined it.
    if (options_.checkAgreement) return agree(call);
    MPI_Request request;
    check(call, MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
    complete(call, &request, 1);
  }

  void allReduceRaw(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    Call call = Call::of(Collective::AllReduce, dtype, op, count);
    size_t bytes = count * dtypeSize(dtype);
    checkArguments(call, in, out);
    agree(call);
    if (size() == 1) return copyBytes(out, in, bytes);
    const void* send = in == out ? MPI_IN_PLACE : in;
    int n = mpiCount(call, count);
    collective(
        call, "MPI_Allreduce",
        [&] { return MPI_Allreduce(send, out, n, mpiType(dtype), mpiOp(op), comm_); },
        [&](MPI_Request* request) {
          return MPI_Iallreduce(send, out, n, mpiType(dtype), mpiOp(op), comm_, request);
        });
  }

  void reduceScatterRaw(const void* in, void* out, size_t countPerRank, DType dtype,
                        ReduceOp op) override {
    Call call = Call::of(Collective::ReduceScatter, dtype, op, countPerRank);
    size_t chunkBytes = countPerRank * dtypeSize(dtype), p = size_t(size());
    checkArguments(call, in, out);
    const char* myChunk = static_cast<const char*>(in) + size_t(groupRank_) * chunkBytes;
    bool inPlace = out == myChunk;
    agree(call);
    if (p == 1) return copyBytes(out, in, chunkBytes);
    // MPI's in-place form reads and writes from the start of the buffer, not at chunk rank():
    // reduce into scratch and copy.
    if (inPlace) scratch_.resize(chunkBytes);
    void* target = inPlace ? scratch_.data() : out;
    int n = mpiCount(call, countPerRank);
    collective(
        call, "MPI_Reduce_scatter_block",
        [&] { return MPI_Reduce_scatter_block(in, target, n, mpiType(dtype), mpiOp(op), comm_); },
        [&](MPI_Request* request) {
          return MPI_Ireduce_scatter_block(in, target, n, mpiType(dtype), mpiOp(op), comm_,
                                           request);
        });
    if (inPlace) copyBytes(out, scratch_.data(), chunkBytes);
  }

  void allGatherRaw(const void* in, void* out, size_t countPerRank, DType dtype) override {
    Call call = Call::of(Collective::AllGather, dtype, ReduceOp::Sum, countPerRank);
    size_t chunkBytes = countPerRank * dtypeSize(dtype), p = size_t(size());
    checkArguments(call, in, out);
    char* myChunk = static_cast<char*>(out) + size_t(groupRank_) * chunkBytes;
    bool inPlace = in == myChunk;
    agree(call);
    if (p == 1) return copyBytes(out, in, chunkBytes);
    int n = mpiCount(call, countPerRank);
    const void* send = inPlace ? MPI_IN_PLACE : in;
    collective(
        call, "MPI_Allgather",
        [&] { return MPI_Allgather(send, n, mpiType(dtype), out, n, mpiType(dtype), comm_); },
        [&](MPI_Request* request) {
          return MPI_Iallgather(send, n, mpiType(dtype), out, n, mpiType(dtype), comm_, request);
        });
  }

  void allToAllRaw(const void* in, void* out, size_t countPerRank, DType dtype) override {
    Call call = Call::of(Collective::AllToAll, dtype, ReduceOp::Sum, countPerRank);
    size_t chunkBytes = countPerRank * dtypeSize(dtype), p = size_t(size());
    checkArguments(call, in, out);
    agree(call);
    if (p == 1) return copyBytes(out, in, chunkBytes);
    int n = mpiCount(call, countPerRank);
    collective(
        call, "MPI_Alltoall",
        [&] { return MPI_Alltoall(in, n, mpiType(dtype), out, n, mpiType(dtype), comm_); },
        [&](MPI_Request* request) {
          return MPI_Ialltoall(in, n, mpiType(dtype), out, n, mpiType(dtype), comm_, request);
        });
  }

  void permuteRaw(const void* in, void* out, size_t count, DType dtype, int sendTo,
                  int recvFrom) override {
    Call call = Call::of(Collective::Permute, dtype, ReduceOp::Sum, count, 0, sendTo, recvFrom);
    size_t bytes = count * dtypeSize(dtype);
    checkArguments(call, in, out);
    agree(call);
    MPI_Request requests[2];
    int pending = 0;
    int n = mpiCount(call, count);
    if (recvFrom == kNoPeer)
      std::fill_n(static_cast<char*>(out), bytes, 0);
    else
      check(call,
            MPI_Irecv(out, n, mpiType(dtype), recvFrom, kPermuteTag, comm_, &requests[pending++]),
            "MPI_Irecv");
    if (sendTo != kNoPeer)
      check(call,
            MPI_Isend(in, n, mpiType(dtype), sendTo, kPermuteTag, comm_, &requests[pending++]),
            "MPI_Isend");
    complete(call, requests, pending);
  }

  void broadcastRaw(void* data, size_t count, DType dtype, int root) override {
    Call call = Call::of(Collective::Broadcast, dtype, ReduceOp::Sum, count, root);
    checkArguments(call, data, data);
    agree(call);
    if (size() == 1) return;
    int n = mpiCount(call, count);
    collective(
        call, "MPI_Bcast", [&] { return MPI_Bcast(data, n, mpiType(dtype), root, comm_); },
        [&](MPI_Request* request) {
          return MPI_Ibcast(data, n, mpiType(dtype), root, comm_, request);
        });
  }

  // --- Started collectives ----------------------------------------------------------------------

  Request startAllReduceRaw(const void* in, void* out, size_t count, DType dtype,
                            ReduceOp op) override {
    Call call = Call::startOf(Collective::AllReduce, dtype, op, count);
    size_t bytes = count * dtypeSize(dtype);
    checkArguments(call, in, out);
    Started started;
    started.send = in == out ? MPI_IN_PLACE : in;
    started.receive = out;
    started.count = mpiCount(call, count);
    if (size() == 1) return finishAtStart(call, [&] { copyBytes(out, in, bytes); });
    return launchOrQueue(call, std::move(started));
  }

  Request startAllReduceRaw(const Segment<void>* buffers, size_t numBuffers, DType dtype,
                            ReduceOp op) override {
    size_t total = 0;
    for (size_t k = 0; k < numBuffers; ++k)
      total += buffers[k].count;
    Call call = Call::startOf(Collective::AllReduce, dtype, op, total, numBuffers);
    call.layout = layoutHash(buffers, numBuffers);
    checkArguments(call, nullptr, nullptr);
    for (size_t k = 0; k < numBuffers; ++k)
      checkBuffer(call, buffers[k].data, buffers[k].count * dtypeSize(dtype), "a buffer");
    if (size() == 1) return finishAtStart(call, [] {});
    Started started;
    started.bucket.assign(buffers, buffers + numBuffers);
    started.send = MPI_IN_PLACE;
    started.count = mpiCount(call, total);
    return launchOrQueue(call, std::move(started));
  }

  Request startReduceScatterRaw(const void* in, void* out, size_t countPerRank, DType dtype,
                                ReduceOp op) override {
    Call call = Call::startOf(Collective::ReduceScatter, dtype, op, countPerRank);
    size_t chunkBytes = countPerRank * dtypeSize(dtype), p = size_t(size());
    checkArguments(call, in, out);
    const char* myChunk = static_cast<const char*>(in) + size_t(groupRank_) * chunkBytes;
    bool inPlace = out == myChunk;
    if (p == 1) return finishAtStart(call, [&] { copyBytes(out, in, chunkBytes); });
    Started started;
    started.send = in;
    started.count = mpiCount(call, countPerRank);
    if (inPlace) {
      // As the blocking form: MPI's in-place reduce-scatter does not put the chunk at rank().
      started.packed.resize(chunkBytes);
      started.copyTo = out;
    } else {
      started.receive = out;
    }
    return launchOrQueue(call, std::move(started));
  }

  Request startAllGatherRaw(const void* in, void* out, size_t countPerRank, DType dtype) override {
    Call call = Call::startOf(Collective::AllGather, dtype, ReduceOp::Sum, countPerRank);
    size_t chunkBytes = countPerRank * dtypeSize(dtype), p = size_t(size());
    checkArguments(call, in, out);
    char* myChunk = static_cast<char*>(out) + size_t(groupRank_) * chunkBytes;
    bool inPlace = in == myChunk;
    if (p == 1) return finishAtStart(call, [&] { copyBytes(out, in, chunkBytes); });
    Started started;
    started.send = inPlace ? MPI_IN_PLACE : in;
    started.receive = out;
    started.count = mpiCount(call, countPerRank);
    return launchOrQueue(call, std::move(started));
  }

  // --- Point-to-point (MpiP2p.h) ---------------------------------------------------------------

  void sendRaw(const void* data, size_t count, DType dtype, int peer) override {
    Call call = detail::pointToPoint(Collective::Send, dtype, count, peer, kNoPeer, false);
    checkPointToPoint(call, data, count, peer, nullptr, 0, kNoPeer);
    p2p_->wait(p2p_->start(call, data, nullptr));
  }

  void recvRaw(void* data, size_t count, DType dtype, int peer) override {
    Call call = detail::pointToPoint(Collective::Recv, dtype, count, kNoPeer, peer, false);
    checkPointToPoint(call, nullptr, 0, kNoPeer, data, count, peer);
    p2p_->wait(p2p_->start(call, nullptr, data));
  }

  void sendRecvRaw(const void* sendData, size_t sendCount, int sendTo, void* recvData,
                   size_t recvCount, int recvFrom, DType dtype) override {
    Call call =
        detail::pointToPoint(Collective::SendRecv, dtype, sendCount, sendTo, recvFrom, false);
    checkPointToPoint(call, sendData, sendCount, sendTo, recvData, recvCount, recvFrom);
    detail::sendRecvThrough(*p2p_, sendData, sendCount, sendTo, recvData, recvCount, recvFrom,
                            dtype);
  }

  Request startSendRaw(const void* data, size_t count, DType dtype, int peer) override {
    Call call = detail::pointToPoint(Collective::Send, dtype, count, peer, kNoPeer, true);
    checkPointToPoint(call, data, count, peer, nullptr, 0, kNoPeer);
    return startedPointToPoint(call, p2p_->start(call, data, nullptr));
  }

  Request startRecvRaw(void* data, size_t count, DType dtype, int peer) override {
    Call call = detail::pointToPoint(Collective::Recv, dtype, count, kNoPeer, peer, true);
    checkPointToPoint(call, nullptr, 0, kNoPeer, data, count, peer);
    return startedPointToPoint(call, p2p_->start(call, nullptr, data));
  }

  void waitAll() override { waitRaw(nextTicket_); }

protected:
  void waitRaw(uint64_t ticket) override {
    // Completes every request up to `ticket` even after one failed (MPI may still write into
    // their buffers), then throws the first failure.
    std::exception_ptr first;
    while (!started_.empty() && started_.front().ticket <= ticket) {
      try {
        advance(started_.front(), /*block=*/true);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
      completed_ = started_.front().ticket;
      started_.pop_front();
    }
    if (first) std::rethrow_exception(first);
  }

  bool testRaw(uint64_t ticket) override {
    progress();
    while (!started_.empty() && started_.front().ticket <= ticket &&
           started_.front().stage == Started::Stage::Done) {
      std::exception_ptr failure = started_.front().failure;
      completed_ = started_.front().ticket;
      started_.pop_front();
      if (failure) std::rethrow_exception(failure);
    }
    return completed_ >= ticket;
  }

  uint64_t completedThrough() const override { return completed_; }

private:
  static constexpr int kPermuteTag = 7;

  /// A started collective on a group of one: done at once.
  template <class Local> Request finishAtStart(const Call& call, Local local) {
    finishStarted(); // the order of completion is the order of starts
    checkAlive(call);
    local();
    return Request();
  }

  /// Queues a started collective: its agreement allgather (with the check), else its data
  /// collective at once; then progresses what is in flight.
  Request launchOrQueue(const Call& call, Started started) {
    checkAlive(call);
    started.call = call;
    started.ticket = ++nextTicket_;
    // In the deque first: MPI reads the record from where it stays (push_back and pop_front
    // keep a deque's elements in place).
    Started& queued = started_.emplace_back(std::move(started));
    if (options_.checkAgreement) {
      queued.stage = Started::Stage::Agreeing;
      queued.calls.resize(size_t(size()));
      int code = MPI_Iallgather(&queued.call, kFields, MPI_INT64_T, queued.calls.data(), kFields,
                                MPI_INT64_T, agreementComm_, &queued.agreement);
      if (code != MPI_SUCCESS) {
        started_.pop_back();
        --nextTicket_;
        check(call, code, "MPI_Iallgather (the agreement check)");
      }
    }
    uint64_t ticket = queued.ticket;
    progress();
    return pendingRequest(ticket);
  }

  /// Does what the requests in flight allow without blocking; a failure is kept for the wait.
  void progress() {
    for (Started& started : started_) {
      if (started.stage == Started::Stage::Done) continue;
      try {
        advance(started, /*block=*/false);
      } catch (...) {
        started.stage = Started::Stage::Done;
        started.failure = std::current_exception();
      }
      // Data collectives reach MPI in the order of the starts (sends and recvs are MPI's at their
      // start).
      if (started.stage < Started::Stage::Running && !started.pointToPoint) return;
    }
  }

  /// Blocking calls come after the started ones on this communicator.
  /// Blocking calls come after the started collectives on this communicator (and the sends and
  /// recvs started before them; later ones stay in flight).
  void finishStarted() {
    for (auto last = started_.rbegin(); last != started_.rend(); ++last)
      if (!last->pointToPoint) return waitRaw(last->ticket);
  }

  /// The communicator of sends and recvs (a group of one has no peers to talk to).
  void makePointToPoint() {
    if (mesh_.size() == 1) return;
    MPI_Comm comm = MPI_COMM_NULL;
    int code = MPI_Comm_dup(comm_, &comm);
    if (code == MPI_SUCCESS) code = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    if (code != MPI_SUCCESS)
      throw CommError("", worldRank_,
                      "meshrt: MPI_Comm_dup (the point-to-point communicator) failed: " +
                          mpiErrorText(code));
    p2p_ = std::make_unique<detail::MpiPeerOps>(
        comm, worldRanks_, groupRank_, options_.timeout,
        [this](const Call& call, const std::string& cause) { return error(call, cause); });
  }

  /// Queues a started send or recv (`id` in p2p_) with the started collectives, for its ticket.
  Request startedPointToPoint(const Call& call, uint64_t id) {
    Started& queued = started_.emplace_back();
    queued.call = call;
    queued.ticket = ++nextTicket_;
    queued.pointToPoint = id;
    queued.stage = Started::Stage::Running;
    return pendingRequest(queued.ticket);
  }

  void checkPointToPoint(const Call& call, const void* sendData, size_t sendCount, int sendTo,
                         const void* recvData, size_t recvCount, int recvFrom) const {
    std::string cause = detail::pointToPointError(call, sendData, sendCount, sendTo, recvData,
                                                  recvCount, recvFrom, size(), groupRank_);
    if (!cause.empty()) throw error(call, cause);
    checkAlive(call);
  }

  /// Advances `started` through agreement, launch and completion (blocking: to the end, or a
  /// CommError). Requests before it must have launched.
  void advance(Started& started, bool block) {
    const Call& call = started.call;
    if (started.stage == Started::Stage::Done) {
      if (started.failure) std::rethrow_exception(started.failure);
      return;
    }
    try {
      if (started.pointToPoint) {
        if (block)
          p2p_->wait(started.pointToPoint);
        else if (!p2p_->test(started.pointToPoint))
          return;
        started.stage = Started::Stage::Done;
        return;
      }
      if (started.stage == Started::Stage::Agreeing) {
        if (!poll(started, &started.agreement, block)) return;
        for (int q = 0; q < size(); ++q) {
          const Call& peer = started.calls[size_t(q)];
          if (peer.sameCollective(call)) continue;
          std::string cause = "ranks disagree: group rank " + std::to_string(groupRank_) +
                              " called " + call.describe() + " but group rank " +
                              std::to_string(q) + " called " + peer.describe();
          if (peer.layout != call.layout && peer.kind == call.kind && peer.count == call.count)
            cause += " (the buffers' counts differ)";
          throw error(call, cause);
        }
        started.stage = Started::Stage::Ready;
      }
      if (started.stage == Started::Stage::Ready) {
        launch(started);
        started.stage = Started::Stage::Running;
      }
      if (!poll(started, &started.data, block)) return;
      finish(started);
      started.stage = Started::Stage::Done;
    } catch (...) {
      started.stage = Started::Stage::Done;
      started.failure = std::current_exception();
      throw;
    }
  }

  /// MPI_Test once (or, blocking, until done or the deadline: complete()).
  bool poll(const Started& started, MPI_Request* request, bool block) {
    checkAlive(started.call);
    if (block) {
      complete(started.call, request, 1);
      return true;
    }
    int done = 0;
    check(started.call, MPI_Test(request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }

  void launch(Started& started) {
    const Call& call = started.call;
    MPI_Datatype type = mpiType(call.type());
    size_t elementSize = dtypeSize(call.type());
    switch (call.collective()) {
    case Collective::AllReduce:
      if (!started.bucket.empty()) {
        started.packed.resize(size_t(call.count) * elementSize);
        char* at = started.packed.data();
        for (const Segment<void>& buffer : started.bucket) {
          copyBytes(at, buffer.data, buffer.count * elementSize);
          at += buffer.count * elementSize;
        }
        started.receive = started.packed.data();
      }
      check(call,
            MPI_Iallreduce(started.send, started.receive, started.count, type,
                           mpiOp(ReduceOp(call.op)), comm_, &started.data),
            "MPI_Iallreduce");
      break;
    case Collective::ReduceScatter:
      check(call,
            MPI_Ireduce_scatter_block(
                started.send, started.copyTo ? started.packed.data() : started.receive,
                started.count, type, mpiOp(ReduceOp(call.op)), comm_, &started.data),
            "MPI_Ireduce_scatter_block");
      break;
    case Collective::AllGather:
      check(call,
            MPI_Iallgather(started.send, started.count, type, started.receive, started.count, type,
                           comm_, &started.data),
            "MPI_Iallgather");
      break;
    default:
      throw error(call, "not a collective that can be started");
    }
  }

  /// Unpacks a bucket, or places an in-place reduce-scatter's chunk.
  void finish(Started& started) {
    size_t elementSize = dtypeSize(started.call.type());
    if (!started.bucket.empty()) {
      const char* at = started.packed.data();
      for (const Segment<void>& buffer : started.bucket) {
        copyBytes(buffer.data, at, buffer.count * elementSize);
        at += buffer.count * elementSize;
      }
    }
    if (started.copyTo) copyBytes(started.copyTo, started.packed.data(), started.packed.size());
  }

  /// A subgroup over `comm`, owned by the world communicator `world`.
  MpiComm(MpiComm& world, std::vector<int> axes, Mesh groupMesh, std::vector<int> worldRanks,
          MPI_Comm comm)
      : worldMesh_(world.worldMesh_), mesh_(std::move(groupMesh)), options_(world.options_),
        comm_(comm), worldComm_(&world), axes_(std::move(axes)), worldRanks_(std::move(worldRanks)),
        worldRank_(world.worldRank_) {
    MPI_Comm_rank(comm_, &groupRank_);
    makeAgreementComm();
    makePointToPoint();
  }

  /// The communicator of the started collectives' agreement records (with the check on).
  void makeAgreementComm() {
    if (!options_.checkAgreement || mesh_.size() == 1) return;
    int code = MPI_Comm_dup(comm_, &agreementComm_);
    if (code == MPI_SUCCESS) code = MPI_Comm_set_errhandler(agreementComm_, MPI_ERRORS_RETURN);
    if (code != MPI_SUCCESS)
      throw CommError("", worldRank_,
                      "meshrt: MPI_Comm_dup (the agreement communicator) failed: " +
                          mpiErrorText(code));
  }

  /// Creates the subgroup over world axes `worldAxes` (on the world communicator): every world
  /// rank must make the same call (MPI_Comm_split is collective over the world), checked first.
  std::unique_ptr<MpiComm> split(const std::vector<int>& worldAxes) {
    finishStarted();
    Call call = Call::of(Collective::Subgroup);
    call.count = encodeAxes(worldAxes, worldMesh_.numAxes());
    if (size() > 1) agreeAlways(call);
    std::vector<MeshAxis> groupAxes;
    for (int axis : worldAxes)
      groupAxes.push_back(worldMesh_.axes()[size_t(axis)]);
    Mesh groupMesh(std::move(groupAxes));
    // Members share every coordinate outside the axes: the color is the first member's world
    // rank, the key the rank's index in the group (row-major over the axes in the named order).
    std::vector<int> coords = worldMesh_.coords(worldRank_);
    std::vector<int> members;
    int groupRank = 0;
    for (int member = 0; member < groupMesh.size(); ++member) {
      std::vector<int> groupCoords = groupMesh.coords(member);
      std::vector<int> memberCoords = coords;
      for (size_t i = 0; i < worldAxes.size(); ++i)
        memberCoords[size_t(worldAxes[i])] = groupCoords[i];
      members.push_back(worldMesh_.rank(memberCoords));
      if (members.back() == worldRank_) groupRank = member;
    }
    MPI_Comm comm = MPI_COMM_NULL;
    check(call, MPI_Comm_split(comm_, members[0], groupRank, &comm), "MPI_Comm_split");
    check(call, MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    return std::unique_ptr<MpiComm>(
        new MpiComm(*this, worldAxes, std::move(groupMesh), std::move(members), comm));
  }

  CommError error(const Call& call, const std::string& cause) const {
    std::ostringstream message;
    message << "meshrt: " << call.name() << " failed on world rank " << worldRank_;
    if (worldComm_ || worldMesh_.numAxes() == 0)
      message << " (rank " << groupRank_ << " of group " << mesh_.str() << ")";
    else
      message << " (mesh " << worldMesh_.str() << ")";
    message << ", MPI backend: " << cause;
    return CommError(call.name(), worldRank_, message.str());
  }

  void check(const Call& call, int code, const char* function) const {
    if (code != MPI_SUCCESS) throw error(call, std::string(function) + ": " + mpiErrorText(code));
  }
  /// Argument errors (detail::argumentError) are CommErrors on the calling rank.
  void checkArguments(const Call& call, const void* in, const void* out) const {
    std::string cause = detail::argumentError(call, in, out, size(), groupRank_);
    if (!cause.empty()) throw error(call, cause);
  }
  void checkBuffer(const Call& call, const void* buffer, size_t bytes, const char* what) const {
    if (!buffer && bytes) throw error(call, std::string(what) + " is null");
  }
  /// A collective on a group of one has nobody to wait for; it still fails after a timeout.
  void checkAlive(const Call& call) const {
    if (broken_) throw error(call, broken_cause_);
  }

  /// MPI counts are ints: a larger count is an error (the same on every rank, as they agree).
  int mpiCount(const Call& call, size_t count) const {
    if (count > size_t(INT_MAX))
      throw error(call, "count " + std::to_string(count) + " exceeds MPI's int counts");
    return int(count);
  }

  /// Runs one data collective. After the agreement check every rank of the group is known to
  /// have entered this collective, so MPI's blocking form cannot wait for a missing rank (and
  /// is faster: OpenMPI's tuned algorithms, not its nonblocking schedules). Without the check,
  /// the nonblocking form, polled against the deadline.
  template <class Blocking, class Start>
  void collective(const Call& call, const char* function, Blocking blocking, Start start) {
    if (options_.checkAgreement) return check(call, blocking(), function);
    MPI_Request request;
    check(call, start(&request), function);
    complete(call, &request, 1);
  }

  /// Waits for `requests` by polling MPI_Testall until they complete or the deadline passes.
  void complete(const Call& call, MPI_Request* requests, int count) {
    Clock::time_point deadline = Clock::now() + options_.timeout;
    for (unsigned poll = 0;; ++poll) {
      int done = 0;
      check(call, MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
      if (done) return;
      if (poll >= kSpinPolls) sched_yield();
      if (poll % 64 == 0 && Clock::now() > deadline) {
        // MPI cannot cancel a collective: this communicator stays unusable.
        std::ostringstream cause;
        cause << "timed out after " << double(options_.timeout.count()) / 1000
              << " s waiting for the other ranks of the group (a rank that failed, exited or "
                 "is stuck before this collective; MESHRT_TIMEOUT_S sets the limit)";
        broken_ = true;
        broken_cause_ = cause.str();
        throw error(call, cause.str());
      }
    }
  }

  /// Checks that every rank of the group makes the same call (unless turned off).
  void agree(const Call& call) {
    finishStarted();
    checkAlive(call);
    if (options_.checkAgreement && size() > 1) agreeAlways(call);
  }

  void agreeAlways(const Call& call) {
    checkAlive(call);
    int p = size();
    calls_.resize(size_t(p));
    MPI_Request request;
    check(call,
          MPI_Iallgather(&call, kFields, MPI_INT64_T, calls_.data(), kFields, MPI_INT64_T, comm_,
                         &request),
          "MPI_Iallgather (the agreement check)");
    complete(call, &request, 1);
    for (int q = 0; q < p; ++q)
      if (!calls_[size_t(q)].sameCollective(call))
        throw error(call, "ranks disagree: group rank " + std::to_string(groupRank_) + " called " +
                              call.describe() + " but group rank " + std::to_string(q) +
                              " called " + calls_[size_t(q)].describe());
    if (call.collective() != Collective::Permute) return;
    std::string mismatch =
        detail::permuteMismatch(p, [&](int q) -> const Call& { return calls_[size_t(q)]; });
    if (!mismatch.empty()) throw error(call, mismatch);
  }

  Mesh worldMesh_;
  Mesh mesh_;
  MpiOptions options_;
  MPI_Comm comm_;
  MpiComm* worldComm_;    // null for the world communicator itself
  std::vector<int> axes_; // the world axes this group spans, in group order
  std::vector<int> worldRanks_;
  int worldRank_ = 0;
  int groupRank_ = 0;
  bool broken_ = false;
  std::string broken_cause_;
  MPI_Comm agreementComm_ = MPI_COMM_NULL; // started collectives' records (checked only)
  std::deque<Started> started_;            // in flight, oldest first
  uint64_t nextTicket_ = 0, completed_ = 0;
  std::vector<Call> calls_;   // the group's calls, gathered by the agreement check
  std::vector<char> scratch_; // in-place reduceScatter's result
  std::map<std::vector<int>, std::unique_ptr<MpiComm>> subgroups_;
  std::unique_ptr<detail::MpiPeerOps> p2p_; // sends and recvs (null on a group of one)
};

} // namespace

bool MpiOptions::defaultCheckAgreement() {
  const char* text = std::getenv("MESHRT_MPI_CHECK");
  if (!text || !*text) return true;
  std::string value(text);
  if (value == "0" || value == "off" || value == "false") return false;
  if (value == "1" || value == "on" || value == "true") return true;
  throw std::invalid_argument("meshrt: MESHRT_MPI_CHECK='" + value + "' is not 0 or 1");
}

int initMpi() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) throw std::runtime_error("meshrt: MPI has already been finalized");
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      throw std::runtime_error("meshrt: MPI_Init_thread failed");
    std::atexit(finalizeAtExit);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

std::unique_ptr<Communicator> mpiWorld(const Mesh& mesh, const MpiOptions& options) {
  int rank = initMpi(), processes = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &processes);
  if (processes != mesh.size())
    throw CommError("", rank,
                    "meshrt: the MPI world has " + std::to_string(processes) +
                        " process(es) but the mesh " + mesh.str() + " has " +
                        std::to_string(mesh.size()) + " ranks (start it with mpirun -np " +
                        std::to_string(mesh.size()) + ")");
  MPI_Comm comm = MPI_COMM_NULL;
  int code = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (code == MPI_SUCCESS) code = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (code != MPI_SUCCESS)
    throw CommError("", rank,
                    "meshrt: MPI_Comm_dup of MPI_COMM_WORLD failed: " + mpiErrorText(code));
  return std::make_unique<MpiComm>(mesh, options, comm);
}

void runMpi(const Mesh& mesh, const std::function<void(Communicator&)>& program,
            const MpiOptions& options) {
  int rank = initMpi(), processes = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &processes);
  std::string failure;
  try {
    std::unique_ptr<Communicator> world = mpiWorld(mesh, options);
    program(*world);
    return;
  } catch (const CommError& caught) {
    if (processes == 1) throw;
    failure = caught.what();
  } catch (const std::exception& caught) {
    if (processes == 1) throw;
    failure = "meshrt: world rank " + std::to_string(rank) + " failed: " + caught.what();
  } catch (...) {
    if (processes == 1) throw;
    failure = "meshrt: world rank " + std::to_string(rank) +
              " failed: an exception that is not a std::exception";
  }
  std::fprintf(stderr, "error: %s\n", failure.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort(); // MPI_Abort does not return
}

} // namespace meshrt
