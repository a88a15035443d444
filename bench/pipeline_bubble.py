#!/usr/bin/env python3
"""The GPipe bubble of meshc's generated pipeline stages on the threads backend, measured against
its prediction (p - 1) / (m + p - 1) (docs/runtime.md "Pipeline stages in generated code").

For each microbatch count m, two contenders train dsl-examples/transformer.mesh's lm_train with m
microbatches of the same size (the batch is m times it), side by side:
  - pipelined: [stage=p], `layers: stage`, --pipeline-schedule gpipe (p ranks, one per stage);
  - sequential: [stage=1], the same microbatches on one rank, every layer in turn.
A stage does 1/p of the sequential rank's per-microbatch work, so with no bubble the pipelined
step would take T_seq / p; the measured bubble is the idle share 1 - T_seq / (p T_pipe). The
last column is the same share of the pipeline model's predicted steps (plan-json's step_seconds
of both contenders), which counts its stages' own times where the formula assumes equal ones. The
once-per-step update is kept small against the microbatches' work (the sizes below). Every
contender runs one thread per rank (OMP_NUM_THREADS=1), pinned to the same p cores, and they
alternate round by round (bench/benchlib.py). Not a test: timing on this shared machine drifts,
so it prints what it measured.

--realtime runs every contender under SCHED_FIFO (`chrt -f 1`), so that the other load of a
shared machine (builds, other benchmarks) cannot take a stage thread's core while it computes or
delay its wake-up; under a load average of 5-8 a one-rank step took 1100 ms plain, 340 ms at
nice -20 and 150 ms so. The kernel's real-time throttling (by default 95% of each second) may
stall a step now and then; the median of a round's steps leaves it out. --layers sets the
repeat's count (default 4). Under --realtime the ranks keep the runtime's short waits even with
MESHRT_YIELD_US set (docs/runtime.md "The barrier"); to compare waits, run without it. --work puts the generated servers elsewhere than the build
directory (another build's meshc, e.g. a before/after). --variant VAR=VALUE[,VAR=VALUE] adds a
third contender, the pipelined server run with those environment variables (e.g.
MESHRT_YIELD_US=50000, ranks that yield up to 50 ms before they sleep), alternated with the others and
measured against the same one-rank step (its rows say `m (variant)`). --busy-baseline adds a
fourth contender, the one-rank step on core 0 while copies of it step on cores 1..p-1 for the
whole measure: the pipelined step's stages all compute beside busy cores, the plain one-rank
step beside idle ones (on a quiet machine), so anything the cores share (caches, memory
bandwidth, the host's clock boost) favours the baseline; its last two columns are the same
measured bubble, 1 - T_seq / (p T_pipe), with this contender's T_seq, and its ratio.
--one-core-baseline adds the pipelined server itself with every rank on core 0: the same
program (the pipeline's schedule, its transfers, and its memory: a GPipe stage keeps all m
microbatches' activations until its backwards, where the one-rank step accumulates gradients
microbatch by microbatch and keeps one), whose stages take turns on one core and so never leave
it idle; its T is the pipeline's work W, and 1 - W / (p T_pipe) is the idle share of the
pipelined step alone (docs/runtime.md, the GPipe bubble). --schedule 1f1b measures the 1F1B
step instead (the same formula: 1F1B reorders GPipe's work, not its bubble).

Every count's contenders alternate in one loop (round r times all of them before round r + 1),
so that a drift of the machine's speed over the run does not show up as a trend over m. Each
ratio comes with its range over single rounds (`rounds' ratios`): the goal's band is narrow at
large m (at m = 8, measured/predicted 1.2 is a pipelined step 2.6% longer than the formula's),
and where a run's range is wider than the band, the run does not decide the goal.

usage: bench/pipeline_bubble.py [--build-dir build] [--stages 2] [--counts 1,2,4,8]
       [--rounds 5] [--steps 5] [--layers 4] [--realtime] [--work DIR] [--variant VAR=VALUE]
       [--busy-baseline] [--one-core-baseline] [--schedule gpipe|1f1b]"""
import argparse
import json
import os
import subprocess
import threading
import time

import benchlib

SIZES = {"seq": 64, "mem": 64, "d_model": 128, "heads": 4, "d_head": 32, "d_ff": 512,
         "vocab": 64, "layers": 4}
MICROBATCH = 4  # rows of one microbatch


class BesideBusyCores(benchlib.Contender):
    """The one-rank server on core 0, timed while copies of it step on cores 1..p-1 (each a
    server of its own, stepping one step at a time from a thread of this script)."""

    def __init__(self, name, prefix, binary, env, log_dir, p):
        super().__init__(name, prefix + ["taskset", "-c", "0", binary], env, log_dir)
        self.neighbours = [benchlib.Contender(f"{name}-neighbour{core}",
                                              prefix + ["taskset", "-c", str(core), binary], env,
                                              log_dir) for core in range(1, p)]
        self.busy, self.stop = threading.Event(), threading.Event()
        self.idle = [threading.Event() for _ in self.neighbours]
        self.threads = []

    def start(self):
        if not super().start():
            return False
        for neighbour, idle in zip(self.neighbours, self.idle):
            if not neighbour.start():
                self.error = neighbour.error
                return False
            thread = threading.Thread(target=self.keep_stepping, args=(neighbour, idle))
            thread.start()
            self.threads.append(thread)
        return True

    def keep_stepping(self, neighbour, idle):
        while not self.stop.is_set():
            if self.busy.is_set():
                idle.clear()
                neighbour.measure(1)
            else:
                idle.set()
                time.sleep(0.005)
        idle.set()

    def measure(self, steps):
        self.busy.set()
        time.sleep(0.05)  # the neighbours are stepping before the timed steps start
        try:
            return super().measure(steps)
        finally:
            # No neighbour step may overlap the next contender's measure.
            self.busy.clear()
            for idle in self.idle:
                idle.wait()

    def close(self):
        self.stop.set()
        for thread in self.threads:
            thread.join()
        for neighbour in self.neighbours:
            neighbour.close()
        super().close()


def spread(per_round, m, name, baseline, p, predicted):
    """The least and the greatest measured/predicted of single rounds (each round's pipelined
    and baseline steps, timed minutes apart at most): how far one round's figure moves, against
    the goal's band (at m = 4 a pipelined step 5% longer than the formula's already leaves it)."""
    ratios = sorted((1 - base / (p * pipe)) / predicted
                    for pipe, base in zip(per_round.get(f"m{m} {name}", []),
                                          per_round.get(f"m{m} {baseline}", []))
                    if pipe and base)
    return f"{ratios[0]:.2f}-{ratios[-1]:.2f}" if ratios and predicted else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", default=os.path.join(benchlib.ROOT, "build"))
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--counts", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=SIZES["layers"])
    parser.add_argument("--realtime", action="store_true")
    parser.add_argument("--work", default="")
    parser.add_argument("--variant", default="")
    parser.add_argument("--busy-baseline", action="store_true")
    parser.add_argument("--schedule", default="gpipe", choices=("gpipe", "1f1b"))
    parser.add_argument("--one-core-baseline", action="store_true")
    args = parser.parse_args()
    p = args.stages
    counts = [int(c) for c in args.counts.split(",")]
    work = args.work or os.path.join(args.build_dir, "bench-pipeline-bubble")
    realtime = ["chrt", "-f", "1"] if args.realtime else []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    variant = dict(item.split("=", 1) for item in args.variant.split(",") if item)
    # Every count's contenders alternate in one loop (round r times all of them, m = 1 to 8,
    # before round r + 1): measured one count after the other, a drift of the machine's speed
    # over the run (other jobs, the host) would show up as a trend over m.
    contenders, modelled = [], {}
    for m in counts:
        sizes = dict(SIZES, batch=MICROBATCH * m, layers=args.layers)
        common = benchlib.dim_args(sizes) + ["--function", "lm_train",
                                             f"--microbatches=batch={m}",
                                             "--pipeline-schedule", args.schedule]
        for name, stages in (("pipelined", p), ("sequential", 1)):
            meshc_args = common + ["--mesh", f"stage={stages}", "--layout", "layers: stage"]
            # The pipeline model's step for the same options (its stages' own forward and
            # backward times, so an imbalance between them shows in its bubble too).
            plan = subprocess.run([benchlib.meshc_path(args.build_dir), benchlib.TRANSFORMER,
                                   "--emit=plan-json", *meshc_args], check=True,
                                  capture_output=True, text=True).stdout
            modelled[(m, name)] = json.loads(plan)[0]["pipeline"]["step_seconds"] * 1e3
            binary = benchlib.build_server(args.build_dir, os.path.join(work, f"{name}-m{m}"),
                                           meshc_args, "LmTrain")
            contenders.append(benchlib.Contender(f"m{m} {name}",
                                                 realtime + benchlib.pin(p) + [binary], env,
                                                 work))
            if name == "pipelined" and args.one_core_baseline:
                # The same server, every rank on core 0 (rankCores pins them there): the
                # pipeline's own work, memory footprint included, with no idle time.
                contenders.append(benchlib.Contender(f"m{m} one core",
                                                     realtime + ["taskset", "-c", "0", binary],
                                                     env, work))
            if name == "pipelined" and variant:
                contenders.append(benchlib.Contender(f"m{m} variant",
                                                     realtime + benchlib.pin(p) + [binary],
                                                     dict(env, **variant), work))
            if name == "sequential" and args.busy_baseline:
                contenders.append(BesideBusyCores(f"m{m} beside busy cores", realtime, binary,
                                                  env, work, p))
    print(f"m = {args.counts} microbatches of {MICROBATCH} rows, {p} stages, {args.layers} "
          f"layers, {args.schedule}, all alternated:")
    per_round = {}
    results = benchlib.alternate(contenders, args.rounds, args.steps, per_round=per_round)
    rows = []
    for m in counts:
        timed = {n.split(" ", 1)[1]: v[0] for n, v in results.items()
                 if n.startswith(f"m{m} ") and isinstance(v, tuple)}
        predicted = (p - 1) / (m + p - 1)
        model = 1 - modelled[(m, "sequential")] / (p * modelled[(m, "pipelined")])
        for name, label in (("pipelined", m), ("variant", f"{m} ({args.variant})")):
            if name == "variant" and not variant:
                continue
            if name not in timed or "sequential" not in timed:
                rows.append((label, "failed", "", "", "", "", "", "")
                            + (("", "", "", "") if args.busy_baseline else ())
                            + (("", "", "", "") if args.one_core_baseline else ()))
                continue
            measured = 1 - timed["sequential"] / (p * timed[name])
            row = (label, f"{timed[name]:.1f}", f"{timed['sequential']:.1f}",
                   f"{measured:.3f}", f"{predicted:.3f}",
                   f"{measured / predicted:.2f}" if predicted else "", f"{model:.3f}",
                   spread(per_round, m, name, "sequential", p, predicted))
            # Each further baseline: its step, the bubble against it, that bubble's ratio to the
            # formula and the ratio's range over single rounds.
            for baseline, wanted in (("beside busy cores", args.busy_baseline),
                                     ("one core", args.one_core_baseline)):
                if not wanted:
                    continue
                base = timed.get(baseline)
                bubble = 1 - base / (p * timed[name]) if base else None
                row += (f"{base:.1f}" if base else "failed", f"{bubble:.3f}" if base else "",
                        f"{bubble / predicted:.2f}" if base and predicted else "",
                        spread(per_round, m, name, baseline, p, predicted))
            rows.append(row)
    header = ("m", "pipelined ms", "sequential ms", "bubble measured", "bubble predicted",
              "measured/predicted", "model's bubble", "rounds' ratios")
    if args.busy_baseline:
        header += ("sequential beside busy ms", "bubble vs it", "its measured/predicted",
                   "rounds' ratios")
    if args.one_core_baseline:
        header += ("pipelined on one core ms", "bubble vs one core", "its ratio",
                   "rounds' ratios")
    benchlib.print_table(rows, header)
    print("goal: measured/predicted within 0.8-1.2 (issue 14)")


if __name__ == "__main__":
    main()
