#!/usr/bin/env python3
"""Planner benchmarks (not tests): run from the repository root as
    python3 bench/plan_time.py [path/to/meshc]

1. Planning time of the transformer example's program (lm) and train block (lm_train: forward,
   backward, AdamW) with `layout auto` at 1 and 48 layers (the `layers` dim is the repeat count),
   on the example's [data=2, model=2] mesh and on [data=2, model=4], for the 8xh100 machine.
   meshc's whole wall time with --emit=plan (front end and training phase included), best of 3
   runs each. Goal: under 1 second at 48 layers.
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
    print(f"{'function':<9} {'mesh':<15} {'layers':>6} {'meshc --emit=plan (s)':>22} "
          f"{'candidates':>10}")
    # The program (forward) and the train block (forward, backward and AdamW: three times the
    # ops) are planned separately. The time is the whole meshc run (parse, sema, the training
    # phase, planning, the report), so the goal is met with the front end included.
    for function in ["lm", "lm_train"]:
        for mesh in ["data=2,model=2", "data=2,model=4"]:
            seconds = {}
            for layers in [1, 48]:
                args = [TRANSFORMER, "--mesh", mesh, "--layout", "auto", "--dim",
                        f"layers={layers}", "--machine", "8xh100", "--function", function,
                        "--emit=plan"]
                seconds[layers], text = best_time(args)
                candidates = sum(int(n) for n in re.findall(r"(\d+) candidate layouts?", text))
                print(f"{function:<9} {mesh:<15} {layers:>6} {seconds[layers]:>22.3f} "
                      f"{candidates:>10}")
            verdict = "under" if seconds[48] < 1 else "OVER"
            print(f"{'':<25} 48 / 1 layers: x{seconds[48] / seconds[1]:.1f}; {verdict} the 1 s goal")


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
