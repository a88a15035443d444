#include "planner/RepeatedSegments.h"

#include <unordered_map>

namespace meshc::plan {

namespace {

/// Periods tried per position: the distances to the next ops with its signature, nearest first.
/// A layer's first op recurs a few times inside the layer at most (a backward's `mul` a few
/// dozen), so its next copy is among the first of them.
constexpr size_t kMaxCandidates = 256;

/// Polynomial hashes of every prefix (modulo 2^64), so that two ranges are compared in O(1). A
/// collision only cuts a segment that does not repeat: the walk's memo checks each copy's
/// structure op by op before it shares anything.
class RangeHash {
public:
  explicit RangeHash(std::span<const int> values)
      : prefix_(values.size() + 1, 0), power_(values.size() + 1, 1) {
    constexpr uint64_t kBase = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < values.size(); ++i) {
      prefix_[i + 1] =
          prefix_[i] * kBase + static_cast<uint64_t>(static_cast<uint32_t>(values[i])) + 1;
      power_[i + 1] = power_[i] * kBase;
    }
  }
  uint64_t of(size_t begin, size_t length) const {
    return prefix_[begin + length] - prefix_[begin] * power_[length];
  }

private:
  std::vector<uint64_t> prefix_, power_;
};

} // namespace

std::vector<OpSegment> findRepeatedSegments(std::span<const int> signature, size_t minOps) {
  size_t n = signature.size();
  std::vector<OpSegment> segments;
  if (minOps == 0) minOps = 1;
  if (n < 2 * minOps) return segments;
  // Per op, the next op with the same signature (n: none).
  std::vector<size_t> next(n, n);
  std::unordered_map<int, size_t> last;
  for (size_t i = n; i-- > 0;) {
    auto [it, inserted] = last.try_emplace(signature[i], i);
    if (!inserted) {
      next[i] = it->second;
      it->second = i;
    }
  }
  RangeHash hash(signature);
  size_t p = 0;
  while (p + 2 * minOps <= n) {
    size_t bestPeriod = 0, bestCopies = 0;
    size_t tried = 0;
    for (size_t q = next[p]; q < n && tried < kMaxCandidates; q = next[q], ++tried) {
      size_t period = q - p;
      if (p + 2 * period > n) break;
      if (period < minOps) continue;
      uint64_t first = hash.of(p, period);
      if (hash.of(q, period) != first) continue;
      size_t copies = 2;
      while (p + (copies + 1) * period <= n && hash.of(p + copies * period, period) == first)
        ++copies;
      if (copies * period > bestCopies * bestPeriod) {
        bestPeriod = period;
        bestCopies = copies;
      }
    }
    if (bestCopies < 2) {
      ++p;
      continue;
    }
    for (size_t c = 0; c < bestCopies; ++c)
      segments.push_back({static_cast<uint32_t>(p + c * bestPeriod),
                          static_cast<uint32_t>(p + (c + 1) * bestPeriod)});
    p += bestCopies * bestPeriod;
  }
  return segments;
}

} // namespace meshc::plan
