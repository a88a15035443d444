"""The test scripts' way to run a step: a failing command prints its output and command, then
exits 1 (the ctest failure)."""
import subprocess
import sys


def run(cmd, with_stderr=False, **kwargs):
    """Runs `cmd`; returns its stdout (with `with_stderr`, stdout then stderr)."""
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        print(f"FAILED ({result.returncode}): {' '.join(cmd)}")
        sys.exit(1)
    return result.stdout + result.stderr if with_stderr else result.stdout
