// meshrt checkpoints: save and load time of a model on [data=2, model=2] against the floor of the
// same I/O (each rank writes its bytes to one file and fsyncs it; reads them back with pread),
// side by side in one run; then loads resharded on [4] and [1]. Usage: bench_checkpoint [dir]
// [MiB] (default: a fresh directory under /tmp, 256 MiB of f32 params).
#include "meshrt/Checkpoint.h"
#include "meshrt/Threads.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Model {
  std::vector<std::vector<float>> buffers;
  std::vector<meshrt::CheckpointTensor> tensors;
};

/// Eight matrices [rows, cols] with rows split over `rowAxes` and cols over `colAxes`.
Model makeModel(const meshrt::Mesh& mesh, int rank, int64_t rows, int64_t cols,
                const std::vector<std::string>& rowAxes, const std::vector<std::string>& colAxes) {
  Model model;
  for (int k = 0; k < 8; ++k) {
    meshrt::CheckpointTensor tensor{"layer" + std::to_string(k) + "/w",
                                    "f32",
                                    meshrt::DType::F32,
                                    {{"rows", rows, rowAxes}, {"cols", cols, colAxes}}};
    meshrt::ShardBox box = meshrt::shardOf(mesh, rank, tensor.dims, tensor.name);
    model.buffers.emplace_back(size_t(box.shape[0] * box.shape[1]), float(k) + 0.5f);
    tensor.count = model.buffers.back().size();
    model.tensors.push_back(tensor);
  }
  for (size_t k = 0; k < model.tensors.size(); ++k)
    model.tensors[k].data = model.buffers[k].data();
  return model;
}

double seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// The slowest rank's time of `body` on `mesh` (best of `repeats`).
template <class Body> double timed(const meshrt::Mesh& mesh, int repeats, Body body) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    std::vector<double> perRank(size_t(mesh.size()));
    meshrt::runThreads(mesh, [&](meshrt::Communicator& world) {
      world.barrier();
      auto start = Clock::now();
      body(world);
      world.barrier();
      perRank[size_t(world.rank())] = seconds(start);
    });
    best = std::min(best, *std::max_element(perRank.begin(), perRank.end()));
  }
  return best;
}

} // namespace

int main(int argc, char** argv) {
  fs::path dir =
      argc > 1 ? fs::path(argv[1])
               : fs::temp_directory_path() / ("meshrt-bench-ckpt-" + std::to_string(::getpid()));
  int64_t mib = argc > 2 ? std::atoll(argv[2]) : 256;
  int64_t cols = 1024, rows = mib * 1024 * 1024 / 4 / 8 / cols;
  double bytes = double(rows * cols * 8 * 4);
  fs::remove_all(dir);
  fs::create_directories(dir / "raw");
  meshrt::Mesh grid = meshrt::Mesh::parse("data=2,model=2");
  const int repeats = 3;

  double rawWrite = timed(grid, repeats, [&](meshrt::Communicator& world) {
    Model model = makeModel(grid, world.rank(), rows, cols, {"data"}, {"model"});
    std::string path = (dir / "raw" / std::to_string(world.rank())).string();
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (const auto& buffer : model.buffers)
      if (::write(fd, buffer.data(), buffer.size() * 4) < 0) std::abort();
    ::fsync(fd);
    ::close(fd);
  });
  double rawRead = timed(grid, repeats, [&](meshrt::Communicator& world) {
    Model model = makeModel(grid, world.rank(), rows, cols, {"data"}, {"model"});
    std::string path = (dir / "raw" / std::to_string(world.rank())).string();
    int fd = ::open(path.c_str(), O_RDONLY);
    off_t offset = 0;
    for (auto& buffer : model.buffers) {
      if (::pread(fd, buffer.data(), buffer.size() * 4, offset) < 0) std::abort();
      offset += off_t(buffer.size() * 4);
    }
    ::close(fd);
  });
  double save = timed(grid, repeats, [&](meshrt::Communicator& world) {
    Model model = makeModel(grid, world.rank(), rows, cols, {"data"}, {"model"});
    meshrt::saveCheckpoint(world, (dir / "ckpt").string(), model.tensors, {1, {}}, {1});
  });
  double load = timed(grid, repeats, [&](meshrt::Communicator& world) {
    Model model = makeModel(grid, world.rank(), rows, cols, {"data"}, {"model"});
    meshrt::loadCheckpoint(world, (dir / "ckpt").string(), model.tensors);
  });
  meshrt::Mesh line = meshrt::Mesh::parse("x=4"), one = meshrt::Mesh::parse("x=1");
  double load4 = timed(line, repeats, [&](meshrt::Communicator& world) {
    Model model = makeModel(line, world.rank(), rows, cols, {}, {"x"});
    meshrt::loadCheckpoint(world, (dir / "ckpt").string(), model.tensors);
  });
  double load1 = timed(one, repeats, [&](meshrt::Communicator& world) {
    Model model = makeModel(one, world.rank(), rows, cols, {}, {});
    meshrt::loadCheckpoint(world, (dir / "ckpt").string(), model.tensors);
  });
  double crcStart = 0;
  {
    std::vector<unsigned char> block(64 << 20, 1);
    auto start = Clock::now();
    volatile uint32_t crc = meshrt::crc32(block.data(), block.size());
    (void)crc;
    crcStart = double(block.size()) / seconds(start) / 1e9;
  }
  fs::remove_all(dir);

  auto gbs = [&](double s) { return bytes / s / 1e9; };
  std::printf("checkpoint of %.0f MiB (8 f32 matrices %lld x %lld) in %s, best of %d, slowest "
              "rank; page cache warm\n",
              bytes / (1 << 20), (long long)rows, (long long)cols, dir.c_str(), repeats);
  std::printf("%-44s %9s %8s %s\n", "", "s", "GB/s", "vs raw I/O");
  std::printf("%-44s %9.3f %8.2f\n", "raw write+fsync, 4 ranks [2,2]", rawWrite, gbs(rawWrite));
  std::printf("%-44s %9.3f %8.2f %.2fx\n", "saveCheckpoint on [2,2]", save, gbs(save),
              rawWrite / save);
  std::printf("%-44s %9.3f %8.2f\n", "raw pread, 4 ranks [2,2]", rawRead, gbs(rawRead));
  std::printf("%-44s %9.3f %8.2f %.2fx\n", "loadCheckpoint on [2,2] (same layout)", load, gbs(load),
              rawRead / load);
  std::printf("%-44s %9.3f %8.2f %.2fx\n", "loadCheckpoint on [4] (resharded)", load4, gbs(load4),
              rawRead / load4);
  std::printf("%-44s %9.3f %8.2f %.2fx\n", "loadCheckpoint on [1] (one rank reads all)", load1,
              gbs(load1), rawRead / load1);
  std::printf("crc32: %.2f GB/s on one thread\n", crcStart);
  return 0;
}
