// meshrt's checkpoints on the threads backend: round trips, resharding on load (a [2,2] save
// loaded on [4] and [1] under other layouts), checksums, incomplete saves, the errors a load
// reports, and a process killed (SIGKILL) in the middle of a save.
#include "meshrt/Checkpoint.h"
#include "meshrt/Threads.h"

#include <catch2/catch.hpp>
#include <zlib.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace meshrt;
namespace fs = std::filesystem;

namespace {

/// A tensor of the test model: name and global dims.
struct Spec {
  std::string name;
  std::vector<std::pair<std::string, int64_t>> dims;
};

/// Three tensors: a matrix, a vector and a scalar (an optimizer-state-like name included).
const std::vector<Spec> kModel = {
    {"layer/w", {{"rows", 8}, {"cols", 12}}},
    {"layer/w@m", {{"rows", 8}, {"cols", 12}}},
    {"layer/b", {{"cols", 12}}},
    {"scale", {}},
};

/// A layout: dim name -> mesh axes.
using Layout = std::map<std::string, std::vector<std::string>>;

/// The global value of element `index` of tensor `name` at `step`: distinct bit patterns.
float valueAt(int64_t step, const std::string& name, int64_t index) {
  uint32_t h = uint32_t(std::hash<std::string>{}(name)) ^ uint32_t(step * 0x9E3779B9u);
  h ^= uint32_t(index) * 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return float(h % 100000) / 977.0f - 50.0f;
}

/// One rank's shards of `specs` under `layout` on its mesh.
struct RankState {
  std::vector<std::vector<float>> buffers;
  std::vector<ShardBox> boxes;
  std::vector<CheckpointTensor> tensors;
};

RankState makeState(const Mesh& mesh, int rank, const Layout& layout,
                    const std::vector<Spec>& specs) {
  RankState state;
  for (const Spec& spec : specs) {
    CheckpointTensor tensor;
    tensor.name = spec.name;
    tensor.dtype = "f32";
    for (const auto& [dim, size] : spec.dims) {
      auto axes = layout.find(dim);
      tensor.dims.push_back(
          {dim, size, axes == layout.end() ? std::vector<std::string>{} : axes->second});
    }
    state.boxes.push_back(shardOf(mesh, rank, tensor.dims, tensor.name));
    size_t count = 1;
    for (int64_t size : state.boxes.back().shape)
      count *= size_t(size);
    state.buffers.emplace_back(count, -1.0f);
    tensor.count = count;
    state.tensors.push_back(tensor);
  }
  for (size_t t = 0; t < specs.size(); ++t)
    state.tensors[t].data = state.buffers[t].data();
  return state;
}

/// Calls fn(local index, global index) for every element of a shard.
template <class Fn>
void forEachElement(const ShardBox& box, const CheckpointTensor& tensor, Fn fn) {
  size_t count = 1;
  for (int64_t size : box.shape)
    count *= size_t(size);
  for (size_t local = 0; local < count; ++local) {
    int64_t rest = int64_t(local), global = 0, globalStride = 1;
    for (size_t d = box.shape.size(); d-- > 0;) {
      int64_t coordinate = rest % box.shape[d] + box.start[d];
      rest /= box.shape[d];
      global += coordinate * globalStride;
      globalStride *= tensor.dims[d].size;
    }
    fn(local, global);
  }
}

void fill(RankState& state, int64_t step) {
  for (size_t t = 0; t < state.tensors.size(); ++t)
    forEachElement(state.boxes[t], state.tensors[t], [&](size_t local, int64_t global) {
      state.buffers[t][local] = valueAt(step, state.tensors[t].name, global);
    });
}

/// "" if every element holds the value of `step` bit for bit, else the first difference.
std::string mismatch(const RankState& state, int64_t step) {
  for (size_t t = 0; t < state.tensors.size(); ++t) {
    std::string error;
    forEachElement(state.boxes[t], state.tensors[t], [&](size_t local, int64_t global) {
      float want = valueAt(step, state.tensors[t].name, global);
      if (error.empty() && std::memcmp(&state.buffers[t][local], &want, sizeof want) != 0)
        error = state.tensors[t].name + "[" + std::to_string(global) +
                "] = " + std::to_string(state.buffers[t][local]) + ", expected " +
                std::to_string(want);
    });
    if (!error.empty()) return error;
  }
  return "";
}

/// Errors from rank threads, checked on the main thread (Catch2 is not thread-safe).
struct Failures {
  std::mutex mutex;
  std::vector<std::string> messages;
  void add(int rank, const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex);
    messages.push_back("rank " + std::to_string(rank) + ": " + message);
  }
  void check() {
    for (const std::string& message : messages)
      FAIL_CHECK(message);
  }
};

/// A fresh directory under the system's temporary directory.
fs::path freshDirectory(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("meshrt-ckpt-test-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  return dir;
}

void save(const Mesh& mesh, const Layout& layout, const fs::path& dir, int64_t step,
          const std::vector<Spec>& specs = kModel, const CheckpointSaveOptions& options = {}) {
  runThreads(mesh, [&](Communicator& world) {
    RankState state = makeState(world.mesh(), world.rank(), layout, specs);
    fill(state, step);
    saveCheckpoint(world, dir.string(), state.tensors, {step, {{"seed", "7"}, {"program", "test"}}},
                   options);
  });
}

/// Loads on `mesh` under `layout` and checks every rank's shards hold the values of `step`.
void loadAndCheck(const Mesh& mesh, const Layout& layout, const fs::path& dir, int64_t step) {
  Failures failures;
  runThreads(mesh, [&](Communicator& world) {
    RankState state = makeState(world.mesh(), world.rank(), layout, kModel);
    CheckpointInfo info = loadCheckpoint(world, dir.string(), state.tensors);
    if (info.step != step)
      failures.add(world.rank(),
                   "step " + std::to_string(info.step) + ", expected " + std::to_string(step));
    if (info.metadata["seed"] != "7" || info.metadata["program"] != "test")
      failures.add(world.rank(), "metadata lost");
    if (std::string error = mismatch(state, step); !error.empty())
      failures.add(world.rank(), error);
  });
  failures.check();
}

const Mesh kMesh2x2 = Mesh::parse("data=2,model=2");
const Layout kLayout2x2 = {{"rows", {"data"}}, {"cols", {"model"}}};

/// The message of the CheckpointError `body` throws ("" if none).
template <class Fn> std::string errorOf(Fn body) {
  try {
    body();
  } catch (const CheckpointError& error) {
    return error.what();
  }
  return "";
}

std::string loadError(const Mesh& mesh, const Layout& layout, const fs::path& dir,
                      const std::vector<Spec>& specs = kModel) {
  return errorOf([&] {
    runThreads(mesh, [&](Communicator& world) {
      RankState state = makeState(world.mesh(), world.rank(), layout, specs);
      loadCheckpoint(world, dir.string(), state.tensors);
    });
  });
}

} // namespace

TEST_CASE("crc32 is zlib's CRC-32", "[checkpoint]") {
  CHECK(crc32("123456789", 9) == 0xCBF43926u);
  std::mt19937 random(1);
  std::vector<unsigned char> bytes(100003);
  for (unsigned char& byte : bytes)
    byte = static_cast<unsigned char>(random());
  CHECK(crc32(bytes.data(), bytes.size()) == ::crc32(0, bytes.data(), uInt(bytes.size())));
  uint32_t split = crc32(bytes.data() + 1000, bytes.size() - 1000, crc32(bytes.data(), 1000));
  CHECK(split == crc32(bytes.data(), bytes.size()));
}

TEST_CASE("shardOf follows the planner's layouts", "[checkpoint]") {
  std::vector<CheckpointDim> dims = {{"rows", 8, {"data"}}, {"cols", 12, {"model", "data"}}};
  // rank 3 of [data=2, model=2] has coordinates (1, 1): cols block 1*2+1 = 3 of 4.
  ShardBox box = shardOf(kMesh2x2, 3, dims, "t");
  CHECK(box.start == std::vector<int64_t>{4, 9});
  CHECK(box.shape == std::vector<int64_t>{4, 3});
  dims[0].size = 7;
  CHECK_THROWS_WITH(shardOf(kMesh2x2, 0, dims, "t"),
                    Catch::Contains("dim 'rows' of size 7 does not split evenly"));
  dims[0] = {"rows", 8, {"nope"}};
  CHECK_THROWS_WITH(shardOf(kMesh2x2, 0, dims, "t"), Catch::Contains("axis 'nope'"));
}

TEST_CASE("checkpoint round trip on the same mesh", "[checkpoint]") {
  fs::path dir = freshDirectory("roundtrip");
  save(kMesh2x2, kLayout2x2, dir, 5);
  // The layout on disk: one file per rank that owns shards, the manifest, the latest pointer.
  CHECK(fs::exists(dir / "ckpt-000001" / "manifest.json"));
  CHECK(fs::exists(dir / "ckpt-000001" / "rank-00000.bin"));
  CHECK(fs::exists(dir / "ckpt-000001" / "rank-00003.bin"));
  std::ifstream latest(dir / "latest");
  std::string pointer;
  latest >> pointer;
  CHECK(pointer == "ckpt-000001");
  // Only the shards' owners wrote: 2 x (8x12) + 12 + 1 floats in all, no replica twice.
  uintmax_t bytes = 0;
  for (const auto& entry : fs::directory_iterator(dir / "ckpt-000001"))
    if (entry.path().extension() == ".bin") bytes += entry.file_size();
  CHECK(bytes == (2 * 96 + 12 + 1) * sizeof(float));
  loadAndCheck(kMesh2x2, kLayout2x2, dir, 5);
  // A second save is a new checkpoint, and the newest loads.
  save(kMesh2x2, kLayout2x2, dir, 6);
  loadAndCheck(kMesh2x2, kLayout2x2, dir, 6);
  fs::remove_all(dir);
}

TEST_CASE("a [2,2] checkpoint loads on [4] and [1] under other layouts", "[checkpoint]") {
  fs::path dir = freshDirectory("reshard");
  save(kMesh2x2, kLayout2x2, dir, 3);
  // [4]: the columns split 4 ways, the rows whole (each new shard reads two old ones).
  loadAndCheck(Mesh::parse("x=4"), {{"cols", {"x"}}}, dir, 3);
  // [4]: the rows split 4 ways, which cuts every old shard in two.
  loadAndCheck(Mesh::parse("x=4"), {{"rows", {"x"}}, {"cols", {}}}, dir, 3);
  // [1]: everything whole, read from all four files.
  loadAndCheck(Mesh::parse("x=1"), {}, dir, 3);
  loadAndCheck(Mesh(), {}, dir, 3);
  // Back onto [2,2] with the axes swapped and a dim split over both axes.
  loadAndCheck(kMesh2x2, {{"rows", {"model"}}, {"cols", {"model", "data"}}}, dir, 3);
  fs::remove_all(dir);
}

TEST_CASE("a corrupted shard is a checksum error naming tensor, rank and file", "[checkpoint]") {
  fs::path dir = freshDirectory("corrupt");
  save(kMesh2x2, kLayout2x2, dir, 1);
  fs::path file = dir / "ckpt-000001" / "rank-00001.bin";
  {
    std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
    stream.seekp(5);
    stream.put('\x7f');
  }
  std::string error = loadError(Mesh::parse("x=1"), {}, dir);
  CHECK_THAT(error, Catch::Contains("tensor 'layer/w'") && Catch::Contains("checksum mismatch") &&
                        Catch::Contains("saved by rank 1") && Catch::Contains(file.string()));
  // The same from the saving mesh: every rank throws the same error.
  CHECK_THAT(loadError(kMesh2x2, kLayout2x2, dir),
             Catch::Contains("tensor 'layer/w'") && Catch::Contains("checksum mismatch") &&
                 Catch::Contains("saved by rank 1") && Catch::Contains(file.string()));
  fs::remove_all(dir);
}

TEST_CASE("a save without its manifest is ignored: the previous checkpoint loads", "[checkpoint]") {
  fs::path dir = freshDirectory("incomplete");
  save(kMesh2x2, kLayout2x2, dir, 10);
  save(kMesh2x2, kLayout2x2, dir, 20);
  // A crash before the manifest of a third save: its shards are there, its manifest is not (a
  // torn one, a temporary file never renamed, at most), and `latest` still names the second.
  fs::create_directory(dir / "ckpt-000003");
  fs::copy_file(dir / "ckpt-000002" / "rank-00000.bin", dir / "ckpt-000003" / "rank-00000.bin");
  std::ofstream(dir / "ckpt-000003" / "manifest.json.tmp") << "{\"format\": \"meshrt-chec";
  loadAndCheck(Mesh::parse("x=4"), {{"cols", {"x"}}}, dir, 20);
  // Without `latest` (a first save cut short before it), the newest complete one loads.
  fs::remove(dir / "latest");
  loadAndCheck(kMesh2x2, kLayout2x2, dir, 20);
  // The next save does not reuse the incomplete directory.
  save(kMesh2x2, kLayout2x2, dir, 30);
  CHECK(fs::exists(dir / "ckpt-000004" / "manifest.json"));
  loadAndCheck(kMesh2x2, kLayout2x2, dir, 30);
  // keep = 1 deletes the older checkpoints after a save.
  save(kMesh2x2, kLayout2x2, dir, 40, kModel, {1});
  CHECK(!fs::exists(dir / "ckpt-000001"));
  CHECK(!fs::exists(dir / "ckpt-000003"));
  CHECK(!fs::exists(dir / "ckpt-000004"));
  loadAndCheck(kMesh2x2, kLayout2x2, dir, 40);
  fs::remove_all(dir);
}

TEST_CASE("a latest checkpoint whose manifest does not verify is an error naming the file",
          "[checkpoint]") {
  fs::path dir = freshDirectory("corrupt-latest");
  save(kMesh2x2, kLayout2x2, dir, 2);
  save(kMesh2x2, kLayout2x2, dir, 4);
  // `latest` is written after the manifest is durable, so a truncated manifest it names is
  // corruption: never a silent resume from step 2.
  fs::path manifest = dir / "ckpt-000002" / "manifest.json";
  fs::resize_file(manifest, fs::file_size(manifest) / 2);
  CHECK_THAT(loadError(kMesh2x2, kLayout2x2, dir),
             Catch::Contains("names ckpt-000002, but its manifest '" + manifest.string() +
                             "' is missing or does not parse") &&
                 Catch::Contains("MESHRT_CHECKPOINT_FALLBACK=1"));
  fs::remove(manifest);
  CHECK_THAT(loadError(kMesh2x2, kLayout2x2, dir), Catch::Contains(manifest.string()));
  // Falling back to the previous complete checkpoint is asked for explicitly (the environment
  // variable is how a generated runner's --load gets it).
  ::setenv("MESHRT_CHECKPOINT_FALLBACK", "1", 1);
  loadAndCheck(kMesh2x2, kLayout2x2, dir, 2);
  ::setenv("MESHRT_CHECKPOINT_FALLBACK", "yes", 1);
  CHECK_THROWS_WITH(loadError(kMesh2x2, kLayout2x2, dir),
                    Catch::Contains("MESHRT_CHECKPOINT_FALLBACK='yes' is not 0 or 1"));
  ::unsetenv("MESHRT_CHECKPOINT_FALLBACK");
  // `latest` naming something that is not a checkpoint is an error too.
  std::ofstream(dir / "latest") << "elsewhere\n";
  CHECK_THAT(loadError(kMesh2x2, kLayout2x2, dir),
             Catch::Contains("names 'elsewhere', which is not a checkpoint"));
  fs::remove_all(dir);
}

TEST_CASE("load errors are clear", "[checkpoint]") {
  fs::path dir = freshDirectory("errors");
  CHECK_THAT(loadError(kMesh2x2, kLayout2x2, dir), Catch::Contains("no checkpoint directory"));
  fs::create_directories(dir);
  CHECK_THAT(loadError(kMesh2x2, kLayout2x2, dir), Catch::Contains("no complete checkpoint in"));
  save(kMesh2x2, kLayout2x2, dir, 1);

  std::vector<Spec> missing = kModel;
  missing.push_back({"layer/extra", {{"cols", 12}}});
  CHECK_THAT(loadError(kMesh2x2, kLayout2x2, dir, missing),
             Catch::Contains("has no tensor 'layer/extra'"));

  std::vector<Spec> reshaped = kModel;
  reshaped[0].dims[1].second = 16;
  CHECK_THAT(loadError(kMesh2x2, kLayout2x2, dir, reshaped),
             Catch::Contains("tensor 'layer/w' has dims [rows=8, cols=12], but the program's are "
                             "[rows=8, cols=16]"));

  std::vector<Spec> renamed = kModel;
  renamed[2].dims[0].first = "d_model";
  CHECK_THAT(loadError(kMesh2x2, {{"d_model", {"model"}}}, dir, renamed),
             Catch::Contains("tensor 'layer/b' has dims [cols=12]"));

  std::string dtypeError = errorOf([&] {
    runThreads(kMesh2x2, [&](Communicator& world) {
      RankState state = makeState(world.mesh(), world.rank(), kLayout2x2, kModel);
      state.tensors[1].dtype = "bf16";
      loadCheckpoint(world, dir.string(), state.tensors);
    });
  });
  CHECK_THAT(dtypeError,
             Catch::Contains("tensor 'layer/w@m' has dtype f32, but the program's is bf16"));

  // A buffer of the wrong size is caught before anything is read or written.
  std::string sizeError = errorOf([&] {
    runThreads(kMesh2x2, [&](Communicator& world) {
      RankState state = makeState(world.mesh(), world.rank(), kLayout2x2, kModel);
      state.tensors[0].count -= 1;
      saveCheckpoint(world, dir.string(), state.tensors, {});
    });
  });
  CHECK_THAT(sizeError, Catch::Contains("tensor 'layer/w' on rank 0 holds 23 elements"));
  fs::remove_all(dir);
}

namespace {

/// A bigger model, so that a save takes long enough to be killed in the middle.
std::vector<Spec> bigModel() {
  std::vector<Spec> specs = kModel;
  for (int k = 0; k < 6; ++k)
    specs.push_back({"big/w" + std::to_string(k), {{"rows", 256}, {"cols", 1024}}});
  return specs;
}

/// Forks a child that saves steps first, first+1, ... on [2,2] until killed (with
/// MESHRT_CHECKPOINT_PAUSE_MS=pauseMs between the shards it writes).
pid_t startSavingChild(const fs::path& dir, int64_t first, int pauseMs) {
  pid_t child = ::fork();
  if (child != 0) return child;
  // The child: never returns into Catch2.
  ::setenv("MESHRT_CHECKPOINT_PAUSE_MS", std::to_string(pauseMs).c_str(), 1);
  try {
    for (int64_t step = first;; ++step)
      save(kMesh2x2, kLayout2x2, dir, step, bigModel(), {2});
  } catch (...) {
  }
  ::_exit(3);
}

void killChild(pid_t child) {
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
}

/// Loads the big model on `mesh` and returns the step, checking every value is that step's.
int64_t loadBig(const Mesh& mesh, const Layout& layout, const fs::path& dir) {
  Failures failures;
  int64_t loaded = -1;
  runThreads(mesh, [&](Communicator& world) {
    RankState state = makeState(world.mesh(), world.rank(), layout, bigModel());
    CheckpointInfo info = loadCheckpoint(world, dir.string(), state.tensors);
    if (world.rank() == 0) loaded = info.step;
    if (std::string error = mismatch(state, info.step); !error.empty())
      failures.add(world.rank(), error);
  });
  failures.check();
  return loaded;
}

bool anyTemporaryFile(const fs::path& dir) {
  std::error_code error;
  for (const auto& entry : fs::recursive_directory_iterator(dir, error))
    if (entry.path().extension() == ".tmp") return true;
  return false;
}

} // namespace

TEST_CASE("a process killed during a save leaves the previous checkpoint whole", "[checkpoint]") {
  fs::path dir = freshDirectory("killed");
  save(kMesh2x2, kLayout2x2, dir, 1, bigModel());

  // Kill the child while its first save (step 2) is writing shards: a temporary rank file exists
  // and the child sleeps 200 ms after each shard it writes.
  pid_t child = startSavingChild(dir, 2, 200);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!anyTemporaryFile(dir) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  killChild(child);
  REQUIRE(anyTemporaryFile(dir));
  CHECK(fs::exists(dir / "ckpt-000002"));
  CHECK(!fs::exists(dir / "ckpt-000002" / "manifest.json"));
  // The previous checkpoint, bit for bit, on the saving mesh and resharded.
  CHECK(loadBig(kMesh2x2, kLayout2x2, dir) == 1);
  CHECK(loadBig(Mesh::parse("x=4"), {{"cols", {"x"}}}, dir) == 1);

  // Kills at arbitrary moments of repeated saves: whatever loads is one whole checkpoint, never
  // older than one known to be complete.
  int64_t newest = 1;
  for (int trial = 0; trial < 5; ++trial) {
    int64_t first = newest + 1;
    child = startSavingChild(dir, first, 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + 97 * trial));
    killChild(child);
    int64_t loaded = loadBig(kMesh2x2, kLayout2x2, dir);
    CHECK(loaded >= newest);
    newest = std::max(newest, loaded);
  }
  fs::remove_all(dir);
}

TEST_CASE("a failed save is the same error on every rank and leaves the previous checkpoint",
          "[checkpoint]") {
  fs::path dir = freshDirectory("failed-save");
  save(kMesh2x2, kLayout2x2, dir, 1);
  // Rank 2's buffer is the wrong size: every rank reports rank 2's error, none hangs, and nothing
  // new is committed.
  std::mutex mutex;
  std::vector<std::string> messages;
  runThreads(kMesh2x2, [&](Communicator& world) {
    RankState state = makeState(world.mesh(), world.rank(), kLayout2x2, kModel);
    fill(state, 2);
    if (world.rank() == 2) state.tensors[2].count = 0;
    try {
      saveCheckpoint(world, dir.string(), state.tensors, {2, {}});
    } catch (const CheckpointError& error) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(error.what());
    }
  });
  REQUIRE(messages.size() == 4);
  for (const std::string& message : messages) {
    CHECK(message == messages[0]);
    CHECK_THAT(message, Catch::Contains("tensor 'layer/b' on rank 2 holds 0 elements"));
  }
  // A directory that cannot be created (a file is in the way) fails on rank 0, for every rank.
  fs::path blocked = freshDirectory("blocked");
  std::ofstream(blocked) << "not a directory";
  CHECK_THAT(errorOf([&] { save(kMesh2x2, kLayout2x2, blocked / "sub", 1); }),
             Catch::Contains("checkpoint save to") && Catch::Contains("on rank 0") &&
                 Catch::Contains("sub"));
  fs::remove(blocked);
  loadAndCheck(kMesh2x2, kLayout2x2, dir, 1);
  fs::remove_all(dir);
}

namespace {

/// Whether anything under `dir` is a checkpoint directory numbered `sequence`.
bool hasCheckpoint(const fs::path& dir, int sequence) {
  char name[32];
  std::snprintf(name, sizeof name, "ckpt-%06d", sequence);
  return fs::exists(dir / name);
}

} // namespace

TEST_CASE("a save that fails writing removes what it wrote and frees its number", "[checkpoint]") {
  fs::path dir = freshDirectory("disk-full");
  save(kMesh2x2, kLayout2x2, dir, 1);
  // A child whose files may not grow past 64 KiB (RLIMIT_FSIZE: writes fail with EFBIG as on a
  // full disk; root cannot be stopped by file modes) saves the 6 MiB model.
  pid_t child = ::fork();
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit limit{};
    ::getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = 64 * 1024;
    ::setrlimit(RLIMIT_FSIZE, &limit);
    std::string message;
    try {
      save(kMesh2x2, kLayout2x2, dir, 2, bigModel());
    } catch (const CheckpointError& error) {
      message = error.what();
    }
    ::_exit(message.find("cannot write") != std::string::npos &&
                    message.find("File too large") != std::string::npos
                ? 0
                : 4);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0); // the save failed with the write error
  CHECK(!hasCheckpoint(dir, 2));
  CHECK(!anyTemporaryFile(dir));
  loadAndCheck(kMesh2x2, kLayout2x2, dir, 1);
  // The sequence goes on where it was.
  save(kMesh2x2, kLayout2x2, dir, 3);
  CHECK(fs::exists(dir / "ckpt-000002" / "manifest.json"));
  loadAndCheck(kMesh2x2, kLayout2x2, dir, 3);
  // A save failing on one rank before anything is written leaves no empty directory either.
  CHECK_THAT(errorOf([&] {
               runThreads(kMesh2x2, [&](Communicator& world) {
                 RankState state = makeState(world.mesh(), world.rank(), kLayout2x2, kModel);
                 if (world.rank() == 3) state.tensors[0].count = 0;
                 saveCheckpoint(world, dir.string(), state.tensors, {4, {}});
               });
             }),
             Catch::Contains("tensor 'layer/w' on rank 3 holds 0 elements"));
  CHECK(!hasCheckpoint(dir, 3));
  fs::remove_all(dir);
}

TEST_CASE("concurrent savers into one directory never share a checkpoint", "[checkpoint]") {
  // Savers with separate worlds (as separate processes would be) start together, round after
  // round; each checkpoint must be one saver's, whole, with checksums that match.
  fs::path dir = freshDirectory("concurrent");
  constexpr int kSavers = 6, kRounds = 4;
  std::vector<std::string> errors(kSavers);
  for (int round = 0; round < kRounds; ++round) {
    std::atomic<int> ready{0};
    std::vector<std::thread> savers;
    for (int saver = 0; saver < kSavers; ++saver)
      savers.emplace_back([&, saver] {
        int64_t step = 100 * (round + 1) + saver;
        try {
          runThreads(Mesh::parse("x=2"), [&](Communicator& world) {
            RankState state = makeState(world.mesh(), world.rank(), {{"cols", {"x"}}}, kModel);
            fill(state, step);
            ready.fetch_add(1);
            while (ready.load() < 2 * kSavers)
              std::this_thread::yield();
            saveCheckpoint(world, dir.string(), state.tensors, {step, {{"seed", "7"}}});
          });
        } catch (const std::exception& error) {
          errors[size_t(saver)] = error.what();
        }
      });
    for (std::thread& saver : savers)
      saver.join();
  }
  for (const std::string& error : errors) {
    INFO(error);
    CHECK(error.empty());
  }
  // Every save has its own checkpoint; each loads (checksums verified) with its own step's values.
  std::set<int64_t> steps;
  for (int sequence = 1; sequence <= kSavers * kRounds; ++sequence) {
    REQUIRE(hasCheckpoint(dir, sequence));
    char name[32];
    std::snprintf(name, sizeof name, "ckpt-%06d", sequence);
    std::ofstream(dir / "latest") << name << "\n";
    Failures failures;
    runThreads(kMesh2x2, [&](Communicator& world) {
      RankState state = makeState(world.mesh(), world.rank(), kLayout2x2, kModel);
      try {
        CheckpointInfo info = loadCheckpoint(world, dir.string(), state.tensors);
        if (world.rank() == 0) steps.insert(info.step);
        if (std::string error = mismatch(state, info.step); !error.empty())
          failures.add(world.rank(), error);
      } catch (const CheckpointError& error) {
        failures.add(world.rank(), error.what());
      }
    });
    failures.check();
  }
  CHECK(steps.size() == size_t(kSavers * kRounds));
  CHECK(!hasCheckpoint(dir, kSavers * kRounds + 1));
  fs::remove_all(dir);
}

TEST_CASE("a manifest from elsewhere cannot name files outside its checkpoint", "[checkpoint]") {
  // tests/fuzz/files replays many more such manifests through the same parser.
  fs::path dir = freshDirectory("untrusted-manifest");
  save(kMesh2x2, kLayout2x2, dir, 1);
  fs::path manifest = dir / "ckpt-000001" / "manifest.json";
  std::ifstream in(manifest);
  const std::string saved((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto loadWith = [&](const std::string& from, const std::string& to) {
    std::string text = saved;
    size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    std::ofstream(manifest) << text.replace(at, from.size(), to);
    return loadError(kMesh2x2, kLayout2x2, dir);
  };
  CHECK_THAT(loadWith("\"rank-00000.bin\"", "\"../../../../../etc/passwd\""),
             Catch::Contains("malformed manifest") &&
                 Catch::Contains("shard file '../../../../../etc/passwd' is not a rank file"));
  CHECK_THAT(loadWith("\"rank-00000.bin\"", "\"/etc/passwd\""),
             Catch::Contains("is not a rank file"));
  // A float where an integer belongs (converting 1e300 would be undefined behaviour).
  CHECK_THAT(loadWith("\"step\": 1", "\"step\": 1e300"),
             Catch::Contains("malformed manifest: 'step' is not an integer"));
  fs::remove_all(dir);
}
