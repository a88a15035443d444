#!/usr/bin/env python3
"""Compares two output files written by a generated runner (`<prog>.main.cpp`) or by
`meshc --emit=run --dump-outputs`. Format, per tensor: a text line
"tensor <name> <dtype> <rank> <sizes...>\\n" followed by prod(sizes) little-endian float64s.

The error of a tensor is max|actual - expected| / max(max|expected|, 1e-30) (relative to the
tensor's largest magnitude, so values near zero after cancellation do not blow it up); a tensor
passes when that is <= its tolerance. Usage: compare_outputs.py ACTUAL EXPECTED [--tol X]
[--tol-bf16 X]. Exit status 0 when every tensor of EXPECTED is in ACTUAL with the same shape and
passes."""
import argparse
import math
import struct
import sys


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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("actual")
    parser.add_argument("expected")
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--tol-bf16", type=float, default=1e-2)
    args = parser.parse_args()
    actual, expected = read_outputs(args.actual), read_outputs(args.expected)
    ok = True
    worst = 0.0
    for name, (dtype, shape, want) in expected.items():
        if name not in actual:
            print(f"FAIL {name}: missing from {args.actual}")
            ok = False
            continue
        got_dtype, got_shape, got = actual[name]
        if got_shape != shape:
            print(f"FAIL {name}: shape {got_shape}, expected {shape}")
            ok = False
            continue
        scale = max([abs(v) for v in want if math.isfinite(v)] + [1e-30])
        error = 0.0
        for g, w in zip(got, want):
            if math.isnan(w) or math.isnan(g) or math.isinf(w) or math.isinf(g):
                if not (g == w or (math.isnan(g) and math.isnan(w))):
                    error = math.inf
                continue
            error = max(error, abs(g - w) / scale)
        tol = args.tol_bf16 if dtype in ("bf16", "f16") else args.tol
        status = "ok  " if error <= tol else "FAIL"
        ok = ok and error <= tol
        worst = max(worst, error)
        print(f"{status} {name} {dtype}{shape}: max relative error {error:.3g} (tolerance {tol:g})")
    print(f"max relative error {worst:.3g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
