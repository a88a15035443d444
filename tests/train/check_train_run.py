#!/usr/bin/env python3
"""`meshc <example> --emit=run --steps N --function <train block> --dump-outputs F` trains in the
interpreter on fresh synthetic batches (seed + step). Checks: one `step S loss L` line per step,
every loss finite, and the loss falls (the mean of the last five steps is under `ratio` times
that of the first five; ratio 0 skips this, for examples whose data has nothing to learn),
a second run prints the same losses (deterministic), and the dump holds the last loss and the
final value of every param, weights and optimizer state (`<fn>.param.<path>`).
Usage: check_train_run.py <meshc> <example.mesh> <train block> <steps> <ratio> <state slot>..."""
import math
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
from compare_outputs import read_outputs  # noqa: E402


def main():
    meshc, example, block, steps, ratio = sys.argv[1:6]
    slots = sys.argv[6:]
    steps, ratio = int(steps), float(ratio)
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "final.bin")
        args = [meshc, example, "--emit=run", "--steps", str(steps), "--function", block]
        first = subprocess.run(args + ["--dump-outputs", dump], capture_output=True, text=True,
                               timeout=600)
        if first.returncode != 0:
            sys.exit(f"FAIL: meshc exited {first.returncode}\n{first.stderr}")
        # A train block with metrics prints them after the loss: `step S loss L name M ...`.
        losses = [float(m.group(2)) for m in re.finditer(r"^step (\d+) loss (\S+)(?: \S+ \S+)*$",
                                                         first.stdout, re.MULTILINE)]
        if len(losses) != steps:
            sys.exit(f"FAIL: {len(losses)} step lines for {steps} steps\n{first.stdout}")
        if not all(math.isfinite(loss) for loss in losses):
            sys.exit(f"FAIL: a non-finite loss\n{first.stdout}")
        head, tail = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        print(f"loss: first five {head:.6g}, last five {tail:.6g} (ratio {tail / head:.3f})")
        if ratio > 0 and not tail < ratio * head:
            sys.exit(f"FAIL: the loss did not fall below {ratio} of its start\n{first.stdout}")
        second = subprocess.run(args, capture_output=True, text=True, timeout=600)
        if second.stdout != first.stdout:
            sys.exit("FAIL: a second run printed different losses")
        tensors = read_outputs(dump)
        last = tensors.get(f"{block}.loss", (None, None, [float("nan")]))[2][0]
        if not abs(last - losses[-1]) <= 1e-8 * abs(losses[-1]):  # printed with 9 digits
            sys.exit(f"FAIL: the dump's {block}.loss is not the last loss")
        params = sorted(name for name in tensors if name.startswith(f"{block}.param."))
        print("params:", " ".join(params))
        for slot in slots:
            if not any(name.endswith("@" + slot) for name in params):
                sys.exit(f"FAIL: no optimizer state '@{slot}' in the dump")
    print("ok")


if __name__ == "__main__":
    main()
