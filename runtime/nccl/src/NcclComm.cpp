// The NCCL backend (meshrt/Nccl.h): world and subgroup communicators over ncclComm_t, the
// collectives on the rank's stream, and the in-process launcher (one thread per GPU).
#include "meshrt/Nccl.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>

namespace meshrt::nccl {

void checkCuda(cudaError_t status, const char* collective, int worldRank, const char* what) {
  if (status == cudaSuccess) return;
  throw CommError(collective, worldRank,
                  std::string("nccl backend, rank ") + std::to_string(worldRank) + ", " +
                      (*collective ? collective : "setup") + ": " + what + ": " +
                      cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

void checkNccl(ncclResult_t status, ncclComm_t comm, const char* collective, int worldRank,
               const char* what) {
  if (status == ncclSuccess) return;
  std::string detail = ncclGetErrorString(status);
  if (const char* last = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr); last && *last)
    detail += " (" + std::string(last) + ")";
  throw CommError(collective, worldRank,
                  std::string("nccl backend, rank ") + std::to_string(worldRank) + ", " +
                      (*collective ? collective : "setup") + ": " + what + ": " + detail);
}

namespace {

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
    return ncclSum;
  case ReduceOp::Max:
    return ncclMax;
  case ReduceOp::Min:
    return ncclMin;
  }
  return ncclSum;
}

bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return aBytes && bBytes && x < y + bBytes && y < x + aBytes;
}

/// Whether NCCL cannot use `pointer` directly: pageable (unregistered) or pinned host memory.
/// Device and managed memory are used as they are.
bool isHostMemory(const void* pointer) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError(); // older runtimes reject unregistered host pointers: host memory
    return true;
  }
  return attributes.type == cudaMemoryTypeUnregistered || attributes.type == cudaMemoryTypeHost;
}

} // namespace

StagingLayout stagingLayout(const void* in, size_t inBytes, bool stageIn, const void* out,
                            size_t outBytes, bool stageOut) {
  StagingLayout layout;
  if (stageIn && stageOut && overlaps(in, inBytes, out, outBytes)) {
    // In place: one region over both, at the same relative offsets.
    auto inAt = reinterpret_cast<uintptr_t>(in), outAt = reinterpret_cast<uintptr_t>(out);
    uintptr_t base = std::min(inAt, outAt);
    layout.inOffset = size_t(inAt - base);
    layout.outOffset = size_t(outAt - base);
    layout.bytes = std::max(layout.inOffset + inBytes, layout.outOffset + outBytes);
    return layout;
  }
  if (stageIn)
    layout.bytes = (inBytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
  if (stageOut) {
    layout.outOffset = layout.bytes;
    layout.bytes += outBytes;
  }
  return layout;
}

NcclCommunicator::~NcclCommunicator() {
  try {
    waitAll();
  } catch (...) {
    // Going away: the stream's error surfaces nowhere else.
  }
  for (cudaEvent_t event : freeEvents_)
    cudaEventDestroy(event);
  // Subgroups first: they were split from this communicator.
  subgroups_.clear();
  if (comm_) ncclCommDestroy(comm_);
  if (barrierWord_) cudaFree(barrierWord_);
  if (scratch_) cudaFree(scratch_);
  if (ownsStream_ && stream_) cudaStreamDestroy(stream_);
  if (ownsStream_ && commStream_) cudaStreamDestroy(commStream_);
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::createWorld(const Mesh& mesh, int rank,
                                                                const ncclUniqueId& id, int device,
                                                                std::chrono::milliseconds timeout) {
  std::unique_ptr<NcclCommunicator> world(new NcclCommunicator());
  world->mesh_ = mesh;
  world->rank_ = world->worldRank_ = rank;
  world->device_ = device;
  world->timeout_ = timeout;
  for (int r = 0; r < mesh.size(); ++r)
    world->worldRanks_.push_back(r);
  checkCuda(cudaSetDevice(device), "", rank, "cudaSetDevice");
  checkCuda(cudaStreamCreateWithFlags(&world->stream_, cudaStreamNonBlocking), "", rank,
            "cudaStreamCreate");
  checkCuda(cudaStreamCreateWithFlags(&world->commStream_, cudaStreamNonBlocking), "", rank,
            "cudaStreamCreate (communication)");
  world->ownsStream_ = true;
  checkCuda(cudaMalloc(&world->barrierWord_, sizeof(int32_t)), "", rank, "cudaMalloc");
  checkCuda(cudaMemset(world->barrierWord_, 0, sizeof(int32_t)), "", rank, "cudaMemset");
  checkNccl(ncclCommInitRank(&world->comm_, mesh.size(), id, rank), nullptr, "", rank,
            "ncclCommInitRank");
  return world;
}

int NcclCommunicator::worldRankOf(int groupRank) const {
  if (groupRank < 0 || groupRank >= int(worldRanks_.size()))
    throw std::out_of_range("worldRankOf: group rank " + std::to_string(groupRank) +
                            " outside a group of " + std::to_string(worldRanks_.size()));
  return worldRanks_[size_t(groupRank)];
}

Communicator& NcclCommunicator::subgroup(const std::vector<std::string>& axes) {
  std::vector<std::string> meshOrder;
  for (const MeshAxis& axis : mesh_.axes())
    meshOrder.push_back(axis.name);
  if (axes == meshOrder) return *this;
  auto cached = subgroups_.find(axes);
  if (cached != subgroups_.end()) return *cached->second;
  std::vector<MeshAxis> groupAxes;
  std::vector<int> positions;
  for (const std::string& name : axes) {
    int position = mesh_.axisIndex(name);
    if (position < 0)
      throw std::invalid_argument("subgroup: no axis '" + name + "' in " + mesh_.str());
    if (std::count(axes.begin(), axes.end(), name) > 1)
      throw std::invalid_argument("subgroup: axis '" + name + "' repeated");
    positions.push_back(position);
    groupAxes.push_back(mesh_.axes()[size_t(position)]);
  }
  // color: row-major over the other axes; key: row-major over `axes` in the given order.
  std::vector<int> coords = mesh_.coords(rank_);
  int color = 0, key = 0;
  for (int a = 0; a < mesh_.numAxes(); ++a)
    if (std::find(positions.begin(), positions.end(), a) == positions.end())
      color = color * mesh_.axes()[size_t(a)].size + coords[size_t(a)];
  for (int position : positions)
    key = key * mesh_.axes()[size_t(position)].size + coords[size_t(position)];

  std::unique_ptr<NcclCommunicator> group(new NcclCommunicator());
  group->mesh_ = Mesh(groupAxes);
  group->rank_ = key;
  group->worldRank_ = worldRank_;
  group->device_ = device_;
  group->stream_ = stream_;
  group->commStream_ = commStream_;
  group->timeout_ = timeout_;
  group->world_ = world_ ? world_ : this;
  group->barrierWord_ = nullptr;
  for (int g = 0; g < group->mesh_.size(); ++g) {
    std::vector<int> groupCoords = group->mesh_.coords(g), member = coords;
    for (size_t i = 0; i < positions.size(); ++i)
      member[size_t(positions[i])] = groupCoords[i];
    group->worldRanks_.push_back(worldRankOf(mesh_.rank(member)));
  }
  enter("subgroup");
  checkCuda(cudaMalloc(&group->barrierWord_, sizeof(int32_t)), "subgroup", worldRank_,
            "cudaMalloc");
  checkCuda(cudaMemset(group->barrierWord_, 0, sizeof(int32_t)), "subgroup", worldRank_,
            "cudaMemset");
  checkNccl(ncclCommSplit(comm_, color, key, &group->comm_, nullptr), comm_, "subgroup", worldRank_,
            "ncclCommSplit");
  NcclCommunicator& result = *group;
  subgroups_.emplace(axes, std::move(group));
  return result;
}

void NcclCommunicator::enter(const char* collective) {
  checkCuda(cudaSetDevice(device_), collective, worldRank_, "cudaSetDevice");
}

ncclDataType_t NcclCommunicator::ncclType(DType dtype, const char* collective) const {
  switch (dtype) {
  case DType::F32:
    return ncclFloat32;
  case DType::F64:
    return ncclFloat64;
  case DType::I32:
    return ncclInt32;
  case DType::Bytes:
    return ncclUint8;
  }
  throw CommError(collective, worldRank_, "nccl backend: unknown dtype");
}

void NcclCommunicator::synchronize(const char* collective) {
  enter(collective);
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    cudaError_t status = cudaStreamQuery(stream_);
    if (status == cudaSuccess) break;
    if (status != cudaErrorNotReady) checkCuda(status, collective, worldRank_, "cudaStreamQuery");
    ncclResult_t async = ncclSuccess;
    checkNccl(ncclCommGetAsyncError(comm_, &async), comm_, collective, worldRank_,
              "ncclCommGetAsyncError");
    checkNccl(async, comm_, collective, worldRank_, "asynchronous error");
    if (std::chrono::steady_clock::now() > deadline) {
      abort();
      throw CommError(collective, worldRank_,
                      "nccl backend, rank " + std::to_string(worldRank_) + ", " + collective +
                          ": no completion within " + std::to_string(timeout_.count()) +
                          " ms (a peer failed or did not arrive); communicators aborted");
    }
    std::this_thread::yield();
  }
}

void NcclCommunicator::abort() {
  for (auto& [axes, group] : subgroups_)
    group->abort();
  if (comm_) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

void NcclCommunicator::onDevice(const char* collective, const void* in, size_t inBytes, void* out,
                                size_t outBytes,
                                const std::function<void(const void*, void*)>& enqueue,
                                bool afterStarted) {
  if (afterStarted) orderAfterStarted();
  bool hostIn = inBytes && isHostMemory(in), hostOut = outBytes && isHostMemory(out);
  if (!hostIn && !hostOut) {
    enqueue(in, out);
    return;
  }
  StagingLayout layout = stagingLayout(in, inBytes, hostIn, out, outBytes, hostOut);
  if (layout.bytes > scratchBytes_) {
    if (scratch_) checkCuda(cudaFree(scratch_), collective, worldRank_, "cudaFree (staging)");
    scratch_ = nullptr;
    scratchBytes_ = 0;
    checkCuda(cudaMalloc(&scratch_, layout.bytes), collective, worldRank_, "cudaMalloc (staging)");
    scratchBytes_ = layout.bytes;
  }
  char* deviceInAt = static_cast<char*>(scratch_) + layout.inOffset;
  char* deviceOutAt = static_cast<char*>(scratch_) + layout.outOffset;
  if (hostIn)
    checkCuda(cudaMemcpyAsync(deviceInAt, in, inBytes, cudaMemcpyHostToDevice, stream_), collective,
              worldRank_, "cudaMemcpyAsync (staging in)");
  enqueue(hostIn ? deviceInAt : in, hostOut ? deviceOutAt : out);
  if (hostOut)
    checkCuda(cudaMemcpyAsync(out, deviceOutAt, outBytes, cudaMemcpyDeviceToHost, stream_),
              collective, worldRank_, "cudaMemcpyAsync (staging out)");
  synchronize(collective);
}

void NcclCommunicator::barrier() {
  enter("barrier");
  orderAfterStarted();
  checkNccl(ncclAllReduce(barrierWord_, barrierWord_, 1, ncclInt32, ncclSum, comm_, stream_), comm_,
            "barrier", worldRank_, "ncclAllReduce");
  synchronize("barrier");
}

void NcclCommunicator::allReduceRaw(const void* in, void* out, size_t count, DType dtype,
                                    ReduceOp op) {
  const char* name = "allReduce";
  if (in != out && overlaps(in, bytesOf(count, dtype), out, bytesOf(count, dtype)))
    throw CommError(name, worldRank_, "allReduce: in and out overlap (in place needs in == out)");
  enter(name);
  size_t bytes = bytesOf(count, dtype);
  onDevice(name, in, bytes, out, bytes, [&](const void* deviceIn, void* deviceOut) {
    checkNccl(ncclAllReduce(deviceIn, deviceOut, count, ncclType(dtype, name), ncclOp(op), comm_,
                            stream_),
              comm_, name, worldRank_, "ncclAllReduce");
  });
}

void NcclCommunicator::reduceScatterRaw(const void* in, void* out, size_t countPerRank, DType dtype,
                                        ReduceOp op) {
  const char* name = "reduceScatter";
  size_t chunk = bytesOf(countPerRank, dtype);
  const void* inPlace = static_cast<const char*>(in) + size_t(rank_) * chunk;
  if (out != inPlace && overlaps(in, chunk * size_t(size()), out, chunk))
    throw CommError(name, worldRank_, "reduceScatter: in and out overlap other than in place");
  enter(name);
  onDevice(name, in, chunk * size_t(size()), out, chunk,
           [&](const void* deviceIn, void* deviceOut) {
             checkNccl(ncclReduceScatter(deviceIn, deviceOut, countPerRank, ncclType(dtype, name),
                                         ncclOp(op), comm_, stream_),
                       comm_, name, worldRank_, "ncclReduceScatter");
           });
}

void NcclCommunicator::allGatherRaw(const void* in, void* out, size_t countPerRank, DType dtype) {
  const char* name = "allGather";
  size_t chunk = bytesOf(countPerRank, dtype);
  const void* inPlace = static_cast<const char*>(out) + size_t(rank_) * chunk;
  if (in != inPlace && overlaps(in, chunk, out, chunk * size_t(size())))
    throw CommError(name, worldRank_, "allGather: in and out overlap other than in place");
  enter(name);
  onDevice(name, in, chunk, out, chunk * size_t(size()),
           [&](const void* deviceIn, void* deviceOut) {
             checkNccl(ncclAllGather(deviceIn, deviceOut, countPerRank, ncclType(dtype, name),
                                     comm_, stream_),
                       comm_, name, worldRank_, "ncclAllGather");
           });
}

void NcclCommunicator::allToAllRaw(const void* in, void* out, size_t countPerRank, DType dtype) {
  const char* name = "allToAll";
  size_t chunk = bytesOf(countPerRank, dtype);
  if (overlaps(in, chunk * size_t(size()), out, chunk * size_t(size())))
    throw CommError(name, worldRank_, "allToAll: in and out overlap");
  enter(name);
  ncclDataType_t type = ncclType(dtype, name);
  onDevice(name, in, chunk * size_t(size()), out, chunk * size_t(size()),
           [&](const void* deviceIn, void* deviceOut) {
             checkNccl(ncclGroupStart(), comm_, name, worldRank_, "ncclGroupStart");
             for (int peer = 0; peer < size(); ++peer) {
               checkNccl(ncclSend(static_cast<const char*>(deviceIn) + size_t(peer) * chunk,
                                  countPerRank, type, peer, comm_, stream_),
                         comm_, name, worldRank_, "ncclSend");
               checkNccl(ncclRecv(static_cast<char*>(deviceOut) + size_t(peer) * chunk,
                                  countPerRank, type, peer, comm_, stream_),
                         comm_, name, worldRank_, "ncclRecv");
             }
             checkNccl(ncclGroupEnd(), comm_, name, worldRank_, "ncclGroupEnd");
           });
}

void NcclCommunicator::permuteRaw(const void* in, void* out, size_t count, DType dtype, int sendTo,
                                  int recvFrom) {
  const char* name = "permute";
  if (overlaps(in, bytesOf(count, dtype), out, bytesOf(count, dtype)))
    throw CommError(name, worldRank_, "permute: in and out overlap");
  for (int peer : {sendTo, recvFrom})
    if (peer != kNoPeer && (peer < 0 || peer >= size()))
      throw CommError(name, worldRank_,
                      "permute: peer " + std::to_string(peer) + " outside a group of " +
                          std::to_string(size()));
  // The pairs must agree (a sends to b iff b receives from a): every rank's pair, gathered
  // (host buffers: staged, so synchronized before the check).
  std::vector<int32_t> pairs(2 * size_t(size()));
  int32_t mine[2] = {sendTo, recvFrom};
  enter(name);
  onDevice(name, mine, sizeof mine, pairs.data(), pairs.size() * sizeof(int32_t),
           [&](const void* deviceIn, void* deviceOut) {
             checkNccl(ncclAllGather(deviceIn, deviceOut, 2, ncclInt32, comm_, stream_), comm_,
                       name, worldRank_, "ncclAllGather of the peers");
           });
  for (int a = 0; a < size(); ++a) {
    int to = pairs[2 * size_t(a)];
    if (to != kNoPeer && pairs[2 * size_t(to) + 1] != a)
      throw CommError(name, worldRank_,
                      "permute: group rank " + std::to_string(a) + " sends to " +
                          std::to_string(to) + " but that rank receives from " +
                          std::to_string(pairs[2 * size_t(to) + 1]));
  }
  ncclDataType_t type = ncclType(dtype, name);
  size_t bytes = bytesOf(count, dtype);
  onDevice(name, in, bytes, out, bytes, [&](const void* deviceIn, void* deviceOut) {
    checkNccl(ncclGroupStart(), comm_, name, worldRank_, "ncclGroupStart");
    if (sendTo != kNoPeer)
      checkNccl(ncclSend(deviceIn, count, type, sendTo, comm_, stream_), comm_, name, worldRank_,
                "ncclSend");
    if (recvFrom != kNoPeer)
      checkNccl(ncclRecv(deviceOut, count, type, recvFrom, comm_, stream_), comm_, name, worldRank_,
                "ncclRecv");
    checkNccl(ncclGroupEnd(), comm_, name, worldRank_, "ncclGroupEnd");
    if (recvFrom == kNoPeer)
      checkCuda(cudaMemsetAsync(deviceOut, 0, bytes, stream_), name, worldRank_, "cudaMemsetAsync");
  });
}

void NcclCommunicator::broadcastRaw(void* data, size_t count, DType dtype, int root) {
  const char* name = "broadcast";
  if (root < 0 || root >= size())
    throw CommError(name, worldRank_,
                    "broadcast: root " + std::to_string(root) + " outside a group of " +
                        std::to_string(size()));
  enter(name);
  size_t bytes = bytesOf(count, dtype);
  onDevice(name, data, bytes, data, bytes, [&](const void* deviceIn, void* deviceOut) {
    checkNccl(
        ncclBroadcast(deviceIn, deviceOut, count, ncclType(dtype, name), root, comm_, stream_),
        comm_, name, worldRank_, "ncclBroadcast");
  });
}

// --- Started collectives -------------------------------------------------------------------------

void NcclCommunicator::orderAfterStarted() {
  if (!started_.empty()) waitAll();
}

Request NcclCommunicator::startOnCommStream(const char* collective,
                                            const std::function<void()>& enqueue) {
  enter(collective);
  cudaEvent_t ready = nullptr, done = nullptr;
  for (cudaEvent_t* event : {&ready, &done}) {
    if (!freeEvents_.empty()) {
      *event = freeEvents_.back();
      freeEvents_.pop_back();
    } else {
      checkCuda(cudaEventCreateWithFlags(event, cudaEventDisableTiming), collective, worldRank_,
                "cudaEventCreate");
    }
  }
  // The inputs are ready once what stream() holds so far has run.
  checkCuda(cudaEventRecord(ready, stream_), collective, worldRank_, "cudaEventRecord");
  checkCuda(cudaStreamWaitEvent(commStream_, ready, 0), collective, worldRank_,
            "cudaStreamWaitEvent");
  freeEvents_.push_back(ready); // the wait has captured it: reusable
  enqueue();
  checkCuda(cudaEventRecord(done, commStream_), collective, worldRank_, "cudaEventRecord");
  started_.push_back({++nextTicket_, done});
  return pendingRequest(nextTicket_);
}

Request NcclCommunicator::startAllReduceRaw(const void* in, void* out, size_t count, DType dtype,
                                            ReduceOp op) {
  const char* name = "allReduce";
  size_t bytes = bytesOf(count, dtype);
  if (in != out && overlaps(in, bytes, out, bytes))
    throw CommError(name, worldRank_, "allReduce: in and out overlap (in place needs in == out)");
  if ((bytes && isHostMemory(in)) || (bytes && isHostMemory(out))) {
    allReduceRaw(in, out, count, dtype, op); // staged: complete on return
    return Request();
  }
  return startOnCommStream(name, [&] {
    checkNccl(ncclAllReduce(in, out, count, ncclType(dtype, name), ncclOp(op), comm_, commStream_),
              comm_, name, worldRank_, "ncclAllReduce");
  });
}

Request NcclCommunicator::startAllReduceRaw(const Segment<void>* buffers, size_t numBuffers,
                                            DType dtype, ReduceOp op) {
  const char* name = "allReduce";
  bool host = false;
  for (size_t k = 0; k < numBuffers; ++k)
    host = host || (buffers[k].count && isHostMemory(buffers[k].data));
  if (host) {
    for (size_t k = 0; k < numBuffers; ++k)
      allReduceRaw(buffers[k].data, buffers[k].data, buffers[k].count, dtype, op);
    return Request();
  }
  // One NCCL group: the bucket's all-reduces are launched together.
  return startOnCommStream(name, [&] {
    checkNccl(ncclGroupStart(), comm_, name, worldRank_, "ncclGroupStart");
    for (size_t k = 0; k < numBuffers; ++k)
      checkNccl(ncclAllReduce(buffers[k].data, buffers[k].data, buffers[k].count,
                              ncclType(dtype, name), ncclOp(op), comm_, commStream_),
                comm_, name, worldRank_, "ncclAllReduce");
    checkNccl(ncclGroupEnd(), comm_, name, worldRank_, "ncclGroupEnd");
  });
}

Request NcclCommunicator::startReduceScatterRaw(const void* in, void* out, size_t countPerRank,
                                                DType dtype, ReduceOp op) {
  const char* name = "reduceScatter";
  size_t chunk = bytesOf(countPerRank, dtype);
  const void* inPlace = static_cast<const char*>(in) + size_t(rank_) * chunk;
  if (out != inPlace && overlaps(in, chunk * size_t(size()), out, chunk))
    throw CommError(name, worldRank_, "reduceScatter: in and out overlap other than in place");
  if (chunk && (isHostMemory(in) || isHostMemory(out))) {
    reduceScatterRaw(in, out, countPerRank, dtype, op);
    return Request();
  }
  return startOnCommStream(name, [&] {
    checkNccl(ncclReduceScatter(in, out, countPerRank, ncclType(dtype, name), ncclOp(op), comm_,
                                commStream_),
              comm_, name, worldRank_, "ncclReduceScatter");
  });
}

Request NcclCommunicator::startAllGatherRaw(const void* in, void* out, size_t countPerRank,
                                            DType dtype) {
  const char* name = "allGather";
  size_t chunk = bytesOf(countPerRank, dtype);
  const void* inPlace = static_cast<const char*>(out) + size_t(rank_) * chunk;
  if (in != inPlace && overlaps(in, chunk, out, chunk * size_t(size())))
    throw CommError(name, worldRank_, "allGather: in and out overlap other than in place");
  if (chunk && (isHostMemory(in) || isHostMemory(out))) {
    allGatherRaw(in, out, countPerRank, dtype);
    return Request();
  }
  return startOnCommStream(name, [&] {
    checkNccl(ncclAllGather(in, out, countPerRank, ncclType(dtype, name), comm_, commStream_),
              comm_, name, worldRank_, "ncclAllGather");
  });
}

// --- Point-to-point ------------------------------------------------------------------------------

void NcclCommunicator::checkPeer(const char* collective, int peer, bool optional) const {
  if (optional && peer == kNoPeer) return;
  if (peer < 0 || peer >= size() || peer == rank_)
    throw CommError(collective, worldRank_,
                    std::string(collective) + ": peer " + std::to_string(peer) +
                        (peer == rank_ ? " is this rank itself"
                                       : " is outside a group of " + std::to_string(size())));
}

void NcclCommunicator::enqueuePointToPoint(const char* collective, const void* sendData,
                                           size_t sendCount, int sendTo, void* recvData,
                                           size_t recvCount, int recvFrom, DType dtype,
                                           cudaStream_t stream) {
  ncclDataType_t type = ncclType(dtype, collective);
  checkNccl(ncclGroupStart(), comm_, collective, worldRank_, "ncclGroupStart");
  if (sendTo != kNoPeer)
    checkNccl(ncclSend(sendData, sendCount, type, sendTo, comm_, stream), comm_, collective,
              worldRank_, "ncclSend");
  if (recvFrom != kNoPeer)
    checkNccl(ncclRecv(recvData, recvCount, type, recvFrom, comm_, stream), comm_, collective,
              worldRank_, "ncclRecv");
  checkNccl(ncclGroupEnd(), comm_, collective, worldRank_, "ncclGroupEnd");
}

void NcclCommunicator::sendRaw(const void* data, size_t count, DType dtype, int peer) {
  sendRecvRaw(data, count, peer, nullptr, 0, kNoPeer, dtype);
}

void NcclCommunicator::recvRaw(void* data, size_t count, DType dtype, int peer) {
  sendRecvRaw(nullptr, 0, kNoPeer, data, count, peer, dtype);
}

void NcclCommunicator::sendRecvRaw(const void* sendData, size_t sendCount, int sendTo,
                                   void* recvData, size_t recvCount, int recvFrom, DType dtype) {
  const char* name = sendTo == kNoPeer ? "recv" : recvFrom == kNoPeer ? "send" : "sendRecv";
  checkPeer(name, sendTo, true);
  checkPeer(name, recvFrom, true);
  size_t sendBytes = sendTo == kNoPeer ? 0 : bytesOf(sendCount, dtype);
  size_t recvBytes = recvFrom == kNoPeer ? 0 : bytesOf(recvCount, dtype);
  if (overlaps(sendData, sendBytes, recvData, recvBytes))
    throw CommError(name, worldRank_, std::string(name) + ": the send and receive buffers overlap");
  enter(name);
  onDevice(
      name, sendData, sendBytes, recvData, recvBytes,
      [&](const void* deviceIn, void* deviceOut) {
        enqueuePointToPoint(name, deviceIn, sendCount, sendTo, deviceOut, recvCount, recvFrom,
                            dtype, stream_);
      },
      /*afterStarted=*/false);
}

Request NcclCommunicator::startSendRaw(const void* data, size_t count, DType dtype, int peer) {
  checkPeer("send", peer, false);
  if (count && isHostMemory(data)) {
    sendRaw(data, count, dtype, peer); // staged: complete on return
    return Request();
  }
  return startOnCommStream("send", [&] {
    enqueuePointToPoint("send", data, count, peer, nullptr, 0, kNoPeer, dtype, commStream_);
  });
}

Request NcclCommunicator::startRecvRaw(void* data, size_t count, DType dtype, int peer) {
  checkPeer("recv", peer, false);
  if (count && isHostMemory(data)) {
    recvRaw(data, count, dtype, peer);
    return Request();
  }
  return startOnCommStream("recv", [&] {
    enqueuePointToPoint("recv", nullptr, 0, kNoPeer, data, count, peer, dtype, commStream_);
  });
}

void NcclCommunicator::waitRaw(uint64_t ticket) {
  // No host synchronization: stream() waits for the events of the requests up to `ticket`.
  size_t done = 0;
  for (; done < started_.size() && started_[done].ticket <= ticket; ++done) {
    checkCuda(cudaStreamWaitEvent(stream_, started_[done].done, 0), "wait", worldRank_,
              "cudaStreamWaitEvent");
    freeEvents_.push_back(started_[done].done);
    completed_ = started_[done].ticket;
  }
  started_.erase(started_.begin(), started_.begin() + std::ptrdiff_t(done));
}

bool NcclCommunicator::testRaw(uint64_t ticket) {
  for (const Started& started : started_) {
    if (started.ticket > ticket) break;
    cudaError_t status = cudaEventQuery(started.done);
    if (status == cudaErrorNotReady) {
      ncclResult_t async = ncclSuccess;
      checkNccl(ncclCommGetAsyncError(comm_, &async), comm_, "test", worldRank_,
                "ncclCommGetAsyncError");
      checkNccl(async, comm_, "test", worldRank_, "asynchronous error");
      return false;
    }
    checkCuda(status, "test", worldRank_, "cudaEventQuery");
  }
  waitRaw(ticket); // complete on the device: the stream waits are free
  return true;
}

void NcclCommunicator::waitAll() {
  waitRaw(nextTicket_);
}

int deviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError(); // clear the sticky "no device / no driver" state
    return 0;
  }
  return count;
}

void runNccl(const Mesh& mesh, const std::function<void(Communicator&)>& program,
             const NcclOptions& options) {
  std::vector<int> devices = options.devices;
  if (devices.empty())
    for (int d = 0, n = deviceCount(); d < n; ++d)
      devices.push_back(d);
  if (devices.empty()) throw CommError("", 0, "nccl backend: no CUDA device is visible");
  if (int(devices.size()) < mesh.size())
    throw CommError("", 0,
                    "nccl backend: the mesh " + mesh.str() + " needs " +
                        std::to_string(mesh.size()) + " GPUs (one per rank) but " +
                        std::to_string(devices.size()) + " are visible");
  ncclUniqueId id;
  checkNccl(ncclGetUniqueId(&id), nullptr, "", 0, "ncclGetUniqueId");
  std::mutex mutex;
  std::exception_ptr firstError;
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < mesh.size(); ++rank)
    ranks.emplace_back([&, rank] {
      std::unique_ptr<NcclCommunicator> world;
      try {
        world =
            NcclCommunicator::createWorld(mesh, rank, id, devices[size_t(rank)], options.timeout);
        program(*world);
        world->synchronize("");
      } catch (...) {
        if (world) world->abort();
        std::lock_guard<std::mutex> lock(mutex);
        if (!firstError) firstError = std::current_exception();
      }
    });
  for (std::thread& rank : ranks)
    rank.join();
  if (firstError) std::rethrow_exception(firstError);
}

} // namespace meshrt::nccl
