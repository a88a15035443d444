// meshrt's MPI backend, run by ctest under `mpirun -np 4`: every process runs the same test cases
// in the same order, each as one rank. Every collective on the world ([x=4] and [a=2, b=2]) and on
// subgroups with exact expected values, in place and out of place; the agreement checks (ranks
// that disagree get a CommError on every rank, and the communicator stays usable); argument errors;
// point-to-point send / recv (rings, chains, started, in order, and their errors); and a world
// whose size is not the mesh's.
#define CATCH_CONFIG_RUNNER
#include "meshrt/Mpi.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

using namespace meshrt;

namespace {

constexpr int kWorld = 4;
const char* const kMeshes[] = {"x=4", "a=2,b=2"};

/// A value that differs per rank and element, exact in f32.
template <class T> T valueOf(int rank, size_t i) {
  return T(int(rank * 1000 + int(i % 997)) - 300);
}

/// Every group of the world communicator of `meshText`: the world, and on the 2-D mesh each
/// axis alone and both axes in either order.
std::vector<Communicator*> groupsOf(Communicator& world) {
  std::vector<Communicator*> groups{&world};
  if (world.mesh().numAxes() == 2) {
    groups.push_back(&world.subgroup({"a"}));
    groups.push_back(&world.subgroup({"b"}));
    groups.push_back(&world.subgroup({"b", "a"}));
  }
  return groups;
}

/// Runs `body` for every mesh and every group, with the agreement check (then MPI's blocking
/// collectives) and without it (then its nonblocking ones, polled).
template <class Body> void forEachGroup(Body body) {
  for (bool checked : {true, false})
    for (const char* meshText : kMeshes) {
      MpiOptions options;
      options.checkAgreement = checked;
      std::unique_ptr<Communicator> world = mpiWorld(Mesh::parse(meshText), options);
      for (Communicator* group : groupsOf(*world)) {
        INFO("mesh " << meshText << ", group " << group->mesh().str() << ", world rank "
                     << world->worldRank() << (checked ? "" : ", unchecked"));
        body(*group);
      }
    }
}

} // namespace

TEST_CASE("MPI world: identity and subgroups") {
  std::unique_ptr<Communicator> world = mpiWorld(Mesh::parse("a=2,b=2"));
  CHECK(std::string(world->backend()) == "mpi");
  CHECK(world->size() == kWorld);
  CHECK(world->rank() == world->worldRank());
  CHECK(world->coords() == Mesh::parse("a=2,b=2").coords(world->rank()));
  Communicator& b = world->subgroup({"b"});
  CHECK(&b == &world->subgroup({"b"})); // cached
  CHECK(b.size() == 2);
  CHECK(b.rank() == world->coord("b"));
  CHECK(b.worldRankOf(0) == world->rank() - world->coord("b"));
  Communicator& ba = world->subgroup({"b", "a"});
  CHECK(ba.mesh().str() == "[b=2, a=2]");
  CHECK(ba.rank() == world->coord("b") * 2 + world->coord("a"));
  for (int q = 0; q < 4; ++q)
    CHECK(ba.worldRankOf(q) == (q % 2) * 2 + q / 2);
  CHECK(&world->subgroup({"a", "b"}) == world.get());
  CHECK(&ba.subgroup({"a"}) == &world->subgroup({"a"}));
  CHECK(world->subgroup(std::vector<std::string>{}).size() == 1);
  CHECK_THROWS_AS(world->subgroup({"c"}), std::invalid_argument);
  CHECK_THROWS_AS(world->subgroup({"a", "a"}), std::invalid_argument);
}

TEST_CASE("MPI allReduce: sum, max, min; f32, f64, i32; in place; small and large") {
  forEachGroup([](Communicator& group) {
    for (size_t count : {size_t(1), size_t(37), size_t(300000)}) {
      INFO("count " << count);
      std::vector<float> in(count), out(count, -1.0f);
      for (size_t i = 0; i < count; ++i)
        in[i] = valueOf<float>(group.rank(), i);
      group.allReduce(in.data(), out.data(), count);
      std::vector<double> inD(count), outD(count);
      for (size_t i = 0; i < count; ++i)
        inD[i] = valueOf<double>(group.rank(), i);
      group.allReduce(inD.data(), outD.data(), count, ReduceOp::Max);
      std::vector<int32_t> inPlace(count);
      for (size_t i = 0; i < count; ++i)
        inPlace[i] = valueOf<int32_t>(group.rank(), i);
      group.allReduce(inPlace.data(), count, ReduceOp::Min);
      size_t firstWrong = count; // the first element that is not exact
      for (size_t i = 0; i < count && firstWrong == count; ++i) {
        float sum = 0;
        double max = -1e30;
        int32_t min = INT32_MAX;
        for (int q = 0; q < group.size(); ++q) {
          sum += valueOf<float>(q, i);
          max = std::max(max, valueOf<double>(q, i));
          min = std::min(min, valueOf<int32_t>(q, i));
        }
        if (out[i] != sum || outD[i] != max || inPlace[i] != min) firstWrong = i;
      }
      CHECK(firstWrong == count);
    }
  });
}

TEST_CASE("MPI reduceScatter, allGather, allToAll: out of place and in place") {
  forEachGroup([](Communicator& group) {
    int p = group.size(), r = group.rank();
    size_t n = 5;
    std::vector<float> in(p * n);
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = valueOf<float>(r, i);
    std::vector<float> out(n), want(n, 0.0f);
    for (size_t i = 0; i < n; ++i)
      for (int q = 0; q < p; ++q)
        want[i] += valueOf<float>(q, r * n + i);
    group.reduceScatter(in.data(), out.data(), n);
    CHECK(out == want);
    std::vector<float> inPlace = in;
    group.reduceScatter(inPlace.data(), inPlace.data() + r * n, n);
    CHECK(std::vector<float>(inPlace.begin() + r * n, inPlace.begin() + (r + 1) * n) == want);

    std::vector<int32_t> mine(n), gathered(p * n), wantGathered(p * n);
    for (size_t i = 0; i < n; ++i)
      mine[i] = valueOf<int32_t>(r, i);
    for (int q = 0; q < p; ++q)
      for (size_t i = 0; i < n; ++i)
        wantGathered[q * n + i] = valueOf<int32_t>(q, i);
    group.allGather(mine.data(), gathered.data(), n);
    CHECK(gathered == wantGathered);
    std::vector<int32_t> gatheredInPlace(p * n, -7);
    std::copy(mine.begin(), mine.end(), gatheredInPlace.begin() + r * n);
    group.allGather(gatheredInPlace.data() + r * n, gatheredInPlace.data(), n);
    CHECK(gatheredInPlace == wantGathered);

    std::vector<double> send(p * n), received(p * n), wantReceived(p * n);
    for (size_t i = 0; i < send.size(); ++i)
      send[i] = valueOf<double>(r, i);
    for (int q = 0; q < p; ++q)
      for (size_t i = 0; i < n; ++i)
        wantReceived[q * n + i] = valueOf<double>(q, r * n + i);
    group.allToAll(send.data(), received.data(), n);
    CHECK(received == wantReceived);
  });
}

TEST_CASE("MPI permute, shift, broadcast, barrier") {
  forEachGroup([](Communicator& group) {
    int p = group.size(), r = group.rank();
    size_t n = 6;
    std::vector<float> in(n), out(n);
    for (size_t i = 0; i < n; ++i)
      in[i] = valueOf<float>(r, i);
    auto expectFrom = [&](int source) {
      std::vector<float> want(n, 0.0f);
      if (source != Communicator::kNoPeer)
        for (size_t i = 0; i < n; ++i)
          want[i] = valueOf<float>(source, i);
      return want;
    };
    // Reversal: rank r sends to p-1-r.
    group.permute(in.data(), out.data(), n, p - 1 - r, p - 1 - r);
    CHECK(out == expectFrom(p - 1 - r));
    for (int offset : {1, -1, 2}) {
      INFO("offset " << offset);
      group.shift(in.data(), out.data(), n, offset, Boundary::Wrap);
      CHECK(out == expectFrom(((r - offset) % p + p) % p));
      group.shift(in.data(), out.data(), n, offset, Boundary::Zero);
      int source = r - offset;
      CHECK(out == expectFrom(source >= 0 && source < p ? source : Communicator::kNoPeer));
    }
    for (int root = 0; root < p; ++root) {
      std::vector<int32_t> data(n, r == root ? 40 + root : -1);
      group.broadcast(data.data(), n, root);
      CHECK(data == std::vector<int32_t>(n, 40 + root));
    }
    group.barrier();
  });
}

TEST_CASE("MPI ranks that disagree get a CommError on every rank, then carry on") {
  std::unique_ptr<Communicator> world = mpiWorld(Mesh::parse("a=2,b=2"));
  int r = world->rank();
  std::vector<float> data(16, 1.0f);
  // World rank 2 passes a different count: every rank throws, naming both calls.
  try {
    world->allReduce(data.data(), r == 2 ? 11 : 10);
    FAIL("no CommError");
  } catch (const CommError& error) {
    CHECK(error.collective() == "allReduce");
    CHECK(error.worldRank() == r);
    CHECK_THAT(error.what(), Catch::Contains("ranks disagree") &&
                                 Catch::Contains("allReduce of 11 f32 (sum)") &&
                                 Catch::Contains("MPI backend"));
  }
  // Different collectives on one subgroup.
  Communicator& b = world->subgroup({"b"});
  try {
    if (b.rank() == 0)
      b.broadcast(data.data(), 4, 0);
    else
      b.allGather(data.data(), data.data() + 4, 4);
    FAIL("no CommError");
  } catch (const CommError& error) {
    CHECK_THAT(error.what(),
               Catch::Contains("ranks disagree") && Catch::Contains("of group [b=2]"));
  }
  // Permute pairs that do not match: rank 0 sends to 1, which receives from nobody.
  try {
    std::vector<float> out(4);
    int sendTo = r == 0 ? 1 : Communicator::kNoPeer;
    world->permute(data.data(), out.data(), 4, sendTo, Communicator::kNoPeer);
    FAIL("no CommError");
  } catch (const CommError& error) {
    CHECK_THAT(error.what(), Catch::Contains("group rank 0 sends to rank 1, which receives from "
                                             "nobody"));
  }
  // The checks ran before any data moved: the communicator still works.
  std::vector<float> ones(3, 1.0f);
  world->allReduce(ones.data(), 3);
  CHECK(ones == std::vector<float>(3, 4.0f));
}

TEST_CASE("MPI started collectives: several in flight, equal to the blocking ones; a bucket") {
  forEachGroup([](Communicator& group) {
    int p = group.size(), r = group.rank();
    for (size_t n : {size_t(0), size_t(5), size_t(70001)}) {
      INFO("count " << n);
      std::vector<float> in(p * n), sum(n, -1.0f), inPlace(n), scattered(n, -1.0f);
      for (size_t i = 0; i < in.size(); ++i)
        in[i] = valueOf<float>(r, i);
      std::copy(in.begin(), in.begin() + n, inPlace.begin());
      std::vector<int32_t> mine(n), gathered(p * n, -7);
      for (size_t i = 0; i < n; ++i)
        mine[i] = valueOf<int32_t>(r, i);
      std::vector<float> scatteredInPlace = in;
      std::vector<Request> requests;
      requests.push_back(group.startAllReduce(in.data(), sum.data(), n));
      requests.push_back(group.startAllReduce(inPlace.data(), n, ReduceOp::Max));
      requests.push_back(group.startReduceScatter(in.data(), scattered.data(), n));
      requests.push_back(group.startReduceScatter(
          scatteredInPlace.data(), scatteredInPlace.data() + r * n, n, ReduceOp::Min));
      requests.push_back(group.startAllGather(mine.data(), gathered.data(), n));
      requests.front().test(); // progress, whether or not it has completed
      group.wait(requests.back());
      for (const Request& request : requests)
        CHECK_FALSE(request.pending());

      std::vector<float> want(n);
      group.allReduce(in.data(), want.data(), n);
      CHECK(sum == want);
      group.allReduce(in.data(), want.data(), n, ReduceOp::Max);
      CHECK(inPlace == want);
      group.reduceScatter(in.data(), want.data(), n);
      CHECK(scattered == want);
      group.reduceScatter(in.data(), want.data(), n, ReduceOp::Min);
      CHECK(std::vector<float>(scatteredInPlace.begin() + r * n,
                               scatteredInPlace.begin() + (r + 1) * n) == want);
      std::vector<int32_t> wantGathered(p * n);
      group.allGather(mine.data(), wantGathered.data(), n);
      CHECK(gathered == wantGathered);
    }
    // A bucket of buffers (one empty), reduced as one collective, then each checked.
    std::vector<std::vector<double>> grads = {std::vector<double>(3), {}, std::vector<double>(999)};
    for (size_t k = 0; k < grads.size(); ++k)
      for (size_t i = 0; i < grads[k].size(); ++i)
        grads[k][i] = valueOf<double>(r, 10 * k + i);
    Request bucket = group.startAllReduce<double>(
        {{grads[0].data(), 3}, {grads[1].data(), 0}, {grads[2].data(), 999}});
    while (!bucket.test()) {
    }
    for (size_t k = 0; k < grads.size(); ++k)
      for (size_t i = 0; i < grads[k].size(); ++i) {
        double want = 0;
        for (int q = 0; q < p; ++q)
          want += valueOf<double>(q, 10 * k + i);
        if (grads[k][i] != want) FAIL("bucket buffer " << k << " element " << i);
      }
  });
}

TEST_CASE("MPI started collectives that disagree: a CommError at every wait, then carry on") {
  std::unique_ptr<Communicator> world = mpiWorld(Mesh::parse("x=4"));
  int r = world->rank();
  std::vector<float> data(16, 1.0f), gathered(64);
  Request request = r == 2 ? world->startAllGather(data.data(), gathered.data(), 16)
                           : world->startAllReduce(data.data(), 16);
  try {
    world->wait(request);
    FAIL("no CommError");
  } catch (const CommError& error) {
    CHECK(error.collective() == (r == 2 ? "allGather" : "allReduce"));
    CHECK_THAT(error.what(), Catch::Contains("ranks disagree") && Catch::Contains("MPI backend") &&
                                 Catch::Contains("started allGather of 16 f32"));
  }
  CHECK_FALSE(request.pending());
  // Buckets of the same total whose buffers differ.
  size_t split = r == 0 ? 3 : 5;
  Request bucket =
      world->startAllReduce<float>({{data.data(), split}, {data.data() + 8, 8 - split}});
  CHECK_THROWS_WITH(bucket.wait(), Catch::Contains("the buffers' counts differ"));
  // The data never reached MPI: the communicator still works, started or blocking.
  std::vector<float> ones(3, 1.0f);
  world->startAllReduce(ones.data(), 3).wait();
  world->allReduce(ones.data(), 3);
  CHECK(ones == std::vector<float>(3, 16.0f));
}

TEST_CASE("MPI started collective that a rank starts too late: a timeout at the waiters") {
  // Without the agreement check (the data collective itself is late): ranks 0-2 time out; rank
  // 3 starts it after that and completes with their contributions (MPI keeps them).
  MpiOptions options;
  options.checkAgreement = false;
  options.timeout = std::chrono::milliseconds(500);
  std::unique_ptr<Communicator> sync = mpiWorld(Mesh::parse("x=4"));
  std::unique_ptr<Communicator> world = mpiWorld(Mesh::parse("x=4"), options);
  int r = world->rank();
  std::vector<float> data(8, 1.0f);
  if (r != 3) {
    Request request = world->startAllReduce(data.data(), data.size());
    auto begin = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(world->wait(request),
                      Catch::Contains("allReduce failed on world rank " + std::to_string(r)) &&
                          Catch::Contains("timed out after 0.5 s"));
    CHECK(std::chrono::steady_clock::now() - begin >= std::chrono::milliseconds(490));
  }
  sync->barrier();
  if (r == 3) {
    world->startAllReduce(data.data(), data.size()).wait();
    CHECK(data == std::vector<float>(8, 4.0f));
  }
  sync->barrier(); // ranks 0-2 keep `data` alive until rank 3 has it
}

TEST_CASE("MPI argument errors are CommErrors naming the collective and the rank") {
  std::unique_ptr<Communicator> world = mpiWorld(Mesh::parse("x=4"));
  std::vector<float> data(8);
  try {
    world->allReduceRaw(data.data(), data.data(), 8, DType::Bytes, ReduceOp::Sum);
    FAIL("no CommError");
  } catch (const CommError& error) {
    CHECK_THAT(error.what(),
               Catch::Contains("allReduce failed on world rank " + std::to_string(world->rank())) &&
                   Catch::Contains("bytes cannot be reduced"));
  }
  CHECK_THROWS_WITH(world->allToAll(data.data(), data.data() + 1, 1),
                    Catch::Contains("allToAll has no in-place form"));
  CHECK_THROWS_WITH(world->broadcast(data.data(), 1, 4), Catch::Contains("root 4 is not a rank"));
  world->barrier();
}

/// Distinct per sender, round and element (exact in every dtype).
template <class T> std::vector<T> messageOf(int from, int round, size_t count) {
  std::vector<T> values(count);
  for (size_t i = 0; i < count; ++i)
    values[i] = T((from * 1000 + round * 100 + int(i % 97)) % 127);
  return values;
}

template <class T> void checkRing(Communicator& comm, int direction) {
  int p = comm.size(), r = comm.rank();
  int to = (r + direction + p) % p, from = (r - direction + p) % p;
  for (size_t count : {size_t(3), size_t(100000)}) { // eager and rendezvous sizes
    std::vector<T> mine = messageOf<T>(r, 0, count), got(count);
    if (r % 2 == 0) {
      comm.send(mine.data(), count, to);
      comm.recv(got.data(), count, from);
    } else {
      comm.recv(got.data(), count, from);
      comm.send(mine.data(), count, to);
    }
    CHECK(got == messageOf<T>(from, 0, count));
  }
}

TEST_CASE("MPI send / recv: rings both ways, every dtype, on the world and on subgroups") {
  forEachGroup([](Communicator& group) {
    if (group.size() == 1) return;
    for (int direction : {1, -1}) {
      checkRing<float>(group, direction);
      checkRing<double>(group, direction);
      checkRing<int32_t>(group, direction);
      checkRing<unsigned char>(group, direction);
    }
  });
}

TEST_CASE("MPI sendRecv along a chain; started sends and recvs with a started all-reduce") {
  std::unique_ptr<Communicator> world = mpiWorld(Mesh::parse("stage=4"));
  int p = world->size(), r = world->rank();
  int next = r + 1 < p ? r + 1 : Communicator::kNoPeer;
  int previous = r > 0 ? r - 1 : Communicator::kNoPeer;
  const size_t count = 50000;
  std::vector<double> activations = messageOf<double>(r, 1, count), fromBehind(count, -1);
  world->sendRecv(activations.data(), count, next, fromBehind.data(), count, previous);
  CHECK(fromBehind == (previous == Communicator::kNoPeer ? std::vector<double>(count, -1)
                                                         : messageOf<double>(previous, 1, count)));
  // A ring of started sends and recvs: every rank waits for its send first.
  int ringNext = (r + 1) % p, ringPrevious = (r + p - 1) % p;
  std::vector<float> mine = messageOf<float>(r, 2, count), got(count), sum(10, float(r + 1));
  Request out = world->startSend(mine.data(), count, ringNext);
  Request reduce = world->startAllReduce(sum.data(), sum.size());
  Request in = world->startRecv(got.data(), count, ringPrevious);
  world->wait(out);
  while (!in.test()) {
  }
  CHECK_FALSE(reduce.pending());
  CHECK(got == messageOf<float>(ringPrevious, 2, count));
  CHECK(sum == std::vector<float>(10, float(p * (p + 1) / 2)));
  // Several messages from one rank arrive in order.
  if (r == 0) {
    std::vector<std::vector<int32_t>> messages;
    for (int round = 0; round < 3; ++round)
      messages.push_back(messageOf<int32_t>(0, round, 40));
    std::vector<Request> sends;
    for (const auto& message : messages)
      sends.push_back(world->startSend(message.data(), 40, 1));
    world->wait(sends.back());
  } else if (r == 1) {
    for (int round = 0; round < 3; ++round) {
      std::vector<int32_t> message(40);
      world->recv(message.data(), 40, 0);
      CHECK(message == messageOf<int32_t>(0, round, 40));
    }
  }
  world->barrier();
}

TEST_CASE("MPI send / recv errors: sizes and dtypes that disagree, bad peers, no sender") {
  std::unique_ptr<Communicator> world = mpiWorld(Mesh::parse("x=4"));
  int r = world->rank();
  std::vector<float> data(16, 1.0f);
  // The receiver sees the mismatch (it probes the message first) and can then take it.
  if (r == 0) world->send(data.data(), 8, 1);
  if (r == 1) {
    CHECK_THROWS_WITH(world->recv(data.data(), 16, 0),
                      Catch::Contains("recv failed on world rank 1") &&
                          Catch::Contains("group rank 0 sent 8 f32 but group rank 1 expects 16 "
                                          "f32"));
    std::vector<int32_t> integers(8);
    CHECK_THROWS_WITH(world->recv(integers.data(), 8, 0),
                      Catch::Contains("group rank 0 sent 8 f32 but group rank 1 expects 8 i32"));
    world->recv(data.data(), 8, 0);
  }
  CHECK_THROWS_WITH(world->send(data.data(), 1, r), Catch::Contains("is this rank itself"));
  CHECK_THROWS_WITH(world->recv(data.data(), 1, 4),
                    Catch::Contains("recv failed on world rank " + std::to_string(r)) &&
                        Catch::Contains("peer 4 is not a rank of the group"));
  world->barrier();
  // A recv whose sender never sends: a timeout naming both ranks.
  MpiOptions shortWait;
  shortWait.timeout = std::chrono::milliseconds(500);
  std::unique_ptr<Communicator> impatient = mpiWorld(Mesh::parse("x=4"), shortWait);
  if (r == 2)
    CHECK_THROWS_WITH(impatient->recv(data.data(), 4, 1),
                      Catch::Contains("recv failed on world rank 2") &&
                          Catch::Contains("recv of 4 f32 from group rank 1: timed out after "
                                          "0.5 s: group rank 1 (world rank 1) sent nothing"));
  world->barrier();
}

TEST_CASE("MPI world whose size is not the mesh's: a CommError on every process") {
  for (const char* meshText : {"x=3", "a=2,b=4"}) {
    Mesh mesh = Mesh::parse(meshText);
    try {
      mpiWorld(mesh);
      FAIL("no CommError");
    } catch (const CommError& error) {
      CHECK_THAT(error.what(),
                 Catch::Contains("the MPI world has 4 process(es) but the mesh " + mesh.str() +
                                 " has " + std::to_string(mesh.size()) + " ranks") &&
                     Catch::Contains("mpirun -np " + std::to_string(mesh.size())));
    }
  }
}

int main(int argc, char** argv) {
  initMpi(); // finalized at exit
  return Catch::Session().run(argc, argv);
}
