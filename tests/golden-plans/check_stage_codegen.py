#!/usr/bin/env python3
"""Code generation for pipeline stages (docs/runtime.md "Pipeline stages in generated code"),
checked on `meshc --emit=kernels`, `--emit=cpp` and `--emit=plan`:

    check_stage_codegen.py <meshc> <transformer.mesh> <stages_tied.mesh>

- The update's scalar collectives do not grow with the stages: AdamW's global-norm clipping sums
  each stage's params' squares on that stage and one all-reduce over the stage axis adds them
  (merged into the all-reduce over `model` of the partial sums when there is one), so after the
  microbatches there is no stage transfer and exactly two collectives over the stage axis (the
  loss's accumulator and the norm's sum), on 2 and on 4 stages.
- Each stage's arena holds its own buffers: on stages_tied.mesh's 3 + 1 split the two stages'
  arenas differ, the larger is the kernel IR's arena, and the generated class sizes its arena by
  its stage.
- The layout pins a split (`layers: stage(1, 3)`): the plan reports and predicts it and the
  generated code places the layers so; a layer count the stages do not divide (5 over 2) is
  planned unevenly and generated as planned, pinned or not.
"""
import re
import subprocess
import sys


def run(binary, mesh_file, *args):
    proc = subprocess.run([binary, mesh_file, *args], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit(f"FAIL: meshc {mesh_file} {' '.join(args)} exited {proc.returncode}\n"
                 f"{proc.stderr}")
    return proc.stdout


def expect(ok, what, detail=""):
    if not ok:
        sys.exit(f"FAIL: {what}\n{detail}")
    print(f"ok   {what}")


COLLECTIVE = re.compile(r"^\s*\w*(?:reduce|gather|scatter)\w*(?:\.start)?(?: #\d+)? \[([^\]]*)\]",
                        re.M)


def update_traffic(kernels):
    """Stage transfers and collectives over the stage axis after the microbatch loop."""
    tail = kernels.split("end microbatches", 1)[1]
    transfers = len(re.findall(r"call stageTransfer", tail))
    over_stage = [axes for axes in COLLECTIVE.findall(tail)
                  if "stage" in [axis.strip() for axis in axes.split(",")]]
    return transfers, over_stage


def stage_masks(cpp):
    """Each param's stage mask in the generated ParamSpecs ("layer[2]/w" -> "0x1")."""
    flat = " ".join(cpp.split())
    return dict(re.findall(r'\{"([^"]+)", (?:true|false), "\w+", "[^"]*", (0x[0-9a-f]+), "stage"\}',
                           flat))


def main():
    binary, transformer, tied = sys.argv[1:4]
    common = ["--function", "lm_train", "--dim", "batch=8", "--microbatches=batch=4"]
    model = "heads: model, d_ff: model, vocab: model, layers: stage"
    for mesh, layout, layers, merged in [
            ("stage=2,model=2", model, 4, True),
            ("stage=4,model=2", model, 8, True),
            ("stage=2,data=2", "batch: data, layers: stage", 4, False)]:
        kernels = run(binary, transformer, "--emit=kernels", *common, f"--mesh={mesh}",
                      "--layout", layout, "--dim", f"layers={layers}")
        transfers, over_stage = update_traffic(kernels)
        expect(transfers == 0, f"[{mesh}]: no stage transfer in the update", f"{transfers}")
        want = ["stage", "stage,model" if merged else "stage"]
        expect(sorted(over_stage) == sorted(want),
               f"[{mesh}]: the update's collectives over the stage axis are {want}",
               f"got {over_stage}")

    # Without microbatches the step sends the carried activation forward, its gradient back and
    # the loss to the first stage; the global norm's scalars stay on their stages (19 transfers
    # before: one per param of stage 1 and the clip scale back).
    kernels = run(binary, transformer, "--emit=kernels", "--function", "lm_train", "--dim",
                  "batch=8", "--dim", "layers=4", "--mesh=stage=2,data=2", "--layout",
                  "batch: data, layers: stage")
    transfers = re.findall(r"# to the stages that read (\S+)\n\s*call stageTransfer", kernels)
    over_stage = [axes for axes in COLLECTIVE.findall(kernels)
                  if "stage" in [axis.strip() for axis in axes.split(",")]]
    expect(len(transfers) == 3 and "x" in transfers and "loss" in transfers and
           over_stage == ["stage"], "[stage=2, data=2] without microbatches: 3 transfers "
           "(activation, gradient, loss), the norm's sum all-reduced over the stages",
           f"{transfers} {over_stage}")

    # Per-stage arenas on the 3 + 1 split.
    tied_args = ["--microbatches=batch=2", "--pipeline-schedule=1f1b"]
    kernels = run(binary, tied, "--emit=kernels", *tied_args)
    arena = int(re.search(r"arena (\d+) bytes for", kernels).group(1))
    per_stage = [int(x) for x in
                 re.search(r"arena per stage: ([\d, ]+) bytes", kernels).group(1).split(", ")]
    expect(len(per_stage) == 2 and max(per_stage) == arena and min(per_stage) < arena,
           f"stages_tied.mesh: arenas per stage {per_stage}, the larger the arena's {arena}")
    expect(re.search(r"arena f32\[\d+\] @\d+ on stages 0x1", kernels) is not None and
           re.search(r"arena f32\[\d+\] @\d+ on stages 0x2", kernels) is not None,
           "stages_tied.mesh: buffers held on one stage each")
    header = run(binary, tied, "--emit=cpp", *tied_args)
    expect(f"kStageArenaBytes[] = {{{per_stage[0]}, {per_stage[1]}}}" in header and
           "arena_{kStageArenaBytes[stage_]}" in header,
           "stages_tied.mesh: the generated class sizes its arena by its stage")

    # A pinned split, against the plan's 3 + 1.
    pinned = ["--layout", "layers: stage(1, 3)", "--microbatches=batch=2"]
    plan = run(binary, tied, "--emit=plan", *pinned)
    expect("0 (layer 0)" in plan and "1 (layers 1-3 + rest)" in plan and
           "as the layout pins them (1, 3)" in plan,
           "layers: stage(1, 3): the plan splits 1 + 3", plan)
    masks = stage_masks(run(binary, tied, "--emit=cpp", *pinned))
    expect(masks.get("layer[0]/w") == "0x1" and masks.get("layer[1]/w") == "0x2" and
           masks.get("layer[3]/w") == "0x2",
           "layers: stage(1, 3): layer 0 generated on stage 0, layers 1-3 on stage 1", f"{masks}")
    ir = run(binary, tied, "--emit=ir", *pinned)
    expect("layers: [stage](1, 3)" in ir, "layers: stage(1, 3) in the IR's layout")

    # Five layers over two stages: balanced by the plan, or pinned.
    for layout, want in [("layers: stage", None), ("layers: stage(2, 3)", [2, 3])]:
        args = ["--dim", "layers=5", "--layout", layout, "--microbatches=batch=2"]
        plan = run(binary, tied, "--emit=plan", *args)
        split = [int(first) for first in re.findall(r"^\s+\d+ \(layers? (\d+)", plan, re.M)]
        expect(len(split) == 2 and split[0] == 0 and (want is None or split[1] == want[0]),
               f"5 layers, {layout}: two stages, stage 1 from layer {split[1:]}", plan)
        masks = stage_masks(run(binary, tied, "--emit=cpp", *args))
        got = [sum(1 for layer in range(5) if masks.get(f"layer[{layer}]/w") == f"0x{s + 1}")
               for s in range(2)]
        expect(got == [split[1], 5 - split[1]],
               f"5 layers, {layout}: the generated code places {got} layers as the plan does",
               f"{masks}")


if __name__ == "__main__":
    main()
