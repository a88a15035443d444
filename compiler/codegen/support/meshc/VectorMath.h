// libm's functions as vector functions for the generated C++ loops. glibc's libmvec holds SIMD
// versions of exp, log, sin, cos and pow (glibc 2.22) and of tanh, erf, expm1, atan2, ... (2.35),
// and GCC calls them from a vectorized loop for any function declared `simd`; glibc's math.h
// declares them so only under -ffast-math (__FAST_MATH__), which generated code is not built
// with. Without it, a loop that calls libm runs one scalar call per element: a user kernel
// (`extern def`, e.g. swish_mlp's std::exp and std::tanh, 3-10 ns per element here) and the
// bf16/f16 ops the generated code computes in double (gelu's tanh, sigmoid's exp: 28 ns per
// element in ViT's bf16 feed-forward). Declared `simd` here, those loops vectorize as the f32
// loops do with MathF32.h (8-10x faster; bench in docs/codegen.md).
//
// libmvec's functions are accurate to 4 ulp (glibc's manual), where libm's are to 1-2: a value
// may differ from the scalar call's in its last bits, far inside the comparison tolerance, and
// the f32 and narrower results the generated code rounds them to almost never see it. libm.so
// and libm.a are linker scripts that add libmvec, so nothing else is linked. Other compilers,
// C libraries and targets keep the scalar calls.
#pragma once

#include <cmath>

#if defined(__x86_64__) && defined(__GLIBC__) && defined(__GNUC__) && !defined(__clang__) &&       \
    !defined(__CUDACC__) && !defined(__FAST_MATH__) && defined(__GLIBC_PREREQ)
#if __GLIBC_PREREQ(2, 22)
#define MESHC_VECTOR_MATH_1(name)                                                                  \
  extern "C" double name(double) noexcept __attribute__((__simd__("notinbranch")));                \
  extern "C" float name##f(float) noexcept __attribute__((__simd__("notinbranch")));
#define MESHC_VECTOR_MATH_2(name)                                                                  \
  extern "C" double name(double, double) noexcept __attribute__((__simd__("notinbranch")));        \
  extern "C" float name##f(float, float) noexcept __attribute__((__simd__("notinbranch")));
MESHC_VECTOR_MATH_1(exp)
MESHC_VECTOR_MATH_1(log)
MESHC_VECTOR_MATH_1(sin)
MESHC_VECTOR_MATH_1(cos)
MESHC_VECTOR_MATH_2(pow)
#if __GLIBC_PREREQ(2, 35)
MESHC_VECTOR_MATH_1(acos)
MESHC_VECTOR_MATH_1(acosh)
MESHC_VECTOR_MATH_1(asin)
MESHC_VECTOR_MATH_1(asinh)
MESHC_VECTOR_MATH_1(atan)
MESHC_VECTOR_MATH_1(atanh)
MESHC_VECTOR_MATH_1(cbrt)
MESHC_VECTOR_MATH_1(cosh)
MESHC_VECTOR_MATH_1(erf)
MESHC_VECTOR_MATH_1(erfc)
MESHC_VECTOR_MATH_1(exp2)
MESHC_VECTOR_MATH_1(expm1)
MESHC_VECTOR_MATH_1(log10)
MESHC_VECTOR_MATH_1(log1p)
MESHC_VECTOR_MATH_1(log2)
MESHC_VECTOR_MATH_1(sinh)
MESHC_VECTOR_MATH_1(tan)
MESHC_VECTOR_MATH_1(tanh)
MESHC_VECTOR_MATH_2(atan2)
MESHC_VECTOR_MATH_2(hypot)
#endif
#undef MESHC_VECTOR_MATH_1
#undef MESHC_VECTOR_MATH_2
#endif
#endif
