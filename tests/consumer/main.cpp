// The consumer's own code: runs the generated class on the ranks of the mesh given to
// meshc_add_program (threads), gathers the output and writes it in the runner's format so that
// run_consumer.py compares it with the reference interpreter's (`meshc --emit=run`).
// Usage: consumer <outputs-file>
#include "model.h"

#include "meshrt/Threads.h"

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <outputs-file>\n", argv[0]);
    return 2;
  }
  using meshc_generated::Model;
  const uint64_t seed = 7;
  meshc::gen::Tensor y;
  meshrt::runThreads(Model::mesh(), [&](meshrt::Communicator& world) {
    Model model(world, seed);
    Model::Outputs outputs = model.run(model.synthesizeInputs(seed));
    meshc::gen::Tensor gathered = Model::gatherOutput(world, "y", outputs.y);
    if (world.rank() == 0) y = std::move(gathered);
  });
  std::FILE* file = std::fopen(argv[1], "wb");
  if (!file) return 2;
  meshc::gen::writeTensor(file, "model.y", "f32", y.shape, y.data);
  std::fclose(file);
  std::printf("consumer: ran on %d ranks, y has %zu values\n", Model::mesh().size(), y.data.size());
  return 0;
}
