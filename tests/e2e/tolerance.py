"""The one comparison rule of the test scripts: generated code against the reference interpreter,
or one mesh's run against another's. docs/architecture.md "Numerical tolerances" derives the
values; compiler/interp/Tolerance.cpp is the same rule in C++ (`meshc run --check`).

An element passes iff |a - e| <= atol + rtol * |e|, with
  rtol = RTOL_ULPS[dtype] * u(dtype) * (1 + steps)    u: the dtype's unit roundoff
  atol = rtol * rms(e)                                 rms over the expected tensor
(an all-zero expected tensor has no scale of its own: its atol is rtol times the RMS of all the
float values the file holds, the program's typical value, `fallback_rms`).
`dtype` is the coarser of the tensor's dtype and its path dtype: the coarsest float dtype on any
path of the program's data flow into it (`meshc --emit=tolerance-dtypes`, path_dtypes_of): an f32
output of a bf16 computation carries bf16 errors, an f32 output that no bf16 value reaches does
not, whatever else the program computes in bf16; `steps` is the number of optimizer
updates the values went through (0 for a forward program). i32 tensors must match exactly. NaN and
infinities must match exactly.
Ill-conditioned elements: given the interpreter's outputs computed in double (`meshc --emit=run
--interp-in-double`), an element that the oracle's own roundings move by d = |e' - e| with R d
above its (default) bound, R = RTOL_ULPS[dtype], is held to R d instead (a gradient zero in
exact arithmetic, or near adamw's eps, whose normalization amplifies the gradient's rounding)."""
import json
import math

from checked_run import run

# Unit roundoff: half the distance from 1 to the next representable number.
UNIT_ROUNDOFF = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}
# rtol in units of u per dtype; docs/architecture.md "Numerical tolerances" says why.
RTOL_ULPS = {"f32": 1024.0, "f16": 8.0, "bf16": 8.0}


def coarsest_dtype(dtypes):
    """The float dtype among `dtypes` whose rounding dominates (the largest unit roundoff), or
    None when there is none."""
    floats = [d for d in dtypes if d in UNIT_ROUNDOFF]
    return max(floats, key=lambda d: UNIT_ROUNDOFF[d]) if floats else None


def coarser(dtype, path_dtype):
    """A tensor's tolerance dtype: its own, or its path dtype when that rounds coarser."""
    if dtype not in UNIT_ROUNDOFF:
        return dtype
    return coarsest_dtype([dtype, path_dtype])


def rtol_of(dtype, steps=0):
    """The relative tolerance of `dtype` after `steps` optimizer updates (0 for integers)."""
    if dtype not in UNIT_ROUNDOFF:
        return 0.0
    return RTOL_ULPS[dtype] * UNIT_ROUNDOFF[dtype] * (1 + steps)


class Verdict:
    """One tensor's comparison: `ratio` is max |a - e| / (atol + rtol |e|) (passes iff <= 1);
    `needed` the smallest rtol (with atol = rtol * rms) under which it would pass."""

    def __init__(self, ok, ratio, needed, rtol, atol, worst_index, worst_got, worst_want,
                 ill_conditioned=0, ill_conditioned_ratio=0.0):
        self.ok, self.ratio, self.needed = ok, ratio, needed
        self.rtol, self.atol = rtol, atol
        self.worst_index, self.worst_got, self.worst_want = worst_index, worst_got, worst_want
        # Elements over the bound that pass within R times the oracle's own rounding movement.
        self.ill_conditioned, self.ill_conditioned_ratio = ill_conditioned, ill_conditioned_ratio

    def describe(self):
        where = ""
        if self.worst_index is not None and self.ratio > 0:
            where = (f"; worst at [{self.worst_index}]: {self.worst_got:.9g} vs "
                     f"{self.worst_want:.9g}")
        if self.ill_conditioned:
            where += (f"; {self.ill_conditioned} element(s) ill-conditioned, at most "
                      f"{self.ill_conditioned_ratio:.3g} times R times the interpreter's own "
                      f"rounding movement")
        return (f"error/tolerance {self.ratio:.3g} (rtol {self.rtol:.3g}, atol {self.atol:.3g}; "
                f"passes from rtol {self.needed:.3g}){where}")


def rms_of(values):
    """Root-mean-square of the finite values (0 when there are none)."""
    finite = [v for v in values if math.isfinite(v)]
    return math.sqrt(sum(v * v for v in finite) / len(finite)) if finite else 0.0


def typical_scale(tensors):
    """The fallback scale of an all-zero tensor: the RMS of every float value of `tensors`
    (name -> (dtype, shape, values), as compare_outputs.read_outputs returns)."""
    return rms_of([v for dtype, _, values in tensors.values() if dtype in UNIT_ROUNDOFF
                   for v in values])


def compare_values(got, want, dtype, steps=0, path_dtype=None, both_approximate=False,
                   fallback_rms=0.0, unrounded=None):
    """Compares two equally long sequences of floats under the rule above (path_dtype: the
    coarsest float dtype on any path into them, None for f32 throughout). both_approximate:
    `want` is not the oracle but another f32 computation (another mesh's run); each is within
    the bound of the exact values, so they are within twice of each other. unrounded: the
    oracle's values computed in double (as long as `want`), for the ill-conditioned elements;
    the verdict's ratio stays the rule's own over all elements."""
    dtype = coarser(dtype, path_dtype)
    rtol = rtol_of(dtype, steps) * (2 if both_approximate else 1)
    roundings = RTOL_ULPS.get(dtype, 0.0)
    rms = rms_of(want) or fallback_rms
    atol = rtol * rms
    ratio, needed, worst, unexplained = 0.0, 0.0, None, 0.0
    ill, ill_ratio = 0, 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        if not (math.isfinite(g) and math.isfinite(w)):
            if g == w or (math.isnan(g) and math.isnan(w)):
                continue
            this, this_needed = math.inf, math.inf
            unexplained = math.inf
        else:
            error = abs(g - w)
            bound = atol + rtol * abs(w)
            this = error / bound if bound > 0 else (0.0 if error == 0 else math.inf)
            scale = rms + abs(w)
            this_needed = error / scale if scale > 0 else (0.0 if error == 0 else math.inf)
            moved = (roundings * abs(unrounded[i] - w)
                     if unrounded is not None and math.isfinite(unrounded[i]) else 0.0)
            if this > 1 and moved > bound and error <= moved:
                ill, ill_ratio = ill + 1, max(ill_ratio, error / moved)
            else:
                unexplained = max(unexplained, this)
        needed = max(needed, this_needed)
        if worst is None or this > ratio:
            ratio, worst = max(ratio, this), (i, g, w)
    ok = (unexplained <= 1.0 and len(got) == len(want)
          and (unrounded is None or len(unrounded) == len(want)))
    index, g, w = worst if worst is not None else (None, 0.0, 0.0)
    return Verdict(ok, ratio, needed, rtol, atol, index, g, w, ill, ill_ratio)


def path_dtypes_of(meshc, example, overrides):
    """Per compared tensor (`<fn>.<output>`, `<fn>.param.<path>`), the coarsest float dtype on any
    path into it in the program as compiled with `overrides` ("" when no float value reaches
    it), from `meshc --emit=tolerance-dtypes` (compiler/interp/DtypePaths.h)."""
    text = run([meshc, example, "--emit=tolerance-dtypes"] + overrides)
    return {name: dtype or None for name, dtype in json.loads(text).items()}


def coarsened_paths(path_dtypes):
    """A line for the log per tensor whose tolerance its path coarsens beyond f32."""
    return [f"{name}: a {dtype} value reaches it, compared at {dtype}'s tolerance"
            for name, dtype in sorted(path_dtypes.items()) if dtype not in (None, "f32")]
