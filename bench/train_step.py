#!/usr/bin/env python3
"""A transformer-layer training step (forward, backward, AdamW with global-norm clipping) on one
rank: meshc's generated code vs PyTorch on the CPU (Debian's python3-torch, run by
/usr/bin/python3) and JAX (PyPI, jit-compiled) where they import, with the same sizes, the same
model and the same thread count, measured side by side in one run. Not a test: it prints
milliseconds per step (median of --steps timed steps after warm-up) and the ratios.

The model is dsl-examples/transformer.mesh's lm_train at --dim sizes (one decoder layer:
token + position embedding, pre-norm attention with a causal mask, GELU feed-forward with
dropout 0.1, final norm, unembedding, log-softmax cross-entropy; AdamW lr 3e-4, betas 0.9/0.95,
weight decay 0.1, clip_norm 1; the PyTorch and JAX versions use a constant learning rate where
meshc's follows the example's warmup and cosine schedule, which changes the losses printed, not
the work per step). Every framework is pinned to the same cores (taskset) and told
to use that many threads (meshc: OpenBLAS; PyTorch: set_num_threads; JAX: XLA's CPU flags).

usage: bench/train_step.py [--build-dir build] [--threads 1] [--steps 10]
       (needs meshc, meshrt and meshrt_kernels built; scripts/install-deps --bench installs
       python3-torch and JAX)"""
import argparse
import os
import shutil
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = {"batch": 8, "seq": 128, "mem": 128, "d_model": 256, "heads": 4, "d_head": 64,
         "d_ff": 1024, "vocab": 512, "layers": 1}

BENCH_MAIN = r"""
#include "lm.h"
#include "meshrt/Threads.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
using meshc_generated::LmTrain;
int main(int argc, char** argv) {
  int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  std::vector<double> ms;
  float first = 0, last = 0;
  meshrt::runThreads(LmTrain::mesh(), [&](meshrt::Communicator& world) {
    LmTrain train(world, 0);
    auto inputs = train.synthesizeInputs(0);
    first = train.step(inputs); // warm-up (arena, BLAS buffers)
    for (int i = 0; i < steps; ++i) {
      auto start = std::chrono::steady_clock::now();
      last = train.step(inputs);
      ms.push_back(std::chrono::duration<double, std::milli>(
                       std::chrono::steady_clock::now() - start).count());
    }
  });
  std::sort(ms.begin(), ms.end());
  std::printf("%.3f %g %g\n", ms[ms.size() / 2], first, last);
}
"""

TORCH = r"""
import sys, time, math, torch
B, S, D, H, DH, F, V, THREADS, STEPS = map(int, sys.argv[1:10])
torch.set_num_threads(THREADS)
torch.manual_seed(0)
g = lambda *shape, std: torch.nn.Parameter(torch.randn(*shape) * std)
p = {"tok": g(V, D, std=0.02), "pos": g(S, D, std=0.02), "unembed": g(D, V, std=0.02),
     "g1": torch.nn.Parameter(torch.ones(D)), "b1": torch.nn.Parameter(torch.zeros(D)),
     "wq": g(D, H, DH, std=0.125), "wk": g(D, H, DH, std=0.125), "wv": g(D, H, DH, std=0.125),
     "wo": g(H, DH, D, std=0.125),
     "g2": torch.nn.Parameter(torch.ones(D)), "b2": torch.nn.Parameter(torch.zeros(D)),
     "win": g(D, F, std=0.125), "bin": torch.nn.Parameter(torch.zeros(F)),
     "wout": g(F, D, std=0.0625), "bout": torch.nn.Parameter(torch.zeros(D)),
     "g3": torch.nn.Parameter(torch.ones(D)), "b3": torch.nn.Parameter(torch.zeros(D))}
opt = torch.optim.AdamW(p.values(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
tokens = torch.randint(0, V, (B, S))
causal = torch.tril(torch.ones(S, S, dtype=torch.bool))
def norm(x, gain, bias):
    return torch.nn.functional.layer_norm(x, (D,)) * gain + bias
def step():
    x = p["tok"][tokens] + p["pos"]
    h = norm(x, p["g1"], p["b1"])
    q = torch.einsum("bsd,dhe->bhse", h, p["wq"])
    k = torch.einsum("bsd,dhe->bhse", h, p["wk"])
    v = torch.einsum("bsd,dhe->bhse", h, p["wv"])
    scores = torch.einsum("bhse,bhme->bhsm", q, k) * 0.25
    weights = torch.softmax(scores.masked_fill(~causal, -1e9), dim=-1)
    context = torch.einsum("bhsm,bhme->bshe", weights, v)
    x = x + torch.einsum("bshe,hed->bsd", context, p["wo"])
    f = torch.nn.functional.gelu(norm(x, p["g2"], p["b2"]) @ p["win"] + p["bin"], approximate="tanh")
    x = x + torch.nn.functional.dropout(f, 0.1, training=True) @ p["wout"] + p["bout"]
    logp = torch.log_softmax(norm(x, p["g3"], p["b3"]) @ p["unembed"], dim=-1)
    loss = torch.nn.functional.nll_loss(logp[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(p.values(), 1.0)
    opt.step()
    return loss.item()
first = step()
ms = []
for _ in range(STEPS):
    start = time.perf_counter(); last = step(); ms.append((time.perf_counter() - start) * 1e3)
ms.sort()
print(f"{ms[len(ms) // 2]:.3f} {first:g} {last:g} torch {torch.__version__}")
"""

JAX = r"""
import sys, time
B, S, D, H, DH, F, V, THREADS, STEPS = map(int, sys.argv[1:10])
import jax, jax.numpy as jnp
key = jax.random.PRNGKey(0)
ks = jax.random.split(key, 12)
n = lambda k, shape, std: jax.random.normal(k, shape) * std
p = {"tok": n(ks[0], (V, D), 0.02), "pos": n(ks[1], (S, D), 0.02),
     "unembed": n(ks[2], (D, V), 0.02), "g1": jnp.ones(D), "b1": jnp.zeros(D),
     "wq": n(ks[3], (D, H, DH), 0.125), "wk": n(ks[4], (D, H, DH), 0.125),
     "wv": n(ks[5], (D, H, DH), 0.125), "wo": n(ks[6], (H, DH, D), 0.125),
     "g2": jnp.ones(D), "b2": jnp.zeros(D), "win": n(ks[7], (D, F), 0.125),
     "bin": jnp.zeros(F), "wout": n(ks[8], (F, D), 0.0625), "bout": jnp.zeros(D),
     "g3": jnp.ones(D), "b3": jnp.zeros(D)}
tokens = jax.random.randint(ks[9], (B, S), 0, V)
causal = jnp.tril(jnp.ones((S, S), bool))
def norm(x, gain, bias):
    mean = x.mean(-1, keepdims=True); var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * gain + bias
def loss_fn(p, tokens, dkey):
    x = p["tok"][tokens] + p["pos"]
    h = norm(x, p["g1"], p["b1"])
    q = jnp.einsum("bsd,dhe->bhse", h, p["wq"]); k = jnp.einsum("bsd,dhe->bhse", h, p["wk"])
    v = jnp.einsum("bsd,dhe->bhse", h, p["wv"])
    scores = jnp.einsum("bhse,bhme->bhsm", q, k) * 0.25
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
    x = x + jnp.einsum("bshe,hed->bsd", jnp.einsum("bhsm,bhme->bshe", weights, v), p["wo"])
    f = jax.nn.gelu(norm(x, p["g2"], p["b2"]) @ p["win"] + p["bin"], approximate=True)
    keep = jax.random.bernoulli(dkey, 0.9, f.shape)
    x = x + jnp.where(keep, f / 0.9, 0) @ p["wout"] + p["bout"]
    logp = jax.nn.log_softmax(norm(x, p["g3"], p["b3"]) @ p["unembed"], axis=-1)
    picked = jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], axis=-1)
    return -picked.mean()
@jax.jit
def step(p, m, v, t, tokens, dkey):
    loss, grads = jax.value_and_grad(loss_fn)(p, tokens, dkey)
    gnorm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads)))
    scale = jnp.minimum(1.0, 1.0 / (gnorm + 1e-6))
    lr, b1, b2, wd = 3e-4, 0.9, 0.95, 0.1
    t = t + 1
    def upd(w, g, m, v):
        g = g * scale; m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g * g
        mh = m / (1 - b1 ** t); vh = v / (1 - b2 ** t)
        return w - lr * (mh / (jnp.sqrt(vh) + 1e-8) + wd * w), m, v
    out = {k: upd(p[k], grads[k], m[k], v[k]) for k in p}
    return loss, {k: o[0] for k, o in out.items()}, {k: o[1] for k, o in out.items()}, \
        {k: o[2] for k, o in out.items()}, t
m = {k: jnp.zeros_like(w) for k, w in p.items()}; v = dict(m); t = 0
loss, p, m, v, t = step(p, m, v, t, tokens, ks[10]); first = float(loss)
ms = []
for i in range(STEPS):
    start = time.perf_counter()
    loss, p, m, v, t = step(p, m, v, t, tokens, jax.random.fold_in(ks[11], i))
    loss.block_until_ready(); ms.append((time.perf_counter() - start) * 1e3)
ms.sort()
print(f"{ms[len(ms) // 2]:.3f} {first:g} {float(loss):g} jax {jax.__version__}")
"""


def run(cmd, env=None):
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        return None, (result.stdout + result.stderr).strip().splitlines()[-3:]
    return result.stdout.strip().splitlines()[-1], None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    work = os.path.join(args.build_dir, "bench-train-step")
    os.makedirs(work, exist_ok=True)
    cores = ",".join(str(c) for c in range(args.threads))
    pin = ["taskset", "-c", cores] if shutil.which("taskset") else []
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads),
               OMP_NUM_THREADS=str(args.threads),
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads="
               + str(args.threads))
    dims = [f"--dim={name}={size}" for name, size in SIZES.items()]
    meshc = os.path.join(args.build_dir, "compiler", "tools", "meshc")
    base = os.path.join(work, "lm")
    subprocess.run([meshc, os.path.join(ROOT, "dsl-examples", "transformer.mesh"), "--emit=cpp",
                    "-o", base, "--mesh", "data=1", "--layout", "auto", "--function", "lm_train"]
                   + dims, check=True)
    with open(os.path.join(work, "bench.cpp"), "w") as f:
        f.write('#include "lm.cpp"\n' + BENCH_MAIN)
    binary = os.path.join(work, "bench")
    blas = subprocess.run(["pkg-config", "--variable=includedir", "openblas"], capture_output=True,
                          text=True).stdout.strip()
    subprocess.run(["c++", "-O2", "-march=native", "-std=c++20", "-w", "-I", work,
                    "-I", os.path.join(ROOT, "runtime", "include"),
                    "-I", os.path.join(ROOT, "runtime", "kernels", "include"),
                    "-I", os.path.join(ROOT, "compiler", "codegen", "support")]
                   + (["-I", blas] if blas else ["-I", "/usr/include/x86_64-linux-gnu/openblas-pthread"])
                   + [os.path.join(work, "bench.cpp"), "-o", binary,
                      os.path.join(args.build_dir, "runtime", "kernels", "libmeshrt_kernels.a"),
                      os.path.join(args.build_dir, "runtime", "libmeshrt.a"), "-lopenblas",
                      "-lpthread"], check=True)

    shape = [str(SIZES[k]) for k in ("batch", "seq", "d_model", "heads", "d_head", "d_ff",
                                     "vocab")] + [str(args.threads), str(args.steps)]
    results = {}
    line, error = run(pin + [binary, str(args.steps)], env)
    results["meshc"] = line or error
    torch_python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    line, error = run(pin + [torch_python, "-c", TORCH] + shape, env)
    results["pytorch"] = line or error
    line, error = run(pin + [sys.executable, "-c", JAX] + shape, env)
    results["jax"] = line or error

    print(f"transformer-layer training step (forward, backward, AdamW), one rank, "
          f"{args.threads} thread(s), sizes {SIZES}")
    times = {}
    for name, value in results.items():
        if isinstance(value, str):
            fields = value.split()
            times[name] = float(fields[0])
            print(f"  {name:8} {times[name]:9.2f} ms/step  (loss {fields[1]} -> {fields[2]}; "
                  f"{' '.join(fields[3:])})")
        else:
            print(f"  {name:8} unavailable: {' | '.join(value)}")
    if "meshc" in times:
        for name, ms in times.items():
            if name != "meshc":
                print(f"  {name} / meshc = {ms / times['meshc']:.2f}  (> 1: meshc is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
