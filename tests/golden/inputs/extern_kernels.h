// User kernels for tests/golden/extern_call.mesh (declared in inputs/extern_lib.mesh).
#pragma once

inline double blend(double a, float b, double t) {
  return a + (b - a) * t;
}
inline float halve(float x) {
  return 0.5f * x;
}
