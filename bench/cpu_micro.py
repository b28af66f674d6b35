"""Three XLA:CPU facts behind issue 67's CPU figures, each timed in isolation at the peer
config's sizes (bench/peer.py), one process pinned to --threads CPUs:

* greedy's token: ``jnp.argmax`` over [batch, vocab] against ``decoding.first_max`` (two plain
  reductions);
* AdamW on the peer model's 23.1M parameters (its shapes): optax.adamw, the same update as one
  hand-written expression, and torch's fused AdamW;
* a decoding loop's q/k/v projections of 8 rows: three [D, H, K] weights against one
  [D, 3, H, K] weight (32 scanned steps of 4 layers, with an FFN between).

    python bench/cpu_micro.py [--threads 1] [--out docs/bench/cpu_micro.json] [peer.py size flags]
"""
from __future__ import annotations

import os
import sys
import time

from common import emit, machine, parser


def best_of(f, *args, calls: int, rounds: int = 5) -> float:
    """Best seconds per call of jitted ``f`` over ``rounds`` rounds of ``calls`` calls."""
    import jax
    out = f(*args)
    jax.block_until_ready(out)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            out = f(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def greedy_token(vocab: int, batch: int) -> dict:
    import jax
    import jax.numpy as jnp
    from switchzoo.decoding import first_max
    x = jax.random.normal(jax.random.key(0), (batch, vocab))
    argmax = jax.jit(lambda x: jnp.argmax(x, -1).astype(jnp.int32))
    assert (argmax(x) == jax.jit(first_max)(x)).all()
    return {"shape": [batch, vocab],
            "jnp_argmax_us": round(1e6 * best_of(argmax, x, calls=400), 1),
            "first_max_us": round(1e6 * best_of(jax.jit(first_max), x, calls=400), 1)}


def peer_shapes(a) -> list[tuple]:
    """The peer model's parameter shapes (bench/peer.py's defaults)."""
    D, F, E, V, HK = a.d_model, a.d_ff, a.experts, a.vocab, a.heads * a.d_kv
    sparse = a.layers // a.sparse_step                 # per stack
    dense = a.layers - sparse
    attention = (4 * a.layers + 4 * a.layers + 4 * a.layers)   # enc self, dec self, dec cross
    return ([(E, D, F), (E, F, D)] * (2 * sparse) + [(D, F), (F, D)] * (2 * dense)
            + [(V, D)] + [(D, HK)] * attention)


def adamw(shapes: list[tuple]) -> dict:
    import jax
    import jax.numpy as jnp
    import optax
    params = [jax.random.normal(jax.random.key(i), s) for i, s in enumerate(shapes)]
    grads = [0.01 * p for p in params]
    tx = optax.adamw(1e-3, b1=0.9, b2=0.98, weight_decay=0.0)

    def optax_step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    def by_hand(p, s, g, lr=1e-3, b1=0.9, b2=0.98, eps=1e-8):
        m, v, c = s
        c = c + 1
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g)]
        p = [pi - lr * (mi / (1 - b1 ** c)) / (jnp.sqrt(vi / (1 - b2 ** c)) + eps)
             for pi, mi, vi in zip(p, m, v)]
        return p, (m, v, c)

    def timed(step, state):
        f = jax.jit(step, donate_argnums=(0, 1))
        p, s = [x + 0 for x in params], state
        p, s = f(p, s, grads)
        jax.block_until_ready(p)
        start = time.perf_counter()
        for _ in range(20):
            p, s = f(p, s, grads)
        jax.block_until_ready(p)
        fusions = f.lower(p, s, grads).compile().as_text().count(" fusion(")
        return round(1e3 * (time.perf_counter() - start) / 20, 2), fusions

    zeros = [jnp.zeros_like(x) for x in params]
    out = {"parameters": sum(int(x.size) for x in params), "leaves": len(params)}
    out["optax_adamw_ms"], out["optax_fusions"] = timed(optax_step, tx.init(params))
    out["one_expression_ms"], out["one_expression_fusions"] = timed(
        by_hand, (zeros, [jnp.zeros_like(x) for x in params], jnp.float32(0)))
    import torch
    tp = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    for p in tp:
        p.grad = 0.01 * p.detach()
    opt = torch.optim.AdamW(tp, lr=1e-3, betas=(0.9, 0.98), weight_decay=0.0, fused=True)
    for _ in range(3):
        opt.step()
    start = time.perf_counter()
    for _ in range(20):
        opt.step()
    out["torch_fused_adamw_ms"] = round(1e3 * (time.perf_counter() - start) / 20, 2)
    return out


def qkv_in_a_loop(a, batch: int, steps: int = 32) -> dict:
    import jax
    import jax.numpy as jnp
    D, H, K, F, layers = a.d_model, a.heads, a.d_kv, a.d_ff, a.layers
    key = jax.random.key
    qkv = [[0.06 * jax.random.normal(key(10 * i + j), (D, H, K)) for j in range(3)]
           for i in range(layers)]
    ffn = [0.03 * jax.random.normal(key(100 + i), (D, F)) for i in range(layers)]
    x0 = jax.random.normal(key(0), (batch, 1, D))

    def run(project):
        def f(x0, qkv, ffn):
            def step(x, _):
                for w, b in zip(qkv, ffn):
                    s = sum(y.sum((1, 3)) for y in project(x, w))
                    x = jnp.tanh(x + 0.01 * (jnp.tanh(x @ b) @ b.T) + 0.0 * s.mean())
                return x, None
            return jax.lax.scan(step, x0, None, length=steps)[0]
        return jax.jit(f)

    separate = run(lambda x, w: [jnp.swapaxes(jnp.einsum("BTD,DHK->BTHK", x, m), 1, 2)
                                 for m in w])
    fused = run(lambda x, w: list(jnp.einsum("BTD,DCHK->CBHTK", x, jnp.stack(w, axis=1))))
    return {"steps": steps, "layers": layers, "rows": batch,
            "separate_ms": round(1e3 * best_of(separate, x0, qkv, ffn, calls=3), 2),
            "fused_ms": round(1e3 * best_of(fused, x0, qkv, ffn, calls=3), 2)}


def main(argv=None) -> dict:
    sys.path.insert(0, os.path.dirname(__file__))
    import peer
    p = parser(__doc__)
    p.add_argument("--threads", type=int, default=1)
    args, rest = p.parse_known_args(argv)
    a = peer.build_parser().parse_args(rest)          # the peer model's sizes (its flags)
    allowed = os.sched_getaffinity(0)
    try:
        note = peer.limit_threads(args.threads)
        import torch
        torch.set_num_threads(args.threads)
        result = {"benchmark": "cpu_micro: argmax, AdamW and q/k/v projections on XLA:CPU",
                  "machine": machine(), "threads": args.threads, "threads_note": note,
                  "greedy_token": greedy_token(a.vocab, a.batch),
                  "adamw": adamw(peer_shapes(a)),
                  "qkv_in_a_decoding_loop": qkv_in_a_loop(a, a.batch)}
    finally:
        os.sched_setaffinity(0, allowed)
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
