#!/usr/bin/env python3
"""Golden emitted C++ and kernel IR: `meshc X.mesh --emit=cpp --cpp-runner -o <tmp>/X` must produce
exactly tests/golden-cpp/X.h, X.cpp and X.main.cpp, and `meshc X.mesh --emit=kernels` exactly
X.kernels. MESHC_UPDATE_GOLDEN=1 in the environment rewrites the goldens instead.
Usage: check_golden_cpp.py MESHC EXAMPLE.mesh GOLDEN_DIR"""
import difflib
import os
import subprocess
import sys
import tempfile


def main():
    meshc, example, golden_dir = sys.argv[1:4]
    stem = os.path.splitext(os.path.basename(example))[0]
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, stem)
        result = subprocess.run([meshc, example, "--emit=cpp", "--cpp-runner", "-o", base],
                                capture_output=True, text=True)
        if result.returncode != 0:
            sys.stderr.write(result.stderr)
            print(f"meshc failed with exit code {result.returncode}")
            return 1
        kernels = subprocess.run([meshc, example, "--emit=kernels", "-o", base + ".kernels"],
                                 capture_output=True, text=True)
        if kernels.returncode != 0:
            sys.stderr.write(kernels.stderr)
            print(f"meshc --emit=kernels failed with exit code {kernels.returncode}")
            return 1
        update = os.environ.get("MESHC_UPDATE_GOLDEN") == "1"
        ok = True
        for suffix in (".h", ".cpp", ".main.cpp", ".kernels"):
            with open(base + suffix) as f:
                actual = f.read()
            golden = os.path.join(golden_dir, stem + suffix)
            if update:
                with open(golden, "w") as f:
                    f.write(actual)
                print(f"updated {golden}")
                continue
            expected = open(golden).read() if os.path.exists(golden) else ""
            if actual != expected:
                ok = False
                sys.stdout.writelines(difflib.unified_diff(
                    expected.splitlines(True), actual.splitlines(True), golden,
                    "meshc --emit=" + ("kernels" if suffix == ".kernels" else "cpp"), n=2))
                print(f"\n{golden} differs (MESHC_UPDATE_GOLDEN=1 rewrites it)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
