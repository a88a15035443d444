"""What bench/'s side-by-side comparisons share: building meshc's generated classes into a timing
server, the contender protocol, round-by-round alternation and the ratio table.

A contender is a process that warms up, prints `ready [info]`, then for each line N on stdin times
N steps and prints `median_ms first_loss last_loss`. Processes stay alive between rounds, so a JIT
compiles once while the rounds alternate contenders (this 2-core machine is shared and its load
drifts: only ratios measured close together mean something). Standard library only: PyTorch runs
under Debian's /usr/bin/python3, JAX under the PyPI one, and both import `serve` from here."""
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
TRANSFORMER = os.path.join(ROOT, "dsl-examples", "transformer.mesh")
# Debian's python3-torch is installed for /usr/bin/python3, JAX from PyPI for this interpreter.
TORCH_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

# Serves one generated class (a program: run(); a train block: step()) on all ranks of its mesh
# (threads backend). A step's time is the slowest rank's, from a barrier before the step.
SERVER_MAIN = r"""
#include "@HEADER@"
#include "meshrt/Threads.h"
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <vector>
using Model = meshc_generated::@CLASS@;
template <class M> float once(M& model, const typename M::Inputs& inputs) {
  if constexpr (requires { model.step(inputs); }) {
    return model.step(inputs);
  } else {
    model.run(inputs);
    return 0.0f;
  }
}
int main() {
  meshrt::Mesh mesh = Model::mesh();
  int ranks = mesh.size();
  std::barrier sync(ranks);
  int request = 0;
  float first = 0, last = 0;
  std::vector<std::vector<double>> ms(ranks);
  meshrt::runThreads(mesh, [&](meshrt::Communicator& world) {
    int rank = world.rank();
    Model model(world, 0);
    auto inputs = model.synthesizeInputs(0);
    float loss = once(model, inputs); // warm-up: arena, library kernels' first calls
    if (rank == 0) first = loss;
    loss = once(model, inputs);
    if (rank == 0) std::printf("ready %d ranks\n", ranks), std::fflush(stdout);
    for (;;) {
      if (rank == 0 && !(std::cin >> request)) request = 0;
      sync.arrive_and_wait();
      if (request <= 0) return;
      ms[rank].clear();
      for (int i = 0; i < request; ++i) {
        sync.arrive_and_wait();
        auto start = std::chrono::steady_clock::now();
        loss = once(model, inputs);
        ms[rank].push_back(std::chrono::duration<double, std::milli>(
                               std::chrono::steady_clock::now() - start).count());
      }
      sync.arrive_and_wait();
      if (rank != 0) continue;
      std::vector<double> slowest(request, 0.0);
      for (const auto& times : ms)
        for (int i = 0; i < request; ++i) slowest[i] = std::max(slowest[i], times[i]);
      std::sort(slowest.begin(), slowest.end());
      last = loss;
      std::printf("%.3f %g %g\n", slowest[slowest.size() / 2], first, last);
      std::fflush(stdout);
    }
  });
}
"""


def learning_rate(step, cos=math.cos, minimum=min, maximum=max):
    """The factor of transformer.mesh's learning rate at step `step` (from 0): warmed up over 100
    steps, then cosine-decayed over 10000 (compiler/train/Optimizer.cpp, learningRate). The
    Python peers pass jax.numpy's functions to trace it inside jit."""
    warmup, decay = 100, 10000
    progress = minimum(maximum((step - warmup) / decay, 0.0), 1.0)
    return minimum(1.0, (step + 1) / warmup) * (1 + cos(math.pi * progress)) / 2


def serve(step, info=""):
    """The contender side for Python frameworks: `step()` runs one step to completion and returns
    the loss. Two warm-up steps (compilation, and a retrace when a step's outputs feed the next)."""
    first = step()
    step()
    print("ready", info, flush=True)
    for line in sys.stdin:
        count = int(line)
        if count <= 0:
            break
        ms = []
        for _ in range(count):
            start = time.perf_counter()
            last = step()
            ms.append((time.perf_counter() - start) * 1e3)
        ms.sort()
        print(f"{ms[len(ms) // 2]:.3f} {first:g} {last:g}", flush=True)


def pin(cores):
    """taskset to the first `cores` cores, so that every contender runs on the same ones."""
    if not shutil.which("taskset"):
        return []
    return ["taskset", "-c", ",".join(str(c) for c in range(cores))]


def build_config(build_dir):
    """The include directories and libraries `meshc run` builds generated code with (the build
    tree's MeshcBuildConfig.h, written by CMake; compiler/driver/Toolchain.cpp reads the same)."""
    for top, _, files in os.walk(os.path.join(build_dir, "compiler")):
        if "MeshcBuildConfig.h" in files:
            with open(os.path.join(top, "MeshcBuildConfig.h")) as f:
                defines = dict(re.findall(r'#define (\w+) "(.*)"', f.read()))
            split = lambda key: [item for item in defines.get(key, "").split(";") if item]
            includes = split("MESHC_BUILD_INCLUDE_DIRS") + split("MESHC_BLAS_INCLUDE")
            libraries = (split("MESHC_BUILD_LIBRARIES") + split("MESHC_BLAS_LIBRARY")
                         + split("MESHC_DNNL_LIBRARIES"))
            return defines.get("MESHC_CXX_COMPILER", "c++"), includes, libraries
    sys.exit(f"bench: no MeshcBuildConfig.h under {build_dir}/compiler (build meshc first)")


def meshc_path(build_dir):
    return os.path.join(build_dir, "compiler", "tools", "meshc")


def dim_args(sizes):
    return [f"--dim={name}={size}" for name, size in sizes.items()]


def precompiled_prelude(build_dir, flags):
    """-include of meshc run's precompiled prelude (the target meshc_prelude's
    <build>/compiler/prelude) when its key file says it was made with `flags` (the compiler and
    its flags, in any order), else [] (the build parses the headers)."""
    directory = os.path.abspath(os.path.join(build_dir, "compiler", "prelude"))
    try:
        with open(os.path.join(directory, "prelude.key")) as f:
            made_with = f.readline().split()
    except OSError:
        return []
    if sorted(made_with) != sorted(flags) or not os.path.exists(
            os.path.join(directory, "prelude.h.gch")):
        return []
    return ["-include", os.path.join(directory, "prelude.h")]


def build_server(build_dir, work, meshc_args, class_name, extra_flags=()):
    """meshc --emit=cpp, then the class's timing server built as `meshc run` builds its runner
    (-O3 -march=native -fno-math-errno, the same include directories and libraries, and its
    precompiled prelude when `extra_flags` is empty), plus `extra_flags`."""
    os.makedirs(work, exist_ok=True)
    base = os.path.join(work, "lm")
    subprocess.run([meshc_path(build_dir), TRANSFORMER, "--emit=cpp", "-o", base] + meshc_args,
                   check=True)
    source = os.path.join(work, f"server_{class_name}.cpp")
    with open(source, "w") as f:
        f.write('#include "lm.cpp"\n'
                + SERVER_MAIN.replace("@HEADER@", "lm.h").replace("@CLASS@", class_name))
    binary = source[:-4]
    cxx, includes, libraries = build_config(build_dir)
    command = [cxx, "-O3", "-march=native", "-fno-math-errno", "-std=c++20", "-w"]
    for include in includes:
        command += ["-I", include]
    if not extra_flags:
        command += precompiled_prelude(
            build_dir, command + [flag for flag in libraries if flag.startswith("-f")])
    command += ["-I", work] + list(extra_flags)
    subprocess.run(command + [source, "-o", binary] + libraries + ["-lpthread"], check=True)
    return binary


class Contender:
    """One contender's server process (see the module's docstring)."""

    def __init__(self, name, argv, env, log_dir):
        self.name, self.argv, self.env, self.log_dir = name, argv, env, log_dir
        self.process, self.info, self.error = None, "", None

    def start(self):
        os.makedirs(self.log_dir, exist_ok=True)
        log = re.sub(r"[^\w.-]+", "_", self.name) + ".stderr"
        self.stderr = open(os.path.join(self.log_dir, log), "w")
        self.process = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.stderr, text=True, env=self.env)
        for line in self.process.stdout:
            if line.startswith("ready"):
                self.info = line[len("ready"):].strip()
                return True
        self.fail()
        return False

    def fail(self):
        self.process.wait()
        self.stderr.close()
        with open(self.stderr.name) as f:
            tail = [line.strip() for line in f.read().strip().splitlines()[-3:]]
        self.error = f"exit {self.process.returncode}: " + " | ".join(tail)
        self.process = None

    def measure(self, steps):
        """Times `steps` steps; returns (median ms, first loss, last loss), or None on failure."""
        if self.process is None:
            return None
        self.process.stdin.write(f"{steps}\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            self.fail()
            return None
        ms, first, last = line.split()[:3]
        return float(ms), first, last

    def close(self):
        if self.process is not None:
            self.process.stdin.write("0\n")
            self.process.stdin.close()
            self.process.wait()
            self.stderr.close()


def alternate(contenders, rounds, steps, log=print, per_round=None):
    """Starts every contender, then `rounds` rounds, each timing every contender once (the order
    rotates each round). Returns {name: (median over rounds of the per-round median ms, first
    loss, last loss)}; a contender that failed gets its error text instead. `per_round`, if
    given, receives {name: [each round's median ms]} (None for a round it failed)."""
    for contender in contenders:
        log(f"  starting {contender.name} ...")
        contender.start()
    samples = {c.name: [] for c in contenders}
    rounds_ms = {c.name: [None] * rounds for c in contenders}
    losses = {}
    for r in range(rounds):
        order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
        for contender in order:
            result = contender.measure(steps)
            if result:
                samples[contender.name].append(result[0])
                rounds_ms[contender.name][r] = result[0]
                losses[contender.name] = result[1:]
        log("  round {}: {}".format(r + 1, ", ".join(
            f"{c.name} {samples[c.name][-1]:.1f} ms" for c in contenders if samples[c.name])))
    if per_round is not None:
        per_round.update(rounds_ms)
    results = {}
    for contender in contenders:
        contender.close()
        if samples[contender.name] and contender.error is None:
            results[contender.name] = (statistics.median(samples[contender.name]),
                                       *losses[contender.name])
        else:
            results[contender.name] = contender.error or "no result"
    return results


def ratio_rows(label, results, meshc, peers, goal=1.3):
    """Table rows for one run: meshc against the faster of `peers` that produced a time."""
    timed = {name: value[0] for name, value in results.items() if isinstance(value, tuple)}
    if meshc not in timed:
        return [(label, "failed", "", "", "")]
    available = [p for p in peers if p in timed]
    if not available:
        return [(label, f"{timed[meshc]:.1f}", "no peer", "", "")]
    fastest = min(available, key=lambda p: timed[p])
    ratio = timed[fastest] / timed[meshc]
    return [(label, f"{timed[meshc]:.1f}", f"{timed[fastest]:.1f} ({fastest})", f"{ratio:.2f}",
             f">= {goal} {'met' if ratio >= goal else 'NOT met'}")]


def print_table(rows, header=("run", "meshc ms", "peer ms", "peer/meshc", "goal")):
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    line = lambda row: "| " + " | ".join(str(v).ljust(w) for v, w in zip(row, widths)) + " |"
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print(line(row))
