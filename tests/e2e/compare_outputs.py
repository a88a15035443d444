#!/usr/bin/env python3
"""Compares two output files written by a generated runner (`<prog>.main.cpp`) or by
`meshc --emit=run --dump-outputs`. Format, per tensor: a text line
"tensor <name> <dtype> <rank> <sizes...>\\n" followed by prod(sizes) little-endian float64s.

Each element must satisfy tolerance.py's rule |a - e| <= atol + rtol |e| (rtol per dtype and per
tensor's path dtype, atol = rtol times the expected tensor's RMS). Usage: compare_outputs.py ACTUAL
EXPECTED [--path-dtypes FILE] [--compute-dtype bf16|f16] [--steps N] [--unrounded U]: FILE is what
`meshc --emit=tolerance-dtypes` prints for the program; --compute-dtype coarsens every tensor
(e.g. einsums run in bf16 by --cuda-math). Exit status 0 when every tensor of EXPECTED is in
ACTUAL with the same shape and passes."""
import argparse
import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tolerance import coarsest_dtype, compare_values, typical_scale  # noqa: E402


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


def compare_files(actual_path, expected_path, steps=0, path_dtypes=None, both_approximate=False,
                  compute_dtype=None, verdicts=None, unrounded_path=None):
    """Prints one line per tensor of EXPECTED (`ok`, `FAIL`, or `noise`: passing only by its
    ill-conditioned elements); returns whether all pass. path_dtypes: tensor name -> the
    coarsest float dtype on any path into it (tolerance.path_dtypes_of); compute_dtype: coarsens
    every tensor; verdicts, a list, gets (name, tolerance.Verdict) per tensor; unrounded_path:
    the interpreter's outputs computed in double (tolerance.py's ill-conditioned elements)."""
    path_dtypes = path_dtypes or {}
    actual, expected = read_outputs(actual_path), read_outputs(expected_path)
    unrounded = read_outputs(unrounded_path) if unrounded_path else {}
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
        path = coarsest_dtype([path_dtypes.get(name), compute_dtype])
        in_double = unrounded.get(name)
        in_double = in_double[2] if in_double and in_double[1] == shape else None
        verdict = compare_values(got, want, dtype, steps, path, both_approximate, file_rms,
                                 in_double)
        ok = ok and verdict.ok
        if verdicts is not None:
            verdicts.append((name, verdict))
        label = ("FAIL" if not verdict.ok else "noise" if verdict.ill_conditioned else "ok  ")
        print(f"{label} {name} {dtype}{shape}: {verdict.describe()}")
    return ok


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("actual")
    parser.add_argument("expected")
    parser.add_argument("--steps", type=int, default=0,
                        help="optimizer updates the values went through")
    parser.add_argument("--path-dtypes", help="a file: `meshc --emit=tolerance-dtypes`'s output")
    parser.add_argument("--compute-dtype", choices=["bf16", "f16"],
                        help="a dtype whose rounding every tensor carries")
    parser.add_argument("--unrounded", help="the interpreter's outputs computed in double "
                        "(meshc --emit=run --interp-in-double): ill-conditioned elements")
    args = parser.parse_args()
    path_dtypes = {}
    if args.path_dtypes:
        with open(args.path_dtypes) as f:
            path_dtypes = json.load(f)
    ok = compare_files(args.actual, args.expected, args.steps, path_dtypes,
                       compute_dtype=args.compute_dtype, unrounded_path=args.unrounded)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
