"""Runs one fuzz case through `meshc run --check` and classifies the outcome.

Outcomes: "pass" (the outputs match the interpreter's), "rejected-ok" (an expected located
error), and the failures: "mismatch" (outputs differ), "build" (the generated C++ does not
compile), "runtime" (the generated program fails), "internal" (any other exit 2), "crash"
(meshc killed by a signal), "timeout", "unlocated" (exit 1 without a `file:line:col: error:`
diagnostic), "rejected" (a located error for a program the generator meant to be valid),
"missed-error" (a non-divisible layout accepted)."""
import os
import re
import shutil
import subprocess
import tempfile
import time

LOCATED = re.compile(r"^\S+\.mesh:\d+:\d+: error: ", re.M)
FAILURES = {"mismatch", "build", "runtime", "internal", "crash", "timeout", "unlocated",
            "rejected", "missed-error"}


class Outcome:
    def __init__(self, kind, output, seconds, detail=""):
        self.kind, self.output, self.seconds, self.detail = kind, output, seconds, detail

    @property
    def failed(self):
        return self.kind in FAILURES


def classify(rc, output, expect_error, may_reject=""):
    """The outcome of one `meshc run` from its exit status and its combined output."""
    if rc is None:
        return "timeout", ""
    if rc < 0:
        return "crash", f"signal {-rc}"
    located = LOCATED.search(output)
    if expect_error:
        if rc == 1 and located:
            line = output[located.start():].splitlines()[0]
            # The planner's message names the dim; a different error means the generator's
            # program was invalid in another way, which is its own bug.
            if expect_error in line:
                return "rejected-ok", line
            return "rejected", line
        if rc == 0:
            return "missed-error", "a layout that does not divide its dim was accepted"
    if rc == 0:
        return "pass", ""
    if rc == 1:
        if located:
            line = output[located.start():].splitlines()[0]
            return ("rejected-ok" if may_reject and may_reject in line else "rejected"), line
        return "unlocated", output.strip().splitlines()[-1] if output.strip() else ""
    if "failed on the generated code" in output:
        return "build", ""
    if "the generated program failed" in output:
        return "runtime", ""
    if "differ from the reference interpreter" in output:
        worst = [line for line in output.splitlines() if "error" in line and "bound" in line]
        return "mismatch", worst[0].strip() if worst else ""
    return "internal", output.strip().splitlines()[-1] if output.strip() else ""


def run_meshc(meshc, path, args, cache_dir, timeout=300):
    """`meshc run PATH --check ARGS`; returns (exit status or None on timeout, output)."""
    command = [meshc, "run", path, "--check", "--no-plan", "--cache-dir", cache_dir] + args
    env = dict(os.environ)
    # The mpirun ranks and the interpreter must not each start a thread per core.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", timeout=timeout, env=env,
                              start_new_session=True)
        rc = proc.returncode
        return rc, proc.stdout
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout or ""
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        return None, out


def run_text(meshc, text, args, expect_error, workdir, name="case", timeout=300, may_reject=""):
    """Writes TEXT to WORKDIR/NAME.mesh, runs it, classifies; the build cache is per call and
    removed afterwards so that the disk does not fill over an hour."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, name + ".mesh")
    with open(path, "w") as f:
        f.write(text)
    cache = tempfile.mkdtemp(prefix="cache-", dir=workdir)
    start = time.time()
    try:
        rc, output = run_meshc(meshc, path, args, cache, timeout)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    kind, detail = classify(rc, output, expect_error, may_reject)
    return Outcome(kind, output, time.time() - start, detail)


def plans(meshc, text, function, workdir, args=()):
    """Whether meshc accepts TEXT up to the plan (a fraction of a second): the reducer's filter
    for candidates that no longer compile, before the seconds of a C++ build."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "candidate.mesh")
    with open(path, "w") as f:
        f.write(text)
    try:
        proc = subprocess.run([meshc, path, "--emit=plan", "--function", function, *args],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0
