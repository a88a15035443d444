#include "driver/CheckOutputs.h"

#include "meshc/TensorFile.h"

#include <fmt/format.h>
#include <llvm/ADT/STLExtras.h>
#include <llvm/Support/MemoryBuffer.h>

#include <cmath>
#include <stdexcept>

namespace meshc {

namespace {

struct OutputTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<double> values;
};

/// The runner's / interpreter's output file: per tensor "tensor <name> <dtype> <rank>
/// <sizes...>\n" then prod(sizes) little-endian float64s.
std::optional<std::map<std::string, OutputTensor>> readOutputs(const std::string& path) {
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer) return std::nullopt;
  std::map<std::string, OutputTensor> tensors;
  try {
    llvm::StringRef bytes = (*buffer)->getBuffer(); // the entries read it: the buffer outlives them
    for (const meshc::gen::TensorFileEntry& entry :
         meshc::gen::parseTensorFile(std::string_view(bytes.data(), bytes.size()), path)) {
      OutputTensor& tensor = tensors[entry.name];
      tensor.dtype = entry.dtype;
      tensor.shape = entry.shape;
      tensor.values.resize(entry.count());
      for (size_t i = 0; i < entry.count(); ++i)
        tensor.values[i] = entry.value(i);
    }
  } catch (const std::runtime_error&) {
    return std::nullopt;
  }
  return tensors;
}

} // namespace

std::optional<std::vector<TensorCheck>> compareOutputFiles(const std::string& actualPath,
                                                           const std::string& expectedPath,
                                                           const CheckRule& rule) {
  auto actual = readOutputs(actualPath), expected = readOutputs(expectedPath);
  if (!actual || !expected) return std::nullopt;
  // An all-zero tensor's scale: the RMS of every float value compared (Tolerance.h).
  std::vector<double> floats;
  for (const auto& [name, tensor] : *expected)
    if (interp::unitRoundoff(tensor.dtype))
      floats.insert(floats.end(), tensor.values.begin(), tensor.values.end());
  double typicalScale = interp::rootMeanSquare(floats);
  std::vector<TensorCheck> checks;
  for (const auto& [name, want] : *expected) {
    TensorCheck& check = checks.emplace_back();
    check.name = name;
    check.dtype = want.dtype;
    check.shape = want.shape;
    auto got = actual->find(name);
    if (got == actual->end() || got->second.shape != want.shape) {
      check.missing = true;
      continue;
    }
    auto isFinite = [](double x) { return std::isfinite(x); };
    check.finite =
        llvm::all_of(got->second.values, isFinite) && llvm::all_of(want.values, isFinite);
    auto compute = rule.computeDtypes.find(name);
    bool trained = rule.trained.count(name.substr(0, name.find('.')));
    check.run = interp::compareWithTolerance(
        got->second.values, want.values, want.dtype, trained ? rule.steps : 0,
        compute == rule.computeDtypes.end() ? "" : compute->second, typicalScale, rule.f32Rtol);
  }
  return checks;
}

bool probeOracle(std::vector<TensorCheck>& checks, const std::string& unroundedPath,
                 const std::string& expectedPath, const CheckRule& rule) {
  // At the default bound, not --tol's: a tensor the oracle determines to that bound stays a
  // mismatch under a tighter --tol.
  CheckRule standard = rule;
  standard.f32Rtol.reset();
  auto oracle = compareOutputFiles(unroundedPath, expectedPath, standard);
  if (!oracle) return false;
  for (TensorCheck& check : checks) {
    if (check.missing || check.run.pass) continue;
    for (const TensorCheck& self : *oracle)
      if (self.name == check.name && !self.missing && self.finite) check.oracle = self.run;
  }
  return true;
}

bool printChecks(const std::vector<TensorCheck>& checks, llvm::raw_ostream& os) {
  bool ok = true;
  size_t noise = 0;
  for (const TensorCheck& check : checks) {
    ok = ok && check.pass();
    if (check.missing) {
      os << "  FAIL " << check.name << ": missing or of another shape in the run's outputs\n";
      continue;
    }
    const interp::Comparison& c = check.run;
    os << fmt::format("  {} {} {}[{}]: error/tolerance {:.3g} (rtol {:.3g}, atol {:.3g}; passes "
                      "from rtol {:.3g})",
                      check.noise() ? "noise"
                      : c.pass      ? "ok  "
                                    : "FAIL",
                      check.name, check.dtype, fmt::join(check.shape, ", "), c.ratio, c.rtol,
                      c.atol, c.neededRtol);
    if (c.ratio > 0)
      os << fmt::format("; worst at [{}]: {:.9g} vs {:.9g}", c.worstIndex, c.worstActual,
                        c.worstExpected);
    if (check.oracle)
      os << fmt::format("; the interpreter in double is {:.3g} times the tolerance from it",
                        check.oracle->ratio);
    noise += check.noise();
    os << "\n";
  }
  if (noise)
    os << fmt::format(
        "note: {} tensor(s) are rounding noise: the reference interpreter computing in double "
        "and the one rounding every op to its dtype disagree on them by more than the tolerance, "
        "so no run can be held to it (a gradient that is zero in exact arithmetic, such as an "
        "attention key bias's, which adamw or adafactor normalize into lr-sized steps); not "
        "counted as mismatches (docs/architecture.md, \"Numerical tolerances\")\n",
        noise);
  return ok;
}

} // namespace meshc
