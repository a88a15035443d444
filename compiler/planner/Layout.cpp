#include "planner/Layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

namespace meshc::plan {

const AxisList& Layout::of(const std::string& dim) const {
  static const AxisList kReplicated;
  auto it = axes.find(dim);
  return it == axes.end() ? kReplicated : it->second;
}

namespace {

/// FNV-1a over the bytes of `text`, and a separator, into `hash`.
void mixString(size_t& hash, const std::string& text) {
  for (char c : text)
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  hash = (hash ^ 0xffu) * 1099511628211ull;
}

void mixAxes(size_t& hash, const AxisList& axes) {
  for (const std::string& axis : axes)
    mixString(hash, axis);
  hash = (hash ^ 0xfeu) * 1099511628211ull; // where the list ends: [a][b] is not [a, b][]
}

} // namespace

size_t AxisListHash::operator()(const AxisList& axes) const {
  size_t hash = 1469598103934665603ull;
  mixAxes(hash, axes);
  return hash;
}

size_t TensorLayoutHash::operator()(const TensorLayout& layout) const {
  size_t hash = 1469598103934665603ull;
  for (const AxisList& axes : layout.dimAxes)
    mixAxes(hash, axes);
  hash = (hash ^ 0xfdu) * 1099511628211ull;
  for (const std::string& axis : layout.partialAxes)
    mixString(hash, axis);
  return (hash ^ (layout.partialIsMax ? 1u : 2u)) * 1099511628211ull;
}

bool TensorLayout::operator<(const TensorLayout& other) const {
  return std::tie(dimAxes, partialAxes, partialIsMax) <
         std::tie(other.dimAxes, other.partialAxes, other.partialIsMax);
}

int64_t Mesh::numDevices() const {
  int64_t n = 1;
  for (const ir::MeshAxis& axis : axes)
    n *= axis.size;
  return n;
}

int64_t Mesh::axisSize(const std::string& axis) const {
  int index = axisIndex(axis);
  return index < 0 ? 0 : axes[index].size;
}

int Mesh::axisIndex(const std::string& axis) const {
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i].name == axis) return static_cast<int>(i);
  return -1;
}

int64_t splitFactor(const Mesh& mesh, const AxisList& axes) {
  int64_t factor = 1;
  for (const std::string& axis : axes)
    factor *= std::max<int64_t>(mesh.axisSize(axis), 1);
  return factor;
}

TensorLayout tensorLayoutOf(const ir::TensorType& type, const Layout& layout, const Mesh& mesh) {
  TensorLayout out;
  std::set<std::string> used;
  for (const ir::Dim& dim : type.dims) {
    AxisList axes;
    for (const std::string& axis : layout.of(dim.name))
      if (mesh.axisIndex(axis) >= 0 && used.insert(axis).second) axes.push_back(axis);
    out.dimAxes.push_back(std::move(axes));
  }
  return out;
}

ir::TensorType localType(const ir::TensorType& type, const TensorLayout& layout, const Mesh& mesh) {
  ir::TensorType local = type;
  for (size_t i = 0; i < local.dims.size() && i < layout.dimAxes.size(); ++i) {
    int64_t factor = splitFactor(mesh, layout.dimAxes[i]);
    local.dims[i].size = factor > 0 ? local.dims[i].size / factor : local.dims[i].size;
  }
  return local;
}

static std::string axesString(const AxisList& axes) {
  return fmt::format("[{}]", fmt::join(axes, ", "));
}

std::string layoutString(const Layout& layout) {
  std::vector<std::string> items;
  for (const auto& [dim, axes] : layout.axes)
    if (!axes.empty()) items.push_back(fmt::format("{}: {}", dim, axesString(axes)));
  if (items.empty()) return "replicated";
  return fmt::format("{}", fmt::join(items, ", "));
}

std::string tensorLayoutString(const ir::TensorType& type, const TensorLayout& layout) {
  std::vector<std::string> items;
  for (size_t i = 0; i < type.dims.size(); ++i) {
    const AxisList* axes = i < layout.dimAxes.size() ? &layout.dimAxes[i] : nullptr;
    if (axes && !axes->empty())
      items.push_back(fmt::format("{}:{}", type.dims[i].name, axesString(*axes)));
    else
      items.push_back(type.dims[i].name);
  }
  std::string out = fmt::format("[{}]", fmt::join(items, ", "));
  if (!layout.partialAxes.empty())
    out += fmt::format(" partial-{}{{{}}}", layout.partialIsMax ? "max" : "sum",
                       fmt::join(layout.partialAxes, ", "));
  return out;
}

} // namespace meshc::plan
