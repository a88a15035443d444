// launch() of the generated CUDA runner (meshrt/Nccl.h): all ranks in this process, or one process
// per GPU under mpirun. Built with MESHRT_NCCL_HAS_MPI when meshrt_nccl has MPI; without it,
// asking for the MPI launch is an error that says so.
#include "meshrt/Nccl.h"
#if MESHRT_NCCL_HAS_MPI
#include "meshrt/NcclMpi.h"
#endif

#include <cstdlib>
#include <stdexcept>
#include <string_view>

namespace meshrt::nccl {
namespace {

NcclLaunch parseLaunch(std::string_view name) {
  if (name == "threads") return NcclLaunch::Threads;
  if (name == "mpi") return NcclLaunch::Mpi;
  throw std::invalid_argument("nccl backend: unknown launch '" + std::string(name) +
                              "' (expected threads or mpi)");
}

} // namespace

bool mpiLaunchBuilt() {
#if MESHRT_NCCL_HAS_MPI
  return true;
#else
  return false;
#endif
}

NcclLaunch NcclOptions::defaultLaunch() {
  if (const char* name = std::getenv("MESHRT_NCCL_LAUNCH"); name && *name) return parseLaunch(name);
  // Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; MPICH's and Slurm's PMI launchers set PMI_SIZE.
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* value = std::getenv(variable); value && *value) return NcclLaunch::Mpi;
  return NcclLaunch::Threads;
}

NcclOptions NcclOptions::fromArgs(int& argc, char** argv) {
  NcclOptions options;
  int kept = 1;
  for (int arg = 1; arg < argc; ++arg) {
    std::string_view text = argv[arg];
    if (text == "--launch") {
      if (arg + 1 >= argc)
        throw std::invalid_argument("nccl backend: --launch needs threads or mpi");
      options.launch = parseLaunch(argv[++arg]);
    } else if (text.substr(0, 9) == "--launch=") {
      options.launch = parseLaunch(text.substr(9));
    } else {
      argv[kept++] = argv[arg];
    }
  }
  argc = kept;
  argv[argc] = nullptr;
  return options;
}

bool launch(const Mesh& mesh, const NcclOptions& options,
            const std::function<void(Communicator&)>& program) {
  if (options.launch == NcclLaunch::Threads) {
    runNccl(mesh, program, options);
    return true;
  }
#if MESHRT_NCCL_HAS_MPI
  return launchWithMpi(mesh, options, program);
#else
  throw std::runtime_error("nccl backend: the MPI launch was asked for (--launch mpi, "
                           "MESHRT_NCCL_LAUNCH or mpirun) but meshrt_nccl was built without MPI");
#endif
}

} // namespace meshrt::nccl
