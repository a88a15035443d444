#!/usr/bin/env python3
"""The collectives a train step issues (issue 12, item 3), as exact lists of `meshc
--emit=plan-json` (kind, axes, bytes per phase, after merging: what the generated code issues):

lm_train <meshc> <transformer.mesh>: transformer.mesh's lm_train on [data=2, model=2] at the
    sizes of bench/lm_sharded.py issues 14 collectives, 2 of them scalar (the loss's numerator
    and denominator in one, the gradient norm's sum of squares): the forward's and backward's
    Megatron all-reduces (embedding, 2 per layer, the unembedding's input gradient),
    log_softmax's row statistics in one all-gather, one gradient bucket over data. The log_softmax
    backward's sum of the cross-entropy's one-hot cotangent needs no all-reduce (Autodiff's
    one-hot pick), and the row max and sum of exp are not two dependent all-reduces.
adafactor <meshc> <moe.mesh|t5.mesh>: moe_train's (t5_train's) Adafactor update on
    [data=2, model=2]: one collective per group. The gradients in one bucket over data; over
    model one bucket of the factored statistics (the row and column means of g^2 of every weight
    whose averaged dim is split), the weights' sums of squares and the updates' sums of squares
    for their RMS clipping: the mean of u^2 is summed over the split factored dim first, divided
    by the statistic that keeps that dim (train/Optimizer.cpp), so it does not wait for the
    resolved statistics. moe's weights split their column dim (w_gate's experts) or a leading
    one; t5's split their row dim too (w_out's d_ff, the embedding's vocab), which its layout
    pins, so the sums run over rows first there.
adafactor_auto <meshc> <t5.mesh>: t5_train on [2, 2] with `d_ff: auto` in --layout and a memory
    budget of 350 KiB (the replicated d_ff needs 361 KiB; the same happens at d_ff 2048 without
    one): the search splits d_ff over model, a factored dim that the layout the training phase saw
    does not pin; w_out's clipping sum, ordered over its columns (d_model) first there, is turned
    to its rows (d_ff) by the planner (train/OrderFactoredSums.h), so the update still takes one
    collective per group and the step exactly the collectives of t5's own layout (23; before the
    planner ordered the sums: 24, a second round over model in the update).
adafactor_both <meshc> <moe.mesh>: moe_train on [2, 2] with `d_model: data, d_ff: model`, both
    factored dims of the experts' w_in and w_out split: the sums run over rows first, 16
    collectives (17 with columns first); the update then takes two rounds after the statistics
    (docs/planner.md, "Merged all-reduces").
lm <meshc> <transformer.mesh>: transformer.mesh's lm forward on [data=2, model=2] at the sizes
    of bench/lm_sharded.py, on the cpu machine: sequence parallelism (planner/SequenceParallel.h).
    Each of the 5 partial sums over model (the embedding's, 2 per layer) is a reduce-scatter of
    the batch rows (batch/2 = 4 rows per data rank, 2 per model rank), the residual adds and layer
    norms run on the rank's 2 rows, and 5 all-gathers bring a norm's rows back for the einsums
    reading it (each layer's attention and FFN, the unembedding); the train step keeps the
    all-reduces (lm_train above).
t5_8xh100 <meshc> <t5.mesh>: t5_train on --machine 8xh100 [data=2, model=2] issues exactly the
    collectives it issues on cpu (23: 8 forward and 7 backward Megatron all-reduces over model,
    the relative position bias's all-gather, 6 buckets over model, one gradient bucket over
    data) and its optimizer one per group. A small partial sum costs the same as an all-reduce
    and as a reduce-scatter plus an all-gather there (2a + 2bn either way); the reshard planner
    takes such near-ties by fewer steps (planner/Reshard.cpp), or every factored statistic would
    be resolved by an unmergeable pair (191 collectives).
"""
import json
import os
import re
import subprocess
import sys

from check_partial_sums import expect, summary

# bench/lm_sharded.py's sizes.
BENCH_SIZES = {"batch": 8, "seq": 128, "mem": 128, "d_model": 256, "heads": 4, "d_head": 64,
               "d_ff": 1024, "vocab": 512, "layers": 2}


def plan(meshc, example, *args):
    proc = subprocess.run([meshc, example, "--emit=plan-json", *args], capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit(f"FAIL: meshc exited {proc.returncode}\n{proc.stderr}")
    return {f["function"]: f for f in json.loads(proc.stdout)}


def local_bytes(shape):
    """Bytes of a local shape as plan-json prints it: "f32[batch=4, seq=128]"."""
    match = re.fullmatch(r"(\w+)\[(.*)\]", shape)
    size = {"f32": 4, "i32": 4, "bf16": 2, "f16": 2}[match.group(1)]
    for extent in filter(None, match.group(2).split(", ")):
        size *= int(extent.split("=")[1])
    return size


def lm_train(meshc, example):
    dims = [f"--dim={name}={size}" for name, size in BENCH_SIZES.items()]
    step = plan(meshc, example, "--mesh", "data=2,model=2", "--function", "lm_train", *dims)
    step = step["lm_train"]
    activation = 4 * 128 * 256 * 4  # f32[batch=8/2, seq, d_model], replicated over model
    rows = 4 * 128                  # log_softmax's rows per rank
    layers = BENCH_SIZES["layers"]
    expect(summary(step, "forward"), [
        *[("all_reduce_sum", ["model"], activation)] * (1 + 2 * layers),
        # Every rank's (max, sum of exp) per row, two doubles, from both ranks of the group.
        ("all_gather", ["model"], rows * 2 * 8 * 2),
        ("bucketed_all_reduce_sum", ["data", "model"], 2 * 4),  # the loss's two sums
    ], "lm_train's forward collectives")
    weights = sum(local_bytes(t["localShape"]) for t in step["tensors"]
                  if t["role"] == "param" and "@" not in t["name"])
    expect(summary(step, "backward"), [
        *[("all_reduce_sum", ["model"], activation)] * (1 + 2 * layers),
        ("bucketed_all_reduce_sum", ["data"], weights),  # every gradient, data parallel
        ("all_reduce_sum", ["model"], 4),  # the gradient norm's sum of squares
    ], "lm_train's backward collectives")
    expect(summary(step, "update"), [], "lm_train's update collectives")
    scalar = [c for c in step["collectives"]
              if c["operandShape"] == "f32[]" and c["bytes"] == 4 * len(c["operands"])]
    expect((len(step["collectives"]), len(scalar)), (14, 2),
           "lm_train's collectives and scalar ones (issue 12: at most JAX's 14, 2 scalar)")


def lm(meshc, example):
    dims = [f"--dim={name}={size}" for name, size in BENCH_SIZES.items()]
    forward = plan(meshc, example, "--mesh", "data=2,model=2", "--function", "lm", *dims)["lm"]
    activation = 4 * 128 * 256 * 4  # f32[batch=8/2, seq, d_model]: the bytes before scattering
    layers = BENCH_SIZES["layers"]
    pair = [("reduce_scatter", ["model"], activation), ("all_gather", ["model"], activation)]
    expect(summary(forward, "forward"), pair * (1 + 2 * layers), "lm's forward collectives")
    expect({c["dim"] for c in forward["collectives"]}, {"batch"}, "the rows split")
    scattered = [c["resultShape"] for c in forward["collectives"] if c["kind"] == "reduce_scatter"]
    expect(scattered, ["f32[batch=2, seq=128, d_model=256]"] * (1 + 2 * layers),
           "each rank's rows after a reduce-scatter")


def adafactor(meshc, example, *options):
    name = os.path.basename(example)
    function = {"moe.mesh": "moe_train", "t5.mesh": "t5_train"}[name]
    with open(example) as source:  # the optimizer's collectives carry its `minimize` line
        line = next(number for number, text in enumerate(source, 1)
                    if "minimize loss with adafactor" in text)
    step = plan(meshc, example, "--mesh", "data=2,model=2", "--function", function,
                *options)[function]
    optimizer = [c for c in step["collectives"]
                 if (c["location"]["file"], c["location"]["line"]) == (name, line)]
    by_group = {}
    for c in optimizer:
        by_group.setdefault(tuple(c["axes"]), []).append((c["kind"], c["phase"]))
    expect(by_group, {
        ("data",): [("bucketed_all_reduce_sum", "backward")],
        # The statistics, the weights' and the updates' sums of squares of every weight.
        ("model",): [("bucketed_all_reduce_sum", "backward")],
    }, f"{function}'s optimizer collectives per group")
    return step


def layout_of(step):
    """dim -> (axes, source) of the dims a plan splits."""
    return {entry["dim"]: (entry["axes"], entry["source"]) for entry in step["layout"]
            if entry["axes"]}


def adafactor_auto(meshc, example):
    step = adafactor(meshc, example, "--memory-budget", "350KiB", "--layout",
                     "batch: data, heads: model, d_ff: auto, vocab: model")
    expect(layout_of(step)["d_ff"], (["model"], "searched"), "the search splits d_ff")
    expect(counts(step), T5_2X2, "t5_train's collectives with d_ff: auto on [2, 2]")
    expect(len(step["collectives"]), 23, "t5_train's collectives with d_ff: auto on [2, 2]")


def adafactor_both(meshc, example):
    step = plan(meshc, example, "--mesh", "data=2,model=2", "--function", "moe_train",
                "--layout", "d_model: data, d_ff: model")["moe_train"]
    # The norm over d_model (split over data): its backward is one layer_norm_grad, whose own
    # all-reduce sums x, x^2, ct and ct x per row at once. Before it (autodiff's means), the
    # recomputed mean of x was bucketed with two forward partial sums and the other three means
    # with each other: the same 16 collectives, grouped otherwise.
    expect(counts(step), {
        ("all_reduce_sum", ("data",), "forward"): 5,
        ("bucketed_all_reduce_sum", ("data",), "forward"): 1,
        ("all_reduce_sum", ("model",), "forward"): 2,
        ("all_reduce_sum", ("data",), "backward"): 1,
        ("bucketed_all_reduce_sum", ("data",), "backward"): 3,
        ("bucketed_all_reduce_sum", ("model",), "backward"): 2,
        # Rows first: the update's last sums, after the statistics: one all-reduce over model
        # and one bucket over both axes (with columns first: one more, over data).
        ("all_reduce_sum", ("model",), "update"): 1,
        ("bucketed_all_reduce_sum", ("data", "model"), "update"): 1,
    }, "moe_train's collectives with both factored dims of its expert weights split")
    expect(len(step["collectives"]), 16, "moe_train's collectives, both factored dims split")


# t5_train's collectives on [data=2, model=2] under its own layout, (kind, axes, phase): count:
# 8 forward and 7 backward Megatron all-reduces over model, the relative position bias's
# all-gather, 6 buckets over model, one gradient bucket over data.
T5_2X2 = {
    ("all_reduce_sum", ("model",), "forward"): 8,
    ("all_gather", ("model",), "forward"): 1,
    ("bucketed_all_reduce_sum", ("model",), "forward"): 2,
    ("all_reduce_sum", ("model",), "backward"): 7,
    ("bucketed_all_reduce_sum", ("model",), "backward"): 4,
    ("bucketed_all_reduce_sum", ("data",), "backward"): 1,
}


def counts(step):
    """How many collectives of each (kind, axes, phase) a plan issues."""
    tally = {}
    for c in step["collectives"]:
        key = (c["kind"], tuple(c["axes"]), c["phase"])
        tally[key] = tally.get(key, 0) + 1
    return tally


def t5_8xh100(meshc, example):
    step = adafactor(meshc, example, "--machine", "8xh100")
    expect(counts(step), T5_2X2,
           "t5_train's collectives on 8xh100 [2, 2] (kind, axes, phase: count)")
    expect(len(step["collectives"]), 23, "t5_train's collectives on 8xh100 [2, 2]")
    cpu = adafactor(meshc, example, "--machine", "cpu")
    expect(counts(step), counts(cpu), "t5_train's collectives on 8xh100 and on cpu")


if __name__ == "__main__":
    {"lm_train": lm_train, "adafactor": adafactor, "adafactor_auto": adafactor_auto,
     "adafactor_both": adafactor_both, "t5_8xh100": t5_8xh100, "lm": lm}[sys.argv[1]](sys.argv[2],
                                                                           sys.argv[3])
    print("ok")
