"""Mesh-TensorFlow (Shazeer et al.; arXiv 1811.02084) Table 3: Transformer encoder-decoders on
WMT'14 English-French, d_model 1024, heads 4 ... 128 with d_ff scaled alongside; BLEU.

    python -m switchzoo.tables --table=mtf_table3_wmt --runs=runs/wmt_h4,runs/wmt_h8,...
"""

TABLE = dict(
    title="Mesh-TensorFlow Table 3: WMT'14 En-Fr translation, heads 4 ... 128",
    source=("configs: tensor2tensor mtf_transformer_paper_tr(size) (heads 8 x 2^size, d_ff "
            "4096 x 2^size, 154k steps = 3 epochs on translate_enfr_wmt32k_packed; its docstring "
            "records no results). The paper's Table 3 (parameters, BLEU) was not found in "
            "readable form: every published number here is None, not guessed, and which sizes "
            "the paper lists is unverified (t2t registers sizes -1 ... 4 and 6). Ours: sacrebleu "
            "13a BLEU on detokenized beam-search output."),
    metric="bleu",
    columns=[("heads", "heads"), ("d_ff", "d_ff"), ("params", "params, paper"),
             ("bleu", "BLEU, paper (↑)")],
    ours=[("bleu", "BLEU, ours (↑)"), ("token_perplexity", "token ppl, ours")],
    rows=[dict(label=f"mtf_wmt_h{h}", match={"model": f"mtf_wmt_h{h}"},
               published=dict(heads=h, d_ff=512 * h, params=None, bleu=None))
          for h in (4, 8, 16, 32, 64, 128)],
    command=("python train.py --config=configs/wmt.py:model=mtf_wmt_h4,pair=en-fr,steps=154000 "
             "--workdir=runs/wmt_h4 && python eval.py --workdir=runs/wmt_h4 "
             "(likewise h8 ... h128)"),
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
