#!/usr/bin/env python3
"""dsl-examples/transformer.mesh on 4 ranks, [data=2, model=2] with the example's own layout
(batch over data; heads, d_ff and vocab over model): its `lm` forward and its `lm_train` step
(forward, backward, AdamW with clipping, warmup and cosine decay) built from meshc's generated
code, against JAX jit with the same sharding on 4 host devices
(XLA_FLAGS=--xla_force_host_platform_device_count=4; NamedSharding over a (data, model) Mesh, the
activations pinned to meshc's layout with with_sharding_constraint) and the same math: one-hot
token embedding + position embedding, pre-norm causal attention (scale 0.25, masked to -1e9),
tanh-GELU feed-forward with dropout 0.1 (train only), final norm, unembedding, log-softmax
cross-entropy over the positions that have a next token. Both run on the same 2 cores (taskset);
meshc's ranks are threads with one oneDNN thread each. Also counts the collectives each side
issues in the train step: meshc's from `meshc --emit=plan`, JAX's from the optimized HLO.

usage: bench/lm_sharded.py [--build-dir build] [--rounds 5] [--steps 10] [--old-build-dir OLD]
                           [--functions lm,lm_train]
       (--old-build-dir: another meshc build, e.g. main's, timed in the same rounds)
       (bench/compare.py runs this with the train-step comparisons)"""
import argparse
import os
import re
import subprocess
import sys

import benchlib

SIZES = {"batch": 8, "seq": 128, "mem": 128, "d_model": 256, "heads": 4, "d_head": 64,
         "d_ff": 1024, "vocab": 512, "layers": 2}
MESH = "data=2,model=2"
RANKS = 4
CORES = 2

JAX = r"""
import re, sys
B, S, D, H, DH, F, V, L = map(int, sys.argv[1:9])
WHICH = sys.argv[9]
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from benchlib import serve, learning_rate

mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))
at = lambda *spec: NamedSharding(mesh, P(*spec))
pin = lambda x, *spec: jax.lax.with_sharding_constraint(x, at(*spec))
# transformer.mesh's layout: batch: data, heads: model, d_ff: model, vocab: model.
LAYER = {"g1": (), "b1": (), "wq": (None, "model", None), "wk": (None, "model", None),
         "wv": (None, "model", None), "wo": ("model", None, None), "g2": (), "b2": (),
         "win": (None, "model"), "bin": ("model",), "wout": ("model", None), "bout": ()}
SPECS = {"tok": ("model", None), "pos": (), "unembed": (None, "model"), "gf": (), "bf": (),
         "layers": [LAYER] * L}
is_spec = lambda x: isinstance(x, tuple)
shardings = jax.tree.map(lambda spec: at(*spec), SPECS, is_leaf=is_spec)

keys = iter(jax.random.split(jax.random.PRNGKey(0), 64))
normal = lambda shape, std: jax.random.normal(next(keys), shape) * std
# lib/layers.mesh's init: stddev d_model^-1/2, and d_ff^-1/2 for w_out.
layer = lambda: {"g1": jnp.ones(D), "b1": jnp.zeros(D), "wq": normal((D, H, DH), D ** -0.5),
                 "wk": normal((D, H, DH), D ** -0.5), "wv": normal((D, H, DH), D ** -0.5),
                 "wo": normal((H, DH, D), D ** -0.5), "g2": jnp.ones(D), "b2": jnp.zeros(D),
                 "win": normal((D, F), D ** -0.5), "bin": jnp.zeros(F),
                 "wout": normal((F, D), F ** -0.5), "bout": jnp.zeros(D)}
params = {"tok": normal((V, D), 0.02), "pos": normal((S, D), 0.02),
          "unembed": normal((D, V), 0.02), "gf": jnp.ones(D), "bf": jnp.zeros(D),
          "layers": [layer() for _ in range(L)]}
params = jax.device_put(params, shardings)
tokens = jax.device_put(jax.random.randint(next(keys), (B, S), 0, V), at("data", None))
causal = jnp.tril(jnp.ones((S, S), bool))

def norm(x, gain, bias):
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * gain + bias

def decoder(p, tokens, dropout_key):
    x = jnp.einsum("bsv,vd->bsd", jax.nn.one_hot(tokens, V, dtype=jnp.float32), p["tok"])
    x = pin(x + p["pos"], "data", None, None)
    allowed = (tokens >= 0)[:, :, None] & causal[None]
    for i, q in enumerate(p["layers"]):
        h = norm(x, q["g1"], q["b1"])
        proj = lambda w: pin(jnp.einsum("bsd,dhe->bshe", h, w), "data", None, "model", None)
        qh, kh, vh = proj(q["wq"]), proj(q["wk"]), proj(q["wv"])
        scores = jnp.einsum("bshe,bmhe->bhsm", qh, kh) * 0.25
        weights = jax.nn.softmax(jnp.where(allowed[:, None], scores, -1e9), axis=-1)
        context = jnp.einsum("bhsm,bmhe->bshe", pin(weights, "data", "model", None, None), vh)
        x = pin(x + jnp.einsum("bshe,hed->bsd", context, q["wo"]), "data", None, None)
        f = jnp.einsum("bsd,df->bsf", norm(x, q["g2"], q["b2"]), q["win"]) + q["bin"]
        f = pin(jax.nn.gelu(f, approximate=True), "data", None, "model")
        if dropout_key is not None:
            keep = jax.random.bernoulli(jax.random.fold_in(dropout_key, i), 0.9, f.shape)
            f = jnp.where(keep, f / 0.9, 0.0)
        x = pin(x + jnp.einsum("bsf,fd->bsd", f, q["wout"]) + q["bout"], "data", None, None)
    logits = jnp.einsum("bsd,dv->bsv", norm(x, p["gf"], p["bf"]), p["unembed"])
    return pin(logits, "data", None, "model")

def loss_fn(p, tokens, dropout_key):
    logp = jax.nn.log_softmax(decoder(p, tokens, dropout_key), axis=-1)
    targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))
    has_next = jnp.pad((tokens[:, 1:] >= 0).astype(jnp.float32), ((0, 0), (0, 1)))
    token_loss = -jnp.sum(logp * jax.nn.one_hot(targets, V, dtype=jnp.float32), -1)
    return jnp.sum(token_loss * has_next) / jnp.sum(has_next)

def train_step(p, m, v, s, tokens, key):
    loss, g = jax.value_and_grad(loss_fn)(p, tokens, jax.random.fold_in(key, s))
    scale = 1.0 / jnp.maximum(jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(g))), 1.0)
    sf = s.astype(jnp.float32)
    lr = 3e-4 * learning_rate(sf, jnp.cos, jnp.minimum, jnp.maximum)
    c1, c2 = 1 - 0.9 ** (sf + 1), 1 - 0.95 ** (sf + 1)
    def update(w, g, m, v):
        g = g * scale
        m = 0.9 * m + 0.1 * g
        v = 0.95 * v + 0.05 * g * g
        return w - lr * ((m / c1) / (jnp.sqrt(v / c2) + 1e-8) + 0.1 * w), m, v
    out = jax.tree.map(update, p, g, m, v)
    part = lambda i: jax.tree.map(lambda o: o[i], out, is_leaf=is_spec)
    return loss, part(0), part(1), part(2), s + 1

replicated = at()
if WHICH == "lm":
    forward = jax.jit(lambda p, tokens: decoder(p, tokens, None),
                      in_shardings=(shardings, at("data", None)),
                      out_shardings=at("data", None, "model"))
    compiled = forward.lower(params, tokens).compile()
    def one_step():
        forward(params, tokens).block_until_ready()
        return 0.0
else:
    train = jax.jit(train_step, donate_argnums=(0, 1, 2),
                    in_shardings=(shardings, shardings, shardings, replicated,
                                  at("data", None), replicated),
                    out_shardings=(replicated, shardings, shardings, shardings, replicated))
    zeros = lambda: jax.device_put(jax.tree.map(jnp.zeros_like, params), shardings)
    state = [params, zeros(), zeros(), jnp.int32(0)]
    key = jax.random.PRNGKey(1)
    compiled = train.lower(*state, tokens, key).compile()
    def one_step():
        loss, *state[:] = train(*state, tokens, key)
        jax.block_until_ready(state)
        return float(loss)

# Collectives of the optimized HLO: an op follows its result's shape; async ones count at start.
hlo = compiled.as_text()
found = re.findall(r" (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                   r"(?:-start)?\(", hlo)
# Scalar ones: every result a f32[] (a tuple of scalars is one collective, as meshc would merge).
scalar = r"(?:/\*index=\d+\*/)?f32\[\]"
scalars = len(re.findall(rf"= (?:{scalar}|\({scalar}(?:, {scalar})*\)) all-reduce(?:-start)?\(",
                         hlo))
serve(one_step, f"collectives={len(found)} scalar={scalars} jax {jax.__version__}")
"""


def meshc_collectives(build_dir, function):
    """The collectives `meshc --emit=plan` lists for `function` (all phases) and how many of them
    move only f32 scalars (a merged bucket of scalars counts once, as JAX's tuple all-reduce)."""
    plan = subprocess.run([benchlib.meshc_path(build_dir), benchlib.TRANSFORMER, "--emit=plan",
                           "--mesh", MESH] + benchlib.dim_args(SIZES), capture_output=True,
                          text=True, check=True).stdout
    section = re.split(r"^plan of \w+ ", plan, flags=re.M)
    text = next(s for s in section if s.startswith(function + "\n"))
    total = sum(int(n) for n in re.findall(r"^collectives of the \w+ ops: (\d+)", text, re.M))
    scalars = len(re.findall(r"^  \S+\s+\w+ over .*: \d+ B of f32\[\] ", text, re.M))
    return total, scalars


def jax_contender(function, log_dir, pin=()):
    """JAX jit's `function` (lm or lm_train) on 4 host devices; it reports its HLO's collectives
    once compiled."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=benchlib.BENCH)
    shape = [str(SIZES[k]) for k in ("batch", "seq", "d_model", "heads", "d_head", "d_ff",
                                     "vocab", "layers")]
    return benchlib.Contender(f"jax {function}",
                              list(pin) + [sys.executable, "-c", JAX] + shape + [function], env,
                              log_dir)


def contenders(build_dir, log_dir, old_build_dir=None, functions=("lm", "lm_train")):
    """meshc's lm and lm_train on 4 thread ranks and JAX's on 4 host devices, pinned to CORES;
    with `old_build_dir`, also another meshc's (its compiler, headers and libraries), built into
    this build's work directory, as "old meshc ..."."""
    work = os.path.join(build_dir, "bench-lm-sharded")
    common = ["--mesh", MESH] + benchlib.dim_args(SIZES)
    pin = benchlib.pin(CORES)
    # Each rank is one thread: one oneDNN (OpenMP) thread each, as 4 ranks share 2 cores.
    meshc_env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    builds = [("meshc", build_dir, "")] + ([("old meshc", old_build_dir, "old-")]
                                           if old_build_dir else [])
    result = []
    for function in functions:
        class_name = {"lm": "Lm", "lm_train": "LmTrain"}[function]
        for name, build, prefix in builds:
            binary = benchlib.build_server(build, os.path.join(work, prefix + function),
                                           common + ["--function", function], class_name)
            result.append(benchlib.Contender(f"{name} {function}", pin + [binary], meshc_env,
                                             log_dir))
        result.append(jax_contender(function, log_dir, pin))
    return result


def rows(results):
    result = []
    for label, function in ((f"lm forward, 4 ranks [{MESH}]", "lm"),
                            (f"lm_train step, 4 ranks [{MESH}]", "lm_train")):
        if f"meshc {function}" not in results:
            continue
        result += benchlib.ratio_rows(label, results, f"meshc {function}", [f"jax {function}"])
        if f"old meshc {function}" in results:
            result += benchlib.ratio_rows(f"{label}, old meshc", results,
                                          f"old meshc {function}", [f"jax {function}"])
            result += benchlib.ratio_rows(f"{label}, meshc vs old", results,
                                          f"meshc {function}", [f"old meshc {function}"],
                                          goal=1.0)
    return result


def collective_line(build_dir, jax_contender):
    total, scalars = meshc_collectives(build_dir, "lm_train")
    jax_counts = dict(re.findall(r"(collectives|scalar)=(\d+)", jax_contender.info))
    jax_text = (f"{jax_counts['collectives']} ({jax_counts['scalar']} scalar)" if jax_counts
                else "unavailable")
    return (f"collectives per lm_train step on [{MESH}]: meshc {total} ({scalars} scalar, "
            f"from --emit=plan), JAX {jax_text} (optimized HLO)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", default=os.path.join(benchlib.ROOT, "build"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--old-build-dir",
                        help="also time another meshc build (e.g. main's) in the same rounds")
    parser.add_argument("--functions", default="lm,lm_train",
                        help="which to time: lm, lm_train or both (comma-separated)")
    parser.add_argument("--collectives", action="store_true",
                        help="only count the collectives per lm_train step (no timing)")
    args = parser.parse_args()
    if args.collectives:
        jax_train = jax_contender("lm_train", os.path.join(args.build_dir, "bench-lm-sharded"))
        jax_train.start()
        jax_train.close()
        print(collective_line(args.build_dir, jax_train))
        return 0
    print(f"transformer.mesh lm and lm_train on [{MESH}], sizes {SIZES}, {CORES} cores; "
          f"{args.rounds} rounds of {args.steps} steps")
    runners = contenders(args.build_dir, os.path.join(args.build_dir, "bench-lm-sharded"),
                         args.old_build_dir, args.functions.split(","))
    results = benchlib.alternate(runners, args.rounds, args.steps)
    benchlib.print_table(rows(results))
    if "lm_train" in args.functions.split(","):
        print(collective_line(args.build_dir, runners[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
