// The consumer's own code: runs the generated class on the ranks of the mesh given to
// meshc_add_program, gathers the output and writes it in the runner's format so that
// run_consumer.py compares it with the reference interpreter's (`meshc --emit=run`).
// The same source for both backends: the cpu program runs on threads; the CUDA consumer
// (cuda/CMakeLists.txt, CONSUMER_ON_NCCL) runs its BACKEND cuda program on the nccl backend, one
// GPU per rank. Errors (no GPU, say) are printed and exit with status 1.
// Usage: consumer <outputs-file>
#include "model.h"

#ifdef CONSUMER_ON_NCCL
#include "meshrt/Nccl.h"
#else
#include "meshrt/Threads.h"
#endif

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <outputs-file>\n", argv[0]);
    return 2;
  }
  using meshc_generated::Model;
  const uint64_t seed = 7;
  meshc::gen::Tensor y;
  auto program = [&](meshrt::Communicator& world) {
    Model model(world, seed);
    Model::Outputs outputs = model.run(model.synthesizeInputs(seed));
    meshc::gen::Tensor gathered = Model::gatherOutput(world, "y", outputs.y);
    if (world.rank() == 0) y = std::move(gathered);
  };
  try {
#ifdef CONSUMER_ON_NCCL
    meshrt::nccl::runNccl(Model::mesh(), program);
#else
    meshrt::runThreads(Model::mesh(), program);
#endif
  } catch (const std::exception& error) {
    std::fprintf(stderr, "consumer: error: %s\n", error.what());
    return 1;
  }
  std::FILE* file = std::fopen(argv[1], "wb");
  if (!file) return 2;
  meshc::gen::writeTensor(file, "model.y", "f32", y.shape, y.data);
  std::fclose(file);
  std::printf("consumer: ran on %d ranks, y has %zu values\n", Model::mesh().size(), y.data.size());
  return 0;
}
