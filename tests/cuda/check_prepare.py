#!/usr/bin/env python3
"""The GPU check's comparison, without a GPU (ctest cuda.prepare_and_compare): what
`compile_example.py --reuse --prepare` writes beside a built runner (the interpreter's outputs,
its K-step train outputs, the program's path dtypes: what tests/gpu/bundle.sh carries to a GPU
machine without meshc) is what its --check compares with, through compare_outputs.py's rule:
- the files are written, and the interpreter's outputs pass against themselves;
- an output moved by 1e-3 of its RMS fails at fp32 (rtol 6.1e-5) and passes under bf16 math
  (compared at bf16's rounding, rtol 0.031); moved by 1e-1 of it, it fails under both.

usage: check_prepare.py COMPILE_EXAMPLE_ARGS...   (those of cuda.compile.mlp, with --reuse)"""
import argparse
import math
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
import compile_example  # noqa: E402
from compare_outputs import read_outputs  # noqa: E402


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def moved_copy(path, out, fraction):
    """`path` with the smallest entry (in magnitude) of its first float tensor of nonzero RMS
    moved by `fraction` of that RMS: under compare_outputs.py's rule (|a - e| <= rtol (rms +
    |e|), |e| <= rms) it fails when fraction > 2 rtol and passes when fraction <= rtol."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    for name, (dtype, shape, values) in read_outputs(path).items():
        rms = math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0
        if dtype.startswith("f") and rms > 0:
            break
    else:
        fail(f"{path} has no float tensor of nonzero RMS")
    index = min(range(len(values)), key=lambda i: abs(values[i]))
    start = data.index(b"\n", data.index(f"tensor {name} ".encode())) + 1
    struct.pack_into("<d", data, start + 8 * index, values[index] + fraction * rms)
    with open(out, "wb") as f:
        f.write(data)


def main():
    steps = 2
    argv = sys.argv[1:] + ["--reuse", "--prepare", "--train-steps", str(steps)]
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--example", required=True)
    known, _ = parser.parse_known_args(argv)
    base = os.path.join(known.workdir, os.path.splitext(os.path.basename(known.example))[0])
    for suffix in (".expected", ".path-dtypes", f".interp{steps}"):
        if os.path.exists(base + suffix):
            os.remove(base + suffix)
    if not os.path.exists(base + "_cuda"):
        fail(f"no runner {base}_cuda (cuda.compile.mlp builds it)")
    subprocess.run([sys.executable, os.path.join(HERE, "compile_example.py")] + argv, check=True)
    for suffix in (".expected", ".path-dtypes", f".interp{steps}"):
        if not os.path.exists(base + suffix):
            fail(f"--prepare wrote no {base + suffix}")

    def verdict(actual, math):
        args = argparse.Namespace(math=math)
        return compile_example.compare(args, base, actual, base + ".expected", 0) == 0

    if not verdict(base + ".expected", "fp32"):
        fail("the interpreter's outputs fail against themselves")
    moved = base + ".moved"
    moved_copy(base + ".expected", moved, 1e-3)
    if verdict(moved, "fp32"):
        fail("an output moved by 1e-3 of its RMS passes at fp32")
    if not verdict(moved, "bf16"):
        fail("an output moved by 1e-3 of its RMS fails under bf16 math")
    moved_copy(base + ".expected", moved, 1e-1)
    if verdict(moved, "bf16"):
        fail("an output moved by 1e-1 of its RMS passes under bf16 math")
    os.remove(moved)
    print("prepared outputs written and compared as --check compares them")


if __name__ == "__main__":
    main()
