// Optimizer lowering. Every formula here is written out in docs/training.md; `s` is the `step`
// op (steps taken before this one, from 0) and t = s + 1.
#include "train/Optimizer.h"
#include "train/OrderFactoredSums.h"
#include "train/Recompute.h"

#include "train/OpBuilder.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>

namespace meshc::train {
namespace {

using ir::OpKind;
using ir::TensorType;
using ir::ValueId;

class OptimizerLowering {
public:
  OptimizerLowering(ir::Function& fn, const Gradients& gradients)
      : fn(fn), gradients(gradients), b(fn, fn.train->loc) {}

  void run();

private:
  double option(const std::string& name, double fallback) const;
  std::string optionString(const std::string& name, const std::string& fallback) const;

  ValueId learningRate(ValueId s);
  /// Scales every gradient by min(1, clip_norm / global norm).
  void clipByGlobalNorm(std::map<size_t, ValueId>& grads, double clipNorm);
  /// A zeros-initialized state slot `<weight>@<slot>` of `type`; returns its Param value.
  ValueId addState(size_t weight, const std::string& slot, TensorType type);
  void update(size_t param, ValueId value) { fn.updates.push_back(ir::ParamUpdate{param, value}); }
  /// beta * old + (1 - beta) * fresh, beta a scalar value.
  ValueId movingAverage(ValueId old, ValueId fresh, ValueId beta) {
    return b.add(b.mul(old, b.cast(beta, b.type(old).dtype)),
                 b.mul(fresh, b.cast(rsub(1, beta), b.type(fresh).dtype)));
  }
  ValueId rsub(double c, ValueId v) {
    return b.binary(OpKind::Sub, b.literal(c, b.type(v).dtype), v);
  }
  ValueId rms(ValueId x) { return b.unary(OpKind::Sqrt, b.meanAll(b.unary(OpKind::Square, x))); }
  /// The update of weight `w` (value `weight`) with gradient `g` and learning rate `lr`.
  ValueId sgd(size_t w, ValueId weight, ValueId g, ValueId lr);
  ValueId adamw(size_t w, ValueId weight, ValueId g, ValueId lr, ValueId t);
  ValueId adafactor(size_t w, ValueId weight, ValueId g, ValueId lr, ValueId t);
  /// mean(u^2) of Adafactor's factored update u = g rsqrt(vr / rowMean) rsqrt(vc) (see there).
  ValueId factoredMeanSquare(ValueId g, ValueId vr, ValueId vc, ValueId rowMean,
                             const std::string& rowDim, const std::string& colDim);

  /// 1 - beta^t, computed once per train step (f32 scalar), shared by every weight.
  ValueId biasCorrection(double beta, ValueId t) {
    auto [it, added] = corrections.try_emplace(beta, 0);
    if (added) it->second = rsub(1, b.binary(OpKind::Pow, b.literal(beta), t));
    return it->second;
  }

  ir::Function& fn;
  const Gradients& gradients;
  OpBuilder b;
  std::map<double, ValueId> corrections;
  std::optional<ValueId> adafactorBeta2;
};

double OptimizerLowering::option(const std::string& name, double fallback) const {
  for (const auto& [key, value] : fn.train->options) {
    if (key != name) continue;
    if (const double* d = std::get_if<double>(&value)) return *d;
    if (const int64_t* i = std::get_if<int64_t>(&value)) return double(*i);
  }
  return fallback;
}

std::string OptimizerLowering::optionString(const std::string& name,
                                            const std::string& fallback) const {
  for (const auto& [key, value] : fn.train->options)
    if (key == name) {
      if (const std::string* text = std::get_if<std::string>(&value)) return *text;
      if (const auto* list = std::get_if<std::vector<std::string>>(&value); list && !list->empty())
        return list->front();
    }
  return fallback;
}

/// lr_s = lr * warmup(s) * decay(s); see docs/training.md "Learning-rate schedules".
ValueId OptimizerLowering::learningRate(ValueId s) {
  double lr = option("lr", 0), warmup = option("warmup_steps", 0),
         decaySteps = option("decay_steps", 0);
  std::string schedule = optionString("schedule", "constant");
  ValueId rate = b.literal(lr);
  if (warmup > 0) { // min(1, (s + 1) / W)
    ValueId ramp = b.mul(b.add(s, 1.0), 1.0 / warmup);
    rate = b.mul(rate, b.binary(OpKind::Minimum, ramp, b.literal(1)));
  }
  if ((schedule == "linear" || schedule == "cosine") && decaySteps > 0) {
    // p = clamp((s - W) / D, 0, 1)
    ValueId progress =
        b.mul(b.binary(OpKind::Maximum, b.add(s, -warmup), b.literal(0)), 1.0 / decaySteps);
    progress = b.binary(OpKind::Minimum, progress, b.literal(1));
    ValueId factor = schedule == "linear"
                         ? rsub(1, progress)
                         : b.mul(b.add(b.unary(OpKind::Cos, b.mul(progress, M_PI)), 1.0), 0.5);
    rate = b.mul(rate, factor);
  } else if (schedule == "rsqrt") { // sqrt(max(W, 1) / max(s + 1, W, 1))
    double floor = std::max(warmup, 1.0);
    ValueId denominator = b.binary(OpKind::Maximum, b.add(s, 1.0), b.literal(floor));
    rate = b.mul(rate, b.mul(b.unary(OpKind::Rsqrt, denominator), std::sqrt(floor)));
  }
  if (fn.definingOp(rate).kind != OpKind::Literal) fn.values[rate].name = "learning_rate";
  return rate;
}

void OptimizerLowering::clipByGlobalNorm(std::map<size_t, ValueId>& grads, double clipNorm) {
  std::optional<ValueId> squares;
  for (const auto& [param, g] : grads) {
    ValueId part = b.cast(b.sumAll(b.unary(OpKind::Square, g)), ir::DType::F32);
    squares = squares ? b.add(*squares, part) : part;
  }
  if (!squares) return;
  ValueId norm = b.unary(OpKind::Sqrt, *squares);
  fn.values[norm].name = "global_grad_norm";
  ValueId clip = b.literal(clipNorm);
  ValueId scale = b.div(clip, b.binary(OpKind::Maximum, norm, clip)); // min(1, c / norm)
  for (auto& [param, g] : grads)
    g = b.mul(g, b.cast(scale, b.type(g).dtype));
}

ValueId OptimizerLowering::addState(size_t weight, const std::string& slot, TensorType type) {
  ir::ParamInfo state;
  state.path = fn.params[weight].path + "@" + slot;
  state.type = std::move(type);
  state.init.kind = "zeros";
  state.trainable = false;
  state.loc = fn.params[weight].loc;
  state.role = ir::ParamRole::OptimizerState;
  state.value = b.op(OpKind::Param, {}, state.type, {{"path", state.path}}, state.path);
  fn.params.push_back(std::move(state));
  return fn.params.back().value;
}

/// Heavy-ball momentum as PyTorch: v' = mu v + g; step v' (or g + mu v' with nesterov).
ValueId OptimizerLowering::sgd(size_t w, ValueId weight, ValueId g, ValueId lr) {
  double momentum = option("momentum", 0);
  ValueId direction = g;
  if (momentum != 0) {
    ValueId velocity = addState(w, "momentum", b.type(weight));
    size_t slot = fn.params.size() - 1;
    ValueId next = b.add(b.mul(velocity, momentum), g);
    update(slot, next);
    direction = option("nesterov", 0) != 0 ? b.add(g, b.mul(next, momentum)) : next;
  }
  return b.sub(weight, b.mul(direction, lr));
}

/// Adam with bias correction and decoupled weight decay (Loshchilov & Hutter).
ValueId OptimizerLowering::adamw(size_t w, ValueId weight, ValueId g, ValueId lr, ValueId t) {
  double beta1 = option("beta1", 0.9), beta2 = option("beta2", 0.999), eps = option("eps", 1e-8),
         decay = option("weight_decay", 0.01);
  ValueId m = addState(w, "m", b.type(weight));
  size_t mSlot = fn.params.size() - 1;
  ValueId v = addState(w, "v", b.type(weight));
  size_t vSlot = fn.params.size() - 1;
  ValueId nextM = movingAverage(m, g, b.literal(beta1));
  ValueId nextV = movingAverage(v, b.unary(OpKind::Square, g), b.literal(beta2));
  update(mSlot, nextM);
  update(vSlot, nextV);
  ir::DType dtype = b.type(weight).dtype;
  ValueId correct1 = b.cast(biasCorrection(beta1, t), dtype);
  ValueId correct2 = b.cast(biasCorrection(beta2, t), dtype);
  ValueId mHat = b.div(nextM, correct1), vHat = b.div(nextV, correct2);
  ValueId direction = b.div(mHat, b.add(b.unary(OpKind::Sqrt, vHat), eps));
  // decay_min_rank = 2 leaves biases and norm gains undecayed, as GPT-2's and LLaMA's training
  // (nanoGPT decays the weights of 2 dims or more only).
  if (decay != 0 && double(b.type(weight).dims.size()) >= option("decay_min_rank", 0))
    direction = b.add(direction, b.mul(weight, decay));
  return b.sub(weight, b.mul(direction, lr));
}

/// Adafactor as in Mesh-TensorFlow (Shazeer & Stern 2018): factored second moments over the
/// last two dims of rank >= 2 weights, beta2_t = 1 - t^-decay_rate, update clipping by RMS,
/// step scaled by max(eps2, RMS(weight)), momentum (beta1 > 0) over the scaled update.
ValueId OptimizerLowering::adafactor(size_t w, ValueId weight, ValueId g, ValueId lr, ValueId t) {
  double decayRate = option("decay_rate", 0.8), beta1 = option("beta1", 0),
         clipThreshold = option("clip_threshold", 1), eps1 = option("eps1", 1e-30),
         eps2 = option("eps2", 1e-3);
  const TensorType weightType = b.type(weight);
  if (!adafactorBeta2) adafactorBeta2 = rsub(1, b.binary(OpKind::Pow, t, b.literal(-decayRate)));
  ValueId beta2 = *adafactorBeta2;
  ValueId squared = b.add(b.unary(OpKind::Square, g), eps1);
  ValueId u = 0;
  std::optional<ValueId> meanSquare; // mean(u^2), for the clipping
  size_t rank = weightType.dims.size();
  if (rank >= 2) {
    std::string rowDim = weightType.dims[rank - 2].name, colDim = weightType.dims[rank - 1].name;
    TensorType rowType = weightType, colType = weightType;
    rowType.dims.erase(rowType.dims.begin() + long(rank) - 1);
    colType.dims.erase(colType.dims.begin() + long(rank) - 2);
    ValueId vr = addState(w, "vr", rowType);
    size_t vrSlot = fn.params.size() - 1;
    ValueId vc = addState(w, "vc", colType);
    size_t vcSlot = fn.params.size() - 1;
    ValueId nextVr = movingAverage(vr, b.reduce(OpKind::ReduceMean, squared, {colDim}), beta2);
    ValueId nextVc = movingAverage(vc, b.reduce(OpKind::ReduceMean, squared, {rowDim}), beta2);
    update(vrSlot, nextVr);
    update(vcSlot, nextVc);
    ValueId rowMean = b.reduce(OpKind::ReduceMean, nextVr, {rowDim});
    ValueId rowFactor = b.unary(OpKind::Rsqrt, b.div(nextVr, rowMean));
    u = b.mul(b.mul(g, rowFactor), b.unary(OpKind::Rsqrt, nextVc));
    if (clipThreshold > 0)
      meanSquare = factoredMeanSquare(g, nextVr, nextVc, rowMean, rowDim, colDim);
  } else {
    ValueId v = addState(w, "v", weightType);
    size_t vSlot = fn.params.size() - 1;
    ValueId nextV = movingAverage(v, squared, beta2);
    update(vSlot, nextV);
    u = b.mul(g, b.unary(OpKind::Rsqrt, nextV));
  }
  if (clipThreshold > 0) { // u / max(1, RMS(u) / d)
    ValueId rmsU = meanSquare ? b.unary(OpKind::Sqrt, *meanSquare) : rms(u);
    u = b.div(u, b.binary(OpKind::Maximum, b.mul(rmsU, 1.0 / clipThreshold),
                          b.literal(1, weightType.dtype)));
  }
  ValueId scale =
      b.mul(b.binary(OpKind::Maximum, rms(weight), b.literal(eps2, weightType.dtype)), lr);
  ValueId subtrahend = b.mul(u, scale);
  if (beta1 > 0) {
    ValueId m = addState(w, "m", weightType);
    size_t mSlot = fn.params.size() - 1;
    subtrahend = movingAverage(m, subtrahend, b.literal(beta1));
    update(mSlot, subtrahend);
  }
  return b.sub(weight, subtrahend);
}

/// mean(u^2) = mean(g^2 rowMean / (vr vc)), the value of squaring u, summed in another order:
/// first over C, divided by the statistic that keeps C (vc), which each rank has whole (it is a
/// mean over R). Summed first over a split dim, that sum's partial sums depend on the gradient
/// alone, so they resolve in the same all-reduce as the statistics instead of in a second round
/// after them; the rest is local. The sum is marked so that OrderFactoredSums.h can turn it to run
/// over R first (dividing by vr) when the layout splits R and not C.
ValueId OptimizerLowering::factoredMeanSquare(ValueId g, ValueId vr, ValueId vc, ValueId rowMean,
                                              const std::string& rowDim,
                                              const std::string& colDim) {
  ValueId inner = b.reduce(OpKind::ReduceMean, b.div(b.unary(OpKind::Square, g), vc), {colDim});
  fn.ops[fn.values[inner].definingOp].setAttr(kFactoredSumAttr,
                                              std::vector<std::string>{rowDim, colDim});
  return b.meanAll(b.mul(inner, b.div(rowMean, vr)));
}

void OptimizerLowering::run() {
  if (gradients.empty()) return;
  ValueId s = b.step();
  ValueId t = b.add(s, 1.0);
  ValueId lr = learningRate(s);
  std::map<size_t, ValueId> grads(gradients.begin(), gradients.end());
  if (double clipNorm = option("clip_norm", 0); clipNorm > 0) clipByGlobalNorm(grads, clipNorm);
  const std::string& optimizer = fn.train->optimizer;
  for (const auto& [w, g] : grads) {
    ValueId weight = fn.params[w].value;
    ValueId lrW = b.cast(lr, b.type(weight).dtype);
    ValueId next = optimizer == "adamw"       ? adamw(w, weight, g, lrW, t)
                   : optimizer == "adafactor" ? adafactor(w, weight, g, lrW, t)
                                              : sgd(w, weight, g, lrW);
    fn.values[next].name = "next/" + fn.params[w].path;
    update(w, next);
  }
}

} // namespace

void lowerOptimizer(ir::Function& fn, const Gradients& gradients,
                    const std::set<std::string>& splitDims) {
  if (!fn.train) return;
  OptimizerLowering(fn, gradients).run();
  orderFactoredSums(
      fn, [&](const ir::TensorType&, const std::string& dim) { return splitDims.count(dim) > 0; });
}

bool lowerTraining(ir::Function& fn, DiagEngine& diag, const std::set<std::string>& splitDims,
                   size_t* forwardOpsOut) {
  if (forwardOpsOut) *forwardOpsOut = SIZE_MAX;
  if (fn.kind != ir::Function::Kind::Train || !fn.train || ir::hasOptimizerUpdates(fn)) return true;
  size_t forwardOps = fn.ops.size();
  if (forwardOpsOut) *forwardOpsOut = forwardOps;
  std::optional<Gradients> gradients = differentiate(fn, diag);
  if (!gradients) return false;
  lowerOptimizer(fn, *gradients, splitDims);
  recomputeActivations(fn, forwardOps);
  return true;
}

std::set<std::string> pinnedDims(const ir::Module& module) {
  std::set<std::string> dims;
  for (const ir::DimLayout& entry : module.layout)
    if (!entry.isAuto && !entry.axes.empty()) dims.insert(entry.dim);
  return dims;
}

} // namespace meshc::train
