// Runs an SPMD program on the backend chosen at run time (library meshrt_launch): the threads
// backend (every rank a thread of this process) or the MPI backend (every rank a process started
// by mpirun). Generated runners go through it, so one binary runs on both.
#pragma once

#include "meshrt/Comm.h"

#include <chrono>
#include <functional>
#include <string_view>

namespace meshrt {

enum class Backend { Threads, Mpi };

/// "threads" or "mpi".
const char* backendName(Backend backend);
/// Parses "threads" or "mpi"; throws std::invalid_argument otherwise.
Backend parseBackend(std::string_view name);
/// Whether this build of meshrt_launch has the MPI backend (MPI was found when it was built).
bool mpiBackendBuilt();

struct LaunchOptions {
  /// The backend: MESHRT_BACKEND (threads|mpi) if set, else MPI when this process was started by
  /// mpirun (OMPI_COMM_WORLD_SIZE or PMI_SIZE in the environment), else threads.
  Backend backend = defaultBackend();
  /// How long a collective waits for a missing rank (MESHRT_TIMEOUT_S, else 60 s).
  std::chrono::milliseconds timeout = defaultTimeout();

  static Backend defaultBackend();
  /// The defaults, then `--backend threads|mpi` (or `--backend=...`) from the command line,
  /// which it removes from argv. Throws std::invalid_argument on an unknown backend.
  static LaunchOptions fromArgs(int& argc, char** argv);
};

/// Runs `program` on every rank of `mesh` that this process holds, each with its world
/// communicator, and returns when they have finished: on threads all ranks (runThreads), on MPI
/// this process's rank, the MPI world's size having to equal mesh.size() (runMpi). Errors follow
/// the backend: threads rethrow the first one here (except ranks stuck outside meshrt after a
/// failure, AbandonedRanksError: it prints "error: <message>" and ends the process with
/// std::_Exit(1)); MPI prints it and aborts the job (a world of
/// one process rethrows). Returns whether this process holds world rank 0, the rank that
/// reports and writes the results.
bool launch(const Mesh& mesh, const LaunchOptions& options,
            const std::function<void(Communicator&)>& program);

} // namespace meshrt
