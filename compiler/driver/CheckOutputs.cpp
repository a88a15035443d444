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
                                                           const CheckRule& rule,
                                                           const std::string& unroundedPath) {
  auto actual = readOutputs(actualPath), expected = readOutputs(expectedPath);
  std::optional<std::map<std::string, OutputTensor>> unrounded;
  if (!unroundedPath.empty() && !(unrounded = readOutputs(unroundedPath))) return std::nullopt;
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
    // The interpreter in double, where it holds the tensor as the rounded run does (a NaN or an
    // infinity on either side is no rounding effect: an f32 overflow double does not have).
    const std::vector<double>* oracleInDouble = nullptr;
    if (unrounded && check.finite)
      if (auto self = unrounded->find(name);
          self != unrounded->end() && self->second.shape == want.shape)
        oracleInDouble = &self->second.values;
    check.run = interp::compareWithTolerance(
        got->second.values, want.values, want.dtype, trained ? rule.steps : 0,
        compute == rule.computeDtypes.end() ? "" : compute->second, typicalScale, rule.f32Rtol,
        oracleInDouble);
  }
  return checks;
}

bool probeOracle(std::vector<TensorCheck>& checks, const std::string& actualPath,
                 const std::string& expectedPath, const std::string& unroundedPath,
                 const CheckRule& rule) {
  auto probed = compareOutputFiles(actualPath, expectedPath, rule, unroundedPath);
  if (!probed || probed->size() != checks.size()) return false;
  for (size_t i = 0; i < checks.size(); ++i)
    if (!checks[i].missing && !checks[i].run.pass) checks[i].probed = (*probed)[i].run;
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
    if (check.probed && check.probed->illConditioned)
      os << fmt::format("; {} element(s) ill-conditioned, at most {:.3g} times R times the "
                        "interpreter's own rounding movement",
                        check.probed->illConditioned, check.probed->illConditionedRatio);
    noise += check.noise();
    os << "\n";
  }
  if (noise)
    os << fmt::format(
        "note: {} tensor(s) are rounding noise in the elements over the tolerance: the "
        "reference interpreter's own rounding (against it computing in double) moves each of "
        "them by more than 1/R of the tolerance, so no run can be held to it there (a gradient "
        "that is zero in exact arithmetic, such as an attention key bias's, or one near adamw's "
        "eps, which the normalization amplifies); those elements are held to R times that "
        "movement (R: the tolerance in roundings, 1024 for f32) and pass within it "
        "(docs/architecture.md, \"Numerical tolerances\")\n",
        noise);
  return ok;
}

} // namespace meshc
