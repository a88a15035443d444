#!/usr/bin/env python3
"""Runs a command that must fail: exit status not 0 and its output (stdout and stderr) matching
a regular expression. For failures that end a whole MPI job, where the job's exit status and
the message printed on the way out are the behaviour under test.

usage: expect_error.py REGEX -- COMMAND..."""
import re
import subprocess
import sys


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit(__doc__)
    pattern, command = sys.argv[1], sys.argv[3:]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    sys.stdout.write(output)
    if result.returncode == 0:
        print(f"expect_error.py: FAILED: the command succeeded; expected an error matching {pattern!r}")
        return 1
    if not re.search(pattern, output):
        print(f"expect_error.py: FAILED: exit status {result.returncode}, but no output matches "
              f"{pattern!r}")
        return 1
    print(f"expect_error.py: ok (exit status {result.returncode}, message matches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
