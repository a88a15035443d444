#!/usr/bin/env python3
"""ZeRO sharding (issue 14, item 4; docs/planner.md "ZeRO") as exact collective kinds, counts and
bytes of `meshc --emit=plan-json` on the 8xh100 machine, for mlp.mesh's mlp_train (SGD with
momentum, global-norm clipping) on [data=4] with `batch: data`: its three weights, ffn/w_in
f32[d_model=64, d_ff=256], ffn/b_in f32[d_ff=256] and ffn/w_out f32[d_ff=256, d_model=64], are
data parallel over `data`, and each shards along d_ff (its largest dim, divisible by 4).

stage1 <meshc> <mlp.mesh>: each gradient is reduce-scattered (not all-reduced: no bucketed
    gradient all-reduce is left) and each new weight all-gathered in the update; the momentum
    is stored split, the weights whole.
stage3 <meshc> <mlp.mesh>: the weights are stored split too: each is all-gathered in forward
    before its use, w_out again in backward (the input gradient of its einsum reads it), and
    nothing is gathered in the update.
auto <meshc> <mlp.mesh>: without --zero, under a --memory-budget that no layout fits without ZeRO
    (mlp_train needs 644 KiB), the planner picks the smallest stage that fits and says so: stage
    1 under 600 KiB (it needs 402.5 KiB), stage 3 under 300 KiB (228.5 KiB); under 200 KiB none
    fits: the error of the plain layout, and a note with what stage 3 would need.
errors <meshc> <mlp.mesh>: bad --zero values are rejected with a message naming the option.
"""
import json
import subprocess
import sys

W_IN = 64 * 256 * 4   # bytes of ffn/w_in, and of ffn/w_out
B_IN = 256 * 4        # ffn/b_in
SHARDS = 4


def plan(meshc, example, *args):
    proc = subprocess.run([meshc, example, "--emit=plan-json", "--machine", "8xh100",
                           "--function", "mlp_train", "--mesh", "data=4", "--layout", "batch:data",
                           *args], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit(f"FAIL: meshc exited {proc.returncode}\n{proc.stderr}")
    return json.loads(proc.stdout)[0]


def collectives(function, phase):
    """(kind, axes, dim, bytes) of each collective of one phase, in plan order."""
    return [(c["kind"], c["axes"], c.get("dim", ""), c["bytes"]) for c in function["collectives"]
            if c["phase"] == phase]


def local_shapes(function):
    return {t["name"]: t["localShape"] for t in function["tensors"] if t["role"] != "input"}


def expect(actual, expected, what):
    if actual != expected:
        sys.exit(f"FAIL: {what}\n  expected {expected}\n  actual   {actual}")


def check_common(function, stage):
    zero = function["zero"]
    expect(zero["stage"], stage, "the reported stage")
    expect([(w["path"], w["dim"], w["axes"]) for w in zero["weights"]],
           [("ffn/w_in", "d_ff", ["data"]), ("ffn/b_in", "d_ff", ["data"]),
            ("ffn/w_out", "d_ff", ["data"])], "the sharded weights")
    total = 2 * W_IN + B_IN
    expect(zero["before"], {"paramBytes": total, "gradientBytes": total, "optimizerBytes": total},
           "memory before ZeRO")
    return zero, total


def stage1(meshc, example):
    function = plan(meshc, example, "--zero=1")
    zero, total = check_common(function, 1)
    expect(zero["after"], {"paramBytes": total, "gradientBytes": total,
                           "optimizerBytes": total // SHARDS}, "memory after ZeRO-1")
    # The three gradients, reduce-scattered as the update reads them (the n of a reduce-scatter
    # is its input, the whole gradient); then the loss and the clipping's sum of shard squares
    # (partial over data) all-reduced in one buffer.
    expect(collectives(function, "backward"), [
        ("reduce_scatter", ["data"], "d_ff", W_IN),
        ("reduce_scatter", ["data"], "d_ff", B_IN),
        ("reduce_scatter", ["data"], "d_ff", W_IN),
        ("bucketed_all_reduce_sum", ["data"], "", 8),
    ], "ZeRO-1's backward collectives")
    expect(collectives(function, "update"), [
        ("all_gather", ["data"], "d_ff", W_IN),
        ("all_gather", ["data"], "d_ff", B_IN),
        ("all_gather", ["data"], "d_ff", W_IN),
    ], "ZeRO-1's update collectives (the new weights gathered back)")
    expect(collectives(function, "forward"), [], "ZeRO-1's forward collectives")
    shapes = local_shapes(function)
    expect(shapes["ffn/w_in"], "f32[d_model=64, d_ff=256]", "ffn/w_in's local shape (whole)")
    expect(shapes["ffn/w_in@momentum"], "f32[d_model=64, d_ff=64]", "its momentum's local shape (split)")
    expect((zero["reduceScatters"], zero["reduceScatterBytes"], zero["allGathers"],
            zero["allGatherBytes"]), (3, total, 3, total), "ZeRO-1's traffic")
    print("ok")


def stage3(meshc, example):
    function = plan(meshc, example, "--zero=3")
    zero, total = check_common(function, 3)
    shard = total // SHARDS
    expect(zero["after"], {"paramBytes": shard, "gradientBytes": shard, "optimizerBytes": shard},
           "memory after ZeRO-3")
    expect(collectives(function, "forward"), [
        ("all_gather", ["data"], "d_ff", W_IN),
        ("all_gather", ["data"], "d_ff", B_IN),
        ("all_gather", ["data"], "d_ff", W_IN),
    ], "ZeRO-3's forward collectives (each weight gathered before its use)")
    expect(collectives(function, "backward"), [
        ("all_gather", ["data"], "d_ff", W_IN),  # w_out again, for the input gradient
        ("reduce_scatter", ["data"], "d_ff", W_IN),
        ("reduce_scatter", ["data"], "d_ff", B_IN),
        ("reduce_scatter", ["data"], "d_ff", W_IN),
        ("bucketed_all_reduce_sum", ["data"], "", 8),
    ], "ZeRO-3's backward collectives")
    expect(collectives(function, "update"), [], "ZeRO-3's update collectives")
    shapes = local_shapes(function)
    expect(shapes["ffn/w_in"], "f32[d_model=64, d_ff=64]", "ffn/w_in's local shape (split)")
    expect(shapes["ffn/w_out@momentum"], "f32[d_ff=64, d_model=64]", "ffn/w_out's momentum's local shape (split)")
    expect((zero["reduceScatters"], zero["allGathers"], zero["allGatherBytes"]),
           (3, 4, total + W_IN), "ZeRO-3's traffic")
    if not zero["totalBytesAfter"] < zero["totalBytesBefore"]:
        sys.exit(f"FAIL: ZeRO-3's plan needs {zero['totalBytesAfter']} bytes, "
                 f"not less than the {zero['totalBytesBefore']} without it")
    print("ok")


def auto(meshc, example):
    plain = plan(meshc, example, "--memory-budget", "1MiB")
    expect("zero" in plain, False, "a ZeRO section when the plain layout fits")
    for budget, stage in [("600KiB", 1), ("300KiB", 3)]:
        function = plan(meshc, example, "--memory-budget", budget)
        expect((function["zero"]["stage"], function["zero"]["chosen"]), (stage, True),
               f"the stage chosen under {budget}")
        if function["memory"]["totalBytes"] > function["memory"]["budgetBytes"]:
            sys.exit(f"FAIL: the plan chosen under {budget} does not fit it")
    proc = subprocess.run([meshc, example, "--emit=plan", "--machine", "8xh100", "--function",
                           "mlp_train", "--mesh", "data=4", "--layout", "batch:data",
                           "--memory-budget", "200KiB"], capture_output=True, text=True, timeout=300)
    expect(proc.returncode, 1, "meshc's exit status when no stage fits")
    for message in ["error: the layout of train block 'mlp_train' needs 644.0 KiB per device, "
                    "over the memory budget of 200.0 KiB",
                    "note: with ZeRO stage 3, train block 'mlp_train' needs 228.5 KiB per device"]:
        expect(message in proc.stderr, True, f"{message!r} in {proc.stderr!r}")
    print("ok")


def errors(meshc, example):
    for bad in ["4", "-1", "x", "1.5", ""]:
        proc = subprocess.run([meshc, example, "--emit=plan", f"--zero={bad}"],
                              capture_output=True, text=True, timeout=300)
        if bad == "":  # an empty value is no option at all: the plan without ZeRO
            expect((proc.returncode, "ZeRO stage" in proc.stdout), (0, False), "--zero=")
            continue
        expect(proc.returncode, 1, f"meshc's exit status for --zero={bad}")
        expect(f"error: --zero must be 0, 1, 2 or 3 (the ZeRO stage), not '{bad}'" in proc.stderr,
               True, f"the message for --zero={bad}: {proc.stderr!r}")
    print("ok")


if __name__ == "__main__":
    {"stage1": stage1, "stage3": stage3, "auto": auto, "errors": errors}[sys.argv[1]](sys.argv[2], sys.argv[3])
