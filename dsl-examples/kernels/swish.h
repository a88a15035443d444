// User kernels for dsl-examples/swish_mlp.mesh: plain C++ scalar functions that meshc calls
// from its fused elementwise loops (declared there with `extern def ... from "kernels/swish.h"`).
#pragma once

#include <cmath>

/// Swish (SiLU): x * sigmoid(x).
inline float swish(float x) {
  return x / (1.0f + std::exp(-x));
}

/// A soft clip: limit * tanh(x / limit), computed in double.
inline double soft_clip(double x, double limit) {
  return limit * std::tanh(x / limit);
}
