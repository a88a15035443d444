// save()/load() of generated classes, in process, on the golden MLP (tests/golden-cpp/mlp.{h,cpp},
// planned for [data=2, model=2]): a train block resumed from a checkpoint continues bit for bit,
// with its step count, optimizer state and seed; a program loads a train block's weights; a
// corrupted checkpoint is an error naming the param. (Other meshes and layouts:
// checkpoint_case.py.)
#include <catch2/catch.hpp>

#include "meshrt/Threads.h"
#include "mlp.h"

#include <filesystem>
#include <fstream>
#include <mutex>

using meshc_generated::Mlp;
using meshc_generated::MlpTrain;
namespace fs = std::filesystem;

namespace {

fs::path freshDirectory(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("meshc-gen-ckpt-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  return dir;
}

} // namespace

TEST_CASE("a train block resumed from a checkpoint continues bit for bit", "[checkpoint]") {
  fs::path dir = freshDirectory("resume");
  std::vector<float> uninterrupted, resumed;
  int64_t resumedFrom = -1;
  meshrt::runThreads(MlpTrain::mesh(), [&](meshrt::Communicator& world) {
    MlpTrain train(world, 0);
    for (int64_t s = 0; s < 3; ++s)
      train.step(train.synthesizeInputs(uint64_t(s)));
    train.save(dir.string());
    std::vector<float> losses;
    for (int64_t s = 3; s < 6; ++s)
      losses.push_back(train.step(train.synthesizeInputs(uint64_t(s))));

    // Another seed: other initial params and random streams, until the load replaces them.
    MlpTrain again(world, 99);
    again.load(dir.string());
    int64_t from = again.stepCount();
    std::vector<float> more;
    for (int64_t s = from; s < from + 3; ++s)
      more.push_back(again.step(again.synthesizeInputs(uint64_t(s))));
    if (world.rank() == 0) {
      uninterrupted = losses;
      resumed = more;
      resumedFrom = from;
    }
  });
  CHECK(resumedFrom == 3);
  REQUIRE(uninterrupted.size() == 3);
  CHECK(resumed == uninterrupted);
  fs::remove_all(dir);
}

TEST_CASE("a program loads the weights of a train block's checkpoint", "[checkpoint]") {
  fs::path dir = freshDirectory("weights");
  std::mutex mutex;
  std::vector<std::string> failures;
  meshrt::runThreads(Mlp::mesh(), [&](meshrt::Communicator& world) {
    MlpTrain train(world, 0);
    for (int64_t s = 0; s < 2; ++s)
      train.step(train.synthesizeInputs(uint64_t(s)));
    train.save(dir.string());
    Mlp program(world, 99);
    bool differedBefore = program.getParam("ffn/w_in").data != train.getParam("ffn/w_in").data;
    program.load(dir.string());         // the optimizer state (`@` slots) is left out
    std::vector<std::string> differing; // getParam is collective: no lock held around it
    for (const std::string& name : Mlp::paramNames())
      if (program.getParam(name).data != train.getParam(name).data) differing.push_back(name);
    std::lock_guard<std::mutex> lock(mutex);
    if (!differedBefore) failures.push_back("seed 99 starts with the trained weights");
    for (const std::string& name : differing)
      failures.push_back(name + " differs after the load");
  });
  for (const std::string& failure : failures)
    FAIL_CHECK(failure);
  fs::remove_all(dir);
}

TEST_CASE("loading a corrupted checkpoint of generated code names the param", "[checkpoint]") {
  fs::path dir = freshDirectory("corrupt");
  meshrt::runThreads(Mlp::mesh(),
                     [&](meshrt::Communicator& world) { Mlp(world, 0).save(dir.string()); });
  {
    std::fstream file(dir / "ckpt-000001" / "rank-00000.bin",
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(0);
    file.put('\x42');
  }
  CHECK_THROWS_WITH(
      meshrt::runThreads(Mlp::mesh(),
                         [&](meshrt::Communicator& world) { Mlp(world, 0).load(dir.string()); }),
      Catch::Contains("tensor 'ffn/w_in'") && Catch::Contains("checksum mismatch") &&
          Catch::Contains("rank-00000.bin"));
  fs::remove_all(dir);
}
