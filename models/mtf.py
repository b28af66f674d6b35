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

# CPU-sized series for the Mesh-TF minis (configs/tables/mtf_table2_lm1b.py and mtf_table3_wmt.py
# MINI; experiments/mtf_tables.py): the papers' recipe of scaling heads and d_ff together at a
# fixed d_model, with heads = 2**k (1 ... 8) standing for the paper's 4 ... 32. Not published.
_LM_CPU_SOURCE = (
    "CPU-sized mtf_lm1b_h* series (experiments/mtf_tables.py --table lm): decoder-only, 2 layers "
    "(for CPU time; h8 has dense_lm_cpu's FLOPs per token), d_model 96, d_kv 24, {heads} head(s), "
    "d_ff {d_ff} = 96 x heads (Table 2's d_ff = d_model x heads), ReLU, untied softmax as in the "
    "paper, no dropout; dense_lm_cpu's vocabulary and width (h4 is its layer); not a published "
    "model")
_WMT_CPU_SOURCE = (
    "CPU-sized mtf_wmt_h* series (experiments/mtf_tables.py --table wmt): encoder-decoder, 3+3 "
    "layers, d_model 128, d_kv 32, {heads} head(s), d_ff {d_ff} = 64 x heads (d_model / 2 x "
    "heads, as the d_ff = 512 x heads inferred for Table 3), ReLU, untied softmax as in the "
    "paper, no dropout; switch_demo's width and depth (h4 is switch_demo with dense FFNs, "
    "untied), 4,224 ids: the demo's 4,000 pieces and their sentinels, as a run sizes them; not "
    "a published model")

MODELS.update({f"mtf_lm_cpu_h{h}": dict(
    vocab_size=4224, d_model=96, num_heads=h, d_kv=24, d_ff=96 * h, num_layers=2,
    activation="relu", dropout=0.0, tie_embeddings=False, relpos_buckets=32,
    relpos_max_distance=128, source=_LM_CPU_SOURCE.format(heads=h, d_ff=96 * h),
) for h in (1, 2, 4, 8)})
MODELS.update({f"mtf_wmt_cpu_h{h}": dict(
    vocab_size=4224, d_model=128, num_heads=h, d_kv=32, d_ff=64 * h, num_layers=3,
    num_encoder_layers=3, activation="relu", dropout=0.0, tie_embeddings=False,
    source=_WMT_CPU_SOURCE.format(heads=h, d_ff=64 * h),
) for h in (1, 2, 4, 8)})
