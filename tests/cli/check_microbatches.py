#!/usr/bin/env python3
"""meshc --microbatches DIM=K (docs/training.md, "Microbatching"): the option's errors, the plan
report's line, the kernel IR's microbatch loop, and `meshc run --microbatches --check` against
the interpreter's whole batch. `check_microbatches.py <meshc> <case>` runs one case; ctest runs
each case as its own test (the training equivalence over 20 steps is e2e.train.microbatch.*)."""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP = os.path.join(ROOT, "dsl-examples", "mlp.mesh")  # batch 32 split over data (2)
STEP_STATE = os.path.join(ROOT, "tests", "golden", "step_state.mesh")


# A scalar step state fed by the loss: computed once per step, after the microbatch loop, from
# the loss averaged over the microbatches, which is the whole batch's loss.
EMA_SOURCE = """dim batch = 8
dim d = 4
train ema_train(x: f32[batch, d]) -> (smoothed: f32[]) {
  state ema: f32[] = zeros()
  param w: f32[d] = normal(stddev = 0.5)
  let loss = mean(square(x * w))
  next ema = 0.9 * ema + 0.1 * loss
  smoothed = ema
  minimize loss with sgd(lr = 0.1)
}
"""
# A state fed by an activation: one value per microbatch, none for the step.
ACTIVATION_STATE_SOURCE = """dim batch = 8
dim d = 4
train state_train(x: f32[batch, d]) {
  state total: f32[] = zeros()
  param w: f32[d] = normal(stddev = 0.5)
  let y = x * w
  let loss = mean(square(y))
  next total = sum(y)
  minimize loss with sgd(lr = 0.1)
}
"""


def source_file(work, name, text):
    path = os.path.join(work, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def meshc(*args):
    return subprocess.run([MESHC, *args], capture_output=True, text=True, timeout=900)


def expect(condition, message, proc=None):
    if not condition:
        detail = f"\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}" if proc else ""
        sys.exit(f"FAIL: {message}{detail}")


def refused(args, message):
    proc = meshc(*args)
    expect(proc.returncode == 1 and proc.stdout == "" and "error: " in proc.stderr and
           message in proc.stderr, f"{' '.join(args[1:])} is refused with '{message}'", proc)


def errors():
    """Bad uses of the option: one clear `error:` each, exit 1, nothing on stdout."""
    plan = [MLP, "--emit=plan", "--mesh", "data=2,model=2"]
    refused(plan + ["--microbatches", "batch=3"],
            "--microbatches batch=3: 3 does not divide the extent of 'batch' per device, 16")
    refused(plan + ["--microbatches", "nope=2"], "--microbatches nope=2: no dim named 'nope'")
    refused(plan + ["--microbatches", "batch"],
            "--microbatches 'batch' is not of the form dim=count")
    refused(plan + ["--microbatches", "batch=0"],
            "--microbatches 'batch=0' is not of the form dim=count")
    refused(plan + ["--microbatches", "batch=2", "--function", "mlp"],
            "--microbatches applies to train blocks, and 'mlp' is a program")
    refused(plan + ["--microbatches", "d_ff=2", "--function", "mlp_train"],
            "no input of train block 'mlp_train' has the dim 'd_ff'")
    # A state over the batch would be split; a state's next value computed from the batch has no
    # one value per microbatch.
    refused([STEP_STATE, "--emit=kernels", "--microbatches", "batch=2"],
            "param 'xl_layer[0]/memory' of train block 'xl_train' has the dim 'batch'")
    with tempfile.TemporaryDirectory() as work:
        refused([source_file(work, "state.mesh", ACTIVATION_STATE_SOURCE), "--emit=kernels",
                 "--microbatches", "batch=2"],
                "cannot microbatch train block 'state_train': the update reads 'y', which is "
                "computed from the batch and is no gradient")
    # The same through meshc run (checked before anything is built).
    with tempfile.TemporaryDirectory() as cache:
        proc = meshc("run", MLP, "--function", "mlp_train", "--microbatches", "batch=5",
                     "--cache-dir", cache)
        expect(proc.returncode == 1 and "does not divide the extent of 'batch'" in proc.stderr,
               "meshc run refuses a count that does not divide the batch", proc)


def memory_of(report):
    """The plan report's memory lines: name -> bytes."""
    units = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}
    found = {}
    for name in ["gradients", "activations"]:
        match = re.search(rf"^  {name} +([0-9.]+) (B|KiB|MiB|GiB)", report, re.M)
        expect(match, f"the report has a {name} line")
        found[name] = float(match.group(1)) * units[match.group(2)]
    return found


def plan_report():
    """--emit=plan says how many microbatches, shows one microbatch's activations, adds the
    accumulators to the gradients and counts the collectives per step: the gradients' bucketed
    all-reduce leaves the loop (it runs once), the forward all-reduce over model stays in it."""
    # At batch 1024 the batch's activations dominate the peak (at 32, the update's temporaries of
    # the weights' size do, the same with microbatches or without).
    args = [MLP, "--emit=plan", "--function", "mlp_train", "--mesh", "data=2,model=2", "--dim",
            "batch=1024"]
    whole = meshc(*args)
    micro = meshc(*args, "--microbatches", "batch=4")
    expect(whole.returncode == 0 and micro.returncode == 0, "both plans succeed", micro)
    expect("microbatches" not in whole.stdout, "no microbatch line without the option", whole)
    line = re.search(r"^  microbatches  4 microbatches along batch per step: .*gradient "
                     r"accumulators ([0-9.]+ \w+) .*collectives per step (\d+) x 4 in the loop "
                     r"\+ (\d+) once$", micro.stdout, re.M)
    expect(line, "the report's microbatch line", micro)
    expect("batch=128," in micro.stdout and "batch=512," not in micro.stdout,
           "tensors are planned for one microbatch (1024 / 2 ranks / 4 = 128 rows)", micro)
    before, after = memory_of(whole.stdout), memory_of(micro.stdout)
    expect(after["activations"] < before["activations"] / 3,
           "one microbatch's activations are smaller than the whole batch's", micro)
    expect(after["gradients"] > before["gradients"],
           "the accumulators count with the gradients", micro)
    total = len(re.findall(r"^  \S+:\d+:\d+  ", whole.stdout, re.M))
    in_loop, once = int(line.group(2)), int(line.group(3))
    expect(in_loop + once == total, f"every collective of the plan is counted ({total})", micro)
    expect(in_loop >= 1 and once >= 2, "the bucket and the update's all-reduce run once", micro)


def kernel_ir():
    """The kernel IR: zeroed accumulators, then the loop (a slice of each input per microbatch,
    the forward and backward passes, `acc += value / 4`), then the gradients' all-reduce on the
    accumulators and the update; dropout and the noise draw at the whole batch's positions."""
    proc = meshc(MLP, "--emit=kernels", "--function", "mlp_train", "--mesh", "data=2,model=2",
                 "--microbatches", "batch=4")
    expect(proc.returncode == 0, "--emit=kernels succeeds", proc)
    run = proc.stdout[proc.stdout.index("run:\n"):]
    expect(run.count("microbatches 4 along batch:\n") == 1 and
           run.count("end microbatches\n") == 1, "one microbatch loop", proc)
    head, rest = run.split("microbatches 4 along batch:\n")
    loop, tail = rest.split("end microbatches\n")
    expect("# zero the accumulator of" in head, "accumulators are zeroed before the loop", proc)
    expect(len(re.findall(r"sliceDim\(.*block\[@microbatch\], 4\)", loop)) == 2,
           "each input (x, target) is sliced per microbatch in the loop", proc)
    expect(len(re.findall(r"# accumulate .* / 4", loop)) >= 4,
           "the loss and the three gradients accumulate in the loop", proc)
    expect(re.search(r"\+microbatch", loop), "random draws at the whole batch's positions", proc)
    expect(re.search(r"^  bucketed_all_reduce_sum\S* .*\[data\]( acc_\w+){4}$", tail, re.M),
           "the loss's and gradients' all-reduce over data runs once, after the loop, on the "
           "four accumulators", proc)
    expect(not re.search(r"all_reduce\S* .*\[data\]", loop),
           "no all-reduce over data in the loop", proc)
    expect(re.search(r"^  all_reduce_sum\S* .*\[model\]", loop, re.M),
           "the forward all-reduce over model stays in the loop", proc)
    expect("= step :" in tail and "= step :" not in loop, "the update runs after the loop", proc)


def run_check():
    """`meshc run --microbatches` builds the microbatched step and --check compares 3 steps'
    losses and final params with the interpreter's whole-batch training."""
    with tempfile.TemporaryDirectory() as cache:
        proc = meshc("run", MLP, "--function", "mlp_train", "--mesh", "data=2,model=2",
                     "--microbatches", "batch=4", "--steps", "3", "--check", "--cache-dir",
                     cache, "--opt=-O1")
        expect(proc.returncode == 0, "meshc run --microbatches --check succeeds", proc)
        for text in ["4 microbatches along batch", "step 2 loss", "ok   mlp_train.loss",
                     "ok   mlp_train.param.ffn/w_in"]:
            expect(text in proc.stdout, f"meshc run prints '{text}'", proc)
        # A step state computed from the loss: after the loop, from the averaged loss.
        ema = source_file(cache, "ema.mesh", EMA_SOURCE)
        proc = meshc("run", ema, "--microbatches", "batch=2", "--steps", "3", "--check",
                     "--cache-dir", cache, "--opt=-O1")
        expect(proc.returncode == 0 and "ok   ema_train.param.ema" in proc.stdout and
               "ok   ema_train.smoothed" in proc.stdout,
               "a state fed by the loss matches the whole batch's", proc)


def split_bucket():
    """t5 on [data=2, model=2]: the planner merges its RMS norms' partial sums over `model` with
    the clipping norm's (a bucket across the loop and the update). Microbatched, the bucket is
    split: the update's part runs after the loop (its own all-reduce, in the update), and the
    step builds, runs and matches the interpreter's whole-batch training."""
    t5 = os.path.join(ROOT, "dsl-examples", "t5.mesh")
    whole = meshc(t5, "--emit=plan", "--mesh", "data=2,model=2", "--function", "t5_train")
    expect(whole.returncode == 0 and "the update's part of a bucket" not in whole.stdout,
           "without microbatches the bucket stays merged", whole)
    plan = meshc(t5, "--emit=plan", "--mesh", "data=2,model=2", "--function", "t5_train",
                 "--microbatches", "batch=2")
    update = plan.stdout.split("collectives of the update ops")[-1].split("\nforced")[0]
    expect(plan.returncode == 0 and "the update's part of a bucket merged with the loop's" in
           update, "microbatched, the update's part of the bucket is an update collective", plan)
    with tempfile.TemporaryDirectory() as cache:
        proc = meshc("run", t5, "--function", "t5_train", "--microbatches", "batch=2", "--steps",
                     "3", "--check", "--cache-dir", cache, "--opt=-O1")
    expect(proc.returncode == 0 and "ok   t5_train.loss" in proc.stdout and
           "FAIL" not in proc.stdout, "the split step matches the interpreter", proc)


CASES = {f.__name__: f for f in [errors, plan_report, kernel_ir, run_check, split_bucket]}

if __name__ == "__main__":
    MESHC = sys.argv[1]
    CASES[sys.argv[2]]()
    print("ok")
