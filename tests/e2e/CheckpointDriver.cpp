// The end-to-end checkpoint driver (tests/e2e/checkpoint_case.py): one generated class, built with
// -DMESHC_CKPT_HEADER="<stem>.h" -DMESHC_CKPT_CLASS=<Class> and -DMESHC_CKPT_TRAIN (a train class)
// or -DMESHC_CKPT_OUTPUT=<output> (a program), on the threads backend over the class's mesh.
//
// Usage: <binary> <seed> <load-dir or -> <steps> <save-dir or -> <outputs-file>
// Constructs the class with <seed>, loads the latest checkpoint of <load-dir>, then:
// - train classes (MESHC_CKPT_TRAIN): takes <steps> training steps, step s on the inputs the
//   interpreter synthesizes for seed s (the same data whatever <seed>; s counts from the loaded
//   step), printing
//   "step <s> loss <loss>" for each, and writes the losses as the tensor "losses" and every
//   param's final global value (weights, optimizer state, step state) as "param.<path>";
// - programs: runs once on the inputs synthesized for seed 0 and writes the gathered output;
// then saves to <save-dir>.
#include MESHC_CKPT_HEADER

#include "meshrt/Threads.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

using namespace meshc_generated;
using Class = MESHC_CKPT_CLASS;
#define MESHC_CKPT_STRING(x) MESHC_CKPT_STRING2(x)
#define MESHC_CKPT_STRING2(x) #x
#ifndef MESHC_CKPT_TRAIN
const char* const kOutput = MESHC_CKPT_STRING(MESHC_CKPT_OUTPUT);
#endif

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s <seed> <load-dir|-> <steps> <save-dir|-> <outputs-file>\n",
                 argv[0]);
    return 2;
  }
  uint64_t seed = std::strtoull(argv[1], nullptr, 10);
  std::string loadDir = argv[2], saveDir = argv[4];
  long steps = std::strtol(argv[3], nullptr, 10);
  struct Result {
    std::string name;
    meshc::gen::Tensor tensor;
  };
  std::vector<Result> results;
  meshc::gen::useSingleThreadedBlas();
  try {
    meshrt::runThreads(Class::mesh(), [&](meshrt::Communicator& world) {
      Class program(world, seed);
      if (loadDir != "-") program.load(loadDir);
#ifdef MESHC_CKPT_TRAIN
      meshc::gen::Tensor losses{{steps}, meshc::gen::Buffer(size_t(steps))};
      for (long k = 0; k < steps; ++k) {
        int64_t s = program.stepCount();
        float loss = program.step(program.synthesizeInputs(uint64_t(s)));
        losses.data[size_t(k)] = loss;
        if (world.rank() == 0) std::printf("step %lld loss %.9g\n", (long long)s, double(loss));
      }
      if (world.rank() == 0) results.push_back({"losses", losses});
      for (const std::string& path : Class::paramNames()) {
        meshc::gen::Tensor value = program.getParam(path); // collective: every rank calls it
        if (world.rank() == 0) results.push_back({"param." + path, value});
      }
#else
      (void)steps;
      auto inputs = program.synthesizeInputs(0);
      auto outputs = program.run(inputs);
      // The output MESHC_CKPT_OUTPUT (a field of Outputs), gathered.
      auto gathered = Class::gatherOutput(world, kOutput, outputs.MESHC_CKPT_OUTPUT);
      if (world.rank() == 0) results.push_back({kOutput, gathered});
#endif
      if (saveDir != "-") program.save(saveDir);
    });
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  std::FILE* file = std::fopen(argv[5], "wb");
  if (!file) {
    std::fprintf(stderr, "error: cannot open '%s'\n", argv[5]);
    return 2;
  }
  for (const Result& result : results)
    meshc::gen::writeTensor(file, result.name, "f32", result.tensor.shape, result.tensor.data);
  std::fclose(file);
  return 0;
}
