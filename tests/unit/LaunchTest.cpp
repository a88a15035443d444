// meshrt::launch's choice of backend: the command line, MESHRT_BACKEND, detection of mpirun,
// and a threads launch (the MPI side runs under mpirun: MpiCommTest.cpp, MpiFailureProbe.cpp).
#include "meshrt/Launch.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

using namespace meshrt;

namespace {

/// Sets (or, with nullptr, unsets) an environment variable for one scope.
class ScopedEnv {
public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      old_ = old;
      hadOld_ = true;
    }
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (hadOld_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

private:
  std::string name_, old_;
  bool hadOld_ = false;
};

/// Parses `args` (argv[0] first) and returns the options and what remains of argv.
std::pair<LaunchOptions, std::vector<std::string>> parse(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& arg : args)
    argv.push_back(arg.data());
  argv.push_back(nullptr);
  int argc = int(args.size());
  LaunchOptions options = LaunchOptions::fromArgs(argc, argv.data());
  return {options, std::vector<std::string>(argv.begin(), argv.begin() + argc)};
}

} // namespace

TEST_CASE("launch: the backend from the environment") {
  ScopedEnv backend("MESHRT_BACKEND", nullptr), ompi("OMPI_COMM_WORLD_SIZE", nullptr),
      pmi("PMI_SIZE", nullptr);
  CHECK(LaunchOptions::defaultBackend() == Backend::Threads);
  {
    ScopedEnv underMpirun("OMPI_COMM_WORLD_SIZE", "4");
    CHECK(LaunchOptions::defaultBackend() == Backend::Mpi);
    ScopedEnv forced("MESHRT_BACKEND", "threads");
    CHECK(LaunchOptions::defaultBackend() == Backend::Threads);
  }
  {
    ScopedEnv underPmi("PMI_SIZE", "2");
    CHECK(LaunchOptions::defaultBackend() == Backend::Mpi);
  }
  ScopedEnv bad("MESHRT_BACKEND", "nccl");
  CHECK_THROWS_WITH(LaunchOptions::defaultBackend(),
                    "meshrt: unknown backend 'nccl' (expected threads or mpi)");
}

TEST_CASE("launch: --backend on the command line wins and is removed from argv") {
  ScopedEnv backend("MESHRT_BACKEND", "mpi");
  auto [options, rest] = parse({"prog", "out.bin", "--backend", "threads", "7"});
  CHECK(options.backend == Backend::Threads);
  CHECK(rest == std::vector<std::string>{"prog", "out.bin", "7"});
  auto [equals, restEquals] = parse({"prog", "--backend=mpi", "out.bin"});
  CHECK(equals.backend == Backend::Mpi);
  CHECK(restEquals == std::vector<std::string>{"prog", "out.bin"});
  auto [fromEnv, restEnv] = parse({"prog", "out.bin"});
  CHECK(fromEnv.backend == Backend::Mpi);
  CHECK(restEnv.size() == 2);
  CHECK_THROWS_WITH(parse({"prog", "--backend", "gpu"}), Catch::Contains("unknown backend 'gpu'"));
  CHECK_THROWS_WITH(parse({"prog", "--backend"}), Catch::Contains("--backend needs"));
  CHECK(std::string(backendName(Backend::Mpi)) == "mpi");
  CHECK(parseBackend("threads") == Backend::Threads);
}

TEST_CASE("launch: threads run every rank in this process, which leads") {
  LaunchOptions options;
  options.backend = Backend::Threads;
  std::atomic<int> ranks{0};
  std::atomic<int> backendsOk{0};
  bool lead = launch(Mesh::parse("a=2,b=3"), options, [&](Communicator& world) {
    ranks.fetch_add(1);
    if (std::string(world.backend()) == "threads") backendsOk.fetch_add(1);
    int value = world.rank();
    world.allReduce(&value, 1);
    if (value != 15) throw std::runtime_error("wrong sum");
  });
  CHECK(lead);
  CHECK(ranks == 6);
  CHECK(backendsOk == 6);
  CHECK_THROWS_WITH(launch(Mesh::parse("x=2"), options,
                           [](Communicator& world) {
                             if (world.rank() == 1) throw std::runtime_error("boom");
                           }),
                    "boom");
}
