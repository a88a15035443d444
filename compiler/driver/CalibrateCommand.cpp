// `meshc calibrate`: measures this machine as generated code sees it and writes a machine
// description that `--machine` takes. A two-line probe program (runtime/include/meshrt/
// Calibrate.h does the measuring) is built with the toolchain `meshc run` builds generated code
// with, and run on the threads backend (or under mpirun; or, with --backend nccl, built with
// nvcc and run on the GPUs: runtime/cuda/include/meshrt/cuda/Calibrate.h); the GEMM rate, the
// elementwise bandwidth and the collectives' times are fitted to the cost model's parameters: peak
// FLOP/s, memory bandwidth, and the link's alpha and bandwidth by weighted least squares on the
// alpha-beta formulas of CostModel.h (all-reduce 2a + 2b (p-1)/p n; reduce-scatter and
// all-gather a + b (p-1)/p n; weights 1/t, so that small messages count as much as large ones).
// The refinements: a cache level (an update-like fused loop over data that fits), the fixed
// cost of a GEMM call (small GEMMs), what a collective costs when thread ranks outnumber the
// cores, and the rates of fused loops, transcendental functions, kernel calls and the row-wise
// kernels (docs/tool.md).
#include "driver/Driver.h"
#include "driver/Toolchain.h"
#include "planner/CostModel.h"
#include "planner/Machine.h"

#include <fmt/format.h>
#include <llvm/ADT/SmallString.h>
#include <llvm/Support/CommandLine.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/JSON.h>
#include <llvm/Support/Path.h>
#include <llvm/Support/ToolOutputFile.h>
#include <llvm/Support/WithColor.h>

#include <algorithm>
#include <cmath>
#include <ctime>

namespace meshc {

namespace {

namespace cl = llvm::cl;

cl::SubCommand calibrateSubcommand("calibrate",
                                   "measure this machine and write a machine description for "
                                   "--machine (see `meshc calibrate --help`)");
cl::OptionCategory calibrateCategory("meshc calibrate options");

cl::opt<std::string> calibrateOutput("o",
                                     cl::desc("Write the machine description here "
                                              "(default: stdout)"),
                                     cl::value_desc("file.json"), cl::init("-"),
                                     cl::sub(calibrateSubcommand), cl::cat(calibrateCategory));
cl::opt<std::string> calibrateName("name", cl::desc("The machine's name (default: calibrated)"),
                                   cl::init("calibrated"), cl::sub(calibrateSubcommand),
                                   cl::cat(calibrateCategory));
cl::opt<int> calibrateRanks("ranks", cl::desc("Ranks the collectives are measured on (default: 2)"),
                            cl::init(2), cl::sub(calibrateSubcommand), cl::cat(calibrateCategory));
cl::opt<std::string>
    calibrateBackend("backend",
                     cl::desc("threads (ranks are threads of one process), mpi (under mpirun) "
                              "or nccl (one GPU per rank, built with nvcc)"),
                     cl::init("threads"), cl::sub(calibrateSubcommand), cl::cat(calibrateCategory));
cl::opt<bool> calibrateQuick("quick",
                             cl::desc("Fewer sizes and repetitions (seconds instead of a minute)"),
                             cl::sub(calibrateSubcommand), cl::cat(calibrateCategory));

int fail(int code, const std::string& message) {
  llvm::WithColor::error(llvm::errs(), "meshc calibrate") << message << "\n";
  return code;
}

void stage(const std::string& text) {
  llvm::errs() << "meshc calibrate: " << text << "\n";
}

/// The link's alpha and 1/beta fitted to the measured collectives (see the file comment).
struct LinkFit {
  double alphaSeconds = 0, bandwidth = 0;
  double worstRatio = 1; // the largest predicted/measured or measured/predicted
};

/// The coefficients of alpha and of 1/bandwidth in the cost model's time of one collective over
/// `ranks` (CostModel.h's formulas, read from collectiveSeconds itself).
std::pair<double, double> formulaCoefficients(plan::CollectiveKind kind, double bytes, int ranks) {
  plan::Mesh mesh;
  mesh.axes.push_back({"x", ranks});
  plan::Machine machine;
  machine.numDevices = machine.devicesPerNode = ranks;
  plan::Collective collective;
  collective.kind = kind;
  collective.axes = {"x"};
  collective.bytes = static_cast<int64_t>(bytes);
  machine.intra = {"link", 1, 0}; // alpha 1, no bandwidth term
  double alphaCoefficient = plan::collectiveSeconds(machine, mesh, collective);
  machine.intra = {"link", 0, 1}; // no alpha, 1 byte/s
  return {alphaCoefficient, plan::collectiveSeconds(machine, mesh, collective)};
}

LinkFit fitLink(const llvm::json::Array& collectives, int ranks) {
  // Normal equations of sum_i ((c_i a + d_i b - t_i) / t_i)^2.
  double caa = 0, cab = 0, cbb = 0, ya = 0, yb = 0;
  std::vector<std::array<double, 3>> samples; // c, d, t
  for (const llvm::json::Value& entry : collectives) {
    const llvm::json::Object* object = entry.getAsObject();
    if (!object) continue;
    llvm::StringRef kind = object->getString("kind").getValueOr("");
    double bytes = object->getNumber("bytes").getValueOr(0);
    double seconds = object->getNumber("seconds").getValueOr(0);
    if (seconds <= 0) continue;
    auto [c, d] =
        formulaCoefficients(kind == "all_reduce"       ? plan::CollectiveKind::AllReduceSum
                            : kind == "reduce_scatter" ? plan::CollectiveKind::ReduceScatter
                                                       : plan::CollectiveKind::AllGather,
                            bytes, ranks);
    samples.push_back({c, d, seconds});
    double w = 1 / (seconds * seconds);
    caa += w * c * c, cab += w * c * d, cbb += w * d * d, ya += w * c * seconds,
        yb += w * d * seconds;
  }
  LinkFit fit;
  double det = caa * cbb - cab * cab;
  double a = det != 0 ? (ya * cbb - yb * cab) / det : 0;
  double b = det != 0 ? (caa * yb - cab * ya) / det : 0;
  if (a < 0 || b <= 0) { // degenerate: fit each alone
    a = std::max(a, 0.0);
    double num = 0, den = 0;
    for (const auto& [c, d, t] : samples)
      num += (t - c * a) * d / (t * t), den += d * d / (t * t);
    b = den > 0 && num > 0 ? num / den : 1e-12;
  }
  fit.alphaSeconds = a;
  fit.bandwidth = 1 / b;
  for (const auto& [c, d, t] : samples) {
    double predicted = c * a + d * b;
    fit.worstRatio = std::max({fit.worstRatio, predicted / t, t / predicted});
  }
  return fit;
}

/// The best rate (FLOP/s) among the probe's GEMM entries (`gemm` may be absent: 0), and their
/// rates in GFLOP/s appended to `table` for the description's notes.
double bestGemmRate(const llvm::json::Array* gemm, std::string& table) {
  double best = 0;
  if (gemm)
    for (const llvm::json::Value& entry : *gemm)
      if (const llvm::json::Object* object = entry.getAsObject()) {
        double rate = object->getNumber("flops_per_s").getValueOr(0);
        best = std::max(best, rate);
        table += fmt::format("{}{}^3 {:.1f}", table.empty() ? "" : ", ",
                             object->getInteger("m").getValueOr(0), rate / 1e9);
      }
  return best;
}

/// GEMMs of a few small shapes fitted to the cost model's gemmSeconds, the peak held:
/// t = (2mnk / peak) (1 + shapeDim / min(m, n, k)) + latency, linear in shapeDim and latency;
/// least squares on relative errors (weights 1/t^2), each kept >= 0.
struct GemmFit {
  double shapeDim = 0, latencySeconds = 0;
};

GemmFit fitGemmShape(const llvm::json::Array& small, double peak) {
  double sxx = 0, sx = 0, s1 = 0, sxy = 0, sy = 0;
  for (const llvm::json::Value& entry : small) {
    const llvm::json::Object* object = entry.getAsObject();
    if (!object) continue;
    double m = object->getNumber("m").getValueOr(0), n = object->getNumber("n").getValueOr(0),
           k = object->getNumber("k").getValueOr(0);
    double seconds = object->getNumber("seconds").getValueOr(0);
    double smallest = std::min({m, n, k});
    if (seconds <= 0 || smallest <= 0) continue;
    double atPeak = 2 * m * n * k / peak, x = atPeak / smallest, y = seconds - atPeak;
    double w = 1 / (seconds * seconds);
    sxx += w * x * x, sx += w * x, s1 += w, sxy += w * x * y, sy += w * y;
  }
  GemmFit fit;
  double det = sxx * s1 - sx * sx;
  if (s1 <= 0) return fit;
  if (det > 0) {
    fit.shapeDim = (sxy * s1 - sx * sy) / det;
    fit.latencySeconds = (sxx * sy - sx * sxy) / det;
  }
  if (det <= 0 || fit.shapeDim < 0) { // the latency alone
    fit.shapeDim = 0;
    fit.latencySeconds = sy / s1;
  } else if (fit.latencySeconds < 0) { // the shape alone
    fit.latencySeconds = 0;
    fit.shapeDim = sxx > 0 ? sxy / sxx : 0;
  }
  fit.shapeDim = std::max(0.0, fit.shapeDim);
  fit.latencySeconds = std::max(0.0, fit.latencySeconds);
  return fit;
}

/// The fixed cost of each matrix of a batched GEMM (the cost model's gemm_batch_seconds): the
/// probe's batch of small matrices less what gemmSeconds charges it without the term (each
/// matrix's FLOPs at the shape's rate), per matrix. Where the runtime's small GEMM loops ran the
/// probe (m n k within `smallTerms`) that is every matrix, with no library call; otherwise each
/// after the first, less one call's latency; >= 0.
double gemmBatchSeconds(const llvm::json::Object& batched, double peak, const GemmFit& fit,
                        double smallTerms) {
  double batch = batched.getNumber("batch").getValueOr(0), m = batched.getNumber("m").getValueOr(0),
         n = batched.getNumber("n").getValueOr(0), k = batched.getNumber("k").getValueOr(0);
  double seconds = batched.getNumber("seconds").getValueOr(0);
  double smallest = std::min({m, n, k});
  if (batch <= 1 || smallest <= 0 || seconds <= 0 || peak <= 0) return 0;
  double flopSeconds = batch * 2 * m * n * k / peak * (1 + fit.shapeDim / smallest);
  if (m * n * k <= smallTerms) return std::max(0.0, (seconds - flopSeconds) / batch);
  return std::max(0.0, (seconds - flopSeconds - fit.latencySeconds) / (batch - 1));
}

/// What one collective costs on top of alpha when thread ranks outnumber the cores: an
/// iteration of the probe (a loop, then a 4-byte all-reduce) less the loop's share of the cores
/// (its time alone times ranks / cores) and the all-reduce's 2 alpha. `iterationKey` names the
/// iteration: "iteration_seconds" (groups spanning the cores) or "shared_iteration_seconds"
/// (each group on one core); -1 when the probe did not measure it.
double oversubscribedSync(const llvm::json::Object& over, const char* iterationKey, int64_t cores,
                          double alpha) {
  double ranks = over.getNumber("ranks").getValueOr(0);
  double work = over.getNumber("work_seconds").getValueOr(0);
  double iteration = over.getNumber(iterationKey).getValueOr(0);
  if (ranks <= static_cast<double>(cores) || iteration <= 0) return -1;
  return std::max(0.0, iteration - work * ranks / static_cast<double>(cores) - 2 * alpha);
}

/// How much a collective's sync grows per rank a core holds (oversubscribed_sync_rank_seconds):
/// the probe at 2 ranks per core (`over`) against the same at 4 (`over.more`), the mean of the
/// two slopes (groups spanning the cores, groups on one); 0 when the probe did not measure it.
double syncPerRank(const llvm::json::Object& over, int64_t cores, double alpha) {
  const llvm::json::Object* more = over.getObject("more");
  if (!more || cores <= 0) return 0;
  double extraRanks =
      (more->getNumber("ranks").getValueOr(0) - over.getNumber("ranks").getValueOr(0)) /
      static_cast<double>(cores);
  if (extraRanks <= 0) return 0;
  double slopes = 0;
  int measured = 0;
  for (const char* key : {"iteration_seconds", "shared_iteration_seconds"}) {
    double fewer = oversubscribedSync(over, key, cores, alpha);
    double many = oversubscribedSync(*more, key, cores, alpha);
    if (fewer < 0 || many < 0) continue;
    slopes += (many - fewer) / extraRanks;
    ++measured;
  }
  return measured ? std::max(0.0, slopes / measured) : 0;
}

} // namespace

bool calibrateCommandChosen() {
  return bool(calibrateSubcommand);
}

void hideUnrelatedCalibrateOptions() {
  cl::HideUnrelatedOptions(calibrateCategory, calibrateSubcommand);
}

int calibrateCommand(const char* argv0) {
  bool onGpus = calibrateBackend == "nccl";
  if (calibrateBackend != "threads" && calibrateBackend != "mpi" && !onGpus)
    return fail(kExitInputError, "--backend must be threads, mpi or nccl");
  if (calibrateRanks < 2) return fail(kExitInputError, "--ranks must be at least 2");
  Toolchain toolchain = findToolchain(argv0);
  if (onGpus && !toolchain.cuda)
    return fail(kExitInputError, "--backend nccl: this meshc was built without CUDA");
  llvm::SmallString<256> dir(cacheDirectory());
  llvm::sys::path::append(dir, "calibrate");
  if (std::error_code ec = llvm::sys::fs::create_directories(dir))
    return fail(kExitInternalError,
                fmt::format("cannot create '{}': {}", dir.str().str(), ec.message()));
  std::string base = (dir + "/probe").str();

  // 1. build the probe as generated code is built (meshc run's default flags).
  std::string source = base + (onGpus ? ".cu" : ".cpp");
  std::string compiler = onGpus ? toolchain.cuda->nvcc : toolchain.cxx;
  stage(fmt::format("building the probe ({})", compiler));
  {
    std::error_code ec;
    llvm::raw_fd_ostream out(source, ec);
    if (ec) return fail(kExitInternalError, fmt::format("cannot write '{}'", source));
    const char* probeNamespace = onGpus ? "meshrt::cuda::calibrate" : "meshrt::calibrate";
    out << fmt::format("#include \"meshrt/{}Calibrate.h\"\n"
                       "int main(int argc, char** argv) {{ return {}::probeMain(argc, argv); }}\n",
                       onGpus ? "cuda/" : "", probeNamespace);
  }
  // meshc run's flags for generated code (-fno-math-errno lets square roots vectorize).
  std::vector<std::string> build = {compiler, "-O3", "-std=c++20", "-w"};
  std::vector<std::string> libraries = toolchain.libraries;
  if (onGpus) {
    std::vector<std::string> cudaOptions = cudaCompileOptions(*toolchain.cuda);
    build.insert(build.end(), cudaOptions.begin(), cudaOptions.end());
    libraries = cudaLinkLibraries(toolchain);
  } else {
    build.insert(build.end(), {"-march=native", "-fno-math-errno"});
  }
  for (const std::string& include : toolchain.includeDirs)
    build.insert(build.end(), {"-I", include});
  build.insert(build.end(), {source, "-o", base + ".bin"});
  build.insert(build.end(), libraries.begin(), libraries.end());
  build.push_back("-lpthread");
  std::string error;
  if (int rc = execute(build, base + ".build.log", base + ".build.log.err", error); rc != 0)
    return fail(kExitInternalError,
                fmt::format("building the probe failed ({}); command: {}\n{}{}",
                            rc < 0 ? error : fmt::format("exit status {}", rc),
                            fmt::join(build, " "), readFile(base + ".build.log"),
                            readFile(base + ".build.log.err")));

  // 2. measure.
  std::vector<std::string> probe;
  if (calibrateBackend == "mpi") probe = mpirunCommand(calibrateRanks);
  probe.push_back(base + ".bin");
  if (!onGpus) probe.insert(probe.end(), {"--backend", std::string(calibrateBackend)});
  probe.insert(probe.end(), {"--ranks", std::to_string(calibrateRanks)});
  if (calibrateQuick) probe.push_back("--quick");
  stage(fmt::format("measuring GEMM, bandwidth and collectives on {} ranks ({} backend)",
                    int(calibrateRanks), std::string(calibrateBackend)));
  if (int rc = execute(probe, base + ".json", base + ".json.err", error); rc != 0)
    return fail(kExitInternalError,
                fmt::format("the probe failed ({}); command: {}\n{}",
                            rc < 0 ? error : fmt::format("exit status {}", rc),
                            fmt::join(probe, " "), readFile(base + ".json.err")));
  std::string measured = readFile(base + ".json");
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(measured);
  const llvm::json::Object* report = parsed ? parsed->getAsObject() : nullptr;
  if (!report) {
    if (!parsed) llvm::consumeError(parsed.takeError());
    return fail(kExitInternalError, fmt::format("the probe's report is not JSON: {}", measured));
  }

  // 3. fit.
  std::string gemmTable, gemmBf16Table;
  double peak = bestGemmRate(report->getArray("gemm"), gemmTable);
  double peakBf16 = bestGemmRate(report->getArray("gemm_bf16"), gemmBf16Table);
  double bandwidth = report->getNumber("stream_bytes_per_s").getValueOr(0);
  const llvm::json::Array* collectives = report->getArray("collectives");
  if (peak <= 0 || bandwidth <= 0 || !collectives || collectives->empty())
    return fail(kExitInternalError, fmt::format("the probe measured nothing usable: {}", measured));
  LinkFit link = fitLink(*collectives, calibrateRanks);
  int64_t cores = std::max<int64_t>(report->getInteger("cores").getValueOr(1), 1);
  // A device of the description is a rank: a core of this host, or one of its GPUs.
  int64_t devices = onGpus ? int64_t(calibrateRanks) : cores;
  double cacheBytes = report->getNumber("cache_bytes").getValueOr(0);
  double cacheBandwidth = report->getNumber("cache_stream_bytes_per_s").getValueOr(0);
  if (cacheBandwidth <= bandwidth) cacheBytes = cacheBandwidth = 0; // no faster level seen
  GemmFit gemmFit;
  if (const llvm::json::Array* small = report->getArray("gemm_small"))
    gemmFit = fitGemmShape(*small, peak);
  double gemmLatency = gemmFit.latencySeconds;
  double gemmBatch = 0, smallGemmTerms = 0;
  if (const llvm::json::Object* batched = report->getObject("gemm_batched")) {
    smallGemmTerms = batched->getNumber("small_gemm_terms").getValueOr(0);
    gemmBatch = gemmBatchSeconds(*batched, peak, gemmFit, smallGemmTerms);
  }
  double syncSeconds = 0, sharedSyncSeconds = -1, syncRankSeconds = 0;
  if (const llvm::json::Object* over = report->getObject("oversubscribed")) {
    syncSeconds =
        std::max(0.0, oversubscribedSync(*over, "iteration_seconds", cores, link.alphaSeconds));
    sharedSyncSeconds =
        oversubscribedSync(*over, "shared_iteration_seconds", cores, link.alphaSeconds);
    syncRankSeconds = syncPerRank(*over, cores, link.alphaSeconds);
  }

  // Loops and kernels: the probe's rates as the machine's fields (CostModel.h, loopShareSeconds
  // and rowKernelSeconds); a transcendental element in simple FLOPs at the vector rate.
  double vectorFlops = 0, transcendentalFlops = 0, randomFlops = 0, normalFlops = 0,
         loopLatency = 0, softmaxElement = 0, softmaxRow = 0, layerNormElement = 0,
         reduceElement = 0, outputSeconds = 0;
  if (const llvm::json::Object* loops = report->getObject("loops")) {
    vectorFlops = loops->getNumber("vector_flops").getValueOr(0);
    transcendentalFlops =
        loops->getNumber("transcendental_element_seconds").getValueOr(0) * vectorFlops;
    randomFlops = loops->getNumber("dropout_element_seconds").getValueOr(0) * vectorFlops;
    normalFlops = loops->getNumber("normal_element_seconds").getValueOr(0) * vectorFlops;
    loopLatency = loops->getNumber("call_seconds").getValueOr(0);
    softmaxElement = loops->getNumber("softmax_element_seconds").getValueOr(0);
    softmaxRow = loops->getNumber("softmax_row_seconds").getValueOr(0);
    layerNormElement = loops->getNumber("layer_norm_element_seconds").getValueOr(0);
    reduceElement = loops->getNumber("reduce_element_seconds").getValueOr(0);
    outputSeconds = loops->getNumber("output_seconds").getValueOr(0);
  }

  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::string command = fmt::format(
      "meshc calibrate --name {} --ranks {} --backend {}{}", std::string(calibrateName),
      int(calibrateRanks), std::string(calibrateBackend), calibrateQuick ? " --quick" : "");
  llvm::json::Object machine{
      {"name", std::string(calibrateName)},
      {"description",
       onGpus ? fmt::format("this machine as measured by `{}` on {}: {} GPUs ({}), one rank "
                            "per GPU (nccl backend)",
                            command, date, devices,
                            report->getString("device_name").getValueOr("").str())
              : fmt::format("this machine as measured by `{}` on {}: {} cores, one rank per "
                            "{} ({} backend)",
                            command, date, cores, calibrateBackend == "mpi" ? "process" : "thread",
                            std::string(calibrateBackend))},
      {"devices", devices},
      {"devices_per_node", devices},
      {"peak_flops", peak},
      {"peak_flops_bf16", peakBf16},
      {"memory_bandwidth", bandwidth},
      {"memory_bytes", report->getNumber("memory_bytes").getValueOr(0)},
      {"cache_bytes", cacheBytes},
      {"cache_bandwidth", cacheBandwidth},
      {"gemm_latency_seconds", gemmLatency},
      {"gemm_shape_dim", gemmFit.shapeDim},
      {"gemm_batch_seconds", gemmBatch},
      {"small_gemm_terms", smallGemmTerms},
      {"oversubscribed_sync_seconds", syncSeconds},
      {"vector_flops", vectorFlops},
      {"transcendental_flops", transcendentalFlops},
      {"random_flops", randomFlops},
      {"normal_flops", normalFlops},
      {"loop_latency_seconds", loopLatency},
      {"softmax_element_seconds", softmaxElement},
      {"softmax_row_seconds", softmaxRow},
      {"layer_norm_element_seconds", layerNormElement},
      {"reduce_element_seconds", reduceElement},
      {"output_seconds", outputSeconds},
      {"intra", llvm::json::Object{{"name", std::string(calibrateBackend)},
                                   {"alpha_seconds", link.alphaSeconds},
                                   {"bandwidth", link.bandwidth}}},
      {"notes",
       onGpus
           ? fmt::format(
                 "measured by `{}`: the einsum's GEMM through cuBLAS on one GPU in the "
                 "runner's default fp32 math (GFLOP/s: {}; the best is the peak) and with "
                 "bf16 operands and fp32 accumulation (GFLOP/s: {}; peak_flops_bf16), the "
                 "elementwise kernel a = b + s c over 256 MiB arrays (bytes read and written "
                 "per second, CUDA events), GEMMs of 16^3 to 128^3 fitted to "
                 "flops / peak (1 + gemm_shape_dim / size) + gemm_latency_seconds, and NCCL "
                 "all-reduce, reduce-scatter "
                 "and all-gather on device buffers from 4 B on {} GPUs fitted to the "
                 "alpha-beta formulas (the worst sample is {:.2f}x off the fit)",
                 command, gemmTable, gemmBf16Table, int(calibrateRanks), link.worstRatio)
           : fmt::format(
                 "measured by `{}`: the einsum's GEMM on one thread (GFLOP/s: {}; the best is the "
                 "peak), the fused elementwise loop a = b + s c over 32 MiB arrays (bytes read "
                 "and written per second), an update-like fused loop (AdamW: 4 arrays read, 3 "
                 "written) over arrays filling half of the last-level cache's share per core "
                 "(cache_bandwidth), GEMMs of 16^3 to 128^3 and skinny ones (8, 16 or 32 by 128 "
                 "by 128, each way) fitted to flops / peak (1 + gemm_shape_dim / smallest of "
                 "m, n, k) + gemm_latency_seconds, a batch of "
                 "16 GEMMs of 16 x 16 x 8 (attention's layout, the batch between rows and terms) "
                 "less that per matrix (gemm_batch_seconds; the runtime's small GEMM loops, which "
                 "take matrices of up to small_gemm_terms multiply-adds), all-reduce, "
                 "reduce-scatter and all-gather "
                 "from 4 B on {} ranks fitted to the alpha-beta formulas (the worst sample is "
                 "{:.2f}x off the fit), and on the threads backend {} thread ranks (twice the "
                 "cores) each looping then all-reducing 4 B: the iteration less the loop's share "
                 "of the cores and 2 alpha is oversubscribed_sync_seconds, and the same with "
                 "each all-reduce over the two ranks one core holds is "
                 "shared_core_sync_seconds; both again with {} thread ranks (four per core): "
                 "how much they grow per rank a core holds is "
                 "oversubscribed_sync_rank_seconds (the mean of the two); loops and kernels on "
                 "64 KiB arrays (in the cache): vector_flops from a fused loop of 8 adds and "
                 "multiplies per element, transcendental_flops the mean time per element of exp, "
                 "log, tanh, sigmoid and gelu (meshrt's f32 ones) at that rate, random_flops a "
                 "fused "
                 "dropout's time per element at that rate, loop_latency_seconds a kernel "
                 "call on [4, 4], and per element of [128, 128] along the last dim softmax and "
                 "log_softmax (their mean; with generated code's row kernels, fitted over rows "
                 "of 16 and 128 to softmax_row_seconds per row plus softmax_element_seconds), "
                 "layer_norm and sum; output_seconds: run() returning an output of 16 "
                 "elements (a new tensor, copied; the previous one freed); no bf16 hardware "
                 "assumed",
                 command, gemmTable, int(calibrateRanks), link.worstRatio, 2 * cores, 4 * cores)},
  };
  // The cores the ranks of this host share (ranks beyond them take turns: the cost model's
  // oversubscription); GPUs run one rank per device.
  if (!onGpus) machine["cores"] = cores;
  if (sharedSyncSeconds >= 0) machine["shared_core_sync_seconds"] = sharedSyncSeconds;
  if (!onGpus) machine["oversubscribed_sync_rank_seconds"] = syncRankSeconds;
  std::string text = llvm::formatv("{0:2}", llvm::json::Value(std::move(machine))).str() + "\n";
  // What `--machine` reads back must parse: the same reader checks it before it is written.
  if (llvm::Expected<plan::Machine> check = plan::parseMachine(text, "calibrated"); !check)
    return fail(kExitInternalError, llvm::toString(check.takeError()));
  std::error_code ec;
  llvm::ToolOutputFile out(calibrateOutput, ec, llvm::sys::fs::OF_Text);
  if (ec)
    return fail(kExitInternalError,
                fmt::format("cannot write '{}': {}", std::string(calibrateOutput), ec.message()));
  out.os() << text;
  out.keep();
  stage(fmt::format("peak {:.1f} GFLOP/s, bandwidth {:.1f} GB/s, alpha {:.2f} us, link {:.1f} GB/s",
                    peak / 1e9, bandwidth / 1e9, link.alphaSeconds * 1e6, link.bandwidth / 1e9));
  stage(fmt::format("cache {:.0f} KiB at {:.1f} GB/s, GEMM latency {:.2f} us, shape dim {:.1f} "
                    "and {:.2f} us per batched matrix (loops up to {:.0f} multiply-adds), "
                    "oversubscribed sync {:.2f} us ({:.2f} us on one core; {:.2f} us more per "
                    "rank a core holds beyond 2)",
                    cacheBytes / 1024, cacheBandwidth / 1e9, gemmLatency * 1e6, gemmFit.shapeDim,
                    gemmBatch * 1e6, smallGemmTerms, syncSeconds * 1e6,
                    std::max(0.0, sharedSyncSeconds) * 1e6, syncRankSeconds * 1e6));
  if (vectorFlops > 0)
    stage(fmt::format(
        "loops {:.1f} GFLOP/s, transcendental {:.1f} FLOPs, random {:.1f} FLOPs, normal "
        "{:.1f} FLOPs, call "
        "{:.3f} us; per element: "
        "softmax {:.2f} ns, layer_norm {:.2f} ns, sum {:.2f} ns",
        vectorFlops / 1e9, transcendentalFlops, randomFlops, normalFlops, loopLatency * 1e6,
        softmaxElement * 1e9, layerNormElement * 1e9, reduceElement * 1e9));
  return kExitOk;
}

} // namespace meshc
