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

_CPU = [(1, 4), (2, 8), (4, 16), (8, 32)]     # ours, heads -> the paper's row at the same rung

MINI = dict(
    title="Mesh-TF Table 3, mini: a CPU English-German series, heads 1 ... 8 with d_ff scaled "
          "alongside at d_model 128, BLEU",
    source=("ours: Table 3's series in miniature, heads and d_ff scaled together at a fixed "
            "d_model: mtf_wmt_cpu_h{1,2,4,8} (encoder-decoders, 3+3 layers, d_model 128, d_kv "
            "32, d_ff = 64 x heads, ReLU, untied softmax; 1.33M ... 3.05M parameters), trained "
            "with the offline demo's translation config (configs/demo.py: AdamW, T5's 1.0x init, "
            "1,200 steps of 32 x 64 tokens) on the shipped English-German pairs (GNU gettext "
            "catalogues; data.pair en-de), one vocabulary of 4,000 SentencePiece pieces. Ours: "
            "sacrebleu 13a BLEU on detokenized beam-search output (4 beams) of the held-out "
            "pairs (results.json bleu). 'paper' is the EN-DE row of " + _PAPER + " at the same "
            "rung of the series (each doubling of heads and d_ff; ours start at 1 head, the "
            "paper's at 4): WMT'14, d_model 1024, so compare the ordering, not values."),
    metric="bleu",
    columns=[("heads", "heads"), ("d_ff", "d_ff"), ("paper_heads", "paper's rung: heads"),
             ("paper_bleu_en_de", "EN-DE BLEU at that rung, paper (↑)")],
    ours=[("bleu", "BLEU, ours (↑)"), ("token_perplexity", "token ppl, ours (↓)"),
          ("loss", "eval loss, ours (↓)")],
    rows=[dict(label=f"mtf_wmt_cpu_h{h}", match={"model": f"mtf_wmt_cpu_h{h}"},
               published=dict(heads=h, d_ff=64 * h, paper_heads=paper,
                              paper_bleu_en_de=next(de for ph, _, de, _ in _RESULTS
                                                    if ph == paper)))
          for h, paper in _CPU],
    orderings=[dict(claim=f"more heads and d_ff, higher BLEU: h{h2} above h{h1}",
                    better=f"mtf_wmt_cpu_h{h2}", worse=f"mtf_wmt_cpu_h{h1}")
               for (h1, _), (h2, _) in zip(_CPU, _CPU[1:])],
    command=("python experiments/mtf_tables.py --table wmt --out runs/mtf_wmt (trains "
             "mtf_wmt_cpu_h1 ... h8 with configs/demo.py, pair en-de, runs eval.py on each, writes "
             "docs/mtf_table3_mini.json) && python eval.py --table=mtf_table3_wmt_mini "
             "--runs=runs/mtf_wmt/h1,runs/mtf_wmt/h2,runs/mtf_wmt/h4,runs/mtf_wmt/h8"),
)
