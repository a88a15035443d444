// Which rounding each compared tensor carries: for every output (and every final param of a train
// block), the coarsest float dtype on any path of the IR's data flow into it. A bf16 op rounds
// only what it feeds, so only those tensors compare at bf16's tolerance (Tolerance.h); an f32
// output whose inputs never pass through bf16 keeps f32's.
#pragma once

#include "ir/IR.h"

#include <string>
#include <utility>
#include <vector>

namespace meshc::interp {

/// The tensors of `fn` that are compared with the interpreter, named as --dump-outputs names
/// them (`<fn>.<output>`; for train blocks also `<fn>.param.<path>`, weights and optimizer
/// state), each with the coarsest float dtype ("f32", "bf16", "f16") among the values it is
/// computed from, itself included; "" when no float value reaches it. In a train block a step
/// reads what the earlier steps wrote, so a param's dtype also covers the paths into its updates
/// (to a fixed point), and the outputs read the params of every step.
std::vector<std::pair<std::string, std::string>> pathDtypes(const ir::Function& fn);

} // namespace meshc::interp
