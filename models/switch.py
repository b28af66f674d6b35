"""Switch Transformer models (Fedus, Zoph, Shazeer 2021, arXiv 2101.03961).

Each entry: ModelConfig fields, ``moe`` (MoeConfig fields, absent for dense models), ``source``
(where every number comes from), ``published`` figures where there are any and ``note``.
``published["params*"]`` are strings at the precision they were printed ("7.4B", "1571B");
tests/test_zoo.py checks count_params against each. ``published["mismatch"]`` says why no
honest config can match, and the test then checks that it still does not.
Where the paper and the released checkpoints differ, the entries say PAPER or HUB.
Every entry starts its weight matrices as the paper's sec. 2.4 says (``SWITCH_INIT``: std
sqrt(0.1 / fan-in), truncated normal), set at the end of this file; a Hugging Face checkpoint's
weights replace it, and a run can set another (--config.init_scale).
"""

MODELS = {
    "switch_tiny": dict(
        vocab_size=256, d_model=64, num_heads=4, d_kv=16, d_ff=128, num_layers=4,
        dropout=0.0, relpos_buckets=32, relpos_max_distance=128,
        moe=dict(num_experts=8, top_k=1, group_size=32, train_capacity_factor=1.25,
                 eval_capacity_factor=2.0, min_capacity=4, jitter=0.01, sparse_every=2),
        source="CPU-sized Switch LM for tests and the demo (not a published model)",
    ),
    "switch_demo": dict(
        vocab_size=4096, d_model=128, num_heads=4, d_kv=32, d_ff=256, num_layers=3,
        num_encoder_layers=3, dropout=0.0, tie_embeddings=True,
        moe=dict(num_experts=8, top_k=1, group_size=256, train_capacity_factor=1.25,
                 eval_capacity_factor=2.0, min_capacity=4, jitter=0.01, sparse_every=2),
        source="CPU-sized Switch encoder-decoder for the offline translation demo "
               "(not a published model)",
    ),
    "dense_tiny": dict(
        vocab_size=256, d_model=64, num_heads=4, d_kv=16, d_ff=128, num_layers=4,
        dropout=0.0, relpos_buckets=32, relpos_max_distance=128,
        source="FLOP-matched dense baseline of switch_tiny (not a published model)",
    ),
}


# The claims study's decoder-only LMs (experiments/lm_claims.py): one width, dense or sparse.
_LM_CPU = dict(vocab_size=4224, d_model=96, num_heads=4, d_kv=24, d_ff=384, num_layers=4,
               activation="relu", dropout=0.0, tie_embeddings=True, relpos_buckets=32,
               relpos_max_distance=128)


_SC_CPU = dict(_LM_CPU, num_layers=2, num_encoder_layers=2)


def _lm_cpu_moe(experts: int, **layout) -> dict:
    return dict(num_experts=experts, top_k=1, group_size=256, train_capacity_factor=1.25,
                eval_capacity_factor=2.0, min_capacity=4, jitter=0.01, aux_loss_weight=0.01,
                z_loss_weight=0.0, **layout)


# Hugging Face checkpoints google/switch-base-{8..256}: T5 v1.0 layout (ReLU, d_ff 3072, tied
# embeddings), every other FFN a Switch layer at i % 2 == 1 (HF's convention, sparse_offset=1).
# Routing numbers from flaxformer t5x/configs/moe/models/switch_base.gin (group 8192, capacity
# 1.25 / 2.0; alpha 0.01 as in the paper, no router z-loss); jitter 0.01 from the hub configs.
_HUB_BASE_SOURCE = (
    "hub google/switch-base-{e} config.json ({seen}): d_model 768, d_ff 3072, d_kv 64, 12 heads, "
    "12+12 layers, 6+6 sparse (encoder/decoder_sparse_step 2), relu, vocab 32128, relpos 32/128; "
    "flaxformer switch_base.gin (ReLU experts, tied logits, group 8192); figures: {fig}")
_TABLE9_BASE = ("Switch paper Table 9 lists Switch-Base as GEGLU with d_ff 2048; its parameter "
                "figures (Tables 7-9) match this ReLU d_ff 3072 tied layout instead (3x2048 = "
                "2x3072 weights per expert, and 7.4B/14.7B need tied embeddings). Table 7 does "
                "not name expert counts: they are read off its parameter column")


def _switch_base(experts: int, seen: str, fig: str, note: str = "", **published):
    return dict(
        vocab_size=32128, d_model=768, num_heads=12, d_kv=64, d_ff=3072,
        num_layers=12, num_encoder_layers=12, activation="relu", dropout=0.1,
        relpos_buckets=32, relpos_max_distance=128, tie_embeddings=True,
        moe=dict(num_experts=experts, top_k=1, group_size=8192, train_capacity_factor=1.25,
                 eval_capacity_factor=2.0, jitter=0.01, aux_loss_weight=0.01,
                 z_loss_weight=0.0, sparse_every=2, sparse_offset=1),
        source=_HUB_BASE_SOURCE.format(e=experts, seen=seen, fig=fig),
        published=published,
        note=_TABLE9_BASE + note,
    )


MODELS.update({
    "switch_base_8": _switch_base(
        8, "read through fine-tuned copies whose _name_or_path is google/switch-base-8",
        "none published (Figure 4 plots the 8-expert model without a number)"),
    "switch_base_16": _switch_base(
        16, "not read; same family", "Switch paper Table 7 (1.1B; pre-trained neg. log perp.)",
        params="1.1B", neg_log_perp=-1.505),
    "switch_base_32": _switch_base(
        32, "read", "Switch paper Table 7", params="2.0B", neg_log_perp=-1.474),
    "switch_base_64": _switch_base(
        64, "read", "Switch paper Tables 6-7 (3,800M)", params="3.8B", neg_log_perp=-1.444),
    "switch_base_128": _switch_base(
        128, "not read; same family",
        "Switch paper Table 7 (7.4B), Table 9 (7B; neg. log perp. @250k/@500k), Table 8 (7410M)",
        note="; Table 8 writes 7410M, this layout counts 7415M (7.4B and 7B agree)",
        params="7.4B", params_table9="7B", neg_log_perp=-1.432,
        neg_log_perp_250k=-1.370, neg_log_perp_500k=-1.306, flops_per_seq="124B"),
    "switch_base_256": _switch_base(
        256, "read", "Switch paper Table 7 and Figure 4 (14.7B)", params="14.7B",
        neg_log_perp=-1.427),
})
MODELS.update({
    "switch_large_128": dict(
        vocab_size=32128, d_model=1024, num_heads=16, d_kv=64, d_ff=4096,
        num_layers=24, num_encoder_layers=24, activation="relu", dropout=0.1,
        tie_embeddings=True,
        moe=dict(num_experts=128, group_size=4096, train_capacity_factor=1.25,
                 eval_capacity_factor=2.0, jitter=0.01, z_loss_weight=0.0,
                 sparse_every=2, sparse_offset=1),
        source=("hub google/switch-large-128 (config.json not read) as built by flaxformer "
                "switch_large.gin / switch_classic_large.gin: 24+24 layers, 16 heads x 64, "
                "d_model 1024, d_ff 4096, 128 experts every other layer, ReLU, tied logits, "
                "group 4096; figures: Switch paper Table 9"),
        published=dict(params="26B", neg_log_perp_250k=-1.248, neg_log_perp_500k=-1.177,
                       flops_per_seq="425B"),
        note=("Table 9 lists GEGLU d_ff 2816; with GEGLU experts that reading gives 27.1B, "
              "not 26B. The 26B matches this ReLU d_ff 4096 layout (26.3B)"),
    ),
    # Switch-XXL. The paper's Table 9 says 64 experts; flaxformer's switch_xxl.gin and the hub
    # checkpoint google/switch-xxl-128 have 128. Both kept; only the 128-expert layout reaches
    # the published 395B (GEGLU experts, as the activation field gives them).
    "switch_xxl": dict(
        vocab_size=32128, d_model=4096, num_heads=64, d_kv=64, d_ff=10240,
        num_layers=24, num_encoder_layers=24, activation="gated-gelu", dropout=0.1,
        tie_embeddings=False,
        moe=dict(num_experts=64, group_size=4096, train_capacity_factor=1.25,
                 eval_capacity_factor=4.0, min_capacity=2, jitter=0.01, z_loss_weight=0.0,
                 sparse_every=2),
        source=("PAPER entry, Switch paper Table 9 as written: d_model 4096, GEGLU d_ff 10240, "
                "d_kv 64, 64 heads, expert freq 1/2, 24 layers, 64 experts; untied logits and "
                "capacity from flaxformer switch_classic_xxl.gin"),
        published=dict(params="395B", neg_log_perp_250k=-1.086, neg_log_perp_500k=-1.008,
                       flops_per_seq="6.3T",
                       mismatch=("no reading of 64 experts reaches 395B: with GEGLU experts "
                                 "it is 201B (ReLU: 137B); 395B is what 128 GEGLU experts "
                                 "give (see switch_xxl_128)")),
        note="Table 9's 64 experts are inconsistent with its own 395B; see switch_xxl_128",
    ),
    "switch_xxl_128": dict(
        vocab_size=32128, d_model=4096, num_heads=64, d_kv=64, d_ff=10240,
        num_layers=24, num_encoder_layers=24, activation="gated-gelu", dropout=0.1,
        tie_embeddings=False,
        moe=dict(num_experts=128, group_size=4096, train_capacity_factor=1.25,
                 eval_capacity_factor=4.0, min_capacity=2, jitter=0.01, z_loss_weight=0.0,
                 sparse_every=2, sparse_offset=1),
        source=("HUB entry, google/switch-xxl-128 (config.json not read) as built by flaxformer "
                "switch_xxl.gin: 128 experts, GEGLU dense and expert MLPs "
                "(expert/dense.MlpBlock.activations = ('gelu', 'linear')), separate output "
                "layer, eval capacity 4, min capacity 2; figures: Switch paper Table 9"),
        published=dict(params="395B"),
        note="the paper's 395B fits this 128-expert layout, not Table 9's 64 experts",
    ),
    "switch_c": dict(
        vocab_size=32128, d_model=2080, num_heads=32, d_kv=64, d_ff=6144,
        num_layers=15, num_encoder_layers=15, activation="relu", dropout=0.1,
        tie_embeddings=False,
        moe=dict(num_experts=2048, group_size=2048, train_capacity_factor=1.0,
                 eval_capacity_factor=2.0, min_capacity=2, jitter=0.01, z_loss_weight=0.0,
                 sparse_every=1),
        source=("PAPER entry, Switch paper Table 9: d_model 2080, d_ff 6144 (no GEGLU), d_kv 64, "
                "32 heads, expert freq 1, 15 layers, 2048 experts; untied logits, capacity "
                "from flaxformer switch_c.gin"),
        published=dict(params="1571B", neg_log_perp_250k=-1.096, neg_log_perp_500k=-1.043,
                       flops_per_seq="890B"),
        note="Table 9 says 32 heads; flaxformer and the hub checkpoint use 30 (switch_c_2048)",
    ),
    "switch_c_2048": dict(
        vocab_size=32128, d_model=2080, num_heads=30, d_kv=64, d_ff=6144,
        num_layers=15, num_encoder_layers=15, activation="relu", dropout=0.1,
        tie_embeddings=False,
        moe=dict(num_experts=2048, group_size=2048, train_capacity_factor=1.0,
                 eval_capacity_factor=2.0, min_capacity=2, jitter=0.01, z_loss_weight=0.0,
                 sparse_every=1, sparse_offset=1),
        source=("HUB entry, google/switch-c-2048 config.json (read) and flaxformer switch_c.gin: "
                "d_model 2080, d_ff 6144, d_kv 64, 30 heads, 15+15 layers, every FFN sparse, "
                "2048 experts, relu, separate output layer; figures: Switch paper Table 9"),
        published=dict(params="1571B"),
        note=("the hub config.json also says num_decoder_layers 12 and decoder_sparse_step 0, "
              "which would drop every decoder expert (~0.8T) and contradicts the 1.6T checkpoint "
              "(3.1TB); this entry follows flaxformer's 15+15 all-sparse layout"),
    ),
    "switch_base_tiny": dict(
        vocab_size=256, d_model=64, num_heads=4, d_kv=16, d_ff=128,
        num_layers=2, num_encoder_layers=2, activation="relu", tie_embeddings=True,
        moe=dict(num_experts=4, group_size=32, jitter=0.01, sparse_every=2, sparse_offset=1),
        source="CPU-sized switch_base_* (HF layout: encoder-decoder, tied, layer 1 sparse); "
               "not a published model",
    ),
**{f"switch_cpu_{e}": dict(
        vocab_size=4224, d_model=128, num_heads=4, d_kv=32, d_ff=512,
        num_layers=4, num_encoder_layers=4, activation="relu", dropout=0.0, tie_embeddings=True,
        relpos_buckets=32, relpos_max_distance=128,
        moe=dict(num_experts=e, top_k=1, group_size=256, train_capacity_factor=1.25,
                 eval_capacity_factor=2.0, min_capacity=4, jitter=0.01, aux_loss_weight=0.01,
                 z_loss_weight=0.0, sparse_every=2, sparse_offset=1),
        source=f"CPU-sized switch_base_{e} for the span-corruption experiment "
               "(experiments/switch_vs_dense.py): switch_base_*'s layout (ReLU, tied, every "
               "other FFN sparse) at d_model 128, 4+4 layers; not a published model",
    ) for e in (8, 16, 32)},
**{f"switch_lm_cpu_{e}": dict(
        **_LM_CPU, moe=_lm_cpu_moe(e, sparse_every=2, sparse_offset=1),
        source=f"CPU-sized decoder-only Switch LM with {e} experts for the claims study "
               "(experiments/lm_claims.py): d_model 96, 4 layers, every other FFN sparse, "
               "ReLU, tied; not a published model",
    ) for e in (8, 16, 32)},
    "switch_lm_cpu_8_every": dict(
        **_LM_CPU, moe=_lm_cpu_moe(8, sparse_every=1),
        source="switch_lm_cpu_8 with every FFN a Switch layer (as Switch-C and the nanoMOE "
               "reference), twice the expert parameters at the same FLOPs; not published",
    ),
    # the same question on span corruption (experiments/span_claims.py): an encoder-decoder
    # of dense_lm_cpu's width, 2+2 layers (~518k non-embedding parameters, about the LM's 443k)
    # (2 and 4 experts: does the span deficit shrink as each expert sees more of the tokens?
    # 1 expert: the Switch layer's code path with nothing to route, which trains as dense)
**{f"switch_sc_cpu_{e}": dict(
        **_SC_CPU, moe=_lm_cpu_moe(e, sparse_every=2, sparse_offset=1),
        source="CPU-sized Switch encoder-decoder for span corruption on the claims study's "
               "prose (experiments/span_claims.py): switch_lm_cpu_8's width, 2+2 layers, the "
               f"second FFN of each stack a Switch layer of {e} expert{'s' * (e > 1)}; not a "
               "published model",
    ) for e in (1, 2, 4, 8)},
    "switch_sc_cpu_8_enc0": dict(
        **_SC_CPU, moe=_lm_cpu_moe(8, encoder_sparse_layers=(0,), sparse_layers=(1,)),
        source="switch_sc_cpu_8 with the encoder's Switch layer in its first layer rather "
               "than its second: the span study's encoder-router question "
               "(experiments/span_claims.py); not a published model",
    ),
    "switch_sc_cpu_8_dec": dict(
        **_SC_CPU, moe=_lm_cpu_moe(8, encoder_sparse_layers=(), sparse_layers=(1,)),
        source="switch_sc_cpu_8 with a dense encoder: the decoder's second FFN its only Switch "
               "layer (the span study's question whether the encoder's undecided router holds "
               "Switch back; experiments/span_claims.py); not a published model",
    ),
    "switch_sc_cpu_8_enc": dict(
        **_SC_CPU, moe=_lm_cpu_moe(8, encoder_sparse_layers=(1,), sparse_layers=()),
        source="switch_sc_cpu_8 with a dense decoder: the encoder's second FFN its only Switch "
               "layer (the span study's question which stack's Switch layer helps; "
               "experiments/span_claims.py); not a published model",
    ),
    "dense_sc_cpu": dict(
        **_SC_CPU,
        source="FLOP-matched dense baseline of switch_sc_cpu_8 (not a published model)",
    ),
    "dense_sc_cpu_wide": dict(
        **{**_SC_CPU, "d_ff": 1728},
        source="dense encoder-decoder with switch_sc_cpu_8's parameters (each stack's FFN widths "
               "384 + 8 x 384 = 2 x 1728), every parameter on every token: does span corruption "
               "at this scale use FFN parameters at all (experiments/span_claims.py)? "
               "not a published model",
    ),
    "dense_lm_cpu": dict(
        **_LM_CPU,
        source="FLOP-matched dense baseline of switch_lm_cpu_* (not a published model)",
    ),
    "dense_lm_cpu_wide": dict(
        **{**_LM_CPU, "d_ff": 1728},
        source="dense model with switch_lm_cpu_8's total parameters (FFN widths 2 x 384 + "
               "2 x 8 x 384 = 4 x 1728): the upper bound of the claims study; not published",
    ),
    "switch_c_tiny": dict(
        vocab_size=256, d_model=64, num_heads=4, d_kv=16, d_ff=128,
        num_layers=2, num_encoder_layers=2, activation="relu", tie_embeddings=False,
        moe=dict(num_experts=8, group_size=32, train_capacity_factor=1.0, min_capacity=2,
                 sparse_every=1),
        source="CPU-sized switch_c_2048 (every FFN sparse, untied); not a published model",
    ),
})

# Switch sec. 2.4: every weight matrix from a truncated normal of std sqrt(s / fan-in), s = 0.1
# (T5's s = 1.0 made its Table 3's runs unstable). dense_tiny, switch_tiny's baseline, too.
SWITCH_INIT = dict(init_scale=0.1, init_distribution="truncated_normal")
for _entry in MODELS.values():
    _entry.update(SWITCH_INIT)
