"""The dropless dispatch against the einsum one (nothing dropped) and the per-token oracle."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from switchzoo import layout as L
from switchzoo.config import MoeConfig
from switchzoo.grouped import block_matmul
from switchzoo.inspector import count_collectives
from switchzoo.moe import SwitchFFN
from tests.test_moe import oracle, run     # run: the layer compiled, not op by op

D, F, E = 16, 32, 8


def pair(top_k=1, activation="relu", impl="blocks", block=4, group_size=16):
    """The same weights twice: einsum with room for every token, and dropless."""
    einsum = MoeConfig(num_experts=E, top_k=top_k, group_size=group_size, min_capacity=1,
                       dispatch="einsum",
                       train_capacity_factor=float(E), eval_capacity_factor=float(E))
    drop = dataclasses.replace(einsum, dispatch="dropless", grouped_matmul=impl, block_size=block)
    return (SwitchFFN(D, F, einsum, nnx.Rngs(0), activation),
            SwitchFFN(D, F, drop, nnx.Rngs(0), activation))


def loss_and_grads(ffn, x, valid=None, layout=None):
    graphdef, state = nnx.split(ffn)

    @jax.jit
    def f(state, x):
        with L.use(layout):
            y, stats = nnx.merge(graphdef, state)(x, valid_BL=valid)
        return jnp.sum(jnp.sin(y)) + stats["aux_loss"], (y, stats)

    (loss, (y, stats)), grads = jax.value_and_grad(f, has_aux=True)(state, x)
    return y, stats, grads


def assert_same(a, b):
    ya, sa, ga = a
    yb, sb, gb = b
    np.testing.assert_allclose(ya, yb, rtol=1e-5, atol=1e-6)
    for k in ("aux_loss", "z_loss", "dropped_fraction", "expert_load"):
        np.testing.assert_allclose(sa[k], sb[k], rtol=1e-6, atol=1e-7)
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-6), ga, gb)


@pytest.mark.parametrize("top_k, activation, impl", [
    (1, "relu", "blocks"), (2, "relu", "blocks"), (2, "gated-gelu", "blocks"),
    (1, "relu", "ragged_dot"), (2, "gated-gelu", "ragged_dot")])
def test_equals_einsum_dispatch_when_nothing_drops(top_k, activation, impl):
    einsum, drop = pair(top_k, activation, impl)
    x = jax.random.normal(jax.random.key(1), (4, 8, D))
    valid = jnp.ones((4, 8), bool).at[1, 5:].set(False)
    assert_same(loss_and_grads(einsum, x, valid), loss_and_grads(drop, x, valid))


def test_equals_the_per_token_oracle_where_einsum_would_drop():
    einsum, drop = pair(top_k=2)
    x = jax.random.normal(jax.random.key(2), (4, 8, D))
    y, stats = run(drop, x)
    want, kept = oracle(einsum, x, capacity=16)      # every token of a 16-token group
    assert kept.all()
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    # Low capacity drops tokens on the einsum path; dropless serves them all the same.
    low = SwitchFFN(D, F, dataclasses.replace(drop.cfg, train_capacity_factor=0.25,
                                              eval_capacity_factor=0.25), nnx.Rngs(0))
    y_low, s_low = run(low, x)
    np.testing.assert_allclose(y_low, want, rtol=1e-5, atol=1e-6)
    assert float(s_low["dropped_fraction"]) == 0.0


def test_block_matmul_and_its_gradients_equal_a_dense_reference():
    rng = np.random.default_rng(0)
    block, counts = 4, [3, 0, 9, 4]                     # an empty expert and a partial block
    padded = [-(-c // block) * block for c in counts]
    rows = np.zeros((sum(padded) + 2 * block, D), np.float32)   # two trailing empty blocks
    expert_of_row = np.full(len(rows), -1)
    at = 0
    for e, (c, p) in enumerate(zip(counts, padded)):
        rows[at:at + c] = rng.normal(size=(c, D))
        expert_of_row[at:at + p] = e
        at += p
    w = jnp.asarray(rng.normal(size=(4, D, F)), jnp.float32)
    block_e = jnp.asarray(np.maximum(expert_of_row[::block], 0), jnp.int32)
    n_blocks = jnp.int32(sum(padded) // block)

    def ours(x, w):
        return block_matmul(x, w, block_e, n_blocks, block)

    def dense(x, w):
        out = jnp.einsum("rd,rdf->rf", x, w[np.maximum(expert_of_row, 0)])
        return jnp.where((expert_of_row >= 0)[:, None], out, 0)

    x = jnp.asarray(rows)
    np.testing.assert_allclose(ours(x, w), dense(x, w), rtol=1e-5, atol=1e-5)
    cot = jnp.asarray(rng.normal(size=(len(rows), F)), jnp.float32)
    g1 = jax.vjp(ours, x, w)[1](cot)
    g2 = jax.vjp(dense, x, w)[1](cot)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("preset, mesh", [
    ("expert_parallel", "expert:8"),               # tokens exchanged by all-to-all
    ("dp_mp_ep", "data:2,model:2,expert:2"),       # + d_ff split: partial sums over 'model'
    ("batch:data,experts:expert", "data:2,expert:4"),   # tokens replicated over 'expert'
])
def test_sharded_dropless_equals_one_device(preset, mesh):
    einsum, drop = pair(top_k=2, group_size=8)
    x = jax.random.normal(jax.random.key(3), (8, 8, D))
    valid = jnp.ones((8, 8), bool).at[3, 6:].set(False)
    lay = L.Layout.create(preset, mesh)
    assert_same(loss_and_grads(einsum, x, valid), loss_and_grads(drop, x, valid, lay))


def test_expert_parallel_dropless_moves_tokens_with_all_to_all():
    _, drop = pair(group_size=8)
    graphdef, state = nnx.split(drop)
    lay = L.Layout.create("expert_parallel", "expert:8")

    @jax.jit
    def step(state, x):
        def loss(state):
            with L.use(lay):
                return jnp.sum(nnx.merge(graphdef, state)(x)[0])
        return jax.grad(loss)(state)

    x = jax.device_put(jnp.ones((8, 8, D)), lay.sharding(("batch", "length", "d_model")))
    counts = count_collectives(step.lower(state, x).compile().as_text())
    # forward: tokens + expert ids out, outputs back; backward: the transposes of both moves
    assert counts["all-to-all"] >= 4, counts
    assert counts["all-gather"] == 0, counts


def test_dropless_refuses_a_layout_it_cannot_run():
    _, drop = pair()
    lay = L.Layout.create("2d", "data:4,model:2")
    with pytest.raises(L.LayoutError, match="d_model unsplit"):
        with L.use(lay):
            jax.jit(lambda x: drop(x)[0]).lower(jnp.ones((8, 8, D)))


def test_generation_and_run_config_select_dropless():
    import switchzoo
    from switchzoo.configs import demo
    from switchzoo import state, zoo
    base = zoo.get("switch_tiny").replace(num_layers=2)     # a dense block, a Switch one
    roomy = base.replace(moe=dataclasses.replace(base.moe, eval_capacity_factor=float(8),
                                                 min_capacity=1, dispatch="einsum"))
    drop = roomy.replace(moe=dataclasses.replace(roomy.moe, dispatch="dropless"))
    prompt = np.random.default_rng(0).integers(2, base.vocab_size, (8, 4))
    # expert_parallel on 8 devices: the layer runs under shard_map while decoding too
    ids = [switchzoo.init(c, mesh="expert:8", layout="expert_parallel").generate(
        prompt, max_new_tokens=5) for c in (roomy, drop)]
    np.testing.assert_array_equal(ids[0], ids[1])
    config = demo.get_config()
    config.moe.dispatch = "dropless"
    assert state.run_model_config(config, 4000).moe.dispatch == "dropless"


@pytest.mark.parametrize("top_k, activation", [(1, "relu"), (2, "gated-gelu")])
def test_each_expert_equals_the_block_loop_for_a_few_rows(top_k, activation, monkeypatch):
    """"auto" on one CPU with a few assignments (cached decoding's) runs each expert that has
    any over all of them, masked: the block loop's outputs and gradients, with no loop in the
    program; past EACH_EXPERT_ROWS assignments, the block loop."""
    from switchzoo import dropless
    _, blocks = pair(top_k, activation)
    _, auto = pair(top_k, activation, impl="auto")
    x = jax.random.normal(jax.random.key(5), (4, 8, D))
    valid = jnp.ones((4, 8), bool).at[2, 3:].set(False)
    assert_same(loss_and_grads(blocks, x, valid), loss_and_grads(auto, x, valid))

    def hlo(ffn):
        graphdef, state = nnx.split(ffn)
        return jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0]).lower(state, x).as_text()
    assert "while" in hlo(blocks) and "while" not in hlo(auto)
    monkeypatch.setattr(dropless, "EACH_EXPERT_ROWS", 4 * 8 * top_k - 1)
    assert "while" in hlo(auto)


def test_auto_dispatch_is_dropless_only_where_nothing_can_drop(monkeypatch):
    """"auto" with room for a group's every token computes the einsum dispatch's sum
    (dropless); with less room, it drops the tokens the per-token oracle drops (einsum)."""
    from switchzoo import dropless
    monkeypatch.setattr(dropless, "EACH_EXPERT", False)     # the block loop: a while
    einsum, _ = pair(group_size=8)
    x = jax.random.normal(jax.random.key(4), (4, 8, D))

    def hlo(ffn):
        graphdef, state = nnx.split(ffn)
        return jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0]).lower(state, x).as_text()

    roomy = SwitchFFN(D, F, dataclasses.replace(einsum.cfg, dispatch="auto"), nnx.Rngs(0))
    tight = SwitchFFN(D, F, dataclasses.replace(roomy.cfg, eval_capacity_factor=1.0),
                      nnx.Rngs(0))
    assert "while" in hlo(roomy) and "while" not in hlo(einsum)
    # with drops, auto is the index dispatch (whose experts may loop over the kept picks)
    index = SwitchFFN(D, F, dataclasses.replace(tight.cfg, dispatch="index"), nnx.Rngs(0))
    assert hlo(tight) == hlo(index) != hlo(roomy)
    everyone, kept_all = oracle(einsum, x, capacity=8)        # 8 tokens x 8.0 / 8 experts
    assert kept_all.all()
    y_roomy = run(roomy, x)[0]
    np.testing.assert_allclose(y_roomy, everyone, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y_roomy, run(einsum, x)[0], rtol=1e-5, atol=1e-6)
    one_slot, kept = oracle(einsum, x, capacity=1)            # 8 tokens x 1.0 / 8 experts
    assert not kept.all(), "the test needs drops"
    y_tight, stats = run(tight, x)
    np.testing.assert_allclose(y_tight, one_slot, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(stats["dropped_fraction"]), (~kept).mean(), rtol=1e-6)


def test_auto_grouped_matmul_is_picked_by_the_compiled_flops(monkeypatch):
    """"auto" reads XLA's FLOP count of a ragged_dot of the layer's shape: XLA:CPU expands it
    into a dense dot over every expert (E x the real work), so auto takes the block loop; a
    backend that compiles it to the real tokens' FLOPs gets ragged_dot."""
    from switchzoo import dropless
    assert jax.default_backend() == "cpu"
    monkeypatch.setattr(dropless, "EACH_EXPERT", False)     # not each_expert's few rows
    ratio = dropless.ragged_dot_cost(64, D, F, E)
    assert E * 0.9 < ratio < E * 1.2, ratio
    assert dropless.resolve("auto", 64, D, F, E) == "blocks"
    assert dropless.resolve("ragged_dot", 64, D, F, E) == "ragged_dot"   # asked: kept

    def hlo(ffn):
        graphdef, state = nnx.split(ffn)
        return jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0]).lower(
            state, jnp.ones((4, 8, D))).as_text()

    _, auto = pair(impl="auto")
    assert "while" in hlo(auto)                      # the block loop
    real = lambda backend, rows, d_in, d_out, *_: 2.0 * rows * d_in * d_out   # noqa: E731
    monkeypatch.setattr(dropless, "_ragged_dot_flops", real)
    assert dropless.resolve("auto", 64, D, F, E) == "ragged_dot"
    assert "while" not in hlo(auto)                  # ragged_dot (XLA:CPU: a masked dense dot)
    monkeypatch.setattr(dropless, "_ragged_dot_flops", lambda *a: None)   # no count: by name
    assert dropless.resolve("auto", 64, D, F, E) == "blocks"


def test_auto_times_both_paths_where_the_count_cannot_see_the_kernel(monkeypatch):
    """Where XLA counts fewer FLOPs than the real work (XLA:GPU's ragged_dot: 0.4-3% of it on
    an H200, where ragged_dot was 4x slower than blocks at 64 experts), auto times both paths
    at the layer's shape and takes the faster; the timing runs eagerly even while a step is
    being traced."""
    from switchzoo import dropless
    monkeypatch.setattr(dropless, "_backend", lambda: "gpu")
    monkeypatch.setattr(dropless, "_ragged_dot_flops",
                        lambda backend, rows, d_in, d_out, *_: 0.01 * 2 * rows * d_in * d_out)
    for seconds, picked in (({"ragged_dot": 2.0, "blocks": 1.0}, "blocks"),
                            ({"ragged_dot": 1.0, "blocks": 2.0}, "ragged_dot")):
        monkeypatch.setattr(dropless, "path_seconds", lambda *a, s=seconds: s)
        assert dropless.resolve("auto", 64, D, F, E) == picked
    monkeypatch.undo()

    timed = {}

    def traced(x):                       # path_seconds called while jit traces a step
        timed.update(dropless.path_seconds("cpu", 64, D, F, E, "float32", repeats=1))
        return x + 1
    jax.jit(traced)(jnp.ones(2))
    assert set(timed) == {"ragged_dot", "blocks"} and all(t > 0 for t in timed.values())


AGREE = """
import sys, jax, jax.numpy as jnp
jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2,
                           process_id=int(sys.argv[2]))
from switchzoo import dropless
me = jax.process_index()
dropless._backend = lambda: "gpu"
dropless.ragged_dot_cost = lambda *a, **k: None
# a near tie timed the other way round on each process
dropless.path_seconds = lambda *a, **k: {"ragged_dot": 1.0 + me, "blocks": 2.0 - me}
picked = []
jax.jit(lambda x: (picked.append(dropless.resolve("auto", 64, 8, 16, 4)), x)[1]).lower(
    jnp.ones(2))
print("picked", picked[0])
"""


def test_auto_takes_process_0s_timing_on_every_process():
    """Each process times the paths itself; on a near tie they would compile different
    programs for one step. 2 real processes (jax.distributed on loopback): both take process
    0's choice, agreed while the step traces."""
    import subprocess
    import sys
    from tests.test_multiprocess import ROOT, env, free_port
    address = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([sys.executable, "-c", AGREE, address, str(i)], cwd=ROOT,
                              env=env(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[1][1][-2000:]
    assert [o.strip().splitlines()[-1] for o, _ in outs] == ["picked ragged_dot"] * 2
