#!/usr/bin/env python3
"""Golden IR after the training phase: `meshc <case.mesh> --emit=train-ir` must succeed and print
exactly <expected.ir>, and that IR must parse back to itself (`meshc expected.ir`) and stay as it
is through the training phase (`meshc expected.ir --emit=train-ir`: already lowered).
With MESHC_UPDATE_GOLDEN=1 the expectation is rewritten.
Usage: check_train_ir.py <meshc> <case.mesh> <expected.ir>"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
import check_case  # noqa: E402


def main():
    meshc, case, expected_path = sys.argv[1:4]
    proc = subprocess.run([meshc, case, "--emit=train-ir"], capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0:
        sys.exit(f"FAIL: meshc exited {proc.returncode}\n{proc.stderr}")
    expected = check_case.compare_or_update(expected_path, proc.stdout, "the train IR")
    for stage in ("ir", "train-ir"):
        again = subprocess.run([meshc, expected_path, f"--emit={stage}"], capture_output=True,
                               text=True, timeout=60)
        if again.returncode != 0 or again.stdout != expected:
            sys.exit(f"FAIL: the train IR does not read back to itself (--emit={stage})\n"
                     f"{again.stderr}")
    print("ok")


if __name__ == "__main__":
    main()
