#!/usr/bin/env python3
"""Cost-model fidelity (issue 15, item 4): for every example in dsl-examples (each program and train
block) on the meshes [1], [2], [2,2] and [2,4] (the example's own mesh axes, e.g. data=2,model=2),
the planner's predicted step time (`meshc --emit=plan-json`, summary.stepSeconds) against the
generated runner's measured time, their ratio, and whether the planner ranks the example's own
layout against its `layout auto` choice as the measurements do (both measured, alternated round by
round; when auto finds the own layout there is nothing to rank). Every variant is built first; then
each round runs every binary once, the rounds one after another over all rows (a row's rounds
minutes apart, so that a spell of load on the shared host reaches one of them). Measured two ways,
each the median over --rounds runs of the binary: back to back (the runner's runs timed one after
another after one barrier, the span over their count, the median of 5 windows of ~4 ms of runs:
what a step costs when steps follow each other, as in training; the goal's column since session 30)
and alone (each of 5 runs after its own barrier: its span, from the first rank's start to the last
rank's end where the runner prints that (threads backend, several ranks), else the slowest rank's;
the median and the best). A run alone also pays the ranks' wake-up after the barrier: 5-20 us on an
oversubscribed mesh, more than some programs.

    python3 bench/fidelity.py [--build-dir build] [--machine M.json] [--only mlp,transformer]
                              [--meshes 1,2,2x2,2x4] [--rounds 3] [--quick] [--no-auto]
                              [--old-meshc OLD_MESHC [--old-machine OLD.json]]

The summary counts the rows within 25% and gives the median |measured / predicted - 1| of each
column. Without --machine, `meshc calibrate` (--quick with --quick) first writes a calibrated description
into a temporary file. The machine is shared and noisy: the load average is printed before and
after, and a ratio is only as good as the rounds behind it. A bench, not a test: nothing fails.
Binaries are cached under <build-dir>/bench-fidelity (meshc run's cache), so a rerun measures
without rebuilding.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "dsl-examples")
MESHES = {"1": (1, 1), "2": (2, 1), "2x2": (2, 2), "2x4": (2, 4)}
WITHIN = 0.25  # the goal: |measured / predicted - 1| <= 25%


def load():
    return os.getloadavg()[0]


def functions_of(path):
    """(mesh axis names, [(kind, function)]) of one .mesh file."""
    text = open(path).read()
    mesh = re.search(r"^mesh\s+\w+\s*\[([^\]]*)\]", text, re.M)
    axes = [a.split("=")[0].strip() for a in mesh.group(1).split(",")] if mesh else []
    return axes, re.findall(r"^(program|train)\s+(\w+)", text, re.M)


def mesh_option(axes, sizes):
    """--mesh for the sizes on the example's axes (the first two; more axes stay at 1)."""
    if not axes:
        return None
    if len(axes) < len(sizes) and any(s > 1 for s in sizes[len(axes):]):
        return None
    values = list(sizes[:len(axes)]) + [1] * (len(axes) - len(sizes))
    return ",".join(f"{a}={s}" for a, s in zip(axes, values))


def first_error(stderr):
    lines = [line for line in stderr.splitlines() if "error" in line]
    return (lines or stderr.splitlines() or ["(no message)"])[0].strip()[:110]


class Variant:
    """One layout (the example's own, or auto) of one function on one mesh."""

    def __init__(self, name, layout_args):
        self.name, self.layout_args = name, layout_args
        self.predicted = None   # seconds
        self.layout = None      # [(dim, axes)]
        self.binary = None
        self.runs = []          # milliseconds, one per round: the runner's median
        self.bests = []         # milliseconds, one per round: the runner's best
        self.slowest = []       # (median, best) per round by the slowest rank (the runner's
                                # measure before the span), where the runner prints a span
        self.steady = []        # milliseconds, one per round: a run of the runner's runs timed
                                # back to back after one barrier (as training's steps run)
        self.old_predicted = None  # seconds, by --old-meshc (own layout only)
        self.problem = None


def plan(meshc, path, fn, mesh, machine, variant):
    proc = subprocess.run([meshc, path, "--emit=plan-json", "--function", fn, "--mesh", mesh,
                           "--machine", machine] + variant.layout_args,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        variant.problem = "plan: " + first_error(proc.stderr)
        return
    report = json.loads(proc.stdout)[0]
    variant.predicted = report["summary"]["stepSeconds"]
    # Axes of size 1 split nothing: [1]'s `batch: data` is the replicated layout.
    sizes = {axis["axis"]: axis["size"] for axis in report["mesh"]}
    variant.layout = sorted((d["dim"], tuple(a for a in d["axes"] if sizes.get(a, 1) > 1))
                            for d in report["layout"])


def build(meshc, path, fn, mesh, machine, variant, cache):
    """`meshc run` builds and runs once (a warm-up of the build cache); the binary is the newest
    one in this variant's own cache directory."""
    proc = subprocess.run([meshc, "run", path, "--function", fn, "--mesh", mesh, "--machine",
                           machine, "--no-plan", "--cache-dir", cache] + variant.layout_args,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        variant.problem = "run: " + first_error(proc.stderr + proc.stdout)
        return
    binaries = []
    for top, _, files in os.walk(cache):
        binaries += [os.path.join(top, f) for f in files if f.endswith(".bin")]
    if not binaries:
        variant.problem = "run: no binary in " + cache
        return
    variant.binary = max(binaries, key=os.path.getmtime)


def measure(variant):
    out = variant.binary[:-4] + ".bench.out"
    proc = subprocess.run([variant.binary, out, "0"], capture_output=True, text=True,
                          timeout=1800)
    # The span (first start to last end) where the runner prints it: a rank that shares its core
    # starts its clock late, so the slowest rank's own time can leave out its core-mates' work.
    slowest = re.search(r"run ([0-9.]+) ms median, ([0-9.]+) ms best", proc.stdout)
    match = re.search(r"span ([0-9.]+) ms median, ([0-9.]+) ms best", proc.stdout) or slowest
    if proc.returncode != 0 or not match:
        variant.problem = "measure: " + first_error(proc.stderr + proc.stdout)
        return
    variant.runs.append(float(match.group(1)))
    variant.bests.append(float(match.group(2)))
    variant.slowest.append((float(slowest.group(1)), float(slowest.group(2))))
    steady = re.search(r"back to back ([0-9.]+) ms a run", proc.stdout)
    if steady:
        variant.steady.append(float(steady.group(1)))


def measure_rounds(rows, rounds):
    """Every built variant once a round, the rounds one after another over all rows: a row's
    rounds lie minutes apart, so that a neighbour's load on this shared host for a while (which
    slowed all of a row's rounds when they ran together, and moved single rows by more than 25%
    between runs) reaches one of them, which the median over rounds leaves out. Within a row the
    own and auto layouts alternate, the order flipped every round."""
    for r in range(rounds):
        print(f"measuring round {r + 1} of {rounds} (load {load():.2f})", flush=True)
        for _, _, own, auto, reason in rows:
            if reason:
                continue
            live = [v for v in (own, auto) if v and not v.problem]
            for v in (live if r % 2 == 0 else live[::-1]):
                measure(v)


def measured_ms(variant, best=False, slowest=False, steady=False):
    """The median over rounds of the runner's median; with `best`, the least of its bests (on a
    loaded machine the runs a busy core did not interrupt: the code's own time). With `slowest`,
    by the slowest rank's time instead of the span; with `steady`, by the runs timed back to back
    (the median or, with `best`, the least over rounds)."""
    if steady:
        runs = variant.steady
    else:
        runs = [r[1 if best else 0] for r in variant.slowest] if slowest else (
            variant.bests if best else variant.runs)
    if not runs:
        return None
    return min(runs) if best else statistics.median(runs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    parser.add_argument("--meshc", help="the meshc to use (default: <build-dir>'s)")
    parser.add_argument("--work", help="where binaries are cached "
                        "(default: <build-dir>/bench-fidelity)")
    parser.add_argument("--machine", help="a machine description (default: meshc calibrate)")
    parser.add_argument("--only", help="comma-separated example stems or stem.function")
    parser.add_argument("--meshes", default="1,2,2x2,2x4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="calibrate with --quick, 2 rounds, meshes 1 and 2x2 only")
    parser.add_argument("--old-meshc", help="also the predictions of this meshc (before/after "
                        "tables; own layouts only)")
    parser.add_argument("--old-machine", help="the machine description --old-meshc plans for "
                        "(default: --machine's; a term new in the new file then stays out of "
                        "the old column)")
    parser.add_argument("--no-auto", action="store_true",
                        help="the own layout only (no rank agreement)")
    args = parser.parse_args()
    meshc = args.meshc or os.path.join(args.build_dir, "compiler", "tools", "meshc")
    if not os.path.exists(meshc):
        sys.exit(f"fidelity: no meshc at {meshc} (build it first)")
    meshes = args.meshes.split(",")
    rounds = args.rounds
    if args.quick:
        rounds = min(rounds, 2)
        if args.meshes == parser.get_default("meshes"):
            meshes = ["1", "2x2"]
    only = set(args.only.split(",")) if args.only else None
    cache_root = args.work or os.path.join(args.build_dir, "bench-fidelity")
    os.makedirs(cache_root, exist_ok=True)
    print(f"load average at start: {load():.2f}", flush=True)

    machine = args.machine
    if not machine:
        machine = os.path.join(tempfile.mkdtemp(prefix="fidelity-"), "calibrated.json")
        command = [meshc, "calibrate", "-o", machine] + (["--quick"] if args.quick else [])
        print("calibrating:", " ".join(command[1:]), flush=True)
        subprocess.run(command, check=True)
    described = json.load(open(machine))
    print(f"machine {machine}: {described.get('description', '')}", flush=True)

    rows = []  # (label, mesh, own Variant, auto Variant or None, skip reason)
    for file in sorted(os.listdir(EXAMPLES)):
        if not file.endswith(".mesh"):
            continue
        stem, path = file[:-5], os.path.join(EXAMPLES, file)
        axes, fns = functions_of(path)
        for kind, fn in fns:
            if only and stem not in only and f"{stem}.{fn}" not in only:
                continue
            for mesh_name in meshes:
                label = f"{stem}.{fn}"
                mesh = mesh_option(axes, MESHES[mesh_name])
                if mesh is None:
                    rows.append((label, mesh_name, None, None,
                                 f"the example declares mesh axes {axes}"))
                    print(f"skip {label} [{mesh_name}]: mesh axes {axes}", flush=True)
                    continue
                own = Variant("own", [])
                auto = None if args.no_auto else Variant("auto", ["--layout", "auto"])
                variants = [v for v in (own, auto) if v]
                for v in variants:
                    plan(meshc, path, fn, mesh, machine, v)
                if args.old_meshc and not own.problem:
                    old = Variant("old", [])
                    plan(args.old_meshc, path, fn, mesh, args.old_machine or machine, old)
                    own.old_predicted = old.predicted
                if auto and own.layout is not None and auto.layout == own.layout:
                    auto.problem = "same layout as own"
                for v in variants:
                    if v.problem:
                        continue
                    cache = os.path.join(cache_root, f"{stem}.{fn}.{mesh_name}.{v.name}")
                    print(f"build {label} [{mesh}] {v.name}", flush=True)
                    build(meshc, path, fn, mesh, machine, v, cache)
                reason = own.problem
                if reason:
                    print(f"skip {label} [{mesh}]: {reason}", flush=True)
                rows.append((label, mesh_name, own, auto, reason))

    measure_rounds(rows, rounds)
    print_table(rows, rounds, bool(args.old_meshc))
    print(f"load average at end: {load():.2f}")


def ratio(v, best=False, predicted=None, slowest=False, steady=False):
    ms = measured_ms(v, best, slowest, steady) if v else None
    predicted = predicted if predicted is not None else (v.predicted if v else None)
    if not v or v.problem or ms is None or not predicted:
        return None
    return ms / (predicted * 1e3)


def fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def ranking(own, auto, best, slowest=False, steady=False):
    if not auto or auto.problem or ratio(auto, best, None, slowest, steady) is None:
        return auto.problem if auto and auto.problem else "-"
    predicted_own_better = own.predicted <= auto.predicted
    measured_own_better = (measured_ms(own, best, slowest, steady) <=
                           measured_ms(auto, best, slowest, steady))
    return ("agrees" if predicted_own_better == measured_own_better else "DISAGREES") + (
        " (own faster)" if measured_own_better else " (auto faster)")


def print_table(rows, rounds, with_old):
    print(f"\npredicted vs measured step time; measured: back to back, the median over {rounds} "
          "rounds of a run's time among the runner's runs timed one after another after one "
          "barrier (span over their count: first rank's start to last rank's end), as training's "
          "steps run; and each run timed alone after a barrier: the median over rounds of the "
          "runner's median of 5 runs (span), and the least of its bests; ratio = measured / "
          "predicted"
          + ("; old: --old-meshc's prediction" if with_old else ""))
    columns = ["function", "mesh"]
    if with_old:
        columns += ["old pred. ms", "old ratio (median)", "old ratio (best)"]
    columns += ["predicted ms", "back to back ms", "ratio (b2b)", "median ms", "ratio",
                "best ms", "ratio (best)", "auto pred. ms", "auto b2b / median / best ms",
                "ranking (b2b)", "ranking (median)", "ranking (best)"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    keys = ["steady", "steady best", "rank steady", "median", "best", "old median", "old best",
            "rank median", "rank best", "slowest median", "slowest best", "slowest rank median",
            "slowest rank best"]
    counts = {key: [0, 0] for key in keys}

    errors = {key: [] for key in counts}  # |ratio - 1| per row

    def tally(key, value):
        if value is not None:
            counts[key][0] += abs(value - 1) <= WITHIN
            counts[key][1] += 1
            errors[key].append(abs(value - 1))

    for label, mesh, own, auto, reason in rows:
        if reason:
            print(f"| {label} | [{mesh}] | skipped: {reason} |" + " |" * (len(columns) - 3))
            continue
        cells = [label, f"[{mesh}]"]
        if with_old:
            old_median = ratio(own, False, own.old_predicted)
            old_best = ratio(own, True, own.old_predicted)
            tally("old median", old_median)
            tally("old best", old_best)
            cells += [fmt(own.old_predicted * 1e3 if own.old_predicted else None),
                      fmt(old_median, 2), fmt(old_best, 2)]
        tally("steady", ratio(own, steady=True))
        tally("steady best", ratio(own, True, steady=True))
        tally("median", ratio(own))
        tally("best", ratio(own, True))
        tally("slowest median", ratio(own, False, None, True))
        tally("slowest best", ratio(own, True, None, True))
        auto_measured = "-"
        if auto and not auto.problem and auto.runs:
            auto_measured = (f"{fmt(measured_ms(auto, steady=True))} / "
                             f"{fmt(measured_ms(auto))} / {fmt(measured_ms(auto, True))}")
        text = ranking(own, auto, False, steady=True)
        if text.startswith(("agrees", "DISAGREES")):
            counts["rank steady"][0] += text.startswith("agrees")
            counts["rank steady"][1] += 1
        for best in (False, True):
            for slowest in (False, True):
                text = ranking(own, auto, best, slowest)
                if text.startswith(("agrees", "DISAGREES")):
                    key = ("slowest " if slowest else "") + ("rank best" if best else "rank median")
                    counts[key][0] += text.startswith("agrees")
                    counts[key][1] += 1
        cells += [fmt(own.predicted * 1e3), fmt(measured_ms(own, steady=True), 4),
                  fmt(ratio(own, steady=True), 2), fmt(measured_ms(own)), fmt(ratio(own), 2),
                  fmt(measured_ms(own, True)), fmt(ratio(own, True), 2),
                  fmt(auto.predicted * 1e3 if auto and auto.predicted and not auto.problem
                      else None), auto_measured, ranking(own, auto, False, steady=True),
                  ranking(own, auto, False),
                  ranking(own, auto, True)]
        print("| " + " | ".join(cells) + " |")

    def share(key):
        good, total = counts[key]
        text = f"{good} of {total}" + (f" ({good / total:.0%})" if total else "")
        if errors[key]:
            text += f", median |ratio - 1| {statistics.median(errors[key]):.0%}"
        return text

    print(f"\nwithin 25%, back to back: {share('steady')} (by the least of the rounds: "
          f"{share('steady best')}); own-vs-auto ranking agrees: {share('rank steady')}")
    print(f"within 25%, runs alone: median {share('median')}, best {share('best')}"
          + (f"; old model: median {share('old median')}, best {share('old best')}"
             if with_old else ""))
    print(f"own-vs-auto ranking agrees (pairs with different layouts): median "
          f"{share('rank median')}, best {share('rank best')}")
    print(f"by the slowest rank's time instead of the span (the runner's measure before session "
          f"21), same runs: within 25%: median {share('slowest median')}, best "
          f"{share('slowest best')}; rankings agree: median {share('slowest rank median')}, best "
          f"{share('slowest rank best')}")


if __name__ == "__main__":
    main()
