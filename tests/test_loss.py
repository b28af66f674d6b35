"""The chunked cross-entropy (switchzoo.loss, run field loss_chunk) against its oracle, the
full-logits loss (loss_chunk=0): loss, metrics and every parameter's gradient, for decoder-only
and encoder-decoder models, tied and untied embeddings, label smoothing, padding, several
chunks, float32 and bfloat16; accumulation; and no float32 [B, L, V] array in its program."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from switchzoo import loss as loss_lib
from switchzoo import state as state_lib
from switchzoo import steps, zoo
from switchzoo.inspector import count_collectives

B, L = 4, 16            # 64 target tokens; chunks of 24 tokens: 6 per row -> 4 per chunk (4)


def batch_for(cfg, seed=0):
    rng = np.random.default_rng(seed)
    ids = lambda: rng.integers(1, cfg.vocab_size, (B, L), dtype=np.int32)  # noqa: E731
    weights = np.ones((B, L), np.float32)
    weights[0, 10:] = 0.0                       # padding
    weights[2, :3] = 0.0
    return {"inputs": ids(), "targets": ids(), "weights": weights}


def one_device(cfg, optimizer=None):
    return state_lib.setup(cfg, "data_parallel", "data:1", devices=jax.devices()[:1],
                           optimizer=optimizer)


def close(a, b, tol, what):
    """|a - b| within tol of b's largest magnitude (bfloat16 errors scale with the values)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(np.max(np.abs(b)), 1e-30)
    assert np.max(np.abs(a - b)) <= tol * scale, (what, np.max(np.abs(a - b)), scale)


def test_chunking():
    assert loss_lib.chunking(4, 16, 8192) == (1, 16)        # the batch fits one chunk
    assert loss_lib.chunking(4, 16, 24) == (4, 4)            # 6 fit a row: divisor 4
    assert loss_lib.chunking(4, 16, 4) == (16, 1)
    assert loss_lib.chunking(1, 29, 7) == (5, 6)             # prime: 5 even chunks, 1 padded
    assert loss_lib.chunking(32, 512, 8192) == (2, 256)
    with pytest.raises(ValueError, match="loss_chunk=0"):
        loss_lib.chunking(4, 16, 0)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_cross_entropy_equals_the_full_logits(dtype, tol):
    """The function alone, on a length with padding to even chunks (29 positions in 5 chunks
    of 6), label smoothing and zero weights: sums and gradients as lm_objective's."""
    V, D, Lp = 50, 8, 29
    k = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k[0], (3, Lp, D)).astype(dtype)
    w = jax.random.normal(k[1], (V, D))
    t = jax.random.randint(k[2], (3, Lp), 0, V)
    wt = jnp.ones((3, Lp)).at[1, 20:].set(0.0)
    batch = {"targets": t, "weights": wt}
    cfg = zoo.get("dense_tiny")

    def full(x, w):
        logits = jnp.einsum("BLD,VD->BLV", x, w.astype(dtype)).astype(jnp.float32)
        _, m = steps.lm_objective(logits, batch, {}, cfg, 0.1)
        return m["cross_entropy"] * m["tokens"], m["accuracy"] * m["tokens"]

    def chunked(x, w):
        return loss_lib.cross_entropy(x, w, t, wt, 0.1, chunk_tokens=3 * 7)

    for f in (full, chunked):
        assert jax.jit(f)(x, w)[1] > 0
    (ce0, c0), (ce1, c1) = jax.jit(full)(x, w), jax.jit(chunked)(x, w)
    close(ce1, ce0, tol, "ce")
    assert abs(float(c1) - float(c0)) <= (0 if dtype == jnp.float32 else 2)
    g0 = jax.jit(jax.grad(lambda x, w: full(x, w)[0], (0, 1)))(x, w)
    g1 = jax.jit(jax.grad(lambda x, w: chunked(x, w)[0], (0, 1)))(x, w)
    for a, b, what in zip(g1, g0, ("dx", "dw")):
        assert a.dtype == b.dtype
        close(a, b, 2 * tol, what)


def grads_and_metrics(setup, batch, loss_chunk, label_smoothing=0.1):
    fn = jax.jit(jax.grad(steps.make_loss_fn(setup, label_smoothing, loss_chunk=loss_chunk),
                          has_aux=True))
    return jax.device_get(fn(setup.init(), batch, steps.step_key(0, 0)))


# One layer per stack (compile time). Switch models run the same head (their routing losses
# pass through as lm_objective's; test_train runs them with the default loss_chunk).
CASES = {
    "decoder, tied, float32": zoo.get("dense_tiny").replace(num_layers=1),
    "decoder, untied, bfloat16": zoo.get("mtf_lm1b_tiny").replace(num_layers=1,
                                                                    dtype="bfloat16"),
    "encoder-decoder, untied, float32": zoo.get("t5_tiny").replace(num_layers=1,
                                                                   num_encoder_layers=1),
    "encoder-decoder, tied, bfloat16": zoo.get("t5_tiny").replace(
        num_layers=1, num_encoder_layers=1, tie_embeddings=True, dtype="bfloat16"),
}


@pytest.mark.parametrize("case", CASES)
def test_train_loss_equals_the_full_logits(case):
    cfg = CASES[case]
    # bfloat16: the full logits are rounded to bfloat16 once, the chunks' never (float32 sums)
    tol, grad_tol = (1e-5, 1e-5) if cfg.dtype == "float32" else (1e-3, 3e-2)
    setup = one_device(cfg)
    batch = batch_for(cfg)
    g0, m0 = grads_and_metrics(setup, batch, 0)
    g1, m1 = grads_and_metrics(setup, batch, 24)         # 4 chunks of 4 positions
    assert set(m1) == set(m0)
    for key, value in m0.items():
        close(m1[key], value, tol, key)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree.leaves(g0)):
        close(a, b, grad_tol, state_lib.path_name(path))


def test_accumulation_equals_one_batch():
    """Chunked with 2 micro-batches (2 rows x 6 positions fit a chunk of 12: 4 chunks of 4
    each) = the full-logits loss of the whole batch, both under label smoothing."""
    setup = one_device(CASES["decoder, tied, float32"], optimizer="adamw")
    batch = batch_for(setup.cfg, seed=1)

    def gradient(accumulate, loss_chunk):
        step = steps.make_train_step(setup, 0.1, accumulate, loss_chunk=loss_chunk)
        new_state, metrics = step(setup.init(), batch)
        mu = jax.device_get(state_lib.moment(new_state.opt_state))
        return {k: m / (1 - 0.9) for k, m in mu.items()}, jax.device_get(metrics)

    whole, m_whole = gradient(1, 0)
    accumulated, m_acc = gradient(2, 12)
    for key in ("loss", "cross_entropy", "accuracy", "tokens"):
        np.testing.assert_allclose(m_acc[key], m_whole[key], rtol=1e-5, err_msg=key)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7),
                 accumulated, whole)


def test_the_chunked_step_holds_no_float32_logits():
    """On a mesh of 2 x 2 (batch over 'data', vocab over 'model'): the compiled train step holds
    each device's f32[B/2, L, V/2] logits with full logits and not chunked (its chunks'
    f32[B/2, 4, V/2] instead), adds no collective (dW is summed over the batch once, after the
    chunk loop, not once per chunk), and computes the same loss."""
    cfg = CASES["decoder, untied, bfloat16"].replace(dtype="float32", vocab_size=300)
    setup = state_lib.setup(cfg, "model_parallel", "data:2,model:2", optimizer="adamw",
                            devices=jax.devices()[:4])   # vocab 300: no other dim that size
    batch = jax.device_put(batch_for(cfg), state_lib.batch_shardings(setup.layout))

    def compiled(loss_chunk):
        step = steps.make_train_step(setup, 0.1, loss_chunk=loss_chunk)
        return step.lower(setup.abstract, batch).compile()
    full, chunked = compiled(0), compiled(8)     # 8 tokens of a device's 2 rows: 4 x 4
    logits = f"f32[{B // 2},{L},{cfg.vocab_size // 2}]"
    assert logits in full.as_text()
    assert logits not in chunked.as_text()
    assert f"f32[{B // 2},4,{cfg.vocab_size // 2}]" in chunked.as_text()
    assert (count_collectives(chunked.as_text())["all-reduce"]
            <= count_collectives(full.as_text())["all-reduce"])
    (_, m0), (_, m1) = full(setup.init(), batch), chunked(setup.init(), batch)
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(m1[key], m0[key], rtol=1e-5, err_msg=key)
