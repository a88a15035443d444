// meshrt's threads backend: every rank is a thread of this process, and collectives read the
// peers' buffers directly through shared memory (docs/runtime.md describes the algorithm).
#pragma once

#include "meshrt/Comm.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>
#include <unistd.h>

namespace meshrt {

struct ThreadsOptions {
  /// How long a collective waits for a missing rank before every waiting rank gets a CommError.
  /// The default reads MESHRT_TIMEOUT_S (and throws std::invalid_argument if it is malformed).
  std::chrono::milliseconds timeout = defaultTimeout();
};

/// What runThreads throws when ranks did not return within the exit grace (the timeout, at least
/// 2 s) after the world failed (stuck outside meshrt, where they never see the failure). Their
/// threads were detached and may still run the program, so the caller must end the process without
/// returning into code or data they use: launch() prints the message and ends the process with
/// std::_Exit(1).
class AbandonedRanksError : public CommError {
public:
  AbandonedRanksError(std::vector<int> ranks, const std::string& message)
      : CommError("", ranks.empty() ? -1 : ranks.front(), message), ranks_(std::move(ranks)) {}
  /// The world ranks abandoned.
  const std::vector<int>& ranks() const { return ranks_; }

private:
  std::vector<int> ranks_;
};

/// Runs `program` on mesh.size() threads, one per rank, each with its world communicator, and
/// returns when all have finished. A rank that throws (or returns while others wait for it in a
/// collective) fails the world: the other ranks' collectives throw CommError. After every thread
/// has ended, the first exception raised (in time) is rethrown to the caller. A rank that has
/// not ended `timeout` after the world failed is abandoned: AbandonedRanksError, naming it and
/// the first failure, instead of a process that never exits. `program` is copied: an abandoned
/// rank keeps its copy alive.
void runThreads(const Mesh& mesh, const std::function<void(Communicator&)>& program,
                const ThreadsOptions& options = {});

/// The cores this process may run on: its affinity mask (e.g. under taskset), at least 1. The
/// threads backend pins ranks by it, and `meshc calibrate` records it as the machine's cores.
/// The main thread's mask (getpid()), not the caller's: a rank thread is pinned to one core.
inline int usableCores() {
  cpu_set_t cpus;
  if (sched_getaffinity(getpid(), sizeof(cpus), &cpus) == 0) return std::max(1, CPU_COUNT(&cpus));
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

} // namespace meshrt
