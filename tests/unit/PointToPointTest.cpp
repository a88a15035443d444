// Point-to-point send / recv on the threads backend (Comm.h, "Point-to-point"): rings on 4 ranks
// in both directions and both call orders, several messages in order, sendRecv along a pipeline
// chain, started sends and recvs (alone, together around a ring, with a started collective,
// test()), waits that keep the rank's other started work moving, a subgroup, every dtype; and the
// errors: mismatched counts and dtypes on both ranks, a peer out of range or this rank itself, a
// sender that never sends (naming both ranks, and the rank that really holds it up), a receiver
// that never receives, a peer that finished the program. And the waits' strategy: how long a rank
// with a core of its own yields before it sleeps (MESHRT_YIELD_US), and an exchange that is the
// same whether its waits yield or sleep.
#include "ThreadsState.h"
#include "meshrt/Threads.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>

using namespace meshrt;
using namespace std::chrono_literals;

namespace {

/// Failures seen on the rank threads, checked on the main thread (Catch2 is not thread-safe).
class RankLog {
public:
  void expect(bool condition, int rank, const std::string& what) {
    if (condition) return;
    std::lock_guard<std::mutex> lock(mutex_);
    failures_.push_back("world rank " + std::to_string(rank) + ": " + what);
  }
  void check() const {
    for (const std::string& failure : failures_)
      FAIL_CHECK(failure);
  }

private:
  std::mutex mutex_;
  std::vector<std::string> failures_;
};

/// The message `from` sends in round `round`: distinct per sender, round and element.
template <class T> std::vector<T> messageOf(int from, int round, size_t count) {
  std::vector<T> values(count);
  for (size_t i = 0; i < count; ++i)
    values[i] = T((from * 1000 + round * 100 + int(i % 97)) % 127);
  return values;
}

template <class T> void checkRing(Communicator& comm, RankLog& log, int direction) {
  int p = comm.size(), r = comm.rank();
  int to = (r + direction + p) % p, from = (r - direction + p) % p;
  const size_t count = 1000;
  std::vector<T> mine = messageOf<T>(r, 0, count), got(count);
  // Blocking sends wait for their receivers: even ranks send first, odd ranks receive first.
  if (r % 2 == 0) {
    comm.send(mine.data(), count, to);
    comm.recv(got.data(), count, from);
  } else {
    comm.recv(got.data(), count, from);
    comm.send(mine.data(), count, to);
  }
  log.expect(got == messageOf<T>(from, 0, count), comm.worldRank(),
             std::string("ring ") + (direction > 0 ? "forward" : "backward"));
}

struct FailureRun {
  std::vector<std::string> rankErrors;
  std::vector<double> rankSeconds;
  std::string thrown;
};

std::atomic<int> rankFailures{0};

/// Returns once another rank has failed (at most 30 s later): a rank that is late on purpose.
void arriveAfterAFailure() {
  auto limit = std::chrono::steady_clock::now() + 30s;
  while (rankFailures.load() == 0 && std::chrono::steady_clock::now() < limit)
    std::this_thread::sleep_for(1ms);
}

FailureRun runFailing(const Mesh& mesh, std::chrono::milliseconds timeout,
                      const std::function<void(Communicator&)>& program) {
  rankFailures.store(0);
  FailureRun run;
  run.rankErrors.resize(size_t(mesh.size()));
  run.rankSeconds.resize(size_t(mesh.size()), -1);
  auto start = std::chrono::steady_clock::now();
  try {
    runThreads(
        mesh,
        [&](Communicator& world) {
          try {
            program(world);
          } catch (const CommError& error) {
            rankFailures.fetch_add(1);
            run.rankErrors[size_t(world.worldRank())] = error.what();
            run.rankSeconds[size_t(world.worldRank())] =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            throw;
          }
        },
        ThreadsOptions{timeout});
  } catch (const std::exception& error) {
    run.thrown = error.what();
  }
  return run;
}

} // namespace

TEST_CASE("send / recv around a ring of 4 ranks, both directions, every dtype", "[runtime][p2p]") {
  RankLog log;
  runThreads(Mesh::parse("stage=4"), [&](Communicator& world) {
    for (int direction : {1, -1}) {
      checkRing<float>(world, log, direction);
      checkRing<double>(world, log, direction);
      checkRing<int32_t>(world, log, direction);
      checkRing<unsigned char>(world, log, direction);
    }
  });
  log.check();
}

TEST_CASE("messages from one rank arrive in the order they were sent", "[runtime][p2p]") {
  RankLog log;
  runThreads(Mesh::parse("x=2"), [&](Communicator& world) {
    const size_t count = 64;
    if (world.rank() == 0) {
      // Started, so that all three are posted before the receiver takes any.
      std::vector<std::vector<float>> messages;
      for (int round = 0; round < 3; ++round)
        messages.push_back(messageOf<float>(0, round, count));
      std::vector<Request> sends;
      for (const auto& message : messages)
        sends.push_back(world.startSend(message.data(), count, 1));
      world.wait(sends.back());
      for (const Request& send : sends)
        log.expect(!send.pending(), 0, "waiting for the last send completes the earlier ones");
    } else {
      for (int round = 0; round < 3; ++round) {
        std::vector<float> got(count);
        world.recv(got.data(), count, 0);
        log.expect(got == messageOf<float>(0, round, count), 1,
                   "message " + std::to_string(round) + " in order");
      }
    }
  });
  log.check();
}

TEST_CASE("sendRecv along a pipeline chain: forward and backward, no peer at the ends",
          "[runtime][p2p]") {
  RankLog log;
  runThreads(Mesh::parse("stage=4"), [&](Communicator& world) {
    int p = world.size(), r = world.rank();
    int next = r + 1 < p ? r + 1 : Communicator::kNoPeer;
    int previous = r > 0 ? r - 1 : Communicator::kNoPeer;
    const size_t count = 300;
    std::vector<double> activations = messageOf<double>(r, 1, count), fromBehind(count, -1);
    // Forward: activations to the next stage, from the previous one.
    world.sendRecv(activations.data(), count, next, fromBehind.data(), count, previous);
    if (previous != Communicator::kNoPeer)
      log.expect(fromBehind == messageOf<double>(previous, 1, count), r, "forward activations");
    else
      log.expect(fromBehind == std::vector<double>(count, -1), r, "the first stage receives none");
    // Backward: gradients to the previous stage, from the next one.
    std::vector<double> gradients = messageOf<double>(r, 2, count), fromAhead(count, -1);
    world.sendRecv(gradients.data(), count, previous, fromAhead.data(), count, next);
    if (next != Communicator::kNoPeer)
      log.expect(fromAhead == messageOf<double>(next, 2, count), r, "backward gradients");
  });
  log.check();
}

TEST_CASE("started sends and recvs: around a ring, with a started all-reduce, test() and wait",
          "[runtime][p2p][async]") {
  RankLog log;
  runThreads(Mesh::parse("stage=4"), [&](Communicator& world) {
    int p = world.size(), r = world.rank(), next = (r + 1) % p, previous = (r + p - 1) % p;
    const size_t count = 5000;
    std::vector<float> mine = messageOf<float>(r, 3, count), got(count), back(count);
    std::vector<float> sum(100, float(r + 1));
    // Every rank starts its send first and waits for it first: the wait matches the started
    // recv meanwhile, so the ring cannot deadlock.
    Request out = world.startSend(mine.data(), count, next);
    Request reduce = world.startAllReduce(sum.data(), sum.size());
    Request in = world.startRecv(got.data(), count, previous);
    world.wait(out);
    log.expect(!out.pending(), r, "the send completed");
    while (!in.test()) {
    }
    log.expect(!reduce.pending(), r, "test() of a later request completes the all-reduce");
    log.expect(got == messageOf<float>(previous, 3, count), r, "started ring forward");
    log.expect(sum == std::vector<float>(100, float(p * (p + 1) / 2)), r, "the all-reduce");
    // The other way, with the recv started first and the send blocking.
    Request backIn = world.startRecv(back.data(), count, next);
    world.send(mine.data(), count, previous);
    world.wait(backIn);
    log.expect(back == messageOf<float>(next, 3, count), r, "started recv, blocking send");
  });
  log.check();
}

TEST_CASE("a rank waiting for a peer keeps its other started work moving",
          "[runtime][p2p][async]") {
  RankLog log;
  runThreads(Mesh::parse("x=2"), [&](Communicator& world) {
    std::vector<float> sum(64, float(world.rank() + 1)), message(32, 7.0f), got(32);
    if (world.rank() == 0) {
      // Waits for the all-reduce while rank 1's blocking send waits for the started recv.
      Request reduce = world.startAllReduce(sum.data(), sum.size());
      Request in = world.startRecv(got.data(), got.size(), 1);
      world.wait(reduce);
      world.wait(in);
    } else {
      world.send(message.data(), message.size(), 0);
      world.startAllReduce(sum.data(), sum.size()).wait();
    }
    log.expect(sum == std::vector<float>(64, 3.0f), world.rank(), "the all-reduce");
    // Rank 1 waits for rank 0's share of a started all-reduce while rank 0 waits in a recv.
    Request again = world.startAllReduce(sum.data(), sum.size());
    if (world.rank() == 0) {
      world.recv(got.data(), got.size(), 1);
      world.wait(again);
    } else {
      world.wait(again);
      world.send(message.data(), message.size(), 0);
    }
    log.expect(sum == std::vector<float>(64, 6.0f), world.rank(), "the second all-reduce");
    if (world.rank() == 0) log.expect(got == message, 0, "the message");
  });
  log.check();
}

TEST_CASE("send / recv inside a subgroup use group ranks", "[runtime][p2p]") {
  RankLog log;
  runThreads(Mesh::parse("data=2,stage=2"), [&](Communicator& world) {
    Communicator& stages = world.subgroup({"stage"});
    std::vector<int32_t> value{world.worldRank()}, got{-1};
    if (stages.rank() == 0)
      stages.send(value.data(), 1, 1);
    else
      stages.recv(got.data(), 1, 0);
    if (stages.rank() == 1)
      log.expect(got[0] == stages.worldRankOf(0), world.worldRank(),
                 "received from group rank 0 of its own stage group");
  });
  log.check();
}

TEST_CASE("a send and recv that disagree on the count or dtype fail on both ranks",
          "[runtime][p2p]") {
  FailureRun count = runFailing(Mesh::parse("x=2"), 30s, [](Communicator& world) {
    std::vector<float> data(16, 1);
    if (world.rank() == 0)
      world.send(data.data(), 8, 1);
    else
      world.recv(data.data(), 16, 0);
  });
  for (int rank = 0; rank < 2; ++rank) {
    INFO(count.rankErrors[size_t(rank)]);
    CHECK_THAT(count.rankErrors[size_t(rank)],
               Catch::Contains("failed on world rank " + std::to_string(rank)) &&
                   Catch::Contains("group rank 0 sent 8 f32 but group rank 1 expects 16 f32"));
  }
  FailureRun dtype = runFailing(Mesh::parse("x=2"), 30s, [](Communicator& world) {
    std::vector<float> single(4, 1);
    std::vector<int32_t> integers(4, 1);
    if (world.rank() == 1)
      world.send(single.data(), 4, 0);
    else
      world.recv(integers.data(), 4, 1);
  });
  INFO(dtype.rankErrors[0]);
  CHECK_THAT(dtype.rankErrors[0], Catch::Contains("recv failed on world rank 0") &&
                                      Catch::Contains("group rank 1 sent 4 f32 but group rank 0 "
                                                      "expects 4 i32"));
}

TEST_CASE("a peer outside the group or this rank itself is an error", "[runtime][p2p]") {
  for (int peer : {5, -2, 0}) {
    FailureRun run = runFailing(Mesh::parse("x=2"), 30s, [peer](Communicator& world) {
      std::vector<float> data(4);
      if (world.rank() == 0) world.send(data.data(), 4, peer);
    });
    INFO(run.rankErrors[0]);
    CHECK_THAT(run.rankErrors[0],
               Catch::Contains("send failed on world rank 0") &&
                   Catch::Contains(peer == 0 ? "peer 0 is this rank itself"
                                             : "peer " + std::to_string(peer) +
                                                   " is not a rank of the group"));
  }
}

TEST_CASE("a recv whose sender never sends fails naming both ranks, no hang", "[runtime][p2p]") {
  FailureRun run = runFailing(Mesh::parse("stage=4"), 300ms, [](Communicator& world) {
    std::vector<float> data(4);
    if (world.rank() == 2) world.recv(data.data(), 4, 1);
    if (world.rank() == 1) arriveAfterAFailure();
  });
  INFO(run.rankErrors[2]);
  CHECK_THAT(run.rankErrors[2],
             Catch::Contains("recv failed on world rank 2") &&
                 Catch::Contains("recv of 4 f32 from group rank 1: nothing was sent: timed out "
                                 "after 0.3 s waiting for world rank(s) 1 to post the matching "
                                 "send"));
  CHECK(run.rankSeconds[2] >= 0.29);
  CHECK(run.rankSeconds[2] < 5);
}

TEST_CASE("a timeout names the rank that really holds a chain of recvs up", "[runtime][p2p]") {
  // Stage 3 waits for stage 2, which waits for stage 1, which is stuck elsewhere.
  FailureRun run = runFailing(Mesh::parse("stage=4"), 300ms, [](Communicator& world) {
    std::vector<float> data(4);
    int r = world.rank();
    if (r == 1) arriveAfterAFailure();
    if (r >= 2) world.recv(data.data(), 4, r - 1);
  });
  std::string first = run.rankErrors[2].empty() ? run.rankErrors[3] : run.rankErrors[2];
  INFO(run.rankErrors[2] << "\n" << run.rankErrors[3]);
  CHECK_THAT(run.thrown, Catch::Contains("waiting for world rank(s) 1"));
  CHECK_THAT(first, Catch::Contains("waiting for world rank(s) 1"));
}

TEST_CASE("a send nobody receives fails after the timeout; a finished peer fails it at once",
          "[runtime][p2p]") {
  FailureRun unreceived = runFailing(Mesh::parse("x=2"), 300ms, [](Communicator& world) {
    std::vector<float> data(4);
    if (world.rank() == 0) world.send(data.data(), 4, 1);
    if (world.rank() == 1) arriveAfterAFailure();
  });
  INFO(unreceived.rankErrors[0]);
  CHECK_THAT(unreceived.rankErrors[0],
             Catch::Contains("send failed on world rank 0") &&
                 Catch::Contains("send of 4 f32 to group rank 1: nobody received it: timed out "
                                 "after 0.3 s waiting for world rank(s) 1"));
  // Rank 0 finishes without sending: rank 1's recv fails long before its 30 s timeout.
  FailureRun finished = runFailing(Mesh::parse("x=2"), 30s, [](Communicator& world) {
    std::vector<float> data(4);
    if (world.rank() == 1) world.recv(data.data(), 4, 0);
  });
  INFO(finished.rankErrors[1]);
  CHECK_THAT(finished.rankErrors[1],
             Catch::Contains("recv failed on world rank 1") &&
                 Catch::Contains("group rank 0 (world rank 0) finished the program without "
                                 "sending to it"));
  CHECK(finished.rankSeconds[1] < 10);
}

namespace {

/// Sets an environment variable for a scope (the runtime reads MESHRT_YIELD_US when a world
/// starts), restoring its former value.
class ScopedEnv {
public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
  const char* name_;
  std::optional<std::string> old_;
};

} // namespace

TEST_CASE("a waiter with a core of its own yields for MESHRT_YIELD_US, then sleeps",
          "[runtime][p2p][wait]") {
  using detail::WorldState;
  {
    ScopedEnv unset("MESHRT_YIELD_US", nullptr);
    CHECK(detail::yieldBudget() == std::chrono::microseconds(0));
  }
  {
    ScopedEnv set("MESHRT_YIELD_US", "1500");
    CHECK(detail::yieldBudget() == std::chrono::microseconds(1500));
    // One rank per core at most: the budget applies. More ranks than cores: no yields at all
    // (a yielding rank would keep its core from the peer it waits for).
    WorldState own(Mesh::parse("x=1"), 1s);
    CHECK(own.yieldFor == std::chrono::microseconds(1500));
    WorldState crowded(Mesh({{"x", usableCores() + 1}}), 1s);
    CHECK(crowded.yieldFor == std::chrono::microseconds(0));
    CHECK(crowded.yields == 0);
    CHECK_FALSE(crowded.keepYielding(0, detail::Clock::now()));
  }
  for (const char* ignored : {"", "-5", "12ms", "x"}) {
    ScopedEnv set("MESHRT_YIELD_US", ignored);
    INFO("MESHRT_YIELD_US='" << ignored << "'");
    CHECK(detail::yieldBudget() == std::chrono::microseconds(0));
  }
  {
    ScopedEnv off("MESHRT_YIELD_US", "0");
    CHECK(detail::yieldBudget() == std::chrono::microseconds(0));
  }
  // The first `yields` always; then only within the budget, counted from the first yield.
  WorldState world(Mesh::parse("x=1"), 1s);
  world.yields = 3;
  world.yieldFor = std::chrono::hours(1);
  auto now = detail::Clock::now();
  CHECK(world.keepYielding(0, now - std::chrono::hours(2)));
  CHECK(world.keepYielding(2, now - std::chrono::hours(2)));
  // A real-time thread (chrt) yields only the first `yields` times; the tests run as ordinary
  // threads, but say so either way.
  CHECK(world.keepYielding(3, now) == !detail::realTimeThread());
  CHECK_FALSE(world.keepYielding(3, now - std::chrono::hours(2)));
  world.yieldFor = std::chrono::microseconds(0);
  CHECK_FALSE(world.keepYielding(3, now));
}

TEST_CASE("a two-stage GPipe exchange completes alike whether its waits yield or sleep",
          "[runtime][p2p][wait]") {
  // A budget no wait here reaches (the waits only yield), and none (they sleep after the few
  // yields): blocking and started sends and recvs, a blocking and a started all-reduce, with the
  // first stage late on purpose so that the second's waits get past their spins.
  for (const char* budget : {"3600000000", "0"}) {
    ScopedEnv set("MESHRT_YIELD_US", budget);
    RankLog log;
    const int microbatches = 4;
    const size_t count = 257;
    runThreads(Mesh::parse("stage=2"), [&](Communicator& world) {
      int r = world.rank();
      std::vector<std::vector<float>> activations(microbatches, std::vector<float>(count));
      std::vector<Request> sends;
      for (int mb = 0; mb < microbatches; ++mb) {
        if (r == 0) {
          std::this_thread::sleep_for(2ms);
          activations[size_t(mb)] = messageOf<float>(0, mb, count);
          sends.push_back(world.startSend(activations[size_t(mb)].data(), count, 1));
        } else {
          world.recv(activations[size_t(mb)].data(), count, 0);
          log.expect(activations[size_t(mb)] == messageOf<float>(0, mb, count), r,
                     "forward activations of microbatch " + std::to_string(mb));
        }
      }
      std::vector<float> gradient(count);
      for (int mb = microbatches - 1; mb >= 0; --mb) {
        if (r == 1) {
          gradient = messageOf<float>(1, mb, count);
          world.send(gradient.data(), count, 0);
        } else {
          std::this_thread::sleep_for(1ms);
          world.recv(gradient.data(), count, 1);
          log.expect(gradient == messageOf<float>(1, mb, count), r,
                     "backward gradients of microbatch " + std::to_string(mb));
        }
      }
      for (Request& send : sends)
        world.wait(send);
      std::vector<float> norm{float(r + 1)}, loss{float(10 * (r + 1))};
      Request started = world.startAllReduce(loss.data(), 1);
      world.allReduce(norm.data(), 1);
      world.wait(started);
      log.expect(norm[0] == 3.0f && loss[0] == 30.0f, r, "the all-reduces");
    });
    INFO("MESHRT_YIELD_US=" << budget);
    log.check();
  }
}
