#!/usr/bin/env python3
"""A transformer-layer training step (forward, backward, AdamW with global-norm clipping) on one
rank: meshc's generated code vs PyTorch on the CPU (Debian's python3-torch, run by
/usr/bin/python3) and JAX (PyPI, jit-compiled) where they import, with the same sizes, the same
model and the same thread count, measured side by side in one run. Not a test: it prints
milliseconds per step (median of --steps timed steps after warm-up) and the ratios.

The model is dsl-examples/transformer.mesh's lm_train at --dim sizes (one decoder layer:
token + position embedding, pre-norm attention with a causal mask, GELU feed-forward with
dropout 0.1, final norm, unembedding, log-softmax cross-entropy; AdamW lr 3e-4, betas 0.9/0.95,
weight decay 0.1, clip_norm 1, the learning rate warmed up over 100 steps and then cosine-decayed
over 10000; weights initialized as lib/layers.mesh does, normal with stddev d_model^-1/2, d_ff^-1/2
for w_out, 0.02 for the embeddings: all three follow the example, so the losses they print are
comparable; the random draws of init, tokens and dropout masks differ). Every framework is
pinned to the same cores (taskset) and told to use that many threads (meshc: oneDNN's OpenMP
threads; PyTorch: set_num_threads; JAX: XLA's Eigen pool off for one thread, its default for
more). The contenders stay up and alternate round
by round (bench/benchlib.py); each round's figure is the median of --steps steps, the result the
median over --rounds rounds. bench/compare.py runs this with the other comparisons.

usage: bench/train_step.py [--build-dir build] [--threads 1] [--rounds 5] [--steps 10]
       (needs meshc, meshrt and meshrt_kernels built; scripts/install-deps --bench installs
       python3-torch and JAX)"""
import argparse
import os
import sys

import benchlib

ROOT = benchlib.ROOT
SIZES = {"batch": 8, "seq": 128, "mem": 128, "d_model": 256, "heads": 4, "d_head": 64,
         "d_ff": 1024, "vocab": 512, "layers": 1}

TORCH = r"""
import sys, torch
from benchlib import serve, learning_rate
B, S, D, H, DH, F, V, THREADS = map(int, sys.argv[1:9])
torch.set_num_threads(THREADS)
torch.manual_seed(0)
g = lambda *shape, std: torch.nn.Parameter(torch.randn(*shape) * std)
p = {"tok": g(V, D, std=0.02), "pos": g(S, D, std=0.02), "unembed": g(D, V, std=0.02),
     "g1": torch.nn.Parameter(torch.ones(D)), "b1": torch.nn.Parameter(torch.zeros(D)),
     "wq": g(D, H, DH, std=D ** -0.5), "wk": g(D, H, DH, std=D ** -0.5),
     "wv": g(D, H, DH, std=D ** -0.5), "wo": g(H, DH, D, std=D ** -0.5),
     "g2": torch.nn.Parameter(torch.ones(D)), "b2": torch.nn.Parameter(torch.zeros(D)),
     "win": g(D, F, std=D ** -0.5), "bin": torch.nn.Parameter(torch.zeros(F)),
     "wout": g(F, D, std=F ** -0.5), "bout": torch.nn.Parameter(torch.zeros(D)),
     "g3": torch.nn.Parameter(torch.ones(D)), "b3": torch.nn.Parameter(torch.zeros(D))}
opt = torch.optim.AdamW(p.values(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
# Step s (from 0) trains at 3e-4 * learning_rate(s): the example's warmup and cosine decay.
schedule = torch.optim.lr_scheduler.LambdaLR(opt, learning_rate)
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
    schedule.step()
    return loss.item()
serve(step, f"torch {torch.__version__}")
"""

JAX = r"""
import sys
from benchlib import serve, learning_rate
B, S, D, H, DH, F, V, THREADS = map(int, sys.argv[1:9])
import jax, jax.numpy as jnp
key = jax.random.PRNGKey(0)
ks = jax.random.split(key, 12)
n = lambda k, shape, std: jax.random.normal(k, shape) * std
p = {"tok": n(ks[0], (V, D), 0.02), "pos": n(ks[1], (S, D), 0.02),
     "unembed": n(ks[2], (D, V), 0.02), "g1": jnp.ones(D), "b1": jnp.zeros(D),
     "wq": n(ks[3], (D, H, DH), D ** -0.5), "wk": n(ks[4], (D, H, DH), D ** -0.5),
     "wv": n(ks[5], (D, H, DH), D ** -0.5), "wo": n(ks[6], (H, DH, D), D ** -0.5),
     "g2": jnp.ones(D), "b2": jnp.zeros(D), "win": n(ks[7], (D, F), D ** -0.5),
     "bin": jnp.zeros(F), "wout": n(ks[8], (F, D), F ** -0.5), "bout": jnp.zeros(D),
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
    lr, b1, b2, wd = 3e-4 * learning_rate(t, jnp.cos, jnp.minimum, jnp.maximum), 0.9, 0.95, 0.1
    t = t + 1
    def upd(w, g, m, v):
        g = g * scale; m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g * g
        mh = m / (1 - b1 ** t); vh = v / (1 - b2 ** t)
        return w - lr * (mh / (jnp.sqrt(vh) + 1e-8) + wd * w), m, v
    out = {k: upd(p[k], grads[k], m[k], v[k]) for k in p}
    return loss, {k: o[0] for k, o in out.items()}, {k: o[1] for k, o in out.items()}, \
        {k: o[2] for k, o in out.items()}, t
m = {k: jnp.zeros_like(w) for k, w in p.items()}
state, count = [p, m, dict(m), 0], [0]
def one_step():
    count[0] += 1
    loss, *state[:] = step(*state, tokens, jax.random.fold_in(ks[11], count[0]))
    jax.block_until_ready(state)
    return float(loss)
serve(one_step, f"jax {jax.__version__}")
"""


def contenders(build_dir, threads, log_dir):
    """meshc's generated lm_train (one rank), PyTorch and JAX, each pinned to `threads` cores and
    told to use that many threads."""
    work = os.path.join(build_dir, "bench-train-step")
    binary = benchlib.build_server(
        build_dir, work, ["--mesh", "data=1", "--layout", "auto", "--function", "lm_train"]
        + benchlib.dim_args(SIZES), "LmTrain")
    # One thread: XLA's Eigen pool off. More: XLA's defaults, held to the pinned cores.
    xla = "--xla_cpu_multi_thread_eigen=false" if threads == 1 else ""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               XLA_FLAGS=xla, PYTHONPATH=benchlib.BENCH)
    if threads > 1:
        # OpenMP's threads (meshc's and PyTorch's) wait by sleeping, not spinning: on this shared
        # machine a spinning thread burns the time slice its partner needs, and a fork-join step
        # ran 7-18x slower (bench/README.md). XLA's own pool is unaffected.
        env["OMP_WAIT_POLICY"] = "passive"
    shape = [str(SIZES[k]) for k in ("batch", "seq", "d_model", "heads", "d_head", "d_ff",
                                     "vocab")] + [str(threads)]
    pin = benchlib.pin(threads)
    return [benchlib.Contender("meshc", pin + [binary], env, log_dir),
            benchlib.Contender("pytorch", pin + [benchlib.TORCH_PYTHON, "-c", TORCH] + shape, env,
                               log_dir),
            benchlib.Contender("jax", pin + [sys.executable, "-c", JAX] + shape, env, log_dir)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    print(f"transformer-layer training step (forward, backward, AdamW), one rank, "
          f"{args.threads} thread(s), sizes {SIZES}; {args.rounds} rounds of {args.steps} steps")
    log_dir = os.path.join(args.build_dir, "bench-train-step")
    results = benchlib.alternate(contenders(args.build_dir, args.threads, log_dir), args.rounds,
                                 args.steps)
    for name, value in results.items():
        if isinstance(value, tuple):
            print(f"  {name:8} {value[0]:9.2f} ms/step  (loss {value[1]} -> {value[2]})")
        else:
            print(f"  {name:8} unavailable: {value}")
    benchlib.print_table(benchlib.ratio_rows(f"train step, 1 rank, {args.threads} thread(s)",
                                             results, "meshc", ["pytorch", "jax"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
