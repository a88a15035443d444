// Repeated segments of an op order: the runs of back-to-back copies of one op sequence that an
// unrolled repeat leaves in a function (a decoder's layers, their backward in reverse, the
// optimizer's per-layer updates). The layout search's walk (PlanEvaluator) memoizes its work per
// copy, so that a walk of N identical layers costs about one layer's walk and O(N) bookkeeping.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace meshc::plan {

/// One copy of a repeated op sequence: the ops [begin, end).
struct OpSegment {
  uint32_t begin = 0, end = 0;
};

/// Cuts `signature` (one integer per op; equal integers: ops that look alike) into runs of at
/// least two back-to-back copies of one sequence of at least `minOps` ops, scanning from the
/// front: at each position, the period whose run covers the most ops (on a tie, the shortest);
/// positions that start no such run are left out. Returns the copies in op order, disjoint.
std::vector<OpSegment> findRepeatedSegments(std::span<const int> signature, size_t minOps);

} // namespace meshc::plan
