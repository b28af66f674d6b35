"""Switch Transformer models (Fedus, Zoph, Shazeer 2021, arXiv 2101.03961).

Each entry: ModelConfig fields, ``moe`` (MoeConfig fields, absent for dense models), ``source``
and ``published`` figures where there are any.
"""

MODELS = {
    "switch_tiny": dict(
        vocab_size=256, d_model=64, num_heads=4, d_kv=16, d_ff=128, num_layers=4,
        dropout=0.0, relpos_buckets=32, relpos_max_distance=128,
        moe=dict(num_experts=8, top_k=1, group_size=32, train_capacity_factor=1.25,
                 eval_capacity_factor=2.0, min_capacity=4, jitter=0.01, sparse_every=2),
        source="CPU-sized Switch LM for tests and the demo (not a published model)",
    ),
    "dense_tiny": dict(
        vocab_size=256, d_model=64, num_heads=4, d_kv=16, d_ff=128, num_layers=4,
        dropout=0.0, relpos_buckets=32, relpos_max_distance=128,
        source="FLOP-matched dense baseline of switch_tiny (not a published model)",
    ),
}
