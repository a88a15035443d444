#!/usr/bin/env python3
"""Compares two output files written by a generated runner (`<prog>.main.cpp`) or by
`meshc --emit=run --dump-outputs`. Format, per tensor: a text line
"tensor <name> <dtype> <rank> <sizes...>\\n" followed by prod(sizes) little-endian float64s.

Each element must satisfy tolerance.py's rule |a - e| <= atol + rtol |e| (rtol per dtype, atol
= rtol times the expected tensor's RMS). Usage: compare_outputs.py ACTUAL EXPECTED
[--compute-dtype bf16|f16]
[--steps N]. Exit status 0 when every tensor of
EXPECTED is in ACTUAL with the same shape and passes."""
import argparse
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tolerance import compare_values, typical_scale  # noqa: E402


def read_outputs(path):
    tensors = {}
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        end = data.index(b"\n", pos)
        fields = data[pos:end].decode().split()
        if not fields or fields[0] != "tensor":
            raise ValueError(f"{path}: malformed header at byte {pos}")
        name, dtype, rank = fields[1], fields[2], int(fields[3])
        shape = [int(s) for s in fields[4:4 + rank]]
        count = math.prod(shape)
        pos = end + 1
        values = struct.unpack_from(f"<{count}d", data, pos)
        pos += 8 * count
        tensors[name] = (dtype, shape, values)
    return tensors


def compare_files(actual_path, expected_path, steps=0, compute_dtype=None,
                  both_approximate=False):
    """Prints one line per tensor of EXPECTED; returns whether all pass."""
    actual, expected = read_outputs(actual_path), read_outputs(expected_path)
    file_rms = typical_scale(expected)
    ok = True
    for name, (dtype, shape, want) in expected.items():
        if name not in actual:
            print(f"FAIL {name}: missing from {actual_path}")
            ok = False
            continue
        got_dtype, got_shape, got = actual[name]
        if got_shape != shape:
            print(f"FAIL {name}: shape {got_shape}, expected {shape}")
            ok = False
            continue
        verdict = compare_values(got, want, dtype, steps, compute_dtype, both_approximate,
                                 file_rms)
        ok = ok and verdict.ok
        print(f"{'ok  ' if verdict.ok else 'FAIL'} {name} {dtype}{shape}: {verdict.describe()}")
    return ok


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("actual")
    parser.add_argument("expected")
    parser.add_argument("--steps", type=int, default=0,
                        help="optimizer updates the values went through")
    parser.add_argument("--compute-dtype", choices=["bf16", "f16"],
                        help="the narrowest float dtype the program computes in")
    args = parser.parse_args()
    ok = compare_files(args.actual, args.expected, args.steps, args.compute_dtype)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
