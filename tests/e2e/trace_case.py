#!/usr/bin/env python3
"""A traced end-to-end case (ctest label e2e): run_case.py with the runner's --trace (so the
traced run still matches the interpreter), then checks the trace (meshrt/Trace.h):

1. it is Chrome trace-event JSON: a "traceEvents" list whose every event has name, ph, ts, dur,
   pid and tid, complete events ("X", dur >= 0) and metadata ("M") only;
2. one track per rank: pid == tid, ranks 0..N-1 of the mesh, each named by metadata;
3. on each track, events nest or follow one another (no partial overlap);
4. every run of every planned function holds, on every rank, one collective event per
   collective that `meshc --emit=plan-json` lists (local slices excepted), of the same family
   (all_reduce, all_gather, ...) at the same source location, and a wait per started one;
5. the op groups of the generated code are there: events named by a .mesh location, in a
   phase the plan knows, GEMMs and fused loops among them.

Usage: trace_case.py <run_case.py's arguments, with --meshc, --example, --workdir, --mesh>
Under MPI (--launcher mpirun ...) each process writes FILE.rank<R>: they are read together."""
import argparse
import collections
import glob
import json
import os
import re
import sys

from checked_run import run

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILY = {"all_reduce_sum": "all_reduce", "all_reduce_max": "all_reduce",
          "all_reduce_min": "all_reduce", "bucketed_all_reduce_sum": "all_reduce"}


def family_of_call(call):
    """meshrt's call (allReduce, startAllGather) -> the plan's family (all_reduce, all_gather)."""
    call = call[len("start"):] if call.startswith("start") else call
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), call).lstrip("_")


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def load_events(path):
    if os.path.exists(path):
        parts = [path]
    else:
        parts = sorted(glob.glob(path + ".rank*"))
        if not parts:
            fail(f"no trace written ({path} or {path}.rank*)")
    events = []
    for part in parts:
        with open(part) as f:
            trace = json.load(f)
        if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
            fail(f"{part}: not a Chrome trace (no traceEvents list)")
        events += trace["traceEvents"]
    return events


def check_tracks(events, ranks):
    for event in events:
        for field in ["name", "ph", "ts", "dur", "pid", "tid"]:
            if field not in event:
                fail(f"event without {field}: {event}")
        if event["ph"] not in ("X", "M"):
            fail(f"unexpected phase {event['ph']}: {event}")
        if event["ph"] == "X" and event["dur"] < 0:
            fail(f"negative duration: {event}")
        if event["pid"] != event["tid"]:
            fail(f"pid and tid differ (one track per rank): {event}")
    tracks = {e["pid"] for e in events if e["ph"] == "X"}
    if tracks != set(range(ranks)):
        fail(f"tracks {sorted(tracks)}, expected one per rank of {ranks}")
    named = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    if named != tracks:
        fail(f"tracks without a name: {sorted(tracks - named)}")
    by_rank = collections.defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            by_rank[e["pid"]].append(e)
    for rank, track in by_rank.items():
        track.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_events = []
        slack = 0.002  # microseconds: the printed rounding
        for e in track:
            while open_events and open_events[-1]["ts"] + open_events[-1]["dur"] <= e["ts"] + slack:
                open_events.pop()
            if open_events:
                outer = open_events[-1]
                if e["ts"] + e["dur"] > outer["ts"] + outer["dur"] + slack:
                    fail(f"rank {rank}: '{e['name']}' overlaps '{outer['name']}' without nesting")
            e["parent"] = open_events[-1] if open_events else None
            open_events.append(e)
    return by_rank


def enclosing_run(event):
    parent = event["parent"]
    while parent is not None and parent["args"]["kind"] != "run":
        parent = parent["parent"]
    return parent


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshc", required=True)
    parser.add_argument("--example", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--mesh", required=True)
    parser.add_argument("--layout")
    known, _ = parser.parse_known_args()
    os.makedirs(known.workdir, exist_ok=True)
    trace_path = os.path.join(known.workdir, "trace.json")
    for stale in glob.glob(trace_path) + glob.glob(trace_path + ".rank*"):
        os.remove(stale)
    print(run([sys.executable, os.path.join(HERE, "run_case.py")] + sys.argv[1:]
              + ["--trace", trace_path]), end="")

    overrides = ["--mesh", known.mesh] + (["--layout", known.layout] if known.layout else [])
    plans = json.loads(run([known.meshc, known.example, "--emit=plan-json"] + overrides))
    ranks = 1
    for axis in known.mesh.split(","):
        ranks *= int(axis.split("=")[1])

    events = load_events(trace_path)
    by_rank = check_tracks(events, ranks)
    location = re.compile(r"^[\w./-]+\.mesh:\d+:\d+$")
    for plan in plans:
        function = plan["function"]
        planned = collections.Counter(
            (FAMILY.get(c["kind"], c["kind"]),
             "{file}:{line}:{col}".format(**c["location"])) for c in plan["collectives"])
        runs_per_rank = set()
        for rank, track in by_rank.items():
            runs = [e for e in track if e["args"]["kind"] == "run" and
                    e["args"]["where"] == function]
            runs_per_rank.add(len(runs))
            issued = collections.defaultdict(collections.Counter)
            waits = collections.Counter()
            starts = collections.Counter()
            groups = collections.defaultdict(collections.Counter)
            for e in track:
                run_event = enclosing_run(e)
                if run_event is None or run_event["args"]["where"] != function:
                    continue
                key = id(run_event)
                if e["cat"] == "collective":
                    if e["args"]["kind"] == "wait":
                        waits[key] += 1
                        continue
                    if e["args"]["kind"].startswith("start"):
                        starts[key] += 1
                    issued[key][(family_of_call(e["args"]["kind"]), e["args"]["where"])] += 1
                else:
                    if not location.match(e["args"]["where"]):
                        fail(f"rank {rank}: op group '{e['name']}' not named by a .mesh location")
                    if e["cat"] not in ("forward", "backward", "update"):
                        fail(f"rank {rank}: op group '{e['name']}' in phase '{e['cat']}'")
                    groups[key][e["args"]["kind"]] += 1
            for run_event in runs:
                key = id(run_event)
                if issued[key] != planned:
                    fail(f"rank {rank}, {function}: collectives issued {sorted(issued[key].items())}"
                         f" but the plan lists {sorted(planned.items())}")
                if waits[key] != starts[key]:
                    fail(f"rank {rank}, {function}: {starts[key]} started collectives, "
                         f"{waits[key]} waits")
                if groups[key]["gemm"] == 0 or groups[key]["loop"] == 0:
                    fail(f"rank {rank}, {function}: no GEMM or loop events: {dict(groups[key])}")
        if len(runs_per_rank) != 1 or 0 in runs_per_rank:
            fail(f"{function}: runs per rank {sorted(runs_per_rank)}")
        print(f"trace: {function}: {runs_per_rank.pop()} run(s) on each of {ranks} ranks, each "
              f"with the {sum(planned.values())} planned collectives "
              f"({dict(collections.Counter(f for f, _ in planned.elements()))})")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
