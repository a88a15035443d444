// The communicator interface of meshrt: what generated SPMD code calls, and what every backend
// (threads today; MPI and NCCL later) implements. Each rank runs the same program and holds one
// Communicator over the whole mesh; subgroup(axes) gives the communicator over the ranks that
// differ only along some axes (the ranks a collective over a split dim talks to).
//
// Conventions shared by every backend (docs/runtime.md has the full contract):
// - Ranks are numbered row-major over the mesh axes (the last axis varies fastest). A subgroup's
//   ranks are numbered row-major over its axes in the order they were named.
// - Counts are element counts; every rank of a collective passes the same count, dtype and op
//   (checked: a mismatch is a CommError on every rank of the group).
// - Chunked collectives (reduceScatter, allGather, allToAll) use `countPerRank` elements per
//   rank of the group, chunk i of a size()*countPerRank buffer belonging to group rank i.
// - In-place forms follow NCCL: allReduce with in == out; reduceScatter with
//   out == in + rank()*countPerRank; allGather with in == out + rank()*countPerRank; broadcast is
//   always in place. Any other overlap of in and out is a CommError.
// - Reductions combine the ranks' values in group-rank order, so every rank gets the same bits.
// - A rank that fails (throws, exits early, or does not arrive within timeout()) turns every
//   other rank's pending and later collectives into a CommError instead of a hang.
// - Started collectives (startAllReduce, ...) return a Request and run while the rank computes;
//   wait(request) completes it. Every rank starts the same collectives in the same order (as for
//   blocking calls, checked the same way); requests on one communicator complete in the order
//   they were started; a blocking collective first completes the started collectives in flight
//   on its communicator (and the sends and recvs started before them).
// - Point-to-point send / recv (pipeline stages) involve two ranks only; see "Point-to-point".
//
// Host code, C++17 and up (generated CUDA sources include it through nvcc's host compiler).
#pragma once

#include "meshrt/Trace.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshrt {

/// The error of a failed collective: names the collective, the rank and the cause.
class CommError : public std::runtime_error {
public:
  CommError(std::string collective, int worldRank, const std::string& message)
      : std::runtime_error(message), collective_(std::move(collective)), worldRank_(worldRank) {}
  /// The collective that failed ("allReduce", "barrier", ...), or "" outside a collective.
  const std::string& collective() const { return collective_; }
  /// The world rank that raised this error.
  int worldRank() const { return worldRank_; }

private:
  std::string collective_;
  int worldRank_;
};

struct MeshAxis {
  std::string name;
  int size = 1;
  bool operator==(const MeshAxis& other) const { return name == other.name && size == other.size; }
  bool operator!=(const MeshAxis& other) const { return !(*this == other); }
};

/// Processors as a grid with named axes; ranks are numbered row-major (last axis fastest).
class Mesh {
public:
  /// The mesh of one processor (no axes).
  Mesh() = default;
  /// Throws std::invalid_argument on an empty or repeated axis name or a size < 1.
  Mesh(std::vector<MeshAxis> axes);
  Mesh(std::initializer_list<MeshAxis> axes) : Mesh(std::vector<MeshAxis>(axes)) {}
  /// Parses "data=2,model=4" (spaces allowed; "" is the one-processor mesh).
  static Mesh parse(std::string_view text);

  const std::vector<MeshAxis>& axes() const { return axes_; }
  int numAxes() const { return int(axes_.size()); }
  /// The number of ranks: the product of the axis sizes.
  int size() const;
  /// Index of the axis named `name`, or -1.
  int axisIndex(std::string_view name) const;
  /// Size of the axis named `name`; throws std::invalid_argument if there is none.
  int axisSize(std::string_view name) const;
  /// Row-major coordinates of `rank`, one per axis.
  std::vector<int> coords(int rank) const;
  /// The rank at `coords` (one per axis, each in range).
  int rank(const std::vector<int>& coords) const;
  /// "[data=2, model=4]".
  std::string str() const;
  bool operator==(const Mesh& other) const { return axes_ == other.axes_; }
  bool operator!=(const Mesh& other) const { return !(*this == other); }

private:
  std::vector<MeshAxis> axes_;
};

enum class ReduceOp { Sum, Max, Min };
/// Element types of collectives. Bytes has no reductions.
enum class DType { F32, F64, I32, Bytes };

template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::F32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::F64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::I32; };
template <> struct DTypeOf<std::byte> { static constexpr DType value = DType::Bytes; };
template <> struct DTypeOf<unsigned char> { static constexpr DType value = DType::Bytes; };

size_t dtypeSize(DType dtype);
const char* dtypeName(DType dtype);
const char* reduceOpName(ReduceOp op);

/// The timeout a backend uses unless told otherwise: MESHRT_TIMEOUT_S from the environment
/// (seconds, may be fractional), else 60 s. Throws std::invalid_argument on a malformed value.
std::chrono::milliseconds defaultTimeout();

/// One buffer of a bucket (a started all-reduce over several buffers): `count` elements at
/// `data`. Segment<void> is the type-erased form.
template <class T> struct Segment {
  T* data = nullptr;
  size_t count = 0;
};

class Communicator;

/// A started collective (Communicator::startAllReduce, ...). Movable, not copyable. Pending
/// until it is completed by wait() / test() (or by waiting for a request started after it on
/// the same communicator). Destroying (or assigning over) a pending Request waits for it; an
/// error met then is not lost: the communicator (threads: the world) has failed and its next
/// call throws. A Request must not outlive its communicator.
class Request {
public:
  Request() = default;
  Request(Request&& other) noexcept : owner_(other.owner_), ticket_(other.ticket_) {
    other.owner_ = nullptr;
  }
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request() { finishQuietly(); }

  /// Started and not yet completed (by wait, test, or the wait for a later request).
  bool pending() const;
  /// owner.wait(*this): returns once the collective has completed (its output is ready and its
  /// buffers may be reused); throws CommError if it failed. No-op when not pending.
  void wait();
  /// owner.test(*this): progresses it without blocking; true once it has completed.
  bool test();
  /// The communicator that started it (null when not pending).
  Communicator* owner() const { return owner_; }
  /// Its number among the collectives started on its communicator (1, 2, ...).
  uint64_t ticket() const { return ticket_; }

private:
  friend class Communicator;
  Request(Communicator& owner, uint64_t ticket) : owner_(&owner), ticket_(ticket) {}
  void finishQuietly() noexcept;

  Communicator* owner_ = nullptr;
  uint64_t ticket_ = 0;
};

/// Where a shift has no peer, the rank receives zeros (Zero) or the shift wraps around (Wrap).
enum class Boundary { Wrap, Zero };

/// A communicator over a group of ranks. Not thread-safe: each rank uses its own from one thread.
class Communicator {
public:
  /// permute's peer value meaning "nobody".
  static constexpr int kNoPeer = -1;
  /// The category of the collectives' trace events (meshrt/Trace.h).
  static constexpr const char* kCollective = "collective";
  /// The category of send / recv trace events.
  static constexpr const char* kPointToPoint = "p2p";

  virtual ~Communicator() = default;

  // --- Identity -------------------------------------------------------------------------------
  /// This rank's index in the group, in [0, size()).
  virtual int rank() const = 0;
  int size() const { return mesh().size(); }
  /// The group's mesh: the whole mesh for the world communicator, only the group's axes (in the
  /// order they were named) for a subgroup.
  virtual const Mesh& mesh() const = 0;
  /// This rank's coordinates in mesh().
  std::vector<int> coords() const { return mesh().coords(rank()); }
  /// This rank's coordinate along the axis `axis` of mesh() (throws if there is none).
  int coord(std::string_view axis) const;
  /// The mesh and rank of the world communicator this group belongs to.
  virtual const Mesh& worldMesh() const = 0;
  virtual int worldRank() const = 0;
  /// The world rank of this group's rank `groupRank`.
  virtual int worldRankOf(int groupRank) const = 0;
  /// How long a collective waits for a missing rank before failing.
  virtual std::chrono::milliseconds timeout() const = 0;
  /// "threads", "mpi", "nccl".
  virtual const char* backend() const = 0;

  /// The communicator over the ranks that share this rank's coordinates on every axis of mesh()
  /// except `axes`; its ranks are row-major over `axes` in the given order. Empty `axes`: the
  /// group of this rank alone; all of the world's axes in mesh order: the world communicator.
  /// Cached: repeated calls return the same object, owned by the world communicator. Treat the
  /// first call for given axes like a collective over the new group's members (MPI and NCCL create
  /// communicators collectively; threads need not): every member makes it, in the same order
  /// relative to its collectives. Generated code creates its subgroups up front, in its
  /// constructor. Throws std::invalid_argument on an unknown or repeated axis.
  virtual Communicator& subgroup(const std::vector<std::string>& axes) = 0;
  Communicator& subgroup(std::initializer_list<std::string_view> axes) {
    return subgroup(std::vector<std::string>(axes.begin(), axes.end()));
  }

  // --- Collectives (typed) --------------------------------------------------------------------
  /// out[i] = op over ranks of in[i]; `count` elements. in == out for in place.
  template <class T>
  void allReduce(const T* in, T* out, size_t count, ReduceOp op = ReduceOp::Sum) {
    static_assert(DTypeOf<T>::value != DType::Bytes, "no reductions over bytes");
    trace::Scope probe(*this, "allReduce", kCollective, count * sizeof(T));
    allReduceRaw(in, out, count, DTypeOf<T>::value, op);
  }
  template <class T> void allReduce(T* data, size_t count, ReduceOp op = ReduceOp::Sum) {
    allReduce<T>(data, data, count, op);
  }
  /// in: size()*countPerRank elements; out (countPerRank) = op over ranks of in's chunk rank().
  template <class T>
  void reduceScatter(const T* in, T* out, size_t countPerRank, ReduceOp op = ReduceOp::Sum) {
    static_assert(DTypeOf<T>::value != DType::Bytes, "no reductions over bytes");
    trace::Scope probe(*this, "reduceScatter", kCollective, countPerRank * sizeof(T));
    reduceScatterRaw(in, out, countPerRank, DTypeOf<T>::value, op);
  }
  /// out (size()*countPerRank): chunk i is rank i's `in` (countPerRank elements).
  template <class T> void allGather(const T* in, T* out, size_t countPerRank) {
    trace::Scope probe(*this, "allGather", kCollective, countPerRank * sizeof(T));
    allGatherRaw(in, out, countPerRank, DTypeOf<T>::value);
  }
  /// in and out: size()*countPerRank elements; out's chunk i is rank i's in chunk rank().
  template <class T> void allToAll(const T* in, T* out, size_t countPerRank) {
    trace::Scope probe(*this, "allToAll", kCollective, countPerRank * sizeof(T));
    allToAllRaw(in, out, countPerRank, DTypeOf<T>::value);
  }
  /// Point-to-point exchange in one step (halo exchange, collective permute): this rank sends
  /// its `in` to group rank `sendTo` and receives group rank `recvFrom`'s `in` into `out`
  /// (`count` elements each). kNoPeer sends nothing / fills `out` with zeros. The pairs must
  /// agree across the group (rank a sends to b iff b receives from a): checked.
  template <class T> void permute(const T* in, T* out, size_t count, int sendTo, int recvFrom) {
    trace::Scope probe(*this, "permute", kCollective, count * sizeof(T));
    permuteRaw(in, out, count, DTypeOf<T>::value, sendTo, recvFrom);
  }
  /// permute with sendTo = rank()+offset and recvFrom = rank()-offset: modulo size() for Wrap;
  /// for Zero, ranks without a peer in [0, size()) receive zeros.
  template <class T>
  void shift(const T* in, T* out, size_t count, int offset, Boundary boundary = Boundary::Wrap) {
    auto [sendTo, recvFrom] = shiftPeers(offset, boundary);
    permute(in, out, count, sendTo, recvFrom);
  }
  /// Copies group rank `root`'s `data` into every rank's `data`.
  template <class T> void broadcast(T* data, size_t count, int root) {
    trace::Scope probe(*this, "broadcast", kCollective, count * sizeof(T));
    broadcastRaw(data, count, DTypeOf<T>::value, root);
  }
  /// Returns once every rank of the group has called it.
  virtual void barrier() = 0;

  // --- Started (non-blocking) collectives -----------------------------------------------------
  // start... begins the collective and returns at once; the buffers belong to it (unread and
  // unwritten by the caller, alive) until wait(request) returns. Every rank of the group starts
  // the same collectives in the same order, interleaved the same way with its blocking calls;
  // a disagreement is a CommError at wait (or earlier) on every rank, a rank that never starts
  // one is a timeout at the waiters. Requests on one communicator complete in the order they were
  // started: waiting for one completes those started before it. A blocking collective first
  // completes the started collectives in flight on its communicator (and what was started before
  // them: sends and recvs started after the last one stay in flight). On the NCCL backend wait()
  // orders the rank's stream after the collective instead of blocking the host (see Nccl.h).

  /// allReduce, started: `count` elements, in == out for in place.
  template <class T>
  Request startAllReduce(const T* in, T* out, size_t count, ReduceOp op = ReduceOp::Sum) {
    static_assert(DTypeOf<T>::value != DType::Bytes, "no reductions over bytes");
    trace::Scope probe(*this, "startAllReduce", kCollective, count * sizeof(T));
    return startAllReduceRaw(in, out, count, DTypeOf<T>::value, op);
  }
  template <class T> Request startAllReduce(T* data, size_t count, ReduceOp op = ReduceOp::Sum) {
    return startAllReduce<T>(data, data, count, op);
  }
  /// A bucket: one all-reduce, in place, over the concatenation of `buffers` (distinct,
  /// non-overlapping; every rank passes the same number of buffers with the same counts).
  template <class T>
  Request startAllReduce(const Segment<T>* buffers, size_t numBuffers,
                         ReduceOp op = ReduceOp::Sum) {
    static_assert(DTypeOf<T>::value != DType::Bytes, "no reductions over bytes");
    rawSegments_.resize(numBuffers);
    size_t count = 0;
    for (size_t i = 0; i < numBuffers; ++i) {
      rawSegments_[i] = {static_cast<void*>(buffers[i].data), buffers[i].count};
      count += buffers[i].count;
    }
    trace::Scope probe(*this, "startAllReduce", kCollective, count * sizeof(T));
    return startAllReduceRaw(rawSegments_.data(), numBuffers, DTypeOf<T>::value, op);
  }
  template <class T>
  Request startAllReduce(std::initializer_list<Segment<T>> buffers, ReduceOp op = ReduceOp::Sum) {
    return startAllReduce<T>(buffers.begin(), buffers.size(), op);
  }
  template <class T>
  Request startAllReduce(const std::vector<Segment<T>>& buffers, ReduceOp op = ReduceOp::Sum) {
    return startAllReduce<T>(buffers.data(), buffers.size(), op);
  }
  /// reduceScatter, started (buffers and in-place form as reduceScatter).
  template <class T>
  Request startReduceScatter(const T* in, T* out, size_t countPerRank,
                             ReduceOp op = ReduceOp::Sum) {
    static_assert(DTypeOf<T>::value != DType::Bytes, "no reductions over bytes");
    trace::Scope probe(*this, "startReduceScatter", kCollective, countPerRank * sizeof(T));
    return startReduceScatterRaw(in, out, countPerRank, DTypeOf<T>::value, op);
  }
  /// allGather, started (buffers and in-place form as allGather).
  template <class T> Request startAllGather(const T* in, T* out, size_t countPerRank) {
    trace::Scope probe(*this, "startAllGather", kCollective, countPerRank * sizeof(T));
    return startAllGatherRaw(in, out, countPerRank, DTypeOf<T>::value);
  }

  // --- Point-to-point -------------------------------------------------------------------------
  // send / recv move one buffer between two ranks of the group (pipeline stages: activations
  // forward, their gradients back). `peer` is a group rank other than rank(). The sends from one
  // rank to another on one communicator are received in the order they were sent (no tags); a
  // recv must name the dtype and count its matching send has (checked: a mismatch is a CommError
  // on both ranks). A blocking send may wait until the receiver has taken the data (threads: it
  // always does, the receiver copying straight from the sender's buffer), so two ranks that send
  // to each other use sendRecv, or start one side. A recv whose sender never sends fails after
  // timeout() naming both ranks. Unlike collectives, only the two ranks take part.
  // Started forms (startSend, startRecv) return a Request that completes as the started
  // collectives' do (in start order on the communicator; the buffer belongs to the call until
  // then); a blocking send or recv does not wait for the requests in flight, so that a rank can
  // start a send and then receive. On NCCL they are stream-ordered like the collectives.

  /// Sends `count` elements at `data` to group rank `peer`.
  template <class T> void send(const T* data, size_t count, int peer) {
    trace::Scope probe(*this, "send", kPointToPoint, count * sizeof(T));
    sendRaw(data, count, DTypeOf<T>::value, peer);
  }
  /// Receives `count` elements from group rank `peer` into `data`.
  template <class T> void recv(T* data, size_t count, int peer) {
    trace::Scope probe(*this, "recv", kPointToPoint, count * sizeof(T));
    recvRaw(data, count, DTypeOf<T>::value, peer);
  }
  /// send(sendData, sendCount, sendTo) and recv(recvData, recvCount, recvFrom) at once, so that
  /// neighbours exchanging with each other cannot deadlock. Either peer may be kNoPeer (that half
  /// is skipped: the first and last pipeline stages). The buffers must not overlap.
  template <class T>
  void sendRecv(const T* sendData, size_t sendCount, int sendTo, T* recvData, size_t recvCount,
                int recvFrom) {
    trace::Scope probe(*this, "sendRecv", kPointToPoint, (sendCount + recvCount) * sizeof(T));
    sendRecvRaw(sendData, sendCount, sendTo, recvData, recvCount, recvFrom, DTypeOf<T>::value);
  }
  /// send, started.
  template <class T> Request startSend(const T* data, size_t count, int peer) {
    trace::Scope probe(*this, "startSend", kPointToPoint, count * sizeof(T));
    return startSendRaw(data, count, DTypeOf<T>::value, peer);
  }
  /// recv, started.
  template <class T> Request startRecv(T* data, size_t count, int peer) {
    trace::Scope probe(*this, "startRecv", kPointToPoint, count * sizeof(T));
    return startRecvRaw(data, count, DTypeOf<T>::value, peer);
  }

  /// Completes `request` (and every request started before it on this communicator). Throws
  /// CommError if it failed; either way it is no longer pending. No-op when not pending; a
  /// request of another communicator is std::invalid_argument.
  void wait(Request& request);
  /// Progresses the requests in flight up to `request` without blocking; true (and no longer
  /// pending) once it has completed. Throws as wait().
  bool test(Request& request);
  /// Completes every request in flight on this communicator.
  virtual void waitAll() = 0;

  // --- Collectives (type-erased): what a backend implements -----------------------------------
  virtual void allReduceRaw(const void* in, void* out, size_t count, DType dtype, ReduceOp op) = 0;
  virtual void reduceScatterRaw(const void* in, void* out, size_t countPerRank, DType dtype,
                                ReduceOp op) = 0;
  virtual void allGatherRaw(const void* in, void* out, size_t countPerRank, DType dtype) = 0;
  virtual void allToAllRaw(const void* in, void* out, size_t countPerRank, DType dtype) = 0;
  virtual void permuteRaw(const void* in, void* out, size_t count, DType dtype, int sendTo,
                          int recvFrom) = 0;
  virtual void broadcastRaw(void* data, size_t count, DType dtype, int root) = 0;
  virtual Request startAllReduceRaw(const void* in, void* out, size_t count, DType dtype,
                                    ReduceOp op) = 0;
  virtual Request startAllReduceRaw(const Segment<void>* buffers, size_t numBuffers, DType dtype,
                                    ReduceOp op) = 0;
  virtual Request startReduceScatterRaw(const void* in, void* out, size_t countPerRank, DType dtype,
                                        ReduceOp op) = 0;
  virtual Request startAllGatherRaw(const void* in, void* out, size_t countPerRank,
                                    DType dtype) = 0;
  virtual void sendRaw(const void* data, size_t count, DType dtype, int peer) = 0;
  virtual void recvRaw(void* data, size_t count, DType dtype, int peer) = 0;
  virtual void sendRecvRaw(const void* sendData, size_t sendCount, int sendTo, void* recvData,
                           size_t recvCount, int recvFrom, DType dtype) = 0;
  virtual Request startSendRaw(const void* data, size_t count, DType dtype, int peer) = 0;
  virtual Request startRecvRaw(void* data, size_t count, DType dtype, int peer) = 0;

  /// The (sendTo, recvFrom) pair of shift(offset, boundary) on this rank.
  std::pair<int, int> shiftPeers(int offset, Boundary boundary) const;

protected:
  /// What a backend implements for wait() / test(): complete (or progress without blocking)
  /// the requests up to `ticket` in start order. test: true once `ticket` has completed.
  virtual void waitRaw(uint64_t ticket) = 0;
  virtual bool testRaw(uint64_t ticket) = 0;
  /// Every request with a ticket up to this one has completed (or failed).
  virtual uint64_t completedThrough() const = 0;
  /// A pending request of this communicator; a collective that completed at its start returns
  /// Request() (not pending).
  Request pendingRequest(uint64_t ticket) { return Request(*this, ticket); }

private:
  friend class Request;
  std::vector<Segment<void>> rawSegments_; // the typed bucket form's buffers, reused
};

} // namespace meshrt
