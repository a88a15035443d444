// meshrt's traces (meshrt/Trace.h) on the threads backend: the probes the generated code prints
// and the collectives meshrt records, written as Chrome trace JSON with one track per rank.
#include "meshrt/Trace.h"
#include "meshrt/Threads.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace meshrt;

namespace {

nlohmann::json readJson(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

/// What one rank of the generated code does, probes included: a loop, a blocking all-reduce
/// over `b`, a GEMM, a started all-reduce over the world and its wait.
void tracedProgram(Communicator& world) {
  std::vector<float> data(64, 1.0f);
  Communicator& b = world.subgroup({"b"});
  MESHRT_TRACE_RUN(world, "program");
  MESHRT_TRACE_SPAN(world);
  MESHRT_TRACE("loop", "t.mesh:1:2", "forward");
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
  MESHRT_TRACE_SITE("t.mesh:2:3");
  b.allReduce(data.data(), data.size());
  MESHRT_TRACE("gemm", "t.mesh:3:4", "backward");
  Request request = world.startAllReduce(data.data(), data.size());
  MESHRT_TRACE_SITE("t.mesh:4:5");
  world.wait(request);
}

} // namespace

TEST_CASE("traces record op groups and collectives per rank", "[trace]") {
  // Off: nothing is recorded, nothing written.
  REQUIRE_FALSE(trace::enabled());
  std::string path = "trace_test_" + std::to_string(::getpid()) + ".json";
  std::remove(path.c_str());
  runThreads(Mesh::parse("a=2,b=2"), tracedProgram);
  trace::finish();
  REQUIRE_FALSE(std::ifstream(path).good());

  trace::enable(path);
  REQUIRE(trace::enabled());
  runThreads(Mesh::parse("a=2,b=2"), tracedProgram);
  trace::finish();
  REQUIRE_FALSE(trace::enabled());
  nlohmann::json trace = readJson(path);
  std::remove(path.c_str());

  REQUIRE(trace["otherData"]["worldSize"] == 4);
  std::map<int, std::vector<nlohmann::json>> tracks;
  for (const nlohmann::json& event : trace["traceEvents"]) {
    for (const char* field : {"name", "ph", "ts", "dur", "pid", "tid"})
      REQUIRE(event.contains(field));
    REQUIRE(event["pid"] == event["tid"]);
    if (event["ph"] == "X") tracks[event["pid"].get<int>()].push_back(event);
  }
  REQUIRE(tracks.size() == 4);
  for (const auto& [rank, events] : tracks) {
    INFO("rank " << rank);
    std::map<std::string, nlohmann::json> byName;
    for (const nlohmann::json& event : events)
      byName[event["name"].get<std::string>()] = event;
    // Op groups named by kind and location, in their phase; collectives by the site before them.
    REQUIRE(byName.size() == 6);
    CHECK(byName["loop t.mesh:1:2"]["cat"] == "forward");
    CHECK(byName["gemm t.mesh:3:4"]["cat"] == "backward");
    CHECK(byName["allReduce t.mesh:2:3"]["cat"] == "collective");
    CHECK(byName["allReduce t.mesh:2:3"]["args"]["bytes"] == 256);
    CHECK(byName["startAllReduce t.mesh:3:4"]["cat"] == "collective");
    CHECK(byName["wait t.mesh:4:5"]["cat"] == "collective");
    CHECK(byName["run program"]["cat"] == "run");
    CHECK(byName["loop t.mesh:1:2"]["dur"].get<double>() >= 1000.0); // the 1 ms sleep, in us
    // Everything lies inside the run; the groups follow one another.
    double runStart = byName["run program"]["ts"],
           runEnd = runStart + byName["run program"]["dur"].get<double>();
    for (const nlohmann::json& event : events) {
      CHECK(event["ts"].get<double>() >= runStart);
      CHECK(event["ts"].get<double>() + event["dur"].get<double>() <= runEnd + 0.001);
    }
    double loopEnd = byName["loop t.mesh:1:2"]["ts"].get<double>() +
                     byName["loop t.mesh:1:2"]["dur"].get<double>();
    CHECK(byName["allReduce t.mesh:2:3"]["ts"].get<double>() >= loopEnd - 0.001);
    CHECK(byName["gemm t.mesh:3:4"]["ts"].get<double>() >=
          byName["allReduce t.mesh:2:3"]["ts"].get<double>());
  }
}

TEST_CASE("a process holding some ranks writes its own file", "[trace]") {
  // What an MPI process does: it records its one rank of the world, and names the file by it.
  std::string path = "trace_test_part_" + std::to_string(::getpid()) + ".json";
  trace::enable(path);
  runThreads(Mesh::parse("x=2"), [](Communicator& world) {
    if (world.rank() == 1) {
      trace::Scope scope(world, "run", "run", 0, "only_rank_1");
    }
    world.barrier();
  });
  trace::finish();
  std::string part = path + ".rank1";
  nlohmann::json trace = readJson(part);
  std::remove(part.c_str());
  REQUIRE_FALSE(std::ifstream(path).good());
  int events = 0;
  for (const nlohmann::json& event : trace["traceEvents"])
    if (event["ph"] == "X") {
      CHECK(event["pid"] == 1);
      CHECK(event["name"] == "run only_rank_1");
      ++events;
    }
  CHECK(events == 1);
}

TEST_CASE("traces record sends and recvs in the category p2p", "[trace][p2p]") {
  std::string path = "trace_test_p2p_" + std::to_string(::getpid()) + ".json";
  trace::enable(path);
  runThreads(Mesh::parse("stage=2"), [](Communicator& world) {
    std::vector<float> data(16, 1.0f), got(16);
    MESHRT_TRACE_SPAN(world);
    MESHRT_TRACE_SITE("t.mesh:7:1");
    if (world.rank() == 0) {
      world.send(data.data(), data.size(), 1);
      world.startRecv(got.data(), got.size(), 1).wait();
    } else {
      world.recv(got.data(), got.size(), 0);
      world.sendRecv(data.data(), data.size(), 0, got.data(), 0, Communicator::kNoPeer);
    }
  });
  trace::finish();
  nlohmann::json trace = readJson(path);
  std::remove(path.c_str());
  std::map<int, std::map<std::string, nlohmann::json>> byRank;
  for (const nlohmann::json& event : trace["traceEvents"])
    if (event["ph"] == "X") byRank[event["pid"].get<int>()][event["name"]] = event;
  CHECK(byRank[0]["send t.mesh:7:1"]["cat"] == "p2p");
  CHECK(byRank[0]["send t.mesh:7:1"]["args"]["bytes"] == 64);
  CHECK(byRank[0]["startRecv t.mesh:7:1"]["cat"] == "p2p");
  CHECK(byRank[1]["recv t.mesh:7:1"]["cat"] == "p2p");
  CHECK(byRank[1]["sendRecv t.mesh:7:1"]["args"]["bytes"] == 64);
}
