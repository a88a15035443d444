#!/usr/bin/env python3
"""What tracing costs (meshrt/Trace.h), measured side by side in one run: the same generated
train step built three ways and alternated round by round (bench/benchlib.py), pinned to the
same cores:
  no-probes  the probes compiled out (-DMESHRT_TRACE_PROBES_OFF): the code before tracing existed;
  off        the probes in, tracing off (what every build ships: the cost that must be nil);
  on         the probes in, MESHRT_TRACE set (every op group and collective recorded).
Cases: (a) bench/train_step.py's one-rank lm_train (one thread), (c) transformer.mesh's lm_train
on [data=2, model=2] (4 thread ranks, its own sizes: many small op groups and 16 collectives per
step, where probes weigh most). Prints each median and the ratios off/no-probes and on/no-probes.

usage: bench/trace_cost.py [--build-dir build] [--rounds 7] [--steps 20] [--only a,c]"""
import argparse
import os
import sys
import tempfile

import benchlib
import train_step


def contenders(build, case, trace_dir):
    if case == "a":
        args = ["--mesh", "data=1", "--layout", "auto", "--function", "lm_train"]
        args += benchlib.dim_args(train_step.SIZES)
        threads = 1
    else:
        args = ["--mesh", "data=2,model=2", "--function", "lm_train"]
        threads = 4
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    pin = benchlib.pin(threads)
    log_dir = os.path.join(build, "bench-trace-cost")
    out = []
    for name, flags in (("no-probes", ["-DMESHRT_TRACE_PROBES_OFF"]), ("off", [])):
        work = os.path.join(build, "bench-trace-cost", f"{case}-{name}")
        binary = benchlib.build_server(build, work, args, "LmTrain", flags)
        out.append(benchlib.Contender(name, pin + [binary], env, log_dir))
        if name == "off":
            traced = dict(env, MESHRT_TRACE=os.path.join(trace_dir, f"{case}.json"))
            out.append(benchlib.Contender("on", pin + [binary], traced, log_dir))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", default=os.path.join(benchlib.ROOT, "build"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--only", default="a,c")
    args = parser.parse_args()
    build = os.path.abspath(args.build_dir)
    print(f"{args.rounds} rounds of {args.steps} steps per contender, alternated; "
          f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as trace_dir:
        for case in args.only.split(","):
            label = {"a": "(a) lm_train, 1 rank, 1 thread, train_step.py sizes",
                     "c": "(c) lm_train, [data=2, model=2], 4 thread ranks"}[case]
            print(label, flush=True)
            results = benchlib.alternate(contenders(build, case, trace_dir), args.rounds,
                                         args.steps)
            base = results.get("no-probes")
            for name, value in results.items():
                if not isinstance(value, tuple):
                    print(f"  {name:10} failed: {value}")
                    continue
                ratio = f"  x{value[0] / base[0]:.3f} of no-probes" if isinstance(base, tuple) else ""
                print(f"  {name:10} {value[0]:9.3f} ms/step{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
