// Layouts: how named dims map onto named mesh axes. A program-wide Layout gives every dim an
// ordered list of axes (major first; empty = replicated). A TensorLayout is what one value
// actually has: the program layout restricted to its dims, possibly with axes dropped where the
// value cannot use them (an axis used twice), plus the axes over which it is a lazy partial sum.
#pragma once

#include "ir/IR.h"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace meshc::plan {

using AxisList = std::vector<std::string>;

/// The program-wide dim -> axes map. Dims absent from `axes` are replicated.
struct Layout {
  std::map<std::string, AxisList> axes;
  const AxisList& of(const std::string& dim) const;
  bool operator==(const Layout&) const = default;
  bool operator<(const Layout& other) const { return axes < other.axes; }
};

/// The layout of one value.
struct TensorLayout {
  /// Per dim of the value's type, in the type's order: the axes it is split over.
  std::vector<AxisList> dimAxes;
  /// Mesh axes over which every rank holds a partial sum still to be reduced (lazy allreduce).
  std::set<std::string> partialAxes;
  /// Whether the partial sum is a max (softmax's running max) rather than a sum.
  bool partialIsMax = false;
  bool operator==(const TensorLayout&) const = default;
  bool operator<(const TensorLayout& other) const;
};

/// Hashes for the tables that intern layouts (the engine's states, planReshard's states): an
/// ordered map compared whole layouts, axis name by axis name, a dozen times per lookup.
struct AxisListHash {
  size_t operator()(const AxisList& axes) const;
};
struct TensorLayoutHash {
  size_t operator()(const TensorLayout& layout) const;
};

/// The mesh: axes in order, major first; rank r has coordinates in row-major order.
struct Mesh {
  std::vector<ir::MeshAxis> axes;
  int64_t numDevices() const;
  int64_t axisSize(const std::string& axis) const; // 0 if unknown
  int axisIndex(const std::string& axis) const;    // -1 if unknown
};

/// Product of the sizes of `axes`.
int64_t splitFactor(const Mesh& mesh, const AxisList& axes);

/// The layout a value of `type` gets from the program layout: each dim's axes, with an axis
/// already used by an earlier dim of the same value dropped (reported by the planner).
TensorLayout tensorLayoutOf(const ir::TensorType& type, const Layout& layout, const Mesh& mesh);

/// Local (per-device) shape: each dim divided by its split factor (dims divide evenly: the
/// planner rejects or never proposes uneven splits).
ir::TensorType localType(const ir::TensorType& type, const TensorLayout& layout, const Mesh& mesh);

/// "batch: [data], d_ff: [model]" — for reports and tests.
std::string layoutString(const Layout& layout);
std::string tensorLayoutString(const ir::TensorType& type, const TensorLayout& layout);

} // namespace meshc::plan
