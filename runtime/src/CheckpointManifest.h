// A checkpoint's manifest as a load reads it: parsed from bytes that may come from elsewhere and
// checked before anything is opened or allocated for it. Integers must be exact and in range,
// file names must be the rank files the format defines ("rank-NNNNN.bin", so never an absolute
// path, a ".." or a subdirectory), and every shard must lie inside its tensor. A bad manifest is
// a CheckpointError, never a crash, a read outside the checkpoint directory or an allocation
// beyond what the program's tensors and the rank files hold. (Internal to meshrt; the fuzz
// target tests/fuzz/files/ManifestFuzzer.cpp calls it directly.)
#pragma once

#include "meshrt/Checkpoint.h"

#include <string_view>

namespace meshrt::detail {

/// The manifest's "format" and "version" (saves write them; loads require them).
inline constexpr const char* kManifestFormat = "meshrt-checkpoint";
inline constexpr int kManifestVersion = 1;

/// One saved shard: where its bytes are and which box of the tensor they hold.
struct SavedShard {
  int rank = 0;     // the world rank that saved it (messages only)
  std::string file; // a rank file directly inside the checkpoint directory
  uint64_t offset = 0, bytes = 0;
  ShardBox box; // inside the tensor's dims, one entry per dim
  uint32_t crc32 = 0;
};

struct SavedTensor {
  std::string name, dtype;
  DType storage = DType::F32;
  std::vector<CheckpointDim> dims; // names and sizes; the saved axes are not needed to load
  std::vector<SavedShard> shards;
};

struct SavedCheckpoint {
  CheckpointInfo info;
  std::vector<SavedTensor> tensors; // distinct names
};

/// Parses and checks the manifest text of checkpoint directory `checkpoint` (named in errors).
/// Throws CheckpointError.
SavedCheckpoint parseManifest(std::string_view text, const std::string& checkpoint);

/// Reads rank `rank`'s shards `boxes` of `tensors` from checkpoint directory `checkpoint`, which
/// `saved` describes, verifying each shard read against its checksum. Throws CheckpointError.
void loadSavedTensors(const std::string& checkpoint, const SavedCheckpoint& saved,
                      const std::vector<CheckpointTensor>& tensors,
                      const std::vector<ShardBox>& boxes, int rank);

} // namespace meshrt::detail
