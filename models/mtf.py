"""Mesh-TensorFlow paper models (Shazeer et al. 2018, arXiv 1811.02084): the LM1B language
models and WMT'14 En-Fr translation models that scale heads and d_ff together at d_model 1024.

The configs are tensor2tensor's mtf_transformer_paper_lm(size) / mtf_transformer_paper_tr(size)
(tensor2tensor/mesh_tensorflow/mtf_transformer.py, by the paper's authors): heads = 8 * 2**size,
d_ff = 8192 * 2**size (LM) or 4096 * 2**size (WMT), 6 layers per stack, separate softmax weights.
Differences from the originals, none visible at the published precision: they learn absolute
position embeddings (256 x 1024) where switchzoo has T5 relative-position biases, and their
exact subword vocabularies are not recorded (t2t asks for ~2**15 and pads to a multiple of 128,
so 32768 here; the h64 row's 1.28B needs the padded vocabulary above 32640).
"""

_LM_SOURCE = (
    "t2t mtf_transformer_paper_lm({size}) on languagemodel_lm1b32k_packed: decoder-only, "
    "6 layers, d_model 1024, d_kv 256, {heads} heads, d_ff {d_ff}, untied softmax, dropout 0.1; "
    "figures: the same function's docstring (params/10^9, per-token log-ppl; x1.1078 for "
    "word level). The paper's LM1B table itself was not read")
# size: (params/10^9 as printed, per-token log perplexity)
_LM_RESULTS = {-1: ("0.14B", 3.209), 0: ("0.22B", 3.119), 1: ("0.37B", 3.037),
               2: ("0.67B", 2.969), 3: ("1.28B", 2.912), 4: ("2.48B", 2.874),
               5: ("4.90B", 2.871)}

_WMT_SOURCE = (
    "t2t mtf_transformer_paper_tr({size}) on translate_enfr_wmt32k_packed (WMT'14 En-Fr): "
    "6+6 layers, d_model 1024, d_kv 128, {heads} heads, d_ff {d_ff}, shared source/target "
    "embedding, separate softmax, dropout 0.1. The paper's WMT table (parameters, BLEU) was not "
    "found in readable form: no figures recorded, and which sizes it lists is unverified "
    "(t2t registers sizes -1..4, and 6)")


def _lm(size: int) -> dict:
    heads, d_ff = int(8 * 2 ** size), int(8192 * 2 ** size)
    params, log_ppl = _LM_RESULTS[size]
    return dict(
        vocab_size=32768, d_model=1024, num_heads=heads, d_kv=256, d_ff=d_ff, num_layers=6,
        activation="relu", dropout=0.1, tie_embeddings=False,
        source=_LM_SOURCE.format(size=size, heads=heads, d_ff=d_ff),
        published=dict(params=params, log_ppl_per_token=log_ppl),
    )


def _wmt(size: int) -> dict:
    heads, d_ff = int(8 * 2 ** size), int(4096 * 2 ** size)
    return dict(
        vocab_size=32768, d_model=1024, num_heads=heads, d_kv=128, d_ff=d_ff,
        num_layers=6, num_encoder_layers=6, activation="relu", dropout=0.1,
        tie_embeddings=False,
        source=_WMT_SOURCE.format(size=size, heads=heads, d_ff=d_ff),
    )


MODELS = {f"mtf_lm1b_h{int(8 * 2 ** s)}": _lm(s) for s in range(-1, 6)}
MODELS.update({f"mtf_wmt_h{int(8 * 2 ** s)}": _wmt(s) for s in range(-1, 5)})
MODELS["mtf_lm1b_tiny"] = dict(
    vocab_size=256, d_model=64, num_heads=2, d_kv=32, d_ff=256, num_layers=2,
    activation="relu", tie_embeddings=False,
    source="CPU-sized mtf_lm1b_* (few wide heads, d_ff 4 x d_model, untied); not published",
)
