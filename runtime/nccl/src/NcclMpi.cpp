// The NCCL world bootstrapped through MPI (meshrt/NcclMpi.h).
#include "meshrt/NcclMpi.h"

namespace meshrt::nccl {

std::unique_ptr<NcclCommunicator> worldFromMpi(const Mesh& mesh, MPI_Comm comm,
                                               std::chrono::milliseconds timeout) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (size != mesh.size())
    throw CommError("", rank,
                    "nccl backend: the mesh " + mesh.str() + " has " + std::to_string(mesh.size()) +
                        " ranks but the MPI communicator " + std::to_string(size));
  // The GPU: this process's rank among the processes sharing its host.
  MPI_Comm host;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host);
  int localRank = 0;
  MPI_Comm_rank(host, &localRank);
  MPI_Comm_free(&host);
  int devices = deviceCount();
  if (devices == 0) throw CommError("", rank, "nccl backend: no CUDA device on this host");
  ncclUniqueId id;
  if (rank == 0) checkNccl(ncclGetUniqueId(&id), nullptr, "", rank, "ncclGetUniqueId");
  int status = MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm);
  if (status != MPI_SUCCESS)
    throw CommError("", rank, "nccl backend: MPI_Bcast of the NCCL unique id failed");
  return NcclCommunicator::createWorld(mesh, rank, id, localRank % devices, timeout);
}

} // namespace meshrt::nccl
