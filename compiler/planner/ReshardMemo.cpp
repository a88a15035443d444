// Reshard paths shared by the evaluators of a process (ReshardMemo.h).
#include "planner/ReshardMemo.h"

#include "planner/CostModel.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

namespace meshc::plan {

struct ReshardMemo::Context {
  Machine machine;
  Mesh mesh;
  std::map<std::tuple<std::string, TensorLayout, TensorLayout>, ReshardEntry> entries;
};

namespace {

/// Whether two meshes have the same axes, names and sizes in order.
bool sameMesh(const Mesh& a, const Mesh& b) {
  return a.axes.size() == b.axes.size() &&
         std::equal(a.axes.begin(), a.axes.end(), b.axes.begin(),
                    [](const ir::MeshAxis& x, const ir::MeshAxis& y) {
                      return x.name == y.name && x.size == y.size;
                    });
}

std::mutex& memoMutex() {
  static std::mutex mutex;
  return mutex;
}

} // namespace

ReshardMemo::ReshardMemo(const Machine& machine, const Mesh& mesh) {
  // The contexts are few (one per machine and mesh planned on) and never freed: entries handed
  // out stay valid for every evaluator.
  static std::vector<std::unique_ptr<Context>> contexts;
  std::lock_guard<std::mutex> lock(memoMutex());
  for (const std::unique_ptr<Context>& context : contexts)
    if (context->machine == machine && sameMesh(context->mesh, mesh)) {
      context_ = context.get();
      return;
    }
  contexts.push_back(std::unique_ptr<Context>(new Context{machine, mesh, {}}));
  context_ = contexts.back().get();
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
