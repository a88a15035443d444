#!/usr/bin/env python3
"""The MLP example's forward pass, data parallel on 2 thread ranks vs 1 rank, built and run side
by side in one run (goal: speedup >= 1.8x on this 2-core machine). Sizes are raised with --dim so
that the step is compute-bound; each generated binary is checked against the interpreter first.

usage: bench/mlp_ranks.py [build-dir]   (build-dir default: build; needs meshc, meshrt,
meshrt_launch, kernels)"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
SIZES = ["--meshc-arg=--dim=batch=512", "--meshc-arg=--dim=d_model=512",
         "--meshc-arg=--dim=d_ff=2048"]
ROUNDS = 3


def build_and_run(mesh, layout):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "e2e", "run_case.py"), "--build-dir", BUILD,
         "--example", os.path.join(ROOT, "dsl-examples", "mlp.mesh"), "--mesh", mesh, "--layout",
         layout, "--opt=-O2", "--workdir", os.path.join(BUILD, "bench-mlp-" + mesh), *SIZES],
        capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench/mlp_ranks.py: the {mesh} case failed\n{out.stdout}{out.stderr}")
    return os.path.join(BUILD, "bench-mlp-" + mesh, "mlp.bin")


def median_ms(binary):
    text = subprocess.run([binary, os.devnull], capture_output=True, text=True, check=True).stdout
    match = re.search(r"program \w+: \d+ ranks?, run ([\d.]+) ms median", text)
    if not match:
        sys.exit(f"bench/mlp_ranks.py: no timing in\n{text}")
    return float(match.group(1))


one = build_and_run("data=1", "batch:data")
two = build_and_run("data=2", "batch:data")
times = {one: [], two: []}
for _ in range(ROUNDS):  # alternate, so both see the same machine load
    for binary in (one, two):
        times[binary].append(median_ms(binary))
t1, t2 = min(times[one]), min(times[two])
print("MLP forward (batch 512, d_model 512, d_ff 2048), generated C++, threads backend")
print(f"{'ranks':>5} {'best median ms':>15}")
print(f"{1:>5} {t1:>15.3f}")
print(f"{2:>5} {t2:>15.3f}")
print(f"speedup 2 ranks / 1 rank: {t1 / t2:.2f}x (goal >= 1.8x)")
