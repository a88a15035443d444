#!/usr/bin/env python3
"""The joint search of pipeline stages, recompute, microbatches and ZeRO under a memory budget
(issue 14, item 5; docs/planner.md, "Joint search"), on `meshc --emit=plan-json` / `--emit=plan`
of the transformer example's train block with `--layout auto`:

    check_joint_search.py <case> <meshc> <transformer.mesh> [<golden dir>]

budget: (3 layers: no stage count divides them on [2, 2]) under a budget no layout meets alone,
    the plan fits, the report lists every combination planned (each kind: recompute,
    microbatches, ZeRO), the chosen one is the fastest of those that fit, and the plan is the
    chosen combination's (its step, memory, microbatching, ZeRO stage and recompute section); the
    text report and the note on stderr name it; the jointSearch object equals the golden file
    (MESHC_UPDATE_GOLDEN=1 rewrites it). Under a budget nothing meets, the plain plan's error and
    a note with the smallest combination's need.
stages: (4 layers) the same budget is met fastest by 2 pipeline stages: the plan is the stage
    layout's (pipeline report) with the search's report; the stages were tried over each axis,
    the chosen is the fastest that fits, faster than every unstaged one that fits, and the
    pipeline's step, memory, microbatches and bubble are the chosen combination's.
jobs: `--plan-jobs` 1, 2 and 3 (the stage splits planned on worker threads while the combinations
    are, by one or two workers and the search's own thread) give the same plans byte for byte:
    `--emit=plan-json` and `--emit=plan` of the `stages` and `stages_zero` cases, and their
    stderr but the search's seconds. jobs_quick (the TSan job's): `--emit=plan` on 1 and 2 jobs.
run: `meshc run --memory-budget --check`: the generated code of a plan the search chose (recompute,
    microbatches and ZeRO together) trains 3 steps and matches the interpreter.
gpt3: the GPT-3 175B train block's shape at 1/8 of its width and 1/12 of its depth on
    h100-cluster [data=8, model=8] under a budget scaled as the weights are: the same search fits
    it and reports what it used.
"""
import json
import os
import re
import subprocess
import sys

SMALL = ["--function", "lm_train", "--dim", "layers=3", "--dim", "batch=16", "--dim", "seq=128",
         "--dim", "mem=128", "--layout", "auto"]
STAGED = [arg if arg != "layers=3" else "layers=4" for arg in SMALL]


def meshc(binary, example, *args):
    return subprocess.run([binary, example, *args], capture_output=True, text=True, timeout=900)


def expect(ok, what, proc=None):
    if not ok:
        detail = f"\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}" if proc else ""
        sys.exit(f"FAIL: {what}{detail}")
    print(f"ok   {what}")


def check_choice(plan, proc, budget_bytes):
    """The plan is the one the report chose, and the choice is the fastest that fits."""
    joint = plan["jointSearch"]
    considered, chosen = joint["considered"], joint["chosen"]
    expect(plan["memory"]["totalBytes"] <= budget_bytes, "the plan fits the budget", proc)
    fitting = [c for c in considered if c["fits"]]
    expect(all(c["memoryBytes"] <= budget_bytes for c in fitting) and
           all(c["memoryBytes"] > budget_bytes for c in considered if not c["fits"]),
           "each combination's 'fits' is its memory against the budget", proc)
    # A tie (relative 1e-9: the same step summed in another order) goes to the simpler one
    # (JointSearch.cpp's `faster`), which may then be an ulp slower than the fastest.
    expect(chosen["stepSeconds"] <= min(c["stepSeconds"] for c in fitting) * (1 + 1e-9),
           "the chosen combination is the fastest of those that fit", proc)
    expect(plan["summary"]["stepSeconds"] == chosen["stepSeconds"] and
           plan["memory"]["totalBytes"] == chosen["memoryBytes"],
           "the plan's step and memory are the chosen combination's", proc)
    micro = plan.get("microbatching", {"count": 1})
    expect(micro["count"] == chosen["microbatches"], "the plan runs the chosen microbatches", proc)
    zero = plan.get("zero", {"stage": 0})
    expect(zero["stage"] == chosen["zeroStage"], "the plan has the chosen ZeRO stage", proc)
    return joint, chosen


def budget_case(binary, example, golden_dir):
    args = [*SMALL, "--memory-budget", "8MiB"]
    proc = meshc(binary, example, "--emit=plan-json", *args)
    expect(proc.returncode == 0, "a plan under 8 MiB", proc)
    plan = json.loads(proc.stdout)[0]
    joint, chosen = check_choice(plan, proc, 8 << 20)
    considered = joint["considered"]
    expect(considered[0]["recompute"] == "" and considered[0]["microbatches"] == 1 and
           considered[0]["zeroStage"] == 0 and not considered[0]["fits"],
           "the first combination is the plain layout, which does not fit", proc)
    expect(any(c["recompute"] == "decoder_layer" for c in considered) and
           any(c["microbatches"] > 1 for c in considered) and
           {c["zeroStage"] for c in considered} == {0, 1, 2, 3},
           "recompute, microbatches and ZeRO stages 0-3 were all considered", proc)
    golden = os.path.join(golden_dir, "joint_search.transformer.json")
    text = json.dumps(joint, indent=1, sort_keys=True) + "\n"
    if os.environ.get("MESHC_UPDATE_GOLDEN") == "1":
        with open(golden, "w") as f:
            f.write(text)
    with open(golden) as f:
        expect(f.read() == text, f"the jointSearch object equals {golden}", proc)

    report = meshc(binary, example, "--emit=plan", *args)
    expect(report.returncode == 0 and "\njoint search (no layout fits the budget of 8.0 MiB alone"
           in report.stdout and re.search(r"\n  chosen: .*: the fastest predicted step of the \d+ "
                                          r"combinations? that fit \(ties: the simpler\)\n", report.stdout),
           "--emit=plan has the joint search's section", report)
    expect(re.search(r"note: no layout of train block 'lm_train' fits the memory budget of 8.0 "
                     r"MiB alone: planned with .* \(joint search: \d+ combinations in ", report.stderr),
           "a note on stderr names the choice", report)
    if chosen["recompute"]:
        expect("\n  decoder_layer: 4 calls" in report.stdout,
               "the recompute section of the chosen plan", report)

    tight = meshc(binary, example, "--emit=plan", *SMALL, "--memory-budget", "1MiB")
    expect(tight.returncode == 1 and "error: no layout of train block 'lm_train' fits the memory "
           "budget of 1.0 MiB per device" in tight.stderr and
           "note: with stages, recomputation, microbatches and ZeRO, train block 'lm_train' needs "
           "at least"
           in tight.stderr, "under 1 MiB nothing fits: the error and the smallest need", tight)


def check_staged_choice(plan, proc, budget_bytes):
    """The plan is the stage layout the joint search chose, and the choice is the fastest that
    fits; returns the search's report and the choice."""
    expect("pipeline" in plan and "jointSearch" in plan, "the plan is a pipeline's, with the "
           "joint search's report", proc)
    joint, p = plan["jointSearch"], plan["pipeline"]
    considered, chosen = joint["considered"], joint["chosen"]
    fitting = [c for c in considered if c["fits"]]
    expect(all((c["memoryBytes"] <= budget_bytes) == c["fits"] for c in considered),
           "each combination's 'fits' is its memory against the budget", proc)
    expect(chosen["stages"] > 1 and chosen["stepSeconds"] == min(c["stepSeconds"] for c in fitting),
           "stages are chosen, the fastest of the combinations that fit", proc)
    def same(a, b):  # the pipeline's JSON has 9 significant digits
        return abs(a - b) <= 1e-8 * abs(b)
    expect(same(p["step_seconds"], chosen["stepSeconds"]) and
           same(p["peak_memory_bytes"], chosen["memoryBytes"]) and
           chosen["memoryBytes"] <= budget_bytes and
           p["microbatches"] == chosen["microbatches"] and p["axis"] == chosen["stageAxis"] and
           len(p["stages"]) == chosen["stages"],
           "the pipeline's step, memory, microbatches and stages are the chosen combination's", proc)
    m, stages = p["microbatches"], len(p["stages"])
    expect(abs(p["bubble_fraction"] - (stages - 1) / (m + stages - 1)) < 1e-9,
           "the pipeline's bubble is (p - 1) / (m + p - 1)", proc)
    return joint, chosen


def stages_case(binary, example):
    # 4 ranks share the 2-core `cpu` machine however they are split into stages, so stages are
    # not faster than the unstaged plans that fit (44.1 ms under 8 MiB: 4 microbatches); under
    # 5300 KiB only ZeRO-3 with 4 microbatches fits unstaged, and 2 stages are faster.
    args = [*STAGED, "--memory-budget", "5300KiB"]
    proc = meshc(binary, example, "--emit=plan-json", *args)
    expect(proc.returncode == 0, "a plan under 5300 KiB", proc)
    joint, chosen = check_staged_choice(json.loads(proc.stdout)[0], proc, 5300 << 10)
    # The chosen pipeline's generated code fits too (its stages' arenas, values computed once,
    # params and optimizer state; docs/runtime.md). 8 microbatches without recomputation, the
    # choice before the model placed the embedding on the first stage, need 6,182,080 bytes
    # there.
    code = [s["code_memory_bytes"] for s in json.loads(proc.stdout)[0]["pipeline"]["stages"]]
    expect(max(code) <= 5300 << 10, f"the chosen pipeline's generated code fits: {code}", proc)
    considered = joint["considered"]
    unstaged = [c for c in considered if c["stages"] == 1]
    expect(unstaged and not unstaged[0]["fits"] and any(c["fits"] for c in unstaged) and
           all(c["stepSeconds"] > chosen["stepSeconds"] for c in unstaged if c["fits"]),
           "unstaged combinations fit too, all slower than the stages", proc)
    expect({(c["stageAxis"], c["stages"]) for c in considered if c["stages"] > 1} ==
           {("data", 2), ("model", 2)}, "2 stages were tried over each axis of [data=2, model=2]",
           proc)
    report = meshc(binary, example, "--emit=plan", *args)
    expect(report.returncode == 0 and "(pipeline stages)" in report.stdout and
           "\njoint search (no layout fits the budget of 5.2 MiB alone" in report.stdout and
           re.search(r"\n  chosen: 2 pipeline stages over '(data|model)', "
                     r"(recompute decoder_layer, )?\d+ microbatches of batch: the fastest",
                     report.stdout),
           "--emit=plan is the pipeline's report with the joint search's section", report)
    expect(re.search(r"note: no layout of train block 'lm_train' fits the memory budget of 5.2 "
                     r"MiB alone: planned with 2 pipeline stages over", report.stderr),
           "a note on stderr names the stages", report)


def stages_zero_case(binary, example):
    """Stages with ZeRO: wider layers (d_model 256, d_ff 1024, seq 32, 8 layers) whose weights
    and optimizer state dominate, the batch pinned over `data` (so that a stage's plan is data
    parallel: a searched stage layout lays the weights over the other axis, which leaves ZeRO
    nothing to shard); under 25,000,000 bytes per device nothing fits unstaged (ZeRO-3 with the
    layer recomputed needs 29.5 MB) nor staged without ZeRO (38.2 MB) or with ZeRO-1 or 2
    (28.6 MB), and 2 stages over `model` whose plans are ZeRO-3'd over `data` fit (22.7 MB).
    (Before the stages' activations followed the code's placement, 4 layers unpinned under
    15,000,000 bytes showed this; the model now charges those stages 16.2 MB, above the
    unstaged plan's 15.1 MB.)"""
    budget = 25000000
    args = ["--function", "lm_train", "--dim", "layers=8", "--dim", "batch=16", "--dim", "seq=32",
            "--dim", "mem=32", "--dim", "d_model=256", "--dim", "d_ff=1024", "--layout",
            "batch: data, auto", "--memory-budget", str(budget)]
    proc = meshc(binary, example, "--emit=plan-json", *args)
    expect(proc.returncode == 0, "a plan under 25,000,000 bytes", proc)
    joint, chosen = check_staged_choice(json.loads(proc.stdout)[0], proc, budget)
    staged = [c for c in joint["considered"] if c["stages"] > 1]
    expect(chosen["zeroStage"] > 0, f"the stages' plans are ZeRO'd (stage {chosen['zeroStage']})",
           proc)
    for axis in {c["stageAxis"] for c in staged}:
        rows = [c["zeroStage"] for c in staged if c["stageAxis"] == axis]
        expect(rows == list(range(len(rows))) and not any(
            c["fits"] for c in staged if c["stageAxis"] == axis and c["zeroStage"] < rows[-1]),
               f"2 stages over '{axis}': ZeRO stages {rows} in order, up to the first that fits",
               proc)
    # A ZeRO row's plans are the same split's plans without ZeRO with the stage applied
    # (PlanPipeline.h, UnzeroedPlans): each must be what planning its stage layout with that
    # ZeRO stage, microbatch count and recomputation from scratch predicts.
    base, layout = args[:-4], args[-3]  # without the layout and the budget; the layout's pins
    for row in staged:
        if row["zeroStage"] == 0:
            continue
        mesh = []
        for name, size in (("data", 2), ("model", 2)):
            if name == row["splitAxis"] and row["stageAxis"] != name:
                mesh += [f"stage={row['stages']}", f"{name}={size // row['stages']}"]
            else:
                mesh.append(f"{name}={size}")
        direct = meshc(binary, example, "--emit=plan-json", *base, "--layout",
                       f"layers: [{row['stageAxis']}], {layout}", "--mesh", ",".join(mesh),
                       "--zero", str(row["zeroStage"]), "--microbatches",
                       f"batch={row['microbatches']}", "--memory-budget", "1e30",
                       *(["--recompute", row["recompute"]] if row["recompute"] else []))
        expect(direct.returncode == 0, f"the row {row} planned directly", direct)
        p = json.loads(direct.stdout)[0]["pipeline"]
        expect(abs(p["step_seconds"] - row["stepSeconds"]) <= 1e-8 * row["stepSeconds"] and
               abs(p["peak_memory_bytes"] - row["memoryBytes"]) <= 1e-8 * row["memoryBytes"],
               f"{row['stages']} stages over '{row['stageAxis']}' with ZeRO stage "
               f"{row['zeroStage']}: the row is the stage layout's plan ({p['step_seconds']} s, "
               f"{p['peak_memory_bytes']} bytes)", direct)


def gpt3_case(binary, example):
    args = ["--function", "lm_train", "--dim", "d_model=1536", "--dim", "heads=12", "--dim",
            "d_head=128", "--dim", "d_ff=6144", "--dim", "vocab=50304", "--dim", "seq=2048",
            "--dim", "mem=2048", "--dim", "batch=64", "--dim", "layers=8", "--machine",
            "h100-cluster", "--mesh", "data=8,model=8", "--layout", "auto", "--memory-budget",
            "1GiB"]
    proc = meshc(binary, example, "--emit=plan-json", *args)
    expect(proc.returncode == 0, "the GPT-3-shaped block fits 1 GiB per device", proc)
    plan = json.loads(proc.stdout)[0]
    if "pipeline" in plan:
        check_staged_choice(plan, proc, 1 << 30)
    else:
        check_choice(plan, proc, 1 << 30)


def jobs_case(binary, example, quick=False):
    """The stage splits on worker threads (JointSearch.cpp, StageWork): the same output whatever
    the number of threads. `quick` (the TSan job, where a search is ~30x slower): `--emit=plan`
    on 1 and 2 jobs only."""
    zero_args = ["--function", "lm_train", "--dim", "layers=8", "--dim", "batch=16", "--dim",
                 "seq=32", "--dim", "mem=32", "--dim", "d_model=256", "--dim", "d_ff=1024",
                 "--layout", "batch: data, auto", "--memory-budget", "25000000"]
    seconds = re.compile(r"combinations in [0-9.]+ s\)")
    for name, args in (("stages", [*STAGED, "--memory-budget", "5300KiB"]),
                       ("stages_zero", zero_args)):
        for emit in ("--emit=plan",) if quick else ("--emit=plan-json", "--emit=plan"):
            runs = {jobs: meshc(binary, example, emit, f"--plan-jobs={jobs}", *args)
                    for jobs in ((1, 2) if quick else (1, 2, 3))}
            one = runs[1]
            expect(one.returncode == 0 and ("(pipeline stages)" in one.stdout or
                                            '"pipeline"' in one.stdout),
                   f"{name} {emit}: stages chosen on 1 job", one)
            for jobs in list(runs)[1:]:
                other = runs[jobs]
                expect(other.returncode == 0 and other.stdout == one.stdout,
                       f"{name} {emit}: the same plan on {jobs} jobs as on 1", other)
                expect(seconds.sub("", other.stderr) == seconds.sub("", one.stderr),
                       f"{name} {emit}: the same stderr on {jobs} jobs as on 1 (but the seconds)",
                       other)
    bad = meshc(binary, example, "--emit=plan", "--plan-jobs=-1", *STAGED)
    expect(bad.returncode != 0 and "--plan-jobs must be a non-negative number" in bad.stderr,
           "--plan-jobs=-1 is an option error", bad)


def run_case(binary, example):
    """`meshc run --memory-budget` builds the joint search's plan (here the repeated layer
    recomputed, 2 microbatches and ZeRO stage 3 on [data=2, model=2]; 3 layers, which no stage
    count divides there) and --check compares 3 train steps' losses and final params with the
    interpreter's plain training."""
    import tempfile
    with tempfile.TemporaryDirectory() as cache:
        proc = meshc(binary, "run", example, "--function", "lm_train", "--dim", "layers=3",
                     "--dim", "batch=8", "--dim", "seq=64", "--dim", "mem=64", "--layout", "auto",
                     "--memory-budget", "1500KiB", "--steps", "3", "--check", "--cache-dir", cache,
                     "--opt=-O1")
    choice = re.search(r"note: no layout of train block 'lm_train' fits the memory budget of 1.5 "
                       r"MiB alone: planned with (.*) \(joint search", proc.stderr + proc.stdout)
    expect(proc.returncode == 0 and choice, "meshc run plans with the joint search and passes "
           "--check", proc)
    used = choice.group(1)
    expect("recompute decoder_layer" in used and "microbatches of batch" in used and
           "ZeRO stage" in used, f"the plan run uses recompute, microbatches and ZeRO ({used})", proc)
    expect("ok   lm_train.loss" in proc.stdout and "ok   lm_train.param.decoder/unembed " in
           proc.stdout and "FAIL" not in proc.stdout, "losses and params match the interpreter",
           proc)


def main():
    case, binary, example = sys.argv[1:4]
    golden_dir = sys.argv[4] if len(sys.argv) > 4 else os.path.dirname(os.path.abspath(__file__))
    {"budget": lambda: budget_case(binary, example, golden_dir),
     "stages": lambda: stages_case(binary, example),
     "stages_zero": lambda: stages_zero_case(binary, example),
     "gpt3": lambda: gpt3_case(binary, example),
     "jobs": lambda: jobs_case(binary, example),
     "jobs_quick": lambda: jobs_case(binary, example, quick=True),
     "run": lambda: run_case(binary, example)}[case]()


if __name__ == "__main__":
    main()
