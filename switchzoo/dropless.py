"""Dropless experts: sort the (token, pick) assignments by expert, run every expert on exactly
its tokens, un-sort. No capacity, so no token is dropped and no slot is padding.

The grouped computation is ``lax.ragged_dot`` (efficient where the backend has a
grouped-matmul kernel), a block-sparse matmul (switchzoo/grouped.py, MegaBlocks-style): each
expert's rows are padded to a multiple of ``block`` rows and a loop runs one [block, D] x
[D, F] matmul per non-empty block, so the work is the real tokens plus at most ``block - 1``
rows per expert; or, for a few rows on a CPU, a branch per expert (grouped.each_expert).
On CPU (and on GPU without a grouped-GEMM lowering) ``ragged_dot`` computes every group
against every row (E times the work); the block loop does not. "auto" tells the two apart by
the compiled FLOPs of a ragged_dot of the layer's shape (``resolve``).

Under a layout that splits the experts over mesh axes the layer runs per device in
``shard_map``: tokens split over the same axes go to the device holding their expert with one
all-to-all and come back with another (expert weights never move). The exchange buffers are
sized for the worst case (every local token picking one device's experts): n x the local
tokens for n expert shards, the price of static shapes without drops.

Shapes (switchzoo.dims): N local tokens (all of them are routed together, one group),
P picks per token, A assignments ((token, pick) pairs: N*P, or the n*A a device receives in
the exchange), E experts on this device, D and F the model and hidden widths. The block loop's
padded rows and blocks are named, not lettered (``x_padded``, ``block_expert``).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from switchzoo import grouped, permute
from switchzoo.grouped import block_matmul
from switchzoo.layers import dropout, mlp
from switchzoo.layout import Layout, LayoutError, spec_axes


# "auto" takes ragged_dot when its compiled FLOPs are within this factor of the real ones.
RAGGED_DOT_SLACK = 1.5
# "auto" takes each_expert for at most this many assignments and experts (decoding's), where
# EACH_EXPERT allows: None, on a CPU (measured there); bench/cuda_hlo.py sets False.
EACH_EXPERT_ROWS, EACH_EXPERT_MAX, EACH_EXPERT = 128, 32, None


@functools.lru_cache(maxsize=None)
def _ragged_dot_flops(backend: str, rows: int, d_in: int, d_out: int, experts: int,
                      dtype: str) -> float | None:
    """XLA's FLOP count of one compiled ``lax.ragged_dot`` [rows, d_in] x [experts, d_in,
    d_out] on ``backend`` (abstract inputs: nothing is allocated or run); None where the
    backend gives no count."""
    x = jax.ShapeDtypeStruct((rows, d_in), dtype)
    w = jax.ShapeDtypeStruct((experts, d_in, d_out), dtype)
    sizes = jax.ShapeDtypeStruct((experts,), jnp.int32)
    try:
        compiled = jax.jit(jax.lax.ragged_dot).lower(x, w, sizes).compile()
        cost = compiled.cost_analysis()
    except Exception:            # noqa: BLE001 -- a backend without the op or the analysis
        return None
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = (cost or {}).get("flops")
    return float(flops) if flops else None


def ragged_dot_cost(rows: int, d_in: int, d_out: int, experts: int,
                    dtype="float32") -> float | None:
    """Compiled FLOPs of ragged_dot at this shape / the real grouped matmul's 2 x rows x d_in x
    d_out, on the default backend: ~1 where it has a grouped-matmul lowering, ~``experts``
    where XLA expands it into a dense dot per group (XLA:CPU; XLA:GPU without a grouped GEMM).
    Compiled once per (backend, shape, dtype); None where the backend reports no FLOPs."""
    flops = _ragged_dot_flops(jax.default_backend(), rows, d_in, d_out, experts,
                              jnp.dtype(dtype).name)
    return None if flops is None else flops / (2.0 * rows * d_in * d_out)


def _backend() -> str:
    return jax.default_backend()


@functools.lru_cache(maxsize=None)
def path_seconds(backend: str, rows: int, d_in: int, d_out: int, experts: int,
                 dtype: str, repeats: int = 3) -> dict:
    """{impl: best seconds} of the experts' MLP (run_experts), forward and backward, at this
    shape with tokens spread evenly over the experts, for ragged_dot and blocks, on the
    default device (once per shape and process; evaluated eagerly even while a step traces)."""
    import time

    rng = np.random.default_rng(0)
    with jax.ensure_compile_time_eval():
        x = jnp.asarray(rng.normal(size=(rows, d_in)), dtype)
        expert = jnp.asarray(np.arange(rows) * experts // rows, jnp.int32)
        w = {"wi": jnp.asarray(rng.normal(size=(experts, d_in, d_out)) / d_in ** .5, dtype),
             "wo": jnp.asarray(rng.normal(size=(experts, d_out, d_in)) / d_out ** .5, dtype)}
        out = {}
        for impl in ("ragged_dot", "blocks"):
            # ``expert`` an argument, as in the layer: its sorting and counts run in the timed
            # program (closed over, they were evaluated op by op here at trace time)
            def loss(x, w, expert, impl=impl):
                return jnp.sum(run_experts(x, expert, w, impl).astype(jnp.float32))
            step = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w, expert).compile()
            jax.block_until_ready(step(x, w, expert))
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                jax.block_until_ready(step(x, w, expert))
                best = min(best, time.perf_counter() - start)
            out[impl] = best
    return out


def resolve(impl: str, rows: int | None = None, d_in: int | None = None,
            d_out: int | None = None, experts: int | None = None, dtype="float32") -> str:
    """"auto": ragged_dot where its compiled program does the real tokens' work (within
    RAGGED_DOT_SLACK of it), blocks where it does more. Decided by compiling a ragged_dot of
    the layer's shape (ragged_dot_cost; at trace time, cached), since a backend name does not
    say: XLA:CPU expands ragged_dot into a dense dot over every group. Where the count is below
    the real work, the analysis cannot see the grouped kernel (XLA:GPU, jax 0.11: 0.4-3% of
    it), so auto times both paths at the layer's shape and takes the faster (path_seconds;
    process 0's choice on every process; why: docs/benchmarks.md's H200 figures). Without a
    shape: ragged_dot on GPU and TPU, blocks elsewhere."""
    if impl != "auto":
        return impl
    ratio = None if rows is None else ragged_dot_cost(rows, d_in, d_out, experts, dtype)
    backend = _backend()
    if rows is not None and backend in ("gpu", "tpu") and (
            ratio is None or ratio < 1 / RAGGED_DOT_SLACK):
        seconds = path_seconds(backend, rows, d_in, d_out, experts, jnp.dtype(dtype).name)
        return _agreed(min(seconds, key=seconds.get), (rows, d_in, d_out, experts,
                                                        jnp.dtype(dtype).name))
    if ratio is None:
        return "ragged_dot" if backend in ("gpu", "tpu") else "blocks"
    return "ragged_dot" if ratio <= RAGGED_DOT_SLACK else "blocks"


_AGREED: dict = {}


def _agreed(choice: str, shape: tuple) -> str:
    """Process 0's choice at ``shape`` on every process: each times the paths itself, and on a
    near tie processes could otherwise compile different programs for one step. Agreed at
    trace time through the jax.distributed key-value store (as JAX's compiler shares its
    caches): no device computation, which tracing forbids."""
    if jax.process_count() == 1:
        return choice
    if shape not in _AGREED:
        from jax._src import distributed        # the store's client: JAX's only handle on it
        client, key = distributed.global_state.client, "switchzoo/dropless/" + "/".join(
            map(str, shape))
        if jax.process_index() == 0:
            client.key_value_set(key, choice)
        _AGREED[shape] = client.blocking_key_value_get(key, 600_000)
    return _AGREED[shape]



# -------------------------------------------------------------------- experts on sorted rows

def run_experts(x_AD, expert_A, w: dict, impl: str = "blocks", block: int = 128,
                dropout_fn=lambda h: h):
    """Each assignment through its expert's MLP (layers.mlp, unweighted), ``w`` one device's
    expert weights ({"wi" or "wi_0"/"wi_1": [E, D, F], "wo": [E, F, D]}); assignments with
    expert id >= E get zero."""
    E = w["wo"].shape[0]
    A, D = x_AD.shape
    first = w["wi" if "wi" in w else "wi_0"]
    if (impl == "auto" and A <= EACH_EXPERT_ROWS and E <= EACH_EXPERT_MAX
            and grouped.on_cpu_unless(EACH_EXPERT)):
        return grouped.each_expert(x_AD, expert_A, w, dropout_fn)
    impl = resolve(impl, A, D, first.shape[-1], E, x_AD.dtype)
    order_A = jnp.argsort(expert_A, stable=True)
    expert_sorted_A = expert_A[order_A]
    counts_E = jnp.bincount(jnp.minimum(expert_A, E), length=E + 1)[:E].astype(jnp.int32)
    sorted_A = permute.inverse_of(order_A, A)          # each assignment's sorted position
    if impl == "ragged_dot":
        def matmul(x, weight):
            return jax.lax.ragged_dot(x, weight.astype(x.dtype), counts_E)

        y_sorted_AD = mlp(permute.gather(x_AD, order_A, sorted_A), w, matmul,
                          dropout_fn=dropout_fn)
        y_sorted_AD = jnp.where((expert_sorted_A < E)[:, None], y_sorted_AD, 0)
        return permute.gather(y_sorted_AD, sorted_A, order_A)

    # Blocks: pad each expert's assignments to a multiple of the block size.
    block = min(block, max(8, 1 << (A - 1).bit_length()))       # no bigger than needed
    padded_E = (counts_E + block - 1) // block * block
    padded_end_E = jnp.cumsum(padded_E)
    start_E = jnp.cumsum(counts_E) - counts_E
    rows = math.ceil((A + E * (block - 1)) / block) * block        # static bound on padded rows
    valid_A = expert_sorted_A < E
    clipped_A = jnp.minimum(expert_sorted_A, E - 1)
    rank_A = jnp.arange(A) - start_E[clipped_A]
    row_A = jnp.where(valid_A, padded_end_E[clipped_A] - padded_E[clipped_A] + rank_A, rows)
    # Each padded row's assignment (A: a padding row) and each assignment's padded row (rows:
    # dropped), composed with the sort: one gather each way, each the other's gradient.
    sorted_row = permute.inverse_of(row_A, rows)
    assignment_row = jnp.where(sorted_row < A, order_A[jnp.minimum(sorted_row, A - 1)], A)
    row_of_A = row_A[sorted_A]
    x_padded = permute.gather(x_AD, assignment_row, row_of_A)
    num_blocks = padded_end_E[-1] // block
    block_expert = jnp.minimum(jnp.searchsorted(padded_end_E, jnp.arange(rows // block) * block,
                                                side="right"), E - 1).astype(jnp.int32)

    def matmul(x, weight):
        return block_matmul(x, weight.astype(x.dtype), block_expert, num_blocks, block)

    y_padded = mlp(x_padded, w, matmul, dropout_fn=dropout_fn)
    return permute.gather(y_padded, row_of_A, assignment_row)


# ------------------------------------------------------------------------ the whole layer

def _layer(x_BLD, index_BLP, gates_BLP, valid_BL, w: dict, rng=None, *, num_experts: int,
           expert_axes: tuple, ff_axes: tuple, exchange: bool, impl: str, block: int,
           rate: float, pin=lambda a: a):
    """One device's share (or the whole layer, with no axes). ``pin`` is applied to what the
    all-to-alls send and receive (inside a vmap, a sharding constraint: without one GSPMD
    compiles a vmapped all_to_all into all-gathers)."""
    if rng is not None and (expert_axes or ff_axes):
        rng = jax.random.fold_in(rng, jax.lax.axis_index(tuple(expert_axes) + tuple(ff_axes)))
    dropout_fn = functools.partial(dropout, rate=rate, rng=rng)
    B, L, D = x_BLD.shape
    P = index_BLP.shape[-1]
    x_ND = x_BLD.reshape(B * L, D)
    E_local = w["wo"].shape[0]
    n = num_experts // E_local
    x_AD = jnp.repeat(x_ND, P, axis=0)        # assignment a = n * P + p reads token n
    expert_A = jnp.where(jnp.repeat(valid_BL.reshape(-1), P), index_BLP.reshape(-1),
                         num_experts)
    gate_A = gates_BLP.reshape(-1).astype(x_BLD.dtype)
    run = functools.partial(run_experts, w=w, impl=impl, block=block, dropout_fn=dropout_fn)

    if exchange:
        # Tokens are split over the expert axes: send each assignment to its expert's device.
        A = expert_A.shape[0]
        order = jnp.argsort(expert_A, stable=True)
        e_s = expert_A[order]
        dest_s = e_s // E_local                                      # n for padding
        count_n = jnp.bincount(dest_s, length=n + 1)[:n]
        start_n = jnp.cumsum(count_n) - count_n
        slot_s = jnp.arange(A) - start_n[jnp.minimum(dest_s, n - 1)]
        # each sent row's assignment, and each assignment's sent row (n A: stays)
        flat_s = dest_s * A + slot_s
        sent = permute.inverse_of(flat_s, n * A)
        sent_a = jnp.where(sent < A, order[jnp.minimum(sent, A - 1)], A)
        row_a = flat_s[permute.inverse_of(order, A)]
        send_x = permute.gather(x_AD, sent_a, row_a).reshape(n, A, D)
        send_e = jnp.full((n, A), E_local, jnp.int32).at[dest_s, slot_s].set(
            e_s % E_local, mode="drop")
        swap = lambda a: pin(jax.lax.all_to_all(pin(a), expert_axes, 0, 0))
        recv_x, recv_e = swap(send_x), swap(send_e)
        y = run(recv_x.reshape(n * A, D), recv_e.reshape(n * A))
        if ff_axes:
            y = jax.lax.psum(y, ff_axes)
        back = swap(y.reshape(n, A, D))
        out_A = permute.gather(back.reshape(n * A, D), row_a, sent_a)
        return jnp.sum((gate_A[:, None] * out_A).reshape(B * L, P, D), axis=1).reshape(B, L, D)

    # Tokens are replicated over the expert axes (or there are none): each device runs its own
    # experts on the assignments that picked them, then the partial outputs are summed.
    first = (jax.lax.axis_index(expert_axes) * E_local) if expert_axes else 0
    local = expert_A - first
    local = jnp.where((local >= 0) & (local < E_local), local, E_local)
    y = run(x_AD, local)
    y_ND = jnp.sum((gate_A[:, None] * y).reshape(B * L, P, D), axis=1)
    if expert_axes or ff_axes:
        y_ND = jax.lax.psum(y_ND, tuple(expert_axes) + tuple(ff_axes))
    return y_ND.reshape(B, L, D)


def plan(layout: Layout, x_shape, w_shapes: dict):
    """How the layer splits over ``layout``'s mesh: (expert axes, d_ff axes, whether tokens
    are exchanged, the tokens' spec, the weights' specs); a LayoutError if it cannot run."""
    specs = {k: layout.spec(("experts", "d_ff", "d_model") if k == "wo" else
                            ("experts", "d_model", "d_ff"), shape, f"experts/{k}")
             for k, shape in w_shapes.items()}
    wi_spec = tuple(specs["wi" if "wi" in specs else "wi_0"]) + (None,) * 3
    expert_axes, d_axes, ff_axes = (spec_axes(e) for e in wi_spec[:3])
    if d_axes:
        raise LayoutError(f"moe.dispatch='dropless' needs d_model unsplit in the experts, but "
                          f"layout {layout.text!r} splits it over {d_axes}; use the einsum "
                          "dispatch with this layout, or drop d_model from it")
    x_spec = layout.spec(("batch", "length", "d_model"), x_shape, strict=False)
    batch_axes = spec_axes(tuple(x_spec)[0] if len(x_spec) else None)
    shared = tuple(a for a in batch_axes if a in expert_axes)
    if shared and set(shared) != set(expert_axes):
        raise LayoutError(f"moe.dispatch='dropless': layout {layout.text!r} splits the batch "
                          f"over some of the experts' axes {expert_axes} but not all; split it "
                          "over all of them (expert parallelism) or none")
    if shared and shared != expert_axes:
        raise LayoutError(f"moe.dispatch='dropless': list the expert axes {expert_axes} in the "
                          f"same order for batch and experts in layout {layout.text!r}")
    return expert_axes, ff_axes, bool(shared), x_spec, specs


def supports(layout: Layout | None, x_shape, w_shapes: dict) -> bool:
    if layout is None or layout.mesh.size == 1:
        return True
    try:
        plan(layout, x_shape, w_shapes)
    except LayoutError:
        return False
    return True


def layer(x_BLD, index_BLP, gates_BLP, valid_BL, w: dict, num_experts: int,
          layout: Layout | None, impl: str = "auto", block: int = 128, rate: float = 0.0,
          rng=None):
    """y_BLD = sum over picks of gate * expert(x), every pick served; expert dropout at ``rate``
    with ``rng``. ``w``: the expert weights (layers.ffn_weights). ``layout`` None (or a
    one-device mesh): computed in place; else per device under shard_map."""
    kw = dict(num_experts=num_experts, impl=impl, block=block, rate=rate)   # run_experts resolves
    if layout is None or layout.mesh.size == 1:
        return _layer(x_BLD, index_BLP, gates_BLP, valid_BL, w, rng, expert_axes=(),
                      ff_axes=(), exchange=False, **kw)
    if layout.exchange:     # a pipeline's shard, holding its own experts (pipeline.SHARDS)
        return _layer(x_BLD, index_BLP, gates_BLP, valid_BL, w, rng,
                      expert_axes=(layout.exchange,), ff_axes=(), exchange=True,
                      pin=lambda a: layout.constrain(a, (None,) * a.ndim), **kw)
    names = list(w)
    expert_axes, ff_axes, exchange, x_spec, specs = plan(
        layout, x_BLD.shape, {k: v.shape for k, v in w.items()})
    body = functools.partial(_layer, expert_axes=expert_axes, ff_axes=ff_axes,
                             exchange=exchange, **kw)

    def per_device(x, idx, gates, valid, rng, *ws):
        return body(x, idx, gates, valid, dict(zip(names, ws)), rng)

    tok = PartitionSpec(*x_spec)
    in_specs = (tok, tok, tok, PartitionSpec(*tuple(x_spec)[:2]),
                None if rng is None else PartitionSpec(), *(specs[k] for k in names))
    fn = jax.shard_map(per_device, mesh=layout.mesh, in_specs=in_specs, out_specs=tok,
                       check_vma=False)
    return fn(x_BLD, index_BLP, gates_BLP, valid_BL, rng, *(w[k] for k in names))
