#!/usr/bin/env python3
"""Partial sums read several times (issue 15, item 5), as exact collective counts and bytes of
`meshc --emit=plan-json` on the 8xh100 machine:

decoder <meshc> <rmsnorm_decoder.mesh>: the bias-free pre-RMS-norm decoder (rms_lm) on its own
    [data=1, model=4] mesh resolves as many forward partial sums as its layer_norm twin (ln_lm):
    Megatron's 2 per layer plus one for the final norm, each of one [batch, seq, d_model]
    activation. Resolving the residual stream once per norm for the mean square and again for
    the scaled value would be twice as many. Under sequence parallelism (SequenceParallel.h)
    each is a reduce-scatter of the batch rows (the norms and residual adds run on a quarter of
    them) and one all-gather brings each norm's rows back for the einsums that read it.
bias <meshc> <megatron_block.mesh>: a Megatron block trained on an input activation: its first
    norm's output gradient, a partial sum over `model` read only by the gain's and bias's
    gradients, is summed before it is resolved: one all-reduce of 2 x 32 KiB over [data, model]
    instead of one of the 128 MiB activation over [model].
"""
import json
import subprocess
import sys


def plan(meshc, example, *args):
    proc = subprocess.run([meshc, example, "--emit=plan-json", "--machine", "8xh100", *args],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit(f"FAIL: meshc exited {proc.returncode}\n{proc.stderr}")
    return {f["function"]: f for f in json.loads(proc.stdout)}


def summary(function, phase):
    """(kind, axes, bytes) of each collective of one phase, in plan order."""
    return [(c["kind"], c["axes"], c["bytes"]) for c in function["collectives"]
            if c["phase"] == phase]


def expect(actual, expected, what):
    if actual != expected:
        sys.exit(f"FAIL: {what}\n  expected {expected}\n  actual   {actual}")


def decoder(meshc, example):
    functions = plan(meshc, example, "--function", "rms_lm", "--function", "ln_lm")
    activation = 4 * 8 * 32 * 4  # f32[batch=4, seq=8, d_model=32], replicated over model
    layers = 2
    expected = [("reduce_scatter", ["model"], activation),
                ("all_gather", ["model"], activation)] * (2 * layers + 1)
    expect(summary(functions["ln_lm"], "forward"), expected, "ln_lm's forward collectives")
    expect(summary(functions["rms_lm"], "forward"), expected,
           "rms_lm's forward collectives (as many as its layer_norm twin's)")
    print("ok")


def bias(meshc, example):
    block = plan(meshc, example)["block"]
    activation = 4 * 1024 * 8192 * 4  # f32[batch=8/2, seq=1024, d_model=8192]: 128 MiB
    d_model = 8192 * 4                 # a norm's gain or bias: 32 KiB
    heads_weight = 8192 * 16 * 128 * 4  # w_q, w_k, w_v, w_o with heads split over model
    ffn_weight = 8192 * 8192 * 4        # w_in, w_out with d_ff split over model
    expect(summary(block, "forward"), [("all_reduce_sum", ["model"], activation)] * 2,
           "the forward collectives (Megatron's 2)")
    expect(summary(block, "backward"), [
        # The second norm's output gradient, resolved once for layer_norm's backward (whose
        # input gradient the attention's output projection needs) and for its gain and bias.
        ("all_reduce_sum", ["model"], activation),
        # The first norm's gain and bias gradients, summed over batch and seq first.
        ("bucketed_all_reduce_sum", ["data", "model"], 2 * d_model),
        *[("all_reduce_sum", ["data"], heads_weight)] * 4,
        # The small gradients (the second norm's gain and bias, the FFN's biases, 8192 values
        # each) and the loss, data parallel.
        ("bucketed_all_reduce_sum", ["data"], 4 * d_model + 4),
        *[("all_reduce_sum", ["data"], ffn_weight)] * 2,
    ], "the backward collectives")
    expect(summary(block, "update"), [], "the update's collectives")
    print("ok")


if __name__ == "__main__":
    {"decoder": decoder, "bias": bias}[sys.argv[1]](sys.argv[2], sys.argv[3])
