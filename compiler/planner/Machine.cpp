#include "planner/Machine.h"

#include <llvm/ADT/SmallVector.h>
#include <llvm/Support/JSON.h>
#include <llvm/Support/MemoryBuffer.h>

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace meshc::plan {

namespace {

struct BuiltinMachine {
  const char* name;
  const char* json;
};

const BuiltinMachine kBuiltinMachines[] = {
#include "planner/BuiltinMachines.inc"
};

llvm::Error parseError(llvm::StringRef sourceName, const std::string& message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), "%s: %s", sourceName.str().c_str(),
                                 message.c_str());
}

/// Reads the fields of one JSON object, remembering the first problem (with the field's path).
class FieldReader {
public:
  FieldReader(const llvm::json::Object& object, std::string path, std::string* error)
      : object_(object), path_(std::move(path)), error_(error) {}

  double number(llvm::StringRef key, bool required = true, double fallback = 0) {
    const llvm::json::Value* value = object_.get(key);
    if (!value) {
      if (required) fail(fmt::format("missing field '{}{}' (a number)", path_, key.str()));
      return fallback;
    }
    auto number = value->getAsNumber();
    if (!number) {
      fail(fmt::format("field '{}{}' must be a number", path_, key.str()));
      return fallback;
    }
    if (*number < 0) {
      fail(fmt::format("field '{}{}' must not be negative", path_, key.str()));
      return fallback;
    }
    return *number;
  }

  int64_t count(llvm::StringRef key, bool required, int64_t fallback) {
    const llvm::json::Value* value = object_.get(key);
    if (!value) {
      if (required)
        fail(fmt::format("missing field '{}{}' (a positive integer)", path_, key.str()));
      return fallback;
    }
    auto integer = value->getAsInteger();
    if (!integer || *integer < 1) {
      fail(fmt::format("field '{}{}' must be a positive integer", path_, key.str()));
      return fallback;
    }
    return *integer;
  }

  std::string string(llvm::StringRef key, bool required) {
    const llvm::json::Value* value = object_.get(key);
    if (!value) {
      if (required) fail(fmt::format("missing field '{}{}' (a string)", path_, key.str()));
      return {};
    }
    auto text = value->getAsString();
    if (!text) {
      fail(fmt::format("field '{}{}' must be a string", path_, key.str()));
      return {};
    }
    return text->str();
  }

  const llvm::json::Object* object(llvm::StringRef key, bool required) {
    const llvm::json::Value* value = object_.get(key);
    if (!value) {
      if (required) fail(fmt::format("missing field '{}{}' (an object)", path_, key.str()));
      return nullptr;
    }
    const llvm::json::Object* nested = value->getAsObject();
    if (!nested) fail(fmt::format("field '{}{}' must be an object", path_, key.str()));
    return nested;
  }

  void fail(std::string message) {
    if (error_->empty()) *error_ = std::move(message);
  }

private:
  const llvm::json::Object& object_;
  std::string path_;
  std::string* error_;
};

Link readLink(const llvm::json::Object& object, const std::string& path, std::string* error) {
  FieldReader reader(object, path + ".", error);
  Link link;
  link.name = reader.string("name", true);
  link.alphaSeconds = reader.number("alpha_seconds");
  link.bandwidthBytesPerS = reader.number("bandwidth");
  if (error->empty() && link.bandwidthBytesPerS <= 0)
    reader.fail(fmt::format("field '{}.bandwidth' must be positive", path));
  return link;
}

} // namespace

std::vector<std::string> builtinMachineNames() {
  std::vector<std::string> names;
  for (const BuiltinMachine& builtin : kBuiltinMachines)
    names.push_back(builtin.name);
  return names;
}

llvm::Expected<Machine> parseMachine(llvm::StringRef json, llvm::StringRef sourceName) {
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(json);
  if (!parsed) return parseError(sourceName, "invalid JSON: " + llvm::toString(parsed.takeError()));
  const llvm::json::Object* root = parsed->getAsObject();
  if (!root) return parseError(sourceName, "a machine description must be a JSON object");

  std::string error;
  FieldReader reader(*root, "", &error);
  Machine machine;
  machine.name = reader.string("name", true);
  machine.description = reader.string("description", false);
  machine.numDevices = reader.count("devices", true, 1);
  machine.devicesPerNode = reader.count("devices_per_node", false, machine.numDevices);
  machine.peakFlops = reader.number("peak_flops");
  machine.peakFlopsBf16 = reader.number("peak_flops_bf16", false, 0);
  machine.memoryBandwidth = reader.number("memory_bandwidth");
  machine.memoryBytes = reader.number("memory_bytes");
  machine.cacheBytes = reader.number("cache_bytes", false, 0);
  machine.cacheBandwidth = reader.number("cache_bandwidth", false, 0);
  machine.gemmLatencySeconds = reader.number("gemm_latency_seconds", false, 0);
  machine.oversubscribedSyncSeconds = reader.number("oversubscribed_sync_seconds", false, 0);
  machine.sharedCoreSyncSeconds =
      reader.number("shared_core_sync_seconds", false, machine.oversubscribedSyncSeconds);
  machine.oversubscribedSyncRankSeconds =
      reader.number("oversubscribed_sync_rank_seconds", false, 0);
  machine.cores = reader.count("cores", false, 0);
  machine.gemmShapeDim = reader.number("gemm_shape_dim", false, 0);
  machine.gemmBatchSeconds = reader.number("gemm_batch_seconds", false, 0);
  machine.smallGemmTerms = reader.number("small_gemm_terms", false, 0);
  machine.vectorFlops = reader.number("vector_flops", false, 0);
  machine.transcendentalFlops = reader.number("transcendental_flops", false, 0);
  machine.randomFlops = reader.number("random_flops", false, 0);
  machine.normalFlops = reader.number("normal_flops", false, 0);
  machine.loopLatencySeconds = reader.number("loop_latency_seconds", false, 0);
  machine.softmaxElementSeconds = reader.number("softmax_element_seconds", false, 0);
  machine.softmaxRowSeconds = reader.number("softmax_row_seconds", false, 0);
  machine.layerNormElementSeconds = reader.number("layer_norm_element_seconds", false, 0);
  machine.reduceElementSeconds = reader.number("reduce_element_seconds", false, 0);
  machine.outputSeconds = reader.number("output_seconds", false, 0);
  reader.string("notes", false); // free text: sources and assumptions
  if (error.empty() && machine.peakFlops <= 0) reader.fail("field 'peak_flops' must be positive");
  if (error.empty() && machine.memoryBandwidth <= 0)
    reader.fail("field 'memory_bandwidth' must be positive");
  if (const llvm::json::Object* intra = reader.object("intra", true); intra && error.empty())
    machine.intra = readLink(*intra, "intra", &error);
  const llvm::json::Object* inter = reader.object("inter", false);
  if (inter && error.empty())
    machine.inter = readLink(*inter, "inter", &error);
  else
    machine.inter = machine.intra;
  if (error.empty() && !inter && machine.devicesPerNode < machine.numDevices)
    reader.fail("missing field 'inter' (an object): the machine has several nodes");
  if (!error.empty()) return parseError(sourceName, error);
  return machine;
}

llvm::Expected<Machine> loadMachine(const std::string& nameOrPath) {
  for (const BuiltinMachine& builtin : kBuiltinMachines)
    if (nameOrPath == builtin.name)
      return parseMachine(builtin.json, std::string("machines/") + builtin.name + ".json");
  llvm::ErrorOr<std::unique_ptr<llvm::MemoryBuffer>> file =
      llvm::MemoryBuffer::getFile(nameOrPath, /*IsText=*/true);
  if (!file) {
    std::vector<std::string> names = builtinMachineNames();
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(), "%s",
        fmt::format("unknown machine '{}': not a built-in ({}) and not a readable file ({})",
                    nameOrPath, fmt::join(names, ", "), file.getError().message())
            .c_str());
  }
  return parseMachine((*file)->getBuffer(), nameOrPath);
}

const Link& linkFor(const Machine& machine, const Mesh& mesh, const AxisList& axes) {
  if (machine.devicesPerNode >= machine.numDevices || axes.empty()) return machine.intra;
  // Every collective a search costs asks (planReshard's edges: a quarter of its time went to
  // walking the 64 ranks of h100-cluster), about a few axis lists of one mesh: the answers are
  // kept by all that decides them, the machine's devices and node size, the mesh's axis sizes
  // and the group's axes' indices.
  llvm::SmallVector<int64_t, 12> key{machine.numDevices, machine.devicesPerNode};
  for (const ir::MeshAxis& axis : mesh.axes)
    key.push_back(axis.size);
  key.push_back(-2); // the sizes end: -1 is an unknown axis's index
  for (const std::string& axis : axes)
    key.push_back(mesh.axisIndex(axis));
  thread_local std::vector<std::pair<llvm::SmallVector<int64_t, 12>, bool>> known;
  for (const auto& [seen, spans] : known)
    if (seen == key) return spans ? machine.inter : machine.intra;
  // Ranks beyond the machine wrap around (oversubscription).
  auto nodeOf = [&](int64_t rank) { return (rank % machine.numDevices) / machine.devicesPerNode; };
  bool spans = groupSpans(mesh, axes, nodeOf);
  if (known.size() >= 64) known.clear(); // a few meshes at a time: no need to keep them all
  known.emplace_back(std::move(key), spans);
  return spans ? machine.inter : machine.intra;
}

bool groupSpans(const Mesh& mesh, const AxisList& axes,
                llvm::function_ref<int64_t(int64_t)> placeOf) {
  // Row-major ranks: the stride of axis i is the product of the sizes of the axes after it. A
  // group spans places when some member lies elsewhere than the group's first rank.
  int64_t numRanks = mesh.numDevices();
  std::vector<int64_t> strides(mesh.axes.size(), 1);
  for (int i = static_cast<int>(mesh.axes.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * mesh.axes[i + 1].size;
  // The group's axes found in the mesh once, not once per rank (every collective a search costs
  // asks, and the ranks are 64 on h100-cluster): (stride, size) of each.
  llvm::SmallVector<std::pair<int64_t, int64_t>, 4> members;
  for (const std::string& axis : axes) {
    int index = mesh.axisIndex(axis);
    if (index >= 0) members.emplace_back(strides[index], mesh.axes[index].size);
  }
  for (int64_t rank = 0; rank < numRanks; ++rank) {
    int64_t base = rank;
    for (const auto& [stride, size] : members)
      base -= (rank / stride % size) * stride;
    if (placeOf(rank) != placeOf(base)) return true;
  }
  return false;
}

} // namespace meshc::plan
