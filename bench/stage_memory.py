#!/usr/bin/env python3
"""The pipeline model's activations and gradients per stage against the generated code's arena
(docs/runtime.md "Pipeline stages in generated code"): for each case, `meshc --emit=plan-json`
of a stage layout reports both, the model's `gradient_bytes + activation_bytes` and the code's
`code_arena_bytes` (the step lowered as --emit=cpp lowers it); this prints their ratio per
stage. No timing: the figures are exact and do not depend on the machine's load.

usage: bench/stage_memory.py [--build-dir build]"""
import argparse
import json
import os
import subprocess
import tempfile

import benchlib

TIED = os.path.join(benchlib.ROOT, "tests", "e2e", "cases", "stages_tied.mesh")
TRANSFORMER = os.path.join(benchlib.ROOT, "dsl-examples", "transformer.mesh")


def cases(untied):
    lm = ["--function", "lm_train", "--dim", "batch=8"]
    return [
        ("stages_tied, 3 + 1, 1F1B, 2 microbatches", TIED, ["--microbatches=batch=2"]),
        ("stages_tied untied, 3 + 1", untied,
         ["--microbatches=batch=2", "--layout", "layers: stage(3, 1)"]),
        ("stages_tied untied, 2 + 2, 4 microbatches", untied,
         ["--microbatches=batch=4", "--layout", "layers: stage(2, 2)"]),
        ("transformer [stage=2, data=2], 4 layers, 4 microbatches, GPipe", TRANSFORMER,
         lm + ["--dim", "layers=4", "--mesh", "stage=2,data=2", "--layout",
               "batch: data, layers: stage", "--microbatches=batch=4",
               "--pipeline-schedule=gpipe"]),
        ("transformer [stage=2, data=2], 4 layers, 4 microbatches, 1F1B", TRANSFORMER,
         lm + ["--dim", "layers=4", "--mesh", "stage=2,data=2", "--layout",
               "batch: data, layers: stage", "--microbatches=batch=4"]),
        ("the same, --recompute=decoder_layer", TRANSFORMER,
         lm + ["--dim", "layers=4", "--mesh", "stage=2,data=2", "--layout",
               "batch: data, layers: stage", "--microbatches=batch=4",
               "--recompute=decoder_layer"]),
        ("transformer [stage=4], 4 layers, 1F1B", TRANSFORMER,
         lm + ["--dim", "layers=4", "--mesh", "stage=4", "--layout", "layers: stage",
               "--microbatches=batch=4"]),
        ("transformer [stage=4], 8 layers, GPipe, recompute", TRANSFORMER,
         lm + ["--dim", "layers=8", "--mesh", "stage=4", "--layout", "layers: stage",
               "--microbatches=batch=4", "--recompute=decoder_layer",
               "--pipeline-schedule=gpipe"]),
        ("transformer [stage=2, data=2, model=2], 8 layers, 2 microbatches", TRANSFORMER,
         lm + ["--dim", "layers=8", "--mesh", "stage=2,data=2,model=2", "--layout",
               "batch: data, heads: model, d_ff: model, vocab: model, layers: stage",
               "--microbatches=batch=2"]),
        ("stages_tied, 2 + 2, GPipe, 4 microbatches", TIED,
         ["--microbatches=batch=4", "--layout", "layers: stage(2, 2)",
          "--pipeline-schedule=gpipe"]),
        ("stages_tied, GPipe, 2 microbatches, --recompute=layer", TIED,
         ["--microbatches=batch=2", "--pipeline-schedule=gpipe", "--recompute=layer"]),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", default=os.path.join(benchlib.ROOT, "build"))
    args = parser.parse_args()
    meshc = os.path.join(args.build_dir, "compiler", "tools", "meshc")
    with open(TIED) as f:
        untied_source = f.read().replace(' as "embedding"', "")
    with tempfile.TemporaryDirectory() as work:
        untied = os.path.join(work, "stages_untied.mesh")
        with open(untied, "w") as f:
            f.write(untied_source)
        rows = []
        for what, source, extra in cases(untied):
            out = subprocess.run([meshc, source, "--emit=plan-json", *extra], check=True,
                                 capture_output=True, text=True).stdout
            stages = json.loads(out)[0]["pipeline"]["stages"]
            ratios = [(s["gradient_bytes"] + s["activation_bytes"]) / s["code_arena_bytes"]
                      for s in stages]
            rows.append((what, ", ".join(f"{r:.2f}" for r in ratios)))
    benchlib.print_table(rows, ("case", "model / code arena, per stage"))


if __name__ == "__main__":
    main()
