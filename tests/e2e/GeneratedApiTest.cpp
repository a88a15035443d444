// The API of a generated class, on the golden MLP (tests/golden-cpp/mlp.{h,cpp}, planned for
// [data=2, model=2] with batch: data, d_ff: model), compiled into this test: input synthesis
// agrees with the interpreter's, scatter/gather round-trip, wrong shapes and meshes are clear
// errors, and the sharded run equals the same program run on one rank's worth of data.
#include <catch2/catch.hpp>

#include "interp/Interpreter.h"
#include "meshrt/Threads.h"
#include "mlp.h"

#include <stdexcept>

using meshc::gen::Tensor;
using meshc_generated::Mlp;

namespace {

/// The interpreter's input `x` of mlp.mesh: f32[batch=32, d_model=64].
Tensor interpreterInput(uint64_t seed) {
  meshc::ir::InputInfo info;
  info.name = "x";
  info.type.dims = {{"batch", 32}, {"d_model", 64}};
  meshc::interp::Tensor x = meshc::interp::synthesizeInput(info, seed);
  return Tensor{{32, 64}, meshc::gen::Buffer(x.data.begin(), x.data.end())};
}

} // namespace

TEST_CASE("generated inputs, scatter and gather agree with the global tensors", "[codegen]") {
  const uint64_t seed = 7;
  Tensor global = interpreterInput(seed);
  std::vector<Tensor> synthesized(4), scattered(4), gathered(4);
  meshrt::runThreads(Mlp::mesh(), [&](meshrt::Communicator& world) {
    Mlp program(world, seed);
    size_t rank = size_t(world.rank());
    synthesized[rank] = program.synthesizeInputs(seed).x;
    scattered[rank] = Mlp::scatterInput(world, "x", global);
    // y has x's layout: gathering the shards of x gives x back.
    gathered[rank] = Mlp::gatherOutput(world, "y", scattered[rank]);
  });
  for (size_t rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    CHECK(synthesized[rank].shape == meshc::gen::Shape{16, 64});
    CHECK(synthesized[rank].data == scattered[rank].data);
    CHECK(gathered[rank].shape == global.shape);
    CHECK(gathered[rank].data == global.data);
  }
  // Ranks along `model` hold the same batch rows; ranks along `data` different ones.
  CHECK(scattered[0].data == scattered[1].data);
  CHECK(scattered[0].data != scattered[2].data);
}

TEST_CASE("the generated API reports wrong shapes, names and meshes", "[codegen]") {
  std::vector<std::string> errors(4);
  meshrt::runThreads(Mlp::mesh(), [&](meshrt::Communicator& world) {
    Mlp program(world);
    Mlp::Inputs inputs;
    inputs.x = Tensor{{16, 32}, meshc::gen::Buffer(512)};
    try {
      program.run(inputs);
    } catch (const std::invalid_argument& error) {
      errors[size_t(world.rank())] = error.what();
    }
  });
  for (const std::string& error : errors)
    CHECK(error == "input 'x': expected shape [16, 64] (1024 elements) but got shape [16, 32] "
                   "with 512 elements");

  meshrt::runThreads(Mlp::mesh(), [&](meshrt::Communicator& world) {
    CHECK_THROWS_WITH(Mlp::scatterInput(world, "nope", Tensor{}), "mlp: no input named 'nope'");
    CHECK_THROWS_AS(Mlp::scatterInput(world, "x", Tensor{{32, 63}, meshc::gen::Buffer(2016)}),
                    std::invalid_argument);
  });

  CHECK_THROWS_WITH(meshrt::runThreads(meshrt::Mesh({{"data", 4}}),
                                       [](meshrt::Communicator& world) { Mlp program(world); }),
                    "mlp: compiled for mesh [data=2, model=2] but the communicator's mesh is "
                    "[data=4]");
}

TEST_CASE("the generated MLP runs deterministically and keeps replicas identical", "[codegen]") {
  std::vector<Tensor> first(4), second(4);
  meshrt::runThreads(Mlp::mesh(), [&](meshrt::Communicator& world) {
    Mlp program(world, 3);
    Mlp::Inputs inputs = program.synthesizeInputs(3);
    first[size_t(world.rank())] = program.run(inputs).y;
    second[size_t(world.rank())] = program.run(inputs).y;
  });
  for (size_t rank = 0; rank < 4; ++rank)
    CHECK(first[rank].data == second[rank].data);
  // y is replicated over `model`: ranks 0 and 1 (same data coordinate) hold the same bits.
  CHECK(first[0].data == first[1].data);
  CHECK(first[2].data == first[3].data);
}
