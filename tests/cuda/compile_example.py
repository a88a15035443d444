#!/usr/bin/env python3
"""Compile-and-link check of generated CUDA (no GPU needed): `meshc --emit=cuda --cpp-runner`
on one example, then ONE nvcc invocation for sm_90 over a translation unit that includes the
generated .cu and its runner, linked against meshrt_cuda, meshrt_nccl, meshrt_kernels, meshrt,
cuBLAS, NCCL and OpenBLAS. Also usable to build the runner for a GPU run (tests/gpu/run.sh).

Usage: compile_example.py --meshc M --example X.mesh --workdir DIR --nvcc NVCC --include DIR...
       --lib LIB... [--mesh ...] [--layout ...] [--math fp32|tf32|bf16] [--opt -O1]
With --check (needs as many GPUs as the mesh has ranks): also runs the binary and compares its
gathered outputs with the reference interpreter's through tests/e2e/compare_outputs.py. With
--check --train-steps K as well: every train block takes K steps on the GPU (forward, backward,
optimizer) and its losses and final params are compared with the interpreter's K steps; then a
checkpoint round trip on the GPU: K steps saved, loaded by a new process and K more steps must
give the final params of 2K uninterrupted steps.
Exit status 0 when meshc, nvcc and the link (and the check) all succeed."""
import argparse
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))
import checked_run  # noqa: E402


def run(cmd):
    return checked_run.run(cmd, with_stderr=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshc", required=True)
    parser.add_argument("--example", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--nvcc", required=True)
    parser.add_argument("--include", action="append", default=[])
    parser.add_argument("--lib", action="append", default=[])
    parser.add_argument("--mesh")
    parser.add_argument("--layout")
    parser.add_argument("--math", default="fp32")
    parser.add_argument("--opt", default="-O1")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--reuse", action="store_true",
                        help="skip meshc and nvcc when the binary exists (a second, --check pass)")
    parser.add_argument("--emit-option", action="append", default=[],
                        help="a meshc option for code generation only (the interpreter's check "
                             "runs without it), e.g. --emit-option=--microbatches=batch=2")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--tol", default="1e-4")
    parser.add_argument("--tol-narrow", default="1e-2")
    parser.add_argument("--train-steps", type=int, default=0)
    parser.add_argument("--param-tol", default="1e-4")
    args = parser.parse_args()

    os.makedirs(args.workdir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(args.example))[0]
    base = os.path.join(args.workdir, stem)
    overrides = []
    if args.mesh:
        overrides += ["--mesh", args.mesh]
    if args.layout:
        overrides += ["--layout", args.layout]
    binary = base + "_cuda"
    if args.reuse and os.path.exists(binary):
        return check(args, base, binary, overrides)
    emit = [args.meshc, args.example, "--emit=cuda", "--cpp-runner", f"--cuda-math={args.math}",
            "-o", base]
    emit += args.emit_option
    result = subprocess.run(emit + overrides, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stdout.write(result.stdout + result.stderr)
        print(f"FAILED ({result.returncode}): {' '.join(emit + overrides)}")
        return 1
    for suffix in (".h", ".cu", ".main.cu"):
        if not os.path.exists(base + suffix):
            print(f"FAILED: meshc wrote no {base + suffix}")
            return 1
    unit = base + ".all.cu"
    with open(unit, "w") as f:
        f.write(f'#include "{stem}.cu"\n#include "{stem}.main.cu"\n')
    start = time.time()
    cmd = [args.nvcc, "-std=c++20", "--extended-lambda", "--expt-relaxed-constexpr",
           f"-arch={args.arch}", "-fmad=false", args.opt, "-o", binary, unit]
    cmd += [f"-I{d}" for d in args.include] + [f"-I{args.workdir}"]
    cmd += args.lib + ["-lcublas", "-lnccl", "-lpthread"]
    run(cmd)
    print(f"{stem}: generated CUDA compiled and linked for {args.arch} in "
          f"{time.time() - start:.1f} s -> {binary}")
    return check(args, base, binary, overrides) if args.check else 0


COMPARE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e",
                       "compare_outputs.py")


def compare(actual, expected, tol, narrow):
    result = subprocess.run([sys.executable, COMPARE, actual, expected, "--tol", tol,
                             "--tol-bf16", narrow], capture_output=True, text=True)
    sys.stdout.write(result.stdout + result.stderr)
    return result.returncode


def check(args, base, binary, overrides):
    """Runs the binary (one GPU per rank) and compares with the interpreter."""
    actual, expected = base + ".actual", base + ".expected"
    print(run([binary, actual, args.seed]), end="")
    run([args.meshc, args.example, "--emit=run", "--seed", args.seed, "--dump-outputs", expected]
        + overrides)
    # bf16 math rounds the GEMM operands: compared with the narrow tolerance.
    tol = args.tol_narrow if args.math == "bf16" else args.tol
    failed = compare(actual, expected, tol, args.tol_narrow)
    if args.train_steps > 0:
        failed += check_training(args, base, binary, overrides)
    return failed


def check_training(args, base, binary, overrides):
    """K train steps on the GPU against the interpreter's K steps, then a checkpoint resume on
    the GPU against 2K uninterrupted steps (tolerances as tests/e2e/run_train_case.py's)."""
    k = str(args.train_steps)
    tol = args.tol_narrow if args.math == "bf16" else args.param_tol
    actual, expected = base + f".steps{k}", base + f".interp{k}"
    print(run([binary, actual, args.seed, "--steps", k]), end="")
    run([args.meshc, args.example, "--emit=run", "--steps", k, "--seed", args.seed,
         "--dump-outputs", expected] + overrides)
    failed = compare(actual, expected, tol, args.tol_narrow)
    checkpoint = base + ".checkpoint"
    if os.path.exists(checkpoint):
        shutil.rmtree(checkpoint)
    run([binary, base + ".first", args.seed, "--steps", k, "--save", checkpoint])
    resumed, straight = base + ".resumed", base + f".steps{2 * args.train_steps}"
    print(run([binary, resumed, args.seed, "--steps", k, "--load", checkpoint]), end="")
    run([binary, straight, args.seed, "--steps", str(2 * args.train_steps)])
    print("checkpoint resume on the GPU vs uninterrupted steps:")
    return failed + compare(resumed, straight, tol, args.tol_narrow)


if __name__ == "__main__":
    sys.exit(main())
