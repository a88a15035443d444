// MathF32.h's f32 functions in a plain loop over 1M floats (the form generated code has, which
// GCC vectorizes) against the scalar double code generated code runs today,
// `float(std::tanh(double(x)))`, side by side: rounds alternate the two, best of N rounds,
// thread CPU time. Built twice (bench_mathf32_native: -march=native; bench_mathf32_sse2: plain
// x86-64). Prints each function's time per element and the ratio scalar / f32 (> 1: f32 faster).
#include "meshrt/kernels/MathF32.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <vector>

namespace f32 = meshrt::kernels::f32;

namespace {

double threadSeconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return double(now.tv_sec) + 1e-9 * double(now.tv_nsec);
}

double geluDouble(double x) {
  return 0.5 * x * (1 + std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}
double sigmoidDouble(double x) {
  return 1 / (1 + std::exp(-x));
}

// One loop per function and side, never inlined into the timing code (as generated loops are).
#define MESHC_BENCH_LOOP(name, body)                                                               \
  __attribute__((noinline)) void name(const float* __restrict x, const float* __restrict y,        \
                                      float* __restrict out, size_t n) {                           \
    (void)y;                                                                                       \
    for (size_t i = 0; i < n; ++i)                                                                 \
      out[i] = body;                                                                               \
  }
MESHC_BENCH_LOOP(expF32, f32::exp(x[i]))
MESHC_BENCH_LOOP(expDouble, float(std::exp(double(x[i]))))
MESHC_BENCH_LOOP(logF32, f32::log(y[i]))
MESHC_BENCH_LOOP(logDouble, float(std::log(double(y[i]))))
MESHC_BENCH_LOOP(tanhF32, f32::tanh(x[i]))
MESHC_BENCH_LOOP(tanhDouble, float(std::tanh(double(x[i]))))
MESHC_BENCH_LOOP(sigmoidF32, f32::sigmoid(x[i]))
MESHC_BENCH_LOOP(sigmoidDoubleLoop, float(sigmoidDouble(double(x[i]))))
MESHC_BENCH_LOOP(geluF32, f32::gelu(x[i]))
MESHC_BENCH_LOOP(geluDoubleLoop, float(geluDouble(double(x[i]))))
MESHC_BENCH_LOOP(sinF32, f32::sin(x[i]))
MESHC_BENCH_LOOP(sinDouble, float(std::sin(double(x[i]))))
MESHC_BENCH_LOOP(cosF32, f32::cos(x[i]))
MESHC_BENCH_LOOP(cosDouble, float(std::cos(double(x[i]))))
MESHC_BENCH_LOOP(powF32, f32::pow(y[i], x[i]))
MESHC_BENCH_LOOP(powDouble, float(std::pow(double(y[i]), double(x[i]))))
#undef MESHC_BENCH_LOOP

using Loop = void (*)(const float*, const float*, float*, size_t);

} // namespace

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 10;
  const size_t n = size_t(1) << 20;
  std::mt19937 engine(1);
  std::uniform_real_distribution<float> signedDist(-8, 8), positiveDist(0.01f, 100);
  std::vector<float> x(n), y(n), out(n), masked(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = signedDist(engine);
    y[i] = positiveDist(engine);
    // A causal softmax's inputs: every other score masked to -1e9 (e^x is 0 there).
    masked[i] = i % 2 ? -1e9f : x[i];
  }
  struct Pair {
    const char* name;
    Loop f32Loop, doubleLoop;
    bool masked = false; // x is `masked`
  };
  const Pair pairs[] = {{"exp", expF32, expDouble},
                        {"exp masked", expF32, expDouble, true},
                        {"log", logF32, logDouble},
                        {"tanh", tanhF32, tanhDouble},
                        {"sigmoid", sigmoidF32, sigmoidDoubleLoop},
                        {"gelu", geluF32, geluDoubleLoop},
                        {"sin", sinF32, sinDouble},
                        {"cos", cosF32, cosDouble},
                        {"pow", powF32, powDouble}};
  std::printf("MathF32.h loop vs scalar double libm, %zu floats, best of %d alternated rounds "
              "(thread CPU time)\n\n",
              n, rounds);
  std::printf("| %-10s | %14s | %14s | %15s |\n", "function", "f32 ns/elem", "double ns/elem",
              "double / f32");
  std::printf("|------------|----------------|----------------|-----------------|\n");
  for (const Pair& pair : pairs) {
    double bestF32 = 1e30, bestDouble = 1e30;
    for (int round = 0; round < rounds; ++round) {
      const float* in = pair.masked ? masked.data() : x.data();
      double start = threadSeconds();
      pair.f32Loop(in, y.data(), out.data(), n);
      double middle = threadSeconds();
      pair.doubleLoop(in, y.data(), out.data(), n);
      double end = threadSeconds();
      bestF32 = std::min(bestF32, middle - start);
      bestDouble = std::min(bestDouble, end - middle);
    }
    std::printf("| %-10s | %14.3f | %14.3f | %15.1f |\n", pair.name, bestF32 / double(n) * 1e9,
                bestDouble / double(n) * 1e9, bestDouble / bestF32);
  }
  return 0;
}
