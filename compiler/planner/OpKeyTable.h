// The per-op inputs of the SPMD rules' memo key (PlanEvaluator::Impl::planOf), stored flat and
// in op order, with each op's last key and plan, and a copy of what a walk reads of that plan
// (its cost and the operand layouts it requires). A layout search walks every op of a function
// for each of thousands of candidate layouts; reading each ir::Op's operand vector, each op's
// dims and each plan from their own heap blocks made that walk wait on memory for most of
// planning time (the 48-layer train block: about 10,000 ops per walk). Here a walk reads a few
// arrays front to back.
#pragma once

#include "ir/IR.h"

#include <cstdint>
#include <span>
#include <vector>

namespace meshc::plan {

template <typename Plan, typename Cost> class OpKeyTable {
public:
  /// Key entries before the operands' states and the dims' axes (planOf: static id, phase,
  /// eager mask, partner state).
  static constexpr size_t kFixedEntries = 4;

  /// Room for `ops` ops reading `inputs` operands and dims in all (add() then never moves the
  /// arrays).
  void reserve(size_t ops, size_t inputs) {
    entries_.reserve(ops);
    lastPlans_.reserve(ops);
    lastCosts_.reserve(ops);
    inputs_.reserve(inputs);
    lastRequired_.reserve(inputs);
    lastKeys_.reserve(kFixedEntries * ops + inputs);
  }

  /// Appends the next op: the values it reads and the dims whose axes its plan depends on.
  void add(const std::vector<ir::ValueId>& operands, const std::vector<int>& dims,
           ir::ValueId result) {
    Entry entry;
    entry.result = result;
    entry.begin = static_cast<uint32_t>(inputs_.size());
    entry.numOperands = static_cast<uint16_t>(operands.size());
    entry.numDims = static_cast<uint16_t>(dims.size());
    entry.keyBegin = static_cast<uint32_t>(lastKeys_.size());
    inputs_.insert(inputs_.end(), operands.begin(), operands.end());
    inputs_.insert(inputs_.end(), dims.begin(), dims.end());
    lastRequired_.resize(inputs_.size());
    lastKeys_.resize(lastKeys_.size() + kFixedEntries + operands.size() + dims.size());
    entries_.push_back(entry);
    lastPlans_.push_back(nullptr);
    lastCosts_.emplace_back();
  }

  ir::ValueId result(uint32_t op) const { return entries_[op].result; }

  std::span<const ir::ValueId> operands(uint32_t op) const {
    const Entry& entry = entries_[op];
    return {inputs_.data() + entry.begin, entry.numOperands};
  }
  /// Dim indices (stored as value ids: both are small unsigned integers).
  std::span<const ir::ValueId> dims(uint32_t op) const {
    const Entry& entry = entries_[op];
    return {inputs_.data() + entry.begin + entry.numOperands, entry.numDims};
  }
  size_t keySize(uint32_t op) const {
    return kFixedEntries + entries_[op].numOperands + entries_[op].numDims;
  }

  /// The plan of the op's last key, when `key` (keySize(op) entries) is that key again.
  const Plan* lastPlan(uint32_t op, const int* key) const {
    const Plan* plan = lastPlans_[op];
    if (!plan) return nullptr;
    const int* last = lastKeys_.data() + entries_[op].keyBegin;
    for (size_t k = 0, n = keySize(op); k < n; ++k)
      if (last[k] != key[k]) return nullptr;
    return plan;
  }
  /// Makes `plan` (with its cost and its operands' required layouts, one per operand) the op's
  /// last, for `key`.
  void setLast(uint32_t op, const int* key, const Plan* plan, const Cost& cost,
               const std::vector<int>& required) {
    const Entry& entry = entries_[op];
    int* last = lastKeys_.data() + entry.keyBegin;
    for (size_t k = 0, n = keySize(op); k < n; ++k)
      last[k] = key[k];
    lastPlans_[op] = plan;
    lastCosts_[op] = cost;
    for (size_t k = 0; k < entry.numOperands && k < required.size(); ++k)
      lastRequired_[entry.begin + k] = required[k];
  }
  /// Of the op's last plan: its cost, and the layout it requires of each operand.
  const Cost& cost(uint32_t op) const { return lastCosts_[op]; }
  std::span<const int> required(uint32_t op) const {
    const Entry& entry = entries_[op];
    return {lastRequired_.data() + entry.begin, entry.numOperands};
  }

private:
  struct Entry {
    uint32_t begin = 0, keyBegin = 0;
    ir::ValueId result = 0;
    uint16_t numOperands = 0, numDims = 0;
  };
  std::vector<Entry> entries_;
  std::vector<ir::ValueId> inputs_; // per op: its operands, then its dims
  std::vector<int> lastKeys_;       // per op: its last key, keySize(op) entries
  std::vector<const Plan*> lastPlans_;
  std::vector<Cost> lastCosts_;
  std::vector<int> lastRequired_; // per op, at its operands' offset in inputs_
};

} // namespace meshc::plan
