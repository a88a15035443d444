// Resharding: the cheapest sequence of collectives that turns a value from one TensorLayout
// (possibly a lazy partial sum or max) into another (resolved), found as a shortest path
// (Dijkstra) over layout states rather than picked from a fixed list of patterns.
//
// Edges from a state: all-reduce of some partial axes; reduce-scatter of some partial axes into
// a dim (appended as its minor-most axes); all-gather of a dim's minor-most axes; a free local
// slice (an unused axis appended to a dim); all-to-all (a dim's minor-most axis moved to be the
// minor-most axis of another dim). Every state is legal: no axis used twice, splits divide the
// dim sizes, partial axes split no dim. Edge costs come from CostModel with the bytes of the
// local shards at that state.
#pragma once

#include "planner/CostModel.h"

#include <optional>
#include <vector>

namespace meshc::plan {

/// Bytes of one element of `dtype`.
int64_t dtypeBytes(ir::DType dtype);

/// Bytes of one device's shard of a value of `type` laid out as `layout`.
int64_t localBytes(const ir::TensorType& type, const TensorLayout& layout, const Mesh& mesh);

/// Whether `layout` fits `type` on `mesh`: one axis list per dim, known axes, no axis used twice
/// (by dims or as a partial axis), every dim divisible by its split factor.
bool isLegalLayout(const ir::TensorType& type, const TensorLayout& layout, const Mesh& mesh);

struct ReshardStep {
  Collective collective;
  TensorLayout after; // the value's layout once this step has run
  double seconds = 0;
};

struct ReshardPath {
  std::vector<ReshardStep> steps; // empty when from == to
  double seconds = 0;
};

/// The cheapest path from `from` to `to` (costs within a relative 1e-9 tie: fewer steps wins).
/// `to` may keep some of `from`'s partial axes (a linear consumer that needs other splits keeps
/// the sum lazy). nullopt when `from` or `to` is illegal for `type`, or `to` is partial over an
/// axis `from` is not.
std::optional<ReshardPath> planReshard(const ir::TensorType& type, const TensorLayout& from,
                                       const TensorLayout& to, const Mesh& mesh,
                                       const Machine& machine);

} // namespace meshc::plan
