// The run-time choice of backend. Built with MESHRT_HAVE_MPI when meshrt_mpi exists; without it,
// asking for MPI is an error that says so.
#include "meshrt/Launch.h"

#include "meshrt/Threads.h"
#ifdef MESHRT_HAVE_MPI
#include "meshrt/Mpi.h"
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace meshrt {

const char* backendName(Backend backend) {
  return backend == Backend::Mpi ? "mpi" : "threads";
}

Backend parseBackend(std::string_view name) {
  if (name == "threads") return Backend::Threads;
  if (name == "mpi") return Backend::Mpi;
  throw std::invalid_argument("meshrt: unknown backend '" + std::string(name) +
                              "' (expected threads or mpi)");
}

bool mpiBackendBuilt() {
#ifdef MESHRT_HAVE_MPI
  return true;
#else
  return false;
#endif
}

Backend LaunchOptions::defaultBackend() {
  if (const char* name = std::getenv("MESHRT_BACKEND"); name && *name) return parseBackend(name);
  // Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; MPICH's and Slurm's PMI launchers set PMI_SIZE.
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* value = std::getenv(variable); value && *value) return Backend::Mpi;
  return Backend::Threads;
}

LaunchOptions LaunchOptions::fromArgs(int& argc, char** argv) {
  LaunchOptions options;
  int kept = 1;
  for (int arg = 1; arg < argc; ++arg) {
    std::string_view text = argv[arg];
    if (text == "--backend") {
      if (arg + 1 >= argc) throw std::invalid_argument("meshrt: --backend needs threads or mpi");
      options.backend = parseBackend(argv[++arg]);
    } else if (text.substr(0, 10) == "--backend=") {
      options.backend = parseBackend(text.substr(10));
    } else {
      argv[kept++] = argv[arg];
    }
  }
  argc = kept;
  argv[argc] = nullptr;
  return options;
}

bool launch(const Mesh& mesh, const LaunchOptions& options,
            const std::function<void(Communicator&)>& program) {
  if (options.backend == Backend::Threads) {
    ThreadsOptions threads;
    threads.timeout = options.timeout;
    try {
      runThreads(mesh, program, threads);
    } catch (const AbandonedRanksError& error) {
      // Returning would run the caller's destructors under threads that still use its data.
      std::fprintf(stderr, "error: %s\n", error.what());
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(1);
    }
    return true;
  }
#ifdef MESHRT_HAVE_MPI
  MpiOptions mpi;
  mpi.timeout = options.timeout;
  int rank = initMpi();
  runMpi(mesh, program, mpi);
  return rank == 0;
#else
  throw std::runtime_error("meshrt: the MPI backend was asked for (--backend, MESHRT_BACKEND or "
                           "mpirun) but this program was built without it (meshrt_launch "
                           "without MPI)");
#endif
}

} // namespace meshrt
