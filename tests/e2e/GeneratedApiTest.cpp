// The API of a generated class, on the golden MLP (tests/golden-cpp/mlp.{h,cpp}, planned for
// [data=2, model=2] with batch: data, d_ff: model), compiled into this test: input synthesis
// agrees with the interpreter's, scatter/gather round-trip, wrong shapes and meshes are clear
// errors, and the sharded run equals the same program run on one rank's worth of data. The
// golden transformer (tests/golden-cpp/transformer.cpp, compiled into this file below) checks
// the arena: temporaries share memory, and a reused object computes what a fresh one does.
#include <catch2/catch.hpp>

#include "interp/Interpreter.h"
#include "meshrt/Threads.h"
#include "mlp.h"
#include "transformer.h"

// One more generated source in this test's translation unit (its own namespace and classes).
#include "transformer.cpp"

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

TEST_CASE("params: names, shards with their layouts, get and set round trip", "[codegen]") {
  CHECK(Mlp::paramNames() == std::vector<std::string>{"ffn/w_in", "ffn/b_in", "ffn/w_out"});
  CHECK_FALSE(Mlp::isOptimizerState("ffn/w_in"));
  std::vector<Tensor> got(4), after(4);
  std::vector<meshc::gen::Buffer> shard(4);
  Tensor replacement{{64, 256}, meshc::gen::Buffer(64 * 256)};
  for (size_t i = 0; i < replacement.data.size(); ++i)
    replacement.data[i] = float(i % 1000) * 0.001f;
  meshrt::runThreads(Mlp::mesh(), [&](meshrt::Communicator& world) {
    Mlp program(world, 5);
    size_t rank = size_t(world.rank());
    std::vector<meshc::gen::ParamShard> shards = program.paramShards();
    REQUIRE(shards.size() == 3);
    CHECK(shards[0].path == "ffn/w_in");
    CHECK(shards[0].globalShape == meshc::gen::Shape{64, 256});
    CHECK(shards[0].localShape == meshc::gen::Shape{64, 128});
    CHECK(shards[0].dims == std::vector<std::string>{"d_model", "d_ff"});
    CHECK(shards[0].axes == std::vector<std::vector<std::string>>{{}, {"model"}});
    got[rank] = program.getParam("ffn/w_in");
    program.setParam("ffn/w_in", replacement);
    shard[rank] = *program.paramShards()[0].data;
    after[rank] = program.getParam("ffn/w_in");
    CHECK_THROWS_WITH(program.getParam("nope"), "mlp: no param named 'nope'");
    CHECK_THROWS_AS(program.setParam("ffn/w_in", Tensor{{64, 255}, meshc::gen::Buffer(64 * 255)}),
                    std::invalid_argument);
  });
  for (size_t rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    CHECK(got[rank].shape == meshc::gen::Shape{64, 256});
    CHECK(got[rank].data == got[0].data); // every rank gets the whole tensor
    CHECK(after[rank].data == replacement.data);
    // Each rank keeps its block of d_ff: columns [128 * model, 128 * model + 128).
    size_t model = rank % 2;
    CHECK(shard[rank][0] == replacement.data[128 * model]);
    CHECK(shard[rank][128 + 5] == replacement.data[256 + 128 * model + 5]);
  }
  // The global value does not depend on the layout: w_in's initializer keyed by global index.
  CHECK(got[0].data[0] != got[0].data[1]);
}

TEST_CASE("a train block's weights move into the program class", "[codegen]") {
  using meshc_generated::MlpTrain;
  std::vector<Tensor> moved(4), direct(4);
  meshrt::runThreads(Mlp::mesh(), [&](meshrt::Communicator& world) {
    MlpTrain train(world, 11);
    Mlp program(world, 12); // other initial weights
    for (const std::string& path : Mlp::paramNames())
      program.setParam(path, train.getParam(path));
    Mlp reference(world, 11);
    Mlp::Inputs inputs = program.synthesizeInputs(3);
    moved[size_t(world.rank())] = program.run(inputs).y;
    direct[size_t(world.rank())] = reference.run(inputs).y;
  });
  for (size_t rank = 0; rank < 4; ++rank)
    CHECK(moved[rank].data == direct[rank].data);
}

TEST_CASE("a train step updates the params and the step counter", "[codegen]") {
  using meshc_generated::MlpTrain;
  // sgd with momentum: one state slot per weight, told apart by its role.
  CHECK(MlpTrain::paramNames() == std::vector<std::string>{"ffn/w_in", "ffn/b_in", "ffn/w_out",
                                                           "ffn/w_in@momentum", "ffn/b_in@momentum",
                                                           "ffn/w_out@momentum"});
  CHECK(MlpTrain::isOptimizerState("ffn/w_in@momentum"));
  CHECK_FALSE(MlpTrain::isOptimizerState("ffn/w_in"));
  std::vector<float> losses(4), again(4);
  std::vector<Tensor> before(4), after(4), momentum(4);
  std::vector<int64_t> counts(4);
  meshrt::runThreads(MlpTrain::mesh(), [&](meshrt::Communicator& world) {
    size_t rank = size_t(world.rank());
    MlpTrain train(world, 1);
    before[rank] = train.getParam("ffn/w_in");
    losses[rank] = train.step(train.synthesizeInputs(1));
    after[rank] = train.getParam("ffn/w_in");
    momentum[rank] = train.getParam("ffn/w_in@momentum");
    counts[rank] = train.stepCount();
    // Back to step 0 with the initial weights and zero momentum: the same loss again.
    MlpTrain fresh(world, 1);
    for (const std::string& path : MlpTrain::paramNames())
      train.setParam(path, fresh.getParam(path));
    train.setStepCount(0);
    again[rank] = train.step(train.synthesizeInputs(1));
  });
  for (size_t rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    CHECK(counts[rank] == 1);
    CHECK(losses[rank] == losses[0]); // the global loss on every rank
    CHECK(again[rank] == losses[rank]);
    CHECK(after[rank].data == after[0].data);
    CHECK(before[rank].data != after[rank].data);
  }
  // The first step's momentum is the gradient, and it moved the weights.
  bool nonzero = false;
  for (float m : momentum[0].data)
    nonzero = nonzero || m != 0;
  CHECK(nonzero);
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

TEST_CASE("run()'s temporaries share one arena, placed by liveness", "[codegen]") {
  using meshc_generated::Lm;
  using meshc_generated::LmTrain;
  STATIC_REQUIRE(Lm::kArenaBytes > 0);
  STATIC_REQUIRE(Lm::kArenaBytes < Lm::kTemporaryBytes);
  STATIC_REQUIRE(LmTrain::kArenaBytes < LmTrain::kTemporaryBytes);
  STATIC_REQUIRE(Lm::kArenaBytes % 64 == 0);
  STATIC_REQUIRE(Mlp::kArenaBytes <= Mlp::kTemporaryBytes);
}

TEST_CASE("a reused generated object leaves no stale data in its arena", "[codegen]") {
  using meshc_generated::Lm;
  using meshc_generated::LmTrain;
  size_t ranks = size_t(Lm::mesh().size());
  std::vector<Tensor> first(ranks), again(ranks), afterOther(ranks), fresh(ranks);
  std::vector<Tensor> trainFirst(ranks), trainAgain(ranks);
  meshrt::runThreads(Lm::mesh(), [&](meshrt::Communicator& world) {
    size_t rank = size_t(world.rank());
    Lm program(world, 5);
    Lm::Inputs inputs = program.synthesizeInputs(11), other = program.synthesizeInputs(12);
    first[rank] = program.run(inputs).logits;
    again[rank] = program.run(inputs).logits;
    program.run(other);
    afterOther[rank] = program.run(inputs).logits;
    Lm freshProgram(world, 5);
    fresh[rank] = freshProgram.run(inputs).logits;

    // A train step changes the params and the step counter: the reused object gets both back
    // (from a fresh one) before stepping on the same inputs again.
    LmTrain train(world, 5), initial(world, 5);
    LmTrain::Inputs trainInputs = train.synthesizeInputs(11);
    trainFirst[rank] = train.run(trainInputs).loss;
    train.run(train.synthesizeInputs(12));
    for (const std::string& path : LmTrain::paramNames())
      train.setParam(path, initial.getParam(path));
    train.setStepCount(0);
    trainAgain[rank] = train.run(trainInputs).loss;
  });
  for (size_t rank = 0; rank < ranks; ++rank) {
    INFO("rank " << rank);
    CHECK(first[rank].shape == meshc::gen::Shape{2, 32, 48});
    CHECK(first[rank].data == again[rank].data);
    CHECK(first[rank].data == afterOther[rank].data);
    CHECK(first[rank].data == fresh[rank].data);
    CHECK(trainFirst[rank].data == trainAgain[rank].data);
    CHECK(std::isfinite(trainFirst[rank].data.at(0)));
  }
}
