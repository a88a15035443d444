// The state the threads backend's ranks share (internal to meshrt): the world (groups, failure,
// exits) and each group's slots and barrier (ThreadsComm.cpp), and the rings of started
// collectives (ThreadsAsync.cpp).
#pragma once

#include "CallRecord.h"
#include "meshrt/Threads.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace meshrt::detail {

using Clock = std::chrono::steady_clock;
constexpr size_t kCacheLine = 64;
// Reduced or gathered chunks at least this large are written around the cache (a buffer of
// several such chunks is read back from memory anyway), so the stores cost no
// read-for-ownership.
constexpr size_t kStreamingBytes = size_t(4) << 20;

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/// How long a waiter with a core of its own yields (beyond the first `yields`) before it sleeps:
/// MESHRT_YIELD_US (microseconds), else 0, off. A rank that sleeps leaves its core idle, and a
/// virtual machine's idle vCPU halts (on the development machine at once: cpuidle's haltpoll
/// without polling), so the wake-up that ends the wait first has to get the vCPU running again on
/// the host, where a yielding rank sees its peer's progress within microseconds. A pipeline stage
/// waits for its neighbour several times a step (the fill, the turn from forwards to backwards, the
/// closing all-reduce), up to about 20-30 ms in bench/pipeline_bubble.py's step: a budget of that
/// order keeps its vCPU up through them. Off by default until a quiet machine shows that it pays
/// (docs/runtime.md, "The barrier": session 15's one partly quiet run did not), and because with
/// another job on the core now and then it costs: a yielding rank accrues CPU time, so the job
/// keeps the core when the message arrives, where a woken rank would preempt it.
inline std::chrono::microseconds yieldBudget() {
  if (const char* text = std::getenv("MESHRT_YIELD_US"); text && *text) {
    char* end = nullptr;
    long long value = std::strtoll(text, &end, 10);
    if (end && *end == '\0' && value >= 0) return std::chrono::microseconds(value);
  }
  return std::chrono::microseconds(0);
}

/// Whether the calling thread runs under SCHED_FIFO or SCHED_RR (e.g. `chrt -f`), read once per
/// thread. Such a thread does not yield beyond the first few times: its yields give the core to
/// no ordinary task, so a long yield loop starves the rest of its core and, at 100% of a core,
/// runs into the kernel's real-time throttling (by default 50 ms of each second), which
/// bench/pipeline_bubble.py's servers under chrt measured as 6-7% longer pipelined steps at
/// m = 8 (docs/runtime.md, "The barrier").
inline bool realTimeThread() {
  thread_local const bool realTime = [] {
    int policy = sched_getscheduler(0);
    return policy == SCHED_FIFO || policy == SCHED_RR;
  }();
  return realTime;
}

inline void futexWait(std::atomic<uint32_t>& word, uint32_t expected,
                      std::chrono::nanoseconds wait) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  timespec timeout{time_t(wait.count() / 1000000000), long(wait.count() % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &timeout,
          nullptr, 0);
}

inline void futexWakeAll(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

/// With at least as many ranks as usable cores, the core each world rank's thread keeps to, or
/// -1 (fewer ranks than cores, or MESHRT_PIN_RANKS=0): the ranks in consecutive blocks, so that
/// ranks that differ only in the innermost mesh axes (the tensor-parallel groups, which
/// communicate most) share a core. Two ranks of one group on two cores, each shared with a rank
/// of another group, leave a core idle whenever both of its ranks wait for peers on the other
/// one; on one core, a rank that waits hands the core to the peer it waits for. As many ranks as
/// cores get one core each: left free, their blocking collectives at times waited about 0.6 ms
/// each, as if the scheduler had put two of them on one core (docs/runtime.md, "The barrier").
inline std::vector<int> rankCores(int ranks) {
  cpu_set_t cpus;
  const char* pin = std::getenv("MESHRT_PIN_RANKS");
  if ((pin && std::string(pin) == "0") || sched_getaffinity(getpid(), sizeof(cpus), &cpus) != 0)
    return std::vector<int>(size_t(ranks), -1);
  std::vector<int> usable;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &cpus)) usable.push_back(cpu);
  std::vector<int> cores(size_t(ranks), -1);
  if (int(usable.size()) > ranks) return cores;
  for (int rank = 0; rank < ranks; ++rank)
    cores[size_t(rank)] = usable[size_t(int64_t(rank) * int64_t(usable.size()) / ranks)];
  return cores;
}

/// Keeps the calling thread on `core` (nothing for -1).
inline void keepToCore(int core) {
  if (core < 0) return;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  CPU_SET(core, &cpus);
  sched_setaffinity(0, sizeof(cpus), &cpus); // best effort: a failure leaves the thread free
}

/// One rank's call, as published to its peers: the record every rank checks, and the buffers.
struct Call : CallRecord {
  const void* in = nullptr;
  void* out = nullptr;
};

/// How many started collectives one rank may have in flight on one group; starting one more
/// completes the oldest first.
constexpr uint64_t kRing = 64;

/// One rank's started collective, as published to its peers (ThreadsAsync.cpp). The stamps
/// only grow, so that a peer reading them late (after this rank reused the slot) still sees
/// "done".
struct alignas(kCacheLine) AsyncSlot {
  CallRecord record;
  std::vector<Segment<void>> inputs, outputs; // the logical buffers, as pieces
  std::atomic<uint64_t> published{0};         // = its sequence once record and pieces are set
  std::atomic<uint64_t> reduced{0};           // >= its sequence once this rank's phase A is done
};

struct alignas(kCacheLine) Slot {
  Call calls[2];
  /// How many barriers this rank has arrived at (to name the missing ranks on a timeout).
  std::atomic<uint64_t> arrivals{0};
  /// How many collectives this rank has begun on the group (only its owner reads it; kept here
  /// rather than in the communicator so that every communicator over the group agrees).
  uint64_t sequence = 0;
};

/// A send posted by its sender for one receiver (ThreadsP2p.cpp), owned by the sender until its
/// state leaves Posted. The receiver copies straight from `data`.
struct P2pMessage {
  enum State : int { Posted, Done, Rejected };
  int from = 0; // the sender's group rank
  CallRecord record;
  const void* data = nullptr;
  std::atomic<int> state{Posted};
  std::string rejection; // the receiver's reason, written before state = Rejected
};

/// One receiver's posted sends, oldest first (sends from one rank are received in order).
struct Mailbox {
  std::mutex mutex;
  std::deque<P2pMessage*> posted;
};

/// What the ranks of one group share.
struct GroupState {
  GroupState(std::vector<int> members, Mesh groupMesh)
      : worldRanks(std::move(members)), mesh(std::move(groupMesh)),
        slots(std::make_unique<Slot[]>(worldRanks.size())) {}
  std::vector<int> worldRanks; // group rank -> world rank
  Mesh mesh;
  std::unique_ptr<Slot[]> slots;
  /// The barrier: generation << 32 | ranks arrived in this generation. One word, so that a rank
  /// can withdraw its arrival only while the barrier has not completed (see abandon()).
  alignas(kCacheLine) std::atomic<uint64_t> barrier{0};
  /// The barrier's generation again, as the 32-bit word the waiters sleep on with futex.
  alignas(kCacheLine) std::atomic<uint32_t> generation{0};
  /// Started collectives (ThreadsAsync.cpp): kRing slots per rank, kRing arrival gates and
  /// kRing gates of phase A done.
  std::unique_ptr<AsyncSlot[]> asyncSlots{new AsyncSlot[worldRanks.size() * kRing]};
  std::unique_ptr<std::atomic<uint64_t>[]> gates { new std::atomic<uint64_t>[ kRing ]() };
  std::unique_ptr<std::atomic<uint64_t>[]> doneGates { new std::atomic<uint64_t>[ kRing ]() };
  /// Bumped when a started collective's gate fills (all arrived, all done phase A); waiters
  /// sleep on it.
  alignas(kCacheLine) std::atomic<uint32_t> asyncEvents{0};
  std::atomic<uint32_t> asyncSleepers{0};
  /// Point-to-point (ThreadsP2p.cpp): one mailbox per receiver, and the word its waiters sleep on
  /// (bumped whenever a send is posted, taken, rejected or withdrawn).
  std::unique_ptr<Mailbox[]> mailboxes{new Mailbox[worldRanks.size()]};
  alignas(kCacheLine) std::atomic<uint32_t> p2pEvents{0};
  std::atomic<uint32_t> p2pSleepers{0};
};

/// Where a rank waits for missing peers at the start of a collective (to find the rank that
/// really holds everyone up when one times out): in `group`'s entry barrier for the peers whose
/// arrivals are below `mark`, or (`started`) for the peers that have not published started
/// collective number `mark`.
struct Waiting {
  const GroupState* group = nullptr;
  bool started = false;
  uint64_t mark = 0;
  /// A point-to-point wait: the world rank it waits for (-1: a collective).
  int peer = -1;
};

/// What all ranks share: the groups, and whether (and why) the world has failed.
class WorldState {
public:
  WorldState(Mesh worldMesh, std::chrono::milliseconds waitLimit)
      : mesh(std::move(worldMesh)), timeout(waitLimit),
        exitGrace(std::max(waitLimit, kMinExitGrace)),
        exited(std::make_unique<std::atomic<bool>[]>(mesh.size())),
        waiting_(std::make_unique<WaitSlot[]>(size_t(mesh.size()))) {
    // With more ranks than cores, a spinning or yielding rank takes the core from the peer it
    // waits for, which keeps to the same core (rankCores): sleep almost at once instead
    // (bench/README.md, "lm forward on 4 thread ranks": 200 yields cost 7-13% of the step).
    bool oversubscribed = mesh.size() > usableCores();
    spins = oversubscribed ? 4 : 200;
    yields = oversubscribed ? 0 : 50;
    yieldFor = oversubscribed ? std::chrono::microseconds(0) : yieldBudget();
  }

  /// Whether a waiter that began yielding at `since` and has yielded `yielded` times yields
  /// again rather than sleep on its futex: the first `yields` times, then while `yieldFor` has
  /// not passed, unless the thread runs under a real-time policy (realTimeThread).
  bool keepYielding(int yielded, Clock::time_point since) const {
    if (yielded < yields) return true;
    return yieldFor.count() > 0 && !realTimeThread() && Clock::now() - since < yieldFor;
  }

  /// The group over world axes `axes` (in that order) that holds `worldRank`.
  GroupState& group(const std::vector<int>& axes, int worldRank) {
    std::vector<int> coords = mesh.coords(worldRank);
    std::vector<MeshAxis> groupAxes;
    for (int axis : axes)
      groupAxes.push_back(mesh.axes()[axis]);
    Mesh groupMesh(std::move(groupAxes));
    // Members share every coordinate outside `axes`; the key names them by their first member.
    std::vector<int> members;
    for (int groupRank = 0; groupRank < groupMesh.size(); ++groupRank) {
      std::vector<int> groupCoords = groupMesh.coords(groupRank);
      for (size_t i = 0; i < axes.size(); ++i)
        coords[axes[i]] = groupCoords[i];
      members.push_back(mesh.rank(coords));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<GroupState>& slot = groups_[{axes, members[0]}];
    if (!slot) slot = std::make_unique<GroupState>(std::move(members), std::move(groupMesh));
    return *slot;
  }

  /// Records the first failure and wakes every waiting rank so that it sees it.
  void fail(int worldRank, std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (firstError_) return;
      firstError_ = error;
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& caught) {
        cause_ = caught.what();
      } catch (...) {
        cause_ = "an exception that is not a std::exception";
      }
      failedRank_ = worldRank;
      failedAt_ = Clock::now();
      failed.store(true, std::memory_order_release);
    }
    wakeAll();
  }
  void markExited(int worldRank) {
    exited[worldRank].store(true, std::memory_order_release);
    wakeAll();
  }

  /// Blocks until every rank has exited, or until the world has failed and `exitGrace` more has
  /// passed; returns the ranks that have not exited (empty when all have). A rank that does not
  /// get back into meshrt (where it would see the failure) within the grace is stuck.
  std::vector<int> awaitExits() {
    std::unique_lock<std::mutex> lock(mutex_);
    auto notExited = [&] {
      std::vector<int> ranks;
      for (int rank = 0; rank < mesh.size(); ++rank)
        if (!exited[rank].load(std::memory_order_acquire)) ranks.push_back(rank);
      return ranks;
    };
    while (true) {
      std::vector<int> ranks = notExited();
      if (ranks.empty()) return ranks;
      if (firstError_ && Clock::now() >= failedAt_ + exitGrace) return ranks;
      // Woken by every exit and failure; the bounded wait covers the end of the grace period.
      changed_.wait_for(lock, std::chrono::milliseconds(50));
    }
  }

  /// Records that `worldRank` waits as `where` says (see Waiting), or no longer waits. Lock-free
  /// (every entry barrier publishes it): the group last, so a reader that sees it sees the rest.
  void setWaiting(int worldRank, const Waiting& where) {
    WaitSlot& slot = waiting_[size_t(worldRank)];
    slot.mark.store(where.mark, std::memory_order_relaxed);
    slot.started.store(where.started, std::memory_order_relaxed);
    slot.peer.store(where.peer, std::memory_order_relaxed);
    slot.group.store(where.group, std::memory_order_release);
  }
  void clearWaiting(int worldRank) {
    waiting_[size_t(worldRank)].group.store(nullptr, std::memory_order_release);
  }
  /// Whether `worldRank` still publishes that it waits as `where` says: a peer that arrived at
  /// the same barrier and is withdrawing its arrival after its own timeout (not a missing rank).
  bool waitsAt(int worldRank, const Waiting& where) const {
    const WaitSlot& slot = waiting_[size_t(worldRank)];
    return slot.group.load(std::memory_order_acquire) == where.group &&
           slot.started.load(std::memory_order_relaxed) == where.started &&
           slot.mark.load(std::memory_order_relaxed) == where.mark &&
           slot.peer.load(std::memory_order_relaxed) == where.peer;
  }

  /// The ranks that really hold up a wait for the world ranks `missing`: a missing rank that is
  /// itself waiting in another collective stands for the ranks it waits for, transitively, so
  /// the answer is the ranks outside every collective at the ends of these chains (empty if all
  /// wait on each other: a deadlock). Nothing, if the world has failed meanwhile (a rank that
  /// gives up records the failure before it stops counting as waiting).
  std::optional<std::vector<int>> culprits(const std::vector<int>& missing) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed.load(std::memory_order_acquire)) return std::nullopt;
    std::vector<bool> seen(size_t(mesh.size()));
    std::vector<int> pending = missing, found;
    while (!pending.empty()) {
      int rank = pending.back();
      pending.pop_back();
      if (seen[size_t(rank)]) continue;
      seen[size_t(rank)] = true;
      const WaitSlot& slot = waiting_[size_t(rank)];
      Waiting where{slot.group.load(std::memory_order_acquire),
                    slot.started.load(std::memory_order_relaxed),
                    slot.mark.load(std::memory_order_relaxed)};
      if (!where.group) {
        found.push_back(rank);
        continue;
      }
      if (int peer = slot.peer.load(std::memory_order_relaxed); peer >= 0) {
        pending.push_back(peer);
        continue;
      }
      for (size_t q = 0; q < where.group->worldRanks.size(); ++q)
        if (!hasArrived(*where.group, q, where)) pending.push_back(where.group->worldRanks[q]);
    }
    std::sort(found.begin(), found.end());
    return found;
  }
  /// "world rank 3 failed: <what it threw>".
  std::string failure() {
    std::lock_guard<std::mutex> lock(mutex_);
    return "world rank " + std::to_string(failedRank_) + " failed: " + cause_;
  }
  std::exception_ptr firstError() {
    std::lock_guard<std::mutex> lock(mutex_);
    return firstError_;
  }

  const Mesh mesh;
  const std::chrono::milliseconds timeout;
  /// How long ranks get to return once the world has failed before they are abandoned: the
  /// timeout, but never less than kMinExitGrace. A short test timeout (300 ms) must not abandon
  /// a rank that is merely descheduled on a loaded machine (abandoning forces the process to end).
  static constexpr std::chrono::milliseconds kMinExitGrace{2000};
  const std::chrono::milliseconds exitGrace;
  std::atomic<bool> failed{false};
  std::unique_ptr<std::atomic<bool>[]> exited;
  /// How long a waiter (barrier, started collective, point to point) spins, then yields, before
  /// it sleeps on the futex: `spins` pauses, then at least `yields` yields and, with a core per
  /// rank, yields for `yieldFor` (keepYielding).
  int spins = 200, yields = 50;
  std::chrono::microseconds yieldFor{0};

private:
  static bool hasArrived(const GroupState& group, size_t q, const Waiting& where) {
    if (where.started)
      return group.asyncSlots[q * kRing + where.mark % kRing].published.load(
                 std::memory_order_acquire) >= where.mark;
    return group.slots[q].arrivals.load(std::memory_order_relaxed) >= where.mark;
  }

  void wakeAll() {
    std::lock_guard<std::mutex> lock(mutex_);
    changed_.notify_all();
    for (auto& [key, group] : groups_) {
      futexWakeAll(group->generation);
      group->asyncEvents.fetch_add(1);
      futexWakeAll(group->asyncEvents);
      group->p2pEvents.fetch_add(1);
      futexWakeAll(group->p2pEvents);
    }
  }

  std::mutex mutex_;
  std::map<std::pair<std::vector<int>, int>, std::unique_ptr<GroupState>> groups_;
  std::condition_variable changed_; // an exit or a failure (awaitExits)
  std::exception_ptr firstError_;
  std::string cause_;
  int failedRank_ = -1;
  Clock::time_point failedAt_;
  struct alignas(kCacheLine) WaitSlot {
    std::atomic<const GroupState*> group{nullptr};
    std::atomic<bool> started{false};
    std::atomic<uint64_t> mark{0};
    std::atomic<int> peer{-1};
  };
  std::unique_ptr<WaitSlot[]> waiting_; // per world rank
};

/// Publishes where a rank waits (WorldState::setWaiting) for as long as it lives. It is destroyed
/// after a rank that gives up has recorded its failure, so peers never see it as outside.
class WaitingScope {
public:
  WaitingScope(WorldState& world, int worldRank, const Waiting& where)
      : world_(world), worldRank_(worldRank) {
    world_.setWaiting(worldRank_, where);
  }
  ~WaitingScope() { world_.clearWaiting(worldRank_); }
  WaitingScope(const WaitingScope&) = delete;
  WaitingScope& operator=(const WaitingScope&) = delete;

private:
  WorldState& world_;
  int worldRank_;
};

/// "timed out after 0.3 s waiting for world rank(s) 3" and, when some missing ranks only wait
/// for others in other collectives, which; "" if the world failed meanwhile (see culprits()).
inline std::string timeoutCause(WorldState& world, const std::vector<int>& missing) {
  std::optional<std::vector<int>> culprits = world.culprits(missing);
  if (!culprits) return "";
  auto list = [](const std::vector<int>& ranks) {
    std::string text;
    for (int rank : ranks)
      text += (text.empty() ? "" : ", ") + std::to_string(rank);
    return text;
  };
  std::ostringstream cause;
  cause << "timed out after " << double(world.timeout.count()) / 1000
        << " s waiting for world rank(s) ";
  if (culprits->empty()) {
    cause << list(missing) << ", each waiting in another collective (a deadlock: the ranks call "
          << "collectives in different orders)";
    return cause.str();
  }
  cause << list(*culprits);
  std::vector<int> waiters;
  for (int rank : missing)
    if (!std::binary_search(culprits->begin(), culprits->end(), rank)) waiters.push_back(rank);
  if (!waiters.empty())
    cause << " (world rank(s) " << list(waiters) << " wait for them in other collectives)";
  return cause.str();
}

/// Group rank `rank`'s share [begin, end) of `count` elements split into `parts` chunks whose
/// boundaries fall on cache lines (so that no two ranks write one line).
inline std::pair<size_t, size_t> chunkOf(size_t count, size_t elementSize, int parts, int rank) {
  size_t perLine = std::max<size_t>(1, kCacheLine / elementSize);
  size_t lines = (count + perLine - 1) / perLine;
  auto boundary = [&](int part) { return std::min(count, lines * part / parts * perLine); };
  return {boundary(rank), boundary(rank + 1)};
}

} // namespace meshrt::detail
