// A threads-backend rank stuck outside meshrt, run by ctest through expect_error.py: world rank 2
// never returns from its own wait loop while the others enter an all-reduce. The others time out
// (MESHRT_TIMEOUT_S), and one timeout later launch() abandons rank 2, prints the error and ends
// the process with a non-zero status instead of joining rank 2 forever.
#include "meshrt/Launch.h"

#include <chrono>
#include <cstdio>
#include <thread>

int main() {
  meshrt::LaunchOptions options;
  options.backend = meshrt::Backend::Threads;
  meshrt::launch(meshrt::Mesh::parse("x=4"), options, [&](meshrt::Communicator& world) {
    if (world.rank() == 2)
      while (true)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    float x = 1;
    world.allReduce(&x, 1);
  });
  std::printf("the program finished without an error\n");
  return 0;
}
