#!/usr/bin/env python3
"""`meshc run --profile` and `meshc run --trace` (docs/tool.md): the profile's table has its
columns, a row per planned collective whose count matches what every rank issued, op-group rows
named by .mesh lines, and totals by phase; --trace writes the Chrome trace where it is told; the
runner's span holds its slowest rank's time, and it times 5 windows of about 4 ms of runs back
to back and prints the median window.
Timings are not asserted otherwise.
Usage: check_profile.py <meshc> <case>"""
import collections
import json
import math
import os
import re
import sys
import tempfile

import check_cli
from check_cli import expect

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP = os.path.join(ROOT, "dsl-examples", "mlp.mesh")
FAMILY = {"all_reduce_sum": "all_reduce", "all_reduce_max": "all_reduce",
          "all_reduce_min": "all_reduce", "bucketed_all_reduce_sum": "all_reduce"}


def planned_collectives(function, mesh):
    proc = meshc(MLP, "--emit=plan-json", "--mesh", mesh, "--function", function)
    expect(proc.returncode == 0, "plan-json", proc)
    counts = collections.Counter()
    for c in json.loads(proc.stdout)[0]["collectives"]:
        loc = c["location"]
        counts[(FAMILY.get(c["kind"], c["kind"]), f"{loc['file']}:{loc['line']}")] += 1
    return counts


def profile_table(output, function):
    """The rows of `function`'s table: (what, where, phase, count, predicted, measured, ratio)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"profile of ") and
                 f" {function}:" in line)
    header = lines[start + 1].split()
    expect(header == ["what", "where", "phase", "count", "predicted", "measured", "ratio",
                      "error"], f"the table's columns: {header}")
    rows, totals = [], {}
    for line in lines[start + 2:]:
        if line.strip() == "totals by phase:":
            continue
        total = re.match(r"^    (\w+) +predicted +(\S+ \S+) +measured +(\S+ \S+) +ratio (\S+)", line)
        if total:
            totals[total.group(1)] = total.groups()[1:]
            continue
        if not line.startswith("  ") or line.startswith("    "):
            break
        fields = line.split()
        # what where phase [count] predicted(2) measured(2) ratio error(2)
        count = fields[3] if len(fields) == 11 else ""
        rows.append({"what": fields[0], "where": fields[1], "phase": fields[2], "count": count,
                     "ratio": fields[-3]})
    return rows, totals


def run_profile():
    with tempfile.TemporaryDirectory() as cache:
        proc = meshc("run", MLP, "--function", "mlp_train", "--mesh", "data=2,model=2",
                     "--steps", "3", "--profile", "--no-plan", "--cache-dir", cache, "--opt=-O1")
        expect(proc.returncode == 0, "meshc run --profile succeeds", proc)
        expect("profile of train block mlp_train: 4 rank(s), 2 run(s) per rank after a warm-up run"
               in proc.stdout, "the profile names the function, its ranks and its runs", proc)
        rows, totals = profile_table(proc.stdout, "mlp_train")
        planned = planned_collectives("mlp_train", "data=2,model=2")
        expect(planned, "the plan has collectives to look for")
        for (family, where), count in planned.items():
            matching = [r for r in rows if r["what"] == family and r["where"] == where]
            expect(len(matching) == 1, f"a row for the planned {family} at {where}", proc)
            expect(matching[0]["count"] == f"{count}/{count}",
                   f"{family} at {where}: planned {count} per run, every rank issued as many "
                   f"(row says {matching[0]['count']})", proc)
        groups = [r for r in rows if not r["count"]]
        expect(any(re.match(r"^mlp\.mesh:\d+$", r["where"]) and r["what"] != "-" for r in groups),
               "op groups are rows named by their .mesh line", proc)
        for phase in ["forward", "backward", "update", "communication", "total"]:
            expect(phase in totals, f"a total for {phase}", proc)
        trace = re.search(r"trace written to (\S+)", proc.stderr)
        expect(trace is not None, "meshc run says where the trace is", proc)
        with open(trace.group(1)) as f:
            expect("traceEvents" in json.load(f), "the trace is Chrome trace JSON")


def run_trace():
    with tempfile.TemporaryDirectory() as cache:
        path = os.path.join(cache, "out", "..", "mlp.trace.json")
        os.makedirs(os.path.join(cache, "out"))
        proc = meshc("run", MLP, "--function", "mlp", "--mesh", "data=2", "--layout", "batch:data", "--trace", path,
                     "--no-plan", "--cache-dir", cache, "--opt=-O1")
        expect(proc.returncode == 0 and "profile of" not in proc.stdout,
               "meshc run --trace runs without printing a profile", proc)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        expect({e["pid"] for e in events if e["ph"] == "X"} == {0, 1},
               "one track per rank of [data=2]")


def run_span():
    """The runner's span (the first rank's start to the last rank's end) holds every rank's run, so
    it is at least the slowest rank's time, run by run; it is printed only for several ranks."""
    with tempfile.TemporaryDirectory() as cache:
        for mesh, ranks in [("data=2,model=2", 4), ("data=1,model=1", 1)]:
            proc = meshc("run", MLP, "--function", "mlp", "--mesh", mesh, "--no-plan",
                         "--cache-dir", cache, "--opt=-O1")
            expect(proc.returncode == 0, "meshc run " + mesh, proc)
            run = re.search(
                rf"program mlp: {ranks} ranks, run ([\d.]+) ms median, ([\d.]+) ms best",
                proc.stdout)
            span = re.search(r"program mlp: span ([\d.]+) ms median, ([\d.]+) ms best", proc.stdout)
            expect(run is not None, "the runner prints its runs on " + mesh, proc)
            # Then runs back to back: 5 windows, each after one barrier, of about 4 ms of runs by
            # the median run (3 to 1000), the median window; a window's span over its count with
            # several ranks, else the slowest rank's.
            steady = re.search(r"program mlp: back to back ([\d.]+) ms a run \(the median of "
                               r"(\d+) windows of (\d+) runs, each after one barrier, "
                               r"(the first rank's start to the last rank's end|slowest rank)\)",
                               proc.stdout)
            expect(steady is not None, "the runner prints its runs back to back on " + mesh, proc)
            windows, count, median = int(steady.group(2)), int(steady.group(3)), float(run.group(1))
            wanted = min(1000, max(3, math.ceil(4 / median))) if median > 0 else 1000
            expect(float(steady.group(1)) > 0 and windows == 5 and
                   abs(count - wanted) <= max(1, 0.05 * wanted),
                   f"{windows} windows of {count} runs back to back for a median run of {median} ms",
                   proc)
            expect((steady.group(4) == "slowest rank") == (ranks == 1),
                   "back to back by the span with several ranks", proc)
            if ranks == 1:
                expect(span is None, "no span for one rank", proc)
                continue
            expect(span is not None, "the runner prints the span on " + mesh, proc)
            expect(all(float(s) >= float(r) for s, r in zip(span.groups(), run.groups())),
                   "span median and best >= the slowest rank's", proc)


CASES = {f.__name__: f for f in [run_profile, run_trace, run_span]}

def meshc(*args):
    return check_cli.meshc(*args)


if __name__ == "__main__":
    check_cli.MESHC = sys.argv[1]
    CASES[sys.argv[2]]()
    print("ok")
