"""Attention through jax.nn.dot_product_attention ("xla"; "cudnn" shares its arguments) and the
one relative-position bias [1, H, T, S] per stack compute today's attention. The oracle is a
model written here from the formulas of layers.py with the bias gathered per batch row from the
batch's positions, run on packed rows (positions restarting at 0 in each segment, as
switchzoo.data packs them) and padded ones (a segment-0 tail)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from switchzoo import attention_impl, layers, relpos, transformer, validate
from switchzoo.config import ModelConfig
from switchzoo.configs import base

# Few buckets and a short max distance, so the bias varies across the rows' offsets.
ENC_DEC = ModelConfig(vocab_size=64, d_model=32, num_heads=4, d_kv=8, d_ff=48, num_layers=2,
                      num_encoder_layers=2, relpos_buckets=8, relpos_max_distance=16)
DECODER = ENC_DEC.replace(num_encoder_layers=0)
# Segment lengths per row; what is left of the row is padding (segment 0). Rows 0-2 are
# packed, rows 3-5 padded (one example each, as evaluation batches).
SRC = [[7, 9, 5], [12, 12], [4, 4, 4, 4, 2], [24], [17], [9]]
TGT = [[5, 3, 6], [8, 7], [3, 2, 4, 3, 1], [16], [11], [4]]
LS, LT = 24, 16


def rows(lengths: list[list[int]], length: int):
    """Segments (1, 2, ... per row; 0 = padding) and positions restarting at 0 in each."""
    seg, pos = np.zeros((len(lengths), length), np.int32), np.zeros((len(lengths), length),
                                                                    np.int32)
    for r, row in enumerate(lengths):
        start = 0
        for s, n in enumerate(row):
            seg[r, start:start + n], pos[r, start:start + n] = s + 1, np.arange(n)
            start += n
    return jnp.asarray(seg), jnp.asarray(pos)


def ids(shape, seed):
    return jnp.asarray(np.random.default_rng(seed).integers(1, 64, shape), jnp.int32)


# --- the oracle: today's attention, bias gathered per row ----------------------------------

def _norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def _attend(p, x_BTD, kv_BSD, bias_BHTS, mask_BTS):
    q = jnp.einsum("BTD,DHK->BHTK", x_BTD, p["q"])
    k = jnp.einsum("BSD,DHK->BHSK", kv_BSD, p["k"])
    v = jnp.einsum("BSD,DHK->BHSK", kv_BSD, p["v"])
    s = jnp.einsum("BHTK,BHSK->BHTS", q, k) + bias_BHTS
    s = s + jnp.where(mask_BTS[:, None], 0.0, -1e9)
    return jnp.einsum("BHTK,HKD->BTD", jnp.einsum("BHTS,BHSK->BHTK",
                                                  jax.nn.softmax(s, axis=-1), v), p["o"])


def _stack(p, cfg, x, pos, seg, causal, enc=None, enc_seg=None):
    mask = seg[:, :, None] == seg[:, None, :]
    if causal:
        mask &= pos[:, None, :] <= pos[:, :, None]
    bucket = relpos.relpos_bucket(pos[:, None, :] - pos[:, :, None], not causal,
                                  cfg.relpos_buckets, cfg.relpos_max_distance)
    bias = jnp.transpose(p["relpos"]["embedding"][bucket], (0, 3, 1, 2))   # [B, H, T, S]
    for i in range(len(p["layers"])):
        lp = p["layers"][i]
        h = _norm(x, lp["attn_norm"]["scale"])
        x = x + _attend(lp["attn"], h, h, bias, mask)
        if enc is not None:
            cross = (seg[:, :, None] == enc_seg[:, None, :]) & (enc_seg[:, None, :] != 0)
            x = x + _attend(lp["cross"], _norm(x, lp["cross_norm"]["scale"]), enc, 0.0, cross)
        h = _norm(x, lp["ffn_norm"]["scale"])
        x = x + jax.nn.relu(h @ lp["ffn"]["wi"]) @ lp["ffn"]["wo"]
    return _norm(x, p["final_norm"]["scale"])


def oracle(params, cfg, batch):
    emb = params["embed"]["embedding"]
    enc = None
    if cfg.is_encoder_decoder:
        enc = _stack(params["encoder"], cfg, emb[batch["src"]], batch["src_pos"],
                     batch["src_seg"], causal=False)
    y = _stack(params["decoder"], cfg, emb[batch["tgt"]], batch["tgt_pos"], batch["tgt_seg"],
               causal=True, enc=enc, enc_seg=batch.get("src_seg"))
    return (y * cfg.d_model ** -0.5) @ emb.T


# --- the model ------------------------------------------------------------------------------

def make_batch(cfg) -> dict:
    # A decoder-only row packs the sources' lengths.
    tgt, lt = (TGT, LT) if cfg.is_encoder_decoder else (SRC, LS)
    tgt_seg, tgt_pos = rows(tgt, lt)
    batch = {"tgt": ids((len(tgt), lt), 1), "labels": ids((len(tgt), lt), 2),
             "tgt_seg": tgt_seg, "tgt_pos": tgt_pos}
    if cfg.is_encoder_decoder:
        batch["src_seg"], batch["src_pos"] = rows(SRC, LS)
        batch["src"] = ids((len(SRC), LS), 3)
    return batch


def model_logits(graphdef, params, cfg, batch):
    model = nnx.merge(graphdef, params)
    if cfg.is_encoder_decoder:
        return model(batch["src"], batch["tgt"], src_positions=batch["src_pos"],
                     src_segments=batch["src_seg"], tgt_positions=batch["tgt_pos"],
                     tgt_segments=batch["tgt_seg"])[0]
    return model(batch["tgt"], positions_BL=batch["tgt_pos"], segments_BL=batch["tgt_seg"])[0]


def loss_of(logits, batch):
    """Mean cross-entropy over the non-padding targets (padding's logits reach no loss)."""
    w = (batch["tgt_seg"] != 0).astype(jnp.float32)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), batch["labels"][..., None], -1)
    return -jnp.sum(logp[..., 0] * w) / jnp.sum(w)


# The checks on results run in numpy: eager jnp compiles each operation per shape on its own.
def max_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def all_finite(tree) -> bool:
    return all(bool(np.all(np.isfinite(np.asarray(g)))) for g in jax.tree.leaves(tree))


@pytest.mark.parametrize("cfg", [ENC_DEC, DECODER], ids=["encoder_decoder", "decoder_only"])
def test_xla_and_reference_attention_compute_the_per_row_bias_oracle(cfg):
    batch = make_batch(cfg)
    valid = np.asarray(batch["tgt_seg"]) != 0
    params = nnx.to_pure_dict(nnx.state(transformer.build(cfg.replace(attention="reference"))))

    def loss_and_logits(logits_fn):
        def f(p):
            logits = logits_fn(p)
            return loss_of(logits, batch), logits
        return jax.jit(jax.value_and_grad(f, has_aux=True))
    (want_loss, want_logits), want_grads = loss_and_logits(
        lambda p: oracle(p, cfg, batch))(params)
    for attention in ("reference", "xla"):
        c = cfg.replace(attention=attention)
        graphdef = nnx.graphdef(nnx.eval_shape(lambda: transformer.build(c)))
        (loss, logits), grads = loss_and_logits(
            lambda p: model_logits(graphdef, p, c, batch))(params)
        # Padding's logits differ (its rows see each other with other offsets), and reach nothing.
        diff = np.abs(np.asarray(logits) - np.asarray(want_logits))
        assert float(np.max(np.where(valid[..., None], diff, 0))) < 1e-5, attention
        assert abs(float(loss) - float(want_loss)) < 1e-5, attention
        assert max_diff(grads, want_grads) < 1e-5, attention
        assert all_finite(grads)
    # Every stack's bias table has a gradient, and the bias matters to the logits: the oracle
    # tests it (a bias gathered wrong would change them).
    for stack in ("encoder", "decoder") if cfg.is_encoder_decoder else ("decoder",):
        assert float(np.max(np.abs(want_grads[stack]["relpos"]["embedding"]))) > 1e-4
    no_bias = jax.tree.map(lambda x: x, params)
    no_bias["decoder"]["relpos"]["embedding"] = np.zeros_like(
        params["decoder"]["relpos"]["embedding"])
    assert max_diff(jax.jit(lambda p: oracle(p, cfg, batch))(no_bias), want_logits) > 1e-2


def layer_vjp(impl, x, kv, bias, mask, cot, causal, strict=False):
    """One Attention (``bias``'s heads, each 8 wide) under ``impl``: (output, the VJP of ``cot`` into its state, x, kv and bias, the rows that see
    nothing), their cotangent zeroed (padding: no loss)."""
    H, K = bias.shape[1], 8
    attn = layers.Attention(x.shape[-1], H, K, nnx.Rngs(params=0), impl=impl, causal=causal,
                            strict=strict)
    graphdef, state = nnx.split(attn)
    T, S = x.shape[1], kv.shape[1]
    m = mask & np.tril(np.ones((T, S), bool)) if causal else mask
    blind = ~np.any(m, axis=-1)

    @jax.jit
    def f(state, x, kv, bias):
        def attend(state, x, kv, bias):
            a = nnx.merge(graphdef, state)
            return a.attend(x, *a.project_kv(kv), bias, m)
        out, vjp = jax.vjp(attend, state, x, kv, bias)
        return out, vjp(jnp.where(blind[..., None], 0.0, cot))
    return (*f(state, x, kv, bias), blind)


def assert_same_layer(out, grads, blind, want, want_grads, tol: float):
    """Finite outputs and gradients, equal to the reference's within ``tol`` (outputs outside
    the rows that see nothing)."""
    assert all_finite(out) and all_finite(grads)
    diff = np.abs(np.asarray(out) - np.asarray(want))
    assert float(np.max(np.where(blind[..., None], 0, diff))) < tol
    assert max_diff(grads, want_grads) < tol


def inputs(rng, B, T, S, D, H, seen=0.6):
    """x, kv, bias [1, H, T, S], a mask whose last 2 rows see nothing, and a cotangent."""
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    mask = rng.random((B, T, S)) < seen
    mask[:, -2:] = False
    return normal(B, T, D), normal(B, S, D), normal(1, H, T, S), mask, normal(B, T, D)


def test_the_layer_under_xla_matches_the_reference_with_fully_masked_rows():
    """One Attention: outputs and gradients (inputs, q/k/v/o, bias [1, H, T, S]) of the xla
    path equal the reference's; rows with nothing to attend to (padding in cross-attention)
    give no NaN."""
    args = inputs(np.random.default_rng(0), B=2, T=6, S=10, D=16, H=4)
    for causal in (False, True):
        (out, grads, blind), (want, want_grads, _) = (layer_vjp(impl, *args, causal)
                                                      for impl in ("xla", "reference"))
        assert_same_layer(out, grads, blind, want, want_grads, 1e-5)


def test_the_pallas_flash_kernel_matches_the_reference_with_bias_and_masks():
    """The TPU path (JAX's Pallas flash-attention kernel, run here in its interpreter): outputs
    and gradients (inputs, q/k/v/o, the bias [1, H, T, S]) equal the reference's, with a mask,
    causal or not, for self-attention and a cross-attention of another length; rows that see
    nothing give no NaN. Lengths that are not multiples of its 128-wide blocks run the
    reference path, or are refused in one line when the kernel was asked for by name."""
    from jax.experimental.pallas import tpu as pltpu
    rng = np.random.default_rng(0)
    with pltpu.force_tpu_interpret_mode():
        for T, S, causal in ((128, 128, True), (128, 256, False)):
            args = inputs(rng, B=2, T=T, S=S, D=16, H=2, seen=0.7)
            (out, grads, blind), (want, want_grads, _) = (layer_vjp(impl, *args, causal)
                                                          for impl in ("pallas", "reference"))
            assert_same_layer(out, grads, blind, want, want_grads, 1e-4)
            assert float(np.max(np.abs(grads[3]))) > 1e-3        # the bias has a gradient

        args = inputs(rng, B=2, T=6, S=6, D=16, H=2)
        out, _, _ = layer_vjp("pallas", *args, True)          # the reference path serves
        assert out.shape == layer_vjp("reference", *args, True)[0].shape
        with pytest.raises(ValueError, match=r"^attention='pallas' cannot serve lengths that "
                                             r"are not multiples of 128 \(6 queries, 6 keys\)"):
            layer_vjp("pallas", *args, True, strict=True)
    with pytest.raises(ValueError, match=r"^attention='pallas' cannot run here: cpu backend"):
        attention_impl.attention_impl(DECODER.replace(attention="pallas"), "cpu")


def test_training_steps_with_attention_dropout_run_the_reference_path():
    cfg = DECODER.replace(dropout=0.1)
    batch = make_batch(cfg)
    graphdef, state = nnx.split(transformer.build(cfg.replace(attention="reference")))
    xla = nnx.graphdef(transformer.build(cfg.replace(attention="xla")))

    @functools.partial(jax.jit, static_argnums=0)
    def logits(g, rng):
        model = nnx.merge(g, state)
        return model(batch["tgt"], positions_BL=batch["tgt_pos"], segments_BL=batch["tgt_seg"],
                     rng=rng)[0]
    key = jax.random.key(0)
    np.testing.assert_array_equal(logits(graphdef, key), logits(xla, key))   # same path
    valid = (batch["tgt_seg"] != 0)[..., None]             # evaluation: fused, the same
    assert float(jnp.max(jnp.where(valid, jnp.abs(logits(graphdef, None) - logits(xla, None)),
                                   0))) < 1e-5


def test_auto_is_decided_once_with_its_reason_and_cudnn_where_it_cannot_run_is_refused(
        monkeypatch):
    # On a TPU, auto takes the Pallas flash kernel where its probe compiles, else the reference.
    monkeypatch.setattr(attention_impl, "_pallas_probe", lambda *a: "")
    assert str(attention_impl.attention_impl(DECODER, "tpu")) == "pallas (Pallas flash attention)"
    monkeypatch.setattr(attention_impl, "_pallas_probe", lambda *a: "ValueError: no")
    assert str(attention_impl.attention_impl(DECODER, "tpu")) == (
        "reference (the Pallas flash kernel did not compile: ValueError: no)")
    auto = attention_impl.attention_impl(DECODER, "cpu")
    assert (auto.name, str(auto)) == (
        "reference", "reference (cpu backend: cuDNN's fused kernel runs on NVIDIA GPUs)")
    # On a GPU, float32 activations keep the reference path (decided before any device query).
    gpu = attention_impl.attention_impl(DECODER, "gpu")
    assert gpu.name == "reference" and gpu.reason.startswith("float32 activations")
    assert str(attention_impl.attention_impl(DECODER.replace(attention="xla", dropout=0.1), "cpu")) == (
        "xla (jax.nn.dot_product_attention, implementation='xla'; training steps run the "
        "reference path for attention dropout (dropout=0.1))")
    with pytest.raises(ValueError, match=r"^attention='cudnn' cannot run here: cpu backend: "
                                         r"cuDNN's fused kernel runs on NVIDIA GPUs; set "
                                         r"attention \(--config.attention\) to auto, xla or "
                                         r"reference$"):
        transformer.build(DECODER.replace(attention="cudnn", dtype="bfloat16"))
    with pytest.raises(ValueError, match=r"^attention='flash' is not an attention "
                                         r"implementation; use one of auto, reference, xla, "
                                         r"cudnn, pallas$"):
        DECODER.replace(attention="flash")
    config = base.get_base()
    config.attention = "flash"
    with pytest.raises(ValueError, match=r"^--config.attention='flash' is not one of auto, "
                                         r"reference, xla, cudnn, pallas$"):
        validate.check(config)


def test_cudnn_calls_it_cannot_serve_fall_back_under_auto_and_are_refused_when_asked_for():
    """Checked before any kernel runs, so testable off a GPU: attention dropout in a training
    step, odd lengths."""
    def attention(**kw):
        return layers.Attention(16, 2, 8, nnx.Rngs(params=0), impl="cudnn", **kw)
    x, key = jnp.ones((1, 3, 16)), jax.random.key(0)
    mask = jnp.ones((1, 3, 3), bool)
    reference = layers.Attention(16, 2, 8, nnx.Rngs(params=0))
    np.testing.assert_array_equal(attention()(x, x, None, mask, 0.1, key),
                                  reference(x, x, None, mask, 0.1, key))
    with pytest.raises(ValueError, match=r"^attention='cudnn' cannot serve attention dropout "
                                         r"\(rate 0.1 in a training step\); use dropout=0, or "
                                         r"set attention \(--config.attention\) to auto, which "
                                         r"runs such calls on the reference path$"):
        attention(strict=True)(x, x, None, mask, 0.1, key)
    with pytest.raises(ValueError, match=r"^attention='cudnn' cannot serve odd lengths \(3 "
                                         r"queries, 3 keys\); use even lengths"):
        attention(strict=True)(x, x, None, mask)


@pytest.mark.parametrize("cfg", [ENC_DEC, DECODER], ids=["encoder_decoder", "decoder_only"])
def test_rows_given_as_lengths_or_without_segments_compute_the_oracle(cfg):
    """How a batch's structure reaches the attention (layers.Mask): the padded rows (one
    example each, as evaluation batches) given their lengths mask by length, and rows given no
    segments mask nothing but causality; both give the oracle's logits (of the valid tokens)
    and loss under reference and xla, as the segment mask does."""
    batch = {k: v[3:] for k, v in make_batch(cfg).items()}      # the padded rows
    lengths = {k: jnp.sum(batch[f"{k}_seg"] != 0, axis=1) for k in ("src", "tgt") if
               f"{k}_seg" in batch}
    full = {k: v[:, :3] for k, v in batch.items()}            # no padding: every row valid
    full.update({f"{k}_seg": jnp.ones_like(full[k]) for k in ("src", "tgt") if k in full})
    params = nnx.to_pure_dict(nnx.state(transformer.build(cfg.replace(attention="reference"))))

    def run(c, batch, lengths, segments: bool):
        model = nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: transformer.build(c))), params)
        seg = (lambda k: batch[f"{k}_seg"]) if segments else (lambda k: None)
        if c.is_encoder_decoder:
            return model(batch["src"], batch["tgt"], src_positions=batch["src_pos"],
                         src_segments=seg("src"), tgt_positions=batch["tgt_pos"],
                         tgt_segments=seg("tgt"), src_lengths=lengths.get("src"),
                         tgt_lengths=lengths.get("tgt"))[0]
        return model(batch["tgt"], positions_BL=batch["tgt_pos"], segments_BL=seg("tgt"),
                     lengths_B=lengths.get("tgt"))[0]

    for b, kw in ((batch, dict(lengths=lengths, segments=True)),
                  (full, dict(lengths={}, segments=False))):
        want = np.asarray(jax.jit(lambda p: oracle(p, cfg, b))(params))
        valid = (np.asarray(b["tgt_seg"]) != 0)[..., None]
        for attention in ("reference", "xla"):
            got = np.asarray(jax.jit(functools.partial(run, cfg.replace(attention=attention),
                                                       **kw))(b))
            assert float(np.max(np.where(valid, np.abs(got - want), 0))) < 1e-5, attention
            assert abs(float(loss_of(got, b)) - float(loss_of(want, b))) < 1e-5, attention
