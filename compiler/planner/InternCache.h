// A cache in front of the evaluator's interning of types and ops by key strings
// (PlanEvaluator::Impl::internType and internStatic): items are found by a hash of their
// structure and compared with the ones seen, so that a key string is built only for an item
// unlike every one before it. A 96-layer block has a hundred thousand values and ops of a few
// hundred kinds; building every one's key was a third of the evaluator's construction. The
// comparison is at least as strict as the key (equal items have equal keys), so the ids are
// the same as without the cache.
#pragma once

#include "ir/IR.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace meshc::plan {

/// Ids of items seen, by hash; `Ref` names an item (a pointer, an index).
template <typename Ref> class InternCache {
public:
  /// The id of an item seen with `hash` for which `same(ref)` holds, or -1.
  template <typename Same> int find(uint64_t hash, Same same) const {
    auto it = seen_.find(hash);
    if (it == seen_.end()) return -1;
    for (const auto& [ref, id] : it->second)
      if (same(ref)) return id;
    return -1;
  }
  void add(uint64_t hash, Ref ref, int id) { seen_[hash].emplace_back(ref, id); }

private:
  std::unordered_map<uint64_t, std::vector<std::pair<Ref, int>>> seen_;
};

inline uint64_t mixHash(uint64_t hash, uint64_t value) {
  return (hash ^ value) * 0x100000001b3ULL + 0x9e3779b97f4a7c15ULL;
}

inline uint64_t typeHash(const ir::TensorType& type) {
  uint64_t hash = static_cast<uint64_t>(type.dtype);
  for (const ir::Dim& dim : type.dims)
    hash =
        mixHash(mixHash(hash, std::hash<std::string>{}(dim.name)), static_cast<uint64_t>(dim.size));
  return hash;
}

/// Equal attribute values, doubles by their bits (a key prints -0 and 0 apart).
inline bool sameAttrValue(const ir::AttrValue& a, const ir::AttrValue& b) {
  if (a.index() != b.index()) return false;
  if (const double* x = std::get_if<double>(&a)) {
    const double* y = std::get_if<double>(&b);
    return std::memcmp(x, y, sizeof(double)) == 0;
  }
  return a == b;
}

inline uint64_t attrValueHash(const ir::AttrValue& value) {
  uint64_t hash = value.index();
  if (const auto* list = std::get_if<std::vector<std::string>>(&value)) {
    for (const std::string& item : *list)
      hash = mixHash(hash, std::hash<std::string>{}(item));
  } else if (const auto* text = std::get_if<std::string>(&value)) {
    hash = mixHash(hash, std::hash<std::string>{}(*text));
  } else if (const auto* integer = std::get_if<int64_t>(&value)) {
    hash = mixHash(hash, static_cast<uint64_t>(*integer));
  } else if (const auto* number = std::get_if<double>(&value)) {
    uint64_t bits = 0;
    std::memcpy(&bits, number, sizeof bits);
    hash = mixHash(hash, bits);
  }
  return hash;
}

} // namespace meshc::plan
