#!/usr/bin/env python3
"""Per-op minima of a trace (meshrt/Trace.h; `meshc run --trace FILE` or `--profile`): the same
op of every timed run (the first run, a warm-up, left out) lines up by its order in the run, and
the least of its durations is what it costs when nothing else took the core. On a shared
machine the sum of the minima estimates an undisturbed run; `meshc run --profile`'s means
cannot. Prints the runs' durations, the sum of the minima and the largest kinds by phase.

    python3 bench/trace_minima.py TRACE.json [--rank R] [--top N] [--by-line]

--by-line groups the minima by source line and phase (as `meshc run --profile` does) instead of
by kind, with each line's kinds and ops per run.
"""
import argparse
import collections
import json


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--by-line", action="store_true",
                        help="group by source line and phase, not by kind")
    args = parser.parse_args()
    with open(args.trace) as f:
        data = json.load(f)
    events = [e for e in (data["traceEvents"] if isinstance(data, dict) else data)
              if e.get("ph") == "X" and e.get("tid") == args.rank]
    runs = sorted((e for e in events if e.get("cat") == "run"), key=lambda e: e["ts"])
    print("runs (ms):", [round(r["dur"] / 1e3, 3) for r in runs])
    per_run = [sorted((e for e in events if e.get("cat") != "run"
                       and r["ts"] <= e["ts"] <= r["ts"] + r["dur"]), key=lambda e: e["ts"])
               for r in runs[1:]]
    if not per_run:
        raise SystemExit("trace_minima: fewer than two runs in the trace")
    count = min(len(ops) for ops in per_run)
    sums = collections.Counter()
    kinds = collections.defaultdict(set)
    ops_per_key = collections.Counter()
    for i in range(count):
        op = per_run[0][i]
        if args.by_line:
            where = op["args"].get("where", "")
            key = (where.rsplit(":", 1)[0] if where.count(":") > 1 else where, op.get("cat"))
        else:
            key = (op["args"].get("kind"), op.get("cat"))
        sums[key] += min(ops[i]["dur"] for ops in per_run)
        kinds[key].add(op["args"].get("kind"))
        ops_per_key[key] += 1
    print(f"sum of per-op minima over {len(per_run)} runs: {sum(sums.values()) / 1e3:.3f} ms")
    for key, us in sums.most_common(args.top):
        if args.by_line:
            print(f"  {key[0]:<26} {key[1]:<12} {us:9.1f} us  {ops_per_key[key]:4d} ops  "
                  f"{','.join(sorted(kinds[key]))}")
        else:
            print(f"  {key[0]:<14} {key[1]:<12} {us:9.1f} us")


if __name__ == "__main__":
    main()
