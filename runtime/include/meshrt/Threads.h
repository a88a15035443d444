// meshrt's threads backend: every rank is a thread of this process, and collectives read the
// peers' buffers directly through shared memory (docs/runtime.md describes the algorithm).
#pragma once

#include "meshrt/Comm.h"

#include <chrono>
#include <functional>

namespace meshrt {

struct ThreadsOptions {
  /// How long a collective waits for a missing rank before every waiting rank gets a CommError.
  /// The default reads MESHRT_TIMEOUT_S (and throws std::invalid_argument if it is malformed).
  std::chrono::milliseconds timeout = defaultTimeout();
};

/// Runs `program` on mesh.size() threads, one per rank, each with its world communicator, and
/// returns when all have finished. A rank that throws (or returns while others wait for it in a
/// collective) fails the world: the other ranks' collectives throw CommError. After every thread
/// has ended, the first exception raised (in time) is rethrown to the caller.
void runThreads(const Mesh& mesh, const std::function<void(Communicator&)>& program,
                const ThreadsOptions& options = {});

} // namespace meshrt
