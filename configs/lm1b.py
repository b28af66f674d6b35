"""python train.py --config=configs/lm1b.py:model=mtf_lm1b_h8 --workdir=DIR

Language modelling on LM1B from the tfds builder lm1b (prepared in --config.data.tfds_data_dir),
or from local text files (one text per line) with --config.data.source=files
--config.data.train_files=a.txt[.gz] --config.data.eval_files=b.txt. Reports token and word
perplexity. Variant keys: model, layout, mesh, steps.
"""
from switchzoo.configs import base


def get_config(arg: str | None = None):
    c = base.get_paper_scale()
    c.model = "mtf_lm1b_h8"
    c.task = "lm"
    c.layout = "dp_mp_ep"
    # data.tfds_name "" and eval_split "": lm1b, evaluated on its test split (it has no other)
    base.apply_variant(c, arg, {"steps": "num_train_steps"})
    return c
