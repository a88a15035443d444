// meshrt's NCCL backend: one GPU per rank, collectives on device pointers, enqueued on the
// rank's CUDA stream (the stream generated CUDA code computes on, so that kernels and
// collectives are ordered without host synchronization). Host pointers are accepted too (the
// runners' timings, checkpoints' string exchanges): staged through a device scratch buffer.
//
// Bootstrap: runNccl() runs every rank of a mesh as a thread of this process, rank r on GPU
// r % deviceCount (the ncclUniqueId is shared in-process); createNcclWorld() is the building
// block for other launchers (e.g. one process per GPU across hosts, the id broadcast through
// MPI by ncclWorldFromMpi when meshrt_nccl is built with MPI).
//
// Subgroups are ncclCommSplit of the world (color: the coordinates off the group's axes; key:
// the row-major rank over the group's axes), created collectively in the order the ranks ask.
// Every NCCL and CUDA error becomes a CommError naming the collective, the world rank and the
// error string (ncclGetErrorString / cudaGetErrorString plus ncclGetLastError). Collectives are
// asynchronous (stream-ordered): an error NCCL reports later (a peer failing) surfaces at the
// next synchronizing call (barrier, or the caller's stream synchronization) as a CommError.
// A rank whose thread throws aborts the world communicator (ncclCommAbort) so that the other
// ranks' pending collectives fail instead of hanging.
//
// Started collectives (startAllReduce, ...) run on the rank's communication stream
// (commStream(), shared by the world and its subgroups, so that they run in start order):
// the start makes it wait for what stream() has enqueued so far (the inputs' producers),
// enqueues the NCCL call and records an event after it. wait() makes stream() wait for that
// event (cudaStreamWaitEvent) and returns at once: kernels enqueued after it see the result,
// and the host is never blocked. test() asks the event (cudaEventQuery). A blocking collective
// first orders stream() after the requests in flight on its communicator. A failure or a peer
// that never starts the collective surfaces at the next synchronize() (barrier, the end of
// runNccl), as for blocking calls. Host buffers are staged: their started collectives complete
// (synchronously) at the start.
#pragma once

#include "meshrt/Comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace meshrt::nccl {

/// Throws CommError(collective, worldRank, "<what>: <CUDA error string>") unless `status` is
/// cudaSuccess.
void checkCuda(cudaError_t status, const char* collective, int worldRank, const char* what);
/// The same for an NCCL result (with ncclGetLastError's detail when there is one).
void checkNccl(ncclResult_t status, ncclComm_t comm, const char* collective, int worldRank,
               const char* what);

/// A communicator over an NCCL communicator. Buffers on device() (device or managed memory)
/// are used as they are: the collectives are enqueued on stream() and return without waiting
/// (barrier() waits). Host buffers (pageable or pinned, told apart by cudaPointerGetAttributes)
/// work too: every collective copies them into a device scratch buffer of this communicator on
/// stream(), runs, copies the results back and waits for the stream, so they are ready (and
/// reusable) when the call returns. Staged in-place calls (in == out, or one rank's chunk of the
/// other) stay in place. The scratch buffer grows to the largest staged call and is kept.
class NcclCommunicator : public Communicator {
public:
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  const Mesh& mesh() const override { return mesh_; }
  const Mesh& worldMesh() const override { return world_ ? world_->mesh_ : mesh_; }
  int worldRank() const override { return worldRank_; }
  int worldRankOf(int groupRank) const override;
  std::chrono::milliseconds timeout() const override { return timeout_; }
  const char* backend() const override { return "nccl"; }
  Communicator& subgroup(const std::vector<std::string>& axes) override;

  void barrier() override;
  void allReduceRaw(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override;
  void reduceScatterRaw(const void* in, void* out, size_t countPerRank, DType dtype,
                        ReduceOp op) override;
  void allGatherRaw(const void* in, void* out, size_t countPerRank, DType dtype) override;
  void allToAllRaw(const void* in, void* out, size_t countPerRank, DType dtype) override;
  void permuteRaw(const void* in, void* out, size_t count, DType dtype, int sendTo,
                  int recvFrom) override;
  void broadcastRaw(void* data, size_t count, DType dtype, int root) override;
  Request startAllReduceRaw(const void* in, void* out, size_t count, DType dtype,
                            ReduceOp op) override;
  Request startAllReduceRaw(const Segment<void>* buffers, size_t numBuffers, DType dtype,
                            ReduceOp op) override;
  Request startReduceScatterRaw(const void* in, void* out, size_t countPerRank, DType dtype,
                                ReduceOp op) override;
  Request startAllGatherRaw(const void* in, void* out, size_t countPerRank, DType dtype) override;
  /// ncclSend / ncclRecv (in one NCCL group for sendRecv) on stream(); the started forms on
  /// commStream(), as the started collectives. NCCL carries no header: the count and dtype of a
  /// send and its recv are not checked against each other here (the CPU backends check them).
  void sendRaw(const void* data, size_t count, DType dtype, int peer) override;
  void recvRaw(void* data, size_t count, DType dtype, int peer) override;
  void sendRecvRaw(const void* sendData, size_t sendCount, int sendTo, void* recvData,
                   size_t recvCount, int recvFrom, DType dtype) override;
  Request startSendRaw(const void* data, size_t count, DType dtype, int peer) override;
  Request startRecvRaw(void* data, size_t count, DType dtype, int peer) override;
  void waitAll() override;

  /// The CUDA device and stream of this rank (shared by the world and its subgroups).
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  /// The stream started collectives run on (shared by the world and its subgroups).
  cudaStream_t commStream() const { return commStream_; }
  ncclComm_t comm() const { return comm_; }
  /// Waits for everything enqueued on stream(), turning an asynchronous NCCL or CUDA error into
  /// a CommError naming `collective`.
  void synchronize(const char* collective);
  /// Aborts the NCCL communicators of this rank (the world and its subgroups): the peers'
  /// pending collectives fail instead of hanging. Used when this rank's program throws.
  void abort();

  /// The world communicator of `rank` over `mesh`, from an id every rank shares (one rank made
  /// it with ncclGetUniqueId). Collective over the world's ranks. Sets the current CUDA device.
  static std::unique_ptr<NcclCommunicator> createWorld(const Mesh& mesh, int rank,
                                                       const ncclUniqueId& id, int device,
                                                       std::chrono::milliseconds timeout);

protected:
  void waitRaw(uint64_t ticket) override;
  bool testRaw(uint64_t ticket) override;
  uint64_t completedThrough() const override { return completed_; }

private:
  NcclCommunicator() = default;
  /// A started collective in flight: the event recorded on commStream() after it.
  struct Started {
    uint64_t ticket;
    cudaEvent_t done;
  };
  /// Enqueues `enqueue` (NCCL calls on commStream()) after stream()'s work so far, and returns
  /// the request that completes with it.
  Request startOnCommStream(const char* collective, const std::function<void()>& enqueue);
  /// Blocking collectives: stream() waits for the requests in flight on this communicator.
  void orderAfterStarted();
  /// The world rank's group ranks along `axes` and the split color/key of this rank.
  void enter(const char* collective);
  ncclDataType_t ncclType(DType dtype, const char* collective) const;
  /// Calls `enqueue(deviceIn, deviceOut)` (which enqueues the NCCL calls on stream()) with `in`
  /// and `out` as device addresses: device buffers as they are (returns without waiting); host
  /// buffers staged through scratch_ (copied in, copied out, stream synchronized). Every
  /// collective goes through here.
  /// `afterStarted`: first order stream() after the started requests (collectives do; sends and
  /// recvs do not, or a started send would hold back the recv its peer's send waits for).
  void onDevice(const char* collective, const void* in, size_t inBytes, void* out, size_t outBytes,
                const std::function<void(const void* deviceIn, void* deviceOut)>& enqueue,
                bool afterStarted = true);
  size_t bytesOf(size_t count, DType dtype) const { return count * dtypeSize(dtype); }
  /// Throws CommError unless `peer` is kNoPeer (when `optional`) or another rank of the group.
  void checkPeer(const char* collective, int peer, bool optional) const;
  /// Enqueues the NCCL calls of a send to `sendTo` and/or a recv from `recvFrom` on `stream`.
  void enqueuePointToPoint(const char* collective, const void* sendData, size_t sendCount,
                           int sendTo, void* recvData, size_t recvCount, int recvFrom, DType dtype,
                           cudaStream_t stream);

  Mesh mesh_;
  int rank_ = 0, worldRank_ = 0, device_ = 0;
  std::vector<int> worldRanks_; // group rank -> world rank
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t commStream_ = nullptr; // started collectives (owned by the world)
  bool ownsStream_ = false;
  std::vector<Started> started_; // in flight, oldest first
  std::vector<cudaEvent_t> freeEvents_;
  uint64_t nextTicket_ = 0, completed_ = 0;
  std::chrono::milliseconds timeout_{60000};
  NcclCommunicator* world_ = nullptr; // null for the world itself
  std::map<std::vector<std::string>, std::unique_ptr<NcclCommunicator>> subgroups_;
  void* barrierWord_ = nullptr; // one device int for barrier()'s all-reduce
  void* scratch_ = nullptr;     // device staging for host buffers (onDevice)
  size_t scratchBytes_ = 0;
};

/// How the ranks of launch() run: every rank a thread of this process (one GPU each), or one
/// process per GPU started by mpirun, on one host or several (NCCL bootstrapped over MPI:
/// worldFromMpi in meshrt/NcclMpi.h; needs meshrt_nccl built with MPI).
enum class NcclLaunch { Threads, Mpi };

struct NcclOptions {
  /// The GPUs to use, rank r on devices[r % devices.size()]; empty: every visible device. Under
  /// MPI each process takes GPU (its rank among its host's processes) % (the host's GPUs).
  std::vector<int> devices;
  std::chrono::milliseconds timeout = defaultTimeout();
  /// MESHRT_NCCL_LAUNCH (threads|mpi) if set, else Mpi when this process was started by mpirun
  /// (OMPI_COMM_WORLD_SIZE or PMI_SIZE in the environment), else Threads.
  NcclLaunch launch = defaultLaunch();

  static NcclLaunch defaultLaunch();
  /// The defaults, then `--launch threads|mpi` (or `--launch=...`) from the command line, which
  /// it removes from argv. Throws std::invalid_argument on another value.
  static NcclOptions fromArgs(int& argc, char** argv);
};

/// Whether this meshrt_nccl can launch through MPI (it was built with MPI).
bool mpiLaunchBuilt();

/// Runs `program` on every rank of `mesh`, one thread per rank, each with its world
/// NcclCommunicator (its CUDA device current). Rethrows the first rank's exception after every
/// rank has finished (a failing rank aborts the communicators, so the others fail too).
void runNccl(const Mesh& mesh, const std::function<void(Communicator&)>& program,
             const NcclOptions& options = {});

/// The generated CUDA runner's entry, shaped like meshrt::launch. Threads: runs every rank in
/// this process (runNccl; returns true). Mpi: runs this process's rank (the MPI world's size must
/// be mesh.size()) on its GPU and returns whether it is world rank 0, the one that reports; a
/// rank that fails prints its error and ends the job with MPI_Abort (exit status 1), since MPI
/// cannot withdraw its peers from the collectives they wait in (a world of one rethrows).
bool launch(const Mesh& mesh, const NcclOptions& options,
            const std::function<void(Communicator&)>& program);

/// The number of visible CUDA devices (0 when there is none or no driver).
int deviceCount();

/// Where a collective's staged host buffers go in the communicator's device scratch buffer
/// (NcclCommunicator stages host memory; exposed so the layout is tested without a GPU).
constexpr size_t kStagingAlignment = 256; // of the out buffer after a separate in buffer
struct StagingLayout {
  size_t inOffset = 0, outOffset = 0; // of the staged in / out buffer in the scratch buffer
  size_t bytes = 0;                   // the scratch bytes needed
};
/// The staged buffers of in (inBytes, when stageIn) and out (outBytes, when stageOut): both
/// staged and overlapping (in place: in == out, or one rank's chunk of the other) share one
/// region at their relative offsets, so NCCL still sees the call in place; otherwise in comes
/// first and out after it, at a kStagingAlignment boundary.
StagingLayout stagingLayout(const void* in, size_t inBytes, bool stageIn, const void* out,
                            size_t outBytes, bool stageOut);

} // namespace meshrt::nccl
