#!/usr/bin/env python3
"""The relative-position buckets of dsl-examples/t5.mesh against T5's own bucketing.

Usage: check_t5_buckets.py <meshc> <t5.mesh>. Interprets the program `position_buckets` and
compares both outputs, exactly, with `relative_position_bucket` below: Mesh-TensorFlow's
`_relative_position_bucket` (mesh_tensorflow/transformer/transformer_layers.py) transcribed
with the example's sizes (8 buckets, maximum distance 32)."""
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e"))
from compare_outputs import read_outputs  # noqa: E402

NUM_BUCKETS = 8
MAX_DISTANCE = 32


def relative_position_bucket(relative_position, bidirectional):
    ret = 0
    n = -relative_position
    num_buckets = NUM_BUCKETS
    if bidirectional:
        num_buckets //= 2
        ret += int(n < 0) * num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    large = max_exact + int(math.log(n / max_exact) / math.log(MAX_DISTANCE / max_exact)
                            * (num_buckets - max_exact))
    return ret + min(large, num_buckets - 1)


def main():
    meshc, example = sys.argv[1:3]
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "buckets.bin")
        proc = subprocess.run([meshc, example, "--emit=run", "--function", "position_buckets",
                               "--dump-outputs", dump], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            sys.exit(f"FAIL: meshc exited {proc.returncode}\n{proc.stderr}")
        outputs = read_outputs(dump)
    ok = True
    for name, bidirectional in (("encoder", True), ("decoder", False)):
        _, (queries, keys), values = outputs[f"position_buckets.{name}"]
        want = [relative_position_bucket(k - q, bidirectional)
                for q in range(queries) for k in range(keys)]
        got = [int(v) for v in values]
        bad = [i for i in range(len(want)) if got[i] != want[i]]
        print(f"{'ok  ' if not bad else 'FAIL'} {name}: {queries} x {keys} buckets"
              + (f"; first mismatch at [{bad[0] // keys}, {bad[0] % keys}]: {got[bad[0]]} vs "
                 f"{want[bad[0]]}" if bad else ""))
        ok = ok and not bad and len(set(want)) > 4
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
