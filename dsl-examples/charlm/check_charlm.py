#!/usr/bin/env python3
"""ctest example.charlm.trains: trains the char-LM demo briefly on GPL-3's text (a Debian system
always ships it) and checks real learning: the mean loss of the last logged window is at least
0.5 below the first's, the sample is printable text, and a second run with the same --checkpoint
resumes at the saved step.

usage: check_charlm.py <charlm binary> <work dir>"""
import os
import re
import shutil
import subprocess
import sys

TEXT = "/usr/share/common-licenses/GPL-3"


def train(binary, checkpoint, steps):
    out = subprocess.run([binary, "--text", TEXT, "--steps", str(steps), "--log-every", "20",
                          "--sample", "80", "--checkpoint", checkpoint],
                         capture_output=True, text=True, timeout=800)
    print(out.stdout, out.stderr, sep="")
    if out.returncode != 0:
        sys.exit(f"charlm failed with exit status {out.returncode}")
    return out.stdout


def main():
    binary, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    checkpoint = os.path.join(work, "checkpoint")
    first = train(binary, checkpoint, 160)
    losses = [float(m) for m in re.findall(r"^step +\d+ +loss ([\d.]+) +tokens/s \d+", first, re.M)]
    if len(losses) < 2:
        sys.exit("no progress lines")
    if not losses[-1] < losses[0] - 0.5:
        sys.exit(f"the loss did not fall enough: {losses[0]:.3f} -> {losses[-1]:.3f}")
    sample = first.split("--- sample", 1)[1].split("\n", 1)[1].rsplit("\n---", 1)[0]
    if len(sample) < 80 or any(not (c.isprintable() or c == "\n") for c in sample):
        sys.exit(f"the sample is not printable text: {sample!r}")
    second = train(binary, checkpoint, 20)
    if "resumed from" not in second or "at step 160" not in second:
        sys.exit("the second run did not resume from the checkpoint at step 160")
    if not re.search(r"^step +180 +loss", second, re.M):
        sys.exit("the resumed run did not continue to step 180")
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; resumed at step 160")


if __name__ == "__main__":
    main()
