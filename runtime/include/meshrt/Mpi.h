// meshrt's MPI backend (library meshrt_mpi): every rank is an MPI process, started by mpirun on
// one or many hosts; collectives are MPI's (docs/runtime.md, "The MPI backend"). This header does
// not include <mpi.h>: programs that only launch through it need MPI's library, not its headers.
#pragma once

#include "meshrt/Comm.h"

#include <chrono>
#include <functional>
#include <memory>

namespace meshrt {

struct MpiOptions {
  /// How long a collective waits for the group before it throws CommError. The default reads
  /// MESHRT_TIMEOUT_S (and throws std::invalid_argument if it is malformed).
  std::chrono::milliseconds timeout = defaultTimeout();
  /// Check before every collective that the group's ranks make the same call (one small
  /// allgather). On by default; MESHRT_MPI_CHECK=0 turns it off.
  bool checkAgreement = defaultCheckAgreement();

  static bool defaultCheckAgreement();
};

/// Initializes MPI if nobody has (MPI_Finalize then runs at exit); returns this process's rank in
/// MPI_COMM_WORLD.
int initMpi();

/// This process's world communicator over `mesh` (a duplicate of MPI_COMM_WORLD, so world rank =
/// MPI rank), initializing MPI if needed. Collective over MPI_COMM_WORLD. Throws CommError on
/// every process if the MPI world's size is not mesh.size().
std::unique_ptr<Communicator> mpiWorld(const Mesh& mesh, const MpiOptions& options = {});

/// Runs `program` on this process's rank of `mesh` (mpiWorld) and returns when it has finished.
/// A rank whose program throws prints the error and ends the whole job with MPI_Abort (exit
/// status 1): MPI cannot withdraw the peers from collectives they are blocked in. In a world of
/// one process the exception is rethrown instead.
void runMpi(const Mesh& mesh, const std::function<void(Communicator&)>& program,
            const MpiOptions& options = {});

} // namespace meshrt
