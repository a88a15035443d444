#!/usr/bin/env python3
"""meshc's generated code against the frameworks, one command, one table (issue 12's goal:
meshc >= 1.3x faster than the faster peer on every row):
  (a) bench/train_step.py's one-rank train step, one thread: meshc vs PyTorch and JAX;
  (b) the same on two threads;
  (c) bench/lm_sharded.py: transformer.mesh's `lm` forward and `lm_train` step on 4 ranks
      [data=2, model=2] vs JAX jit with the same sharding on 4 host devices,
and the collectives per lm_train step on each side. Within each part the contenders stay up and
alternate round by round, pinned to the same cores (bench/benchlib.py); each figure is the median
over rounds of a round's median step.

usage: bench/compare.py [--build-dir build] [--rounds 5] [--steps 10] [--only a,b,c]
       (needs meshc, meshrt, meshrt_launch, meshrt_mpi and meshrt_kernels built;
       scripts/install-deps --bench installs PyTorch and JAX)"""
import argparse
import os
import sys

import benchlib
import lm_sharded
import train_step


def part_notes(part, results):
    """Every contender's time, or why it has none, and the train steps' losses (first step ->
    last timed step: a check that the contenders train the same model from the same start)."""
    notes = [f"({part}) {name} failed: {value}" for name, value in results.items()
             if not isinstance(value, tuple)]
    timed = {name: value for name, value in results.items() if isinstance(value, tuple)}
    notes.append(f"({part}) medians: " + ", ".join(f"{name} {value[0]:.1f} ms"
                                                  for name, value in timed.items()))
    losses = [f"{name} {value[1]} -> {value[2]}" for name, value in timed.items()
              if float(value[1]) != 0]
    return notes + ([f"({part}) losses: " + ", ".join(losses)] if losses else [])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", default=os.path.join(benchlib.ROOT, "build"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--only", default="a,b,c", help="parts to run, e.g. a,c")
    args = parser.parse_args()
    build = os.path.abspath(args.build_dir)
    parts = set(args.only.split(","))
    print(f"{args.rounds} rounds of {args.steps} steps per contender, alternated; "
          f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}", flush=True)
    rows, notes = [], []
    for part, threads in (("a", 1), ("b", 2)):
        if part not in parts:
            continue
        print(f"({part}) train step, one rank, {threads} thread(s), sizes {train_step.SIZES}",
              flush=True)
        log_dir = os.path.join(build, "bench-train-step")
        results = benchlib.alternate(train_step.contenders(build, threads, log_dir), args.rounds,
                                     args.steps)
        rows += benchlib.ratio_rows(f"({part}) train step, 1 rank, {threads} thread(s)", results,
                                    "meshc", ["pytorch", "jax"])
        notes += part_notes(part, results)
    if "c" in parts:
        print(f"(c) lm and lm_train on [{lm_sharded.MESH}], sizes {lm_sharded.SIZES}", flush=True)
        runners = lm_sharded.contenders(build, os.path.join(build, "bench-lm-sharded"))
        results = benchlib.alternate(runners, args.rounds, args.steps)
        rows += [("(c) " + row[0],) + row[1:] for row in lm_sharded.rows(results)]
        notes += part_notes("c", results)
        notes.append(lm_sharded.collective_line(build, runners[-1]))
    print()
    benchlib.print_table(rows)
    for note in notes:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
