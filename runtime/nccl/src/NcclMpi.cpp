// The NCCL world bootstrapped through MPI (meshrt/NcclMpi.h): one process per GPU, on one host or
// several.
#include "meshrt/NcclMpi.h"

#include <cstdio>
#include <cstdlib>

namespace meshrt::nccl {

std::unique_ptr<NcclCommunicator> worldFromMpi(const Mesh& mesh, MPI_Comm comm,
                                               std::chrono::milliseconds timeout) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (size != mesh.size())
    throw CommError("", rank,
                    "nccl backend: the mesh " + mesh.str() + " has " + std::to_string(mesh.size()) +
                        " ranks but the MPI communicator " + std::to_string(size) +
                        " processes (start it with mpirun -np " + std::to_string(mesh.size()) +
                        ", one process per GPU)");
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

namespace {

void finalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

} // namespace

bool launchWithMpi(const Mesh& mesh, const NcclOptions& options,
                   const std::function<void(Communicator&)>& program) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) throw std::runtime_error("nccl backend: MPI has already been finalized");
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      throw std::runtime_error("nccl backend: MPI_Init_thread failed");
    std::atexit(finalizeAtExit);
  }
  int rank = 0, processes = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &processes);
  std::string failure;
  std::unique_ptr<NcclCommunicator> world;
  try {
    world = worldFromMpi(mesh, MPI_COMM_WORLD, options.timeout);
    program(*world);
    world->synchronize("");
    return rank == 0;
  } catch (const std::exception& caught) {
    if (processes == 1) throw;
    failure = caught.what();
  } catch (...) {
    if (processes == 1) throw;
    failure = "an exception that is not a std::exception";
  }
  // The peers may wait in NCCL collectives for this rank: abort its communicators, then the job.
  if (world) world->abort();
  std::fprintf(stderr, "error: nccl backend, process %d of %d (mpirun): %s\n", rank, processes,
               failure.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort(); // MPI_Abort does not return
}

} // namespace meshrt::nccl
