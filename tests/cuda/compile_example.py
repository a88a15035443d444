#!/usr/bin/env python3
"""Compile-and-link check of generated CUDA (no GPU needed): `meshc --emit=cuda --cpp-runner`
on one example, then ONE nvcc invocation for sm_90 over a translation unit that includes the
generated .cu and its runner, linked against meshrt_cuda, meshrt_nccl, meshrt_kernels, meshrt,
cuBLAS, NCCL and OpenBLAS. Also usable to build the runner for a GPU run (tests/gpu/run.sh).

Usage: compile_example.py --meshc M --example X.mesh --workdir DIR --nvcc NVCC --include DIR...
       --lib LIB... [--mesh ...] [--layout ...] [--math fp32|tf32|bf16] [--opt -O1]
With --check (needs as many GPUs as the mesh has ranks): also runs the binary and compares its
gathered outputs with the reference interpreter's through tests/e2e/compare_outputs.py (the
tolerance rule of tests/e2e/tolerance.py; TF32 math compared at f16's rounding, bf16 at bf16's).
With --check --train-steps K as well: every train block takes K steps on the GPU (forward,
backward, optimizer) and its losses and final params are compared with the interpreter's K steps; then a
checkpoint round trip on the GPU: K steps saved, loaded by a new process and K more steps must
give the final params of 2K uninterrupted steps.
With --prepare instead: builds and writes the interpreter's outputs (the K-step ones too) beside
the binary without running it, so that `--reuse --check` later runs where meshc cannot
(tests/gpu/bundle.sh).
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
    parser.add_argument("--prepare", action="store_true",
                        help="after the build, write what --check compares with (the "
                             "interpreter's outputs, the path dtypes) without running the binary")
    parser.add_argument("--reuse", action="store_true",
                        help="skip meshc and nvcc when the binary exists (a second, --check pass)")
    parser.add_argument("--emit-option", action="append", default=[],
                        help="a meshc option for code generation only (the interpreter's check "
                             "runs without it), e.g. --emit-option=--microbatches=batch=2")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--train-steps", type=int, default=0)
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
        return finish(args, base, binary, overrides)
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
    return finish(args, base, binary, overrides)


def finish(args, base, binary, overrides):
    """What follows the build: --prepare's files, --check's run and comparison, or nothing."""
    if args.prepare:
        interpreter_outputs(args, base, overrides)
    return check(args, base, binary, overrides) if args.check else 0


COMPARE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e",
                       "compare_outputs.py")
# The GPU's math modes as the dtype whose rounding every compared tensor then carries (TF32 keeps
# f16's 10 mantissa bits; bf16 rounds the GEMM operands), for tests/e2e/tolerance.py's rule.
COMPUTE_DTYPE = {"fp32": None, "tf32": "f16", "bf16": "bf16"}


def compare(args, base, actual, expected, steps):
    """tests/e2e/compare_outputs.py's rule (per dtype and path dtype, after `steps` updates)."""
    cmd = [sys.executable, COMPARE, actual, expected, "--path-dtypes", base + ".path-dtypes",
           "--steps", str(steps)]
    if COMPUTE_DTYPE[args.math]:
        cmd += ["--compute-dtype", COMPUTE_DTYPE[args.math]]
    result = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(result.stdout + result.stderr)
    return result.returncode


def interpreter_outputs(args, base, overrides):
    """Writes what the GPU's outputs are compared with: the interpreter's outputs (and its
    K-step train outputs) and the program's path dtypes. With --reuse, files already there are
    kept: a bundle made by --prepare carries them to a GPU machine that has no meshc."""
    k = str(args.train_steps)
    wanted = {base + ".expected": ["--emit=run", "--seed", args.seed],
              base + ".path-dtypes": ["--emit=tolerance-dtypes"]}
    if args.train_steps > 0:
        wanted[base + f".interp{k}"] = ["--emit=run", "--steps", k, "--seed", args.seed]
    for path, emit in wanted.items():
        if args.reuse and os.path.exists(path):
            continue
        if emit[0] == "--emit=run":
            run([args.meshc, args.example] + emit + ["--dump-outputs", path] + overrides)
        else:
            with open(path, "w") as f:
                f.write(run([args.meshc, args.example] + emit + overrides))


def check(args, base, binary, overrides):
    """Runs the binary (one GPU per rank) and compares with the interpreter."""
    interpreter_outputs(args, base, overrides)
    actual = base + ".actual"
    print(run([binary, actual, args.seed]), end="")
    failed = compare(args, base, actual, base + ".expected", 0)
    if args.train_steps > 0:
        failed += check_training(args, base, binary)
    return failed


def check_training(args, base, binary):
    """K train steps on the GPU against the interpreter's K steps, then a checkpoint resume on
    the GPU against 2K uninterrupted steps."""
    k = str(args.train_steps)
    actual = base + f".steps{k}"
    print(run([binary, actual, args.seed, "--steps", k]), end="")
    failed = compare(args, base, actual, base + f".interp{k}", args.train_steps)
    checkpoint = base + ".checkpoint"
    if os.path.exists(checkpoint):
        shutil.rmtree(checkpoint)
    run([binary, base + ".first", args.seed, "--steps", k, "--save", checkpoint])
    resumed, straight = base + ".resumed", base + f".steps{2 * args.train_steps}"
    print(run([binary, resumed, args.seed, "--steps", k, "--load", checkpoint]), end="")
    run([binary, straight, args.seed, "--steps", str(2 * args.train_steps)])
    print("checkpoint resume on the GPU vs uninterrupted steps:")
    return failed + compare(args, base, resumed, straight, 2 * args.train_steps)


if __name__ == "__main__":
    sys.exit(main())
