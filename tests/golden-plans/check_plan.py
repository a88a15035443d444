#!/usr/bin/env python3
"""Golden plans and planner error cases.

golden <meshc> <example.mesh> <mesh>: `meshc example.mesh --emit=plan` on one of the meshes
    below must succeed and print exactly tests/golden-plans/<example>.<mesh>.plan.
    MESHC_UPDATE_GOLDEN=1 in the environment rewrites the expectation instead.
error <meshc> <case.mesh>: as tests/check_case.py's error mode, with the command-line options
    of the case's `// ARGS: ...` line (e.g. --emit=plan --memory-budget 1KiB).
"""
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import check_case  # noqa: E402  (tests/check_case.py: the error-case checker)

# The meshes every example is planned on. On [2, 2] the example keeps its own layout (written
# for data x model); on [4] and [2, 4] the planner searches every dim.
MESHES = {
    "4": ["--mesh", "data=4", "--layout", "auto"],
    "2x2": ["--mesh", "data=2,model=2"],
    "2x4": ["--mesh", "data=2,model=4", "--layout", "auto"],
    # The file's own mesh and layout (test models outside dsl-examples).
    "own": [],
}
MACHINE = ["--machine", "8xh100"]


def golden(meshc, example, mesh):
    stem = os.path.splitext(os.path.basename(example))[0]
    expected_path = os.path.join(HERE, f"{stem}.{mesh}.plan")
    args = [meshc, example, "--emit=plan", *MACHINE, *MESHES[mesh]]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit(f"FAIL: {' '.join(args)} exited {proc.returncode}\n{proc.stderr}")
    # Paths in the plan are file base names already; nothing else varies between runs.
    check_case.compare_or_update(expected_path, proc.stdout, "the plan")
    print("ok")


def error(meshc, case):
    args = []
    with open(case) as f:
        for line in f:
            if "// ARGS:" in line:
                args += shlex.split(line.split("// ARGS:", 1)[1])

    def run(meshc_, case_):
        proc = subprocess.run([meshc_, case_, *args], capture_output=True, text=True, timeout=60)
        if proc.returncode < 0 or proc.returncode > 2:
            sys.exit(f"FAIL: meshc crashed (exit {proc.returncode})\n{proc.stderr}")
        return proc

    check_case.run = run
    check_case.error(meshc, case)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "golden":
        golden(sys.argv[2], os.path.abspath(sys.argv[3]), sys.argv[4])
    else:
        error(sys.argv[2], os.path.abspath(sys.argv[3]))
