#!/usr/bin/env python3
"""Training equivalence of one example's train block (ctest label e2e).

For each mesh, compiles the example with `meshc --emit=cpp --cpp-runner`, builds the generated
code and trains N steps (`<binary> out --steps N`: forward, backward and the optimizer's update
on the threads backend). Then:
  1. every mesh's per-step losses and final params (weights and optimizer state) match those of
     the reference mesh (the first one, normally [1]) within the tolerances below;
  2. on the second mesh, the generated code matches the reference interpreter
     (`meshc --emit=run --steps K --dump-outputs`) for K steps.

Tolerances: tolerance.py's rule, |a - e| <= atol + rtol |e| elementwise (rtol per dtype, atol =
rtol times the expected tensor's RMS), with rtol growing linearly in the optimizer updates that
the values went through: the loss printed at step s after s updates, the final params and
optimizer state after N. Why linear: each step computes its gradient with an error within the
one-step bound, and a stable optimizer (lr below 2 over the curvature) does not amplify an
earlier step's parameter difference, so the per-step differences at most add up; the optimizers
that normalize each gradient element (AdamW: m / sqrt(v); Adafactor: by the factored second
moment) stay within the bound as long as no element's gradient is pure rounding noise (its
update would then flip sign; docs/architecture.md "Numerical tolerances"). Mesh against mesh,
both runs are approximations, so the bound doubles (both_approximate). A real bug (a missing
gradient all-reduce, a wrong shard, a step counter off by one) gives errors of 1e-2 or more: a
missing all-reduce halves or doubles a gradient.

The dtype of each comparison is the compared tensor's path dtype (tolerance.py; `meshc
--emit=tolerance-dtypes`): a loss, metric or param that no bf16/f16 value reaches compares at f32's
tolerance whatever else the program computes in bf16.

Testing the test: with --inject-fault FAULT the second mesh is compiled with `meshc
--inject-fault=FAULT` (compiler/planner/InjectFault.h: drop-grad-allreduce drops the first
all-reduce of a param's gradient), and --expect-failure inverts the verdict: the script succeeds
only when the comparisons fail, and prints the worst error over its tolerance.

Usage: run_train_case.py --meshc M --example X.mesh --workdir DIR --cxx C++ --include DIR...
       --lib LIB... --mesh REF --mesh M2 [--mesh M3...] [--layout-of-ref auto] [--steps 20]
       [--interp-steps 3] [--inject-fault FAULT [--expect-failure]] [--cxx-flag=-fsanitize=address]...
       [--dim NAME=SIZE]... [--launcher "mpirun -np 4"]
Each --mesh is `axes|layout` (`data=1|auto`, `data=2,model=2|own`). --cxx-flag adds a flag to the
build of the generated code (compile and link), as run_case.py's."""
import argparse
import os
import re
import shlex
import sys
import time

from checked_run import run
from compare_outputs import compare_files
from generated_build import GENERATED, add_build_options, build_generated
from tolerance import coarsened_paths, compare_values, path_dtypes_of


def series_of(text):
    """The `step S loss L [metric M ...]` lines of a run: each named value's floats in step
    order ("loss", then the train block's metrics)."""
    series = {}
    steps = 0
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and len(fields) % 2 == 0 and fields[0] == "step" and fields[2] == "loss":
            assert int(fields[1]) == steps, f"step {fields[1]} out of order"
            steps += 1
            for name, value in zip(fields[2::2], fields[3::2]):
                series.setdefault(name, []).append(float(value))
    return series


class Comparisons:
    """Every comparison of one run of the script: the path dtypes of the compared tensors, and
    (what, tolerance.Verdict) for each, for the summary of an injected fault."""

    def __init__(self, function, path_dtypes):
        self.function, self.path_dtypes, self.verdicts = function, path_dtypes, []

    def series(self, got, want, both_approximate, what):
        """Every per-step series (the loss and each metric) of two runs."""
        if sorted(got) != sorted(want):
            print(f"FAIL {what}: values {sorted(got)}, expected {sorted(want)}")
            return False
        ok = True
        for name in want:
            ok = self.losses(got[name], want[name], name, both_approximate,
                             what if name == "loss" else f"{what} ({name})") and ok
        return ok

    def losses(self, got, want, name, both_approximate, what):
        """The value printed at step s (the loss or a metric) has been through s updates."""
        if len(got) != len(want):
            print(f"FAIL {what}: {len(got)} losses, expected {len(want)}")
            return False
        path = self.path_dtypes.get(f"{self.function}.{name}")
        verdicts = [compare_values([g], [w], "f32", step, path, both_approximate)
                    for step, (g, w) in enumerate(zip(got, want))]
        ok = all(v.ok for v in verdicts)
        worst = max(range(len(verdicts)), key=lambda step: verdicts[step].ratio)
        self.verdicts.append((what, verdicts[worst]))
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {len(got)} losses; worst at step {worst}: "
              f"{verdicts[worst].describe()}; first {got[0]:.6g} last {got[-1]:.6g}")
        if not ok:
            for step, (g, w) in enumerate(zip(got, want)):
                print(f"  step {step}: {g:.9g} vs {w:.9g}")
        return ok

    def files(self, actual, expected, steps, both_approximate, what, unrounded=None):
        print(f"--- {what}: final loss and params after {steps} steps")
        verdicts = []
        ok = compare_files(actual, expected, steps, self.path_dtypes, both_approximate,
                           verdicts=verdicts, unrounded_path=unrounded)
        self.verdicts += [(f"{what}: {name}", verdict) for name, verdict in verdicts]
        return ok

    def worst(self):
        return max(self.verdicts, key=lambda item: item[1].ratio)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshc", required=True)
    parser.add_argument("--example", required=True)
    parser.add_argument("--workdir", required=True)
    add_build_options(parser)
    parser.add_argument("--mesh", action="append", required=True,
                        help="MESH|LAYOUT[|EXTRA]: the first is the reference; EXTRA are meshc "
                             "options for code generation only, space-separated")
    parser.add_argument("--function", required=True, help="the train block")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--interp-steps", type=int, default=3)
    parser.add_argument("--seed", default="0")
    parser.add_argument("--launcher", default="",
                        help="runs every mesh but the reference under it with --backend mpi "
                             "(e.g. \"mpirun -np 4\")")
    parser.add_argument("--dim", action="append", default=[],
                        help="NAME=SIZE: meshc --dim for every mesh and the interpreter")
    parser.add_argument("--inject-fault", help="meshc --inject-fault=FAULT for the second mesh")
    parser.add_argument("--expect-failure", action="store_true",
                        help="succeed only when the comparisons fail (with --inject-fault)")
    args = parser.parse_args()
    if args.expect_failure and not args.inject_fault:
        parser.error("--expect-failure needs --inject-fault")
    if args.inject_fault and len(args.mesh) < 2:
        parser.error("--inject-fault needs a second mesh")
    os.makedirs(args.workdir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(args.example))[0]

    runs = []  # (mesh, binary, overrides, losses, dump)
    for index, spec in enumerate(args.mesh):
        # MESH|LAYOUT[|EXTRA]: EXTRA, space-separated meshc options for code generation only
        # (e.g. `--microbatches=batch:4`); the interpreter oracle runs without them.
        mesh, layout, *extra = spec.split("|")
        extra = extra[0].split() if extra else []
        overrides = ["--mesh", mesh, "--function", args.function]
        for dim in args.dim:
            overrides += ["--dim", dim]
        if layout != "own":
            overrides += ["--layout", layout]
        tag = mesh.replace("=", "").replace(",", "_") + "".join(
            "_" + re.sub(r"[^A-Za-z0-9]+", "", option) for option in extra)
        # A pinned stage split (`layers: stage(1, 3)`) is another build of the same mesh.
        for split in re.findall(r"\(([\d, ]+)\)", layout):
            tag += "_split" + re.sub(r"\D+", "_", split)
        base = os.path.join(args.workdir, f"{stem}-{tag}")
        start = time.time()
        fault = [f"--inject-fault={args.inject_fault}"] if args.inject_fault and index == 1 else []
        print(run([args.meshc, args.example, "--emit=cpp", "--cpp-runner", "-o", base] + overrides
                  + extra + fault, with_stderr=True), end="")
        unity = base + ".unity.cpp"
        with open(unity, "w") as f:
            f.write(f'#include "{os.path.basename(base)}.cpp"\n'
                    f'#include "{os.path.basename(base)}.main.cpp"\n')
        binary = base + ".bin"
        reused = build_generated(args, unity, binary, args.workdir,
                                 [base + ext for ext in GENERATED])
        built = time.time() - start
        dump = base + f".steps{args.steps}"
        start = time.time()
        launch = shlex.split(args.launcher) if args.launcher and index > 0 else []
        backend = ["--backend", "mpi"] if launch else []
        # Under the launcher only world rank 0 prints its steps (--backend mpi fails without
        # MPI); processes each running the whole mesh on threads would print every step 4 times,
        # which series_of rejects.
        text = run(launch + [binary] + backend + [dump, args.seed, "--steps", str(args.steps)])
        series = series_of(text)
        losses = series.get("loss", [float("nan")])
        print(f"[{mesh}] ({layout} layout) {'reused' if reused else 'built'} in {built:.1f} s, "
              f"{args.steps} steps in "
              f"{time.time() - start:.2f} s: loss {losses[0]:.6g} -> {losses[-1]:.6g}")
        runs.append((" ".join([mesh] + extra), binary, overrides, series, dump, launch + [binary]
                     + backend))

    ok = True
    path_dtypes = path_dtypes_of(args.meshc, args.example, runs[0][2])
    for line in coarsened_paths(path_dtypes):
        print(line)
    compared = Comparisons(args.function, path_dtypes)
    reference = runs[0]
    if len(reference[3].get("loss", [])) != args.steps:
        print(f"FAIL: the reference printed {len(reference[3].get('loss', []))} losses, "
              f"expected {args.steps}")
        return 1
    for mesh, _, _, series, dump, _ in runs[1:]:
        what = f"[{mesh}] vs [{reference[0]}]"
        ok = compared.series(series, reference[3], True, what) and ok
        ok = compared.files(dump, reference[4], args.steps, True, what) and ok

    # The generated code against the interpreter, a few steps on the second mesh.
    mesh, binary, overrides, _, _, command = runs[1] if len(runs) > 1 else runs[0]
    k = str(args.interp_steps)
    actual, expected = binary + f".steps{k}", binary + f".interp{k}"
    generated = series_of(run(command + [actual, args.seed, "--steps", k]))
    interpret = [args.meshc, args.example, "--emit=run", "--steps", k, "--seed", args.seed]
    interpreted = series_of(run(interpret + ["--dump-outputs", expected] + overrides))
    what = f"generated [{mesh}] vs the interpreter"
    ok = compared.series(generated, interpreted, False, what) and ok
    files_ok = compared.files(actual, expected, args.interp_steps, False, what)
    if not files_ok:
        # Are the elements over the bound determined by the program at all? The interpreter in
        # double says how far its own rounding moves each (tolerance.py's ill-conditioned ones).
        unrounded = expected + "-double"
        run(interpret + ["--interp-in-double", "--dump-outputs", unrounded] + overrides)
        files_ok = compared.files(actual, expected, args.interp_steps, False,
                                  f"{what}, the interpreter in double for ill-conditioned "
                                  "elements", unrounded)
    ok = files_ok and ok
    if args.inject_fault:
        what, verdict = compared.worst()
        caught = "caught" if not ok else "NOT caught"
        print(f"injected fault {args.inject_fault} {caught}: worst error/tolerance "
              f"{verdict.ratio:.3g} ({what})")
        if args.expect_failure:
            return 0 if not ok else 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
