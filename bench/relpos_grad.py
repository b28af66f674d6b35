"""The relative-position table's gradient: the plain gather's scatter-add over H.T.S against
relpos.toeplitz_bias (diagonal sums, then a one-hot matmul into the buckets).

    python bench/relpos_grad.py [--heads 12] [--lengths 128 512] [--out f.json]

For each length, the jitted gradient of sum(bias * g) with respect to the [32, H] table, g a
[1, H, T, T] cotangent (what a training step hands the bias after its batch sum): best wall
time on this CPU (interleaved rounds), and XLA's cost analysis of each compiled program (FLOPs,
bytes accessed) and its scatter count, read from the compiled HLO. The forward of both is the
same gather, bit for bit (tests/test_relpos_gradient.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from common import emit, interleaved_best, machine, parser

from switchzoo.relpos import gather_bias, offset_buckets, toeplitz_bias


def programs(heads: int, T: int, bidirectional: bool = True):
    table = jax.random.normal(jax.random.key(0), (32, heads))
    g = jax.random.normal(jax.random.key(1), (1, heads, T, T))
    buckets = offset_buckets(T, T, bidirectional, 32, 128)

    def gather(t):
        return gather_bias(t, jnp.arange(T)[None], jnp.arange(T)[None], bidirectional, 128)

    def toeplitz(t):
        return toeplitz_bias(t, T, T, buckets)

    out = {}
    for name, f in (("scatter", gather), ("diagonals", toeplitz)):
        grad = jax.grad(lambda t, g, f=f: jnp.sum(f(t) * g))    # g an argument: not folded
        out[name] = (jax.jit(grad).lower(table, g).compile(), (table, g))
    return out


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    rows = []
    for T in args.lengths:
        progs = programs(args.heads, T)
        fns = [lambda c=c, a=a: jax.block_until_ready(c(*a)) for c, a in progs.values()]
        seconds = interleaved_best(fns, args.repeats, 1)
        row = {"length": T, "heads": args.heads}
        for (name, (compiled, _)), s in zip(progs.items(), seconds):
            cost = compiled.cost_analysis()
            cost = cost[0] if isinstance(cost, list) else cost
            row[name] = {"ms": round(s * 1e3, 3), "flops": cost.get("flops"),
                         "bytes_accessed": cost.get("bytes accessed"),
                         "scatters": compiled.as_text().count(" scatter(")}
        row["speedup"] = round(row["scatter"]["ms"] / row["diagonals"]["ms"], 2)
        rows.append(row)
    result = {"bench": "relpos_grad", "machine": machine(), "rows": rows}
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
