#!/usr/bin/env python3
"""Planner benchmarks (not tests): run from the repository root as
    python3 bench/plan_time.py [path/to/meshc]

1. Planning time of the transformer example with `layout auto` at 1 and 48 layers (the `layers`
   dim is the repeat count), on the example's [data=2, model=2] mesh and on [data=2, model=4],
   for the 8xh100 machine. meshc's wall time with --emit=plan minus its time with --emit=ir
   (parsing, sema and lowering alone) is the planner's time; best of 3 runs each. Goal: under
   1 second at 48 layers.
2. The simulation of Mesh-TensorFlow's largest language model (bench/mtf_lm.mesh) on the
   tpuv2-pod machine: parameters, predicted step time and utilization (the paper: ~50%).
"""
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESHC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "compiler", "tools", "meshc")
TRANSFORMER = os.path.join(ROOT, "dsl-examples", "transformer.mesh")


def best_time(args, runs=3):
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run([MESHC, *args], capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"meshc {' '.join(args)} failed:\n{proc.stderr}")
        best = min(best, elapsed)
    return best, proc.stdout


def plan_time():
    print("planning time, transformer example, layout auto, machine 8xh100 (best of 3)")
    print(f"{'mesh':<18} {'layers':>6} {'sema (s)':>9} {'plan (s)':>9} {'planner (s)':>11} "
          f"{'candidates':>10}")
    for mesh in ["data=2,model=2", "data=2,model=4"]:
        planner = {}
        for layers in [1, 48]:
            common = [TRANSFORMER, "--mesh", mesh, "--layout", "auto", "--dim", f"layers={layers}",
                      "--machine", "8xh100"]
            sema, _ = best_time([*common, "--emit=ir"])
            plan, text = best_time([*common, "--emit=plan"])
            candidates = sum(int(n) for n in re.findall(r"(\d+) candidate layouts?", text))
            planner[layers] = max(plan - sema, 0.0)
            print(f"{mesh:<18} {layers:>6} {sema:>9.3f} {plan:>9.3f} {planner[layers]:>11.3f} "
                  f"{candidates:>10}")
        ratio = planner[48] / planner[1] if planner[1] > 0 else float("inf")
        verdict = "under" if planner[48] < 1 else "OVER"
        print(f"{'':<18} 48 / 1 layers: planner time x{ratio:.1f}; {verdict} the 1 s goal")


def mtf_simulation():
    path = os.path.join(ROOT, "bench", "mtf_lm.mesh")
    seconds, out = best_time([path, "--emit=plan-json", "--machine", "tpuv2-pod"], runs=1)
    plan = json.loads(out)[0]
    params = 0
    for tensor in plan["tensors"]:
        if tensor["role"] == "param":
            sizes = [int(s) for s in re.findall(r"=(\d+)", tensor["globalShape"])]
            count = 1
            for s in sizes:
                count *= s
            params += count
    summary, memory = plan["summary"], plan["memory"]
    mesh = " x ".join(f"{a['axis']}:{a['size']}" for a in plan["mesh"])
    print()
    print("Mesh-TensorFlow's largest LM on tpuv2-pod, mesh " + mesh)
    print(f"  parameters           {params / 1e9:.2f} B")
    print(f"  predicted step       {summary['stepSeconds'] * 1e3:.1f} ms "
          f"(compute {summary['computeSeconds'] * 1e3:.1f} ms, "
          f"communication {summary['communicationSeconds'] * 1e3:.1f} ms)")
    print(f"  memory per device    {memory['totalBytes'] / 2**30:.2f} GiB "
          f"of {memory['budgetBytes'] / 2**30:.2f} GiB")
    print(f"  predicted utilization {100 * summary['utilization']:.1f}% (paper: ~50%)")
    print(f"  planned in           {seconds:.2f} s")


if __name__ == "__main__":
    plan_time()
    mtf_simulation()
