// `meshc run --check`: the run's outputs against the reference interpreter's, element by element
// under interp/Tolerance.h's rule. A tensor that fails is then held against the interpreter
// itself: the interpreter computing in double (no rounding to the dtype) against the same
// interpreter rounding every op, as the oracle does. An element that the oracle's own rounding
// moves by more than 1/R of its bound is ill-conditioned (a gradient that is zero in exact
// arithmetic, or near adamw's eps, which the normalization amplifies): it is held to R times
// that movement (Tolerance.h), and a tensor that passes only so is reported as noise.
#pragma once

#include "interp/Tolerance.h"

#include <llvm/Support/raw_ostream.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace meshc {

/// What the comparison needs besides the two files.
struct CheckRule {
  int64_t steps = 0;             // optimizer updates the values of `trained`'s tensors went through
  std::set<std::string> trained; // the train blocks (programs take no steps)
  std::optional<double> f32Rtol; // --tol
  std::map<std::string, std::string> computeDtypes; // per tensor, its path dtype
};

/// One compared tensor (`<function>.<output>` or `<function>.param.<path>`).
struct TensorCheck {
  std::string name, dtype;
  std::vector<int64_t> shape;
  bool missing = false; // absent from the run's outputs, or of another shape
  bool finite = true;   // no NaN or infinity on either side
  interp::Comparison run;
  /// For a failing tensor: the comparison again, with the interpreter's run in double.
  std::optional<interp::Comparison> probed;
  bool noise() const { return !missing && !run.pass && probed && probed->pass; }
  bool pass() const { return !missing && (run.pass || noise()); }
};

/// Compares the runner-format output files `actualPath` and `expectedPath`, one entry per
/// expected tensor, with `unroundedPath` (the interpreter's outputs computed in double) for the
/// ill-conditioned elements when not empty; nullopt when a file is malformed.
std::optional<std::vector<TensorCheck>> compareOutputFiles(const std::string& actualPath,
                                                           const std::string& expectedPath,
                                                           const CheckRule& rule,
                                                           const std::string& unroundedPath = {});

/// Fills `probed` of each failing check: the same comparison with `unroundedPath`. False when a
/// file is malformed. Not where either side holds a NaN or an infinity: an f32 overflow that
/// double does not have is no noise.
bool probeOracle(std::vector<TensorCheck>& checks, const std::string& actualPath,
                 const std::string& expectedPath, const std::string& unroundedPath,
                 const CheckRule& rule);

/// One line per tensor (`ok`, `FAIL` or `noise`) and a note when some are noise; whether all
/// pass.
bool printChecks(const std::vector<TensorCheck>& checks, llvm::raw_ostream& os);

} // namespace meshc
