"""Switch Transformer (Fedus, Zoph, Shazeer; arXiv 2101.03961) Figure 4, mini: more experts at
equal FLOPs per token give better quality at equal steps. The figure is a plot (Switch-Base with
2 ... 256 experts against T5-Base, C4 span corruption); it prints no table, so there is only a
CPU-sized ``MINI`` (switch_figure4_mini), with no published numbers.

    python -m switchzoo.tables --table=switch_figure4_mini --runs=runs/lm/dense,runs/lm/switch_8,...
"""

_PAPER = "Switch paper (arXiv 2101.03961v3, JMLR 2022) Figure 4"

MINI = dict(
    title="Switch Figure 4, mini: a decoder-only LM on CPU, 8 / 16 / 32 experts at dense_lm_cpu's "
          "FLOPs per token",
    source=(f"{_PAPER}: at equal FLOPs per token, quality at equal steps improves with the "
            "number of experts (Switch-Base with 2 ... 256 experts; Switch-Base-64 reaches "
            "T5-Base's step-450k quality at ~60k steps). The figure is a plot: there are no "
            "published numbers for its curves, and none at this size. Ours: switch_lm_cpu_"
            "{8,16,32} (top-1 at capacity 1.25, every other FFN sparse, d_model 96, 4 layers) "
            "against dense_lm_cpu (the same dense, 849k parameters), a decoder-only language "
            "model on English prose (python -m switchzoo.data.english), trained with "
            "configs/lm_cpu.py (the paper's recipe: Adafactor per expert, the rsqrt schedule in "
            "T5's shape with warm-up 250 (T5's own holds 0.01 for 10k steps), "
            "0.1x truncated-normal init, no dropout, aux loss 0.01) for 2,400 steps of 32 x 128 "
            "tokens, ~22 tokens per dense non-embedding parameter; -loss per token on the "
            "corpus's held-out split (results.json neg_log_perplexity). dense_lm_cpu_wide "
            "(switch_lm_cpu_8's 1.88M parameters, all dense: 1.8x the FLOPs) is shown as the "
            "upper bound, without a claim. A row with several seeds shows their mean and spread."),
    metric="neg_log_perplexity",
    columns=[("experts", "experts"), ("capacity_factor", "capacity factor")],
    ours=[("neg_log_perplexity", "neg. log perp., ours (↑)"), ("accuracy", "accuracy, ours"),
          ("dropped_fraction_mean", "dropped (eval), ours")],
    rows=[dict(label="dense_lm_cpu (dense)", match={"model": "dense_lm_cpu"},
               published=dict(experts=None, capacity_factor=None))] + [
        dict(label=f"switch_lm_cpu_{e}",
             match={"model": f"switch_lm_cpu_{e}", "moe.top_k": 1,
                    "moe.train_capacity_factor": 1.25},
             published=dict(experts=e, capacity_factor=1.25)) for e in (8, 16, 32)] + [
        dict(label="dense_lm_cpu_wide (upper bound)", match={"model": "dense_lm_cpu_wide"},
             published=dict(experts=None, capacity_factor=None))],
    orderings=[
        dict(claim="8 experts beat dense at equal FLOPs per token",
             better="switch_lm_cpu_8", worse="dense_lm_cpu (dense)"),
        dict(claim="16 experts beat 8", better="switch_lm_cpu_16", worse="switch_lm_cpu_8"),
        dict(claim="32 experts beat 16", better="switch_lm_cpu_32", worse="switch_lm_cpu_16"),
    ],
    command=("python -m switchzoo.data.english --out runs/corpus && python "
             "experiments/lm_claims.py --out runs/lm --corpus runs/corpus --runs dense dense_s1 "
             "switch_8 switch_8_s1 switch_16 switch_32 dense_wide && for r in dense dense_s1 "
             "switch_8 switch_8_s1 switch_16 switch_32 dense_wide; do python eval.py "
             "--workdir=runs/lm/$r; done && python eval.py --table=switch_figure4_mini "
             "--runs=runs/lm/dense,runs/lm/dense_s1,runs/lm/switch_8,runs/lm/switch_8_s1,"
             "runs/lm/switch_16,runs/lm/switch_32,runs/lm/dense_wide"),
)
