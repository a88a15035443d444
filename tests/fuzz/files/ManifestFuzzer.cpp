// Fuzz target over a checkpoint manifest from elsewhere: any bytes as manifest.json must load
// into the program's tensors or fail with a CheckpointError, never crash, read outside the
// checkpoint directory or allocate more than its rank files hold. The bytes are parsed and then
// loaded, on every rank of a [4] mesh under another layout than the save's (resharding), from the
// rank files of a real [2,2] save made once per process.
#include "CheckpointManifest.h"
#include "meshrt/Threads.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using namespace meshrt;
namespace fs = std::filesystem;

/// The program's tensors (name, dtype, storage, dims by name and size); dim -> axis per layout.
struct Spec {
  const char* name;
  const char* dtype;
  DType storage;
  std::vector<std::pair<const char*, int64_t>> dims;
};
const std::vector<Spec> kModel = {
    {"layer/w", "f32", DType::F32, {{"rows", 8}, {"cols", 12}}},
    {"layer/w@m", "bf16", DType::F32, {{"rows", 8}, {"cols", 12}}},
    {"layer/b", "f32", DType::F32, {{"cols", 12}}},
    {"steps", "i32", DType::I32, {}},
    {"mask", "f64", DType::F64, {{"rows", 8}}},
};

/// One rank's tensors on `mesh` with dims split as `axisOf` says, each element set to `fill`.
struct Shards {
  std::vector<std::vector<unsigned char>> buffers;
  std::vector<CheckpointTensor> tensors;
  std::vector<ShardBox> boxes;
};
Shards shardsOf(const Mesh& mesh, int rank, const std::map<std::string, std::string>& axisOf,
                unsigned char fill) {
  Shards shards;
  for (const Spec& spec : kModel) {
    CheckpointTensor tensor{spec.name, spec.dtype, spec.storage, {}, nullptr, 0};
    for (const auto& [dim, size] : spec.dims) {
      auto axis = axisOf.find(dim);
      tensor.dims.push_back({dim, size, {}});
      if (axis != axisOf.end()) tensor.dims.back().axes.push_back(axis->second);
    }
    shards.boxes.push_back(shardOf(mesh, rank, tensor.dims, tensor.name));
    tensor.count = 1;
    for (int64_t size : shards.boxes.back().shape)
      tensor.count *= size_t(size);
    shards.buffers.emplace_back(tensor.count * dtypeSize(tensor.storage), fill);
    shards.tensors.push_back(tensor);
  }
  for (size_t t = 0; t < shards.tensors.size(); ++t)
    shards.tensors[t].data = shards.buffers[t].data();
  return shards;
}

/// A directory holding a real save, made once per process and removed at exit (unless
/// MESHC_FUZZ_KEEP_CHECKPOINT=1, e.g. to take its manifest as a seed).
struct SavedDirectory {
  fs::path root =
      fs::temp_directory_path() / ("meshrt-fuzz-manifest-" + std::to_string(::getpid()));
  fs::path checkpoint = root / "ckpt-000001";
  bool keep = false;

  SavedDirectory() {
    fs::remove_all(root);
    Mesh mesh{{"x", 2}, {"y", 2}};
    runThreads(mesh, [&](Communicator& world) {
      Shards shards = shardsOf(mesh, world.rank(), {{"rows", "x"}, {"cols", "y"}},
                               static_cast<unsigned char>(world.rank() + 1));
      saveCheckpoint(world, root.string(), shards.tensors, {7, {{"seed", "1"}}});
    });
    const char* keepEnv = std::getenv("MESHC_FUZZ_KEEP_CHECKPOINT");
    keep = keepEnv && *keepEnv == '1';
    if (keep) std::fprintf(stderr, "kept the checkpoint %s\n", checkpoint.c_str());
  }
  ~SavedDirectory() {
    std::error_code ignored;
    if (!keep) fs::remove_all(root, ignored);
  }
};

} // namespace

namespace {
bool lastRejected = false;
} // namespace

extern "C" bool meshcFuzzLastInputRejected() {
  return lastRejected;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  lastRejected = false;
  static const SavedDirectory saved;
  const fs::path& checkpoint = saved.checkpoint;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    detail::SavedCheckpoint manifest = detail::parseManifest(text, checkpoint.string());
    Mesh mesh{{"a", 4}};
    for (int rank = 0; rank < mesh.size(); ++rank) {
      Shards shards = shardsOf(mesh, rank, {{"rows", "a"}}, 0);
      detail::loadSavedTensors(checkpoint.string(), manifest, shards.tensors, shards.boxes, rank);
    }
  } catch (const CheckpointError&) {
    // The clean rejection: anything else escaping (or a crash) is a bug.
    lastRejected = true;
  }
  return 0;
}
