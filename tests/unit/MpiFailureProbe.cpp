// Failures of the MPI backend that end the job, each a mode of this program, run by ctest under
// mpirun through expect_error.py (which checks the exit status and the message):
//   timeout: world rank 3 never joins a barrier; the others time out (MESHRT_TIMEOUT_S) and
//            the launcher aborts the job with the message instead of hanging.
//   timeout_unchecked: the same without the agreement check (MESHRT_MPI_CHECK=0), in an
//            allreduce: the nonblocking collective times out.
//   throw:   world rank 1 throws; the launcher prints its error and aborts the job.
//   size:    the mesh has 4 ranks but the MPI world another number of processes.
//   recv_timeout: world rank 2 waits to receive from world rank 1, which never sends; rank 2
//            times out naming both and the launcher aborts the job.
//   recv_mismatch: world rank 0 sends 8 f32 to world rank 1, which expects 16.
#include "meshrt/Launch.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "timeout_unchecked") setenv("MESHRT_MPI_CHECK", "0", 1);
  meshrt::LaunchOptions options;
  options.backend = meshrt::Backend::Mpi;
  meshrt::launch(meshrt::Mesh::parse("a=2,b=2"), options, [&](meshrt::Communicator& world) {
    if (mode == "timeout" || mode == "timeout_unchecked") {
      if (world.rank() == 3)
        std::this_thread::sleep_for(world.timeout() * 20); // killed by the others' abort
      if (mode == "timeout") world.barrier();
      float x = 1;
      world.allReduce(&x, 1);
    } else if (mode == "recv_timeout") {
      float x = 0;
      // Every rank but 2 waits outside meshrt until rank 2's abort ends the job (none reaches
      // MPI_Finalize first, and no other rank's timeout races with rank 2's message).
      if (world.rank() == 2)
        world.recv(&x, 1, 1);
      else
        std::this_thread::sleep_for(world.timeout() * 20);
    } else if (mode == "recv_mismatch") {
      float data[16] = {};
      if (world.rank() == 0) world.send(data, 8, 1);
      if (world.rank() == 1) world.recv(data, 16, 0);
      world.barrier();
    } else if (mode == "throw") {
      world.barrier();
      if (world.rank() == 1) throw std::runtime_error("boom in rank 1");
      float x = 1;
      world.allReduce(&x, 1);
    }
  });
  std::printf("mode '%s': the program finished without an error\n", mode.c_str());
  return 0;
}
