// Parsing and checking a checkpoint manifest read back from disk (see CheckpointManifest.h).
#include "CheckpointManifest.h"

// Header-only fmt, as in Checkpoint.cpp: programs link meshrt without libfmt.
#define FMT_HEADER_ONLY
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <limits>
#include <regex>
#include <set>

namespace meshrt::detail {
namespace {

using json = nlohmann::json;

/// Reads one manifest: every check names `where` (the checkpoint, then the tensor) in its error.
class ManifestReader {
public:
  explicit ManifestReader(std::string where) : where_(std::move(where)) {}

  SavedCheckpoint read(const json& manifest) {
    expectObject(manifest, "the manifest");
    if (stringAt(manifest, "format") != kManifestFormat)
      fail(fmt::format("format '{}' is not {}", stringAt(manifest, "format"), kManifestFormat));
    int64_t version = integerAt(manifest, "version", 0, std::numeric_limits<int>::max());
    if (version != kManifestVersion)
      throw CheckpointError(fmt::format("{} has format version {}, this meshrt reads {}", where_,
                                        version, kManifestVersion));
    SavedCheckpoint saved;
    saved.info.step = integerAt(manifest, "step", std::numeric_limits<int64_t>::min(),
                                std::numeric_limits<int64_t>::max());
    const json& metadata = manifest.at("metadata");
    expectObject(metadata, "'metadata'");
    for (const auto& [key, value] : metadata.items()) {
      if (!value.is_string()) fail(fmt::format("metadata '{}' is not a string", key));
      saved.info.metadata[key] = value.get<std::string>();
    }
    std::set<std::string> names;
    for (const json& tensor : arrayAt(manifest, "tensors")) {
      saved.tensors.push_back(readTensor(tensor));
      if (!names.insert(saved.tensors.back().name).second)
        fail(fmt::format("tensor '{}' is listed twice", saved.tensors.back().name));
    }
    return saved;
  }

private:
  [[noreturn]] void fail(const std::string& problem) const {
    throw CheckpointError(fmt::format("{}: malformed manifest: {}", where_, problem));
  }

  void expectObject(const json& value, const char* what) const {
    if (!value.is_object()) fail(fmt::format("{} is not an object", what));
  }
  const json& arrayAt(const json& object, const char* key) const {
    expectObject(object, "an entry");
    const json& value = object.at(key);
    if (!value.is_array()) fail(fmt::format("'{}' is not an array", key));
    return value;
  }
  std::string stringAt(const json& object, const char* key) const {
    expectObject(object, "an entry");
    const json& value = object.at(key);
    if (!value.is_string()) fail(fmt::format("'{}' is not a string", key));
    return value.get<std::string>();
  }
  /// An integer in [low, high]: floats are refused (converting one out of range is undefined).
  int64_t integer(const json& value, const std::string& what, int64_t low, int64_t high) const {
    if (value.is_number_unsigned()) {
      uint64_t number = value.get<uint64_t>();
      if (high >= 0 && number <= uint64_t(high)) return int64_t(number);
    } else if (value.is_number_integer()) {
      int64_t number = value.get<int64_t>();
      if (number >= low && number <= high) return number;
    } else {
      fail(fmt::format("{} is not an integer", what));
    }
    fail(fmt::format("{} {} is outside [{}, {}]", what, value.dump(), low, high));
  }
  int64_t integerAt(const json& object, const char* key, int64_t low, int64_t high) const {
    expectObject(object, "an entry");
    return integer(object.at(key), fmt::format("'{}'", key), low, high);
  }
  std::vector<int64_t> box(const json& shard, const char* key, size_t rank, int64_t high) const {
    std::vector<int64_t> sizes;
    for (const json& size : arrayAt(shard, key))
      sizes.push_back(integer(size, fmt::format("'{}' entry", key), 0, high));
    if (sizes.size() != rank)
      fail(fmt::format("'{}' has {} entries for {} dims", key, sizes.size(), rank));
    return sizes;
  }

  SavedTensor readTensor(const json& entry) {
    SavedTensor tensor;
    tensor.name = stringAt(entry, "name");
    tensor.dtype = stringAt(entry, "dtype");
    std::string storage = stringAt(entry, "storage");
    bool known = false;
    for (DType dtype : {DType::F32, DType::F64, DType::I32, DType::Bytes})
      if (storage == dtypeName(dtype)) {
        tensor.storage = dtype;
        known = true;
      }
    std::string where = fmt::format("tensor '{}'", tensor.name);
    if (!known) fail(fmt::format("{}: unknown storage type '{}'", where, storage));
    // The tensor's bytes must be countable: every shard's size below is at most this.
    uint64_t elements = 1;
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    for (const json& dim : arrayAt(entry, "dims")) {
      tensor.dims.push_back({stringAt(dim, "name"), integerAt(dim, "size", 0, kMax), {}});
      if (__builtin_mul_overflow(elements, uint64_t(tensor.dims.back().size), &elements) ||
          elements > uint64_t(kMax) / dtypeSize(tensor.storage))
        fail(fmt::format("{}: its dims hold more than 2^63 bytes", where));
    }
    for (const json& shard : arrayAt(entry, "shards"))
      tensor.shards.push_back(readShard(shard, tensor, where));
    return tensor;
  }

  SavedShard readShard(const json& entry, const SavedTensor& tensor, const std::string& where) {
    SavedShard shard;
    shard.rank = int(integerAt(entry, "rank", 0, std::numeric_limits<int>::max()));
    shard.file = stringAt(entry, "file");
    // Exactly the names saves write (rankFileName): nothing else is ever opened.
    static const std::regex rankFile("rank-[0-9]{5,9}\\.bin");
    if (!std::regex_match(shard.file, rankFile))
      fail(fmt::format("{}: shard file '{}' is not a rank file (rank-NNNNN.bin)", where,
                       shard.file));
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    shard.offset = uint64_t(integerAt(entry, "offset", 0, kMax));
    shard.bytes = uint64_t(integerAt(entry, "bytes", 0, kMax - int64_t(shard.offset)));
    shard.crc32 = uint32_t(integerAt(entry, "crc32", 0, std::numeric_limits<uint32_t>::max()));
    shard.box.start = box(entry, "start", tensor.dims.size(), kMax);
    shard.box.shape = box(entry, "shape", tensor.dims.size(), kMax);
    uint64_t elements = 1;
    for (size_t d = 0; d < tensor.dims.size(); ++d) {
      if (shard.box.start[d] > tensor.dims[d].size - shard.box.shape[d])
        fail(fmt::format("{}: the shard of rank {} (start {}, shape {}) is not inside its dims",
                         where, shard.rank, fmt::join(shard.box.start, "x"),
                         fmt::join(shard.box.shape, "x")));
      elements *= uint64_t(shard.box.shape[d]); // at most the tensor's count (checked above)
    }
    if (shard.bytes != elements * dtypeSize(tensor.storage))
      fail(fmt::format("{}: the shard of rank {} in '{}' has {} bytes for shape {}", where,
                       shard.rank, shard.file, shard.bytes, fmt::join(shard.box.shape, "x")));
    return shard;
  }

  std::string where_;
};

} // namespace

SavedCheckpoint parseManifest(std::string_view text, const std::string& checkpoint) {
  std::string where = fmt::format("checkpoint '{}'", checkpoint);
  try {
    return ManifestReader(where).read(json::parse(text.begin(), text.end()));
  } catch (const json::exception& error) {
    throw CheckpointError(fmt::format("{}: malformed manifest: {}", where, error.what()));
  }
}

} // namespace meshrt::detail
