"""Mesh-TensorFlow (Shazeer et al.; arXiv 1811.02084) Table 2: Transformer-decoder language
models on the one-billion-word benchmark (LM1B), d_model 1024, heads 4 ... 256 with d_ff scaled
alongside, ~10 epochs.

    python -m switchzoo.tables --table=mtf_table2_lm1b --runs=runs/lm1b_h4,runs/lm1b_h8,...
"""

_T2T = ("tensor2tensor mesh_tensorflow/mtf_transformer.py, mtf_transformer_paper_lm(size) "
        "docstring (by the paper's authors): 136k steps (10 epochs) on "
        "languagemodel_lm1b32k_packed, params/10^9 and per-token log-ppl; 'to get word-level "
        "log-ppl, multiply by 1.1078'")

# heads, d_ff, params as printed (x10^9), per-token log-ppl: all from the t2t docstring / formula.
_RESULTS = [(4, 4096, "0.14", 3.209), (8, 8192, "0.22", 3.119), (16, 16384, "0.37", 3.037),
            (32, 32768, "0.67", 2.969), (64, 65536, "1.28", 2.912), (128, 131072, "2.48", 2.874),
            (256, 262144, "4.90", 2.871)]
# exp(1.1078 * log-ppl) for each row above, rounded to 2 decimals: derived here, not printed.
_WORD_PPL_DERIVED = {4: 34.99, 8: 31.67, 16: 28.92, 32: 26.82, 64: 25.18, 128: 24.14, 256: 24.06}

TABLE = dict(
    title="Mesh-TensorFlow Table 2: LM1B language models, heads 4 ... 256",
    source=(f"{_T2T}. The 'word ppl (derived)' column is exp(1.1078 x log-ppl), computed from "
            "those two published numbers, not printed anywhere. The paper's Table 2 itself was "
            "not found in readable form, so its word perplexities and training times are None "
            "here, not guessed. Ours: results.json word_perplexity = exp(summed subword NLL incl. "
            "EOS / words incl. one EOS per sentence)."),
    metric="word_perplexity",
    columns=[("heads", "heads"), ("d_ff", "d_ff"), ("params_b", "params (10^9)"),
             ("log_ppl_per_token", "log-ppl/token, t2t"),
             ("word_ppl_derived", "word ppl (derived)"),
             ("word_perplexity", "word ppl, paper table")],
    ours=[("word_perplexity", "word ppl, ours (↓)"), ("loss", "log-ppl/token, ours")],
    rows=[dict(label=f"mtf_lm1b_h{h}", match={"model": f"mtf_lm1b_h{h}"},
               published=dict(heads=h, d_ff=d_ff, params_b=params, log_ppl_per_token=lp,
                              word_ppl_derived=_WORD_PPL_DERIVED[h], word_perplexity=None))
          for h, d_ff, params, lp in _RESULTS],
    orderings=[dict(claim=f"more heads and d_ff, lower word perplexity: h{h2} below h{h1}",
                    better=f"mtf_lm1b_h{h2}", worse=f"mtf_lm1b_h{h1}")
               for (h1, *_), (h2, *_) in zip(_RESULTS, _RESULTS[1:])],
    command=("python train.py --config=configs/lm1b.py:model=mtf_lm1b_h4,steps=136000 "
             "--workdir=runs/lm1b_h4 "
             "&& python eval.py --workdir=runs/lm1b_h4 (likewise h8 ... h256)"),
)

MINI = dict(
    title="Mesh-TF Table 2, mini: tiny LMs on CPU, more parameters vs word perplexity",
    source=("no published numbers. The tiny catalogue has no heads-scaling series at fixed "
            "d_model, so Table 2's trend (more parameters, lower word perplexity) is checked "
            "across the tiny LMs that differ most in parameters: switch_tiny (379K, Switch FFNs, "
            "FLOP-matched to dense_tiny) vs dense_tiny (148K). mtf_lm1b_tiny (131K) is shown "
            "without a claim: its parameters differ from dense_tiny's by too little."),
    metric="word_perplexity",
    columns=[],
    ours=[("word_perplexity", "word ppl, ours (↓)"), ("loss", "loss, ours"),
          ("dropped_fraction_mean", "dropped (eval), ours")],
    rows=[dict(label=m, match={"model": m}, published={})
          for m in ("mtf_lm1b_tiny", "dense_tiny", "switch_tiny")],
    orderings=[dict(claim="more parameters at equal steps give lower word perplexity",
                    better="switch_tiny", worse="dense_tiny")],
    command=("for m in switch_tiny dense_tiny mtf_lm1b_tiny; do python train.py "
             "--config=configs/mini.py:model=$m --workdir=runs/mini_$m && python eval.py "
             "--workdir=runs/mini_$m; done"),
)
