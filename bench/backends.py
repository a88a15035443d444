#!/usr/bin/env python3
"""The MPI backend against the threads backend: the same generated binary (the MLP, Transformer
and MoE forward passes on [data=2, model=2], at the examples' sizes and, for the first two, at
sizes raised so that a step is compute-bound) run on 4 thread ranks and as 4 MPI processes
under mpirun, alternately, in one run. Each binary
is first checked against the interpreter on both backends (tests/e2e/run_case.py). Prints the
best step time of each and the ratio MPI / threads (expect > 1: MPI copies through shared
memory and its processes contend for the same cores), and the same for MPI without the agreement
check before each collective (MESHRT_MPI_CHECK=0: nonblocking collectives, polled).

usage: bench/backends.py [build-dir] [--rounds N]
       (build-dir default: build; needs meshc, meshrt_launch with MPI, meshrt_kernels)"""
import argparse
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANKS = 4
MESH = "data=2,model=2"
# (example, its program, meshc size overrides): the examples' own sizes (steps of a millisecond
# or less, where the collectives' latency counts) and raised ones (compute-bound steps).
CASES = [
    ("mlp", "mlp", []),
    ("mlp", "mlp", ["--dim=batch=256", "--dim=d_model=256", "--dim=d_ff=1024"]),
    ("transformer", "lm", []),
    ("transformer", "lm", ["--dim=batch=8", "--dim=seq=64", "--dim=mem=64"]),
    ("moe", "moe", []),
]
# As root and on fewer cores than ranks (as in CI); shared memory transport only.
MPI_ENV = {"OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}


def mpirun():
    path = shutil.which("mpirun")
    if not path:
        sys.exit("bench/backends.py: no mpirun on PATH (scripts/install-deps installs OpenMPI)")
    return [path, "--allow-run-as-root", "--oversubscribe", "-np", str(RANKS)]


def build_and_check(build, example, sizes):
    """Builds the example's runner and checks it against the interpreter on both backends."""
    workdir = os.path.join(build, f"bench-backends-{example}{'-large' if sizes else ''}")
    for extra in (["--backend", "threads"],
                  ["--backend", "mpi", "--launcher", " ".join(mpirun())]):
        out = subprocess.run(
            [sys.executable, os.path.join(ROOT, "tests", "e2e", "run_case.py"), "--build-dir",
             build, "--example", os.path.join(ROOT, "dsl-examples", example + ".mesh"), "--mesh",
             MESH, "--opt=-O2", "--workdir", workdir, *["--meshc-arg=" + s for s in sizes],
             *extra], capture_output=True, text=True, env={**os.environ, **MPI_ENV})
        if out.returncode != 0:
            sys.exit(f"bench/backends.py: {example} {extra[1]} failed\n{out.stdout}{out.stderr}")
    return os.path.join(workdir, example + ".bin")


def best_ms(command, program, env=None):
    """The runner's best step time of its timed runs (each: the slowest rank's)."""
    text = subprocess.run(command, capture_output=True, text=True, check=True,
                          env={**os.environ, **MPI_ENV, **(env or {})}).stdout
    match = re.search(rf"program {program}: {RANKS} ranks, run [\d.]+ ms median, ([\d.]+) ms best",
                      text)
    if not match:
        sys.exit(f"bench/backends.py: no timing of program {program} in\n{text}")
    return float(match.group(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"generated forward passes on {RANKS} ranks [{MESH}], threads backend vs MPI backend "
          f"(mpirun -np {RANKS}, {os.cpu_count()} cores): the best step time over {args.rounds} "
          "rounds of 5 timed steps each (the best resists other jobs' load)")
    print(f"{'example sizes':<16} {'threads ms':>11} {'mpi ms':>11} {'mpi / threads':>14} "
          f"{'unchecked ms':>13} {'unchecked / threads':>20}", flush=True)
    for example, program, sizes in CASES:
        binary = build_and_check(args.build, example, sizes)
        threads = [binary, "--backend", "threads", os.devnull]
        mpi = mpirun() + [binary, "--backend", "mpi", os.devnull]
        times = {"threads": [], "mpi": [], "unchecked": []}
        for _ in range(args.rounds):  # alternate, so that both see the same machine load
            times["threads"].append(best_ms(threads, program))
            times["mpi"].append(best_ms(mpi, program))
            times["unchecked"].append(best_ms(mpi, program, {"MESHRT_MPI_CHECK": "0"}))
        t, m, u = (min(times[key]) for key in ("threads", "mpi", "unchecked"))
        label = f"{example} {'large' if sizes else 'own'}"
        print(f"{label:<16} {t:>11.3f} {m:>11.3f} {m / t:>13.2f}x "
              f"{u:>13.3f} {u / t:>19.2f}x", flush=True)


if __name__ == "__main__":
    main()
