#!/usr/bin/env python3
"""Replays one reduced reproducer of tests/fuzz/regressions/ (a ctest, label fuzz).

The file's header says how to run it and what must happen:
  // difffuzz-args: --function case12 --backend threads --opt -O1 [--steps N]
  // difffuzz-expect: pass | error DIM | known-bug KIND
`pass`: `meshc run --check` matches the interpreter; `error DIM`: a located planner error naming
DIM; `known-bug KIND`: a bug not fixed yet still fails as KIND (runcase.py's outcomes), so that
the test turns red once it is fixed and the expectation must become `pass`.

Usage: replay.py --meshc M FILE [--workdir DIR]"""
import argparse
import os
import re
import shlex
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runcase import classify, run_meshc  # noqa: E402


def header(text, key):
    m = re.search(rf"^// {key}: (.*)$", text, re.M)
    if not m:
        raise SystemExit(f"replay: no '// {key}:' line")
    return m.group(1).strip()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshc", required=True)
    parser.add_argument("--workdir")
    parser.add_argument("file")
    args = parser.parse_args()
    with open(args.file) as f:
        text = f.read()
    run_args = shlex.split(header(text, "difffuzz-args"))
    expect = header(text, "difffuzz-expect").split()
    expect_error = expect[1] if expect[0] == "error" else ""
    workdir = tempfile.mkdtemp(prefix="replay-", dir=args.workdir)
    try:
        rc, output = run_meshc(args.meshc, os.path.abspath(args.file), run_args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    kind, detail = classify(rc, output, expect_error)
    print(output)
    wanted = {"pass": "pass", "error": "rejected-ok", "known-bug": expect[-1]}[expect[0]]
    print(f"replay: {kind}{' - ' + detail if detail else ''}; expected {wanted}")
    if expect[0] == "known-bug" and kind == wanted:
        print("replay: the known bug is still there (see the file's header)")
    return 0 if kind == wanted else 1


if __name__ == "__main__":
    sys.exit(main())
