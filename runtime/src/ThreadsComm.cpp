// The threads backend: every rank is a thread, and a collective reads the peers' buffers in place.
//
// Each group (the world, or one subgroup) has one slot per rank where the rank publishes the
// call it is making (kind, count, dtype, op, buffer pointers) and a barrier (an arrival counter
// and a generation word the waiters sleep on with futex). A collective is: publish, barrier,
// check that every rank made the same call, then phases that copy or reduce straight from the
// peers' published buffers, separated by barriers. The last barrier keeps every buffer alive
// and unchanged until nobody reads it any more. Only the first barrier can fail (see wait()). Slots
// are double-buffered by call parity: a rank can be at most one call ahead of a peer (the next
// call's first barrier waits for it), so it never overwrites a slot a slower peer is still
// checking.
#include "meshrt/Threads.h"

#include "Reduce.h"
#include "ThreadsAsync.h"
#include "ThreadsP2p.h"
#include "ThreadsState.h"

#include <cstring>
#include <deque>
#include <optional>
#include <sstream>

namespace meshrt {
namespace {

using namespace detail;

/// memcpy that accepts null pointers when there is nothing to copy.
void copyBytes(void* to, const void* from, size_t bytes) {
  if (bytes) std::memcpy(to, from, bytes);
}

// Small allreduces reduce the whole buffer on every rank (one data phase instead of two).
constexpr size_t kSmallAllReduceBytes = 16 * 1024;

// --- The communicator ---------------------------------------------------------------------------

class ThreadsComm final : public Communicator {
public:
  /// A world communicator.
  ThreadsComm(WorldState& world, int worldRank)
      : ThreadsComm(world, worldRank, allAxes(world.mesh), nullptr) {}

  ~ThreadsComm() override {
    // The queues' waiting hooks reach this rank's other communicators and queues, which go away
    // with this one (members, subgroups): off from here on.
    closing_ = true;
    for (auto& [axes, comm] : subgroups_)
      comm->closing_ = true;
  }

  int rank() const override { return groupRank_; }
  const Mesh& mesh() const override { return group_.mesh; }
  const Mesh& worldMesh() const override { return world_.mesh; }
  int worldRank() const override { return worldRank_; }
  int worldRankOf(int groupRank) const override {
    if (groupRank < 0 || groupRank >= size())
      throw std::out_of_range("meshrt: rank " + std::to_string(groupRank) + " is not in group " +
                              group_.mesh.str());
    return group_.worldRanks[groupRank];
  }
  std::chrono::milliseconds timeout() const override { return world_.timeout; }
  const char* backend() const override { return "threads"; }

  Communicator& subgroup(const std::vector<std::string>& axes) override {
    std::vector<int> worldAxes;
    for (const std::string& name : axes) {
      int index = group_.mesh.axisIndex(name);
      if (index < 0)
        throw std::invalid_argument("meshrt: subgroup: group mesh " + group_.mesh.str() +
                                    " has no axis '" + name + "'");
      int worldAxis = axes_[index];
      if (std::find(worldAxes.begin(), worldAxes.end(), worldAxis) != worldAxes.end())
        throw std::invalid_argument("meshrt: subgroup: axis '" + name + "' named twice");
      worldAxes.push_back(worldAxis);
    }
    ThreadsComm& worldComm = worldComm_ ? *worldComm_ : *this;
    if (worldAxes == worldComm.axes_) return worldComm;
    std::unique_ptr<ThreadsComm>& cached = worldComm.subgroups_[worldAxes];
    if (!cached) cached.reset(new ThreadsComm(world_, worldRank_, worldAxes, &worldComm));
    return *cached;
  }

  void barrier() override { begin(Call{CallRecord::of(Collective::Barrier)}); }

  void allReduceRaw(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    Call call{CallRecord::of(Collective::AllReduce, dtype, op, count), in, out};
    size_t bytes = count * dtypeSize(dtype);
    checkArguments(call, in, out);
    int p = size();
    // Allocate before the collective starts: past its first barrier nothing may throw.
    std::vector<const void*>& inputs = inputs_;
    inputs.resize(p);
    bool small = bytes <= kSmallAllReduceBytes;
    if (small) scratch_.resize(bytes);
    begin(call);
    if (p == 1) {
      if (in != out) copyBytes(out, in, bytes);
      return;
    }
    if (small) {
      // Everyone reduces everything into scratch; the inputs may be overwritten once all have
      // read them.
      for (int q = 0; q < p; ++q)
        inputs[q] = peer(q).in;
      detail::reduce(dtype, op, scratch_.data(), inputs.data(), p, count, false);
      wait(call);
      copyBytes(out, scratch_.data(), bytes);
      return;
    }
    // This rank reduces its chunk from every peer's input into its own output, then writes it
    // into every peer's output. Only this rank reads or writes that chunk of any rank's buffers
    // (and it has read every input's chunk before writing any output's), so in place is safe,
    // and one barrier after the writes ends the collective: two barriers instead of a third
    // between a reduce-scatter and an allgather that reads the peers' chunks (a rank that
    // waits at a barrier hands its core to the peer when ranks share cores).
    size_t elementSize = dtypeSize(dtype);
    auto [first, last] = chunkOf(count, elementSize, p, groupRank_);
    for (int q = 0; q < p; ++q)
      inputs[q] = static_cast<const char*>(peer(q).in) + first * elementSize;
    size_t chunkBytes = (last - first) * elementSize;
    bool streaming = chunkBytes >= kStreamingBytes;
    char* mine = static_cast<char*>(out) + first * elementSize;
    detail::reduce(dtype, op, mine, inputs.data(), p, last - first, streaming);
    for (int q = 0; q < p; ++q)
      if (q != groupRank_)
        detail::copy(static_cast<char*>(peer(q).out) + first * elementSize, mine, chunkBytes,
                     streaming);
    wait(call);
  }

  void reduceScatterRaw(const void* in, void* out, size_t countPerRank, DType dtype,
                        ReduceOp op) override {
    Call call{CallRecord::of(Collective::ReduceScatter, dtype, op, countPerRank), in, out};
    int p = size();
    size_t chunkBytes = countPerRank * dtypeSize(dtype);
    checkArguments(call, in, out);
    std::vector<const void*>& inputs = inputs_;
    inputs.resize(p);
    begin(call);
    if (p == 1) {
      if (out != in) copyBytes(out, in, chunkBytes);
      return;
    }
    for (int q = 0; q < p; ++q)
      inputs[q] = static_cast<const char*>(peer(q).in) + groupRank_ * chunkBytes;
    detail::reduce(dtype, op, out, inputs.data(), p, countPerRank, chunkBytes >= kStreamingBytes);
    wait(call);
  }

  void allGatherRaw(const void* in, void* out, size_t countPerRank, DType dtype) override {
    Call call{CallRecord::of(Collective::AllGather, dtype, ReduceOp::Sum, countPerRank), in, out};
    int p = size();
    size_t chunkBytes = countPerRank * dtypeSize(dtype);
    checkArguments(call, in, out);
    char* myChunk = static_cast<char*>(out) + groupRank_ * chunkBytes;
    begin(call);
    if (in != myChunk) copyBytes(myChunk, in, chunkBytes);
    if (p == 1) return;
    for (int q = 0; q < p; ++q)
      if (q != groupRank_)
        copyBytes(static_cast<char*>(out) + q * chunkBytes, peer(q).in, chunkBytes);
    wait(call);
  }

  void allToAllRaw(const void* in, void* out, size_t countPerRank, DType dtype) override {
    Call call{CallRecord::of(Collective::AllToAll, dtype, ReduceOp::Sum, countPerRank), in, out};
    int p = size();
    size_t chunkBytes = countPerRank * dtypeSize(dtype);
    checkArguments(call, in, out);
    begin(call);
    for (int q = 0; q < p; ++q)
      copyBytes(static_cast<char*>(out) + q * chunkBytes,
                static_cast<const char*>(peer(q).in) + groupRank_ * chunkBytes, chunkBytes);
    if (p > 1) wait(call);
  }

  void permuteRaw(const void* in, void* out, size_t count, DType dtype, int sendTo,
                  int recvFrom) override {
    Call call{CallRecord::of(Collective::Permute, dtype, ReduceOp::Sum, count, 0, sendTo, recvFrom),
              in, out};
    int p = size();
    size_t bytes = count * dtypeSize(dtype);
    checkArguments(call, in, out);
    begin(call);
    std::string mismatch =
        detail::permuteMismatch(p, [&](int q) -> const CallRecord& { return peer(q); });
    if (!mismatch.empty()) throw error(call, mismatch);
    if (recvFrom == kNoPeer)
      std::fill_n(static_cast<char*>(out), bytes, 0);
    else
      copyBytes(out, peer(recvFrom).in, bytes);
    if (p > 1) wait(call);
  }

  void broadcastRaw(void* data, size_t count, DType dtype, int root) override {
    Call call{CallRecord::of(Collective::Broadcast, dtype, ReduceOp::Sum, count, root), data, data};
    checkArguments(call, data, data);
    size_t bytes = count * dtypeSize(dtype);
    begin(call);
    if (size() == 1) return;
    if (groupRank_ != root) copyBytes(data, peer(root).in, bytes);
    wait(call);
  }

  // --- Started collectives (ThreadsAsync.h) ----------------------------------------------------

  Request startAllReduceRaw(const void* in, void* out, size_t count, DType dtype,
                            ReduceOp op) override {
    Call call{CallRecord::startOf(Collective::AllReduce, dtype, op, count), in, out};
    checkArguments(call, in, out);
    Segment<void> input{const_cast<void*>(in), count}, output{out, count};
    return started(call, &input, 1, &output, 1);
  }

  Request startAllReduceRaw(const Segment<void>* buffers, size_t numBuffers, DType dtype,
                            ReduceOp op) override {
    size_t total = 0;
    for (size_t k = 0; k < numBuffers; ++k)
      total += buffers[k].count;
    Call call{CallRecord::startOf(Collective::AllReduce, dtype, op, total, numBuffers)};
    checkArguments(call, nullptr, nullptr);
    if (numBuffers && !buffers) throw error(call, "the list of buffers is null");
    for (size_t k = 0; k < numBuffers; ++k)
      checkBuffer(call, buffers[k].data, buffers[k].count * dtypeSize(dtype), "a buffer");
    return started(call, buffers, numBuffers, buffers, numBuffers);
  }

  Request startReduceScatterRaw(const void* in, void* out, size_t countPerRank, DType dtype,
                                ReduceOp op) override {
    Call call{CallRecord::startOf(Collective::ReduceScatter, dtype, op, countPerRank), in, out};
    size_t p = size_t(size());
    checkArguments(call, in, out);
    Segment<void> input{const_cast<void*>(in), countPerRank * p}, output{out, countPerRank};
    return started(call, &input, 1, &output, 1);
  }

  Request startAllGatherRaw(const void* in, void* out, size_t countPerRank, DType dtype) override {
    Call call{CallRecord::startOf(Collective::AllGather, dtype, ReduceOp::Sum, countPerRank), in,
              out};
    size_t p = size_t(size());
    checkArguments(call, in, out);
    Segment<void> input{const_cast<void*>(in), countPerRank}, output{out, countPerRank * p};
    return started(call, &input, 1, &output, 1);
  }

  // --- Point-to-point (ThreadsP2p.h) -----------------------------------------------------------

  void sendRaw(const void* data, size_t count, DType dtype, int peer) override {
    Call call{pointToPoint(Collective::Send, dtype, count, peer, kNoPeer, false), data, nullptr};
    checkPointToPoint(call, data, count, peer, nullptr, 0, kNoPeer);
    progressOthers();
    p2p_->wait(p2p_->start(call, data, nullptr));
  }

  void recvRaw(void* data, size_t count, DType dtype, int peer) override {
    Call call{pointToPoint(Collective::Recv, dtype, count, kNoPeer, peer, false), nullptr, data};
    checkPointToPoint(call, nullptr, 0, kNoPeer, data, count, peer);
    progressOthers();
    p2p_->wait(p2p_->start(call, nullptr, data));
  }

  void sendRecvRaw(const void* sendData, size_t sendCount, int sendTo, void* recvData,
                   size_t recvCount, int recvFrom, DType dtype) override {
    Call call{pointToPoint(Collective::SendRecv, dtype, sendCount, sendTo, recvFrom, false),
              sendData, recvData};
    checkPointToPoint(call, sendData, sendCount, sendTo, recvData, recvCount, recvFrom);
    progressOthers();
    detail::sendRecvThrough(*p2p_, sendData, sendCount, sendTo, recvData, recvCount, recvFrom,
                            dtype);
  }

  Request startSendRaw(const void* data, size_t count, DType dtype, int peer) override {
    Call call{pointToPoint(Collective::Send, dtype, count, peer, kNoPeer, true), data, nullptr};
    checkPointToPoint(call, data, count, peer, nullptr, 0, kNoPeer);
    progressOthers();
    return inFlight(false, p2p_->start(call, data, nullptr));
  }

  Request startRecvRaw(void* data, size_t count, DType dtype, int peer) override {
    Call call{pointToPoint(Collective::Recv, dtype, count, kNoPeer, peer, true), nullptr, data};
    checkPointToPoint(call, nullptr, 0, kNoPeer, data, count, peer);
    progressOthers();
    return inFlight(false, p2p_->start(call, nullptr, data));
  }

  void waitAll() override { waitRaw(nextTicket_); }

protected:
  // Tickets number the started collectives and point-to-point operations together, in start
  // order; each maps to its queue's own number.
  void waitRaw(uint64_t ticket) override {
    std::exception_ptr failure;
    while (!inFlight_.empty() && inFlight_.front().ticket <= ticket) {
      const InFlight& front = inFlight_.front();
      try {
        if (front.collective)
          async_->wait(front.inner);
        else
          p2p_->wait(front.inner);
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
      completed_ = front.ticket;
      inFlight_.pop_front();
    }
    if (failure) std::rethrow_exception(failure);
  }
  bool testRaw(uint64_t ticket) override {
    progressOthers();
    p2p_->progress();
    while (!inFlight_.empty() && inFlight_.front().ticket <= ticket) {
      InFlight front = inFlight_.front();
      bool done = false;
      try {
        done = front.collective ? async_->test(front.inner) : p2p_->test(front.inner);
      } catch (...) {
        completed_ = front.ticket;
        inFlight_.pop_front();
        throw;
      }
      if (!done) break;
      completed_ = front.ticket;
      inFlight_.pop_front();
    }
    return completed_ >= ticket;
  }
  uint64_t completedThrough() const override { return completed_; }

private:
  ThreadsComm(WorldState& world, int worldRank, std::vector<int> axes, ThreadsComm* worldComm)
      : world_(world), group_(world.group(axes, worldRank)), axes_(std::move(axes)),
        worldRank_(worldRank), worldComm_(worldComm) {
    groupRank_ = int(std::find(group_.worldRanks.begin(), group_.worldRanks.end(), worldRank) -
                     group_.worldRanks.begin());
    auto makeError = [this](const CallRecord& record, const std::string& cause) {
      return error(Call{record, nullptr, nullptr}, cause);
    };
    // A rank waiting for peers keeps its other work in flight moving: the peers may wait for it
    // (a started recv their blocking send waits for, its share of a started collective).
    async_ = std::make_unique<AsyncQueue>(world_, group_, groupRank_, makeError, [this] {
      if (closing_) return;
      progressOthers();
      if (!p2p_->idle()) p2p_->progress();
    });
    p2p_ = std::make_unique<PeerQueue>(world_, group_, groupRank_, makeError, [this] {
      if (closing_) return;
      progressOthers();
      if (!async_->idle()) async_->progress();
    });
  }

  Request started(const Call& call, const Segment<void>* inputs, size_t numInputs,
                  const Segment<void>* outputs, size_t numOutputs) {
    progressOthers();
    uint64_t ticket = async_->start(call, inputs, numInputs, outputs, numOutputs);
    return ticket ? inFlight(true, ticket) : Request();
  }

  /// The request of a started collective (`collective`) or point-to-point operation, numbered
  /// `inner` by its queue.
  Request inFlight(bool collective, uint64_t inner) {
    inFlight_.push_back({++nextTicket_, collective, inner});
    return pendingRequest(nextTicket_);
  }

  /// This rank's share of the collectives started on its other groups, as far as it goes without
  /// blocking (every entry into meshrt is a chance to progress them).
  void progressOthers() {
    ThreadsComm& worldComm = worldComm_ ? *worldComm_ : *this;
    auto progress = [](ThreadsComm& comm) {
      if (!comm.async_->idle()) comm.async_->progress();
      if (!comm.p2p_->idle()) comm.p2p_->progress();
    };
    if (&worldComm != this) progress(worldComm);
    for (auto& [axes, comm] : worldComm.subgroups_)
      if (comm.get() != this) progress(*comm);
  }

  static std::vector<int> allAxes(const Mesh& mesh) {
    std::vector<int> axes(mesh.numAxes());
    for (int i = 0; i < mesh.numAxes(); ++i)
      axes[i] = i;
    return axes;
  }

  /// The call group rank `q` published for the current collective.
  const Call& peer(int q) const {
    return group_.slots[q].calls[group_.slots[groupRank_].sequence & 1];
  }

  /// The error `cause` of this rank's `call`, after failing the world (if it has not failed
  /// already) so that no peer waits for this rank.
  CommError error(const Call& call, const std::string& cause) const {
    std::ostringstream message;
    message << "meshrt: " << call.name() << " failed on world rank " << worldRank_;
    if (axes_.size() != size_t(world_.mesh.numAxes()) || world_.mesh.numAxes() == 0)
      message << " (rank " << groupRank_ << " of group " << group_.mesh.str() << ")";
    else
      message << " (mesh " << world_.mesh.str() << ")";
    message << ": " << cause;
    CommError result(call.name(), worldRank_, message.str());
    world_.fail(worldRank_, std::make_exception_ptr(result));
    return result;
  }

  /// Argument errors (detail::argumentError) are CommErrors on the calling rank.
  void checkArguments(const Call& call, const void* in, const void* out) const {
    std::string cause = detail::argumentError(call, in, out, size(), groupRank_);
    if (!cause.empty()) throw error(call, cause);
  }
  void checkPointToPoint(const Call& call, const void* sendData, size_t sendCount, int sendTo,
                         const void* recvData, size_t recvCount, int recvFrom) const {
    std::string cause = detail::pointToPointError(call, sendData, sendCount, sendTo, recvData,
                                                  recvCount, recvFrom, size(), groupRank_);
    if (!cause.empty()) throw error(call, cause);
  }
  void checkBuffer(const Call& call, const void* buffer, size_t bytes, const char* what) const {
    if (!buffer && bytes) throw error(call, std::string(what) + " is null");
  }

  /// Publishes `call`, waits for every rank of the group, and checks that all made the same call.
  void begin(const Call& call) {
    progressOthers();
    // Blocking calls follow the started ones on this group (the same order on every rank).
    if (!async_->idle()) async_->waitAll();
    if (world_.failed.load(std::memory_order_acquire)) throw error(call, world_.failure());
    ++group_.slots[groupRank_].sequence;
    group_.slots[groupRank_].calls[group_.slots[groupRank_].sequence & 1] = call;
    if (size() == 1) return;
    wait(call, /*entry=*/true);
    for (int q = 0; q < size(); ++q)
      if (!peer(q).sameCollective(call))
        throw error(call, "ranks disagree: group rank " + std::to_string(groupRank_) + " called " +
                              call.describe() + " but group rank " + std::to_string(q) +
                              " called " + peer(q).describe());
  }

  /// The group barrier: spin briefly (a peer on another core is usually close), then yield
  /// (ranks may outnumber cores), then sleep on the generation word.
  ///
  /// Only the entry barrier of a collective (`entry`) can fail: there a rank that sees the world
  /// failed, a missing peer exited, or its deadline passed withdraws its arrival and throws.
  /// Either every rank passes the barrier or none does, so nobody starts reading the buffers of
  /// a rank that has left. Past the entry barrier every rank is inside the collective's data
  /// phases, which cannot fail, so the later barriers wait without condition.
  void wait(const Call& call, bool entry = false) {
    group_.slots[groupRank_].arrivals.fetch_add(1, std::memory_order_relaxed);
    uint64_t before = group_.barrier.fetch_add(1, std::memory_order_acq_rel);
    uint32_t generation = uint32_t(before >> 32);
    if (uint32_t(before) + 1 == uint32_t(size())) {
      group_.barrier.store(uint64_t(generation + 1) << 32, std::memory_order_release);
      group_.generation.store(generation + 1, std::memory_order_release);
      futexWakeAll(group_.generation);
      return;
    }
    // Published from the start of an entry barrier, so that a peer timing out elsewhere blames
    // the ranks this one waits for rather than this one; withdrawn only after a failure is
    // recorded.
    std::optional<WaitingScope> waiting;
    if (entry)
      waiting.emplace(world_, worldRank_,
                      Waiting{&group_, false,
                              group_.slots[groupRank_].arrivals.load(std::memory_order_relaxed)});
    auto passed = [&] {
      return uint32_t(group_.barrier.load(std::memory_order_acquire) >> 32) != generation;
    };
    for (int spin = 0; spin < world_.spins; ++spin) {
      if (passed()) return;
      cpuRelax();
    }
    Clock::time_point yielding = Clock::now();
    for (int yield = 0; world_.keepYielding(yield, yielding); ++yield) {
      if (passed()) return;
      if (entry && world_.failed.load(std::memory_order_relaxed)) break;
      sched_yield();
    }
    Clock::time_point deadline = Clock::now() + world_.timeout;
    while (!passed()) {
      if (entry) {
        std::string cause = whyGiveUp(deadline);
        if (!cause.empty()) {
          if (!abandon(generation)) return; // Everyone arrived meanwhile: carry on.
          throw error(call, cause);
        }
      }
      std::chrono::nanoseconds slice = std::chrono::milliseconds(50);
      if (entry) slice = std::min<std::chrono::nanoseconds>(slice, deadline - Clock::now());
      futexWait(group_.generation, generation, std::max(slice, std::chrono::nanoseconds(1000)));
    }
  }

  /// Why a rank waiting at an entry barrier should stop waiting, or "".
  std::string whyGiveUp(Clock::time_point deadline) const {
    if (world_.failed.load(std::memory_order_acquire)) return world_.failure();
    uint64_t arrival = group_.slots[groupRank_].arrivals.load(std::memory_order_relaxed);
    std::vector<int> missing;
    std::string exited;
    for (int q = 0; q < size(); ++q) {
      if (group_.slots[q].arrivals.load(std::memory_order_relaxed) >= arrival) continue;
      int worldRank = group_.worldRanks[q];
      // A peer whose deadline passed at the same moment withdraws its arrival before it records
      // the failure: it is here, not missing.
      if (world_.waitsAt(worldRank, Waiting{&group_, false, arrival})) continue;
      missing.push_back(worldRank);
      if (world_.exited[worldRank].load(std::memory_order_acquire))
        exited += (exited.empty() ? "" : ", ") + std::to_string(worldRank);
    }
    if (!exited.empty())
      return "world rank(s) " + exited + " finished the program without joining this collective";
    if (Clock::now() < deadline) return "";
    std::string cause = timeoutCause(world_, missing);
    if (cause.empty()) return world_.failure();
    return cause + " (MESHRT_TIMEOUT_S sets the limit)";
  }

  /// Withdraws this rank's arrival at the barrier of `generation`; false if it has completed.
  bool abandon(uint32_t generation) {
    uint64_t current = group_.barrier.load(std::memory_order_acquire);
    while (uint32_t(current >> 32) == generation)
      if (group_.barrier.compare_exchange_weak(current, current - 1, std::memory_order_acq_rel,
                                               std::memory_order_acquire)) {
        group_.slots[groupRank_].arrivals.fetch_sub(1, std::memory_order_relaxed);
        return true;
      }
    return false;
  }

  WorldState& world_;
  GroupState& group_;
  std::vector<int> axes_; // the world axes this group spans, in group order
  int worldRank_;
  int groupRank_ = 0;
  ThreadsComm* worldComm_; // null for the world communicator itself
  std::vector<char> scratch_;
  std::vector<const void*> inputs_; // the peers' buffers of a reduction, reused
  std::unique_ptr<AsyncQueue> async_;
  std::unique_ptr<PeerQueue> p2p_;
  struct InFlight {
    uint64_t ticket;
    bool collective; // else point-to-point
    uint64_t inner;  // its number in async_ or p2p_
  };
  std::deque<InFlight> inFlight_; // started, oldest first
  uint64_t nextTicket_ = 0, completed_ = 0;
  bool closing_ = false; // being destroyed: no waiting hooks
  std::map<std::vector<int>, std::unique_ptr<ThreadsComm>> subgroups_;
};

} // namespace

void runThreads(const Mesh& mesh, const std::function<void(Communicator&)>& program,
                const ThreadsOptions& options) {
  // Owned jointly by the rank threads, so that a rank abandoned while stuck (below) never
  // touches freed runtime state.
  struct Run {
    Run(const Mesh& mesh, std::chrono::milliseconds timeout,
        const std::function<void(Communicator&)>& body)
        : world(mesh, timeout), program(body) {}
    WorldState world;
    std::function<void(Communicator&)> program;
  };
  auto run = std::make_shared<Run>(mesh, options.timeout, program);
  WorldState& world = run->world;
  std::vector<std::thread> threads;
  threads.reserve(mesh.size());
  std::vector<int> cores = rankCores(mesh.size());
  auto runRank = [run, cores](int worldRank) {
    keepToCore(cores[size_t(worldRank)]);
    try {
      ThreadsComm comm(run->world, worldRank);
      run->program(comm);
      run->world.markExited(worldRank);
    } catch (...) {
      run->world.fail(worldRank, std::current_exception());
      run->world.markExited(worldRank);
    }
  };
  try {
    for (int worldRank = 0; worldRank < mesh.size(); ++worldRank)
      threads.emplace_back(runRank, worldRank);
  } catch (...) {
    world.fail(-1, std::current_exception());
    for (int worldRank = int(threads.size()); worldRank < mesh.size(); ++worldRank)
      world.markExited(worldRank);
  }
  // Joining a rank that never gets back into meshrt (stuck in a loop or a wait of its own) would
  // freeze the process: once the world has failed, a rank gets the exit grace (the timeout, at
  // least 2 s) to return, then it is abandoned (its thread detached) and the caller gets an
  // AbandonedRanksError.
  std::vector<int> stuck = world.awaitExits();
  for (size_t rank = 0; rank < threads.size(); ++rank) {
    if (std::find(stuck.begin(), stuck.end(), int(rank)) != stuck.end())
      threads[rank].detach();
    else
      threads[rank].join();
  }
  std::exception_ptr error = world.firstError();
  if (stuck.empty()) {
    if (error) std::rethrow_exception(error);
    return;
  }
  std::string ranks;
  for (int rank : stuck)
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank);
  std::ostringstream message;
  message << "meshrt: world rank(s) " << ranks << " did not return within "
          << double(world.exitGrace.count()) / 1000
          << " s of the failure below (stuck outside meshrt: MESHRT_TIMEOUT_S sets the limit); "
             "their threads are abandoned, so the process must end: "
          << world.failure();
  throw AbandonedRanksError(stuck, message.str());
}

} // namespace meshrt
