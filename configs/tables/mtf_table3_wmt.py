"""Mesh-TensorFlow (Shazeer et al.; arXiv 1811.02084) Table 3: Transformer encoder-decoders on
WMT'14 English-German and English-French, d_model 1024, heads 4 ... 128 with d_ff scaled
alongside; BLEU.

    python -m switchzoo.tables --table=mtf_table3_wmt --runs=runs/wmt_h4,runs/wmt_h8,...
"""

_PAPER = "Mesh-TensorFlow paper (Shazeer et al. 2018, arXiv 1811.02084) Table 3"
# heads, params (x10^9), EN-DE BLEU, EN-FR BLEU: the paper's Table 3.
_RESULTS = [(4, "0.15", 25.5, 41.8), (8, "0.24", 26.5, 42.5), (16, "0.42", 27.1, 43.3),
            (32, "0.77", 27.5, 43.5), (64, "1.48", 27.5, 43.8), (128, "2.89", 26.7, 43.9)]

TABLE = dict(
    title="Mesh-TensorFlow Table 3: WMT'14 En-De and En-Fr translation, heads 4 ... 128",
    source=(f"{_PAPER}: encoder-decoders, d_model 1024, d_k = d_v = 128. Its d_ff column is "
            "damaged in the copies read; d_ff = 512 x heads fits its parameter counts "
            "(inferred). The last row is the earlier Transformer-Big (d_ff 4096, 16 heads of "
            "64) the paper compares with; no catalogue model. Training: tensor2tensor "
            "mtf_transformer_paper_tr(size), 154k steps = 3 epochs. Ours: sacrebleu 13a BLEU on "
            "detokenized beam-search output, on the pair the run trained (--config.data.pair)."),
    metric="bleu",
    columns=[("heads", "heads"), ("d_ff", "d_ff"), ("params", "params (10^9), paper"),
             ("bleu_en_de", "EN-DE BLEU, paper (↑)"), ("bleu_en_fr", "EN-FR BLEU, paper (↑)")],
    ours=[("bleu", "BLEU, ours (↑)"), ("token_perplexity", "token ppl, ours")],
    rows=[dict(label=f"mtf_wmt_h{h}", match={"model": f"mtf_wmt_h{h}"},
               published=dict(heads=h, d_ff=512 * h, params=params, bleu_en_de=de,
                              bleu_en_fr=fr))
          for h, params, de, fr in _RESULTS] + [
        dict(label="Transformer-Big (comparison)", match=None,
             published=dict(heads=16, d_ff=4096, params="0.21", bleu_en_de=28.4,
                            bleu_en_fr=41.8))],
    command=("python train.py --config=configs/wmt.py:model=mtf_wmt_h4,pair=en-fr,steps=154000 "
             "--workdir=runs/wmt_h4 && python eval.py --workdir=runs/wmt_h4 "
             "(likewise h8 ... h128; pair=en-de for the EN-DE column)"),
)

MINI = dict(
    title="Mesh-TF Table 3, mini: tiny encoder-decoders on CPU, more parameters vs eval loss",
    source=("no published numbers. BLEU of CPU-sized models after a short run is near zero and "
            "noisy, so the claim is checked on eval loss: Table 3's trend, more parameters give "
            "a better translation model, across the tiny encoder-decoders: switch_c_tiny (658K, "
            "every FFN sparse) vs switch_base_tiny (280K, every other FFN sparse)."),
    metric="bleu",
    columns=[],
    ours=[("bleu", "BLEU, ours (↑)"), ("loss", "eval loss, ours (↓)"),
          ("dropped_fraction_mean", "dropped (eval), ours")],
    rows=[dict(label=m, match={"model": m}, published={})
          for m in ("t5_tiny", "switch_base_tiny", "switch_c_tiny")],
    orderings=[dict(claim="more parameters at equal steps give lower eval loss",
                    metric="loss", better="switch_c_tiny", worse="switch_base_tiny")],
    command=("for m in switch_c_tiny switch_base_tiny t5_tiny; do python train.py "
             "--config=configs/mini.py:model=$m,task=translation --workdir=runs/mini_tr_$m && "
             "python eval.py --workdir=runs/mini_tr_$m; done"),
)
