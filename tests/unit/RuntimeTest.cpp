// meshrt's communicator on the threads backend: every collective on every test mesh and on its
// subgroups with exact expected values, in place and out of place, large buffers, and the
// failure semantics (timeouts, ranks that throw or leave, mismatched calls).
#include "meshrt/Threads.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <thread>

using namespace meshrt;
using namespace std::chrono_literals;

namespace {

const char* const kMeshes[] = {"x=1", "x=2", "x=4", "x=8", "a=2,b=2", "a=2,b=4"};

/// Assertions from rank threads, collected per world rank and checked on the main thread
/// (Catch2's assertions are not thread-safe).
class RankLog {
public:
  explicit RankLog(int ranks) : errors_(ranks) {}
  void fail(int worldRank, std::string message) {
    errors_[worldRank].push_back(std::move(message));
  }
  template <class T>
  void expectEqual(int worldRank, const std::vector<T>& got, const std::vector<T>& want,
                   const std::string& what) {
    if (got.size() != want.size()) {
      fail(worldRank, what + ": " + std::to_string(got.size()) + " elements, expected " +
                          std::to_string(want.size()));
      return;
    }
    for (size_t i = 0; i < got.size(); ++i)
      if (!(got[i] == want[i])) {
        std::ostringstream message;
        message << what << ": element " << i << " is " << +got[i] << ", expected " << +want[i];
        fail(worldRank, message.str());
        return;
      }
  }
  void check() const {
    for (size_t rank = 0; rank < errors_.size(); ++rank) {
      INFO("world rank " << rank);
      for (const std::string& error : errors_[rank])
        FAIL_CHECK(error);
    }
  }

private:
  std::vector<std::vector<std::string>> errors_;
};

/// A distinct value per (world rank, element), exactly representable in every dtype, so that
/// sums over up to 8 ranks are exact.
template <class T> T valueOf(int worldRank, size_t index) {
  return T((worldRank + 1) * 1000 + int(index % 997) - 400);
}

template <class T> std::vector<T> valuesOf(int worldRank, size_t count, size_t first = 0) {
  std::vector<T> values(count);
  for (size_t i = 0; i < count; ++i)
    values[i] = valueOf<T>(worldRank, first + i);
  return values;
}

/// Expected reduction of valuesOf over the group's ranks, elements [first, first + count).
template <class T>
std::vector<T> expectedReduce(Communicator& comm, ReduceOp op, size_t count, size_t first = 0) {
  std::vector<T> result(count);
  for (size_t i = 0; i < count; ++i) {
    T value = valueOf<T>(comm.worldRankOf(0), first + i);
    for (int q = 1; q < comm.size(); ++q) {
      T next = valueOf<T>(comm.worldRankOf(q), first + i);
      value = op == ReduceOp::Sum   ? value + next
              : op == ReduceOp::Max ? std::max(value, next)
                                    : std::min(value, next);
    }
    result[i] = value;
  }
  return result;
}

std::string label(Communicator& comm, const std::string& what) {
  return what + " on group " + comm.mesh().str();
}

template <class T>
void checkAllReduce(Communicator& comm, RankLog& log, size_t count, ReduceOp op) {
  int me = comm.worldRank();
  std::string what = label(comm, std::string("allReduce ") + dtypeName(DTypeOf<T>::value) + " " +
                                     reduceOpName(op) + " of " + std::to_string(count));
  std::vector<T> want = expectedReduce<T>(comm, op, count);
  std::vector<T> in = valuesOf<T>(me, count), out(count, T(-1));
  comm.allReduce(in.data(), out.data(), count, op);
  log.expectEqual(me, out, want, what + " (out of place)");
  log.expectEqual(me, in, valuesOf<T>(me, count), what + " (input unchanged)");
  comm.allReduce(in.data(), count, op);
  log.expectEqual(me, in, want, what + " (in place)");
}

template <class T> void checkReduceScatter(Communicator& comm, RankLog& log, size_t countPerRank) {
  int me = comm.worldRank(), p = comm.size(), rank = comm.rank();
  std::string what = label(comm, std::string("reduceScatter ") + dtypeName(DTypeOf<T>::value) +
                                     " of " + std::to_string(countPerRank) + " per rank");
  std::vector<T> want = expectedReduce<T>(comm, ReduceOp::Sum, countPerRank, rank * countPerRank);
  std::vector<T> in = valuesOf<T>(me, p * countPerRank), out(countPerRank, T(-1));
  comm.reduceScatter(in.data(), out.data(), countPerRank);
  log.expectEqual(me, out, want, what + " (out of place)");
  comm.reduceScatter(in.data(), in.data() + rank * countPerRank, countPerRank);
  log.expectEqual(
      me, std::vector<T>(in.begin() + rank * countPerRank, in.begin() + (rank + 1) * countPerRank),
      want, what + " (in place)");
  std::vector<T> maxWant =
      expectedReduce<T>(comm, ReduceOp::Max, countPerRank, rank * countPerRank);
  in = valuesOf<T>(me, p * countPerRank);
  comm.reduceScatter(in.data(), out.data(), countPerRank, ReduceOp::Max);
  log.expectEqual(me, out, maxWant, what + " (max)");
}

template <class T> void checkAllGather(Communicator& comm, RankLog& log, size_t countPerRank) {
  int me = comm.worldRank(), p = comm.size(), rank = comm.rank();
  std::string what = label(comm, std::string("allGather ") + dtypeName(DTypeOf<T>::value) + " of " +
                                     std::to_string(countPerRank) + " per rank");
  std::vector<T> want;
  for (int q = 0; q < p; ++q) {
    std::vector<T> chunk = valuesOf<T>(comm.worldRankOf(q), countPerRank);
    want.insert(want.end(), chunk.begin(), chunk.end());
  }
  std::vector<T> in = valuesOf<T>(me, countPerRank), out(p * countPerRank, T(-1));
  comm.allGather(in.data(), out.data(), countPerRank);
  log.expectEqual(me, out, want, what + " (out of place)");
  std::vector<T> inPlace(p * countPerRank, T(-1));
  std::copy(in.begin(), in.end(), inPlace.begin() + rank * countPerRank);
  comm.allGather(inPlace.data() + rank * countPerRank, inPlace.data(), countPerRank);
  log.expectEqual(me, inPlace, want, what + " (in place)");
}

/// allToAll's input element i of the chunk for group rank `to`, on world rank `from`.
template <class T> T allToAllValue(int from, int to, size_t i) {
  return T(from * 100000 + to * 1000 + int(i % 997));
}

template <class T> void checkAllToAll(Communicator& comm, RankLog& log, size_t countPerRank) {
  int me = comm.worldRank(), p = comm.size(), rank = comm.rank();
  std::vector<T> in(p * countPerRank), want(p * countPerRank), out(p * countPerRank, T(-1));
  for (int q = 0; q < p; ++q)
    for (size_t i = 0; i < countPerRank; ++i) {
      in[q * countPerRank + i] = allToAllValue<T>(me, q, i);
      want[q * countPerRank + i] = allToAllValue<T>(comm.worldRankOf(q), rank, i);
    }
  comm.allToAll(in.data(), out.data(), countPerRank);
  log.expectEqual(me, out, want,
                  label(comm, std::string("allToAll ") + dtypeName(DTypeOf<T>::value) + " of " +
                                  std::to_string(countPerRank) + " per rank"));
}

template <class T> void checkShifts(Communicator& comm, RankLog& log, size_t count) {
  int me = comm.worldRank(), p = comm.size(), rank = comm.rank();
  std::vector<T> in = valuesOf<T>(me, count), out(count);
  for (int offset : {1, -1, 2, 0, p + 1, -3}) {
    std::string what = label(comm, "shift by " + std::to_string(offset) + " of " +
                                       std::to_string(count) + " " + dtypeName(DTypeOf<T>::value));
    std::fill(out.begin(), out.end(), T(-1));
    comm.shift(in.data(), out.data(), count, offset, Boundary::Wrap);
    int from = ((rank - offset) % p + p) % p;
    log.expectEqual(me, out, valuesOf<T>(comm.worldRankOf(from), count), what + " (wrap)");
    std::fill(out.begin(), out.end(), T(-1));
    comm.shift(in.data(), out.data(), count, offset, Boundary::Zero);
    from = rank - offset;
    log.expectEqual(me, out,
                    from >= 0 && from < p ? valuesOf<T>(comm.worldRankOf(from), count)
                                          : std::vector<T>(count, T(0)),
                    what + " (zero)");
  }
  // The reversal: rank r and p-1-r swap buffers.
  std::fill(out.begin(), out.end(), T(-1));
  comm.permute(in.data(), out.data(), count, p - 1 - rank, p - 1 - rank);
  log.expectEqual(me, out, valuesOf<T>(comm.worldRankOf(p - 1 - rank), count),
                  label(comm, "permute reversal"));
}

template <class T> void checkBroadcast(Communicator& comm, RankLog& log, size_t count) {
  int me = comm.worldRank();
  for (int root : {0, comm.size() - 1, comm.size() / 2}) {
    std::vector<T> data = valuesOf<T>(me, count);
    comm.broadcast(data.data(), count, root);
    log.expectEqual(me, data, valuesOf<T>(comm.worldRankOf(root), count),
                    label(comm, "broadcast from " + std::to_string(root)));
  }
}

/// Every collective on `comm` (each rank of the world calls this on its own group).
void checkEveryCollective(Communicator& comm, RankLog& log) {
  for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(5003)}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
      checkAllReduce<float>(comm, log, count, op);
      checkAllReduce<int32_t>(comm, log, count, op);
    }
    checkAllReduce<double>(comm, log, count, ReduceOp::Sum);
    checkShifts<float>(comm, log, count);
    checkBroadcast<double>(comm, log, count);
  }
  for (size_t countPerRank : {size_t(0), size_t(1), size_t(5), size_t(1500)}) {
    checkReduceScatter<float>(comm, log, countPerRank);
    checkReduceScatter<int32_t>(comm, log, countPerRank);
    checkReduceScatter<double>(comm, log, countPerRank);
    checkAllGather<float>(comm, log, countPerRank);
    checkAllGather<unsigned char>(comm, log, countPerRank);
    checkAllToAll<int32_t>(comm, log, countPerRank);
    checkAllToAll<double>(comm, log, countPerRank);
  }
  comm.barrier();
}

/// Every subgroup shape of `mesh`: the world, each axis alone, both axes in both orders, none.
std::vector<std::vector<std::string>> groupShapes(const Mesh& mesh) {
  std::vector<std::vector<std::string>> shapes;
  for (const MeshAxis& axis : mesh.axes())
    shapes.push_back({axis.name});
  if (mesh.numAxes() == 2) {
    shapes.push_back({mesh.axes()[0].name, mesh.axes()[1].name});
    shapes.push_back({mesh.axes()[1].name, mesh.axes()[0].name});
  }
  shapes.push_back({});
  return shapes;
}

} // namespace

TEST_CASE("mesh: ranks, coordinates, parsing", "[runtime]") {
  Mesh mesh = Mesh::parse("data = 2, model=4");
  CHECK(mesh.str() == "[data=2, model=4]");
  CHECK(mesh.size() == 8);
  CHECK(mesh.axisIndex("model") == 1);
  CHECK(mesh.axisIndex("nope") == -1);
  CHECK(mesh.axisSize("data") == 2);
  CHECK(mesh.coords(6) == std::vector<int>{1, 2});
  for (int rank = 0; rank < mesh.size(); ++rank)
    CHECK(mesh.rank(mesh.coords(rank)) == rank);
  CHECK(Mesh::parse("").size() == 1);
  CHECK(Mesh().size() == 1);
  CHECK(Mesh({{"x", 3}}) == Mesh::parse("x=3"));
  CHECK_THROWS_WITH(Mesh::parse("x=2,x=3"), Catch::Contains("'x' appears twice"));
  CHECK_THROWS_WITH(Mesh::parse("x=0"), Catch::Contains("size 0"));
  CHECK_THROWS_WITH(Mesh::parse("x"), Catch::Contains("cannot parse mesh axis 'x'"));
  CHECK_THROWS_WITH(Mesh::parse("x=2y"), Catch::Contains("cannot parse"));
  CHECK_THROWS_AS(mesh.coords(8), std::out_of_range);
  CHECK_THROWS_AS(mesh.rank({2, 0}), std::out_of_range);
  CHECK_THROWS_WITH(mesh.axisSize("batch"), Catch::Contains("has no axis 'batch'"));
}

TEST_CASE("defaultTimeout reads MESHRT_TIMEOUT_S", "[runtime]") {
  const char* saved = std::getenv("MESHRT_TIMEOUT_S");
  std::string savedValue = saved ? saved : "";
  unsetenv("MESHRT_TIMEOUT_S");
  CHECK(defaultTimeout() == 60s);
  setenv("MESHRT_TIMEOUT_S", "0.25", 1);
  CHECK(defaultTimeout() == 250ms);
  setenv("MESHRT_TIMEOUT_S", "soon", 1);
  CHECK_THROWS_WITH(defaultTimeout(), Catch::Contains("MESHRT_TIMEOUT_S='soon'"));
  setenv("MESHRT_TIMEOUT_S", "-1", 1);
  CHECK_THROWS_AS(defaultTimeout(), std::invalid_argument);
  if (saved)
    setenv("MESHRT_TIMEOUT_S", savedValue.c_str(), 1);
  else
    unsetenv("MESHRT_TIMEOUT_S");
}

TEST_CASE("communicator identity and subgroups", "[runtime]") {
  Mesh mesh = Mesh::parse("data=2,model=4");
  RankLog log(mesh.size());
  std::vector<int32_t> modelSums(mesh.size());
  runThreads(mesh, [&](Communicator& world) {
    int me = world.worldRank();
    auto expect = [&](bool ok, const std::string& what) {
      if (!ok) log.fail(me, what);
    };
    expect(world.rank() == me && world.size() == 8 && world.mesh() == mesh, "world identity");
    expect(world.coords() == mesh.coords(me), "world coords");
    expect(world.coord("model") == me % 4 && world.coord("data") == me / 4, "world coord()");
    expect(std::string(world.backend()) == "threads", "backend name");
    Communicator& model = world.subgroup({"model"});
    expect(&model == &world.subgroup({"model"}), "subgroups are cached");
    expect(model.size() == 4 && model.rank() == me % 4, "model group rank");
    expect(model.mesh() == Mesh({{"model", 4}}), "model group mesh");
    expect(model.worldMesh() == mesh && model.worldRank() == me, "model group world identity");
    for (int q = 0; q < 4; ++q)
      expect(model.worldRankOf(q) == (me / 4) * 4 + q, "model group members");
    Communicator& swapped = world.subgroup({"model", "data"});
    expect(swapped.rank() == (me % 4) * 2 + me / 4, "row-major over the named order");
    expect(&swapped.subgroup({"model"}) == &model, "a subgroup's subgroup is the world's");
    expect(world.subgroup({}).size() == 1, "the empty subgroup is this rank alone");
    expect(&world.subgroup({"data", "model"}) == &world, "the full subgroup is the world");
    expect(&world.subgroup({"model", "data"}) != &world, "a reordered full subgroup is not");
    try {
      model.subgroup({"data"});
      expect(false, "subgroup over an axis outside the group");
    } catch (const std::invalid_argument& error) {
      expect(std::string(error.what()).find("has no axis 'data'") != std::string::npos,
             error.what());
    }
    try {
      world.subgroup({"data", "data"});
      expect(false, "subgroup over a repeated axis");
    } catch (const std::invalid_argument& error) {
      expect(std::string(error.what()).find("'data' named twice") != std::string::npos,
             error.what());
    }
    int32_t value = me;
    model.allReduce(&value, 1);
    modelSums[me] = value;
  });
  log.check();
  for (int rank = 0; rank < 8; ++rank)
    CHECK(modelSums[rank] == (rank < 4 ? 0 + 1 + 2 + 3 : 4 + 5 + 6 + 7));
}

TEST_CASE("every collective on every mesh and subgroup", "[runtime]") {
  std::string text = GENERATE(from_range(std::begin(kMeshes), std::end(kMeshes)));
  Mesh mesh = Mesh::parse(text);
  INFO("mesh " << mesh.str());
  RankLog log(mesh.size());
  runThreads(mesh, [&](Communicator& world) {
    checkEveryCollective(world, log);
    for (const std::vector<std::string>& axes : groupShapes(mesh))
      checkEveryCollective(world.subgroup(axes), log);
  });
  log.check();
}

TEST_CASE("large buffers with lengths that are not multiples of the group size", "[runtime]") {
  std::string text = GENERATE("x=2", "x=4", "a=2,b=4");
  Mesh mesh = Mesh::parse(text);
  INFO("mesh " << mesh.str());
  RankLog log(mesh.size());
  const size_t count = (1 << 20) + 3; // 4 MiB of f32
  runThreads(mesh, [&](Communicator& world) {
    checkAllReduce<float>(world, log, count, ReduceOp::Sum);
    checkAllReduce<double>(world, log, count / 2, ReduceOp::Max);
    Communicator& row = world.subgroup({mesh.axes().back().name});
    checkAllReduce<int32_t>(row, log, count, ReduceOp::Sum);
    checkReduceScatter<float>(world, log, count / mesh.size());
    checkAllGather<float>(world, log, count / mesh.size());
    checkAllToAll<float>(row, log, count / row.size());
    checkShifts<float>(row, log, count);
    checkBroadcast<float>(world, log, count);
  });
  log.check();
}

TEST_CASE("repeated small collectives on overlapping groups", "[runtime]") {
  // Each step sums a value over the world, a model row or a data column, in turn; the main
  // thread replays the same steps serially.
  Mesh mesh = Mesh::parse("data=2,model=4");
  const int steps = 1000;
  std::vector<int32_t> results(mesh.size());
  runThreads(mesh, [&](Communicator& world) {
    Communicator* groups[] = {&world, &world.subgroup({"model"}), &world.subgroup({"data"})};
    int32_t value = world.worldRank();
    for (int step = 0; step < steps; ++step) {
      groups[step % 3]->allReduce(&value, 1);
      value = value % 1009 + step;
    }
    results[world.worldRank()] = value;
  });
  std::vector<int32_t> values(8), next(8);
  std::iota(values.begin(), values.end(), 0);
  for (int step = 0; step < steps; ++step) {
    for (int rank = 0; rank < 8; ++rank) {
      int32_t sum = 0;
      for (int peer = 0; peer < 8; ++peer) {
        bool sameGroup = step % 3 == 0   ? true
                         : step % 3 == 1 ? peer / 4 == rank / 4  // model row: same data coord
                                         : peer % 4 == rank % 4; // data column: same model coord
        if (sameGroup) sum += values[peer];
      }
      next[rank] = sum % 1009 + step;
    }
    values = next;
  }
  CHECK(results == values);
}

namespace {

/// Runs `program` and returns what runThreads threw (or "" if nothing), with every rank's
/// CommError message collected in `rankErrors`.
struct FailureRun {
  std::string thrown;
  bool thrownIsCommError = false;
  std::vector<std::string> rankErrors;
  std::vector<double> rankSeconds;
};

/// CommErrors caught by runFailing's ranks so far (in its current run).
std::atomic<int> rankFailures{0};

/// A late rank: returns once another rank has failed (and at most 30 s later), so that it
/// arrives after the others timed out but well within the timeout runThreads then gives it
/// before abandoning it, however loaded the machine.
void arriveAfterAFailure() {
  auto limit = std::chrono::steady_clock::now() + 30s;
  while (rankFailures.load() == 0 && std::chrono::steady_clock::now() < limit)
    std::this_thread::sleep_for(1ms);
}

FailureRun runFailing(const Mesh& mesh, std::chrono::milliseconds timeout,
                      const std::function<void(Communicator&)>& program) {
  rankFailures.store(0);
  // The ranks own what they write (the state, the program, the start), as runThreads' own state
  // is: a rank that runThreads abandons (it did not return within the exit grace after the failure,
  // as on a machine loaded enough) may still write after this function has returned.
  auto run = std::make_shared<FailureRun>();
  run->rankErrors.resize(mesh.size());
  run->rankSeconds.resize(mesh.size(), -1);
  auto start = std::chrono::steady_clock::now();
  try {
    runThreads(
        mesh,
        [run, start, program](Communicator& world) {
          try {
            program(world);
          } catch (const CommError& error) {
            rankFailures.fetch_add(1);
            run->rankErrors[world.worldRank()] = error.what();
            run->rankSeconds[world.worldRank()] =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            throw;
          }
        },
        ThreadsOptions{timeout});
  } catch (const CommError& error) {
    run->thrown = error.what();
    run->thrownIsCommError = true;
  } catch (const std::exception& error) {
    run->thrown = error.what();
  }
  return *run;
}

} // namespace

TEST_CASE("a rank that never arrives is a timeout error on the others", "[runtime]") {
  FailureRun run = runFailing(Mesh::parse("a=2,b=2"), 300ms, [](Communicator& world) {
    if (world.worldRank() == 3) arriveAfterAFailure();
    std::vector<float> data(100, 1);
    world.allReduce(data.data(), data.size());
  });
  INFO(run.thrown);
  CHECK(run.thrownIsCommError);
  CHECK_THAT(run.thrown, Catch::Contains("allReduce failed on world rank") &&
                             Catch::Contains("timed out after 0.3 s waiting for world rank(s) 3"));
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank << ": " << run.rankErrors[rank]);
    CHECK_THAT(run.rankErrors[rank],
               Catch::Contains("allReduce failed on world rank " + std::to_string(rank)));
    CHECK(run.rankSeconds[rank] >= 0.29);
    CHECK(run.rankSeconds[rank] < 1.4);
  }
  // The late rank arrives to a failed world and fails at once.
  CHECK_THAT(run.rankErrors[3],
             Catch::Contains("failed on world rank 3") && Catch::Contains("timed out"));
}

TEST_CASE("a timeout inside a subgroup names the missing rank", "[runtime]") {
  FailureRun run = runFailing(Mesh::parse("data=2,model=4"), 400ms, [](Communicator& world) {
    Communicator& model = world.subgroup({"model"});
    if (world.worldRank() == 6) arriveAfterAFailure();
    model.barrier();
  });
  CHECK_THAT(run.thrown, Catch::Contains("barrier failed on world rank") &&
                             Catch::Contains("of group [model=4]") &&
                             Catch::Contains("waiting for world rank(s) 6"));
  // Ranks of the other model group finished their barrier normally.
  for (int rank = 0; rank < 4; ++rank)
    CHECK(run.rankErrors[rank].empty());
}

TEST_CASE("a rank that throws fails the others' collectives", "[runtime]") {
  FailureRun run = runFailing(Mesh::parse("x=4"), 30s, [](Communicator& world) {
    std::vector<double> data(10, 1);
    world.allReduce(data.data(), data.size());
    if (world.rank() == 1) throw std::runtime_error("boom in rank 1");
    world.allReduce(data.data(), data.size());
  });
  CHECK(run.thrown == "boom in rank 1");
  CHECK_FALSE(run.thrownIsCommError);
  for (int rank : {0, 2, 3}) {
    INFO(run.rankErrors[rank]);
    CHECK_THAT(run.rankErrors[rank],
               Catch::Contains("allReduce failed on world rank " + std::to_string(rank)) &&
                   Catch::Contains("world rank 1 failed: boom in rank 1"));
    CHECK(run.rankSeconds[rank] < 5); // not the 30 s timeout
  }
}

TEST_CASE("a rank that leaves early fails the others at once", "[runtime]") {
  FailureRun run = runFailing(Mesh::parse("x=4"), 30s, [](Communicator& world) {
    if (world.rank() == 2) return;
    world.barrier();
  });
  CHECK(run.thrownIsCommError);
  CHECK_THAT(run.thrown,
             Catch::Contains("world rank(s) 2 finished the program without joining this"));
  for (int rank : {0, 1, 3})
    CHECK(run.rankSeconds[rank] < 5);
}

TEST_CASE("ranks that disagree on a collective get an error on every rank", "[runtime]") {
  SECTION("counts") {
    FailureRun run = runFailing(Mesh::parse("x=4"), 30s, [](Communicator& world) {
      std::vector<float> data(11, 1);
      world.allReduce(data.data(), world.rank() == 2 ? 11 : 10);
    });
    CHECK(run.thrownIsCommError);
    for (int rank = 0; rank < 4; ++rank) {
      INFO(run.rankErrors[rank]);
      CHECK_THAT(run.rankErrors[rank], Catch::Contains("ranks disagree"));
    }
    CHECK_THAT(run.rankErrors[0], Catch::Contains("group rank 0 called allReduce of 10 f32 (sum) "
                                                  "but group rank 2 called allReduce of 11 f32"));
  }
  SECTION("collectives") {
    FailureRun run = runFailing(Mesh::parse("x=2"), 30s, [](Communicator& world) {
      float value = 1;
      if (world.rank() == 0)
        world.barrier();
      else
        world.broadcast(&value, 1, 0);
    });
    CHECK_THAT(run.thrown, Catch::Contains("called barrier but group rank 1 called broadcast of 1 "
                                           "f32 from root 0") ||
                               Catch::Contains("called broadcast of 1 f32 from root 0 but group "
                                               "rank 0 called barrier"));
  }
  SECTION("dtypes and ops") {
    FailureRun run = runFailing(Mesh::parse("x=2"), 30s, [](Communicator& world) {
      float value = 1;
      world.allReduce(&value, 1, world.rank() == 0 ? ReduceOp::Sum : ReduceOp::Max);
    });
    CHECK_THAT(run.thrown, Catch::Contains("(sum)") && Catch::Contains("(max)"));
  }
  SECTION("permute pairs") {
    FailureRun run = runFailing(Mesh::parse("x=3"), 30s, [](Communicator& world) {
      float in = 1, out = 0;
      world.permute(&in, &out, 1, 0, world.rank() == 0 ? 2 : Communicator::kNoPeer);
    });
    CHECK_THAT(run.thrown, Catch::Contains("permute failed") &&
                               Catch::Contains("sends to rank 0, which receives from"));
  }
}

TEST_CASE("bad arguments are CommErrors that name the collective and rank", "[runtime]") {
  auto expectError = [](const std::function<void(Communicator&)>& call, const std::string& text) {
    FailureRun run = runFailing(Mesh::parse("x=2"), 30s, call);
    INFO(run.thrown);
    CHECK(run.thrownIsCommError);
    CHECK_THAT(run.thrown, Catch::Contains(text));
  };
  expectError(
      [](Communicator& comm) {
        unsigned char bytes[4] = {};
        comm.allReduceRaw(bytes, bytes, 4, DType::Bytes, ReduceOp::Sum);
      },
      "allReduce failed on world rank");
  expectError(
      [](Communicator& comm) {
        std::vector<float> data(8);
        comm.allReduce(data.data(), data.data() + 1, 4);
      },
      "input and output overlap");
  expectError(
      [](Communicator& comm) {
        std::vector<float> data(8);
        comm.reduceScatter(data.data(), data.data(), 4); // in place only on rank 0
      },
      "output overlaps the input other than as its chunk rank()");
  expectError(
      [](Communicator& comm) {
        float value = 0;
        comm.broadcast(&value, 1, 2);
      },
      "root 2 is not a rank of the group");
  expectError(
      [](Communicator& comm) {
        float value = 0, out = 0;
        comm.permute(&value, &out, 1, 5, Communicator::kNoPeer);
      },
      "peer 5 is not a rank of the group");
  expectError([](Communicator& comm) { comm.allGather<float>(nullptr, nullptr, 3); },
              "input is null");
  // A null buffer whose chunk the check would locate (UBSan: arithmetic on a null pointer).
  expectError(
      [](Communicator& comm) {
        float value = 0;
        comm.allGather<float>(&value, nullptr, 1);
      },
      "output is null");
  expectError(
      [](Communicator& comm) {
        float value = 0;
        comm.reduceScatter<float>(nullptr, &value, 1);
      },
      "input is null");
  try {
    runThreads(Mesh::parse("x=2"), [](Communicator& comm) {
      float value = 0;
      if (comm.rank() == 1) comm.broadcast(&value, 1, 7);
      comm.barrier();
    });
    FAIL("no error");
  } catch (const CommError& error) {
    CHECK(error.collective() == "broadcast");
    CHECK(error.worldRank() == 1);
  }
}

TEST_CASE("a failed world fails every later collective at once", "[runtime]") {
  FailureRun run = runFailing(Mesh::parse("x=2"), 30s, [](Communicator& world) {
    if (world.rank() == 0) throw std::runtime_error("first");
    std::this_thread::sleep_for(50ms);
    world.barrier();
  });
  CHECK(run.thrown == "first");
  CHECK_THAT(run.rankErrors[1], Catch::Contains("barrier failed on world rank 1") &&
                                    Catch::Contains("world rank 0 failed: first"));
}

TEST_CASE("groups run different collectives at the same time", "[runtime]") {
  // The two model rows of [data=2, model=4] make different calls concurrently; each column
  // then checks the rows' results against each other.
  Mesh mesh = Mesh::parse("data=2,model=4");
  RankLog log(mesh.size());
  runThreads(mesh, [&](Communicator& world) {
    Communicator& model = world.subgroup({"model"});
    Communicator& data = world.subgroup({"data"});
    int me = world.worldRank();
    for (int step = 0; step < 50; ++step) {
      if (world.coord("data") == 0) {
        checkAllGather<float>(model, log, 300);
        checkShifts<int32_t>(model, log, 17);
      } else {
        checkAllReduce<double>(model, log, 5000, ReduceOp::Min);
        checkReduceScatter<float>(model, log, 33);
        checkBroadcast<float>(model, log, 100);
      }
      int32_t mine = me, other = -1;
      data.shift(&mine, &other, 1, 1);
      if (other != (me + 4) % 8) log.fail(me, "column exchange after step " + std::to_string(step));
    }
  });
  log.check();
}

TEST_CASE("a mesh without axes is one rank", "[runtime]") {
  int calls = 0;
  runThreads(Mesh(), [&](Communicator& world) {
    ++calls;
    float value = 3;
    world.allReduce(&value, 1);
    world.barrier();
    CHECK(world.size() == 1);
    CHECK(value == 3);
    CHECK(world.subgroup({}).size() == 1);
  });
  CHECK(calls == 1);
}

TEST_CASE("a rank that throws something other than std::exception", "[runtime]") {
  FailureRun run;
  run.rankErrors.resize(2);
  try {
    runThreads(Mesh::parse("x=2"), [&](Communicator& world) {
      if (world.rank() == 0) throw 42;
      try {
        world.barrier();
      } catch (const CommError& error) {
        run.rankErrors[1] = error.what();
      }
    });
  } catch (int value) {
    run.thrown = std::to_string(value);
  }
  CHECK(run.thrown == "42");
  CHECK_THAT(run.rankErrors[1],
             Catch::Contains("world rank 0 failed: an exception that is not a std::exception"));
}

TEST_CASE("failures racing with collectives never leave a peer reading freed buffers",
          "[runtime]") {
  // One rank throws after a varying number of steps while the others run collectives on
  // buffers that die with their stack frames; the sanitizer builds would see a stale read.
  for (int trial = 0; trial < 24; ++trial) {
    INFO("trial " << trial);
    int thrower = trial % 4, throwAfter = trial * 7 % 13;
    FailureRun run = runFailing(Mesh::parse("x=4"), 30s, [&](Communicator& world) {
      for (int step = 0;; ++step) {
        if (world.rank() == thrower && step == throwAfter)
          throw std::runtime_error("trial failure");
        std::vector<float> in(20000 + step, 1.0f), out(in.size());
        if (step % 2)
          world.allReduce(in.data(), out.data(), in.size());
        else
          world.allGather(in.data(), std::vector<float>(4 * in.size()).data(), in.size());
      }
    });
    CHECK(run.thrown == "trial failure");
  }
}

// --- Started collectives -------------------------------------------------------------------------

namespace {

/// Starts an all-reduce (out of place and in place), a reduce-scatter and an all-gather on
/// `comm`, all in flight at once, then waits for them in the reverse order (waiting for the last
/// completes them all) and compares each with its blocking twin.
void checkStartedAgainstBlocking(Communicator& comm, RankLog& log, size_t count) {
  int me = comm.worldRank(), p = comm.size(), rank = comm.rank();
  std::vector<float> in = valuesOf<float>(me, count), out(count, -1.0f);
  std::vector<int32_t> inPlace = valuesOf<int32_t>(me, count);
  std::vector<float> scatterIn = valuesOf<float>(me, p * count), scattered(count, -1.0f);
  std::vector<double> gathered(p * count, -1.0);
  std::vector<double> gatherIn = valuesOf<double>(me, count);
  std::vector<Request> requests;
  requests.push_back(comm.startAllReduce(in.data(), out.data(), count));
  requests.push_back(comm.startAllReduce(inPlace.data(), count, ReduceOp::Max));
  requests.push_back(comm.startReduceScatter(scatterIn.data(), scattered.data(), count));
  requests.push_back(comm.startAllGather(gatherIn.data(), gathered.data(), count));
  comm.wait(requests.back());
  for (Request& request : requests)
    if (request.pending()) log.fail(me, label(comm, "a request before the last is still pending"));

  std::string what = label(comm, "started collectives of " + std::to_string(count));
  std::vector<float> wantSum(count);
  comm.allReduce(valuesOf<float>(me, count).data(), wantSum.data(), count);
  log.expectEqual(me, out, wantSum, what + ": allReduce");
  std::vector<int32_t> wantMax = valuesOf<int32_t>(me, count);
  comm.allReduce(wantMax.data(), count, ReduceOp::Max);
  log.expectEqual(me, inPlace, wantMax, what + ": allReduce in place (max)");
  log.expectEqual(me, scattered, expectedReduce<float>(comm, ReduceOp::Sum, count, rank * count),
                  what + ": reduceScatter");
  std::vector<double> wantGathered(p * count);
  comm.allGather(gatherIn.data(), wantGathered.data(), count);
  log.expectEqual(me, gathered, wantGathered, what + ": allGather");
}

} // namespace

TEST_CASE("started collectives equal the blocking ones, several in flight", "[runtime][async]") {
  std::string text = GENERATE("x=1", "x=2", "x=4", "a=2,b=4");
  Mesh mesh = Mesh::parse(text);
  INFO("mesh " << mesh.str());
  RankLog log(mesh.size());
  runThreads(mesh, [&](Communicator& world) {
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(300001)}) {
      checkStartedAgainstBlocking(world, log, count);
      for (const std::vector<std::string>& axes : groupShapes(mesh))
        checkStartedAgainstBlocking(world.subgroup(axes), log, count);
    }
  });
  log.check();
}

TEST_CASE("a bucket all-reduce overlaps other groups' work and more than a ring of requests",
          "[runtime][async]") {
  Mesh mesh = Mesh::parse("data=2,model=4");
  RankLog log(mesh.size());
  runThreads(mesh, [&](Communicator& world) {
    int me = world.worldRank();
    Communicator& data = world.subgroup({"data"});
    Communicator& model = world.subgroup({"model"});
    // A gradient bucket: buffers of several sizes (one empty), reduced over `data` while the
    // rank keeps running blocking collectives over `model` (the rest of backward).
    std::vector<size_t> sizes = {3, 0, 70000, 17, 1};
    std::vector<std::vector<float>> grads;
    std::vector<Segment<float>> bucket;
    for (size_t k = 0; k < sizes.size(); ++k)
      grads.push_back(valuesOf<float>(me, sizes[k], 100 * k));
    for (std::vector<float>& grad : grads)
      bucket.push_back({grad.data(), grad.size()});
    Request request = data.startAllReduce(bucket);
    int32_t steps = me;
    for (int step = 0; step < 20; ++step)
      model.allReduce(&steps, 1, ReduceOp::Max);
    // Progress, complete or not. Not a Catch assertion: Catch is not thread-safe (TSan found two
    // ranks writing its state); a throw fails the test through runThreads.
    request.test();
    data.wait(request);
    log.expectEqual(me, std::vector<int32_t>{steps}, std::vector<int32_t>{7 - 4 * (me < 4)},
                    "model max");
    for (size_t k = 0; k < sizes.size(); ++k)
      log.expectEqual(me, grads[k], expectedReduce<float>(data, ReduceOp::Sum, sizes[k], 100 * k),
                      "bucket buffer " + std::to_string(k));
    // Twice the ring of requests in flight; test() until the last completes.
    std::vector<int32_t> values(150);
    std::vector<Request> requests;
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = int32_t(i) * (me + 1);
      requests.push_back(world.startAllReduce(&values[i], 1));
    }
    while (!requests.back().test())
      std::this_thread::yield();
    for (size_t i = 0; i < values.size(); ++i)
      if (values[i] != int32_t(i) * 36) log.fail(me, "ring request " + std::to_string(i));
  });
  log.check();
}

TEST_CASE("a started collective that the ranks disagree on is an error at every wait",
          "[runtime][async]") {
  SECTION("collectives") {
    FailureRun run = runFailing(Mesh::parse("x=4"), 30s, [](Communicator& world) {
      std::vector<float> data(16, 1), gathered(64);
      Request request = world.rank() == 2 ? world.startAllGather(data.data(), gathered.data(), 16)
                                          : world.startAllReduce(data.data(), 16);
      world.wait(request);
    });
    CHECK(run.thrownIsCommError);
    for (int rank = 0; rank < 4; ++rank)
      CHECK_THAT(run.rankErrors[rank], Catch::Contains("ranks disagree"));
    CHECK_THAT(run.rankErrors[0],
               Catch::Contains("allReduce failed on world rank 0") &&
                   Catch::Contains("group rank 0 called started allReduce of 16 f32 (sum) but "
                                   "group rank 2 called started allGather of 16 f32"));
  }
  SECTION("started against blocking, and bucket layouts") {
    FailureRun blocking = runFailing(Mesh::parse("x=2"), 300ms, [](Communicator& world) {
      float value = 1;
      if (world.rank() == 0)
        world.allReduce(&value, 1);
      else
        world.startAllReduce(&value, 1).wait();
    });
    // They never meet: a timeout naming the other rank (whichever side times out first), which
    // waits in the other collective: a deadlock.
    CHECK_THAT(
        blocking.thrown,
        (Catch::Contains("timed out after 0.3 s waiting for world rank(s) 1, each waiting") ||
         Catch::Contains("timed out after 0.3 s waiting for world rank(s) 0, each waiting")) &&
            Catch::Contains("in another collective (a deadlock"));
    FailureRun bucket = runFailing(Mesh::parse("x=2"), 30s, [](Communicator& world) {
      std::vector<float> a(8), b(8);
      size_t split = world.rank() == 0 ? 3 : 5;
      world.startAllReduce({Segment<float>{a.data(), split}, {b.data(), 8 - split}}).wait();
    });
    CHECK_THAT(bucket.thrown, Catch::Contains("started allReduce of 2 buffers, 8 f32 (sum) with "
                                              "buffer 0 of"));
  }
}

TEST_CASE("a rank that never starts a collective is a timeout at the waiters", "[runtime][async]") {
  std::vector<double> startSeconds(4, -1);
  FailureRun run = runFailing(Mesh::parse("a=2,b=2"), 300ms, [&](Communicator& world) {
    if (world.worldRank() == 3) arriveAfterAFailure();
    std::vector<float> data(100, 1);
    auto begin = std::chrono::steady_clock::now();
    Request request = world.startAllReduce(data.data(), data.size());
    startSeconds[world.worldRank()] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    request.wait();
  });
  CHECK(run.thrownIsCommError);
  CHECK_THAT(run.thrown, Catch::Contains("allReduce failed on world rank") &&
                             Catch::Contains("timed out after 0.3 s waiting for world rank(s) 3 "
                                             "to start it"));
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank << ": " << run.rankErrors[rank]);
    CHECK(startSeconds[rank] < 0.25); // the start did not wait for the late rank
    CHECK_THAT(run.rankErrors[rank],
               Catch::Contains("allReduce failed on world rank " + std::to_string(rank)));
    CHECK(run.rankSeconds[rank] >= 0.29);
    CHECK(run.rankSeconds[rank] < 1.4);
  }
  CHECK_THAT(run.rankErrors[3], Catch::Contains("failed on world rank 3"));
}

TEST_CASE("a rank that throws with a request in flight still completes it", "[runtime][async]") {
  // Its Request's destructor finishes the collective during unwinding, so the peers' waits get
  // the right sums and their buffers are never read after they are gone; later calls fail.
  RankLog log(4);
  FailureRun run = runFailing(Mesh::parse("x=4"), 30s, [&](Communicator& world) {
    std::vector<float> grads(50000, float(world.rank() + 1));
    Request request = world.startAllReduce(grads.data(), grads.size());
    if (world.rank() == 1) throw std::runtime_error("boom in backward");
    request.wait();
    log.expectEqual(world.worldRank(), grads, std::vector<float>(grads.size(), 10.0f), "sum");
    world.barrier();
  });
  log.check();
  CHECK(run.thrown == "boom in backward");
  for (int rank : {0, 2, 3})
    CHECK_THAT(run.rankErrors[rank], Catch::Contains("world rank 1 failed: boom in backward"));
}

TEST_CASE("a rank stuck outside meshrt is abandoned after the timeout, never a frozen process",
          "[runtime]") {
  // Rank 2 never gets back into meshrt: the others time out, and runThreads returns the exit
  // grace later (the timeout, but at least 2 s, so that a rank merely descheduled on a loaded
  // machine is not abandoned; instead of joining rank 2 forever), naming it and the first failure.
  // The stuck rank touches only what it owns (runThreads keeps its copy of the program alive).
  auto release = std::make_shared<std::atomic<bool>>(false);
  auto released = std::make_shared<std::atomic<bool>>(false);
  std::string thrown;
  std::vector<int> abandoned;
  auto start = std::chrono::steady_clock::now();
  try {
    runThreads(
        Mesh::parse("x=4"),
        [release, released](Communicator& world) {
          if (world.rank() == 2) {
            while (!release->load())
              std::this_thread::sleep_for(1ms);
            released->store(true);
            return;
          }
          float value = 1;
          world.allReduce(&value, 1);
        },
        ThreadsOptions{300ms});
  } catch (const AbandonedRanksError& error) {
    thrown = error.what();
    abandoned = error.ranks();
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  release->store(true);
  CHECK(abandoned == std::vector<int>{2});
  CHECK_THAT(thrown, Catch::StartsWith("meshrt: world rank(s) 2 did not return within 2 s") &&
                         Catch::Contains("abandoned") &&
                         Catch::Contains("waiting for world rank(s) 2 (MESHRT_TIMEOUT_S"));
  CHECK(seconds >= 2.29); // the timeout, then the 2 s grace for the stuck rank to return
  // The abandoned thread ends on its own once released.
  while (!released->load())
    std::this_thread::sleep_for(1ms);
}

TEST_CASE("a timeout names the rank that is really missing, not a rank waiting for it",
          "[runtime]") {
  // Rank 3 never arrives. Rank 1 first waits for it in their 'a' subgroup, then would join the
  // world barrier; ranks 0 and 2 wait at the world barrier from the start, so their deadlines
  // pass first, while both 1 and 3 are missing there. The culprit is 3 alone, every time.
  for (int repetition = 0; repetition < 6; ++repetition) {
    FailureRun run = runFailing(Mesh::parse("a=2,b=2"), 300ms, [](Communicator& world) {
      if (world.worldRank() == 3) arriveAfterAFailure();
      if (world.worldRank() == 1) {
        std::this_thread::sleep_for(50ms);
        world.subgroup({"a"}).barrier();
      }
      world.barrier();
    });
    INFO("repetition " << repetition << ": " << run.thrown);
    CHECK_THAT(
        run.thrown,
        Catch::Contains("waiting for world rank(s) 3 (world rank(s) 1 wait for them in other "
                        "collectives)") ||
            Catch::Contains("of group [a=2]): timed out after 0.3 s waiting for world "
                            "rank(s) 3 ("));
    for (const std::string& error : run.rankErrors)
      CHECK_THAT(error, !Catch::Contains("waiting for world rank(s) 1"));
  }
}

TEST_CASE("a started collective's timeout names the rank that never started it",
          "[runtime][async]") {
  // The same with started collectives: rank 1 waits for 3 in a started all-reduce on their 'a'
  // subgroup, ranks 0 and 2 in a started world all-reduce.
  for (int repetition = 0; repetition < 3; ++repetition) {
    FailureRun run = runFailing(Mesh::parse("a=2,b=2"), 300ms, [](Communicator& world) {
      float value = 1;
      if (world.worldRank() == 3) arriveAfterAFailure();
      if (world.worldRank() == 1) {
        std::this_thread::sleep_for(50ms);
        world.subgroup({"a"}).startAllReduce(&value, 1).wait();
      }
      world.startAllReduce(&value, 1).wait();
    });
    INFO("repetition " << repetition << ": " << run.thrown);
    CHECK_THAT(run.thrown, Catch::Contains("waiting for world rank(s) 3 "));
    for (const std::string& error : run.rankErrors)
      CHECK_THAT(error, !Catch::Contains("waiting for world rank(s) 1"));
  }
}
