// The reference interpreter: runs one IR function on one device. It is the oracle every
// sharded run and every generated program is checked against, so it favours clarity and
// numerical care over speed: values are held in double and rounded to their dtype after
// every op; reductions accumulate in double; softmax, logsumexp and layer_norm are stable.
#pragma once

#include "ir/IR.h"

#include <llvm/Support/Error.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace meshc::interp {

struct UserFunctions; // interp/UserFunctions.h

/// A dense row-major tensor over its type's dims, values already rounded to the dtype.
struct Tensor {
  ir::TensorType type;
  std::vector<double> data;
};

using TensorMap = std::map<std::string, Tensor>;

struct Options {
  uint64_t seed = 0;     // keys every RNG stream (inputs, params, dropout, random ops)
  bool training = false; // dropout is active only when training
  uint64_t step = 0;     // the train step: the `step` op's value; keys train-block RNG streams
  /// Round every op's result to its dtype (the oracle's behaviour). Off: float values stay in
  /// double throughout (i32 still wraps), for finite-difference gradient checks.
  bool roundToDtype = true;
  int64_t maxElements = int64_t(1) << 28; // per tensor; larger ones are an error, not an OOM
  /// The user's functions for `call` ops (loadUserFunctions); a `call` without one is an error.
  const UserFunctions* userFunctions = nullptr;
};

/// Deterministic input values: f32 normal(0, 1); i32 uniform in [0, indexBound) (or {0, 1}).
/// Keyed by (seed, input name, global element index), so any shard reproduces them.
Tensor synthesizeInput(const ir::InputInfo& input, uint64_t seed);

/// A parameter's initial value from its initializer, keyed by (seed, path, global index).
Tensor initializeParam(const ir::ParamInfo& param, uint64_t seed);

/// Runs `fn`. `inputs` must hold every input by name with its exact type (else an error);
/// params are initialized from `opts.seed` unless given in `params` by path.
/// Returns the outputs by name (a train block returns "loss").
llvm::Expected<TensorMap> run(const ir::Function& fn, const TensorMap& inputs, const Options& opts,
                              const TensorMap& params = {});

/// One train step of a train block that has been through the training phase: runs `fn` with
/// every param read from `state` (by path; a param absent from `state` is first initialized
/// from `opts.seed`, so an empty map starts training), then applies `fn.updates` to `state`
/// together. Dropout is active; random ops and dropout key their streams by `opts.step`.
/// Returns the step's loss (computed before the update); `outputs`, when given, receives the loss
/// and the train block's metrics by name.
llvm::Expected<double> trainStep(const ir::Function& fn, const TensorMap& inputs,
                                 const Options& opts, TensorMap& state,
                                 TensorMap* outputs = nullptr);

} // namespace meshc::interp
