// The traits of each op, read from the single table in OpKinds.def. Passes ask these instead of
// keeping their own lists of op kinds, so that a new op is described once.
#pragma once

#include "ir/IR.h"

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace meshc::ir {

/// How an op's result type follows from its operands and attributes (the IR verifier's rules,
/// the same ones sema applies when it types a call).
enum class ResultRule : uint8_t {
  Source,    // no operands; the type is given (a declaration, an attribute, sema's choice)
  Same,      // the type of operand 0
  Convert,   // operand 0's dims, in order; any dtype
  Permute,   // operand 0's dtype and dims, in another order
  Expand,    // operand 0's dtype; its dims plus new ones
  Broadcast, // the operands' common dtype; the union of their dims by name
  Compare,   // i32; the union of the operands' dims by name (operands share a dtype)
  Select,    // (cond, a, b): a's and b's dtype; the union of all three operands' dims
  External,  // the union of the operands' dims; the dtype the user's function returns
  Contract,  // the operands' common dtype; a subset of the union of their dims
  Reduce,    // operand 0's dtype and dims less [dims]
  Remap,     // each operand's dims with [from] replaced by [to]; operand 0's dtype
  Positions, // operand 0's dims with [from] replaced by [to]; i32 (positions along [from])
  OneHot,    // the ids' dims plus [dim]; a float dtype
  Gather,    // the table's dtype; the ids' dims plus the table's dims other than [dim]
};
const char* resultRuleName(ResultRule rule);

/// Bits of OpTraits::flags.
enum OpFlag : uint8_t {
  NoTraits = 0,
  Elementwise = 1 << 0,  // a scalar function of the operands' elements at the same named index
  ReadsRng = 1 << 1,     // draws from the layout-invariant counter-based RNG (keyed by [stream])
  SideEffect = 1 << 2,   // writes state other than its result
  NoGradient = 1 << 3,   // differentiating through it is an error (not merely a zero gradient)
  VariesPerRun = 1 << 4, // a source whose value may change between runs (inputs, params, step)
};

/// A set of operand positions (bit k: operand k; every bit: every operand of a variadic op).
using OperandSet = uint8_t;
inline constexpr OperandSet NoOperands = 0;
inline constexpr OperandSet AllOperands = 0xff;
template <typename... Ks> constexpr OperandSet Operands(Ks... ks) {
  return static_cast<OperandSet>(((1u << ks) | ...));
}
inline constexpr int Variadic = -1;

struct OpTraits {
  int arity; // the operand count, or Variadic (one or more)
  ResultRule result;
  OperandSet linear;      // the operands the result is linear in (each with the others fixed)
  OperandSet gradient;    // the operands a gradient flows to
  uint8_t flags;          // OpFlag bits
  std::string_view attrs; // the attributes every instance carries, space separated

  constexpr bool isVariadic() const { return arity == Variadic; }
  constexpr bool acceptsOperandCount(size_t n) const {
    return isVariadic() ? n >= 1 : n == static_cast<size_t>(arity);
  }
  constexpr bool isSource() const { return result == ResultRule::Source; }
  constexpr bool isElementwise() const { return flags & Elementwise; }
  constexpr bool readsRng() const { return flags & ReadsRng; }
  constexpr bool hasSideEffect() const { return flags & SideEffect; }
  constexpr bool rejectsGradient() const { return flags & NoGradient; }
  constexpr bool variesPerRun() const { return flags & VariesPerRun; }
  constexpr bool isDifferentiable() const { return gradient != NoOperands; }
  static constexpr bool contains(OperandSet set, size_t operand) {
    return set == AllOperands || (operand < 8 && (set >> operand) & 1u);
  }
  constexpr bool isLinearIn(size_t operand) const { return contains(linear, operand); }
  constexpr bool hasGradientFor(size_t operand) const { return contains(gradient, operand); }
};

inline constexpr OpTraits kOpTraits[] = {
#define OP(Name, Spelling, Arity, Result, Linear, Gradient, Traits, Attrs, Description)            \
  OpTraits{Arity, ResultRule::Result, Linear, Gradient, Traits, Attrs},
#include "ir/OpKinds.def"
#undef OP
};
inline constexpr size_t kNumOpKinds = std::size(kOpTraits);

constexpr const OpTraits& opTraits(OpKind kind) {
  return kOpTraits[static_cast<size_t>(kind)];
}

/// Per op of `fn`: whether its value is the same in every run and step, so that generated code
/// computes it once, in the constructor (kernel pass hoist-invariants), and the cost model
/// charges it nothing per step: no operand, or only such operands, and neither a source that
/// varies per run nor an RNG draw nor a side effect.
std::vector<char> stepInvariantOps(const Function& fn);

} // namespace meshc::ir
