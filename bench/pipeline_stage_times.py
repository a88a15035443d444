#!/usr/bin/env python3
"""Where each pipeline stage's time goes in meshc's generated pipelined step on the threads
backend, set against the pipeline model's stage times (docs/runtime.md "Pipeline stages in
generated code").

Traces `meshc run` of dsl-examples/transformer.mesh's lm_train on [stage=p] with `layers: stage`
(the sizes of bench/pipeline_bubble.py; one thread per rank, pinned to p cores) and sums, per
rank (= stage) over the steps after the first, the op groups' own time by phase (forward,
backward, update: each op group's least duration over the steps, summed, which the other load on
a shared machine disturbs least, bench/trace_minima.py), the stage transfers (send / recv: the
copy plus the wait of a blocking exchange) and the other collectives (means). Beside it, plan-json's per-stage figures for the same
options: m x forward, m x backward, once per step. The ratio row is each stage's compute over
stage 0's, measured and predicted. Not a test: timing.

usage: bench/pipeline_stage_times.py [--build-dir build] [--stages 2] [--microbatches 8]
       [--layers 4] [--split 3,1] [--schedule gpipe] [--steps 6]"""
import argparse
import collections
import json
import os
import subprocess
import tempfile

import benchlib
from pipeline_bubble import MICROBATCH, SIZES


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", default=os.path.join(benchlib.ROOT, "build"))
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--layers", type=int, default=SIZES["layers"])
    parser.add_argument("--split", default="", help="pin the split, e.g. 3,1 (default: the plan's)")
    parser.add_argument("--schedule", default="gpipe")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    p, m = args.stages, args.microbatches
    sizes = dict(SIZES, layers=args.layers, batch=MICROBATCH * m)
    layout = f"layers: stage({args.split})" if args.split else "layers: stage"
    meshc_args = benchlib.dim_args(sizes) + [
        "--function", "lm_train", f"--microbatches=batch={m}", "--pipeline-schedule",
        args.schedule, "--mesh", f"stage={p}", "--layout", layout]
    meshc = benchlib.meshc_path(args.build_dir)
    plan = json.loads(subprocess.run([meshc, benchlib.TRANSFORMER, "--emit=plan-json", *meshc_args],
                                     check=True, capture_output=True, text=True).stdout)[0]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = os.path.join(tmp, "t.json")
        subprocess.run(benchlib.pin(p) + [meshc, "run", benchlib.TRANSFORMER, *meshc_args,
                                          "--steps", str(args.steps), "--no-plan", "--trace",
                                          trace_path],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        with open(trace_path) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    by_rank = collections.defaultdict(list)
    for e in events:
        by_rank[e["pid"]].append(e)
    rows, computes = [], {}
    for rank in sorted(by_rank):
        runs = sorted((e for e in by_rank[rank] if e["cat"] == "run"), key=lambda e: e["ts"])[1:]
        per_run = [sorted((e for e in by_rank[rank] if e["cat"] != "run"
                           and r["ts"] <= e["ts"] < r["ts"] + r["dur"]), key=lambda e: e["ts"])
                   for r in runs]
        # Op groups (a stage transfer's own group, traced before meshc named it a collective
        # site, left out: its time is the send's or recv's) aligned by their order in the run:
        # the least of each one's durations is its cost undisturbed by the other load.
        groups = [[e for e in ops if e["cat"] not in ("collective", "p2p")
                   and e["args"]["kind"] != "the"]
                  for ops in per_run]
        count = min(len(g) for g in groups)
        sums = collections.Counter()
        for i in range(count):
            sums[groups[0][i]["cat"]] += min(g[i]["dur"] for g in groups) / 1e3
        for ops in per_run:
            for e in ops:
                if e["cat"] in ("collective", "p2p"):
                    key = "p2p" if e["args"]["kind"] in ("send", "recv", "wait") else "collectives"
                    sums[key + " mean"] += e["dur"] / 1e3 / len(per_run)
        per = dict(sums)
        step = sum(r["dur"] for r in runs) / 1e3 / len(runs)
        compute = per.get("forward", 0) + per.get("backward", 0) + per.get("update", 0)
        computes[rank] = compute
        stage = plan["pipeline"]["stages"][rank] if rank < len(plan["pipeline"]["stages"]) else {}
        model = {k: stage.get(f"{k}_seconds", 0) * 1e3 for k in ("forward", "backward", "once")}
        rows.append((rank, stage.get("layers", "?"), f"{per.get('forward', 0):.2f}",
                     f"{m * model['forward']:.2f}", f"{per.get('backward', 0):.2f}",
                     f"{m * model['backward']:.2f}", f"{per.get('update', 0):.2f}",
                     f"{model['once']:.2f}", f"{per.get('p2p mean', 0):.2f}",
                     f"{per.get('collectives mean', 0):.2f}", f"{compute:.2f}",
                     f"{m * (model['forward'] + model['backward']) + model['once']:.2f}",
                     f"{step:.2f}"))
    print(f"{p} stages, {m} microbatches of {MICROBATCH} rows, {args.layers} layers, "
          f"{args.schedule}; ms per step over the {args.steps - 1} steps after the first: op "
          "groups by phase as the sum of each group's least duration, send/recv, the other "
          "collectives and the step as means")
    benchlib.print_table(rows, ("stage", "layers", "forward", "model fwd", "backward",
                                "model bwd", "update", "model once", "send/recv",
                                "other collectives", "compute", "model compute", "step"))
    if 0 in computes and computes[0] > 0:
        stages = plan["pipeline"]["stages"]
        model0 = m * (stages[0]["forward_seconds"] + stages[0]["backward_seconds"]) + \
            stages[0]["once_seconds"]
        ratios = []
        for rank in sorted(computes):
            s = stages[rank]
            model = m * (s["forward_seconds"] + s["backward_seconds"]) + s["once_seconds"]
            ratios.append(f"stage {rank}: measured {computes[rank] / computes[0]:.3f}, "
                          f"model {model / model0:.3f}")
        print("compute over stage 0's: " + "; ".join(ratios))
    print(f"model: slot {plan['pipeline']['slot_seconds'] * 1e3:.3f} ms, step "
          f"{plan['pipeline']['step_seconds'] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
