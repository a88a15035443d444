// Reshard paths shared by the evaluators of a process (ReshardMemo.h).
#include "planner/ReshardMemo.h"

#include "planner/CostModel.h"

#include <fmt/format.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace meshc::plan {

struct ReshardMemo::Context {
  Machine machine;
  Mesh mesh;
  std::map<std::tuple<std::string, TensorLayout, TensorLayout>, ReshardEntry> entries;
};

namespace {

/// Machine's fields, in order: a field added to Machine changes its size, and this assertion
/// asks for it in machineKey too (a memo shared by two machines that differ in it would be wrong).
struct MachineFields {
  std::string name, description;
  int64_t numDevices, devicesPerNode, meshCopies;
  double peakFlops, peakFlopsBf16, memoryBandwidth, memoryBytes, cacheBytes, cacheBandwidth,
      gemmLatencySeconds, oversubscribedSyncSeconds, sharedCoreSyncSeconds;
  int64_t cores;
  double gemmShapeDim, vectorFlops, transcendentalFlops, randomFlops, normalFlops,
      loopLatencySeconds, softmaxElementSeconds, layerNormElementSeconds, reduceElementSeconds;
  Link intra, inter;
};
static_assert(sizeof(MachineFields) == sizeof(Machine),
              "a Machine field is missing from machineKey");

/// Every field of the machine and the mesh, the numbers exactly (fmt's shortest round trip).
std::string contextKey(const Machine& m, const Mesh& mesh) {
  std::string key = fmt::format(
      "{}\n{}\n{} {} {}\n{} {} {} {} {} {} {} {} {}\n{}\n{} {} {} {} {} {} {} {} {}\n{} {} {}\n{} "
      "{} {}\n",
      m.name, m.description, m.numDevices, m.devicesPerNode, m.meshCopies, m.peakFlops,
      m.peakFlopsBf16, m.memoryBandwidth, m.memoryBytes, m.cacheBytes, m.cacheBandwidth,
      m.gemmLatencySeconds, m.oversubscribedSyncSeconds, m.sharedCoreSyncSeconds, m.cores,
      m.gemmShapeDim, m.vectorFlops, m.transcendentalFlops, m.randomFlops, m.normalFlops,
      m.loopLatencySeconds, m.softmaxElementSeconds, m.layerNormElementSeconds,
      m.reduceElementSeconds, m.intra.name, m.intra.alphaSeconds, m.intra.bandwidthBytesPerS,
      m.inter.name, m.inter.alphaSeconds, m.inter.bandwidthBytesPerS);
  for (const ir::MeshAxis& axis : mesh.axes)
    key += fmt::format("{}={},", axis.name, axis.size);
  return key;
}

std::mutex& memoMutex() {
  static std::mutex mutex;
  return mutex;
}

} // namespace

ReshardMemo::ReshardMemo(const Machine& machine, const Mesh& mesh) {
  // The contexts are few (one per machine and mesh planned on) and never freed: entries handed
  // out stay valid for every evaluator.
  static std::map<std::string, std::unique_ptr<Context>> contexts;
  std::string key = contextKey(machine, mesh);
  std::lock_guard<std::mutex> lock(memoMutex());
  std::unique_ptr<Context>& context = contexts[key];
  if (!context) context.reset(new Context{machine, mesh, {}});
  context_ = context.get();
}

const ReshardEntry& ReshardMemo::entry(const std::string& typeKey, const ir::TensorType& type,
                                       const TensorLayout& from, const TensorLayout& to) const {
  auto key = std::make_tuple(typeKey, from, to);
  {
    std::lock_guard<std::mutex> lock(memoMutex());
    auto it = context_->entries.find(key);
    if (it != context_->entries.end()) return it->second;
  }
  const Machine& machine = context_->machine;
  const Mesh& mesh = context_->mesh;
  ReshardEntry entry;
  entry.path = planReshard(type, from, to, mesh, machine);
  if (entry.path)
    for (const ReshardStep& step : entry.path->steps) {
      entry.mergeableSeconds.push_back(mergeableLatencySeconds(machine, mesh, step.collective));
      entry.stepBytes.push_back(static_cast<double>(localBytes(type, step.after, mesh)));
    }
  std::lock_guard<std::mutex> lock(memoMutex());
  return context_->entries.try_emplace(std::move(key), std::move(entry)).first->second;
}

} // namespace meshc::plan
