// Sharded, atomic, reshardable checkpoints (see meshrt/Checkpoint.h and docs/runtime.md).
//
// Every step that can fail runs inside collectively(): each rank runs its part, then the ranks
// exchange their error messages (an allGather, which is also the barrier between steps), and if
// any rank failed every rank throws the first failure's message. So a failure is never a hang and
// every rank reports the cause, whichever backend runs the collectives.
#include "meshrt/Checkpoint.h"

#include "CheckpointManifest.h"

// Header-only fmt: generated programs link meshrt without linking libfmt.
#define FMT_HEADER_ONLY
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <regex>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace meshrt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kFormat = detail::kManifestFormat;
constexpr int kVersion = detail::kManifestVersion;
constexpr const char* kManifest = "manifest.json";
constexpr const char* kLatest = "latest";

std::string checkpointName(int sequence) {
  return fmt::format("ckpt-{:06}", sequence);
}
std::string rankFileName(int rank) {
  return fmt::format("rank-{:05}.bin", rank);
}

/// The sequence number of a checkpoint subdirectory name ("ckpt-000007" -> 7), or -1.
int sequenceOf(const std::string& name) {
  static const std::regex pattern("ckpt-([0-9]{1,9})");
  std::smatch match;
  if (!std::regex_match(name, match, pattern)) return -1;
  return std::stoi(match[1].str());
}

[[noreturn]] void fail(const std::string& message) {
  throw CheckpointError(message);
}
[[noreturn]] void failErrno(const std::string& what, const std::string& path) {
  fail(fmt::format("{} '{}': {}", what, path, std::strerror(errno)));
}

//===--- Durable files ---===//

class FileDescriptor {
public:
  FileDescriptor(const std::string& path, int flags, mode_t mode = 0644)
      : fd_(::open(path.c_str(), flags | O_CLOEXEC, mode)), path_(path) {
    if (fd_ < 0) failErrno("cannot open", path);
  }
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  void writeAll(const void* bytes, size_t size) {
    const char* at = static_cast<const char*>(bytes);
    while (size > 0) {
      ssize_t written = ::write(fd_, at, size);
      if (written < 0 && errno == EINTR) continue;
      if (written < 0) failErrno("cannot write", path_);
      at += written;
      size -= size_t(written);
    }
  }
  void readAllAt(void* bytes, size_t size, uint64_t offset) {
    char* at = static_cast<char*>(bytes);
    while (size > 0) {
      ssize_t got = ::pread(fd_, at, size, off_t(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) failErrno("cannot read", path_);
      if (got == 0) fail(fmt::format("'{}' is shorter than the manifest says", path_));
      at += got;
      size -= size_t(got);
      offset += uint64_t(got);
    }
  }
  void sync() {
    if (::fsync(fd_) != 0) failErrno("cannot fsync", path_);
  }
  uint64_t size() {
    struct stat status {};
    if (::fstat(fd_, &status) != 0) failErrno("cannot stat", path_);
    return uint64_t(status.st_size);
  }
  void close() {
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) failErrno("cannot close", path_);
  }

private:
  int fd_;
  std::string path_;
};

/// Makes a rename or a new entry of `dir` durable.
void syncDirectory(const fs::path& dir) {
  FileDescriptor(dir.string(), O_RDONLY | O_DIRECTORY).sync();
}

/// Writes `path` atomically: `write` fills `path` + `suffix` + ".tmp", which is fsynced and
/// renamed over `path`, and the directory is fsynced. A crash leaves `path` as it was or whole
/// and new. Writers of one path at the same time need distinct suffixes.
void writeAtomically(const fs::path& path, const std::function<void(FileDescriptor&)>& write,
                     const std::string& suffix = "") {
  fs::path temporary = path;
  temporary += suffix + ".tmp";
  {
    FileDescriptor file(temporary.string(), O_WRONLY | O_CREAT | O_TRUNC);
    write(file);
    file.sync();
    file.close();
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) failErrno("cannot rename", temporary);
  syncDirectory(path.parent_path());
}

void writeTextAtomically(const fs::path& path, const std::string& text,
                         const std::string& suffix = "") {
  writeAtomically(
      path, [&](FileDescriptor& file) { file.writeAll(text.data(), text.size()); }, suffix);
}

std::string readText(const fs::path& path) {
  FileDescriptor file(path.string(), O_RDONLY);
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) failErrno("cannot stat", path);
  std::string text(size_t(status.st_size), '\0');
  file.readAllAt(text.data(), text.size(), 0);
  return text;
}

/// MESHRT_CHECKPOINT_PAUSE_MS: a test hook that sleeps after each shard a save writes, so that a
/// test can kill a process in the middle of a save.
std::chrono::milliseconds pauseBetweenShards() {
  const char* text = std::getenv("MESHRT_CHECKPOINT_PAUSE_MS");
  return std::chrono::milliseconds(text ? std::strtol(text, nullptr, 10) : 0);
}

//===--- Agreement between ranks ---===//

/// Every rank's `text`, in rank order (collective).
std::vector<std::string> allGatherStrings(Communicator& world, const std::string& text) {
  int32_t length = int32_t(text.size());
  std::vector<int32_t> lengths(size_t(world.size()));
  world.allGather(&length, lengths.data(), 1);
  size_t longest = size_t(*std::max_element(lengths.begin(), lengths.end()));
  std::vector<std::string> texts(lengths.size());
  if (longest == 0) return texts;
  std::vector<unsigned char> padded(longest, 0), all(longest * lengths.size());
  std::copy(text.begin(), text.end(), padded.begin());
  world.allGather(padded.data(), all.data(), longest);
  for (size_t r = 0; r < texts.size(); ++r)
    texts[r].assign(reinterpret_cast<const char*>(all.data() + r * longest), size_t(lengths[r]));
  return texts;
}

/// Runs `part` on this rank, then fails every rank with the first failed rank's message. `what`
/// prefixes errors that are not CheckpointErrors (filesystem errors, bad_alloc, ...).
void collectively(Communicator& world, const std::string& what, const std::function<void()>& part) {
  std::string error;
  try {
    part();
  } catch (const CheckpointError& exception) {
    error = exception.what();
  } catch (const std::exception& exception) {
    error = fmt::format("{} on rank {}: {}", what, world.rank(), exception.what());
  }
  for (const std::string& message : allGatherStrings(world, error))
    if (!message.empty()) throw CheckpointError(message);
}

//===--- Shards ---===//

size_t product(const std::vector<int64_t>& sizes) {
  size_t n = 1;
  for (int64_t size : sizes)
    n *= size_t(size);
  return n;
}

/// Whether `rank` writes its shard of `tensor`: replicas along the axes the tensor is not split
/// over are written once, by coordinate 0 (along its held axis, by the lowest holding one).
bool ownsShard(const Mesh& mesh, int rank, const CheckpointTensor& tensor) {
  if (!holdsTensor(mesh, rank, tensor)) return false;
  std::vector<int> coords = mesh.coords(rank);
  for (int a = 0; a < mesh.numAxes(); ++a) {
    const std::string& axis = mesh.axes()[size_t(a)].name;
    bool splits =
        std::any_of(tensor.dims.begin(), tensor.dims.end(), [&](const CheckpointDim& dim) {
          return std::find(dim.axes.begin(), dim.axes.end(), axis) != dim.axes.end();
        });
    int writer =
        tensor.heldMask != 0 && axis == tensor.heldAxis ? std::countr_zero(tensor.heldMask) : 0;
    if (!splits && coords[size_t(a)] != writer) return false;
  }
  return true;
}

/// Copies the intersection of box `from` (data `in`) and box `to` (data `out`), both row-major
/// over their shapes, `element` bytes per element.
void copyIntersection(const ShardBox& from, const unsigned char* in, const ShardBox& to,
                      unsigned char* out, size_t element) {
  size_t rank = to.shape.size();
  std::vector<int64_t> low(rank), high(rank);
  for (size_t d = 0; d < rank; ++d) {
    low[d] = std::max(from.start[d], to.start[d]);
    high[d] = std::min(from.start[d] + from.shape[d], to.start[d] + to.shape[d]);
    if (low[d] >= high[d]) return;
  }
  if (rank == 0) {
    std::memcpy(out, in, element);
    return;
  }
  // Runs along the last dim, one per index of the outer dims.
  size_t run = size_t(high[rank - 1] - low[rank - 1]) * element;
  std::vector<int64_t> at = low;
  while (true) {
    int64_t inOffset = 0, outOffset = 0;
    for (size_t d = 0; d < rank; ++d) {
      inOffset = inOffset * from.shape[d] + (at[d] - from.start[d]);
      outOffset = outOffset * to.shape[d] + (at[d] - to.start[d]);
    }
    std::memcpy(out + size_t(outOffset) * element, in + size_t(inOffset) * element, run);
    // The next index of the outer dims (odometer order), or done.
    int d = int(rank) - 2;
    for (; d >= 0; --d) {
      if (++at[size_t(d)] < high[size_t(d)]) break;
      at[size_t(d)] = low[size_t(d)];
    }
    if (d < 0) return;
  }
}

std::string dtypeStorageName(DType dtype) {
  return dtypeName(dtype);
}

json dimsJson(const std::vector<CheckpointDim>& dims) {
  json out = json::array();
  for (const CheckpointDim& dim : dims)
    out.push_back({{"name", dim.name}, {"size", dim.size}, {"axes", dim.axes}});
  return out;
}

std::string dimsString(const std::vector<CheckpointDim>& dims) {
  std::vector<std::string> parts;
  for (const CheckpointDim& dim : dims)
    parts.push_back(fmt::format("{}={}", dim.name, dim.size));
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

/// Checks the tensors a rank passes and returns their shard boxes on this rank.
std::vector<ShardBox> shardBoxes(Communicator& world, const std::vector<CheckpointTensor>& tensors,
                                 const char* operation) {
  std::vector<ShardBox> boxes;
  std::vector<std::string> names;
  for (const CheckpointTensor& tensor : tensors) {
    if (std::find(names.begin(), names.end(), tensor.name) != names.end())
      fail(fmt::format("checkpoint {}: tensor '{}' is listed twice", operation, tensor.name));
    names.push_back(tensor.name);
    boxes.push_back(shardOf(world.mesh(), world.rank(), tensor.dims, tensor.name));
    boxes.back().held = holdsTensor(world.mesh(), world.rank(), tensor);
    size_t elements = boxes.back().held ? product(boxes.back().shape) : 0;
    if (tensor.count != elements || (elements > 0 && tensor.data == nullptr))
      fail(fmt::format("checkpoint {}: tensor '{}' on rank {} holds {} elements but its shard "
                       "{} of {} has {}",
                       operation, tensor.name, world.rank(), tensor.count,
                       fmt::join(boxes.back().shape, "x"), dimsString(tensor.dims), elements));
  }
  return boxes;
}

//===--- Choosing the checkpoint to load ---===//

/// The manifest of checkpoint subdirectory `name`, or nothing if it has none or it does not parse
/// (a save that did not finish).
std::optional<json> completeManifest(const fs::path& dir, const std::string& name) {
  fs::path path = dir / name / kManifest;
  std::error_code error;
  if (!fs::is_regular_file(path, error)) return std::nullopt;
  try {
    json manifest = json::parse(readText(path));
    if (manifest.value("format", "") != kFormat) return std::nullopt;
    return manifest;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::vector<int> sequencesIn(const fs::path& dir) {
  std::vector<int> sequences;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error))
    if (int sequence = sequenceOf(entry.path().filename().string());
        sequence >= 0 && entry.is_directory())
      sequences.push_back(sequence);
  std::sort(sequences.rbegin(), sequences.rend());
  return sequences;
}

/// The checkpoint `latest` names. `latest` is replaced only after its checkpoint's manifest is
/// durable, so one it names that does not verify (missing or truncated manifest) is corruption: an
/// error naming the file, unless `fallBack` asks for the newest complete checkpoint instead.
/// Without `latest` (a first save cut short before it), the newest complete one.
int chooseCheckpoint(const fs::path& dir, bool fallBack) {
  std::error_code error;
  if (!fs::is_directory(dir, error))
    fail(fmt::format("no checkpoint directory '{}'", dir.string()));
  if (fs::is_regular_file(dir / kLatest, error)) {
    std::string latest = readText(dir / kLatest);
    while (!latest.empty() && std::isspace(static_cast<unsigned char>(latest.back())))
      latest.pop_back();
    int sequence = sequenceOf(latest);
    if (sequence >= 0 && completeManifest(dir, latest)) return sequence;
    std::string problem =
        sequence < 0
            ? fmt::format("'{}' names '{}', which is not a checkpoint", (dir / kLatest).string(),
                          latest)
            : fmt::format("'{}' names {}, but its manifest '{}' is missing or does not parse",
                          (dir / kLatest).string(), latest, (dir / latest / kManifest).string());
    if (!fallBack)
      fail(problem + " (MESHRT_CHECKPOINT_FALLBACK=1 loads the newest complete checkpoint "
                     "instead)");
    for (int older : sequencesIn(dir))
      if (completeManifest(dir, checkpointName(older))) {
        std::fprintf(stderr, "warning: meshrt: %s; loading %s instead\n", problem.c_str(),
                     checkpointName(older).c_str());
        return older;
      }
    fail(problem + ", and no other checkpoint in '" + dir.string() + "' is complete");
  }
  for (int sequence : sequencesIn(dir))
    if (completeManifest(dir, checkpointName(sequence))) return sequence;
  fail(fmt::format("no complete checkpoint in '{}'", dir.string()));
}

//===--- Saving ---===//

/// Creates the next checkpoint subdirectory of `root` and returns its sequence number. mkdir is
/// exclusive: of two savers into one directory that pick the same number, the loser takes the
/// next one, so no two saves ever share a checkpoint.
int createNextCheckpoint(const fs::path& root) {
  std::vector<int> existing = sequencesIn(root);
  int sequence = existing.empty() ? 1 : existing.front() + 1;
  for (int attempt = 0; attempt < 1000; ++attempt, ++sequence) {
    fs::path path = root / checkpointName(sequence);
    if (::mkdir(path.c_str(), 0755) == 0) {
      syncDirectory(root);
      return sequence;
    }
    if (errno != EEXIST) failErrno("cannot create", path.string());
  }
  fail(fmt::format("checkpoint save to '{}': 1000 concurrent saves took every number from {}",
                   root.string(), sequence - 1000));
}

/// Removes what a failed save wrote (its whole checkpoint directory, the manifest first as in
/// deleteOldCheckpoints), so that no temporary files stay behind and the next save reuses its
/// number. Best effort: the save's own error is the one reported.
void removeFailedSave(const fs::path& checkpoint) noexcept {
  std::error_code ignored;
  fs::remove(checkpoint / kManifest, ignored);
  fs::remove_all(checkpoint, ignored);
  try {
    syncDirectory(checkpoint.parent_path());
  } catch (const std::exception&) {
  }
}

/// Writes this rank's file of checkpoint `path`; returns the manifest records of its shards.
json writeRankFile(Communicator& world, const fs::path& path,
                   const std::vector<CheckpointTensor>& tensors,
                   const std::vector<ShardBox>& boxes) {
  json records = json::array();
  std::vector<size_t> owned;
  for (size_t t = 0; t < tensors.size(); ++t)
    if (ownsShard(world.mesh(), world.rank(), tensors[t])) owned.push_back(t);
  if (owned.empty()) return records;
  std::string file = rankFileName(world.rank());
  std::chrono::milliseconds pause = pauseBetweenShards();
  writeAtomically(path / file, [&](FileDescriptor& out) {
    uint64_t offset = 0;
    for (size_t t : owned) {
      const CheckpointTensor& tensor = tensors[t];
      size_t bytes = tensor.count * dtypeSize(tensor.storage);
      out.writeAll(tensor.data, bytes);
      records.push_back({{"tensor", tensor.name},
                         {"rank", world.rank()},
                         {"file", file},
                         {"offset", offset},
                         {"bytes", bytes},
                         {"start", boxes[t].start},
                         {"shape", boxes[t].shape},
                         {"crc32", crc32(tensor.data, bytes)}});
      offset += bytes;
      if (pause.count() > 0) std::this_thread::sleep_for(pause);
    }
  });
  return records;
}

json buildManifest(const Mesh& mesh, const std::vector<CheckpointTensor>& tensors,
                   const CheckpointInfo& info, const std::vector<std::string>& rankRecords) {
  json manifest = {{"format", kFormat},     {"version", kVersion},
                   {"step", info.step},     {"metadata", info.metadata},
                   {"mesh", json::array()}, {"tensors", json::array()}};
  for (const MeshAxis& axis : mesh.axes())
    manifest["mesh"].push_back({{"name", axis.name}, {"size", axis.size}});
  std::map<std::string, json> shardsOf;
  for (const std::string& text : rankRecords)
    for (json& record : json::parse(text)) {
      std::string name = record["tensor"];
      record.erase("tensor");
      shardsOf[name].push_back(std::move(record));
    }
  for (const CheckpointTensor& tensor : tensors) {
    json& shards = shardsOf[tensor.name];
    // The owners' shards tile the tensor: their sizes add up to the global size.
    size_t covered = 0, global = 1;
    for (const json& shard : shards)
      covered += product(shard["shape"].get<std::vector<int64_t>>());
    for (const CheckpointDim& dim : tensor.dims)
      global *= size_t(dim.size);
    if (covered != global)
      fail(fmt::format("checkpoint save: the ranks' shards of '{}' cover {} of its {} elements "
                       "(did every rank pass the same tensors?)",
                       tensor.name, covered, global));
    manifest["tensors"].push_back({{"name", tensor.name},
                                   {"dtype", tensor.dtype},
                                   {"storage", dtypeStorageName(tensor.storage)},
                                   {"dims", dimsJson(tensor.dims)},
                                   {"shards", shards}});
  }
  return manifest;
}

/// Deletes all but the `keep` newest complete checkpoints (and incomplete ones older than them).
void deleteOldCheckpoints(const fs::path& dir, int keep) {
  if (keep <= 0) return;
  int kept = 0;
  for (int sequence : sequencesIn(dir)) {
    if (kept < keep) {
      if (completeManifest(dir, checkpointName(sequence))) ++kept;
      continue;
    }
    // The manifest first: a deletion cut short leaves an incomplete checkpoint, never one that
    // names missing shards.
    fs::remove(dir / checkpointName(sequence) / kManifest);
    syncDirectory(dir / checkpointName(sequence));
    fs::remove_all(dir / checkpointName(sequence));
  }
}

//===--- Loading ---===//

/// Whether boxes `a` and `b` (of one rank) share an element.
bool intersects(const ShardBox& a, const ShardBox& b) {
  for (size_t d = 0; d < a.shape.size(); ++d)
    if (a.start[d] >= b.start[d] + b.shape[d] || b.start[d] >= a.start[d] + a.shape[d])
      return false;
  return true;
}

/// Reads rank `rank`'s shard of `tensor` (box `box`) from the saved shards that cover it.
/// `saved` has passed parseManifest, so its shards lie inside its dims.
void loadTensor(int rank, const fs::path& checkpoint, const detail::SavedTensor& saved,
                const CheckpointTensor& tensor, const ShardBox& box) {
  std::string where = fmt::format("checkpoint '{}': tensor '{}'", checkpoint.string(), tensor.name);
  if (saved.dtype != tensor.dtype)
    fail(fmt::format("{} has dtype {}, but the program's is {}", where, saved.dtype, tensor.dtype));
  if (saved.storage != tensor.storage)
    fail(fmt::format("{} is stored as {}, but the program holds it as {}", where,
                     dtypeName(saved.storage), dtypeName(tensor.storage)));
  bool same = saved.dims.size() == tensor.dims.size();
  for (size_t d = 0; same && d < saved.dims.size(); ++d)
    same = saved.dims[d].name == tensor.dims[d].name && saved.dims[d].size == tensor.dims[d].size;
  if (!same)
    fail(fmt::format("{} has dims {}, but the program's are {}", where, dimsString(saved.dims),
                     dimsString(tensor.dims)));

  // The shards this rank needs. They must not overlap: counting the elements they fill then
  // proves every element of the box was read.
  std::vector<const detail::SavedShard*> needed;
  for (const detail::SavedShard& shard : saved.shards) {
    if (!intersects(shard.box, box)) continue;
    for (const detail::SavedShard* other : needed)
      if (intersects(other->box, shard.box))
        fail(fmt::format("{}: the shards of ranks {} and {} overlap", where, other->rank,
                         shard.rank));
    needed.push_back(&shard);
  }
  size_t element = dtypeSize(saved.storage);
  auto* out = static_cast<unsigned char*>(tensor.data);
  size_t filled = 0;
  std::vector<unsigned char> bytes;
  for (const detail::SavedShard* shard : needed) {
    // O_NOFOLLOW: a rank file that is a link could point anywhere; saves never write links.
    FileDescriptor file((checkpoint / shard->file).string(), O_RDONLY | O_NOFOLLOW);
    // Checked before allocating: a manifest cannot ask for more bytes than the file holds.
    if (file.size() < shard->offset + shard->bytes)
      fail(fmt::format("'{}' is shorter than the manifest says",
                       (checkpoint / shard->file).string()));
    bytes.resize(size_t(shard->bytes));
    file.readAllAt(bytes.data(), bytes.size(), shard->offset);
    uint32_t actual = crc32(bytes.data(), bytes.size());
    if (actual != shard->crc32)
      fail(fmt::format("{}: checksum mismatch in the shard saved by rank {} in '{}' (crc32 "
                       "{:08x}, manifest says {:08x}; read by rank {})",
                       where, shard->rank, (checkpoint / shard->file).string(), actual,
                       shard->crc32, rank));
    copyIntersection(shard->box, bytes.data(), box, out, element);
    size_t overlap = 1;
    for (size_t d = 0; d < box.shape.size(); ++d)
      overlap *=
          size_t(std::min(shard->box.start[d] + shard->box.shape[d], box.start[d] + box.shape[d]) -
                 std::max(shard->box.start[d], box.start[d]));
    filled += overlap;
  }
  if (filled != product(box.shape))
    fail(fmt::format("{}: the saved shards cover {} of the {} elements rank {} needs", where,
                     filled, product(box.shape), rank));
}

} // namespace

void detail::loadSavedTensors(const std::string& checkpoint, const SavedCheckpoint& saved,
                              const std::vector<CheckpointTensor>& tensors,
                              const std::vector<ShardBox>& boxes, int rank) {
  std::map<std::string, const SavedTensor*> byName;
  for (const SavedTensor& tensor : saved.tensors)
    byName[tensor.name] = &tensor;
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (!boxes[t].held) continue;
    auto found = byName.find(tensors[t].name);
    if (found == byName.end())
      fail(fmt::format("checkpoint '{}' has no tensor '{}' ({} tensors saved)", checkpoint,
                       tensors[t].name, byName.size()));
    loadTensor(rank, checkpoint, *found->second, tensors[t], boxes[t]);
  }
}

bool CheckpointLoadOptions::defaultFallBack() {
  const char* text = std::getenv("MESHRT_CHECKPOINT_FALLBACK");
  if (!text || !*text || std::strcmp(text, "0") == 0) return false;
  if (std::strcmp(text, "1") == 0) return true;
  throw std::invalid_argument(std::string("meshrt: MESHRT_CHECKPOINT_FALLBACK='") + text +
                              "' is not 0 or 1");
}

uint32_t crc32(const void* bytes, size_t size, uint32_t crc) {
  // Slicing by 8 (eight bytes per step through eight tables), ~8x the bytewise loop: table k
  // advances a byte's contribution by k more zero bytes.
  static const auto tables = [] {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k)
        c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; ++n)
      for (size_t k = 1; k < 8; ++k)
        t[k][n] = (t[k - 1][n] >> 8) ^ t[0][t[k - 1][n] & 0xFF];
    return t;
  }();
  const auto* at = static_cast<const unsigned char*>(bytes);
  crc = ~crc;
  for (; size >= 8; size -= 8, at += 8) {
    // The bytes in memory order (little-endian loads of two words).
    uint32_t low = crc ^ (uint32_t(at[0]) | uint32_t(at[1]) << 8 | uint32_t(at[2]) << 16 |
                          uint32_t(at[3]) << 24);
    uint32_t high =
        uint32_t(at[4]) | uint32_t(at[5]) << 8 | uint32_t(at[6]) << 16 | uint32_t(at[7]) << 24;
    crc = tables[7][low & 0xFF] ^ tables[6][(low >> 8) & 0xFF] ^ tables[5][(low >> 16) & 0xFF] ^
          tables[4][low >> 24] ^ tables[3][high & 0xFF] ^ tables[2][(high >> 8) & 0xFF] ^
          tables[1][(high >> 16) & 0xFF] ^ tables[0][high >> 24];
  }
  for (; size > 0; --size, ++at)
    crc = tables[0][(crc ^ *at) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

bool holdsTensor(const Mesh& mesh, int rank, const CheckpointTensor& tensor) {
  if (tensor.heldMask == 0) return true;
  int axis = mesh.axisIndex(tensor.heldAxis);
  if (axis < 0)
    fail(fmt::format("tensor '{}' is held along axis '{}', which mesh {} lacks", tensor.name,
                     tensor.heldAxis, mesh.str()));
  return (tensor.heldMask >> mesh.coords(rank)[size_t(axis)]) & 1;
}

ShardBox shardOf(const Mesh& mesh, int rank, const std::vector<CheckpointDim>& dims,
                 const std::string& tensorName) {
  std::vector<int> coords = mesh.coords(rank);
  ShardBox box;
  for (const CheckpointDim& dim : dims) {
    int64_t blocks = 1, index = 0;
    for (const std::string& axis : dim.axes) {
      int a = mesh.axisIndex(axis);
      if (a < 0)
        fail(fmt::format("tensor '{}': dim '{}' is split over axis '{}', which mesh {} lacks",
                         tensorName, dim.name, axis, mesh.str()));
      blocks *= mesh.axes()[size_t(a)].size;
      index = index * mesh.axes()[size_t(a)].size + coords[size_t(a)];
    }
    if (dim.size < 0 || dim.size % blocks != 0)
      fail(fmt::format("tensor '{}': dim '{}' of size {} does not split evenly over {} ({} "
                       "shards)",
                       tensorName, dim.name, dim.size, fmt::join(dim.axes, ", "), blocks));
    int64_t local = dim.size / blocks;
    box.start.push_back(index * local);
    box.shape.push_back(local);
  }
  return box;
}

void saveCheckpoint(Communicator& world, const std::string& dir,
                    const std::vector<CheckpointTensor>& tensors, const CheckpointInfo& info,
                    const CheckpointSaveOptions& options) {
  fs::path root(dir);
  std::string what = "checkpoint save to '" + dir + "'";
  std::vector<ShardBox> boxes;
  int32_t sequence = 0;   // rank 0's from the moment it creates the directory
  bool committed = false; // `latest` names the new checkpoint: never remove it then
  try {
    // Rank 0 creates the new checkpoint's directory; no save ever writes into an existing one.
    collectively(world, what, [&] {
      boxes = shardBoxes(world, tensors, "save");
      if (world.rank() != 0) return;
      fs::create_directories(root);
      sequence = createNextCheckpoint(root);
    });
    world.broadcast(&sequence, 1, 0);
    fs::path checkpoint = root / checkpointName(sequence);

    // Every rank writes and fsyncs its shards; the gather below is the barrier after which all
    // of them are durable.
    std::string records;
    collectively(world, what,
                 [&] { records = writeRankFile(world, checkpoint, tensors, boxes).dump(); });
    std::vector<std::string> allRecords = allGatherStrings(world, records);

    // The manifest commits the checkpoint; `latest` then points at it.
    collectively(world, what, [&] {
      if (world.rank() != 0) return;
      json manifest = buildManifest(world.mesh(), tensors, info, allRecords);
      writeTextAtomically(checkpoint / kManifest, manifest.dump(1));
      // Concurrent savers each replace `latest` from a temporary of their own.
      writeTextAtomically(root / kLatest, checkpointName(sequence) + "\n",
                          "." + checkpointName(sequence));
      committed = true;
      deleteOldCheckpoints(root, options.keep);
    });
  } catch (const CheckpointError&) {
    // Every rank has finished its part (collectively() agrees on failures after all ran), so
    // rank 0 removes the directory nobody writes any more.
    if (world.rank() == 0 && sequence > 0 && !committed)
      removeFailedSave(root / checkpointName(sequence));
    throw;
  }
}

CheckpointInfo loadCheckpoint(Communicator& world, const std::string& dir,
                              const std::vector<CheckpointTensor>& tensors,
                              const CheckpointLoadOptions& options) {
  fs::path root(dir);
  int32_t sequence = 0;
  collectively(world, "checkpoint load from '" + dir + "'", [&] {
    if (world.rank() == 0) sequence = chooseCheckpoint(root, options.fallBack);
  });
  world.broadcast(&sequence, 1, 0);
  fs::path checkpoint = root / checkpointName(sequence);

  CheckpointInfo info;
  collectively(world, "checkpoint load from '" + dir + "'", [&] {
    std::vector<ShardBox> boxes = shardBoxes(world, tensors, "load");
    std::error_code error;
    if (!fs::is_regular_file(checkpoint / kManifest, error))
      fail(fmt::format("checkpoint '{}' has no readable manifest", checkpoint.string()));
    detail::SavedCheckpoint saved =
        detail::parseManifest(readText(checkpoint / kManifest), checkpoint.string());
    detail::loadSavedTensors(checkpoint.string(), saved, tensors, boxes, world.rank());
    info = saved.info;
  });
  return info;
}

} // namespace meshrt
