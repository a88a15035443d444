#!/usr/bin/env python3
"""Where the pipelined step's time beyond the GPipe formula goes, from traces (docs/runtime.md,
"Pipeline stages in generated code", the bubble).

For each microbatch count m, bench/pipeline_bubble.py's two contenders (the same sizes: the
pipelined step on [stage=p], GPipe, and the same microbatches on one rank) are traced
(MESHRT_TRACE) over --steps steps after their two warm-up steps, pinned to the same p cores
(and with --realtime under SCHED_FIFO, as pipeline_bubble.py --realtime runs them; real-time
ranks keep the runtime's short waits, so on a quiet machine run without it). With T_seq the one-rank step and T_pipe
the pipelined one (each step's slowest rank; medians over the steps), the formula's pipelined
step is T_f = T_seq (m + p - 1) / (p m), and the excess T_pipe - T_f splits into three terms that
add up to it:
  - compute: the stages' op groups together against the one rank's (summed per step, each
    leaf event's duration; transfers and collectives left out), through the formula:
    (C_pipe - C_seq) (m + p - 1) / (p m). Work the split adds or removes, and ops that run slower
    beside a busy neighbour core than beside an idle one.
  - schedule: a replay of each step with the ranks' own measured compute between their transfers
    and free transfers (a recv waits for its peer's matching send, an all-reduce for every rank),
    against the formula applied to the pipelined compute: R - C_pipe (m + p - 1) / (p m). The
    stages' imbalance, and the once-per-step work where it runs.
  - transfers: T_pipe - R. The copies, and every wait that lasts longer than its dependency:
    a rank woken late from a futex sleep, a rank whose core was taken.
Also per step: the transfers' lateness (the receiver's recv end minus the later of its start and
the sender's post), summed; and the waits on the critical path (the replay again with every
wait that really waited ending 1 ms late, less the replay: how many wake-ups the step pays in
turn, so that a wake-up latency w costs about w times that). --variant VAR=VALUE[,...] traces the pipelined step a second time
under those environment variables (e.g. MESHRT_YIELD_US=50000). Not a test: timing; the trace adds
about 0.1 us per op to every contender alike.

usage: bench/pipeline_excess.py [--build-dir build] [--stages 2] [--counts 1,4] [--layers 8]
       [--steps 12] [--realtime] [--variant VAR=VALUE]"""
import argparse
import json
import os
import statistics
import subprocess

import benchlib
from pipeline_bubble import MICROBATCH, SIZES


def trace(binary, env, steps, path, prefix):
    """Runs a timing server for `steps` steps with MESHRT_TRACE=path; returns its events."""
    run_env = dict(env, MESHRT_TRACE=path)
    subprocess.run(prefix + [binary], input=f"{steps}\n0\n", text=True, env=run_env, check=True,
                   stdout=subprocess.DEVNULL)
    with open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def steps_of(events):
    """Per step (after the server's two warm-up steps) and rank: (run ms, compute ms, ops)."""
    ranks = sorted({e["pid"] for e in events})
    runs = {r: sorted((e for e in events if e["cat"] == "run" and e["pid"] == r),
                      key=lambda e: e["ts"])[2:] for r in ranks}
    ops = {r: sorted((e for e in events if e["cat"] != "run" and e["pid"] == r),
                     key=lambda e: e["ts"]) for r in ranks}
    result = []
    for i in range(min(len(v) for v in runs.values())):
        step = {}
        for r in ranks:
            run = runs[r][i]
            inside = [e for e in ops[r] if run["ts"] <= e["ts"] < run["ts"] + run["dur"]]
            compute = sum(e["dur"] for e in inside if is_compute(e)) / 1e3
            step[r] = (run["dur"] / 1e3, compute, inside)
        result.append(step)
    return result


def is_compute(event):
    # "step's" groups enclose the step's final waits; their leaves are counted instead.
    return event["cat"] not in ("p2p", "collective") and event["args"].get("kind") != "step's"


def replay(step, wake=0.0):
    """The step's time with each rank's measured compute between its transfers and free
    transfers: a recv waits for the peer's matching send (in order), a blocking all-reduce for
    every rank's arrival. Started all-reduces and waits are free. A rank that had to wait
    resumes `wake` ms after its dependency (a wake-up's cost), so (replay(s, 1) - replay(s)) / 1
    counts the waits on the step's critical path."""
    ranks = sorted(step)
    program = {}
    for r in ranks:
        items, compute = [], 0.0
        for e in step[r][2]:
            kind = e["args"].get("kind")
            if e["cat"] in ("p2p", "collective"):
                if kind in ("send", "startSend", "recv", "allReduce"):
                    items.append(("compute", compute))
                    compute = 0.0
                    items.append((kind, e["args"].get("peer")))
            elif is_compute(e):
                compute += e["dur"] / 1e3
        items.append(("compute", compute))
        program[r] = items
    clock = {r: 0.0 for r in ranks}
    at = {r: 0 for r in ranks}
    sent = {r: [] for r in ranks}      # post times of r's sends, in order
    taken = {r: 0 for r in ranks}      # how many of its peer's sends r has received
    reduces = {r: [] for r in ranks}   # arrival times at r's blocking all-reduces
    passed = {r: 0 for r in ranks}     # how many of them r has passed
    moved = True
    while moved:
        moved = False
        for r in ranks:
            while at[r] < len(program[r]):
                kind, _ = program[r][at[r]]
                if kind == "compute":
                    clock[r] += program[r][at[r]][1]
                elif kind in ("send", "startSend"):
                    sent[r].append(clock[r])
                elif kind == "recv":
                    # Two stages: the peer is the other rank. (More stages: the previous or next
                    # one; this replay is for --stages 2.)
                    peer = ranks[1 - ranks.index(r)] if len(ranks) == 2 else None
                    if peer is None or taken[r] >= len(sent[peer]):
                        break
                    if sent[peer][taken[r]] > clock[r]:
                        clock[r] = sent[peer][taken[r]] + wake
                    taken[r] += 1
                elif kind == "allReduce":
                    n = passed[r]
                    if len(reduces[r]) == n:
                        reduces[r].append(clock[r])
                    if any(len(reduces[q]) <= n for q in ranks):
                        break
                    last = max(reduces[q][n] for q in ranks)
                    clock[r] = last + wake if last > reduces[r][n] else last
                    passed[r] += 1
                at[r] += 1
                moved = True
    if any(at[r] < len(program[r]) for r in ranks):
        return None  # a dependency this replay does not model
    return max(clock.values())


def lateness(step):
    """Sum over the step's transfers of recv end - max(recv start, the sender's post end)."""
    ranks = sorted(step)
    if len(ranks) != 2:
        return 0.0
    total = 0.0
    for r in ranks:
        peer = ranks[1 - ranks.index(r)]
        sends = [e for e in step[peer][2] if e["args"].get("kind") in ("send", "startSend")]
        recvs = [e for e in step[r][2] if e["args"].get("kind") == "recv"]
        for s, v in zip(sends, recvs):
            total += v["ts"] + v["dur"] - max(v["ts"], s["ts"] + s["dur"])
    return total / 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", default=os.path.join(benchlib.ROOT, "build"))
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--counts", default="1,4")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--realtime", action="store_true")
    parser.add_argument("--variant", default="")
    args = parser.parse_args()
    p = args.stages
    work = os.path.join(args.build_dir, "bench-pipeline-excess")
    prefix = (["chrt", "-f", "1"] if args.realtime else []) + benchlib.pin(p)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    variant = dict(item.split("=", 1) for item in args.variant.split(",") if item)
    rows = []
    for m in [int(c) for c in args.counts.split(",")]:
        sizes = dict(SIZES, batch=MICROBATCH * m, layers=args.layers)
        common = benchlib.dim_args(sizes) + ["--function", "lm_train",
                                             f"--microbatches=batch={m}",
                                             "--pipeline-schedule", "gpipe",
                                             "--layout", "layers: stage"]
        binaries = {name: benchlib.build_server(args.build_dir,
                                                os.path.join(work, f"{name}-m{m}"),
                                                common + ["--mesh", f"stage={stages}"], "LmTrain")
                    for name, stages in (("pipelined", p), ("sequential", 1))}
        contenders = [("sequential", binaries["sequential"], env),
                      ("pipelined", binaries["pipelined"], env)]
        if variant:
            contenders.append((args.variant, binaries["pipelined"], dict(env, **variant)))
        traced = {name: steps_of(trace(binary, run_env, args.steps,
                                       os.path.join(work, f"trace-m{m}-{i}.json"), prefix))
                  for i, (name, binary, run_env) in enumerate(contenders)}
        seq = traced["sequential"]
        t_seq = statistics.median(max(s[r][0] for r in s) for s in seq)
        c_seq = statistics.median(sum(s[r][1] for r in s) for s in seq)
        factor = (m + p - 1) / (p * m)
        t_f = t_seq * factor
        for name, _, _ in contenders[1:]:
            steps = traced[name]
            t_pipe = statistics.median(max(s[r][0] for r in s) for s in steps)
            c_pipe = statistics.median(sum(s[r][1] for r in s) for s in steps)
            replays = [x for x in (replay(s) for s in steps) if x is not None]
            r_med = statistics.median(replays) if replays else float("nan")
            late = statistics.median(lateness(s) for s in steps)
            waits = [(replay(s, 1.0) - x) for s, x in zip(steps, (replay(s) for s in steps))
                     if x is not None]
            critical = statistics.median(waits) if waits else float("nan")
            bubble = 1 - t_seq / (p * t_pipe)
            predicted = (p - 1) / (m + p - 1)
            rows.append((m if name == "pipelined" else f"{m} ({name})", f"{t_seq:.1f}",
                         f"{t_pipe:.1f}", f"{t_f:.1f}", f"{t_pipe - t_f:+.1f}",
                         f"{(c_pipe - c_seq) * factor:+.1f}", f"{r_med - c_pipe * factor:+.1f}",
                         f"{t_pipe - r_med:+.1f}", f"{late:.2f}", f"{critical:.1f}",
                         f"{bubble / predicted:.2f}" if predicted else ""))
            print(f"m = {m} {name}: C_seq {c_seq:.1f} ms, C_pipe {c_pipe:.1f} ms "
                  f"(per stage: " + ", ".join(
                      f"{statistics.median(s[r][1] for s in steps):.1f}" for r in sorted(steps[0]))
                  + f"), replay {r_med:.1f} ms over {len(replays)} of {len(steps)} steps",
                  flush=True)
    benchlib.print_table(rows, ("m", "T_seq ms", "T_pipe ms", "formula ms", "excess ms",
                                "compute", "schedule", "transfers", "lateness ms",
                                "critical waits",
                                "measured/predicted"))
    print("excess = compute + schedule + transfers (ms per step, medians; see the docstring)")


if __name__ == "__main__":
    main()
