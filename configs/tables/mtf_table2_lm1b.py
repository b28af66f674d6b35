"""Mesh-TensorFlow (Shazeer et al.; arXiv 1811.02084) Table 2: Transformer-decoder language
models on the one-billion-word benchmark (LM1B), d_model 1024, heads 4 ... 256 with d_ff scaled
alongside, ~10 epochs.

    python -m switchzoo.tables --table=mtf_table2_lm1b --runs=runs/lm1b_h4,runs/lm1b_h8,...
"""

_T2T = ("tensor2tensor mesh_tensorflow/mtf_transformer.py, mtf_transformer_paper_lm(size) "
        "docstring (by the paper's authors): 136k steps (10 epochs) on "
        "languagemodel_lm1b32k_packed, params/10^9 and per-token log-ppl; 'to get word-level "
        "log-ppl, multiply by 1.1078'")

_PAPER = "Mesh-TensorFlow paper (Shazeer et al. 2018, arXiv 1811.02084) Table 2"

# heads, d_ff, params (x10^9) and per-token log-ppl from the t2t docstring; word perplexity on
# LM1B and subword perplexity on Wikipedia from the paper's Table 2.
_RESULTS = [(4, 4096, "0.14", 3.209, 35.0, 8.74), (8, 8192, "0.22", 3.119, 31.7, 8.03),
            (16, 16384, "0.37", 3.037, 28.9, 7.44), (32, 32768, "0.67", 2.969, 26.8, 6.99),
            (64, 65536, "1.28", 2.912, 25.1, 6.55), (128, 131072, "2.48", 2.874, 24.1, 6.24),
            (256, 262144, "4.90", 2.871, 24.0, 6.01)]

TABLE = dict(
    title="Mesh-TensorFlow Table 2: LM1B language models, heads 4 ... 256",
    source=(f"{_PAPER}: decoder LMs, d_model 1024, d_k = d_v = 256, 6 layers; its d_ff is not "
            "printed, d_ff = 1024 x heads fits its parameter counts (inferred). The h256 model "
            "reached 23.5 after more training; the paper's comparison rows: 28.0 (a 6.5B "
            f"model), 26.1 (an ensemble), 23.7 (a >100B model). Log-ppl/token: {_T2T}. Ours: "
            "results.json word_perplexity = exp(summed subword NLL incl. EOS / words incl. one "
            "EOS per sentence), the LM1B convention."),
    metric="word_perplexity",
    columns=[("heads", "heads"), ("d_ff", "d_ff"), ("params_b", "params (10^9), paper"),
             ("log_ppl_per_token", "log-ppl/token, t2t"),
             ("word_perplexity", "LM1B word ppl, paper (↓)"),
             ("wiki_subword_perplexity", "Wikipedia subword ppl, paper (↓)")],
    ours=[("word_perplexity", "word ppl, ours (↓)"), ("loss", "log-ppl/token, ours")],
    rows=[dict(label=f"mtf_lm1b_h{h}", match={"model": f"mtf_lm1b_h{h}"},
               published=dict(heads=h, d_ff=d_ff, params_b=params, log_ppl_per_token=lp,
                              word_perplexity=word, wiki_subword_perplexity=wiki))
          for h, d_ff, params, lp, word, wiki in _RESULTS],
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
