// Sharded checkpoints of meshrt programs: every rank writes the shards it owns, rank 0 writes one
// manifest (global shapes, dtypes, layouts, the step, per-shard checksums), and a checkpoint
// loads into any mesh and layout (each rank reads the regions of the saved shards that cover its
// new shard). Writes are atomic (temporary file, fsync, rename, fsync of the directory) and the
// manifest is written last, so a crash during a save leaves the previous checkpoint whole and
// loadable. docs/runtime.md ("Checkpoints") describes the format and the argument.
//
// A checkpoint directory holds one subdirectory per save and a pointer to the newest:
//   <dir>/ckpt-000007/rank-00003.bin   the shards world rank 3 owns, back to back
//   <dir>/ckpt-000007/manifest.json    written last: a save without it does not exist
//   <dir>/latest                       "ckpt-000007", replaced atomically after the manifest
// The directory must be visible to every rank (one host, or a shared filesystem).
#pragma once

#include "meshrt/Comm.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshrt {

/// A failed save or load: names the checkpoint, and where it applies the tensor, rank and file.
class CheckpointError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// One global dim of a checkpointed tensor and the mesh axes it is split over (row-major over
/// the axes in order, as the planner's layouts; empty: not split).
struct CheckpointDim {
  std::string name;
  int64_t size = 0;
  std::vector<std::string> axes;
};

/// A tensor to save or to load into: its identity and layout, and this rank's shard in memory
/// (row-major over the shard's shape). Generated code fills one per parameter.
struct CheckpointTensor {
  std::string name;  // a parameter path such as "block[0]/ffn/w_in" or "ffn/w_in@m"
  std::string dtype; // the language's dtype ("f32", "bf16", ...): recorded and checked on load
  DType storage = DType::F32; // the element type in memory and on disk
  std::vector<CheckpointDim> dims;
  void* data = nullptr;
  size_t count = 0; // elements at `data`: must equal the shard's size (checked)
  /// Held by some ranks only (pipeline stages: a layer's params live on its stage's ranks): the
  /// ranks whose coordinate c along `heldAxis` has bit c of `heldMask` set. 0: every rank. A rank
  /// that does not hold it passes no data (count 0); its lowest holding coordinate writes it.
  std::string heldAxis;
  uint64_t heldMask = 0;
};

/// Whether `rank` of `mesh` holds `tensor` (CheckpointTensor::heldMask).
bool holdsTensor(const Mesh& mesh, int rank, const CheckpointTensor& tensor);

/// What a checkpoint records beside the tensors.
struct CheckpointInfo {
  int64_t step = 0;                            // e.g. the train steps taken
  std::map<std::string, std::string> metadata; // free form: seed, program name, ...
};

struct CheckpointSaveOptions {
  /// After a save, delete all but the `keep` newest complete checkpoints (0: keep all).
  int keep = 0;
};

struct CheckpointLoadOptions {
  /// When `latest` names a checkpoint that does not verify (its manifest missing or truncated),
  /// load the newest complete checkpoint instead (with a warning on stderr) rather than fail.
  /// Off by default: `latest` is replaced only after its manifest is durable, so that is
  /// corruption, and resuming silently from an older step would hide it. The default reads
  /// MESHRT_CHECKPOINT_FALLBACK (0 or 1; std::invalid_argument otherwise), which is how a
  /// generated runner's `--load` turns it on.
  bool fallBack = defaultFallBack();

  static bool defaultFallBack();
};

/// This rank's shard of a tensor with `dims` on `mesh`: per dim the global start and the size.
struct ShardBox {
  std::vector<int64_t> start, shape;
  bool held = true; // false: the rank holds no shard (CheckpointTensor::heldMask)
};
/// Throws CheckpointError when a dim's size is not divisible by its axes' sizes or an axis is
/// unknown.
ShardBox shardOf(const Mesh& mesh, int rank, const std::vector<CheckpointDim>& dims,
                 const std::string& tensorName);

/// Saves `tensors` (this rank's shards) as a new checkpoint under `dir` (created if missing).
/// Collective over `world`: every rank calls it with the same tensors (same names, dims and
/// layouts). A replicated shard is written once, by the rank with coordinate 0 on the axes the
/// tensor is not split over. Returns when the checkpoint is durable and `latest` names it; on
/// any rank's failure every rank throws the same CheckpointError, the previous checkpoint stays
/// the latest, and what the failed save wrote is removed (its number is free for the next save).
/// Two savers into one directory never share a checkpoint: each creates its own exclusively.
void saveCheckpoint(Communicator& world, const std::string& dir,
                    const std::vector<CheckpointTensor>& tensors, const CheckpointInfo& info,
                    const CheckpointSaveOptions& options = {});

/// Loads the checkpoint `latest` names under `dir` (or, without `latest`, the newest complete one;
/// one `latest` names that does not verify is an error naming the file unless
/// `options.fallBack`) into `tensors` (this rank's shards of the
/// layout in `tensors`, which may differ from the saved one, on any mesh) and returns its step
/// and metadata. Collective over `world`. The checkpoint must hold every tensor named, with the
/// same dtype and global dims (names and sizes); tensors it holds beyond those are ignored. Every
/// shard read is verified against its checksum. On any rank's failure every rank throws the
/// same CheckpointError (a missing tensor, a shape or dtype mismatch, a checksum mismatch naming
/// tensor, rank and file, no complete checkpoint).
CheckpointInfo loadCheckpoint(Communicator& world, const std::string& dir,
                              const std::vector<CheckpointTensor>& tensors,
                              const CheckpointLoadOptions& options = {});

/// The CRC-32 (IEEE 802.3, the polynomial and bit order of zlib's crc32()) of `bytes`,
/// continuing from `crc` (0 to start).
uint32_t crc32(const void* bytes, size_t size, uint32_t crc = 0);

} // namespace meshrt
