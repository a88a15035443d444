#!/usr/bin/env python3
"""Pipeline stages in the planner (issue 14, items 1 and 5; docs/planner.md, "Pipeline stages"),
checked on `meshc --emit=plan-json` of the transformer example with its repeated layers laid
over a `stage` axis (`layers: stage`):

    check_pipeline.py <meshc> <transformer.mesh>

- The stages' timeline: the bubble is (p - 1) / (m + p - 1) and the step (m + p - 1) slots plus
  the once-per-step work; every stage holds at least one layer, consecutive, all layers placed.
- The schedules: GPipe holds all m microbatches' activations on every stage, 1F1B at most p - s
  on stage s (less memory on the first stage, the same predicted time).
- The parts are the plans': a stage's forward time at one layer per stage equals the per-layer
  difference of plans of the same step at one and two layers on the mesh without the stage axis.
- More microbatches shrink the bubble; `--microbatches batch=auto` keeps the fastest count that
  fits the memory budget: under a budget that only one count fits, that one, unless recomputing
  the repeated layer lets a faster one fit.
- Recomputation composes with stages: one stage of every layer predicts the unstaged plan's
  step exactly and bounds its memory from above.
"""
import json
import os
import re
import subprocess
import sys

LAYOUT = "batch:data, heads:model, d_ff:model, vocab:model, layers:stage"


def meshc(binary, example, *args, expect_ok=True):
    proc = subprocess.run([binary, example, "--emit=plan-json", "--function", "lm_train", *args],
                          capture_output=True, text=True, timeout=300)
    if expect_ok and proc.returncode != 0:
        sys.exit(f"FAIL: meshc {' '.join(args)} exited {proc.returncode}\n{proc.stderr}")
    return proc


def pipeline(binary, example, *args):
    return json.loads(meshc(binary, example, *args).stdout)[0]["pipeline"]


def expect(ok, what, detail=""):
    if not ok:
        sys.exit(f"FAIL: {what}\n{detail}")
    print(f"ok   {what}")


def close(a, b, rel=1e-6):
    return abs(a - b) <= rel * max(abs(a), abs(b))


def main():
    binary, example = sys.argv[1], sys.argv[2]
    base = ["--mesh", "stage=4,data=2,model=2", "--layout", LAYOUT, "--dim", "layers=8",
            "--dim", "batch=16"]
    runs = {}
    for schedule in ["gpipe", "1f1b"]:
        for m in [1, 2, 4, 8]:
            runs[schedule, m] = pipeline(binary, example, *base, "--microbatches", f"batch={m}",
                                         "--pipeline-schedule", schedule)
    for (schedule, m), p in runs.items():
        stages = p["stages"]
        expect(len(stages) == 4 and p["microbatches"] == m and p["schedule"] == schedule,
               f"{schedule} m={m}: 4 stages, {m} microbatches")
        expect(close(p["bubble_fraction"], 3 / (m + 3)),
               f"{schedule} m={m}: bubble (p - 1) / (m + p - 1) = {3 / (m + 3):.4f}")
        once = max(s["once_seconds"] for s in stages)
        expect(close(p["step_seconds"], (m + 3) * p["slot_seconds"] + once),
               f"{schedule} m={m}: step = (m + p - 1) x slot + once")
        first = 0
        for s in stages:
            expect(s["first_layer"] == first and s["layers"] >= 1, "consecutive layers")
            first += s["layers"]
            expect(p["slot_seconds"] + 1e-15 >= s["forward_seconds"] + s["backward_seconds"],
                   "the slot covers every stage's forward and backward")
        expect(first == 8 and stages[-1]["holds_rest"], "all 8 layers placed, the rest last")
        in_flight = [s["in_flight"] for s in stages]
        want = [m] * 4 if schedule == "gpipe" else [min(m, 4 - s) for s in range(4)]
        expect(in_flight == want, f"{schedule} m={m}: microbatches in flight {want}",
               f"got {in_flight}")
    for m in [1, 2, 4, 8]:
        gpipe, ofob = runs["gpipe", m], runs["1f1b", m]
        expect(close(gpipe["step_seconds"], ofob["step_seconds"]),
               f"m={m}: GPipe and 1F1B take the same predicted time")
    # m > p: 1F1B's first stage holds p microbatches, GPipe's all m.
    expect(runs["gpipe", 8]["stages"][0]["memory_bytes"] >
           runs["1f1b", 8]["stages"][0]["memory_bytes"],
           "m=8: 1F1B holds less on the first stage than GPipe")
    expect(runs["1f1b", 8]["bubble_fraction"] < runs["1f1b", 1]["bubble_fraction"],
           "more microbatches, a smaller bubble")

    # The parts are the plans': one layer's forward = plan(2 layers) - plan(1 layer), on a machine
    # with a device per rank (on `cpu`'s 2 cores the 16 ranks of all stages share them 4 times as
    # much as the 4 ranks of one stage's mesh would alone, and a stage's plan counts them all).
    def forward_seconds(layers, machine="h100-cluster", mesh="data=2,model=2",
                        layout="batch:data, heads:model, d_ff:model, vocab:model"):
        """The `by phase` forward time of the plan report."""
        proc = subprocess.run([binary, example, "--emit=plan", "--function", "lm_train",
                               "--machine", machine, "--mesh", mesh, "--layout", layout, "--dim",
                               f"layers={layers}", "--dim", "batch=4"],
                              capture_output=True, text=True, timeout=300)
        units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
        for line in proc.stdout.splitlines():
            if line.strip().startswith("by phase"):
                words = line.replace(",", "").split()
                at = words.index("forward")
                return float(words[at + 1]) * units[words[at + 2]]
        sys.exit(f"FAIL: no 'by phase' line\n{proc.stdout}")
    layer = forward_seconds(2) - forward_seconds(1)
    stage1 = pipeline(binary, example, *base, "--microbatches", "batch=4", "--pipeline-schedule",
                      "1f1b", "--machine", "h100-cluster")["stages"][1]
    # On `cpu` (2 cores), 4 stages of one rank each run 2 ranks per core: a stage's forward is
    # twice its layers' on one rank alone (no collectives: the oversubscription factor exactly).
    alone = forward_seconds(2, "cpu", "data=1", "layers: []") - forward_seconds(1, "cpu", "data=1",
                                                                             "layers: []")
    shared = pipeline(binary, example, "--mesh", "stage=4", "--layout", "layers: stage", "--dim",
                      "layers=8", "--dim", "batch=16", "--microbatches", "batch=4")["stages"][1]
    # A middle stage also runs what every stage computes for itself (the attention mask built
    # from the batch): its share of the rest, which the code runs there too.
    expect(shared["rest_forward_seconds"] > 0 and
           close(shared["forward_seconds"] - shared["rest_forward_seconds"],
                 2 * shared["layers"] * alone, 3e-3),
           "4 one-rank stages on 2 cores: a stage's forward = 2 x its layers x one layer alone "
           "+ its part of the rest",
           f"{shared['forward_seconds']} - {shared['rest_forward_seconds']} vs 2 x "
           f"{shared['layers']} x {alone}")
    # The rest's time on the stages that run it (driver/PlaceRest.cpp): the embedding's forward
    # and backward on the first stage, the head's and the loss's on the last, the attention mask
    # built from the batch on every stage; a middle stage runs no backward of the rest.
    four = pipeline(binary, example, "--mesh", "stage=4", "--layout", "layers: stage", "--dim",
                    "layers=8", "--dim", "batch=16", "--microbatches", "batch=4")["stages"]
    first, middle, second, last = four
    expect(middle["rest_backward_seconds"] == 0 == second["rest_backward_seconds"] and
           middle["rest_forward_seconds"] == second["rest_forward_seconds"] > 0,
           "[stage=4]: a middle stage runs the mask of the rest, no backward of it",
           str([(s["rest_forward_seconds"], s["rest_backward_seconds"]) for s in four]))
    expect(first["rest_forward_seconds"] > middle["rest_forward_seconds"] and
           first["rest_backward_seconds"] > 0 and
           last["rest_forward_seconds"] > first["rest_forward_seconds"] and
           last["rest_backward_seconds"] > first["rest_backward_seconds"],
           "[stage=4]: the embedding's time on the first stage, the head's and the loss's (more) "
           "on the last", str([(s["rest_forward_seconds"], s["rest_backward_seconds"])
                               for s in four]))
    for s in four:
        expect(close(s["forward_seconds"] - s["rest_forward_seconds"],
                     middle["forward_seconds"] - middle["rest_forward_seconds"]),
               "[stage=4]: every stage's forward is its 2 layers' plus its part of the rest")
    # The report prints 4 significant figures: their difference is known to about 2e-3.
    expect(close(stage1["forward_seconds"] - stage1["rest_forward_seconds"],
                 stage1["layers"] * layer, 3e-3),
           "a middle stage's forward = its layers x (plan at 2 layers - plan at 1 layer)",
           f"{stage1['forward_seconds']} vs {stage1['layers']} x {layer}")

    # auto: the fastest count that fits; a budget between the m=1 and m=8 stage memories leaves
    # only the larger counts.
    auto = pipeline(binary, example, *base, "--microbatches", "batch=auto")
    best = min((p for (s, m), p in runs.items() if s == "1f1b"), key=lambda p: p["step_seconds"])
    expect(auto["microbatches"] == best["microbatches"],
           f"batch=auto picks the fastest count ({best['microbatches']})",
           f"got {auto['microbatches']}")
    # Under a budget that only the count needing the least memory fits, auto picks that one.
    peaks = sorted((p["peak_memory_bytes"], m) for (sched, m), p in runs.items() if sched == "1f1b")
    expect(peaks[0][0] < peaks[1][0], "one microbatch count needs the least memory", str(peaks))
    budget = int((peaks[0][0] + peaks[1][0]) / 2)
    fitted = pipeline(binary, example, *base, "--microbatches", "batch=auto", "--memory-budget",
                      str(budget))
    plain_fit = runs["1f1b", peaks[0][1]]
    expect(fitted["peak_memory_bytes"] <= budget, f"under a {budget} B budget batch=auto fits it")
    if fitted["recompute_chosen"]:  # recomputation let a faster count fit
        expect(fitted["recompute"] == ["decoder_layer"] and
               fitted["step_seconds"] < plain_fit["step_seconds"],
               "recomputing the layer is chosen only when faster than the count that fits "
               "without it", f"{fitted['step_seconds']} vs {plain_fit['step_seconds']}")
    else:
        expect(fitted["microbatches"] == peaks[0][1],
               f"under a {budget} B budget batch=auto picks the one count that fits "
               f"({peaks[0][1]})", f"got {fitted['microbatches']}")
    over = peaks[1][1]
    tight = meshc(binary, example, *base, "--microbatches", f"batch={over}", "--memory-budget",
                  "100KiB", expect_ok=False)
    expect(tight.returncode == 1 and "error: no microbatch count of train block 'lm_train' fits"
           in tight.stderr, f"{over} microbatches over the budget is a located error",
           tight.stderr)

    # Recomputation composes with stages: its time adds up per layer, so one stage holding
    # every layer predicts the step of the plan without stages exactly; its memory does not
    # (a recomputed layer keeps its inputs, one layer at a time holds its whole activations),
    # so the stage's memory is an upper bound of that plan's, within a quarter of it (at a
    # sequence length where activations, not the update's temporaries, set the peak).
    sizes = ["--dim", "layers=8", "--dim", "batch=16", "--dim", "seq=128", "--dim", "mem=128",
             "--recompute=decoder_layer"]
    piped = pipeline(binary, example, "--mesh", "stage=1,data=2,model=2", "--layout", LAYOUT,
                     *sizes)
    flat = json.loads(meshc(binary, example, "--mesh", "data=2,model=2", *sizes).stdout)[0]
    expect(close(piped["step_seconds"], flat["summary"]["stepSeconds"], 1e-6),
           "one stage with recomputation: the step of the plan without stages",
           f"{piped['step_seconds']} vs {flat['summary']['stepSeconds']}")
    total = flat["memory"]["totalBytes"]
    expect(total <= piped["peak_memory_bytes"] <= 1.25 * total,
           "one stage with recomputation: memory at most a quarter above the plan's",
           f"{piped['peak_memory_bytes']} vs {total}")
    four = ["--mesh", "stage=4,data=2,model=2", "--layout", LAYOUT, "--microbatches", "batch=4",
            *sizes[:-1]]
    kept, recomputed = (pipeline(binary, example, *four, *extra)
                        for extra in ([], ["--recompute=decoder_layer"]))
    expect(recomputed["peak_memory_bytes"] < kept["peak_memory_bytes"] and
           recomputed["step_seconds"] > kept["step_seconds"] and
           recomputed["recompute"] == ["decoder_layer"] and not recomputed["recompute_chosen"],
           "four stages with --recompute: less memory, a longer step",
           f"{recomputed['peak_memory_bytes']} vs {kept['peak_memory_bytes']}")

    # Recomputation adds to the backward, per microbatch: bench/megatron_1t.mesh at small sizes
    # (bf16 compute from f32 master weights: the copies include the weights' casts, which the
    # planner once took for the update, so that every gradient they fed was charged once per
    # step and a stage's backward came out near zero). Each stage's backward grows by its
    # layers' recomputed forward (positive, at most a layer's forward, the same per layer on
    # every stage), its forward and once-per-step work stay, its activations shrink.
    megatron = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                            "megatron_1t.mesh")
    small = ["--mesh", "stage=4,data=2,model=2", "--microbatches", "batch=4"]
    for dim, size in [("layers", 8), ("batch", 16), ("d_model", 256), ("heads", 4),
                      ("d_head", 64), ("d_ff", 1024), ("vocab", 512), ("seq", 128),
                      ("mem", 128)]:
        small += ["--dim", f"{dim}={size}"]
    mixed = {}
    for extra in ([], ["--recompute=decoder_layer"]):
        proc = subprocess.run([binary, megatron, "--emit=plan-json", *small, *extra],
                              capture_output=True, text=True, timeout=300)
        expect(proc.returncode == 0, f"megatron_1t.mesh at small sizes {' '.join(extra)}",
               proc.stderr)
        mixed[bool(extra)] = json.loads(proc.stdout)[0]["pipeline"]
    plain, recomputed = mixed[False], mixed[True]
    per_layer = []
    for a, b in zip(plain["stages"], recomputed["stages"]):
        expect(a["layers"] == b["layers"] and close(a["once_seconds"], b["once_seconds"], 1e-9)
               and close(a["forward_seconds"], b["forward_seconds"], 0.01)
               and b["activation_bytes"] < a["activation_bytes"],
               f"bf16 with --recompute, stage of layers {a['first_layer']}+: the same split, "
               "forward and once-per-step work, fewer activations", f"{a}\n{b}")
        added = (b["backward_seconds"] - a["backward_seconds"]) / a["layers"]
        expect(0 < added <= 1.01 * a["forward_seconds"] / a["layers"],
               f"bf16 with --recompute, stage of layers {a['first_layer']}+: the backward grows "
               f"by at most a forward per layer ({added:.6g} s)", f"{a}\n{b}")
        per_layer.append(added)
    expect(max(per_layer) <= 1.01 * min(per_layer),
           "bf16 with --recompute: the same recomputed time per layer on every stage",
           str(per_layer))
    expect(recomputed["step_seconds"] > plain["step_seconds"] and
           recomputed["peak_memory_bytes"] < plain["peak_memory_bytes"],
           "bf16 with --recompute: a longer step, less memory",
           f"{recomputed['step_seconds']} vs {plain['step_seconds']}")

    # Code generation takes the stage layout (tests/e2e: e2e.train.stages.*; tests/cuda), with
    # --recompute too (the recomputed layer's forward runs again in its stage's backward).
    cpp = subprocess.run([binary, example, "--emit=cpp", "--function", "lm_train", *base],
                         capture_output=True, text=True, timeout=300)
    expect(cpp.returncode == 0 and "stageTransfer" in cpp.stdout, "--emit=cpp of a stage layout",
           cpp.stderr)
    both = subprocess.run([binary, example, "--emit=cpp", "--function", "lm_train", *base,
                           "--recompute=decoder_layer"], capture_output=True, text=True, timeout=300)
    expect(both.returncode == 0 and "stageTransfer" in both.stdout and both.stdout != cpp.stdout,
           "--emit=cpp with --recompute and stages", both.stderr)

    # Each stage holds its own layers' params and optimizer state (ParamSpec's stage mask), as
    # the plan's balanced split places the layers: 8 layers on 4 stages, two each.
    for path, mask in [("decoder/decoder_layer[1]/ffn/w_in", "0x1"),
                       ("decoder/decoder_layer[2]/ffn/w_in@m", "0x2"),
                       ("decoder/decoder_layer[7]/ffn/w_in@v", "0x8"),
                       ("decoder/token_embedding", "0x1"), ("decoder/unembed", "0x8")]:
        spec = re.escape(f'{{"{path}",') + r'[^}]*,\s*' + mask + r',\s*"stage"\}'
        expect(re.search(spec, cpp.stdout) is not None, f"--emit=cpp: {path} held by stages {mask}")
    # A large head leaves the last stage fewer layers (tests/e2e/cases/stages_tied.mesh: the plan
    # gives stage 0 three of four layers), and code generation follows the plan.
    tied = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e", "cases",
                        "stages_tied.mesh")
    plan = subprocess.run([binary, tied, "--emit=plan", "--microbatches=batch=2"],
                          capture_output=True, text=True, timeout=300)
    split = subprocess.run([binary, tied, "--emit=cpp", "--microbatches=batch=2"],
                           capture_output=True, text=True, timeout=300)
    expect("0 (layers 0-2)" in plan.stdout and "1 (layer 3 + rest)" in plan.stdout,
           "stages_tied.mesh: the plan splits 3 + 1", plan.stdout + plan.stderr)
    flat = " ".join(split.stdout.split())
    expect('{"layer[2]/w", false, "f32", "d:16:16: e:16:16:", 0x1, "stage"}' in flat
           and '{"layer[3]/w", false, "f32", "d:16:16: e:16:16:", 0x2, "stage"}' in flat
           and '{"embedding", false, "f32", "vocab:512:512: d:16:16:"}' in flat,
           "stages_tied.mesh: layer 2 generated on stage 0, the tied embedding on both",
           split.stderr)


if __name__ == "__main__":
    main()
