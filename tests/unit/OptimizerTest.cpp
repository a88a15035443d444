// The optimizers' lowered IR, run for a few steps in the interpreter (pure double), against
// straightforward references written here as plain loops over doubles (docs/training.md has the
// formulas). The loss 0.5 |w - tw|^2 + 0.5 |bias - tb|^2 has the gradient (w - tw, bias - tb),
// so the references need no autodiff of their own.
#include "train/Optimizer.h"
#include "train/OrderFactoredSums.h"

#include "interp/Interpreter.h"
#include "ir/Verifier.h"
#include "sema/Sema.h"

#include <catch2/catch.hpp>

#include <cmath>

using namespace meshc;

namespace {

/// A param of the reference: values and, for rank 2, its rows x cols shape.
struct RefParam {
  std::string path;
  std::vector<double> x, target;
  int64_t rows = 0, cols = 0; // rows = 0: rank 1
  std::map<std::string, std::vector<double>> slots;
};

struct Options {
  std::string optimizer = "sgd";
  std::map<std::string, double> numbers;
  std::string schedule = "constant";
  double get(const std::string& name, double fallback) const {
    auto it = numbers.find(name);
    return it == numbers.end() ? fallback : it->second;
  }
};

double referenceLearningRate(const Options& o, double s) {
  double lr = o.get("lr", 0), warmup = o.get("warmup_steps", 0), decay = o.get("decay_steps", 0);
  if (warmup > 0) lr *= std::min(1.0, (s + 1) / warmup);
  double p = decay > 0 ? std::clamp((s - warmup) / decay, 0.0, 1.0) : 0;
  if (o.schedule == "linear" && decay > 0) lr *= 1 - p;
  if (o.schedule == "cosine" && decay > 0) lr *= 0.5 * (1 + std::cos(M_PI * p));
  if (o.schedule == "rsqrt") {
    double floor = std::max(warmup, 1.0);
    lr *= std::sqrt(floor / std::max(s + 1, floor));
  }
  return lr;
}

double meanSquare(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v)
    sum += x * x;
  return sum / double(v.size());
}

/// One reference step of every param.
void referenceStep(const Options& o, std::vector<RefParam>& params, int64_t s) {
  double lr = referenceLearningRate(o, double(s)), t = double(s + 1);
  std::vector<std::vector<double>> grads;
  double squares = 0;
  for (RefParam& p : params) {
    std::vector<double> g(p.x.size());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = p.x[i] - p.target[i];
      squares += g[i] * g[i];
    }
    grads.push_back(g);
  }
  if (double clip = o.get("clip_norm", 0); clip > 0) {
    double scale = clip / std::max(std::sqrt(squares), clip);
    for (auto& g : grads)
      for (double& x : g)
        x *= scale;
  }
  for (size_t k = 0; k < params.size(); ++k) {
    RefParam& p = params[k];
    const std::vector<double>& g = grads[k];
    size_t n = g.size();
    auto slot = [&](const std::string& name) -> std::vector<double>& {
      return p.slots.try_emplace(name, n, 0.0).first->second;
    };
    if (o.optimizer == "sgd") {
      double mu = o.get("momentum", 0);
      if (mu == 0) {
        for (size_t i = 0; i < n; ++i)
          p.x[i] -= lr * g[i];
        continue;
      }
      std::vector<double>& v = slot("momentum");
      for (size_t i = 0; i < n; ++i) {
        v[i] = mu * v[i] + g[i];
        double direction = o.get("nesterov", 0) != 0 ? g[i] + mu * v[i] : v[i];
        p.x[i] -= lr * direction;
      }
    } else if (o.optimizer == "adamw") {
      double b1 = o.get("beta1", 0.9), b2 = o.get("beta2", 0.999), eps = o.get("eps", 1e-8),
             wd = o.get("weight_decay", 0.01);
      if ((p.rows > 0 ? 2 : 1) < o.get("decay_min_rank", 0)) wd = 0;
      std::vector<double>&m = slot("m"), &v = slot("v");
      for (size_t i = 0; i < n; ++i) {
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        double mHat = m[i] / (1 - std::pow(b1, t)), vHat = v[i] / (1 - std::pow(b2, t));
        p.x[i] -= lr * (mHat / (std::sqrt(vHat) + eps) + wd * p.x[i]);
      }
    } else { // adafactor
      double decayRate = o.get("decay_rate", 0.8), b1 = o.get("beta1", 0),
             d = o.get("clip_threshold", 1), eps1 = o.get("eps1", 1e-30),
             eps2 = o.get("eps2", 1e-3);
      double beta2 = 1 - std::pow(t, -decayRate);
      std::vector<double> u(n);
      if (p.rows > 0) {
        std::vector<double>&vr = p.slots.try_emplace("vr", p.rows, 0.0).first->second,
        &vc = p.slots.try_emplace("vc", p.cols, 0.0).first->second;
        for (int64_t i = 0; i < p.rows; ++i) {
          double mean = 0;
          for (int64_t j = 0; j < p.cols; ++j)
            mean += g[i * p.cols + j] * g[i * p.cols + j] + eps1;
          vr[i] = beta2 * vr[i] + (1 - beta2) * mean / double(p.cols);
        }
        for (int64_t j = 0; j < p.cols; ++j) {
          double mean = 0;
          for (int64_t i = 0; i < p.rows; ++i)
            mean += g[i * p.cols + j] * g[i * p.cols + j] + eps1;
          vc[j] = beta2 * vc[j] + (1 - beta2) * mean / double(p.rows);
        }
        double vrMean = 0;
        for (double x : vr)
          vrMean += x / double(p.rows);
        for (int64_t i = 0; i < p.rows; ++i)
          for (int64_t j = 0; j < p.cols; ++j)
            u[i * p.cols + j] = g[i * p.cols + j] / std::sqrt(vr[i] / vrMean) / std::sqrt(vc[j]);
      } else {
        std::vector<double>& v = slot("v");
        for (size_t i = 0; i < n; ++i) {
          v[i] = beta2 * v[i] + (1 - beta2) * (g[i] * g[i] + eps1);
          u[i] = g[i] / std::sqrt(v[i]);
        }
      }
      double clipBy = std::max(1.0, std::sqrt(meanSquare(u)) / d);
      double scale = std::max(std::sqrt(meanSquare(p.x)), eps2) * lr;
      std::vector<double> subtrahend(n);
      for (size_t i = 0; i < n; ++i)
        subtrahend[i] = u[i] / clipBy * scale;
      if (b1 > 0) {
        std::vector<double>& m = slot("m");
        for (size_t i = 0; i < n; ++i)
          subtrahend[i] = m[i] = b1 * m[i] + (1 - b1) * subtrahend[i];
      }
      for (size_t i = 0; i < n; ++i)
        p.x[i] -= subtrahend[i];
    }
  }
}

std::string optimizerCall(const Options& o) {
  std::string args;
  for (const auto& [key, value] : o.numbers)
    args += fmt::format("{}{} = {}", args.empty() ? "" : ", ", key, value);
  if (o.schedule != "constant") args += ", schedule = " + o.schedule;
  return o.optimizer + "(" + args + ")";
}

struct Trained {
  llvm::SourceMgr sources;
  std::string errors;
  llvm::raw_string_ostream errorStream{errors};
  DiagEngine diag{sources, errorStream};
  ir::Function fn;
};

/// The first function of `source` through sema and the training phase.
ir::Function lowered(const std::string& source, Trained& trained) {
  std::optional<SourceSet> set = loadSourcesFromBuffer(source, "t.mesh", trained.diag);
  REQUIRE(set);
  std::optional<ir::Module> module = analyze(*set, trained.diag);
  trained.errorStream.flush();
  INFO(trained.errors);
  REQUIRE(module);
  ir::Function fn = module->functions.at(0);
  REQUIRE(train::lowerTraining(fn, trained.diag));
  return fn;
}

/// Lowers the train block with `o` (`splitDims` as the module's layout would split them), runs
/// `steps` steps in the interpreter and the reference, and compares every param after every step.
void compareWithReference(const Options& o, int steps,
                          const std::set<std::string>& splitDims = {}) {
  std::string source = fmt::format(R"(
dim r = 3
dim c = 4
train t(tw: f32[r, c], tb: f32[c]) {{
  param w: f32[r, c] = normal(stddev = 1)
  param bias: f32[c] = normal(stddev = 1)
  let loss = 0.5 * sum(square(w - tw)) + 0.5 * sum(square(bias - tb))
  minimize loss with {}
}}
)",
                                   optimizerCall(o));
  INFO(source);
  Trained trained;
  std::optional<SourceSet> set = loadSourcesFromBuffer(source, "t.mesh", trained.diag);
  REQUIRE(set);
  std::optional<ir::Module> module = analyze(*set, trained.diag);
  trained.errorStream.flush();
  INFO(trained.errors);
  REQUIRE(module);
  ir::Function fn = module->functions.at(0);
  REQUIRE(train::lowerTraining(fn, trained.diag, splitDims));
  CHECK(ir::verifyFunction(fn).empty());
  // The clipping's sum runs over r first when r is split (OrderFactoredSums.h).
  if (o.optimizer == "adafactor" && o.get("clip_threshold", 1) > 0)
    CHECK(train::factoredSumOrder(fn) ==
          std::vector<std::string>{splitDims.count("r") ? "r" : "c"});

  interp::Options opts;
  opts.seed = 4;
  opts.roundToDtype = false;
  interp::TensorMap inputs, state;
  for (const ir::InputInfo& input : fn.inputs)
    inputs[input.name] = interp::synthesizeInput(input, 8);
  std::vector<RefParam> reference;
  for (const ir::ParamInfo& param : fn.params) {
    if (param.role != ir::ParamRole::Weight) continue;
    RefParam p;
    p.path = param.path;
    p.x = interp::initializeParam(param, opts.seed).data;
    p.target = inputs.at(param.path == "w" ? "tw" : "tb").data;
    if (param.type.dims.size() == 2) {
      p.rows = param.type.dims[0].size;
      p.cols = param.type.dims[1].size;
    }
    reference.push_back(p);
  }
  for (int s = 0; s < steps; ++s) {
    opts.step = uint64_t(s);
    auto loss = interp::trainStep(fn, inputs, opts, state);
    if (!loss) FAIL(llvm::toString(loss.takeError()));
    referenceStep(o, reference, s);
    for (const RefParam& p : reference) {
      const std::vector<double>& got = state.at(p.path).data;
      REQUIRE(got.size() == p.x.size());
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("step " << s << ", " << p.path << "[" << i << "]");
        CHECK(got[i] == Approx(p.x[i]).epsilon(1e-10).margin(1e-12));
      }
      for (const auto& [slot, values] : p.slots) {
        INFO("step " << s << ", state " << p.path << "@" << slot);
        REQUIRE(state.count(p.path + "@" + slot));
        const std::vector<double>& gotSlot = state.at(p.path + "@" + slot).data;
        REQUIRE(gotSlot.size() == values.size());
        for (size_t i = 0; i < values.size(); ++i)
          CHECK(gotSlot[i] == Approx(values[i]).epsilon(1e-10).margin(1e-12));
      }
    }
  }
  // Every state slot the IR added is one the reference has (no unexpected state).
  size_t slots = 0;
  for (const RefParam& p : reference)
    slots += p.slots.size();
  CHECK(state.size() == reference.size() + slots);
}

} // namespace

TEST_CASE("sgd: plain, momentum and nesterov match the reference", "[optimizer]") {
  compareWithReference({"sgd", {{"lr", 0.1}}, "constant"}, 3);
  compareWithReference({"sgd", {{"lr", 0.1}, {"momentum", 0.9}}, "constant"}, 3);
  compareWithReference({"sgd", {{"lr", 0.05}, {"momentum", 0.9}, {"nesterov", 1}}, "constant"}, 3);
}

TEST_CASE("adamw: bias correction and decoupled weight decay match the reference", "[optimizer]") {
  compareWithReference({"adamw", {{"lr", 0.01}}, "constant"}, 3);
  compareWithReference(
      {"adamw", {{"lr", 0.02}, {"beta1", 0.8}, {"beta2", 0.95}, {"weight_decay", 0.1}}, "constant"},
      3);
  // Weight decay for the rank-2 w only (the rank-1 bias undecayed), then for neither.
  compareWithReference(
      {"adamw", {{"lr", 0.02}, {"weight_decay", 0.5}, {"decay_min_rank", 2}}, "constant"}, 3);
  compareWithReference(
      {"adamw", {{"lr", 0.02}, {"weight_decay", 0.5}, {"decay_min_rank", 3}}, "constant"}, 3);
}

TEST_CASE("adafactor: factored (rank 2) and unfactored (rank 1) moments, clipping, momentum",
          "[optimizer]") {
  compareWithReference({"adafactor", {{"lr", 0.01}}, "constant"}, 3);
  compareWithReference(
      {"adafactor",
       {{"lr", 0.05}, {"decay_rate", 0.6}, {"clip_threshold", 0.5}, {"beta1", 0.9}, {"eps2", 0.5}},
       "constant"},
      3);
  // The clipping's mean of u^2 is summed over a split factored dim first (OrderFactoredSums.h):
  // over c (the default, and c split), or over r (r split); the same values either way.
  for (const std::set<std::string>& split : {std::set<std::string>{"c"}, {"r"}, {"r", "c"}})
    compareWithReference({"adafactor", {{"lr", 0.05}, {"clip_threshold", 0.5}}, "constant"}, 3,
                         split);
}

TEST_CASE("learning-rate schedules at several steps", "[optimizer]") {
  compareWithReference({"sgd", {{"lr", 0.1}, {"warmup_steps", 3}}, "constant"}, 5);
  compareWithReference({"sgd", {{"lr", 0.1}, {"warmup_steps", 2}, {"decay_steps", 4}}, "linear"},
                       8);
  compareWithReference({"sgd", {{"lr", 0.1}, {"warmup_steps", 1}, {"decay_steps", 5}}, "cosine"},
                       8);
  compareWithReference({"sgd", {{"lr", 0.1}, {"warmup_steps", 3}}, "rsqrt"}, 7);
  compareWithReference({"sgd", {{"lr", 0.1}}, "rsqrt"}, 4);
  // The reference formulas themselves, at hand-checked points.
  Options cosine{"sgd", {{"lr", 1}, {"warmup_steps", 2}, {"decay_steps", 4}}, "cosine"};
  CHECK(referenceLearningRate(cosine, 0) == Approx(0.5));
  CHECK(referenceLearningRate(cosine, 1) == Approx(1.0));
  CHECK(referenceLearningRate(cosine, 4) == Approx(0.5));
  CHECK(referenceLearningRate(cosine, 6) == Approx(0.0).margin(1e-12));
  Options rsqrt{"sgd", {{"lr", 1}, {"warmup_steps", 4}}, "rsqrt"};
  CHECK(referenceLearningRate(rsqrt, 3) == Approx(1.0));
  CHECK(referenceLearningRate(rsqrt, 15) == Approx(0.5));
}

TEST_CASE("gradient clipping by global norm", "[optimizer]") {
  // Unit-normal targets and weights: the global norm is ~5, so 0.5 clips and 100 does not.
  compareWithReference({"sgd", {{"lr", 0.1}, {"clip_norm", 0.5}}, "constant"}, 3);
  compareWithReference({"adamw", {{"lr", 0.01}, {"clip_norm", 0.5}}, "constant"}, 3);
  compareWithReference({"sgd", {{"lr", 0.1}, {"clip_norm", 100}}, "constant"}, 2);
}

TEST_CASE("state slots are named <weight>@<slot> with dims a subset of the weight's",
          "[optimizer]") {
  Trained trained;
  std::string source = R"(
dim r = 3
dim c = 4
train t(x: f32[r, c]) {
  param w: f32[r, c] = normal(stddev = 1)
  param bias: f32[c] = zeros()
  let loss = sum(square(w * x + bias))
  minimize loss with adafactor(lr = 0.1, beta1 = 0.9)
}
)";
  ir::Function fn = lowered(source, trained);
  std::map<std::string, std::vector<std::string>> slots;
  for (const ir::ParamInfo& p : fn.params) {
    if (p.role != ir::ParamRole::OptimizerState) continue;
    CHECK_FALSE(p.trainable);
    CHECK(p.init.kind == "zeros");
    for (const ir::Dim& d : p.type.dims)
      slots[p.path].push_back(d.name);
  }
  using Dims = std::vector<std::string>;
  CHECK(slots == std::map<std::string, Dims>{{"w@vr", {"r"}},
                                             {"w@vc", {"c"}},
                                             {"w@m", {"r", "c"}},
                                             {"bias@v", {"c"}},
                                             {"bias@m", {"c"}}});
  CHECK(fn.updates.size() == 7); // 2 weights + 5 slots
  // Lowering twice is a no-op: IR that already has updates is left as it is.
  size_t ops = fn.ops.size();
  REQUIRE(train::lowerTraining(fn, trained.diag));
  CHECK(fn.ops.size() == ops);
}

TEST_CASE("training the mlp example in the interpreter decreases its loss", "[optimizer]") {
  Trained trained;
  SemaOptions options;
  options.dimSizes = {{"batch", 8}, {"d_model", 16}, {"d_ff", 32}};
  std::optional<SourceSet> set =
      loadSources(std::string(MESHC_SOURCE_DIR) + "/dsl-examples/mlp.mesh", trained.diag);
  REQUIRE(set);
  std::optional<ir::Module> module = analyze(*set, trained.diag, options);
  REQUIRE(module);
  const ir::Function* train = module->findFunction("mlp_train");
  REQUIRE(train);
  ir::Function fn = *train;
  REQUIRE(train::lowerTraining(fn, trained.diag));
  // One fixed batch (the loss of a fixed batch must fall; fresh batches only in expectation).
  interp::TensorMap inputs, state;
  for (const ir::InputInfo& input : fn.inputs)
    inputs[input.name] = interp::synthesizeInput(input, 1);
  std::vector<double> losses;
  for (int s = 0; s < 30; ++s) {
    interp::Options opts;
    opts.seed = 1;
    opts.step = uint64_t(s);
    auto loss = interp::trainStep(fn, inputs, opts, state);
    if (!loss) FAIL(llvm::toString(loss.takeError()));
    losses.push_back(*loss);
  }
  INFO("first loss " << losses.front() << ", last " << losses.back());
  CHECK(losses.back() < 0.8 * losses.front());
  double firstFive = 0, lastFive = 0;
  for (int i = 0; i < 5; ++i) {
    firstFive += losses[size_t(i)];
    lastFive += losses[losses.size() - 1 - size_t(i)];
  }
  CHECK(lastFive < firstFive);
}

TEST_CASE("every optimizer lowers bf16 and f32 weights of any rank to well-typed updates",
          "[optimizer]") {
  for (const char* optimizer :
       {"sgd(lr = 0.1, momentum = 0.9, clip_norm = 1)", "adamw(lr = 0.01, clip_norm = 1)",
        "adafactor(lr = 0.01, beta1 = 0.9, warmup_steps = 2, schedule = rsqrt)"}) {
    INFO(optimizer);
    Trained trained;
    std::string source = fmt::format(R"(
dim r = 3
dim c = 4
dim d = 2
train t(x: f32[r, c]) {{
  param w: bf16[d, r, c] = normal(stddev = 1)
  param v: f32[c] = normal(stddev = 1)
  param s: f32[] = constant(value = 0.5)
  let loss = sum(square(cast(w, f32) * x + v) * s)
  minimize loss with {}
}}
)",
                                     optimizer);
    ir::Function fn = lowered(source, trained);
    for (const ir::ParamUpdate& update : fn.updates)
      CHECK(fn.typeOf(update.value) == fn.params[update.param].type);
    interp::TensorMap inputs{{"x", interp::synthesizeInput(fn.inputs[0], 1)}}, state;
    for (int s = 0; s < 3; ++s) {
      interp::Options opts;
      opts.step = uint64_t(s);
      auto loss = interp::trainStep(fn, inputs, opts, state);
      if (!loss) FAIL(llvm::toString(loss.takeError()));
      CHECK(std::isfinite(*loss));
    }
    CHECK(state.at("w").type.dtype == ir::DType::BF16);
  }
}

TEST_CASE("adafactor's clipping sums reordered in place compute the same step", "[optimizer]") {
  // A rank-3 weight (a leading dim d): lowered with c summed first, then turned to r first and
  // back, as the planner does for the layout it finds (planner/Planner.cpp).
  Trained trained;
  std::string source = R"(
dim r = 3
dim c = 4
dim d = 2
train t(x: f32[d, r, c]) {
  param w: f32[d, r, c] = normal(stddev = 1)
  param v: f32[c] = normal(stddev = 1)
  let loss = sum(square(w * x + v))
  minimize loss with adafactor(lr = 0.05, clip_threshold = 0.5)
}
)";
  ir::Function colsFirst = lowered(source, trained);
  REQUIRE(train::factoredSumOrder(colsFirst) == std::vector<std::string>{"c"});
  auto splitting = [](std::set<std::string> dims) {
    return [dims](const ir::TensorType& weight, const std::string& dim) {
      CHECK(weight.hasDim(dim)); // asked about the weight's own dims
      return dims.count(dim) > 0;
    };
  };
  for (const std::set<std::string>& split : {std::set<std::string>{"r"}, {"r", "c"}}) {
    ir::Function rows = colsFirst;
    CHECK(train::orderFactoredSums(rows, splitting(split)) == std::vector<std::string>{"r"});
  }
  ir::Function rowsFirst = colsFirst;
  CHECK(train::orderFactoredSums(rowsFirst, splitting({"r"})) == std::vector<std::string>{"r"});
  CHECK(ir::verifyFunction(rowsFirst).empty());
  // c split alone, or neither: back to c first, op for op the lowering's IR.
  for (const std::set<std::string>& split : {std::set<std::string>{}, {"c"}}) {
    ir::Function back = rowsFirst;
    CHECK(train::orderFactoredSums(back, splitting(split)) == std::vector<std::string>{"c"});
    CHECK(ir::verifyFunction(back).empty());
    REQUIRE(back.ops.size() == colsFirst.ops.size());
    for (size_t i = 0; i < back.ops.size(); ++i) {
      CHECK(back.ops[i].operands == colsFirst.ops[i].operands);
      CHECK(back.ops[i].attrs == colsFirst.ops[i].attrs);
      CHECK(back.typeOf(back.ops[i].result) == colsFirst.typeOf(colsFirst.ops[i].result));
    }
  }
  // The same params after 3 steps, in double, up to the sums' rounding.
  auto train = [&](const ir::Function& fn) {
    interp::TensorMap inputs{{"x", interp::synthesizeInput(fn.inputs[0], 2)}}, state;
    for (int s = 0; s < 3; ++s) {
      interp::Options opts;
      opts.step = uint64_t(s);
      opts.roundToDtype = false;
      auto loss = interp::trainStep(fn, inputs, opts, state);
      if (!loss) FAIL(llvm::toString(loss.takeError()));
    }
    return state.at("w").data;
  };
  std::vector<double> expected = train(colsFirst), got = train(rowsFirst);
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i)
    CHECK(got[i] == Approx(expected[i]).epsilon(1e-12).margin(1e-14));
}
