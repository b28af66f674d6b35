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

_CPU = [(1, 4), (2, 8), (4, 16), (8, 32)]     # ours, heads -> the paper's row at the same rung

MINI = dict(
    title="Mesh-TF Table 2, mini: a CPU LM series, heads 1 ... 8 with d_ff scaled alongside at "
          "d_model 96, word perplexity",
    source=("ours: Table 2's series in miniature, heads and d_ff scaled together at a fixed "
            "d_model: mtf_lm_cpu_h{1,2,4,8} (decoder-only, 2 layers, d_model 96, d_kv 24, "
            "d_ff = 96 x heads, ReLU, untied softmax; 867k ... 1.25M parameters, 811k of them "
            "the two embeddings), trained with configs/lm_cpu.py (the Switch paper's recipe: "
            "Adafactor, the rsqrt schedule in T5's shape with warm-up 250 (T5's own holds 0.01 "
            "for 10k steps), 0.1x truncated-normal init, no dropout) on English "
            "prose (python -m switchzoo.data.english), 2,000 steps of 32 x 128 tokens, one "
            "vocabulary of 4,000 SentencePiece pieces. Ours: results.json word_perplexity (the "
            "LM1B convention: exp(summed subword NLL incl. EOS / words incl. one EOS per "
            "line)) on the corpus's held-out split. 'paper' is the row of " + _PAPER +
            " at the same rung of the series (each doubling of heads and d_ff; ours start at 1 "
            "head, the paper's at 4): LM1B, 10 epochs, d_model 1024, so compare the ordering and "
            "the shrinking gains, not values."),
    metric="word_perplexity",
    columns=[("heads", "heads"), ("d_ff", "d_ff"), ("paper_heads", "paper's rung: heads"),
             ("paper_word_perplexity", "LM1B word ppl at that rung, paper (↓)")],
    ours=[("word_perplexity", "word ppl, ours (↓)"), ("loss", "log-ppl/token, ours"),
          ("token_perplexity", "token ppl, ours")],
    rows=[dict(label=f"mtf_lm_cpu_h{h}", match={"model": f"mtf_lm_cpu_h{h}"},
               published=dict(heads=h, d_ff=96 * h, paper_heads=paper,
                              paper_word_perplexity=next(
                                  word for ph, _, _, _, word, _ in _RESULTS if ph == paper)))
          for h, paper in _CPU],
    orderings=[dict(claim=f"more heads and d_ff, lower word perplexity: h{h2} below h{h1}",
                    better=f"mtf_lm_cpu_h{h2}", worse=f"mtf_lm_cpu_h{h1}")
               for (h1, _), (h2, _) in zip(_CPU, _CPU[1:])],
    command=("python -m switchzoo.data.english --out runs/corpus && python "
             "experiments/mtf_tables.py --table lm --out runs/mtf_lm --corpus runs/corpus "
             "(trains mtf_lm_cpu_h1 ... h8 with configs/lm_cpu.py, runs eval.py on each, writes "
             "docs/mtf_table2_mini.json) && python eval.py --table=mtf_table2_lm1b_mini "
             "--runs=runs/mtf_lm/h1,runs/mtf_lm/h2,runs/mtf_lm/h4,runs/mtf_lm/h8"),
)
