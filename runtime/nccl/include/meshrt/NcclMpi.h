// Bootstrapping the NCCL backend across hosts through MPI: one process per GPU (launched by
// mpirun), the ncclUniqueId made by world rank 0 and broadcast with MPI_Bcast, each process on
// GPU (its rank among the processes of its host) % (the host's device count).
// Available when meshrt_nccl was built with MPI (MESHRT_NCCL_HAS_MPI).
#pragma once

#include "meshrt/Nccl.h"

#include <mpi.h>

namespace meshrt::nccl {

/// The world communicator of this process over `mesh` (mesh.size() must equal the size of
/// `comm`); collective over `comm`.
std::unique_ptr<NcclCommunicator>
worldFromMpi(const Mesh& mesh, MPI_Comm comm, std::chrono::milliseconds timeout = defaultTimeout());

/// launch() with NcclLaunch::Mpi: initializes MPI if nobody has (finalized at exit), runs this
/// process's rank of `mesh` over MPI_COMM_WORLD (worldFromMpi) and returns whether it is world
/// rank 0. Failures: see launch().
bool launchWithMpi(const Mesh& mesh, const NcclOptions& options,
                   const std::function<void(Communicator&)>& program);

} // namespace meshrt::nccl
