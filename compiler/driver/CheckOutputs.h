// `meshc run --check`: the run's outputs against the reference interpreter's, element by element
// under interp/Tolerance.h's rule. A tensor that fails is then held against the interpreter
// itself: the interpreter computing in double (no rounding to the dtype) against the same
// interpreter rounding every op, as the oracle does. Where those two disagree by more than the
// tolerance, the value is rounding noise that the program does not determine (a gradient that
// is zero in exact arithmetic, which adamw or adafactor normalize into lr-sized steps), and no
// run can be held to the bound: such a tensor is reported as noise, not as a mismatch.
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
  /// For a failing tensor: the interpreter in double against the interpreter rounded.
  std::optional<interp::Comparison> oracle;
  bool noise() const { return !missing && !run.pass && oracle && !oracle->pass; }
  bool pass() const { return !missing && (run.pass || noise()); }
};

/// Compares the runner-format output files `actualPath` and `expectedPath`, one entry per
/// expected tensor; nullopt when a file is malformed.
std::optional<std::vector<TensorCheck>> compareOutputFiles(const std::string& actualPath,
                                                           const std::string& expectedPath,
                                                           const CheckRule& rule);

/// Fills `oracle` of each failing check from `unroundedPath`, the interpreter's outputs computed
/// in double, against `expectedPath` under the default bound (without --tol); false when a file
/// is malformed. Not where either holds a NaN or an infinity: an f32 overflow that double does
/// not have is no noise.
bool probeOracle(std::vector<TensorCheck>& checks, const std::string& unroundedPath,
                 const std::string& expectedPath, const CheckRule& rule);

/// One line per tensor (`ok`, `FAIL` or `noise`) and a note when some are noise; whether all
/// pass.
bool printChecks(const std::vector<TensorCheck>& checks, llvm::raw_ostream& os);

} // namespace meshc
